"""Runners forked from the fork server (fa2_sandbox/runner/fork_server.py; the harness side is
fa2_sandbox/harness/forked.py): confined as an exec'd runner is, in their own environment rather
than the server's, with exit statuses that read as subprocess.Popen's; GRADER_FORK_SERVER=off
gives exec'd runners, and a server that could not fork safely is never used.

One forked runner of a tiny "spy" submission serves most tests (the `spied` fixture): its
tests/adapters.py prints, at import, one line "SPY {json}" of what the runner sees (its
environment, folders, uid, limits, whether it can read the project's oracle), read back through
the runner's log."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from fa2_sandbox.harness import confinement, forked
from fa2_sandbox.harness.client import PROJECT_ROOT, SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.harness.scratch import FILE_LIMIT
from fa2_sandbox.harness.watchdog import kill_runner
from fa2_sandbox.wire.cases import FlashCase
from fa2_sandbox.wire.requests import Flash
from tests.self.fa2_sandbox.test_runner_guarantees import NAIVE

ENV = {"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}  # every runner here: one fork server for them all
REQUEST = Flash("pytorch", FlashCase(batch=(1,), n_queries=16, n_keys=16, head_dim=16), seed=1)
ORACLE = PROJECT_ROOT / "reference" / "oracle.py"
SERVER_FOLDER = "fa2-fork-server-"  # forked.ForkServer's own folder (its HOME, TMPDIR and cwd)

SPY = f'''
import ctypes, json, multiprocessing.process, os, resource, site, sys, tempfile

import triton


def _attempt(fn):
    try:
        fn()
        return "allowed"
    except Exception as exc:
        return type(exc).__name__


_deathsig = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(_deathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
with open("/proc/self/status") as _f:
    _status = dict(line.split(":", 1) for line in _f if ":" in line)
_report = {{
    "home": os.environ["HOME"], "expanded_home": os.path.expanduser("~"), "tmp": tempfile.gettempdir(),
    "cwd": os.getcwd(), "fa2_sandbox": sys.modules["fa2_sandbox"].__file__,
    "triton_cache": triton.knobs.cache.dir,
    # computed once, when the module was imported: in a forked runner, by the server
    "import_time": {{"triton_home": triton.knobs.cache.home_dir, "user_site": site.USER_SITE,
                    "multiprocessing_dir": multiprocessing.process.ORIGINAL_DIR}},
    "oracle": _attempt(lambda: open({str(ORACLE)!r}).read()),
    "euid": os.geteuid(), "root": sorted(os.listdir("/")),
    "limits": {{n: resource.getrlimit(getattr(resource, n))
               for n in ("RLIMIT_CORE", "RLIMIT_FSIZE", "RLIMIT_DATA", "RLIMIT_NPROC")}},
    "capabilities": _status["CapEff"].strip(), "no_new_privs": _status["NoNewPrivs"].strip(),
    "parent_death_signal": _deathsig.value, "session_leader": os.getpgrp() == os.getpid() == os.getsid(0),
    "env": dict(os.environ), "sys_path": sys.path,
}}
# one write, not print's two (the text, then its newline): the harness writes its own notes into the
# same log as it reads the runner's output, and one could land between them
os.write(1, ("SPY " + json.dumps(_report) + "\\n").encode())


def get_flashattention_autograd_function_pytorch():
    from student import Dense
    return Dense
'''


def make_spy(folder: Path) -> Path:
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "adapters.py").write_text(SPY)
    (folder / "student.py").write_text(NAIVE)
    return folder


def spy_report(runner: SubmissionRunner) -> dict:
    """The SPY line the runner's adapters printed at import (the last, should it have started twice)."""
    log = runner.log_tail()
    assert "SPY {" in log, log
    report, _ = json.JSONDecoder().raw_decode(log[log.rindex("SPY {") + len("SPY "):])
    return report


