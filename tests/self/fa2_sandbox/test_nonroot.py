"""Sandbox mode "userns": a grader that is not root confines each runner with an unprivileged user
namespace (fa2_sandbox/harness/confinement.py), not with nothing.

Two ways in:

- in this process, whoever runs it: GRADER_SANDBOX=userns makes `isolation()` try the user
  namespace alone (as root too), so the launcher's "userns" path runs for real here, with the
  grader's uid outside (root's, when the suite runs as root).
- a real non-root grader: a script run as nobody (setpriv) that starts runners itself, with this
  very Python (a virtual environment's as it is, not the Python it was made from, which may lack
  torch). That Python, the one a venv was made from, or the project may live under a folder
  nobody cannot enter (/root, mode 700): the script then runs in a private mount namespace where
  that folder is a tmpfs holding only them (the host is not changed). Where nobody still cannot
  import the grader's packages (files not readable by others), the test skips and says what to
  change. Not root: the script runs as this user, as it is.

What a hostile submission must not manage there: read a file outside its root (the project's
tests/, a file of the grader's temp folder), write the system folders or the Python install,
change the code it trusts, open a socket other than loopback, see or signal the grader's or
another runner's processes; and a runner that hangs dies with all its children, setsid'd ones
too, without the per-uid kill (which would kill the grader: the runner has the grader's uid).
"""
import json
import os
import shlex
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from fa2_sandbox.harness import confinement
from fa2_sandbox.harness.client import PROJECT_ROOT, SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from tests.self.fa2_sandbox.test_hostile import HOSTILE, TEST_MARK, kill_orphans, orphans
from tests.self.fa2_sandbox.test_runner_guarantees import REQUEST, children_holding_memory, make_submission

NOBODY = 65534


@pytest.fixture
def userns(monkeypatch):
    """Sandbox mode "userns" for this test's runners, probed afresh (and not cached past it)."""
    monkeypatch.setenv("GRADER_SANDBOX", "userns")
    monkeypatch.setattr(confinement, "_ISOLATION", {})
    found = confinement.isolation(tempfile.gettempdir())
    if found["mode"] != "userns":
        assert found["mode"] == "none" and "NOT isolated" in found["note"], found  # said, never silent
        pytest.skip("user namespaces are refused here: " + found["note"][:300])
    return found


@pytest.fixture
def runners(tmp_path, userns):
    made = []

    def make(forward: str, head: str = "", **kwargs) -> SubmissionRunner:
        folder = make_submission(tmp_path / f"sub{len(made)}", forward, head)
        runner = SubmissionRunner(load_submission(folder), import_timeout=60, **kwargs)
        assert runner.isolation["mode"] == "userns" and runner.uid is None
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()


def report(reply) -> dict:
    assert reply.status == "error" and "REPORT " in reply.message, reply
    return json.loads(reply.message.split("REPORT ", 1)[1])


ATTEMPTS = '''
import json, os, socket
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "allowed"
    except Exception as exc:
        out[name] = type(exc).__name__
'''


def attempts(code: str) -> str:
    """A forward body: `attempt` and `out` defined, then `code`."""
    return ATTEMPTS + textwrap.dedent(code)


def test_note_says_what_userns_confines(userns):
    note = userns["note"]
    assert note.startswith("runner isolated: unprivileged user namespaces")
    for words in ("a root of its own", "read-only", "its own PID namespace", "no capabilities",
                  "NOT a uid of its own", "the grader's user", "the namespaces alone confine it"):
        assert words in note, note


