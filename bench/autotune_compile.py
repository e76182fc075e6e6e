"""How long an autotuned kernel's first call takes with the runner's side-by-side compile of its
configs (fa2_sandbox/runner/parallel_autotune.py) and without it, on a GPU, each in a fresh process
with an empty Triton cache; the two must choose the same config and give the same output.

    python bench/autotune_compile.py            # prints one line per way, then the ratio

The kernel is the Triton tutorial's matmul over eight configs (tile sizes 64 to 256, 3 to 5 stages), fp16,
M = N = K = 2048: each config a separate compile.
"""
import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import json, os, sys, time
import torch, triton, triton.language as tl
if sys.argv[1] == "side-by-side":
    from fa2_sandbox.runner import parallel_autotune
    assert parallel_autotune.install()

configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_stages=s, num_warps=w)
           for bm, bn, bk, s, w in [(128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4),
                                    (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (128, 32, 32, 4, 4),
                                    (256, 128, 64, 3, 8), (64, 64, 64, 5, 4)]]

@triton.autotune(configs=configs, key=["M", "N", "K"])
@triton.jit
def matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # C[m, n] = sum_k A[m, k] B[k, n], one BM x BN tile of C per program
    pm, pn = tl.program_id(0), tl.program_id(1)
    rm, rn, rk = pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN), tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))

torch.manual_seed(0)
n = 2048
a, b = torch.randn(n, n, device="cuda", dtype=torch.float16), torch.randn(n, n, device="cuda", dtype=torch.float16)
c = torch.empty(n, n, device="cuda", dtype=torch.float16)
t = time.perf_counter()
matmul[lambda m: (triton.cdiv(n, m["BM"]), triton.cdiv(n, m["BN"]))](a, b, c, n, n, n)
torch.cuda.synchronize()
seconds = time.perf_counter() - t
error = (c.float() - a.float() @ b.float()).abs().max().item()
print(json.dumps({"seconds": seconds, "best": str(matmul.best_config), "max_error": error}))
'''


def first_call(way: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        script = os.path.join(cache, "first_call.py")  # Triton reads a kernel's source from its file
        with open(script, "w") as f:
            f.write(CHILD)
        env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(cache, "triton"),
                   PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = subprocess.run([sys.executable, script, way], env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"{way}: the first call failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    results = {way: first_call(way) for way in ("one by one", "side-by-side")}
    for way, r in results.items():
        print(f"{way:>13}: first call {r['seconds']:.2f} s, chose {r['best']}, max error {r['max_error']:.3g}")
    serial, parallel = results["one by one"]["seconds"], results["side-by-side"]["seconds"]
    same = results["one by one"]["max_error"] == results["side-by-side"]["max_error"]
    print(f"side-by-side / one by one: {parallel / serial:.2f}; the same output: {same}")


if __name__ == "__main__":
    main()
