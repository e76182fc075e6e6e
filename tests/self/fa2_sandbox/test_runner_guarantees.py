"""The runner's guarantees against a hostile submission, one by one, each on a tiny submission of
its own (make_submission): a timeout kills the process group, no child outlives the runner, output
is bounded, a crash or a CUDA error gets a fresh runner, memory is capped, the channel refuses
what it should, the project cannot be touched, tensors are validated, and the copy the runner
imports is the trusted one. test_hostile.py grades the hostile example submissions as a class."""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fa2_sandbox.harness import confinement
from fa2_sandbox.harness.client import LOG_TAIL_BYTES, PROJECT_ROOT, SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.wire.cases import FlashCase
from fa2_sandbox.wire.requests import Flash
from tests.self.fa2_sandbox.test_hostile import TEST_MARK, kill_orphans, orphans

NAIVE = '''
import math
import torch


class Dense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        lse = torch.logsumexp(s, -1)
        ctx.save_for_backward(q, k, v, lse)
        return torch.softmax(s, -1) @ v

    @staticmethod
    def backward(ctx, do):
        q, k, v, lse = ctx.saved_tensors
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v
            return (*torch.autograd.grad(o, (q, k, v), do), None)
'''

CASE = FlashCase(batch=(1,), n_queries=16, n_keys=16, head_dim=16)
REQUEST = Flash("pytorch", CASE, seed=1)


def make_submission(folder: Path, forward: str, head: str = "") -> Path:
    """A tiny submission whose PyTorch slot runs `forward` (indented body) before a dense answer."""
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "adapters.py").write_text(textwrap.dedent('''
        def get_flashattention_autograd_function_pytorch():
            from student import Attention
            return Attention
    '''))
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    (folder / "student.py").write_text(NAIVE + textwrap.dedent(head) + textwrap.dedent('''

        class Attention(Dense):
            @staticmethod
            def forward(ctx, q, k, v, is_causal=False):
        ''') + body + "\n        return Dense.forward(ctx, q, k, v, is_causal)\n")
    return folder


@pytest.fixture
def runner_for(tmp_path):
    runners = []

    def make(forward: str, head: str = "", **kwargs) -> SubmissionRunner:
        runner = SubmissionRunner(load_submission(make_submission(tmp_path / f"sub{len(runners)}", forward, head)),
                                  import_timeout=60, **kwargs)
        runners.append(runner)
        return runner

    yield make
    for runner in runners:
        runner.close()


def marked(mark: str) -> list:
    return [c for _, c in orphans(mark)]


def test_timeout_kills_the_process_group(runner_for):
    runner = runner_for(f'''
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", "{TEST_MARK}timeout"])
        while True:
            pass
    ''')
    reply = runner.call(REQUEST, timeout=4, what="N=16")
    assert reply.status == "timeout" and reply.message == "timed out after 4 s in forward (N=16)", reply
    assert not marked(f"{TEST_MARK}timeout")
    # a case no smaller than one that timed out fails at once; a smaller one still runs
    bigger = replace(REQUEST, case=FlashCase(batch=(2,), n_queries=16, n_keys=16, head_dim=16))
    started = time.monotonic()
    again = runner.call(bigger, timeout=4)
    assert again.status == "timeout" and "not run: a smaller case already timed out after 4 s" in again.message
    assert time.monotonic() - started < 1
    smaller = replace(REQUEST, case=FlashCase(batch=(1,), n_queries=8, n_keys=8, head_dim=16))
    assert runner.call(smaller, timeout=4).message == "timed out after 4 s in forward"


def test_a_runner_that_learns_no_timeouts_runs_every_case(runner_for):
    """The timing reference's kept runner (learns_timeouts=False): a call that timed out on a busy
    machine fails no later call, of its own submission's check or the next one's."""
    runner = runner_for("while True:\n    pass", learns_timeouts=False)
    assert runner.call(REQUEST, timeout=3).status == "timeout"
    bigger = replace(REQUEST, case=FlashCase(batch=(2,), n_queries=16, n_keys=16, head_dim=16))
    assert runner.call(bigger, timeout=3).message == "timed out after 3 s in forward"


