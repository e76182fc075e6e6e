"""The kept Triton cache (fa2_sandbox/harness/kernel_cache.py): what comes back from a runner's
scratch folder, and what never does."""
import json
import os
import subprocess
import sys
from pathlib import Path

from fa2_sandbox.harness import kernel_cache
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.harness.scratch import PROJECT_ROOT, ScratchFolder

REFERENCE = PROJECT_ROOT / "submissions" / "reference"


def test_kernels_survive_the_scratch_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_CACHE_DIR", str(tmp_path / "kept"))
    submission = load_submission(REFERENCE)
    kept = kernel_cache.kept_cache(submission.root, "triton-bf16-full-d64")
    first = ScratchFolder(submission, uid=None, kept_kernels=kept)
    assert first.runner_env({"network": False}, {})["TRITON_CACHE_AUTOTUNING"] == "1"
    entry = first.triton_cache / "abc123" / "_attn_fwd.cubin"
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"\x7fELF kernel")
    first.remove()
    assert not first.path.exists()
    assert (kernel_cache.kept_cache(submission.root) / "abc123" / "_attn_fwd.cubin").read_bytes() == b"\x7fELF kernel"

    second = ScratchFolder(submission, uid=None, kept_kernels=kept)
    assert (second.triton_cache / "abc123" / "_attn_fwd.cubin").read_bytes() == b"\x7fELF kernel"
    second.remove()


def test_compiled_kernels_are_shared_by_a_submissions_tracks_and_autotuning_is_not(tmp_path, monkeypatch):
    """A kernel the memory track compiled serves the bf16 causal track's runner; the memory track's
    autotuning choice (made at N = 16384, by a key that may omit the length) stays with it."""
    monkeypatch.setenv("GRADER_CACHE_DIR", str(tmp_path / "kept"))
    submission = load_submission(REFERENCE)
    memory = ScratchFolder(submission, uid=None, kept_kernels=kernel_cache.kept_cache(submission.root, "memory-triton"))
    (memory.triton_cache / "k1").mkdir()
    (memory.triton_cache / "k1" / "_attn_fwd.cubin").write_bytes(b"\x7fELF kernel")
    (memory.triton_cache / "t1").mkdir()
    (memory.triton_cache / "t1" / "_attn_fwd.autotune.json").write_text('{"configs_timings": []}')
    memory.remove()

    causal = ScratchFolder(submission, uid=None,
                           kept_kernels=kernel_cache.kept_cache(submission.root, "triton-bf16-causal"))
    assert (causal.triton_cache / "k1" / "_attn_fwd.cubin").read_bytes() == b"\x7fELF kernel"
    assert not (causal.triton_cache / "t1").exists()
    causal.remove()
    again = ScratchFolder(submission, uid=None, kept_kernels=kernel_cache.kept_cache(submission.root, "memory-triton"))
    assert (again.triton_cache / "t1" / "_attn_fwd.autotune.json").exists()
    again.remove()


def test_a_runner_whose_kernels_autotuned_says_so(tmp_path, monkeypatch):
    """The scheduler starts an autotuning Triton slot's largest kernels early (GradingScheduling.autotuned):
    the runner's Triton cache tells, by an autotuning result in an entry's folder; a compiled kernel
    alone does not, and off the GPU (nothing kept) the answer is no."""
    monkeypatch.setenv("GRADER_CACHE_DIR", str(tmp_path / "kept"))
    submission = load_submission(REFERENCE)
    runner = ScratchFolder(submission, uid=None, kept_kernels=kernel_cache.kept_cache(submission.root, "memory-triton"))
    (runner.triton_cache / "k1").mkdir()
    (runner.triton_cache / "k1" / "_attn_fwd.cubin").write_bytes(b"\x7fELF kernel")
    assert not runner.autotuned()
    (runner.triton_cache / "t1").mkdir()
    (runner.triton_cache / "t1" / "_attn_fwd.autotune.json").write_text('{"configs_timings": []}')
    assert runner.autotuned()
    runner.remove()
    assert not kernel_cache.holds_autotuning(runner.triton_cache)  # gone with its folder: no, not an error
    on_cpu = ScratchFolder(submission, uid=None)
    (on_cpu.triton_cache / "t1").mkdir()
    (on_cpu.triton_cache / "t1" / "_attn_fwd.autotune.json").write_text('{"configs_timings": []}')
    assert not on_cpu.autotuned()
    on_cpu.remove()


def test_a_kernels_index_is_kept_after_its_files(tmp_path, monkeypatch):
    """A runner starting while another takes its kernels back finds a kernel whole or not at all:
    Triton reads a kernel through its index, and one whose files are missing failed to load."""
    cache, kept = tmp_path / "cache", tmp_path / "kept"
    (cache / "k").mkdir(parents=True)
    for name in ("__grp___attn_fwd.json", "_attn_fwd.cubin", "_attn_fwd.json", "_attn_fwd.ptx"):
        (cache / "k" / name).write_text(name)
    written = []
    real = kernel_cache._copy_file
    monkeypatch.setattr(kernel_cache, "_copy_file", lambda source, target, uid: (written.append(target.name),
                                                                               real(source, target, uid)))
    assert kernel_cache.take_back(cache, kept) == 4
    assert written[-1] == "__grp___attn_fwd.json"


