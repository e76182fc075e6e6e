"""Compilers' caches that outlive the runner, per submission: Triton's compiled kernels and autotuning
results, and torch.compile's output (kept_inductor_cache).

A runner's Triton cache lives in its scratch folder and goes with it, so every run compiled and
autotuned every kernel again, for every attention case of an autotuned kernel (notes/grading-speed.md).
This keeps a copy under the grader's cache folder (GRADER_CACHE_DIR, else
$XDG_CACHE_HOME/fa2-grader, else ~/.cache/fa2-grader), brought into the scratch folder when the
runner's folder is made, then between any two of its calls, and when it is removed
(scratch.ScratchFolder.share_kernels): compiled kernels one copy per submission, shared by its
tracks (the Triton memory and timing tracks compile the kernels of a bf16 causal track again, a
hygiene check the kernels of its float32 twin, and runners of one submission run side by side,
so a kernel one of them compiled reaches the others at their next call), and with
TRITON_CACHE_AUTOTUNING=1 in the runner's environment autotuning results one copy per
(submission, track). A compiled kernel is the same whichever runner compiled it; an autotuning
result is not (a kernel whose key omits the length keeps the choice made at the first length it
met), so those stay with the track whose cases chose them, and a verdict never depends on which
of a submission's tracks ran first.

What a runner writes is untrusted, so the copy is one submission's own: no submission ever
reads a file another wrote, and a poisoned entry can only hurt the grading of the one who
wrote it. Triton keys entries by the kernel's source and the compiler, so a changed kernel
misses the cache instead of reading a stale one. A compiled kernel is a group of files whose
index (`__grp__<name>.json`) holds their absolute paths, which name the last runner's scratch
folder; bring_in points them at the new folder, or Triton finds them gone and compiles again
(it did, in every runner, until this was measured: notes/grading-speed.md, "Kept kernels were
compiled again by every runner"). Only
regular files with one link are copied back (never a link, a device or a hard link to a file
elsewhere), each under MAX_FILE bytes and MAX_TOTAL in all, and each is written whole (a
temporary file, then a rename), so two runners of one submission finishing at once leave one
of their copies, never a mix; a kernel's index is written after its files, so a runner starting
meanwhile finds a kernel whole or not at all.
"""
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

MAX_FILE = 64 << 20
MAX_TOTAL = 1 << 30
# How many kernels a runner took from its submission's other runners while it ran (ScratchFolder.share_kernels):
# a count in each line of bench/grade_speed.py's GRADER_CPU_LOG.
SHARED_KERNELS = "kernels from its other runners"