def test_no_child_survives_the_runner(runner_for):
    runner = runner_for(f'''
        import os, subprocess, sys
        sleep = "import time; time.sleep(1000)"
        subprocess.Popen([sys.executable, "-c", sleep, "{TEST_MARK}unit-popen"])
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", sleep, "{TEST_MARK}unit-setsid"])
            os._exit(0)
    ''')
    assert runner.call(REQUEST, timeout=30).ok
    deadline = time.monotonic() + 10
    while len(marked(f"{TEST_MARK}unit")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(marked(f"{TEST_MARK}unit")) == 2  # alive between calls, as a runner is
    runner.close()
    time.sleep(0.2)
    left = marked(f"{TEST_MARK}unit")
    kill_orphans(f"{TEST_MARK}unit")
    if runner.uid is None:
        assert left == [c for c in left if "setsid" in c]
        pytest.skip("without a uid of its own, a setsid'd child escapes the process-group kill")
    assert not left


def test_output_is_bounded(runner_for):
    runner = runner_for('''
        import sys
        chunk = "y" * 1023 + "\\n"
        for _ in range(50):
            sys.stdout.write(chunk * 1024)
        sys.stderr.write("LAST LINE\\n")
    ''')
    assert runner.call(REQUEST, timeout=60).ok
    tail = runner.log_tail()
    assert runner.output.total > 50 << 20
    assert len(tail.encode()) <= LOG_TAIL_BYTES + 100 and tail.rstrip().endswith("LAST LINE")
    assert "earlier bytes of output not kept" in tail
    on_disk = sum(p.stat().st_size for p in runner.scratch_folder.path.rglob("*")
                  if p.is_file() and "trusted" not in p.parts)
    assert on_disk < 1 << 20  # the output never touched the disk


def test_outputs_are_judged_as_returned(runner_for):
    """The forward returns zeros and keeps a thread that writes the right output into them once
    the backward starts (the backward waits for it): the outputs come back as the forward
    returned them, so the zeros are judged, while the gradients, computed right, come back too."""
    runner = runner_for('''
        o = Dense.forward(ctx, q, k, v, is_causal)
        returned = torch.zeros_like(o)
        ctx.backward_started = threading.Event()

        def fix_up():
            ctx.backward_started.wait()
            returned.copy_(o)

        ctx.fix_up = threading.Thread(target=fix_up, daemon=True)
        ctx.fix_up.start()
        return returned
    ''', head='''
        import threading

        dense_backward = Dense.backward


        def backward_after_the_fix_up(ctx, do):
            ctx.backward_started.set()
            ctx.fix_up.join()
            return dense_backward(ctx, do)


        Dense.backward = staticmethod(backward_after_the_fix_up)
    ''')
    for _ in range(3):  # the same every time: nothing here depends on the threads' timing
        reply = runner.call(REQUEST, timeout=60)
        assert reply.ok, reply
        assert torch.equal(reply.tensors["o"], torch.zeros_like(reply.tensors["o"]))
        assert all(reply.tensors[name].abs().max() > 0 for name in ("dq", "dk", "dv")), reply.tensors


def test_what_a_call_printed_is_in_the_log_when_it_returns(runner_for):
    """The runner prints, then replies on another pipe: the log tail read right after the reply
    holds the print (the harness catches up with the output pipe first), every time."""
    runner = runner_for('''
        print(f"CALL-{next(CALLS)}-DONE", flush=True)
    ''', head="import itertools\nCALLS = itertools.count()\n")
    for n in range(20):
        assert runner.call(REQUEST, timeout=60).ok
        assert f"CALL-{n}-DONE" in runner.log_tail(), runner.log_tail()[-300:]


def test_raise_not_implemented_is_named(runner_for):
    reply = runner_for("if is_causal:\n    raise NotImplemented").call(
        replace(REQUEST, case=replace(CASE, is_causal=True)), timeout=60)
    assert reply.status == "error"
    assert reply.message.startswith("TypeError: exceptions must derive from BaseException (`raise NotImplemented` "
                                    "at student.py:"), reply.message
    assert reply.message.endswith("NotImplemented is a constant, not an exception; raise NotImplementedError instead)")


def test_fresh_runner_after_a_crash(runner_for):
    runner = runner_for('''
        import ctypes, os
        if not os.path.exists("crashed-once"):
            open("crashed-once", "w").close()
            ctypes.string_at(0)
    ''')
    first = runner.call(REQUEST, timeout=30, what="N=16")
    assert first.status == "crash" and first.message == "process died with SIGSEGV during forward (N=16)"
    assert "Fatal Python error: Segmentation fault" in runner.log_tail()  # faulthandler's stack
    second = runner.call(REQUEST, timeout=30)
    assert second.ok, second


def test_import_failure_restarts_a_crashed_runner_here(runner_for):
    """The timing check starts its runners with import_failure() in the test's own thread before
    calling them from a pool: a runner restarted lazily inside a pool thread would be killed when
    that thread ends (PR_SET_PDEATHSIG follows the thread)."""
    runner = runner_for('''
        import ctypes, os
        if not os.path.exists("crashed-once"):
            open("crashed-once", "w").close()
            ctypes.string_at(0)
    ''')
    assert runner.call(REQUEST, timeout=30).status == "crash" and runner.process is None
    assert runner.import_failure() is None and runner.process is not None
    assert runner.call(REQUEST, timeout=30).ok

def test_fresh_runner_after_a_cuda_error(runner_for):
    """A CUDA error poisons the context: the runner says so and the next call gets a new one
    (simulated here by the error's message, which is what the runner looks at)."""
    runner = runner_for('''
        import os
        if not os.path.exists("failed-once"):
            open("failed-once", "w").close()
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    ''')
    first = runner.call(REQUEST, timeout=30)
    pid = runner.process.pid if runner.process else None
    assert first.status == "error" and "illegal memory access" in first.message
    assert runner.process is None, "the poisoned runner should have been stopped"
    second = runner.call(REQUEST, timeout=30)
    assert second.ok and runner.process.pid != pid


def test_out_of_memory_in_the_runner(runner_for):
    runner = runner_for('''
        import torch
        hoard = [torch.ones(1 << 28) for _ in range(8)]
    ''', memory_limit=int(1.5 * (1 << 30)))
    reply = runner.call(REQUEST, timeout=60, what="N=16")
    assert reply.status == "crash" and reply.message.startswith("ran out of memory during forward (N=16): "), reply
    # the allocation fails (RLIMIT_DATA), or the watchdog sees the runner's memory first
    assert "the runner's limit is 1.5 GiB" in reply.message or "over the runner's limit of 1.5 GiB" in reply.message
    assert runner.call(REQUEST, timeout=30).status == "crash"  # a fresh runner, out of memory again


def children_holding_memory(leave_group: bool = False) -> str:
    """A forward whose 3 children each touch 800 MiB and wait; with `leave_group` they setsid first."""
    return f'''
        import os, time, torch
        kids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                {"os.setsid()" if leave_group else "pass"}
                x = torch.ones(200 << 20)  # 800 MiB, touched
                time.sleep(60)
                os._exit(0)
            kids.append(pid)
        for pid in kids:
            os.waitpid(pid, 0)
    '''


def test_memory_watchdog_counts_every_process(runner_for):
    """Per-process limits let each child allocate; the watchdog adds them all up."""
    runner = runner_for(children_holding_memory(), memory_limit=int(1.5 * (1 << 30)))
    reply = runner.call(REQUEST, timeout=60)
    assert reply.status == "crash", reply
    assert reply.message.startswith("ran out of memory during forward: its processes held"), reply


def test_invalid_messages(runner_for):
    runner = runner_for('''
        import os, sys
        os.write(int(sys.argv[2]), b"this is not json\\n")
    ''')
    reply = runner.call(REQUEST, timeout=30)
    assert reply.status == "crash" and "sent an invalid message on the grader's channel during forward" in reply.message


def test_closed_channel_does_not_hang(runner_for):
    runner = runner_for('''
        import os, sys
        os.close(int(sys.argv[1])); os.close(int(sys.argv[2]))
        while True:
            pass
    ''')
    started = time.monotonic()
    reply = runner.call(REQUEST, timeout=60)
    assert reply.status == "crash" and "closed the grader's result channel and kept running" in reply.message
    assert time.monotonic() - started < 20


def test_runner_cannot_touch_the_project(runner_for, tmp_path):
    """The runner reads none of the project, writes into no reports folder and no other submission."""
    if confinement.isolation(tempfile.gettempdir())["mode"] == "none":
        pytest.skip("no uid of its own here (not root): " + confinement.isolation(tempfile.gettempdir())["note"])
    public = Path(tempfile.mkdtemp(prefix="hostile-unit-"))  # world-traversable, like a shared disk
    try:
        os.chmod(public, 0o755)
        (public / "reports" / "alice").mkdir(parents=True)
        (public / "reports" / "alice" / "results.json").write_text("{}")
        (public / "class" / "bob").mkdir(parents=True)
        (public / "class" / "bob" / "secret.py").write_text("answer = 42\n")
        for p in [public / "reports", public / "reports" / "alice", public / "class", public / "class" / "bob"]:
            os.chmod(p, 0o755)
        student = public / "class" / "mallory"
        make_submission(student, f'''
            import json, os
            out = {{}}
            def attempt(name, fn):
                try:
                    fn()
                    out[name] = "allowed"
                except Exception as exc:
                    out[name] = type(exc).__name__
            attempt("read project", lambda: open({str(PROJECT_ROOT / "README.md")!r}).read())
            attempt("read rubric", lambda: open({str(PROJECT_ROOT / "grading/rubric.yaml")!r}).read())
            attempt("read other submission", lambda: open({str(public / "class/bob/secret.py")!r}).read())
            attempt("write results.json", lambda: open({str(public / "reports/alice/results.json")!r}, "r+"))
            attempt("create in reports", lambda: open({str(public / "reports/PWNED")!r}, "x"))
            attempt("create in other submission", lambda: open({str(public / "class/bob/PWNED")!r}, "x"))
            attempt("create in project reports", lambda: open({str(PROJECT_ROOT / "reports/PWNED")!r}, "x"))
            attempt("import reference solution", lambda: __import__("reference.flash_pytorch"))
            attempt("import oracle", lambda: __import__("reference.oracle"))
            attempt("network", lambda: __import__("socket").create_connection(("1.1.1.1", 53), timeout=2))
            raise RuntimeError("REPORT " + json.dumps(out))
        ''')
        runner = SubmissionRunner(load_submission(student), import_timeout=60)
        try:
            reply = runner.call(REQUEST, timeout=60)
        finally:
            runner.close()
        assert reply.status == "error" and "REPORT " in reply.message, reply
        out = json.loads(reply.message.split("REPORT ", 1)[1])
        must_deny = ["write results.json", "create in reports", "create in other submission",
                     "create in project reports", "import reference solution", "import oracle"]
        if confinement.isolation(tempfile.gettempdir())["mode"] == "namespace":
            must_deny += ["read project", "read rubric", "read other submission", "network"]
        allowed = [name for name in must_deny if out[name] == "allowed"]
        assert not allowed, out
        assert not (public / "reports" / "PWNED").exists() and not (PROJECT_ROOT / "reports" / "PWNED").exists()
    finally:
        shutil.rmtree(public, ignore_errors=True)


def test_tensors_are_validated(tmp_path):
    """What comes back is read only from this call's file in the exchange folder, never through a
    link or from a FIFO, and must be a dict of plain dense tensors."""
    runner = SubmissionRunner(load_submission(make_submission(tmp_path / "sub", "pass")))
    try:
        def reply_with(make_file, path=None):
            tag = f"call1-{os.urandom(4).hex()}"
            target = runner.scratch_folder.exchange / f"{tag}.pt"
            make_file(target)
            message = {"event": "done", "status": "ok", "tag": tag, "result": {"tensors": path or str(target)}}
            return runner._reply(message, tag, "")

        good = reply_with(lambda p: torch.save({"o": torch.ones(2, 3)}, p))
        assert good.ok and torch.equal(good.tensors["o"], torch.ones(2, 3))
        bad = {
            "link": lambda p: os.symlink("/etc/hostname", p),
            "fifo": lambda p: os.mkfifo(p),
            "not a dict": lambda p: torch.save([torch.ones(1)], p),
            "not a tensor": lambda p: torch.save({"o": 3}, p),
            "sparse": lambda p: torch.save({"o": torch.eye(3).to_sparse()}, p),
            "garbage": lambda p: p.write_bytes(b"\x80not a pickle"),
        }
        for what, make in bad.items():
            reply = reply_with(make)
            assert reply.status == "crash" and "sent back invalid tensors" in reply.message, (what, reply)
        elsewhere = reply_with(lambda p: torch.save({"o": torch.ones(1)}, p), path="/etc/passwd")
        assert elsewhere.status == "crash" and "outside the exchange folder" in elsewhere.message
        forged = runner._reply({"event": "done", "status": "ok", "tag": "call1", "result": {}}, "call1-abcd", "")
        assert forged.status == "crash" and "sent an invalid reply" in forged.message
    finally:
        runner.close()


def test_copy_keeps_links_inside_and_drops_the_rest(tmp_path):
    sub = make_submission(tmp_path / "sub", "pass")
    (tmp_path / "outside.txt").write_text("secret")
    os.symlink(tmp_path / "outside.txt", sub / "leak.txt")
    os.symlink("/etc/hostname", sub / "hostname")
    os.symlink("student.py", sub / "alias.py")
    os.symlink(".", sub / "loop")
    os.mkfifo(sub / "fifo")
    runner = SubmissionRunner(load_submission(sub))
    try:
        copy = runner._copy_submission()
        names = {p.name for p in copy.iterdir()}
        assert "alias.py" in names and (copy / "alias.py").read_text() == (sub / "student.py").read_text()
        assert not names & {"leak.txt", "hostname", "loop", "fifo"}
        assert not any(p.is_symlink() for p in copy.rglob("*"))
        if runner.uid is not None:
            assert all(p.lstat().st_uid == runner.uid for p in [copy, *copy.rglob("*")])
    finally:
        runner.close()


def test_trusted_copy_is_enough_and_holds_no_solutions(tmp_path):
    runner = SubmissionRunner(load_submission(make_submission(tmp_path / "sub", "pass")))
    try:
        trusted = runner.scratch_folder.trusted
        files = {str(p.relative_to(trusted)) for p in trusted.rglob("*.py")}
        assert {"fa2_sandbox/runner/serve.py", "fa2_sandbox/runner/ranks.py", "fa2_sandbox/wire/tensors.py"} <= files
        # exactly the runner side and the wire: no harness, no reference solution, no oracle, no tests
        assert {f.split("/")[1] for f in files if f.count("/") > 1} == {"runner", "wire"}
        assert all(f.startswith("fa2_sandbox/") for f in files)
        code = ("import sys, fa2_sandbox.runner.serve, fa2_sandbox.runner.distributed_ops; "
                "print(sorted(m for m in sys.modules if m.split('.')[0] in ('reference', 'tests') "
                "or m.startswith('fa2_sandbox.harness')))")
        proc = subprocess.run([sys.executable, "-I", "-c",
                               f"import sys; sys.path.insert(0, {str(runner.scratch_folder.trusted)!r}); {code}"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == "[]", proc.stdout
    finally:
        runner.close()


def test_scratch_is_private(tmp_path):
    runner = SubmissionRunner(load_submission(make_submission(tmp_path / "sub", "pass")))
    try:
        runner._copy_submission()
        scratch = runner.scratch_folder
        assert stat.S_IMODE(scratch.path.stat().st_mode) == 0o711
        for folder in (scratch.exchange, scratch.home, scratch.path / "submission"):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
            if runner.uid is not None:
                assert folder.stat().st_uid == runner.uid
        assert scratch.path.stat().st_uid == os.geteuid() and scratch.trusted.stat().st_uid == os.geteuid()
    finally:
        runner.close()