def test_hostile_runner_is_confined(runners, tmp_path):
    secret = tmp_path / "outside-scratch.txt"  # the grader's own temp folder, outside the runner's
    secret.write_text("secret")
    os.chmod(secret, 0o644)
    project = str(PROJECT_ROOT)
    runner = runners(attempts(f'''
        attempt("read project tests", lambda: open({str(PROJECT_ROOT / "grading/rubric.yaml")!r}).read())
        out["project listed"] = sorted(os.listdir({project!r})) if os.path.isdir({project!r}) else None
        attempt("read grader temp file", lambda: open({str(secret)!r}).read())
        attempt("write system folder", lambda: open("/usr/PWNED-userns", "x"))
        attempt("write python install", lambda: open(os.path.join({sys.prefix!r}, "PWNED-userns"), "x"))
        attempt("write trusted code", lambda: open(os.path.join(os.environ["PYTHONPATH"].split(os.pathsep)[0],
                                                                "fa2_sandbox", "runner", "serve.py"), "a"))
        attempt("network", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2))
        attempt("signal every process", lambda: os.kill(-1, 0))
        attempt("write own scratch", lambda: open("mine.txt", "w").write("ok"))
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        cmdlines = [open(f"/proc/{{p}}/cmdline", "rb").read() for p in pids]
        out["pids"] = sorted(pids)
        out["pytest visible"] = any(b"pytest" in c for c in cmdlines)
        out["capabilities"] = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0]
        raise RuntimeError("REPORT " + json.dumps(out))
    '''))
    out = report(runner.call(REQUEST, timeout=60))
    denied = ["read project tests", "read grader temp file", "write system folder",
              "write python install", "write trusted code", "network", "signal every process"]
    assert not [name for name in denied if out[name] == "allowed"], out
    # A virtual environment in the project (a .venv) is bound at its own path: the project's folder
    # is there, holding that alone.
    python_inside = {Path(root).relative_to(PROJECT_ROOT).parts[0] for root in confinement.root_binds([project])
                     if confinement._is_under(root, project)}
    assert out["project listed"] == (sorted(python_inside) or None), out
    assert out["write own scratch"] == "allowed", out
    assert out["pids"] == [1, 2] and not out["pytest visible"], out  # its init and itself, nothing else
    assert int(out["capabilities"], 16) == 0, out
    assert not (Path("/usr") / "PWNED-userns").exists() and secret.read_text() == "secret"


def test_tamper_files_finds_nothing(userns):
    runner = SubmissionRunner(load_submission(HOSTILE / "tamper_files"), import_timeout=60)
    try:
        reply = runner.call(REQUEST, timeout=120)
        assert reply.ok, reply  # it answers zeros: wrong, but a reply
        assert "forbidden reads=0 writes=0" in runner.log_tail(), runner.log_tail()[-2000:]
    finally:
        runner.close()


def test_runners_do_not_see_each_other(runners):
    mark = f"{TEST_MARK}userns-neighbour"
    first = runners(f'''
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", "{mark}"])
    ''')
    try:
        assert first.call(REQUEST, timeout=60).ok
        deadline = time.monotonic() + 10
        while not [c for _, c in orphans(mark)] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [c for _, c in orphans(mark)], "the first runner's child never started"
        second = runners(attempts(f'''
            seen = [open(f"/proc/{{p}}/cmdline", "rb").read() for p in os.listdir("/proc") if p.isdigit()]
            out["neighbour visible"] = any(b"{mark}" in c for c in seen)
            raise RuntimeError("REPORT " + json.dumps(out))
        '''))
        assert report(second.call(REQUEST, timeout=60)) == {"neighbour visible": False}
    finally:
        first.close()
    assert not [c for _, c in orphans(mark)]


def test_hang_kills_every_child(runners):
    """setsid'd and double-forked children leave the process group; the PID namespace keeps them."""
    mark = f"{TEST_MARK}userns-hang"
    runner = runners(f'''
        import os, subprocess, sys
        sleep = "import time; time.sleep(1000)"
        subprocess.Popen([sys.executable, "-c", sleep, "{mark}-popen"])
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", sleep, "{mark}-setsid"])
            os._exit(0)
        while True:
            pass
    ''')
    try:
        assert runner.import_failure() is None
        launcher = runner.process.pid
        reply = runner.call(REQUEST, timeout=5, what="N=16")
        assert reply.status == "timeout" and reply.message == "timed out after 5 s in forward (N=16)", reply
        time.sleep(0.2)
        left = [c for _, c in orphans(mark)]
        assert not left, left
        assert not os.path.exists(f"/proc/{launcher}")  # reaped: no zombie
    finally:
        kill_orphans(mark)


