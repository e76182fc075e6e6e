"""Which attention cases each slot is graded on, by tier, and on which device.

- course: the official tests' cases (tests/test_attention.py): B=4, N=128, d=64, fp32; the
  PyTorch class non-causal on the CPU, the Triton class causal and not on CUDA. Judged by their
  tolerance alone, so a repo that passes the official tests gets the course tier.
- handout: what the handout promises (powers of two >= 16, d in {16, 32, 64, 128}, several
  tiles), non-causal. For the Triton slot fp32 and bf16 (flash_benchmarking sweeps both); for
  the PyTorch slot fp32, its bf16 twins being the `bf16` tier (the handout asks no dtype of it).
- causal: the handout's shapes with is_causal=True (a requirement for Triton, flash_forward (c);
  advice for PyTorch, which the handout lets ignore the flag).
- robustness: odd lengths, odd head dims, 4-D, strided inputs, large scores (advice).

The PyTorch slot always runs on the CPU, where the official tests run it; a GPU adds one
`runs_on_cuda` check. Without a GPU the Triton slot runs under the interpreter, so its cases
shrink (N <= 256). Case ids must be unique within a slot: each check's result file is named
after its id.
"""
from functools import lru_cache

from fa2_sandbox.wire.cases import FlashCase
from grading.tracks import Track, kernel_track

ODD_PAIRS = [(113, 203), (203, 113), (128, 217), (1, 239), (127, 513), (1023, 1024), (17, 17)]


def _handout(n: int, causal: bool):
    return [FlashCase(batch=(2,), n_queries=n, n_keys=n, head_dim=d, dtype=dtype, is_causal=causal)
            for d in (16, 32, 64, 128) for dtype in ("float32", "bfloat16")]


COURSE_CASE = FlashCase(batch=(4,), n_queries=128, n_keys=128, head_dim=64)  # tests/test_attention.py


def slot_device(slot: str, on_gpu: bool) -> str:
    """Where a slot's cases run: the Triton class on CUDA when there is a GPU, the PyTorch class
    on the CPU as in the official tests."""
    return "cuda" if slot == "triton" and on_gpu else "cpu"


def flash_cases(slot: str, on_gpu: bool) -> list[tuple[str, FlashCase]]:
    small = slot == "triton" and not on_gpu
    n = 64 if small else 1024  # 64, not 128: the course case is 128 and ids must stay unique
    cases = [("course", COURSE_CASE)]
    if slot == "triton":  # the official Triton tests run both
        cases += [("course", FlashCase(batch=(4,), n_queries=128, n_keys=128, head_dim=64, is_causal=True))]
    for case in _handout(n, causal=False):
        cases += [("bf16" if slot == "pytorch" and case.dtype == "bfloat16" else "handout", case)]
    cases += [("causal", c) for c in _handout(n, causal=True)]
    pairs = [(nq, nk) for nq, nk in ODD_PAIRS if not small or max(nq, nk) <= 256] + ([(255, 256)] if small else [])
    for i, (nq, nk) in enumerate(pairs):
        dtype = ("float32", "bfloat16")[i % 2]
        cases += [("robustness", FlashCase(batch=(2,), n_queries=nq, n_keys=nk, head_dim=64, dtype=dtype,
                                           is_causal=causal)) for causal in (False, True)]
    cases += [("robustness", FlashCase(batch=(2,), n_queries=n // 2 + 3, n_keys=n // 2 + 3, head_dim=d,
                                       dtype="bfloat16", is_causal=True)) for d in (48, 80, 96)]
    cases += [
        ("robustness", FlashCase(batch=(2, 3), n_queries=n // 2, n_keys=n // 2, head_dim=64, is_causal=True)),
        ("robustness", FlashCase(batch=(2, 3), n_queries=n // 2 - 5, n_keys=n // 2 - 5, head_dim=64,
                                 dtype="bfloat16", noncontiguous=True)),
        # Scores ~x64: a running max started at 0 overflows exp. bf16, because in fp32 every
        # FlashAttention backward (recomputing P from a float32 L) misses the 3x rule here.
        ("robustness", FlashCase(batch=(2,), n_queries=n // 2, n_keys=n // 2, head_dim=64, dtype="bfloat16",
                                 score_scale=8.0)),
        # Every score near -200: exp(s - m) underflows to 0 unless the running max starts at -inf.
        # bf16 for the same reason as above (|L| ~ 200).
        ("robustness", FlashCase(batch=(2,), n_queries=n // 2 + 9, n_keys=n // 2 + 9, head_dim=64, dtype="bfloat16",
                                 is_causal=True, score_shift=-200.0)),
    ]
    return cases


# The tiers whose checks are requirements (grading/rubric.yaml): for the PyTorch slot the handout
# asks neither bf16 nor causal masking, so those tiers are advice there.
REQUIRED_TIERS = {"pytorch": ("course", "handout"), "triton": ("course", "handout", "causal")}


@lru_cache(maxsize=None)
def replay_cases(slot: str, on_gpu: bool) -> tuple:
    """The (tier, case) pairs whose first answer in a runner is followed at once by a second,
    unseen input of the same case (grading/checks/flash_checks.run_case), so that a submission that
    caches its answers by shape, dtype or case is caught in every runner that answers required
    flash checks, however the checks are spread: one case per slot, and for the Triton slot on a
    GPU, where its cases spread over a runner per kernel (grading/tracks.py), one per kernel. Each
    is the smallest case of a required tier in its runner: replay is a requirement, so it is judged
    only where the handout promises the submission works. A runner with no such case (a kernel of
    an odd head dim, which only robustness cases use) gets no replay: caching there could win only
    advice points. Fixed by the machine alone, so every schedule probes the same cases: -n 0 and
    -n 2 grade alike."""
    runners = {}
    for tier, case in flash_cases(slot, on_gpu):
        if tier in REQUIRED_TIERS[slot]:
            runner = kernel_track(case) if slot == "triton" and on_gpu else Track(slot)
            runners.setdefault(runner, []).append((tier, case))
    return tuple(min(cases, key=lambda pair: pair[1].work) for cases in runners.values())


# The memory checks' shape: at N = 1024 one batch-head's score matrix (1M elements) dwarfs
# every tile and every O(N d) tensor (64K elements).
MEMORY_CASE = FlashCase(batch=(2,), n_queries=1024, n_keys=1024, head_dim=64, is_causal=True)
# The Triton slot's memory case on a GPU, where one N x N fp32 matrix is 1 GiB at N=16384.
GPU_MEMORY_CASE = FlashCase(batch=(1,), n_queries=16384, n_keys=16384, head_dim=64, dtype="bfloat16", is_causal=True)

# The cases whose calls watch every aten op (fa2_sandbox/wire/requests.py Flash.watch_ops): the
# implementation check reads the course case's (library attention called) and the memory check
# MEMORY_CASE's on a CPU (the largest tensor). Every other call runs unwatched, as in the
# official tests: the watch runs Python on each op, 3 to 5 times a tile loop's own CPU.
WATCHED_CASES = (COURSE_CASE, MEMORY_CASE)
