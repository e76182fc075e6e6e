"""Time the reference Triton FlashAttention-2 against SDPA's flash and cuDNN backends, one run.

    python bench/attention.py            # the full table (bf16, d 64/128, N 1k-16k, causal or not)
    python bench/attention.py --quick    # two shapes

FLOPs: 4·BH·N²·d for the forward, half that when causal, and 2.5x the forward for the backward
(so fwd+bwd is 3.5x). BH is chosen so that BH·N stays at 512K tokens, enough to fill an H100.
Every timed output is checked against SDPA's math in fp32 before its time is printed.
"""
import argparse
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from reference.flash_triton import FlashAttentionTriton  # noqa: E402

TOKENS = 512 * 1024


def sdpa(backend):
    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def triton_fa2(q, k, v, causal):
    return FlashAttentionTriton.apply(q, k, v, causal)


PEERS = {"triton (ours)": triton_fa2, "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
         "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}


def check(fn, q, k, v, do, causal) -> float:
    """Relative error of output and dq against fp32 math attention, on 4 heads (a dense
    fp32 reference of every head would not fit at N=16384)."""
    q, k, v, do = (t[:, :4] for t in (q, k, v, do))
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v, causal)
    o.backward(do)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(q32, k32, v32, is_causal=causal)
    ref.backward(do.float())
    rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()
    return max(rel(o, ref), rel(q.grad, q32.grad))


def bench(fn, q, k, v, do, causal, backward: bool) -> float:
    if not backward:
        return do_bench(lambda: fn(q, k, v, causal), warmup=50, rep=200, return_mode="median")
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))

    def step():
        fn(q, k, v, causal).backward(do)
    return do_bench(step, warmup=50, rep=200, return_mode="median", grad_to_none=[q, k, v])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    shapes = [(n, d, causal) for d in (64, 128) for n in (1024, 4096, 16384) for causal in (False, True)]
    if args.quick:
        shapes = [(1024, 64, False), (4096, 128, True)]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}, bf16")
    rows = []
    for n, d, causal in shapes:
        bh = TOKENS // n
        g = torch.Generator(device="cuda").manual_seed(n + d)
        # (1, BH, N, d): SDPA's flash and cuDNN backends take 4-D inputs only
        q, k, v, do = (torch.randn(1, bh, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        fwd_flops = 4 * bh * n * n * d * (0.5 if causal else 1.0)
        row = {"shape": f"BH={bh} N={n} d={d} {'causal' if causal else 'full'}"}
        for name, fn in PEERS.items():
            try:
                err = check(fn, q, k, v, do, causal)
                if err > 2e-2:
                    raise RuntimeError(f"relative error {err:.2e}")
                fwd = bench(fn, q, k, v, do, causal, backward=False)
                both = bench(fn, q, k, v, do, causal, backward=True)
                row[name] = (fwd_flops / fwd * 1e-9, 3.5 * fwd_flops / both * 1e-9, err)
            except Exception as exc:  # a backend missing on this GPU must not hide the others
                row[name] = None
                print(f"  {name} at {row['shape']}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        rows.append(row)
        print(row, flush=True)

    print("\nTFLOP/s (fwd | fwd+bwd); ratio = ours / peer")
    header = f"{'shape':34s}" + "".join(f"{name:>22s}" for name in PEERS) + f"{'vs flash':>16s}{'vs cudnn':>16s}"
    print(header)
    for row in rows:
        cells = "".join(f"{'—':>22s}" if row[name] is None else f"{row[name][0]:10.0f} | {row[name][1]:9.0f}"
                        for name in PEERS)
        ours = row["triton (ours)"]
        ratios = ""
        for peer in ("sdpa flash", "cudnn"):
            other = row[peer]
            ratios += (f"{'—':>16s}" if ours is None or other is None
                       else f"{ours[0] / other[0]:7.2f} | {ours[1] / other[1]:5.2f}")
        print(f"{row['shape']:34s}{cells}{ratios}")


if __name__ == "__main__":
    main()
