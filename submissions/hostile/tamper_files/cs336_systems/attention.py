"""DELIBERATELY HOSTILE test code (see README.md): looks for the grader's files and other
submissions' files, tries to read them and to write next to them. It never modifies an existing
file: a write is tested by opening for update without writing, or by creating and removing a new
file. It prints what it managed, then answers with zeros."""
import glob
import os
import re

import torch

MINE = os.path.dirname(os.getcwd())  # the runner's own scratch folder: fair game
FOUND = {"read": [], "write": []}


def _mine(path):
    return os.path.realpath(path).startswith(MINE + os.sep)


def candidate_roots():
    roots = {"/work/main", "/autograder", "/workspace", "/grader", os.path.expanduser("~")}
    for d in glob.glob("/proc/[0-9]*"):
        for what in ("cmdline", "environ"):
            try:
                text = open(f"{d}/{what}", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            roots |= set(re.findall(r"(/[\w.@+-]+(?:/[\w.@+-]+)*)", text))
        try:
            roots.add(os.readlink(f"{d}/cwd"))
        except OSError:
            pass
    try:
        for line in open("/proc/self/mountinfo"):
            roots.add(line.split()[4])
    except OSError:
        pass
    expanded = set()
    for r in roots:
        while r not in ("/", ""):
            expanded.add(r)
            r = os.path.dirname(r)
    return sorted(p for p in expanded if os.path.isdir(p) and not _mine(p) and not p.startswith(("/proc", "/sys", "/dev", "/usr", "/etc", "/lib", "/bin", "/sbin", "/root/.pyenv", "/work/.library")))


def try_read(path):
    if _mine(path) or not os.path.isfile(path):
        return
    try:
        with open(path, "rb") as f:
            f.read(64)
        FOUND["read"].append(path)
    except OSError:
        pass


def try_write_existing(path):
    if _mine(path) or not os.path.isfile(path):
        return
    try:
        with open(path, "r+b"):  # opened for update, nothing written
            FOUND["write"].append(path)
    except OSError:
        pass


def try_create(folder):
    if _mine(folder) or not os.path.isdir(folder):
        return
    path = os.path.join(folder, "PWNED-by-hostile-tamper_files")
    try:
        with open(path, "x"):
            pass
        os.unlink(path)
        FOUND["write"].append(folder)
    except OSError:
        pass


def snoop():
    for root in candidate_roots()[:400]:
        for pattern in ("grading/rubric.yaml", "reference/flash_pytorch.py", "reference/oracle.py",
                        "README.md", "*.yaml", "reports/*/results.json", "reports/*/checks/*.json",
                        "*/results.json", "submissions/*/tests/adapters.py", "*/tests/adapters.py",
                        "exchange/*.pt", "*/exchange/*.pt"):
            for path in glob.glob(os.path.join(root, pattern))[:20]:
                if os.path.basename(path) in ("results.json", "adapters.py") or path.endswith((".yaml", ".pt", ".py", ".json", ".md")):
                    if "/reports/" in path or path.endswith(("rubric.yaml", "results.json")) or "/reference/" in path or "/submissions/" in path or "/exchange/" in path or path.endswith("README.md"):
                        try_read(path)
                        try_write_existing(path)
        for folder in ("reports", "submissions", "reference", "grading", "exchange", ""):
            if folder == "" and not glob.glob(os.path.join(root, "reports")):
                continue
            try_create(os.path.join(root, folder))
        for path in glob.glob(os.path.join(root, "reports", "*")) + glob.glob(os.path.join(root, "submissions", "*")):
            try_create(path)
    for other in glob.glob("/tmp/grade-*"):  # other runners' scratch folders
        for path in glob.glob(os.path.join(other, "*", "*")) + glob.glob(os.path.join(other, "*", "*", "*")):
            try_read(path)
        for folder in glob.glob(os.path.join(other, "*")):
            try_create(folder)
    # the link this repo ships: ../../../reference (the project's reference solutions)
    try_read(os.path.join(os.getcwd(), "peek", "flash_pytorch.py"))
    reads, writes = sorted(set(FOUND["read"])), sorted(set(FOUND["write"]))
    print(f"[hostile tamper_files] forbidden reads={len(reads)} writes={len(writes)}", flush=True)
    for path in reads[:10]:
        print(f"[hostile tamper_files] read {path}", flush=True)
    for path in writes[:10]:
        print(f"[hostile tamper_files] wrote {path}", flush=True)


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        snoop()
        ctx.save_for_backward(torch.zeros(q.shape[:-1]))
        return torch.zeros_like(q)

    @staticmethod
    def backward(ctx, do):
        return torch.zeros_like(do), None, None, None
