"""The sandbox launcher: the code that runs between the fork and a runner's exec.

`python -I fa2_sandbox/harness/launcher.py SPEC -- ARGV...` (the command confinement.launch_command
builds) sets hard resource limits, enters new mount and network namespaces, builds a root of its
own (a tmpfs holding binds of the system folders, the Python install and the runner's scratch
folder, at their usual paths, plus a private /tmp and /dev/shm; the grader's own packages in that
Python install covered by an empty read-only tmpfs), chroots into it, drops to the
runner's uid and execs the runner (in mode "userns": forks the PID namespace's init, which drops
every capability and forks the runner). The modes and what each confines: confinement.py. Standard
library only: it runs as a script, with -I, before anything of the project could be trusted.
"""
import ctypes
import json
import os
import re
import resource
import select
import signal
import sys

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWIPC = 0x10000000, 0x20000000, 0x08000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 1, 4, 24, 28
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
# SECBIT_NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE and each one's lock, KEEP_CAPS_LOCKED
SECUREBITS_LOCKED_DOWN = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_KEPT_ON_REMOUNT = 1 | 2 | 4 | 8 | 1024 | 2048 | 4096  # statvfs's ST_* flags equal these MS_* ones


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


def _build_root(libc, binds: list, scratch: str, userns: bool = False, readonly: tuple = (),
                covered: tuple = ()) -> None:
    """A tmpfs root holding `binds` (at their own paths), the private tmpfs folders and `scratch`,
    then chroot into it. /proc/self/... and every path the runner was given stay valid.
    `userns` (mode "userns", in the runner's PID namespace): a fresh /proc instead of the host's,
    every bind but /dev and `scratch` read-only, and so is each path of `readonly` (in `scratch`).
    Each folder of `covered` (inside a bind) is an empty read-only tmpfs there."""
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
    for path in covered:  # the grader's packages in a bound Python install (a wheel's): solutions, oracle, rubric
        _mount(libc, "tmpfs", NEW_ROOT + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")
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


def _init_and_runner(libc, spec: dict, cwd: str, argv: list, start=None) -> None:
    """Mode "userns", once the namespaces exist: fork the PID namespace's init, which builds the
    runner's root, drops every capability and forks the runner (exec'd from `argv`, or `start()`
    called there); this process waits for the init and exits as the runner did (the same status,
    or the same signal). Never returns."""
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
            _build_root(libc, spec["binds"], spec["scratch"], userns=True, readonly=tuple(spec.get("readonly", ())),
                        covered=tuple(spec.get("covered", ())))
            os.chdir(cwd)  # the same path, in the new root
            _drop_capabilities(libc)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1: a default action is never taken
            runner = os.fork()
            if runner == 0:
                try:
                    start() if start is not None else os.execv(argv[0], argv)
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


def launch(spec: dict, argv: list, start=None) -> None:
    """Confine this process as `spec` says, then exec `argv`, or call `start()` instead (a runner
    forked from the fork server, fa2_sandbox/runner/fork_server.py, which holds its imports
    already). Never returns."""
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
        _build_root(libc, spec["binds"], spec["scratch"], covered=tuple(spec.get("covered", ())))
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
        _init_and_runner(libc, spec, cwd, argv, start)
    os.chdir(cwd)  # the same path, in the new root
    if start is not None:
        start()
        os._exit(71)
    os.execv(argv[0], argv)


def main() -> None:
    args = sys.argv[1:]
    split = args.index("--")
    try:
        launch(json.loads(args[0]), args[split + 1:])
    except BaseException as exc:  # before the runner exists: say why on the log, exit 71
        print(f"[grader] the runner's sandbox could not be set up: {exc!r}", file=sys.stderr, flush=True)
        os._exit(71)


def _is_under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


if __name__ == "__main__":
    main()
