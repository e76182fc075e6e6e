"""Which attention cases each slot is graded on, by tier.

- course: the official test's one case (B=4, N=128, d=64, fp32), so we never contradict it.
- handout: what the handout promises (powers of two >= 16, d in {16, 32, 64, 128}, several
  tiles), non-causal; `causal` holds the same shapes with is_causal=True, so the rubric can
  weigh causal apart (the handout lets the PyTorch class ignore it).
- robustness: odd lengths, odd head dims, 4-D, strided inputs, large scores.

Without a GPU the Triton slot runs under the interpreter, so its cases shrink (N <= 256).
Case ids must be unique within a slot: each check's result file is named after its id.
"""
from adapters.cases import FlashCase

ODD_PAIRS = [(113, 203), (203, 113), (128, 217), (1, 239), (127, 513), (1023, 1024), (17, 17)]


def _handout(n: int, causal: bool):
    return [FlashCase(batch=(2,), n_queries=n, n_keys=n, head_dim=d, dtype=dtype, is_causal=causal)
            for d in (16, 32, 64, 128) for dtype in ("float32", "bfloat16")]


def flash_cases(slot: str, on_gpu: bool) -> list[tuple[str, FlashCase]]:
    small = slot == "triton" and not on_gpu
    n = 64 if small else 1024  # 64, not 128: the course case is 128 and ids must stay unique
    cases = [("course", FlashCase(batch=(4,), n_queries=128, n_keys=128, head_dim=64))]
    cases += [("handout", c) for c in _handout(n, causal=False)]
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


# The memory checks' shape: at N = 1024 one batch-head's score matrix (1M elements) dwarfs
# every tile and every O(N d) tensor (64K elements).
MEMORY_CASE = FlashCase(batch=(2,), n_queries=1024, n_keys=1024, head_dim=64, is_causal=True)