def test_tracks_and_submissions_keep_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_CACHE_DIR", str(tmp_path))
    a, b = tmp_path / "alice", tmp_path / "bob"
    keys = {kernel_cache.kept_cache(a, "timing"), kernel_cache.kept_cache(b, "timing"),
            kernel_cache.kept_cache(a, "ddp-ddp")}
    assert len(keys) == 3 and all(k.is_relative_to(tmp_path / "triton") for k in keys)


def test_only_plain_files_come_back(tmp_path):
    cache, kept = tmp_path / "cache", tmp_path / "kept"
    secret = tmp_path / "secret.txt"
    secret.write_text("another student's file")
    (cache / "k").mkdir(parents=True)
    (cache / "k" / "kernel.json").write_text("{}")
    os.symlink(secret, cache / "k" / "link.json")  # a link to a file the runner could not read
    os.link(secret, cache / "k" / "hard.json")  # a hard link to one
    os.symlink(tmp_path, cache / "dirlink")  # a link to a folder
    os.mkfifo(cache / "k" / "fifo")
    (cache / "k" / "huge.bin").write_bytes(b"\0" * 16)

    copied = kernel_cache.take_back(cache, kept)
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == \
        ["k/huge.bin", "k/kernel.json"]
    assert copied == 2
    assert kernel_cache.take_back(cache, kept) == 0  # the same entries: nothing to copy again


def test_a_kept_kernel_is_found_by_the_next_runner(tmp_path, monkeypatch):
    """Triton indexes a compiled kernel's files by absolute path (a group file): the next runner,
    in another scratch folder, must find them through Triton's own cache manager, or it compiles
    the kernel again (it did: notes/grading-speed.md)."""
    from triton.runtime.cache import get_cache_manager
    key = "ab" * 32
    first, kept, second = tmp_path / "first", tmp_path / "kept", tmp_path / "second"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(first))
    manager = get_cache_manager(key)
    cubin = manager.put(b"\x7fELF kernel", "_attn_fwd.cubin")
    metadata = manager.put("{}", "_attn_fwd.json")
    manager.put_group("_attn_fwd.json", {"_attn_fwd.cubin": cubin, "_attn_fwd.json": metadata})
    kernel_cache.take_back(first, kept)
    for path in list(first.rglob("*"))[::-1]:
        path.unlink() if path.is_file() else path.rmdir()  # the first runner's folder is gone

    kernel_cache.bring_in(kept, second, uid=None)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(second))
    group = get_cache_manager(key).get_group("_attn_fwd.json")
    assert group is not None and sorted(group) == ["_attn_fwd.cubin", "_attn_fwd.json"]
    assert all(Path(p).is_relative_to(second) for p in group.values())
    assert Path(group["_attn_fwd.cubin"]).read_bytes() == b"\x7fELF kernel"


def test_a_kernel_index_cannot_point_outside_its_folder(tmp_path):
    kept, cache = tmp_path / "kept", tmp_path / "cache"
    (kept / "k").mkdir(parents=True)
    (kept / "k" / "__grp__a.json").write_text(json.dumps({"child_paths": {"a.cubin": "/etc/shadow"}}))
    (kept / "k" / "__grp__b.json").write_text("not json")
    kernel_cache.bring_in(kept, cache, uid=None)
    group = json.loads((cache / "k" / "__grp__a.json").read_text())
    assert group == {"child_paths": {"a.cubin": str(cache / "k" / "shadow")}}
    assert not (cache / "k" / "__grp__b.json").exists()


def test_torch_compile_output_is_kept_for_the_submissions_next_runner(tmp_path, monkeypatch):
    """A runner's inductor folder comes back, without its locks, and the submission's next runner of
    any track starts with it; the runner's TORCHINDUCTOR_CACHE_DIR names its own scratch copy."""
    monkeypatch.setenv("GRADER_CACHE_DIR", str(tmp_path / "kept"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "graders-own"))
    submission = load_submission(REFERENCE)
    first = ScratchFolder(submission, uid=None, kept_kernels=kernel_cache.kept_cache(submission.root, "pytorch"))
    assert first.runner_env({"network": False}, {})["TORCHINDUCTOR_CACHE_DIR"] == str(first.inductor_cache)
    (first.inductor_cache / "fxgraph" / "ab").mkdir(parents=True)
    (first.inductor_cache / "fxgraph" / "ab" / "entry").write_bytes(b"graph")
    (first.inductor_cache / "locks").mkdir()
    (first.inductor_cache / "locks" / "ab.lock").write_text("")
    first.remove()

    second = ScratchFolder(submission, uid=None, kept_kernels=kernel_cache.kept_cache(submission.root, "memory-triton"))
    assert (second.inductor_cache / "fxgraph" / "ab" / "entry").read_bytes() == b"graph"
    assert not (second.inductor_cache / "locks").exists()
    second.remove()