def under(path: str, folder: Path) -> bool:
    """Whether `path`, as the runner printed it, lies in `folder` (of this process). In modes
    "namespace" and "userns" the runner lives in a root of its own, which holds its scratch folder
    at the folder's real path (scratch.sandbox_spec binds os.path.realpath): a path the runner
    prints may be the real one where the harness's is not (a TMPDIR through a link), so either
    form counts; both name the same random grade-XXXXXXXX folder."""
    return any(path == top or path.startswith(top.rstrip("/") + "/") for top in (str(folder), os.path.realpath(folder)))


def confinement_facts(report: dict, runner: SubmissionRunner) -> dict:
    """What of a SPY report says how the runner was confined and started, with its own scratch
    folder and uid (different for every runner) written as placeholders, so that two runners
    of the same submission compare equal."""
    text = json.dumps({k: report[k] for k in ("oracle", "root", "limits", "capabilities", "no_new_privs",
                                              "parent_death_signal", "session_leader", "env", "sys_path")})
    for folder in {os.path.realpath(runner.scratch_folder.path), str(runner.scratch_folder.path)}:
        text = text.replace(folder, "SCRATCH")
    facts = json.loads(text)
    # the runner's own temporary folders (serve.py's runner-metadata-XXXXXXXX) have random names
    facts["sys_path"] = [re.sub(r"^SCRATCH/home/tmp/.*", "SCRATCH/home/tmp/...", p) for p in facts["sys_path"]]
    facts["own_uid"] = report["euid"] == runner.uid if runner.uid is not None else report["euid"]
    return facts


@pytest.fixture(scope="module")
def spied(tmp_path_factory):
    """One forked runner of the spy submission, started (with the fork server on, whatever the
    caller's environment says) and asked one Flash case: the runner, the reply, its process's
    class as launched and its SPY report."""
    folder = make_spy(tmp_path_factory.mktemp("fork-server") / "spy")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("GRADER_FORK_SERVER", raising=False)
        runner = SubmissionRunner(load_submission(folder), env=ENV, import_timeout=120)
        try:
            ready = runner.start()
            assert ready.get("import_error") is None, (ready, runner.log_tail())
            process_class = type(runner.process)
            reply = runner.call(REQUEST, 60)
            yield SimpleNamespace(runner=runner, folder=folder, reply=reply, process_class=process_class,
                                  report=spy_report(runner))
        finally:
            runner.close()


def test_a_runner_is_forked_answers_and_is_confined(spied):
    """The runner comes from the fork server (a ForkedProcess, not a Popen, and no note that it
    started afresh), answers a Flash case, and is confined by the launcher as the probe says
    this machine confines: the limits, the parent-death signal, a session of its own, its own
    uid and no capabilities where the mode gives them, and the project's oracle out of reach
    where the project is hidden."""
    runner, report = spied.runner, spied.report
    assert spied.process_class is forked.ForkedProcess
    assert "not forked" not in runner.log_tail()
    assert spied.reply.ok, (spied.reply.status, spied.reply.message, spied.reply.traceback)
    mode = runner.isolation["mode"]
    assert mode == confinement.isolation(tempfile.gettempdir(), runner.memory_limit)["mode"]
    assert report["limits"]["RLIMIT_CORE"] == [0, 0] and report["limits"]["RLIMIT_FSIZE"] == [FILE_LIMIT] * 2
    assert report["parent_death_signal"] == signal.SIGKILL and report["session_leader"]
    if mode != "none":  # "none": limits and kills only (not root, no user namespaces, or no uid switch)
        assert report["capabilities"] == "0000000000000000", report
    if mode in ("namespace", "uid"):
        assert report["euid"] == runner.uid != os.geteuid()
    if mode in ("namespace", "userns"):  # the project is not in the runner's root
        assert ORACLE.is_file() and report["oracle"] == "FileNotFoundError", report
    else:
        pytest.skip(f"mode {mode!r} does not hide the project: {runner.isolation['note']}")


