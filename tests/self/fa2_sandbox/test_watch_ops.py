"""Watch(ops=...): only the calls whose checks read the op watch pay for it (its torch modes run
Python on every op), and those that do still see library attention and the largest tensor."""
import torch
import torch.nn.functional as F

from fa2_sandbox.runner.instruments import Watch
from grading.checks.test_flash import IMPLEMENTATION
from grading.matrix import MEMORY_CASE, WATCHED_CASES, flash_cases


def attend():
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    F.scaled_dot_product_attention(q, k, v)
    torch.zeros(30, 40)  # the largest tensor made inside the watch


def test_watching_ops_sees_library_attention_and_the_largest_tensor():
    """With ops, SDPA called on CPU tensors is in forbidden_ops and the largest tensor any op made
    is reported, its numel and its shape."""
    with Watch(ops=True) as watch:
        attend()
    report = watch.report()
    assert "scaled_dot_product_attention" in report["forbidden_ops"]
    assert report["largest_numel"] == 1200
    assert report["largest_shape"] == [30, 40]


def test_without_ops_what_was_not_watched_reads_none():
    """None, not an empty dict or 0: a check that reads the op watch of an unwatched call fails
    loudly instead of passing a submission that called SDPA. Triton launches are still counted."""
    with Watch(ops=False) as watch:
        attend()
    report = watch.report()
    assert report["forbidden_ops"] is None
    assert report["largest_numel"] is None
    assert report["largest_shape"] is None
    assert isinstance(report["triton_launches"], dict)


def test_the_cases_whose_checks_read_the_op_watch_are_watched():
    """The implementation check (no library attention) reads forbidden_ops of each slot's first
    case, and the memory check on a CPU the largest tensor of MEMORY_CASE: both are watched. Some
    other graded case is not, so the flag is not simply always on."""
    for slot, _, case in IMPLEMENTATION:
        assert case in WATCHED_CASES, (slot, case.id)
    assert MEMORY_CASE in WATCHED_CASES
    assert any(case not in WATCHED_CASES for _, case in flash_cases("pytorch", False))
