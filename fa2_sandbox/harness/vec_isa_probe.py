"""One probe of torch.compile's CPU vector instructions per grading run, not one per runner.

The first time a process compiles for the CPU with torch.compile, inductor asks which vector
instruction sets (AVX-512, AVX2) it may use: for each one the CPU claims, it compiles a small C++
file and loads the library in a new Python (torch/_inductor/cpu_vec_isa.py, VecISA.check_build;
torch 2.11 imports torch in that Python). In a class run that was about half a minute of a core in
every runner whose submission torch.compile's its PyTorch slot (notes/grading-speed.md, "the
fork server on the whole class"), the same answer on the same machine each time.

So the controller probes once, in the background, while its workers start, and writes what it
found to a file. Where every instruction set the CPU claims builds and loads, each runner started
after that gets TORCHINDUCTOR_VEC_ISA_OK=1, inductor's own switch for "take the claimed sets
without checking": the answer its own probe would have found. Where one does not, or the probe
failed or has not answered yet, a runner gets nothing and probes for itself, as before. The
probe runs the grader's torch with the grader's compiler and no submission code, so no
submission can change another's answer.

It is worth its cost only where several runners would probe: a run of at least two submissions
whose Python files call torch.compile (`worth_probing`).
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ENV = "TORCHINDUCTOR_VEC_ISA_OK"
TIMEOUT_S = 300.0
SKIP_FOLDERS = {".git", ".venv", "venv", "site-packages", "node_modules", "__pycache__", "wandb"}

# valid_vec_isa_list() keeps the sets that build and load (the probe); with vec_isa_ok set, its
# undecorated body keeps every set the CPU claims without building any.
PROBE = """
import json
from torch._inductor import config, cpu_vec_isa
built = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
config.cpp.vec_isa_ok = True
claimed = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list.__wrapped__()]
print(json.dumps({"built": built, "claimed": claimed}))
"""


def calls_torch_compile(root: Path) -> bool:
    """Whether a Python file of the submission at `root` mentions torch.compile (read, not run)."""
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in SKIP_FOLDERS]
        for name in files:
            if name.endswith(".py"):
                try:
                    if "torch.compile" in Path(folder, name).read_text(errors="replace"):
                        return True
                except OSError:
                    continue
    return False


def worth_probing(submissions) -> bool:
    """At least two submissions that may each have a runner probe."""
    found = 0
    for submission in submissions:
        found += calls_torch_compile(submission.root)
        if found >= 2:
            return True
    return False


def start(path: Path) -> threading.Thread:
    """In the controller: probe in a thread and write {"built", "claimed"} or {"error"} to `path`."""
    def probe():
        with tempfile.TemporaryDirectory(prefix="fa2-vec-isa-") as cache:
            env = {k: v for k, v in os.environ.items() if k != ENV}
            env.update({"TORCHINDUCTOR_CACHE_DIR": cache, "CUDA_VISIBLE_DEVICES": ""})
            try:
                done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=cache, capture_output=True,
                                      text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
                answer = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else \
                    {"error": f"exit status {done.returncode}: {done.stderr.strip()[-500:]}"}
            except (subprocess.TimeoutExpired, OSError, ValueError, IndexError) as exc:
                answer = {"error": repr(exc)}
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(answer))
        os.replace(partial, path)  # a worker never reads half a file

    thread = threading.Thread(target=probe, name="vec-isa-probe", daemon=True)
    thread.start()
    return thread


def runner_env(path: Path | None) -> dict:
    """In a worker, for each runner it starts: {ENV: "1"} where the probe has answered that every
    claimed set builds and loads; else nothing, and the runner probes for itself."""
    if path is None:
        return {}
    try:
        answer = json.loads(path.read_text())
    except (OSError, ValueError):  # not answered yet
        return {}
    claimed = answer.get("claimed")
    return {ENV: "1"} if claimed and answer.get("built") == claimed else {}