def test_a_forked_runner_lives_in_its_own_folders_not_the_servers(spied):
    """HOME, the temporary folder, the cwd, Triton's cache and the trusted fa2_sandbox package are
    the runner's own (its scratch folder, its trusted copy), not the fork server's folder
    (fa2-fork-server-*, its HOME and TMPDIR) nor the project: the server imported torch and Triton
    with its own environment, and the runner must not inherit what they read of it then."""
    runner, report = spied.runner, spied.report
    scratch = runner.scratch_folder
    assert under(report["home"], scratch.home) and under(report["expanded_home"], scratch.home), report
    assert under(report["tmp"], scratch.home), report  # TMPDIR is home/tmp (scratch.runner_env)
    assert under(report["cwd"], scratch.path / "submission"), report
    assert under(report["triton_cache"], scratch.triton_cache), report
    assert under(report["fa2_sandbox"], scratch.trusted), report
    assert not under(report["fa2_sandbox"], PROJECT_ROOT), report
    assert report["env"]["PYTHONPATH"].split(os.pathsep)[0] in (str(scratch.trusted), os.path.realpath(scratch.trusted))
    everything = json.dumps({k: v for k, v in report.items() if k != "import_time"})
    assert SERVER_FOLDER not in everything, everything


def test_what_modules_computed_at_import_is_not_the_servers(spied):
    """What a preloaded module computed from the environment when it was imported would be the
    server's unless the runner's environment or the child sets it again: triton.knobs.cache.home_dir
    (the default of Triton's dump and override folders: TRITON_HOME is the runner's), site.USER_SITE
    and multiprocessing's ORIGINAL_DIR (reset in the child) never name the fork server's folder,
    which an exec'd runner never sees (in mode "namespace" it does not even exist in its root)."""
    assert SERVER_FOLDER not in json.dumps(spied.report["import_time"]), spied.report["import_time"]


def test_exit_statuses_read_as_popens(spied, tmp_path):
    """A forked runner's end reads as Popen's: running, poll() is None and wait(timeout) raises
    TimeoutExpired; killed (watchdog.kill_runner), wait() returns -SIGKILL and poll() and
    returncode agree; a runner that exits with status 3 (at import) reads 3."""
    runner = spied.runner
    if runner.process is None:  # stopped by another test: a fresh one, forked all the same
        runner.start()
    process = runner.process
    assert isinstance(process, forked.ForkedProcess)
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    kill_runner(process, runner.uid)
    assert process.wait(timeout=10) == -signal.SIGKILL
    assert process.poll() == process.returncode == -signal.SIGKILL
    runner.stop()

    folder = tmp_path / "exits"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "adapters.py").write_text("import os\nos._exit(3)\n")
    exits = SubmissionRunner(load_submission(folder), env=ENV, import_timeout=60)
    try:
        exits.launch()
        process = exits.process
        assert isinstance(process, forked.ForkedProcess)
        ready = exits.start()
        assert str(ready.get("import_error")).endswith("exited with status 3 during import"), ready
        assert process.poll() == process.returncode == 3
    finally:
        exits.close()


def test_forked_runners_draw_numpy_numbers_of_their_own(tmp_path, monkeypatch):
    """numpy's global generator is seeded when numpy.random is imported: preloaded by a server,
    two runners forked from it would draw the same numbers, where two exec'd runners draw their
    own. (torch does not import numpy.random today; this server preloads it to make sure.)"""
    monkeypatch.setattr(forked, "PRELOAD", (*forked.PRELOAD, "numpy.random"))
    env = {**ENV, "TORCH_FORK_SERVER_TEST": "numpy"}  # a server of its own (servers are per environment)
    folder = tmp_path / "draws"
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "adapters.py").write_text(
        "import numpy\nprint('DRAW', numpy.random.randint(1 << 62), flush=True)\n")
    draws = []
    for _ in range(2):
        runner = SubmissionRunner(load_submission(folder), env=env, import_timeout=60)
        try:
            assert runner.start().get("import_error") is None, runner.log_tail()
            assert isinstance(runner.process, forked.ForkedProcess)
            draws += [line for line in runner.log_tail().splitlines() if line.startswith("DRAW")]
        finally:
            runner.close()
    assert len(draws) == 2 and draws[0] != draws[1], draws