def cache_root() -> Path:
    if os.environ.get("GRADER_CACHE_DIR"):
        return Path(os.environ["GRADER_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fa2-grader"


def kept_cache(submission_root: Path, track: str = "") -> Path:
    """Where one submission's track keeps its autotuning results between runs; with no track,
    where the submission's compiled kernels are kept, for all its tracks."""
    key = hashlib.sha256(f"{os.path.realpath(submission_root)}\0{track}".encode()).hexdigest()[:24]
    return cache_root() / "triton" / key


def kept_inductor_cache(submission_root: Path) -> Path:
    """Where one submission's torch.compile output is kept between runs, for all its tracks.

    torch.compile's caches (the FX graph and AOTAutograd caches, the inductor's generated code and
    its compiled C++) are keyed by the traced graph, its input shapes and guards, and the compiler's
    version, so an entry is the same whichever runner wrote it: a later runner of the submission
    skips lowering and code generation, and traces with dynamo only. Unlike a Triton autotuning
    result, what the inductor generates masks every tile at every length, so sharing it across
    tracks cannot turn a correct kernel into one that reads past the end."""
    key = hashlib.sha256(os.path.realpath(submission_root).encode()).hexdigest()[:24]
    return cache_root() / "inductor" / key


def is_inductor_entry(relative: str) -> bool:
    """What of a runner's inductor folder is worth keeping: not its lock files."""
    return not relative.startswith("locks" + os.sep) and not relative.endswith(".lock")


def is_autotuning(relative: str) -> bool:
    """An autotuning result (triton/runtime/autotuner.py check_disk_cache names it)."""
    return relative.endswith(".autotune.json")


def holds_autotuning(cache: Path) -> bool:
    """Whether a runner's Triton cache holds an autotuning result: one of its kernels autotuned
    (with TRITON_CACHE_AUTOTUNING=1 the autotuner writes each choice into its kernel's entry)."""
    try:
        with os.scandir(cache) as entries:
            folders = [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
        return any(is_autotuning(name) for folder in folders for name in os.listdir(folder))
    except OSError:
        return False


def _regular_files(folder: Path):
    """(relative path, size) of the plain files under `folder`, links and special files left out."""
    for directory, dirs, files in os.walk(folder):  # os.walk does not follow links to folders
        for name in files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
                yield os.path.relpath(path, folder), info.st_size


def _copy_file(source: str, target: Path, uid: int | None) -> None:
    """Copy one file whole, never through a link at the source, owned by `uid` if given."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as reader:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with open(temporary, "wb") as writer:
            shutil.copyfileobj(reader, writer, MAX_FILE)
    if uid is not None:
        os.chown(temporary, uid, uid)
    os.replace(temporary, target)


def _relocate_group(index: Path) -> None:
    """Point a kernel group's index at its files in this folder: the same names, beside it.
    Only the names are read from the (untrusted) index; a file it names elsewhere is dropped,
    and an index that does not parse is removed, so Triton compiles that kernel again."""
    try:
        children = json.loads(index.read_text())["child_paths"]
        relocated = {str(name): str(index.parent / os.path.basename(str(path))) for name, path in children.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        index.unlink(missing_ok=True)
        return
    index.write_text(json.dumps({"child_paths": relocated}))


def kernel_folders(folder: Path) -> set:
    """The kernels a Triton cache holds: a folder each, named by Triton's hash of the kernel and its
    specialization (an autotuning result has a folder of its own too)."""
    try:
        return {entry.name for entry in os.scandir(folder)
                if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)}
    except OSError:
        return set()


def folder_bytes(folder: Path) -> int:
    """What take_back would weigh of a folder: its plain files' sizes."""
    return sum(size for _, size in _regular_files(folder))


def bring_in(kept: Path, cache: Path, uid: int | None) -> int:
    """Copy the kept kernels into a runner's empty cache folder; the number of files."""
    count = 0
    if kept.is_dir():
        for relative, _ in _regular_files(kept):
            if os.path.basename(relative).startswith("."):  # a file another runner's take_back is writing
                continue
            _copy_file(str(kept / relative), cache / relative, uid)
            if os.path.basename(relative).startswith("__grp__"):
                _relocate_group(cache / relative)
            count += 1
    if uid is not None:  # the folders too: the runner adds to them
        for directory, _, _ in os.walk(cache):
            os.chown(directory, uid, uid)
    return count


def take_back(cache: Path, kept: Path, which=lambda relative: True) -> int:
    """Copy what a runner's cache holds back to where it is kept, the files `which(relative)`
    accepts, a kernel's index after its files; the number of files."""
    count, total = 0, 0
    if not cache.is_dir():
        return 0
    files = sorted(_regular_files(cache), key=lambda entry: os.path.basename(entry[0]).startswith("__grp__"))
    for relative, size in files:
        if size > MAX_FILE or total + size > MAX_TOTAL or relative.startswith(".") or not which(relative):
            continue
        target = kept / relative
        try:
            if target.exists() and target.stat().st_size == size:
                continue  # Triton never rewrites an entry: same name and size, same file
            _copy_file(str(cache / relative), target, None)
        except OSError:
            continue  # gone, or replaced by a link, while we copied: not kept
        count += 1
        total += size
    return count
