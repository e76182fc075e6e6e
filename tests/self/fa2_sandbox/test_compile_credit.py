"""A call's deadline moves by the time its runner compiled an autotuner's configs
(fa2_sandbox/harness/compile_credit.py), at most the timeout again: a kernel that compiles slowly
beside a class still answers, and one that hangs, or claims to compile for ever, is still stopped."""
import textwrap
import time

import pytest

from fa2_sandbox.harness import compile_credit
from fa2_sandbox.harness.client import SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.wire.cases import FlashCase
from fa2_sandbox.wire.requests import Flash

# A class whose forward "compiles" (inside the runner's own compiling(), as parallel_autotune's
# side-by-side compile is) for COMPILE s, then runs for RUN s; torch's attention does the rest.
ADAPTERS = '''
import time
import torch
from fa2_sandbox.runner import parallel_autotune


class Compiling:
    @staticmethod
    def apply(q, k, v, is_causal=False):
        with parallel_autotune.compiling():
            time.sleep({compile})
        time.sleep({run})
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def get_flashattention_autograd_function_pytorch():
    return Compiling
'''
CASE = FlashCase(batch=(1,), n_queries=16, n_keys=16, head_dim=16, dtype="float32")


def call(tmp_path, compile_s, run_s, timeout):
    (tmp_path / "adapters.py").write_text(textwrap.dedent(ADAPTERS.format(compile=compile_s, run=run_s)))
    runner = SubmissionRunner(load_submission(tmp_path), import_timeout=120)
    try:
        assert runner.import_failure() is None
        started = time.monotonic()
        reply = runner.call(Flash("pytorch", CASE, seed=1, device="cpu"), timeout, "16x16")
        return reply, time.monotonic() - started
    finally:
        runner.close()


def test_a_call_that_compiled_past_its_timeout_still_answers(tmp_path):
    reply, took = call(tmp_path, compile_s=3.5, run_s=1.0, timeout=3)
    assert reply.ok, reply  # 4.5 s in all, 1 s of it its own running
    assert took >= 4.5


def test_a_call_that_compiles_for_ever_is_stopped_at_twice_its_timeout(tmp_path):
    reply, took = call(tmp_path, compile_s=60, run_s=0, timeout=2)
    assert reply.timed_out
    assert reply.message == ("timed out after 2 s in forward (16x16); 2 s more were given for compiling an "
                             "autotuner's configs")
    assert 2 * compile_credit.MAX_CREDIT * 2 <= took < 2 * 2 + 3  # its credit, then the stop and the reap


def test_a_call_that_runs_past_its_timeout_without_compiling_gets_no_more(tmp_path):
    reply, took = call(tmp_path, compile_s=0, run_s=60, timeout=2)
    assert reply.timed_out and reply.message == "timed out after 2 s in forward (16x16)"
    assert took < 2 + 3


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(compile_credit.time, "monotonic", lambda: now[0])
    return now


def test_the_credit_adds_up_compiles_and_never_passes_its_cap(clock):
    credit = compile_credit.CompileCredit(timeout=10)
    credit.heard({"on": True})
    clock[0] += 4
    credit.heard({"on": True})  # a second "on" while compiling changes nothing
    credit.heard({"on": False})
    assert credit.owed() == 4 and credit.owed() == 0  # owed once
    credit.heard({"on": "yes"})  # not an event the runner's code sends: ignored
    clock[0] += 1
    assert credit.owed() == 0
    credit.heard({"on": True})
    clock[0] += 30  # still compiling, far past the cap
    assert credit.owed() == 6 and credit.credited == 10
    clock[0] += 5
    assert credit.owed() == 0