def test_watchdog_counts_setsid_children(runners):
    """The memory watchdog adds up the runner's PID namespace, not only its process group."""
    runner = runners(children_holding_memory(leave_group=True), memory_limit=int(1.5 * (1 << 30)))
    reply = runner.call(REQUEST, timeout=60)
    assert reply.status == "crash", reply
    assert reply.message.startswith("ran out of memory during forward: its processes held"), reply


def test_exit_status_and_channel_pass_through(runners):
    """The launcher and the namespace's init hold none of the runner's pipes and pass on how it died."""
    crash = runners('''
        import ctypes
        ctypes.string_at(0)
    ''')
    reply = crash.call(REQUEST, timeout=30, what="N=16")
    assert reply.status == "crash" and reply.message == "process died with SIGSEGV during forward (N=16)", reply
    exits = runners('''
        import os
        os._exit(3)
    ''')
    assert exits.call(REQUEST, timeout=30).message == "exited with status 3 during forward"
    closes = runners('''
        import os, sys
        os.close(int(sys.argv[1])); os.close(int(sys.argv[2]))
        while True:
            pass
    ''')
    started = time.monotonic()
    reply = closes.call(REQUEST, timeout=60)
    assert reply.status == "crash" and "closed the grader's result channel and kept running" in reply.message
    assert time.monotonic() - started < 20


# -- a grader that is not root ----------------------------------------------------------------

NONROOT_GRADER = '''
import json, os, sys, tempfile
from pathlib import Path
sys.path.insert(0, {project!r})
from fa2_sandbox.harness import confinement
from fa2_sandbox.harness.client import SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.wire import requests

request = requests.from_json(json.loads({request!r}))
out = {{"uid": os.getuid(), "isolation": confinement.isolation(tempfile.gettempdir())}}
out["project readable here"] = os.access({readme!r}, os.R_OK)
for name, folder, timeout in [("snoop", {snoop!r}, 60), ("hang", {hang!r}, 4)]:
    if out["isolation"]["mode"] != "userns":
        break
    runner = SubmissionRunner(load_submission(Path(folder)), import_timeout=60)
    try:
        reply = runner.call(request, timeout=timeout)
        out[name] = [reply.status, reply.message]
    finally:
        runner.close()
print("RESULT " + json.dumps(out))
'''


def _blocking_ancestor(path: str) -> str | None:
    """The highest folder above `path` that others cannot enter, if any (/root, mode 700)."""
    parts = Path(path).parts
    for i in range(2, len(parts)):
        folder = os.path.join(*parts[:i])
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def _needed_by_a_grader() -> list:
    """The folders a grader started with this Python reads: the interpreter's (a venv's and the
    Python it was made from, with their sys.path entries: confinement.python_roots) and the project's."""
    roots = {*confinement.python_roots([]), os.path.realpath(PROJECT_ROOT)}
    return sorted(r for r in roots if not any(r != o and confinement._is_under(r, o) for o in roots))


def _python_env() -> dict:
    """Where this Python's sys.path comes from besides its prefix, for another user's process:
    PYTHONPATH, and the user's site-packages (found by HOME, which differs there) when on sys.path."""
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    if site.ENABLE_USER_SITE and site.getusersitepackages() in sys.path:
        env["PYTHONUSERBASE"] = site.getuserbase()
    return env


def _as_nobody_prefix(workdir: Path) -> list:
    """The command that runs what follows it as nobody. Where a folder a grader needs lies under
    one nobody cannot enter (a venv or Python under /root, mode 700), it runs in a private mount
    namespace where that folder is a tmpfs holding only what is needed (the host is not changed)."""
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all"]
    hidden = [(root, _blocking_ancestor(root)) for root in _needed_by_a_grader()]
    staged = [(root, workdir / "nobody-stage" / str(i)) for i, (root, blocking) in enumerate(hidden) if blocking]
    if not staged:
        return drop
    q = shlex.quote
    steps = ["set -e", "umask 022"]
    steps += [f"mkdir -p {q(str(stage))}; mount --rbind {q(root)} {q(str(stage))}" for root, stage in staged]
    steps += [f"mount -t tmpfs -o mode=755 tmpfs {q(folder)}" for folder in sorted({b for _, b in hidden if b})]
    steps += [f"mkdir -p {q(root)}; mount --rbind {q(str(stage))} {q(root)}; umount -l {q(str(stage))}"
              for root, stage in staged]
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(steps + ['exec "$@"']), "sh",
            *drop]


