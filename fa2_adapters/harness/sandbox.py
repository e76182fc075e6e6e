"""Confinement for a submission's runner: its own uid, a private view of the disk and network,
resource limits, and a way to kill every process it ever started.

Two halves live here:

- the harness side (used by fa2_adapters.harness: client, scratch, watchdog): `isolation()` probes
  what this machine allows, once per process and memory limit; `claim_uid`, `kill_uid`,
  `processes` and `rss_bytes` manage one runner's processes; `launch_command` builds the command
  line that starts a runner confined.
- the launcher (`python -I fa2_adapters/harness/sandbox.py SPEC -- ARGV...`), which runs between the fork
  and the runner's exec: it sets hard resource limits, enters new mount and network namespaces,
  builds a root of its own (a tmpfs holding binds of the system folders, the Python install and
  the runner's scratch folder, at their usual paths, plus a private /tmp and /dev/shm), chroots
  into it, drops to the runner's uid and execs the runner. Standard library only.

Modes, best first (`isolation()` picks the first that works here, and says so):

- "namespace": running as root with CAP_SYS_ADMIN. The runner runs as a fresh numeric uid (no
  passwd entry) in a root that holds only an allowlist: /usr, /bin, /lib*, /sbin, /etc, /dev,
  /proc, /sys, the Python install and its own scratch folder. The project, reports, rubrics,
  other submissions, /home, /root, /run, other runners' folders: none of it exists there, wherever
  it lives on this machine. A network namespace leaves it only loopback (so it cannot reach other
  runners' gloo ports or the outside). It cannot raise its limits.
- "uid": root, but namespaces are refused. The runner runs as a fresh uid: it cannot write
  anything of the project or of other submissions, but can read whatever is world-readable.
- "none": not root. The runner runs as this user: limits and process-group kills still apply,
  but it can read and write what this user can. The note says so in every runner log.
"""
import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SANDBOX_PY = Path(__file__).resolve()

UID_BASE, UID_SPAN = 1_900_000_000, 200_000_000  # far above any real account

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
PR_SET_PDEATHSIG = 1
MS_NOSUID, MS_NODEV = 2, 4
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


# -- the launcher ----------------------------------------------------------------------------

def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else str(s).encode()
    _check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {target}")


SYSTEM_BINDS = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev", "/proc", "/sys"]
PRIVATE_TMPFS = {"/tmp": "size=256m,mode=1777", "/dev/shm": "size=512m,mode=1777"}  # RAM: kept small
NEW_ROOT = "/tmp/fa2-grader-newroot"  # a mount point only: each runner mounts its root there, privately


def _build_root(libc, binds: list, scratch: str) -> None:
    """A tmpfs root holding `binds` (at their own paths), the private tmpfs folders and `scratch`,
    then chroot into it. /proc/self/... and every path the runner was given stay valid."""
    os.makedirs(NEW_ROOT, mode=0o700, exist_ok=True)
    _mount(libc, "tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    entries = [(p, "bind") for p in binds] + [(p, "tmpfs") for p in PRIVATE_TMPFS] + [(scratch, "scratch")]
    for path, kind in sorted(entries, key=lambda e: (e[0].count("/"), e[0])):
        target = NEW_ROOT + path
        if kind == "tmpfs":
            os.makedirs(target, mode=0o755, exist_ok=True)
            _mount(libc, "tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, PRIVATE_TMPFS[path])
            continue
        if not os.path.lexists(path):
            continue
        if os.path.islink(path):  # /bin -> usr/bin on merged-/usr systems
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            if not os.path.lexists(target):
                os.symlink(os.readlink(path), target)
            continue
        if os.path.isdir(path):
            os.makedirs(target, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
            open(target, "a").close()
        # the scratch folder without its submounts; everything else with them (/dev/pts, ...)
        _mount(libc, path, target, None, MS_BIND | (0 if kind == "scratch" else MS_REC))
    os.chdir(NEW_ROOT)
    os.chroot(".")


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, siocgifflags, request))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


def launch(spec: dict, argv: list) -> None:
    """Confine this process as `spec` says, then exec `argv`. Never returns."""
    grader = os.getppid()
    os.umask(0o022)
    for name, value in spec.get("limits", {}).items():
        which = getattr(resource, name)
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))  # hard too: the runner cannot raise them again
    libc = _libc()
    cwd = os.getcwd()
    if spec.get("namespace"):
        _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing below leaks to the host
        _build_root(libc, spec["binds"], spec["scratch"])
        if spec.get("network"):
            _check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            _loopback_up()
    uid = spec.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    # A runner dies with the grader that started it (a killed pytest worker, say): a submission
    # that hangs must not spin on after it. Set after the change of uid, which clears it.
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != grader:  # the grader died before that: nobody is waiting
        os._exit(71)
    os.chdir(cwd)  # the same path, in the new root
    os.execv(argv[0], argv)


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    try:
        launch(json.loads(args[0]), args[split + 1:])
    except BaseException as exc:  # before the runner exists: say why on the log, exit 71
        print(f"[grader] the runner's sandbox could not be set up: {exc!r}", file=sys.stderr, flush=True)
        os._exit(71)


