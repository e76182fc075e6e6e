#!/usr/bin/env bash
# Gradescope runs this once, as root, when the autograder image is built.
# Expects the grader project at /autograder/source/grader (see README.md for the zip layout).
set -euo pipefail

GRADER=/autograder/source/grader
VENV=/autograder/venv
# The versions this project is tested with (see the top-level README); override if needed.
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
TRITON_SPEC="${TRITON_SPEC:-triton==3.9.0}"
# Gradescope machines have no GPU: the CPU wheel is a tenth of the size and installs faster.
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip python3-dev build-essential >/dev/null

# A venv keeps us clear of the distribution's Python packages (and of PEP 668 on newer images).
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC" --index-url "$TORCH_INDEX"
# Triton's wheel works on a CPU through its interpreter (TRITON_INTERPRET=1), which is how
# the Triton checks run here.
"$VENV/bin/python" -m pip install --quiet "$TRITON_SPEC"
# The project itself and its remaining dependencies (pytest, numpy, pyyaml, jinja2, ...).
# The `course` extra: what the course's cs336-basics and pyproject declare (einops, einx, jaxtyping, pandas).
"$VENV/bin/python" -m pip install --quiet -e "$GRADER[course]"

"$VENV/bin/python" -c "import torch, triton, pytest, jinja2; print('torch', torch.__version__, 'triton', triton.__version__)"
