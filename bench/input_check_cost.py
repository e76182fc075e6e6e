"""What the runner's check of a flash call's inputs costs, beside the reference's call it checks.

    python bench/input_check_cost.py            # the PyTorch slot's largest cases, on the CPU
    python bench/input_check_cost.py --cuda     # the Triton slot's largest cases, on the GPU

Each flash call copies q, k, v and dO before the forward and compares them bit for bit after the
forward and after the backward (fa2_sandbox/runner/input_changes.py, serve.Runner.flash). For
each case this prints the median time of that copy and the two comparisons, of what the runner
did before (a copy and one comparison with torch.equal), and of the reference's forward and
backward. notes/input-checks.md has the figures.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fa2_sandbox.runner import flash_call, input_changes  # noqa: E402
from fa2_sandbox.wire.cases import FlashCase, make_inputs  # noqa: E402

CPU_CASES = [  # the PyTorch slot's largest (grading/matrix.py)
    FlashCase(batch=(2,), n_queries=1024, n_keys=1024, head_dim=128),
    FlashCase(batch=(2,), n_queries=1024, n_keys=1024, head_dim=128, dtype="bfloat16"),
    FlashCase(batch=(2, 3), n_queries=512, n_keys=512, head_dim=64, is_causal=True),
]
CUDA_CASES = [  # the Triton slot's largest handout case, and its memory check's (test_memory.py)
    FlashCase(batch=(2,), n_queries=1024, n_keys=1024, head_dim=128, dtype="bfloat16"),
    FlashCase(batch=(1,), n_queries=16384, n_keys=16384, head_dim=64, dtype="bfloat16", is_causal=True),
]


def median_s(fn, repeats: int, device: str) -> float:
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cuda", action="store_true", help="the Triton reference on the GPU")
    args = parser.parse_args()
    device = "cuda" if args.cuda else "cpu"
    if args.cuda:
        from reference.flash_triton import FlashAttentionTriton as cls
    else:
        from reference.flash_pytorch import FlashAttentionPytorch as cls
    for case in CUDA_CASES if args.cuda else CPU_CASES:
        q, k, v, do = make_inputs(case, 4242, device)
        caller = {"q": q, "k": k, "v": v, "dO": do}

        def before_this():
            copies = [t.clone() for t in caller.values()]
            return [torch.equal(a, b) for a, b in zip(copies, caller.values())]

        def now():
            copies = input_changes.snapshot(caller)
            return input_changes.changes(copies, caller), input_changes.changes(copies, caller)

        call = median_s(lambda: flash_call.run_flash(cls, q, k, v, do, case.is_causal), 5, device)
        old, new = median_s(before_this, 50, device), median_s(now, 50, device)
        print(f"{case.id}: input check {new * 1e3:.2f} ms (before: {old * 1e3:.2f} ms), the reference's forward "
              f"and backward {call * 1e3:.1f} ms: the check is {new / call:.1%} of the call, "
              f"{(new - old) / call:+.1%} more than before")


if __name__ == "__main__":
    main()
