"""How a submission is found and run, split along the trust boundary.

harness/  runs in the grader: finds submissions (discover), makes a runner's scratch folder
          (scratch, kernel_cache), starts and confines it (confinement), watches it (watchdog) and
          calls it (client). It trusts everything in the project.
runner/   runs inside the sandbox, the only process that imports a submission's code (serve).
          It trusts exactly runner/ and wire/, copied beside it; never reference/ or tests/.
wire/     what both sides share: the message channel, the attention cases and the tensor exchange.

The package's name is one no submission uses, so a student's `adapters.py` never shadows it.

The project's root and its packages are said here once, for the grader and the sandbox alike: in
a checkout the root is the clone, installed it is site-packages (in a runner, its trusted copy).
"""
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# The grader's own top-level packages: what a wheel installs besides its metadata (pyproject.toml's
# [tool.setuptools.packages.find] lists the same), and the code a traceback calls the grader's.
GRADER_PACKAGES = ("reference", "grading", "reporting", "submissions", "fa2_sandbox")
