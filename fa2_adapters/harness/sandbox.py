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
  into it, drops to the runner's uid and execs the runner (in mode "userns": see below). Standard
  library only.

Modes, best first (`isolation()` picks the first that works here, and says so):

- "namespace": running as root with CAP_SYS_ADMIN. The runner runs as a fresh numeric uid (no
  passwd entry) in a root that holds only an allowlist: /usr, /bin, /lib*, /sbin, /etc, /dev,
  /proc, /sys, the Python install and its own scratch folder. The project, reports, rubrics,
  other submissions, /home, /root, /run, other runners' folders: none of it exists there, wherever
  it lives on this machine. A network namespace leaves it only loopback (so it cannot reach other
  runners' gloo ports or the outside). It cannot raise its limits.
- "uid": root, but namespaces are refused. The runner runs as a fresh uid: it cannot write
  anything of the project or of other submissions, but can read whatever is world-readable.
- "userns": not root (or GRADER_SANDBOX=userns, which makes a root grader use it alone: the
  tests do), but unprivileged user namespaces work. The launcher enters new user, mount, network,
  IPC and PID namespaces (the grader's uid and gid mapped to themselves, setgroups denied) and builds
  the same root as "namespace", except that every bind but /dev and the scratch folder is
  read-only (a Python install the grader's user owns, say), the scratch folder's trusted/ is
  read-only, and /proc is a fresh one of the runner's PID namespace (the host's would show the
  grader's processes, which the runner's uid could trace). It forks an init (pid 1 there: it
  reaps orphans and passes the runner's exit status on through the launcher, which waits for
  it), drops every capability (bounding set, securebits, no_new_privs) and forks the runner
  (chrooted, it cannot make a user namespace of its own either: the kernel refuses that).
  What it does NOT give: a uid of its own. Outside the namespaces the runner's processes run as
  the grader's user, so the confinement is the namespaces alone: a kernel flaw in them, or a file
  of the grader's user reachable inside its root, is the grader's to lose; no per-uid process
  limit (RLIMIT_NPROC would count the grader's own). Its processes are found and killed through
  its PID namespace (`pid_namespace`, `processes(pidns=...)`, `kill_pidns`), never by uid
  (kill_uid would kill the grader): when the namespace's init dies, the kernel kills the rest.
- "none": not root and no user namespace (or GRADER_SANDBOX=off). The runner runs as this user:
  limits and process-group kills still apply, but it can read and write what this user can.
  The note says so in every runner log.
"""
import ctypes
import json
import os
import re
import resource
import select
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
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWIPC = 0x10000000, 0x20000000, 0x08000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 4, 24, 28
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
# SECBIT_NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE and each one's lock, KEEP_CAPS_LOCKED
SECUREBITS_LOCKED_DOWN = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_KEPT_ON_REMOUNT = 1 | 2 | 4 | 8 | 1024 | 2048 | 4096  # statvfs's ST_* flags equal these MS_* ones


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


def _build_root(libc, binds: list, scratch: str, userns: bool = False, readonly: tuple = ()) -> None:
    """A tmpfs root holding `binds` (at their own paths), the private tmpfs folders and `scratch`,
    then chroot into it. /proc/self/... and every path the runner was given stay valid.
    `userns` (mode "userns", in the runner's PID namespace): a fresh /proc instead of the host's,
    every bind but /dev and `scratch` read-only, and so is each path of `readonly` (in `scratch`)."""
    os.makedirs(NEW_ROOT, mode=0o700, exist_ok=True)
    _mount(libc, "tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    entries = [(p, "bind") for p in binds if not (userns and p == "/proc")]
    entries += [(p, "tmpfs") for p in PRIVATE_TMPFS] + [(scratch, "scratch")] + ([("/proc", "proc")] if userns else [])
    for path, kind in sorted(entries, key=lambda e: (e[0].count("/"), e[0])):
        target = NEW_ROOT + path
        if kind == "proc":  # this PID namespace's processes only
            os.makedirs(target, mode=0o755, exist_ok=True)
            _mount(libc, "proc", target, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            continue
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
    if userns:
        if os.path.ismount(NEW_ROOT + "/dev/mqueue"):  # the host's queues: this IPC namespace's instead
            _mount(libc, "mqueue", NEW_ROOT + "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for path in readonly:
            _mount(libc, NEW_ROOT + path, NEW_ROOT + path, None, MS_BIND)
        for path in [p for p, kind in entries if kind == "bind" and p != "/dev"] + list(readonly):
            if os.path.lexists(path) and not os.path.islink(path):
                _remount_readonly(libc, NEW_ROOT + path)
    os.chdir(NEW_ROOT)
    os.chroot(".")


def _remount_readonly(libc, top: str) -> None:
    """Make `top` and every mount below it read-only, keeping the flags a user namespace may not
    drop (nosuid, nodev, noexec, atime: locked on mounts it inherited)."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])  # \040: a space
            if _is_under(point, top):
                points.append(point)
    for point in sorted(set(points), key=lambda p: p.count("/")):
        flags = os.statvfs(point).f_flag & MS_KEPT_ON_REMOUNT
        _mount(libc, None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enter_user_namespace(libc, network: bool) -> None:
    """Mode "userns": new user, mount, PID (for the children) and, with `network`, network
    namespaces; this uid and gid mapped to themselves; mounts made private; loopback up."""
    uid, gid = os.geteuid(), os.getegid()
    # IPC too: System V objects and POSIX queues are reached by uid, and the uid is the grader's
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | (CLONE_NEWNET if network else 0)
    _check(libc.unshare(flags), "unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC"
                                + (" | CLONE_NEWNET)" if network else ")"))
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    if network:
        _loopback_up()


def _drop_capabilities(libc) -> None:
    """No capability left, none to gain back: not by exec (an empty bounding set, no_new_privs),
    not as uid 0 of the namespace (securebits locked), and not traceable (not dumpable)."""
    _check(libc.prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED_DOWN, 0, 0, 0), "prctl(PR_SET_SECUREBITS)")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT)")
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:  # until EINVAL: past the last capability
        cap += 1
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    _check(libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    with open("/proc/self/status") as f:
        caps = {k: int(v, 16) for k, v in (line.split(":") for line in f if line.startswith("Cap"))}
    if any(caps.values()):
        raise OSError(f"capabilities left after dropping them: {caps}")


def _close_fds_but(keep: set) -> None:
    low = 0
    for fd in sorted(keep) + [1 << 20]:
        os.closerange(low, fd)
        low = fd + 1


def _init_and_runner(libc, spec: dict, cwd: str, argv: list) -> None:
    """Mode "userns", once the namespaces exist: fork the PID namespace's init, which builds the
    runner's root, drops every capability and forks the runner; this process waits for the init
    and exits as the runner did (the same status, or the same signal). Never returns."""
    status_r, status_w = os.pipe()
    alive_r, alive_w = os.pipe()  # this end closes when the launcher dies: the init looks once
    init = os.fork()
    if init == 0:
        try:
            os.close(status_r)
            os.close(alive_w)
            _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
            if select.select([alive_r], [], [], 0)[0]:  # the launcher died before that
                os._exit(71)
            os.close(alive_r)
            _build_root(libc, spec["binds"], spec["scratch"], userns=True, readonly=tuple(spec.get("readonly", ())))
            os.chdir(cwd)  # the same path, in the new root
            _drop_capabilities(libc)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1: a default action is never taken
            runner = os.fork()
            if runner == 0:
                try:
                    os.execv(argv[0], argv)
                finally:
                    os._exit(71)
            _close_fds_but({status_w})  # the grader sees the runner's pipes close when it does
            while True:  # reap orphans; when the runner ends, so does the namespace (the kernel kills the rest)
                pid, status = os.waitpid(-1, 0)
                if pid == runner:
                    os.write(status_w, str(status).encode())
                    os._exit(0)
        except BaseException as exc:
            print(f"[grader] the runner's sandbox could not be set up: {exc!r}", file=sys.stderr, flush=True)
            os._exit(71)
    os.close(status_w)
    os.close(alive_r)
    _close_fds_but({2, status_r, alive_w})
    _, status = os.waitpid(init, 0)
    told = os.read(status_r, 32)
    status = int(told) if told else status  # the init killed: its own status
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


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
    if spec.get("userns"):  # the root is built by the PID namespace's init (_init_and_runner)
        _enter_user_namespace(libc, bool(spec.get("network")))
    elif spec.get("namespace"):
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
    if spec.get("userns"):
        _init_and_runner(libc, spec, cwd, argv)
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
_ANSWERED_ELSEWHERE = {}  # (scratch_parent, data_limit) -> a function giving another process's answer, or None


def isolation(scratch_parent: str, data_limit: int = 0) -> dict:
    """What confinement works on this machine, probed by starting a confined interpreter that
    imports torch (and, where the harness sees a GPU, allocates on it):
    {"mode": "namespace" | "uid" | "userns" | "none", "network": bool, "data_limit": bool, "note": str}.
    `data_limit` is the RLIMIT_DATA to try (0: none); if the probe fails with it and works
    without it (a driver mapping more than the limit, say), runners go without it and the
    harness's memory watchdog alone bounds them. Probed once per process for each
    (scratch_parent, data_limit): a limit that works says nothing of a smaller one. The user,
    GRADER_SANDBOX and the GPU are no part of the key: they are taken as fixed for the process."""
    key = (scratch_parent, data_limit)
    if key not in _ISOLATION:
        answer = _ANSWERED_ELSEWHERE.pop(key, lambda: None)()
        _ISOLATION[key] = answer or _probe_isolation(scratch_parent, data_limit)
    return _ISOLATION[key]


def answer_isolation_with(scratch_parent: str, data_limit: int, answer) -> None:
    """Let isolation() take its answer for this key from `answer()`, another process's probe of
    the same question (harness/shared_probe.py), or probe itself when that gives None."""
    _ANSWERED_ELSEWHERE[(scratch_parent, data_limit)] = answer


def _probe_isolation(scratch_parent: str, data_limit: int) -> dict:
    import subprocess

    import torch

    wanted = os.environ.get("GRADER_SANDBOX", "").lower()
    off = wanted in ("0", "off", "none")
    root = os.geteuid() == 0 and not off and wanted != "userns"
    modes = [("namespace", True), ("namespace", False), ("uid", False)] if root else []
    if not root and not off:  # a user namespace instead (GRADER_SANDBOX=userns: even as root)
        modes += [("userns", True), ("userns", False)]
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
        uid = claim_uid() if mode in ("namespace", "uid") else None
        try:
            spec = {"uid": uid, "namespace": mode in ("namespace", "userns"), "network": network,
                    "binds": root_binds([]), "scratch": probe_dir,
                    "limits": {"RLIMIT_DATA": data_limit} if with_data else {}}
            if mode == "userns":
                spec["userns"] = True
            proc = subprocess.run(launch_command(spec, [sys.executable, "-I", "-c", code]), cwd=probe_dir,
                                  capture_output=True, text=True, timeout=180, start_new_session=True)
            if proc.returncode == 0 and proc.stdout.strip().endswith("ok"):
                what = {"namespace": "its own uid, a root of its own holding only system folders, Python "
                                     "and its scratch folder" + (", no network but loopback" if network else ""),
                        "uid": "its own uid (no mount namespace here: it can read world-readable files)",
                        "userns": "unprivileged user namespaces (" + ("the grader is not root" if os.geteuid()
                                  else "GRADER_SANDBOX=userns") + "): a root of its own holding only system "
                                  "folders and Python, read-only, and its scratch folder; its own PID namespace "
                                  "(it sees and kills only its own processes)" + (", no network but loopback"
                                  if network else "") + "; no capabilities. NOT a uid of its own: outside the "
                                  "namespaces it runs as the grader's user, so the namespaces alone confine it, "
                                  "and no per-uid process limit applies",
                        "none": "NOT isolated: " + ("the grader is not root" + ("" if off else " and user "
                                "namespaces were refused") if os.geteuid() else "no uid switch worked here")
                                + ", so it can read and write what the grader's user can; limits "
                                "and process-group kills still apply"}[mode]
                if data_limit and not with_data:
                    what += "; no RLIMIT_DATA (it broke the probe), the memory watchdog alone"
                if notes and mode not in ("namespace", "userns"):
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


def processes(uid: int | None = None, pgid: int | None = None, pidns: str | None = None) -> list:
    """Pids owned by `uid`; or those in process group `pgid` and those in PID namespace `pidns`
    (as `pid_namespace` names it), either."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if uid is not None:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    found.append(int(name))
                continue
            if pidns is not None:
                try:
                    if os.readlink(f"/proc/{name}/ns/pid") == pidns:
                        found.append(int(name))
                        continue
                except OSError:  # another user's process, or one that has just ended
                    pass
            if pgid is not None:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[2]) == pgid:
                    found.append(int(name))
        except (OSError, ValueError, IndexError):
            pass
    return found


def pid_namespace(pid: int) -> str | None:
    """The PID namespace that `pid`'s children go into, where it differs from its own: a "userns"
    launcher's (its runner's), as "pid:[inode]"; None otherwise, or once it has ended. A launcher
    outlives its namespace (it waits for the namespace's init, whose end ends every process in it),
    so None from a launcher that has ended means nothing of its runner is left."""
    try:
        own, children = os.readlink(f"/proc/{pid}/ns/pid"), os.readlink(f"/proc/{pid}/ns/pid_for_children")
    except OSError:
        return None
    return children if children != own else None


def kill_pidns(pidns: str, attempts: int = 20) -> None:
    """SIGKILL every process of PID namespace `pidns` (the kernel ends the rest with its
    init), setsid'd ones included; repeat until none is left. Not by uid: in mode "userns"
    they share the grader's."""
    for _ in range(attempts):
        pids = processes(pidns=pidns)
        if not pids:
            return
        for pid in sorted(pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


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


def zombie(pid: int) -> bool:
    """Dead, waiting only for its parent to read its exit status: the runner itself is one until
    the harness waits for it, after the kill. (kill_uid took it for alive and tried 20 times,
    0.7 s of every runner's close.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True  # gone already


def kill_uid(uid: int, attempts: int = 20) -> None:
    """SIGKILL every process of `uid`, setsid'd and double-forked ones included: a child that
    takes the uid sends kill(-1), which reaches all of them at once; repeat until none is left."""
    # The uid change happens in subprocess's C child between fork and exec: a Python-level
    # os.fork() in this multi-threaded grader (torch's threads, CUDA's) may deadlock the child.
    # The system's kill(1), which any uid may run (unlike an interpreter under /root, say);
    # procps' kill takes no "--" and reads "-9 -1" as signal 9 to every process it may signal.
    killer = [shutil.which("kill") or "/bin/kill", "-9", "-1"]
    for _ in range(attempts):
        if not [pid for pid in processes(uid=uid) if not zombie(pid)]:
            return
        subprocess.run(killer, user=uid, group=uid, extra_groups=[], close_fds=True,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
