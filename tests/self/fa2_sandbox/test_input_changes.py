"""The runner finds which inputs a flash call changed in place, bit for bit, per tensor and per
phase (fa2_sandbox/runner/input_changes.py, serve.Runner.op_flash)."""
import math
import types

import pytest
import torch

from fa2_sandbox.runner import input_changes
from fa2_sandbox.runner.serve import Runner
from fa2_sandbox.wire.cases import FlashCase, make_inputs
from fa2_sandbox.wire.requests import Flash
from reference.flash_pytorch import FlashAttentionPytorch


def drawn(dtype=torch.float32):
    generator = torch.Generator().manual_seed(3)
    return {"q": torch.randn(2, 37, 16, generator=generator).to(dtype),
            "k": torch.randn(2, 41, 16, generator=generator).to(dtype)}


def test_untouched_inputs_are_left_out():
    tensors = drawn()
    assert input_changes.changes(input_changes.snapshot(tensors), tensors) == {}


def test_a_change_is_counted_with_its_largest_size():
    tensors = drawn()
    before = input_changes.snapshot(tensors)
    row = tensors["q"][1, 5].clone()
    tensors["q"][1, 5].mul_(1 + 1e-4)
    found = input_changes.changes(before, tensors)
    assert set(found) == {"q"}
    assert found["q"]["changed"] == 16 and found["q"]["numel"] == 2 * 37 * 16
    assert found["q"]["largest"] == pytest.approx((row * 1e-4).abs().max().item(), rel=1e-2)


def test_a_change_below_bf16_rounding_leaves_bf16_bits_alone():
    """Why the hygiene check looks at float32 too: the same nudge rounds away in bf16."""
    tensors = drawn(torch.bfloat16)
    before = input_changes.snapshot(tensors)
    tensors["q"][1, 5].mul_(1 + 1e-4)
    assert input_changes.changes(before, tensors) == {}


def test_bits_not_values_are_compared():
    """-0.0 for 0.0 and one NaN for another compare equal as numbers; as bits they differ."""
    tensors = {"q": torch.tensor([0.0, 1.0, float("nan")])}
    before = input_changes.snapshot(tensors)
    tensors["q"][0] = -0.0
    assert input_changes.changes(before, tensors)["q"] == {"changed": 1, "numel": 3, "largest": 0.0}
    tensors["q"][1] = float("inf")
    assert input_changes.changes(before, tensors)["q"] == {"changed": 2, "numel": 3, "largest": None}


def test_strided_inputs_and_a_new_shape():
    tensors = {"v": torch.randn(4, 6, 8).transpose(1, 2)}
    before = input_changes.snapshot(tensors)
    tensors["v"][0, 0, 0] += 1
    assert input_changes.changes(before, tensors)["v"]["changed"] == 1
    tensors["v"].resize_(2, 2)
    assert input_changes.changes(before, tensors)["v"]["now"] == "float32 of shape [2, 2]"


# -- in the runner: per phase, every dtype -------------------------------------------------------

class NudgesQ(FlashAttentionPytorch):
    """Scales the caller's first query row by 1 + 1e-4 before computing."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        q[(0,) * (q.dim() - 1)].mul_(1 + 1e-4)
        return FlashAttentionPytorch.forward(ctx, q, k, v, is_causal)


class HalvesDO(FlashAttentionPytorch):
    """Halves the caller's dO in place, then answers for the halved gradient."""

    @staticmethod
    def backward(ctx, do):
        return FlashAttentionPytorch.backward(ctx, do.mul_(0.5))


def flash_result(tmp_path, cls, dtype="float32", backward=True) -> dict:
    module = types.SimpleNamespace(get_flashattention_autograd_function_pytorch=lambda: cls)
    channel = types.SimpleNamespace(send=lambda message: None)
    case = FlashCase(batch=(2,), n_queries=33, n_keys=47, head_dim=16, dtype=dtype)
    runner = Runner(channel, module, tmp_path)
    runner.tag = "t"
    return runner.flash(Flash("pytorch", case, seed=5, backward=backward)), make_inputs(case, 5, "cpu")[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_reference_changes_nothing(tmp_path, dtype):
    result, _ = flash_result(tmp_path, FlashAttentionPytorch, dtype)
    assert result["changed_inputs"] == {"forward": {}, "backward": {}}


def test_the_forward_that_changed_q_is_named(tmp_path):
    result, q = flash_result(tmp_path, NudgesQ)
    change = result["changed_inputs"]["forward"]
    assert set(change) == {"q"} and change["q"]["changed"] == 16 and change["q"]["numel"] == q.numel()
    assert change["q"]["largest"] == pytest.approx(q[0, 0].abs().max().item() * 1e-4, rel=1e-2)
    assert result["changed_inputs"]["backward"] == {}  # compared with the inputs as the forward left them


def test_the_nudge_is_invisible_in_bf16(tmp_path):
    result, _ = flash_result(tmp_path, NudgesQ, "bfloat16")
    assert result["changed_inputs"] == {"forward": {}, "backward": {}}


def test_the_backward_that_changed_do_is_named(tmp_path):
    result, q = flash_result(tmp_path, HalvesDO)
    assert result["changed_inputs"]["forward"] == {}
    change = result["changed_inputs"]["backward"]
    assert set(change) == {"dO"} and change["dO"]["changed"] == q.numel() and math.isfinite(change["dO"]["largest"])


def test_a_forward_only_call_compares_the_forward(tmp_path):
    result, _ = flash_result(tmp_path, NudgesQ, backward=False)
    assert set(result["changed_inputs"]) == {"forward"} and set(result["changed_inputs"]["forward"]) == {"q"}