# -- the harness side ------------------------------------------------------------------------

def launch_command(spec: dict, argv: list) -> list:
    return [sys.executable, "-I", str(SANDBOX_PY), json.dumps(spec), "--", *argv]


def _is_under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def python_roots(hidden: list) -> list:
    """Directories the runner's interpreter reads: its prefixes (kept even inside a hidden folder,
    e.g. a .venv in the project) and the sys.path entries outside `hidden` (the project root,
    which pytest puts on sys.path, above all)."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                os.path.dirname(os.path.realpath(sys.executable))}
    entries = {p for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)}
    entries = {os.path.realpath(p) for p in entries}
    entries = {p for p in entries if not any(_is_under(p, os.path.realpath(h)) for h in hidden)}
    roots = {os.path.realpath(r) for r in prefixes} | entries
    roots.discard("/")
    return sorted(r for r in roots if not any(r != o and _is_under(r, o) for o in roots))


def root_binds(hidden: list) -> list:
    """What the runner's root holds besides its scratch folder and private tmpfs: the system
    folders and the Python install (minus what is already inside a system folder)."""
    binds = [p for p in SYSTEM_BINDS if os.path.lexists(p)]
    return binds + [r for r in python_roots(hidden) if not any(_is_under(r, b) for b in binds)]


_ISOLATION = {}  # (scratch_parent, data_limit) -> what isolation() found for them


def isolation(scratch_parent: str, data_limit: int = 0) -> dict:
    """What confinement works on this machine, probed by starting a confined interpreter that
    imports torch (and, where the harness sees a GPU, allocates on it):
    {"mode": "namespace" | "uid" | "none", "network": bool, "data_limit": bool, "note": str}.
    `data_limit` is the RLIMIT_DATA to try (0: none); if the probe fails with it and works
    without it (a driver mapping more than the limit, say), runners go without it and the
    harness's memory watchdog alone bounds them. Probed once per process for each
    (scratch_parent, data_limit): a limit that works says nothing of a smaller one. The user,
    GRADER_SANDBOX and the GPU are no part of the key: they are taken as fixed for the process."""
    key = (scratch_parent, data_limit)
    if key not in _ISOLATION:
        _ISOLATION[key] = _probe_isolation(scratch_parent, data_limit)
    return _ISOLATION[key]


def _probe_isolation(scratch_parent: str, data_limit: int) -> dict:
    import subprocess

    import torch

    root = os.geteuid() == 0 and os.environ.get("GRADER_SANDBOX", "").lower() not in ("0", "off", "none")
    modes = [("namespace", True), ("namespace", False), ("uid", False)] if root else []
    attempts = [(m, n, d) for m, n in modes for d in ([True, False] if data_limit else [False])]
    attempts += [("none", False, d) for d in ([True, False] if data_limit else [False])]
    code = "import socket, torch; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
    if torch.cuda.is_available():
        code += "torch.ones(1 << 20, device='cuda').sum().item(); "
    code += "print('ok')"
    probe_dir = os.path.realpath(tempfile.mkdtemp(prefix="grade-probe-", dir=scratch_parent))
    os.chmod(probe_dir, 0o711)
    notes = []
    for mode, network, with_data in attempts:
        uid = claim_uid() if mode != "none" else None
        try:
            spec = {"uid": uid, "namespace": mode == "namespace", "network": network,
                    "binds": root_binds([]), "scratch": probe_dir,
                    "limits": {"RLIMIT_DATA": data_limit} if with_data else {}}
            proc = subprocess.run(launch_command(spec, [sys.executable, "-I", "-c", code]), cwd=probe_dir,
                                  capture_output=True, text=True, timeout=180, start_new_session=True)
            if proc.returncode == 0 and proc.stdout.strip().endswith("ok"):
                what = {"namespace": "its own uid, a root of its own holding only system folders, Python "
                                     "and its scratch folder" + (", no network but loopback" if network else ""),
                        "uid": "its own uid (no mount namespace here: it can read world-readable files)",
                        "none": "NOT isolated: " + ("the grader is not root" if os.geteuid() else "no uid switch "
                                "worked here") + ", so it can read and write what the grader's user can; limits "
                                "and process-group kills still apply"}[mode]
                if data_limit and not with_data:
                    what += "; no RLIMIT_DATA (it broke the probe), the memory watchdog alone"
                if notes and mode != "namespace":
                    what += " (" + "; ".join(notes)[-400:] + ")"
                shutil.rmtree(probe_dir, ignore_errors=True)
                return {"mode": mode, "network": network, "data_limit": with_data,
                        "note": f"runner {'isolated: ' if mode != 'none' else ''}{what}"}
            notes.append(f"{mode}{'+net' if network else ''}{'+data' if with_data else ''}: "
                         f"{(proc.stderr or proc.stdout).strip()[-200:]}")
        except Exception as exc:
            notes.append(f"{mode}: {exc!r}")
        finally:
            if uid is not None:
                kill_uid(uid)
                release_uid(uid)
    shutil.rmtree(probe_dir, ignore_errors=True)
    return {"mode": "none", "network": False, "data_limit": False, "launcher": False,
            "note": "runner NOT isolated and no limits: the sandbox launcher failed (" + "; ".join(notes)[-600:] + ")"}


def _claims() -> Path:
    path = Path("/tmp/fa2-grader-uids")
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def claim_uid() -> int:
    """A uid no one uses, reserved for one runner until release_uid (a file per uid in /tmp)."""
    import pwd
    import secrets

    for _ in range(1000):
        uid = UID_BASE + secrets.randbelow(UID_SPAN)
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        claim = _claims() / str(uid)
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        kill_uid(uid)  # a leftover of a killed grading session, if any
        return uid
    raise RuntimeError("no free uid for a runner")


def release_uid(uid: int) -> None:
    try:
        (_claims() / str(uid)).unlink()
    except OSError:
        pass


def processes(uid: int | None = None, pgid: int | None = None) -> list:
    """Pids owned by `uid`, or in process group `pgid`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if uid is not None:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    found.append(int(name))
            else:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[2]) == pgid:
                    found.append(int(name))
        except (OSError, ValueError, IndexError):
            pass
    return found


def rss_bytes(pids: list) -> int:
    """Resident anonymous memory of `pids` (resident minus file-backed and shared pages, so the
    libraries every process maps are not counted once per process)."""
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                fields = f.read().split()
                total += (int(fields[1]) - int(fields[2])) * page
        except (OSError, ValueError, IndexError):
            pass
    return total


def kill_uid(uid: int, attempts: int = 20) -> None:
    """SIGKILL every process of `uid`, setsid'd and double-forked ones included: a child that
    takes the uid sends kill(-1), which reaches all of them at once; repeat until none is left."""
    # The uid change happens in subprocess's C child between fork and exec: a Python-level
    # os.fork() in this multi-threaded grader (torch's threads, CUDA's) may deadlock the child.
    # The system's kill(1), which any uid may run (unlike an interpreter under /root, say);
    # procps' kill takes no "--" and reads "-9 -1" as signal 9 to every process it may signal.
    killer = [shutil.which("kill") or "/bin/kill", "-9", "-1"]
    for _ in range(attempts):
        if not processes(uid=uid):
            return
        subprocess.run(killer, user=uid, group=uid, extra_groups=[], close_fds=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
