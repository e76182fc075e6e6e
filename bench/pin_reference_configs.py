"""Choose the reference Triton kernels' configs at the timing budget's case, on an idle GPU, and
write them to reference/pinned_configs.json (reference/flash_triton.py keeps them there).

    python bench/pin_reference_configs.py [--trials 3] [--write]

Autotunes each kernel `--trials` times from scratch, prints every trial's choice and the
forward+backward time with the chosen configs next to SDPA's (do_bench medians, the same inputs),
and with --write keeps each kernel's most frequent choice.
"""
import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import torch
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fa2_sandbox.wire.cases import FlashCase, make_inputs  # noqa: E402
from grading.rubric import Rubric  # noqa: E402
from reference import flash_triton as ft  # noqa: E402

KERNELS = {"fwd": ft._attn_fwd, "dkdv": ft._attn_bwd_dkdv, "dq": ft._attn_bwd_dq}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    b = Rubric().budgets["flash_triton"]
    case = FlashCase(batch=(b["batch"],), n_queries=b["n"], n_keys=b["n"], head_dim=b["d"], dtype=b["dtype"],
                     is_causal=b["causal"])
    q, k, v, do = make_inputs(case, 0, "cuda")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ft.PINNED.clear()  # autotune every config
    choices = {name: Counter() for name in KERNELS}

    def step():
        ft.FlashAttentionTriton.apply(q, k, v, case.is_causal).backward(do)

    for trial in range(args.trials):
        for kernel in KERNELS.values():
            kernel.cache.clear()
        step()
        torch.cuda.synchronize()
        for name, kernel in KERNELS.items():
            choices[name][ft._shape(kernel.best_config)] += 1
        ms = do_bench(step, warmup=200, rep=1000, return_mode="median")
        print(f"trial {trial + 1}: " + ", ".join(f"{n} {ft._shape(k.best_config)}" for n, k in KERNELS.items())
              + f"; fwd+bwd {ms:.3f} ms", flush=True)
    q4, k4, v4, do4 = (t.detach().unsqueeze(0).requires_grad_() for t in (q, k, v, do))
    sdpa = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, is_causal=case.is_causal)
                    .backward(do4.detach()), warmup=200, rep=1000, return_mode="median")
    print(f"SDPA fwd+bwd {sdpa:.3f} ms ({torch.cuda.get_device_name()}, {case.id}, batch {b['batch']})")
    bucket = ft._bucket(case.n_queries)
    pinned = {ft.pinned_key(name, q, case.head_dim, case.is_causal, bucket, bucket): list(counts.most_common(1)[0][0])
              for name, counts in choices.items()}
    print(json.dumps(pinned, indent=1))
    if args.write:
        ft.PINNED_FILE.write_text(json.dumps(pinned, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