# What a grader run as nobody needs besides the standard library and the project's own code.
NOBODY_PROBE = '''
import os
import pytest, torch, xdist, yaml
for module in (pytest, torch, xdist, yaml):  # an unreadable package's folder imports as an empty namespace
    assert module.__file__, f"cannot read the {{module.__name__}} package's files in {{list(module.__path__)}}"
assert os.access({source!r}, os.R_OK), "cannot read the project: " + {source!r}
print("PROBE OK")
'''
_NOBODY_CANNOT = {}  # "why": the probe's answer, once per process: None where nobody can run this Python


def _skip_unless_nobody_can_run(prefix: list, workdir: Path, env: dict) -> None:
    """Skip the calling test, saying why and what to do, where nobody cannot import the grader's
    packages from this Python or read the project (a venv made with umask 077, say)."""
    if "why" not in _NOBODY_CANNOT:
        source = str(PROJECT_ROOT / "fa2_sandbox" / "harness" / "client.py")
        proc = subprocess.run([*prefix, sys.executable, "-c", NOBODY_PROBE.format(source=source)], env=env,
                              cwd=workdir, capture_output=True, text=True, timeout=180)
        lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit status {proc.returncode}"]
        _NOBODY_CANNOT["why"] = None if "PROBE OK" in proc.stdout else lines[-1]
    why = _NOBODY_CANNOT["why"]
    if why:
        pytest.skip(f"user nobody cannot run this Python ({sys.executable}) with the grader's packages and the "
                    f"project: {why}. A grader of another user reads {', '.join(_needed_by_a_grader())}"
                    ": make what it cannot read readable by others (chmod -R o+rX on the virtual environment or the "
                    "project), or make the virtual environment with umask 022")


