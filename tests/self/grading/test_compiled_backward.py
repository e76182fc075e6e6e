"""A backward that calls a torch.compile'd function is graded like any other (the 2025 handout
suggests compiling the PyTorch backward; 7 of the 20 corpus repos do).

The runner watches the student's calls with a TorchDispatchMode. torch.compile refused
fullgraph=True under such a mode in torch 2.13, and in torch 2.11 the mode's coming and going
recompiled the function until dynamo's recompile limit (8) failed the course's own case on the H100.
Several shapes in one runner, as in grading, with fullgraph=True as the corpus repos write it. With
dynamic=False too, each shape is a graph of its own, and the ninth raised FailOnRecompileLimitHit
where the course, a fresh process per test, passed each case: the runner lifts the limit
(fa2_sandbox/runner/serve.py allow_recompiles).
"""
import textwrap

import pytest

from fa2_sandbox.harness.client import SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.wire.cases import FlashCase
from fa2_sandbox.wire.requests import Flash

ADAPTERS = """
def get_flashattention_autograd_function_pytorch():
    from cs336_systems.flash import CompiledBackward
    return CompiledBackward
"""

FLASH = """
import torch


@torch.compile(fullgraph=True, DYNAMIC backend="aot_eager")  # dynamo is what meets the mode; aot_eager: quick
def attention_backward(q, k, v, o, L, do, scale):
    p = torch.exp(q @ k.transpose(-1, -2) * scale - L[..., None])
    dv = p.transpose(-1, -2) @ do
    ds = p * (do @ v.transpose(-1, -2) - (o * do).sum(-1, keepdim=True)) * scale
    return ds @ k, ds.transpose(-1, -2) @ q, dv


class CompiledBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        scale = q.shape[-1] ** -0.5
        s = q @ k.transpose(-1, -2) * scale
        L = torch.logsumexp(s, dim=-1)
        o = torch.exp(s - L[..., None]) @ v
        ctx.save_for_backward(q, k, v, o, L)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, L = ctx.saved_tensors
        return *attention_backward(q, k, v, o, L, do, q.shape[-1] ** -0.5), None
"""


@pytest.fixture(params=["", "dynamic=False,"], ids=["dynamic-default", "dynamic-false"])
def compiled_submission(tmp_path, request):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "adapters.py").write_text(textwrap.dedent(ADAPTERS))
    (tmp_path / "cs336_systems").mkdir()
    (tmp_path / "cs336_systems" / "__init__.py").write_text("")
    (tmp_path / "cs336_systems" / "flash.py").write_text(textwrap.dedent(FLASH).replace("DYNAMIC ", request.param))
    return load_submission(tmp_path)


def test_compiled_backward_runs_under_the_watch(compiled_submission):
    runner = SubmissionRunner(compiled_submission)
    try:
        for n in (16, 33, 64, 100, 128, 200, 256, 300, 400, 512):  # more shapes than dynamo's recompile limit
            case = FlashCase(batch=(2,), n_queries=n, n_keys=n, head_dim=16)
            reply = runner.call(Flash("pytorch", case, seed=n, warmup=True), 300)
            assert reply.ok, f"N={n}: {reply.status}: {reply.message}"
            assert "backward_error" not in reply.result, f"N={n}: {reply.result['backward_error']['message']}"
            assert set(reply.tensors) >= {"o", "L", "dq", "dk", "dv"}
    finally:
        runner.close()
