"""How long an autotuned kernel's first call takes with the runner's side-by-side compile of its
configs (fa2_sandbox/runner/parallel_autotune.py) and without it, on a GPU: each way in a fresh
process with an empty Triton cache, both at once (each compiles on cores of its own on a machine
of 16), and the two must give the same output.

    python bench/autotune_compile.py                      # the Triton tutorial's matmul, 8 configs
    python bench/autotune_compile.py --submission REPO    # REPO's Triton FA2, forward + backward

The matmul: fp16, M = N = K = 2048, tiles 64 to 256, 3 to 5 stages; each config a separate compile.
A submission: its get_flashattention_autograd_function_triton() (imported as the runner imports it),
float32 q, k, v of shape (2, 1024, 128), causal unless --full: the grader's 1024 x 1024 d128 replay,
where an autotuning submission's compiles are longest (notes/grading-speed.md).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MATMUL = r'''
import json, sys, time
import torch, triton, triton.language as tl
from fa2_sandbox.runner import parallel_autotune
if sys.argv[1] == "side-by-side":
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
error = (c.double() - a.double() @ b.double()).abs().max().item()
print(json.dumps({"seconds": seconds, "chose": str(matmul.best_config), "output": error}))
'''

SUBMISSION = r'''
import json, os, sys, time
from pathlib import Path
import torch
from fa2_sandbox.runner import parallel_autotune
from fa2_sandbox.runner.serve import load_adapters
if sys.argv[1] == "side-by-side":
    assert parallel_autotune.install()
root = Path(sys.argv[2])
os.chdir(root)
attention = load_adapters(root, root / "tests" / "adapters.py", []).get_flashattention_autograd_function_triton()
torch.manual_seed(0)
q, k, v = (torch.randn(2, 1024, 128, device="cuda", requires_grad=True) for _ in range(3))
t = time.perf_counter()
o = attention.apply(q, k, v, sys.argv[3] == "causal")
torch.cuda.synchronize()
forward = time.perf_counter() - t
o.sum().backward()
torch.cuda.synchronize()
print(json.dumps({"seconds": time.perf_counter() - t, "forward_s": forward, "output": float(o.double().sum())}))
'''


def start(way: str, folder: str, child: str, args: list) -> subprocess.Popen:
    script = os.path.join(folder, "first_call.py")  # Triton reads a kernel's source from its file
    Path(script).write_text(child)
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(folder, "triton"), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, script, way, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submission", type=Path, help="a repo whose Triton FA2 is timed instead of the matmul")
    parser.add_argument("--full", action="store_true", help="the submission's call without the causal mask")
    options = parser.parse_args()
    child, args = MATMUL, []
    if options.submission:
        child, args = SUBMISSION, [str(options.submission.resolve()), "full" if options.full else "causal"]
    ways = ("one by one", "side-by-side")
    folders = [tempfile.TemporaryDirectory() for _ in ways]
    print(f"timing the first call both ways at once: {'the matmul' if not options.submission else args}", flush=True)
    running = {way: start(way, folder.name, child, args) for way, folder in zip(ways, folders)}
    results = {}
    for way, process in running.items():
        out, err = process.communicate()
        if process.returncode:
            raise SystemExit(f"{way}: the first call failed:\n{err[-3000:]}")
        results[way] = json.loads(out.strip().splitlines()[-1])
    for way, r in results.items():
        rest = ", ".join(f"{k} {v}" for k, v in r.items() if k != "seconds")
        print(f"{way:>13}: first call {r['seconds']:.1f} s, {rest}")
    serial, parallel = results["one by one"]["seconds"], results["side-by-side"]["seconds"]
    same = results["one by one"]["output"] == results["side-by-side"]["output"]
    print(f"side-by-side / one by one: {parallel / serial:.2f}; the same output: {same}")


if __name__ == "__main__":
    main()
