"""The FSDP checks build their model from the submission's cs336_basics.model, as the official tests do.

The handout's FSDP wraps "any Linear or Embedding layer" of the course's model, and real
submissions find those layers by their cs336_basics classes (both 2026 FSDPs of the corpus do).
The checks trained a model of torch.nn.Linear layers, so such an FSDP sharded nothing: on the H100
both corpus FSDPs failed fsdp::sharded or fsdp::equivalence[fp16] while being correct.

Here a throwaway 2026 submission brings its own cs336_basics (Linear and Embedding that are not
torch.nn's) and the bundled reference FSDP, told to shard those classes only. Graded for FSDP, it
must pass every check, with the model built from its classes; told to ignore compute_dtype, it must
fail the fp16 check alone, on the dtype its layers computed in (with the official tests' SGD rate,
float16 barely moves the parameters, so they alone cannot tell).
"""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

COURSE_MODEL = """
import torch
from torch import nn


class Linear(nn.Module):  # y = x W^T, W of shape (d_out, d_in), no bias: the course's layout
    def __init__(self, in_features, out_features, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(out_features, in_features), std=0.02))

    def forward(self, x):
        return torch.einsum("...i,oi->...o", x, self.weight)


class Embedding(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(num_embeddings, embedding_dim)))

    def forward(self, token_ids):
        return self.weight[token_ids]


# The norm is not what this test is about: the grader's own twin of the course's RMSNorm.
from fa2_sandbox.wire.toy_models import CourseRMSNorm as RMSNorm  # noqa: E402,F401
"""

ADAPTERS = """
from cs336_systems.fsdp import fsdp_gather_full_params, fsdp_on_after_backward, get_fsdp  # noqa: F401
"""

# The same FSDP, deaf to compute_dtype: everything stays float32.
ADAPTERS_IGNORING_DTYPE = ADAPTERS + """
from cs336_systems import fsdp


def get_fsdp(module, compute_dtype=None):
    return fsdp.get_fsdp(module, None)
"""


def write_submission(root: Path, adapters: str = ADAPTERS, name: str = "course_layers_fsdp") -> Path:
    sub = root / name
    for package in ("tests", "cs336_systems", "cs336_basics"):
        (sub / package).mkdir(parents=True)
        (sub / package / "__init__.py").write_text("")
    (sub / "cs336_basics" / "model.py").write_text(textwrap.dedent(COURSE_MODEL))
    reference = (ROOT / "submissions" / "reference" / "cs336_systems" / "fsdp.py").read_text()
    line = "SHARDED_MODULES = (nn.Linear, nn.Embedding)"
    assert line in reference
    (sub / "cs336_systems" / "fsdp.py").write_text(reference.replace(
        line, "from cs336_basics.model import Embedding, Linear  # noqa: E402\nSHARDED_MODULES = (Linear, Embedding)"))
    (sub / "tests" / "adapters.py").write_text(adapters)
    return sub


def fsdp_checks(subs: list, reports: Path) -> dict:
    """Grade `subs` for FSDP in one session: {submission: {check name: its results.json test}}."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0",
               *[f"--impl={sub}" for sub in subs], f"--reports={reports}", "-k", "fsdp", "--seed", "20261125"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    graded = {}
    for sub in subs:
        results = reports / sub.name / "results.json"
        assert results.is_file(), run.stdout[-3000:] + run.stderr[-2000:]
        checks = {t["name"].split("::", 1)[1]: t for t in json.loads(results.read_text())["tests"]
                  if t["part"] == "fsdp"}
        assert set(checks) == {"fsdp::equivalence[fp32]", "fsdp::equivalence[fp16]", "fsdp::sharded[fp32]"}
        graded[sub.name] = checks
    return graded


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict:
    """Both submissions graded in one session: each one's checks run in runners of its own and are
    judged on its own, so sharing the session's start, collection and oracles changes no verdict."""
    root = tmp_path_factory.mktemp("course-layers")
    subs = [write_submission(root), write_submission(root, ADAPTERS_IGNORING_DTYPE, "course_layers_fsdp_fp32")]
    return fsdp_checks(subs, root / "reports")


def test_an_fsdp_of_the_course_layers_passes(graded):
    checks = graded["course_layers_fsdp"]
    for name, t in checks.items():
        assert t["outcome"] == "passed", f"{name}: {t['output']}"
        assert "built from cs336_basics.model's Embedding, Linear and RMSNorm" in t["output"], t["output"]


def test_an_fsdp_that_ignores_compute_dtype_fails_fp16_only(graded):
    checks = dict(graded["course_layers_fsdp_fp32"])
    fp16 = checks.pop("fsdp::equivalence[fp16]")
    assert fp16["outcome"] == "failed"
    assert fp16["output"].startswith("compute_dtype=float16 had no effect: the layers computed in float32"), \
        fp16["output"]
    assert all(t["outcome"] == "passed" for t in checks.values()), checks
