"""Grade the reference Triton kernel's bf16 cases (the large-score ones among them) over many
seeds, judged as the grader judges them (reference/tolerance.py), and print per case how many
seeds pass and the worst ratio of an error to its bound (max or mean error; 1 is the bound).

    python bench/seed_sweep.py                          # a GPU: the grader's GPU cases, 200 seeds each
    python bench/seed_sweep.py --seeds 1000 -k x8       # only the cases whose id contains x8
    python bench/seed_sweep.py --small -k x8            # a GPU, the CPU's smaller cases (issue 36's 32x32)
    python bench/seed_sweep.py --seeds 20 -k 32x32      # a CPU: the interpreter's cases (issue 36)
    python bench/seed_sweep.py --seeds 20 -k 32x32 --truncate   # ... with the interpreter's own bf16 rounding

Without a GPU it sets TRITON_INTERPRET=1 and runs the CPU cases under the interpreter, patched
as the grader's runners patch it (fa2_sandbox/runner/triton_interpreter.py); --truncate leaves
its float32 -> bf16 conversions truncating, the bug behind issue 36. Exits 1 if any seed fails.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the reference imports triton
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fa2_sandbox.runner.triton_interpreter import ensure_bf16_dot, ensure_bf16_rounding  # noqa: E402
from fa2_sandbox.wire.cases import make_inputs  # noqa: E402
from grading.matrix import flash_cases  # noqa: E402
from reference.flash_triton import FlashAttentionTriton  # noqa: E402
from reference.tolerance import expected_attention, judge_attention  # noqa: E402


def run(q, k, v, do, causal) -> dict:
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = FlashAttentionTriton.apply(q, k, v, causal)
    lse = o.grad_fn.saved_tensors[0]
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return {"o": o.detach(), "L": lse, "dq": dq, "dk": dk, "dv": dv}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="seeds per case (default 200)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("-k", default="", help="only cases whose id contains this")
    parser.add_argument("--small", action="store_true", help="the CPU's (interpreter's) cases, on any device")
    parser.add_argument("--truncate", action="store_true", help="CPU: keep the interpreter's truncating bf16 casts")
    args = parser.parse_args()
    device = "cuda" if ON_GPU else "cpu"
    if not ON_GPU:
        problems = [ensure_bf16_dot(True)] + ([] if args.truncate else [ensure_bf16_rounding(True)])
        if any(problems):
            print("cannot fix the interpreter's bf16:", "; ".join(p for p in problems if p))
            return 2
    cases = [c for _, c in flash_cases("triton", ON_GPU and not args.small) if c.dtype == "bfloat16" and args.k in c.id]
    print(f"{device} ({torch.cuda.get_device_name() if ON_GPU else 'Triton interpreter'}), seeds "
          f"{args.start}..{args.start + args.seeds - 1}, {len(cases)} cases")
    failed_total = 0
    for case in cases:
        start, worst, failed = time.monotonic(), (0.0, None), []
        for seed in range(args.start, args.start + args.seeds):
            q, k, v, do = make_inputs(case, seed, device)
            verdicts = judge_attention(run(q, k, v, do, case.is_causal), q, k, v, do, case.is_causal,
                                       expected_attention(q, k, v, do, case.is_causal))
            for name, v_ in verdicts.items():
                for kind, err, bound in (("max", v_.max_err, v_.max_bound), ("mean", v_.mean_err, v_.mean_bound)):
                    if err / bound > worst[0]:
                        worst = (err / bound, f"{name} {kind}, seed {seed}")
            if bad := [f"{n}: {v_.reason}" for n, v_ in verdicts.items() if not v_.ok]:
                failed.append((seed, bad))
        failed_total += len(failed)
        print(f"{case.id:34s} {args.seeds - len(failed):5d}/{args.seeds} pass   worst {worst[0]:.3f} of a bound "
              f"({worst[1]})   {time.monotonic() - start:.0f} s", flush=True)
        for seed, bad in failed[:5]:
            print(f"    seed {seed}: {' '.join(bad)}")
    print(f"{failed_total} failing (case, seed) pairs")
    return 1 if failed_total else 0


if __name__ == "__main__":
    sys.exit(main())
