"""Confinement for a submission's runner: its own uid, a private view of the disk and network,
resource limits, and a way to kill every process it ever started.

This is the harness side (used by fa2_sandbox.harness: client, scratch, watchdog): `isolation()`
probes what this machine allows, once per process and memory limit; `claim_uid`, `kill_uid`,
`processes` and `rss_bytes` manage one runner's processes; `launch_command` builds the command
line that starts a runner confined. What runs between the fork and the runner's exec, confining
it, is the launcher (launcher.py: standard library only, run as a script).

Modes, best first (`isolation()` picks the first that works here, and says so):

- "namespace": running as root with CAP_SYS_ADMIN. The runner runs as a fresh numeric uid (no
  passwd entry) in a root that holds only an allowlist: /usr, /bin, /lib*, /sbin, /etc, /dev,
  /proc, /sys, the Python install and its own scratch folder. The project, reports, rubrics,
  other submissions, /home, /root, /run, other runners' folders: none of it exists there, wherever
  it lives on this machine; where the grader is installed into that Python (a wheel), its own
  packages there are empty folders (`grader_package_folders`). A network namespace leaves it only
  loopback (so it cannot reach other runners' gloo ports or the outside). It cannot raise its limits.
- "uid": root, but namespaces are refused. The runner runs as a fresh uid: it cannot write
  anything of the project or of other submissions, but can read whatever is world-readable: a
  wheel's installed packages (the reference solutions, the oracle, the rubric) cannot be covered.
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
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fa2_sandbox import GRADER_PACKAGES
from fa2_sandbox.harness import launcher
from fa2_sandbox.harness.launcher import SYSTEM_BINDS
from fa2_sandbox.harness.launcher import _is_under as _is_under  # scratch.py's too

LAUNCHER_PY = Path(launcher.__file__).resolve()

UID_BASE, UID_SPAN = 1_900_000_000, 200_000_000  # far above any real account


def launch_command(spec: dict, argv: list) -> list:
    """The command line that starts `argv` confined as `spec` says: the launcher, as a script."""
    return [sys.executable, "-I", str(LAUNCHER_PY), json.dumps(spec), "--", *argv]


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


def grader_package_folders(binds: list) -> list:
    """The folders of the grader's own packages that the runner's root holds through `binds`: a
    grader installed into the Python install the runner uses (a wheel's, in site-packages; its
    PROJECT_ROOT is site-packages then, hidden as a folder but bound as part of that install),
    wherever on sys.path, the one imported too. A checkout outside `binds` is not there at all.
    They hold the reference solutions, the oracle and the rubric with its hidden checks; the
    launcher covers each with an empty folder. The runner needs none of them: it imports the
    fa2_sandbox it trusts (a package of its own, first on its PYTHONPATH) from its scratch copy."""
    found = set()
    for name in GRADER_PACKAGES:
        spec = importlib.util.find_spec(name)
        found |= set(spec.submodule_search_locations or []) if spec else set()
        found |= {os.path.join(entry, name) for entry in sys.path if entry and os.path.isabs(entry)}
    found = {os.path.realpath(p) for p in found if os.path.isdir(p)}
    return sorted(p for p in found if any(_is_under(p, os.path.realpath(b)) for b in binds))


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
                        "uid": "its own uid (no mount namespace here: it can read world-readable files, the "
                               "grader's installed packages among them: reference solutions, oracle, rubric)",
                        "userns": "unprivileged user namespaces (" + ("the grader is not root" if os.geteuid()
                                  else "GRADER_SANDBOX=userns") + "): a root of its own holding only system "
                                  "folders and Python, read-only, and its scratch folder; its own PID namespace "
                                  "(it sees and kills only its own processes)" + (", no network but loopback"
                                  if network else "") + "; no capabilities. NOT a uid of its own: outside the "
                                  "namespaces it runs as the grader's user, so the namespaces alone confine it, "
                                  "and no per-uid process limit applies",
                        "none": "NOT isolated: " + ("the grader is not root" + ("" if off else " and user "
                                "namespaces were refused") if os.geteuid() else "no uid switch worked here")
                                + ", so it can read and write what the grader's user can (the grader's "
                                "own code, oracle and rubric too); limits and process-group kills still apply"}[mode]
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
    the harness waits for it, after the kill. (kill_uid took it for alive and tried 20 times on
    every runner's close: notes/grading-speed.md.)"""
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