def as_nobody(script: str, workdir: Path, env: dict | None = None,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `script` with this Python (a venv's as it is) as a user that is not root: nobody, where
    this is root. `workdir` (its cwd and HOME) must be nobody's to write; `env` adds to its small
    environment. Skips the calling test, saying why, where util-linux's tools are missing or nobody
    cannot run this Python with the grader's packages."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir), "TMPDIR": "/tmp",
           "GRADER_MEMORY_LIMIT_GB": "3", **_python_env(), **(env or {})}
    command = [sys.executable, "-c", script]
    if os.geteuid() != 0:
        return subprocess.run(command, env=env, cwd=workdir, capture_output=True, text=True, timeout=timeout)
    for tool in ("setpriv", "unshare", "mount"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} (util-linux) is not installed: cannot run a grader as nobody")
    prefix = _as_nobody_prefix(workdir)
    _skip_unless_nobody_can_run(prefix, workdir, env)
    return subprocess.run([*prefix, *command], env=env, cwd=workdir, capture_output=True, text=True, timeout=timeout)


def test_a_grader_that_is_not_root(tmp_path):
    """The real case: the grader's process is not root; its runners go into user namespaces."""
    public = Path(tempfile.mkdtemp(prefix="nonroot-grader-"))  # readable by nobody, unlike tmp_path
    try:
        os.chmod(public, 0o777)
        readme = str(PROJECT_ROOT / "README.md")
        snoop = make_submission(public / "snoop", attempts(f'''
            attempt("read project", lambda: open({readme!r}).read())
            attempt("network", lambda: socket.create_connection(("1.1.1.1", 53), timeout=2))
            attempt("signal every process", lambda: os.kill(-1, 0))
            out["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
            raise RuntimeError("REPORT " + json.dumps(out))
        '''))
        hang = make_submission(public / "hang", f'''
            import os, sys
            if os.fork() == 0:
                os.setsid()
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)",
                                          "{TEST_MARK}nonroot-setsid"])
            while True:
                pass
        ''')
        for path in [public, *public.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        script = NONROOT_GRADER.format(project=str(PROJECT_ROOT), request=json.dumps(REQUEST.to_json()), readme=readme,
                                       snoop=str(snoop), hang=str(hang))
        proc = as_nobody(script, public)
        assert proc.returncode == 0 and "RESULT " in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
        out = json.loads(proc.stdout.split("RESULT ", 1)[1])
        assert out["uid"] != 0
        mode, note = out["isolation"]["mode"], out["isolation"]["note"]
        if mode == "none":  # user namespaces refused here: said in words, never silently
            assert note.startswith("runner NOT isolated: the grader is not root and user namespaces were refused")
            pytest.skip("unprivileged user namespaces are refused on this machine: " + note[:300])
        assert mode == "userns" and "the grader is not root" in note, out
        assert out["project readable here"], "the grader's user can read the project: the test shows nothing"
        status, message = out["snoop"]
        assert status == "error" and "REPORT " in message, out
        seen = json.loads(message.split("REPORT ", 1)[1])
        assert seen == {"read project": "FileNotFoundError", "network": "OSError",
                        "signal every process": "ProcessLookupError", "pids": [1, 2]}, seen
        assert out["hang"] == ["timeout", "timed out after 4 s in forward"], out
        time.sleep(0.2)
        assert not [c for _, c in orphans(f"{TEST_MARK}nonroot")]
    finally:
        kill_orphans(f"{TEST_MARK}nonroot")
        shutil.rmtree(public, ignore_errors=True)


def test_root_modes_unchanged_without_the_switch(monkeypatch):
    """GRADER_SANDBOX=userns is the only way a root grader gets a user namespace."""
    if os.geteuid() != 0:
        pytest.skip("not root: the root modes are not tried here")
    monkeypatch.delenv("GRADER_SANDBOX", raising=False)
    monkeypatch.setattr(confinement, "_ISOLATION", {})
    assert confinement.isolation(tempfile.gettempdir())["mode"] in ("namespace", "uid")


def test_pid_namespace_of_a_plain_process_is_none():
    """Outside mode "userns" kill_runner and the watchdog see no PID namespace: as before."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert confinement.pid_namespace(proc.pid) is None
        assert confinement.processes(pgid=proc.pid) == [proc.pid]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert confinement.pid_namespace(proc.pid) is None


def test_reports_name_the_userns_caveat(tmp_path):
    """The submission page says in words that a "userns" runner had no uid of its own; the class
    page counts such runners apart from the isolated and the NOT isolated ones."""
    from reporting import build_reports

    reports = tmp_path / "reports"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "results", reports)
    note = "runner isolated: unprivileged user namespaces (the grader is not root): a root of its own"
    path = reports / "alice" / "results.json"
    data = json.loads(path.read_text())
    data["extra_data"]["isolation"] = {"mode": "userns", "note": note}
    path.write_text(json.dumps(data))
    build_reports(reports)
    page = (reports / "alice" / "index.html").read_text()
    assert ("<dd><strong>user namespaces only, no uid of its own (outside them it ran as the grading user)"
            f"</strong>: {note}</dd>") in page
    index = (reports / "index.html").read_text()
    assert "1 graded with their code confined by user namespaces only (no uid of its own" in index
    assert "NOT isolated" not in index


def test_refused_user_namespace_falls_back_in_words(monkeypatch):
    """Where the user namespace cannot be set up, the runner goes unconfined and the note says so
    and why: never silently."""
    launch_command = confinement.launch_command

    def refused(spec, argv):  # the launcher fails in mode "userns" alone, as where the kernel refuses it
        return launch_command({**spec, "scratch": "/nonexistent-scratch"} if spec.get("userns") else spec, argv)

    monkeypatch.setenv("GRADER_SANDBOX", "userns")
    monkeypatch.setattr(confinement, "_ISOLATION", {})
    monkeypatch.setattr(confinement, "launch_command", refused)
    found = confinement.isolation(tempfile.gettempdir())
    assert found["mode"] == "none", found
    assert found["note"].startswith("runner NOT isolated: "), found
    assert "userns+net: [grader] the runner's sandbox could not be set up" in found["note"], found