def test_fork_server_off_gives_an_exec_d_runner_confined_the_same(spied, monkeypatch):
    """With GRADER_FORK_SERVER=off a new runner is a subprocess.Popen and still answers; what it
    sees of its confinement (limits, root, uid, oracle, environment, sys.path) is what the forked
    runner saw, its own folders and uid aside."""
    monkeypatch.setenv("GRADER_FORK_SERVER", "off")
    runner = SubmissionRunner(load_submission(spied.folder), env=ENV, import_timeout=120)
    try:
        reply = runner.call(REQUEST, 60)
        assert type(runner.process) is subprocess.Popen
        assert reply.ok, (reply.status, reply.message, reply.traceback)
        assert "not forked" not in runner.log_tail()  # no server to fall back from: nothing to say
        assert confinement_facts(spy_report(runner), runner) == confinement_facts(spied.report, spied.runner)
    finally:
        runner.close()


UNSAFE = "fork_server_test_starts_a_thread"
SAFE = "fork_server_test_harmless"


def preload_modules(folder: Path) -> None:
    (folder / f"{UNSAFE}.py").write_text("import threading, time\n"
                                         "threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n")
    (folder / f"{SAFE}.py").write_text("VALUE = 1\n")


def first_message(folder: Path, modules: list) -> tuple:
    """Run fork_server.py as forked.ForkServer does (a SOCK_SEQPACKET pair, argv CONTROL_FD
    LAUNCHER_PY MODULE...) with `folder` on its PYTHONPATH: its first message, and its exit status
    and output once this end is closed."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = subprocess.Popen(
        [sys.executable, "-P", str(forked.SERVER_PY), str(theirs.fileno()), str(forked.launcher_py()), *modules],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(folder), "HOME": str(folder)},
        pass_fds=(theirs.fileno(),), cwd=folder, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    theirs.close()
    message = None
    try:
        ours.settimeout(60)
        data = ours.recv(1 << 16)
        message = json.loads(data) if data else None
    finally:
        ours.close()  # a ready server returns when this end closes; a refusing one has returned already
        try:
            output, _ = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            output, _ = server.communicate()
    return message, server.returncode, output


def test_a_server_that_cannot_fork_safely_is_not_used(tmp_path, monkeypatch):
    """A preloaded module that starts a thread makes the server refuse ({"error": ...} naming the
    module, instead of {"ready": true}, which a harmless module gets) and stop; forked.ForkServer
    then sets `broken`, `spawn` returns None, and a SubmissionRunner given that server starts its
    runner afresh, saying why in its log."""
    preload_modules(tmp_path)
    message, code, output = first_message(tmp_path, [SAFE])
    assert (message, code) == ({"ready": True}, 0), output
    message, code, output = first_message(tmp_path, [SAFE, UNSAFE])
    assert message and set(message) == {"error"}, (message, output)
    assert UNSAFE in message["error"] and "thread" in message["error"], message
    assert code == 0, output  # it said why and stopped, forking nothing

    monkeypatch.setattr(forked, "PRELOAD", (UNSAFE, *forked.PRELOAD))  # first: torch is not imported at all
    # the server's PYTHONPATH is the grader's user site-packages (scratch.user_site_paths): here, the module's folder
    monkeypatch.setattr(forked, "user_site_paths", lambda: [str(tmp_path)])
    server = forked.ForkServer({**ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    try:
        assert server.broken and UNSAFE in server.broken, server.broken
        assert server.process.poll() is not None  # closed and gone
        r, w = os.pipe()
        try:
            assert server.spawn(None, str(tmp_path), {}, (r, w, w)) is None
        finally:
            os.close(r)
            os.close(w)

        monkeypatch.delenv("GRADER_FORK_SERVER", raising=False)
        monkeypatch.setattr(forked, "fork_server", lambda env: server)
        runner = SubmissionRunner(load_submission(make_spy(tmp_path / "spy")), env=ENV, import_timeout=120)
        try:
            ready = runner.start()
            assert ready.get("import_error") is None, (ready, runner.log_tail())
            assert type(runner.process) is subprocess.Popen
            assert f"runner started afresh, not forked: {server.broken}" in runner.log_tail()
        finally:
            runner.close()
    finally:
        server.close()