def test_a_kept_inductor_cache_is_hit_from_another_folder(tmp_path):
    """torch.compile's caches hold no absolute path of the folder that wrote them: a graph compiled
    in one runner's folder, taken back and brought into another's, and the first folder removed,
    is found there (a cache hit), not compiled again. One process, its in-memory caches cleared
    between the two compiles, so only the second folder's files can answer."""
    script = tmp_path / "compiled.py"
    script.write_text(
        "import os, shutil, sys\n"
        "from pathlib import Path\n"
        "import torch\n"
        "from torch._dynamo.utils import counters\n"
        "from torch._inductor.codecache import PyCodeCache\n"
        "from fa2_sandbox.harness import kernel_cache\n"
        "base = Path(sys.argv[1])\n"
        "def compile_in(folder):\n"
        "    os.environ['TORCHINDUCTOR_CACHE_DIR'] = str(folder)\n"
        "    torch._dynamo.reset()\n"
        "    PyCodeCache.cache_clear()\n"
        "    counters.clear()\n"
        "    f = torch.compile(lambda q, k: torch.softmax(q @ k.T, -1).sum(), fullgraph=True)\n"
        "    f(torch.randn(8, 4), torch.randn(8, 4))\n"
        "    print(counters['inductor']['fxgraph_cache_hit'], counters['inductor']['fxgraph_cache_miss'])\n"
        "compile_in(base / 'first')\n"
        "kernel_cache.take_back(base / 'first', base / 'kept', kernel_cache.is_inductor_entry)\n"
        "kernel_cache.bring_in(base / 'kept', base / 'second', None)\n"
        "shutil.rmtree(base / 'first')\n"
        "compile_in(base / 'second')\n")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                         check=True)
    assert [line.split() for line in out.stdout.splitlines()] == [["0", "1"], ["1", "0"]]


def test_runners_side_by_side_share_kernels_between_calls(tmp_path, monkeypatch):
    """A kernel one runner compiled reaches a runner of the same submission that is already running,
    at its next call, with its index pointing into that runner's folder, and is counted once; its
    autotuning result does not (it stays with the track that chose it)."""
    monkeypatch.setenv("GRADER_CACHE_DIR", str(tmp_path / "kept"))
    submission = load_submission(REFERENCE)
    fp32, bf16 = (ScratchFolder(submission, uid=None, kept_kernels=kernel_cache.kept_cache(submission.root, track))
                  for track in ("triton-fp32-full", "triton-bf16-full"))
    (fp32.triton_cache / "k1").mkdir()
    (fp32.triton_cache / "k1" / "_attn_fwd.cubin").write_bytes(b"\x7fELF kernel")
    (fp32.triton_cache / "k1" / "__grp___attn_fwd.json").write_text(
        json.dumps({"child_paths": {"_attn_fwd.cubin": str(fp32.triton_cache / "k1" / "_attn_fwd.cubin")}}))
    (fp32.triton_cache / "t1").mkdir()
    (fp32.triton_cache / "t1" / "_attn_fwd.autotune.json").write_text('{"configs_timings": []}')
    fp32.share_kernels()  # after fp32's call

    bf16.share_kernels()  # before bf16's next call
    assert (bf16.triton_cache / "k1" / "_attn_fwd.cubin").read_bytes() == b"\x7fELF kernel"
    index = json.loads((bf16.triton_cache / "k1" / "__grp___attn_fwd.json").read_text())
    assert index["child_paths"]["_attn_fwd.cubin"] == str(bf16.triton_cache / "k1" / "_attn_fwd.cubin")
    assert not (bf16.triton_cache / "t1").exists()
    assert bf16.kernels_from_others == 1
    bf16.share_kernels()  # nothing new: nothing counted again, and k1 is not sent back
    assert bf16.kernels_from_others == 1 and fp32.kernels_from_others == 0
    fp32.remove()
    bf16.remove()


def test_what_runners_share_between_calls_is_bounded(tmp_path, monkeypatch):
    """A runner's kernels go to the kept folder between calls only up to MAX_TOTAL bytes in all, as
    at its end: its files are untrusted, and one call after another must not fill the grader's disk."""
    monkeypatch.setenv("GRADER_CACHE_DIR", str(tmp_path / "kept"))
    monkeypatch.setattr(kernel_cache, "MAX_TOTAL", 100)
    submission = load_submission(REFERENCE)
    runner = ScratchFolder(submission, uid=None, kept_kernels=kernel_cache.kept_cache(submission.root, "triton"))
    for key in ("k1", "k2", "k3"):
        (runner.triton_cache / key).mkdir()
        (runner.triton_cache / key / "_attn_fwd.cubin").write_bytes(b"x" * 40)
        runner.share_kernels()
    kept = kernel_cache.kernel_folders(kernel_cache.kept_cache(submission.root))
    assert kept == {"k1", "k2"}
    runner.remove()
