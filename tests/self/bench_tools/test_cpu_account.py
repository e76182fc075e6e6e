"""bench/cpu_account.py: a class run's CPU split per submission and by phase, from hand-made
/proc snapshots (no real /proc), a runner's cpu log and a timeline, as grade_speed.py feeds them.

The family in every test: the controller (pid 1), a grader worker (pid 10, gw0) and a runner of
alice (pid 11, the worker's child)."""
import json

import pytest

from bench.cpu_account import RANKS, ProcessLedger, account, compare_accounts

CONTROLLER, WORKER, RUNNER = "grader controller", "grader workers", "runner (student code)"
COMPILERS = "compilers (ptxas, gcc, ld)"
START = 1000  # every process's start time in ticks, unless a test reuses a pid


def proc(ppid, own, role, reaped=0.0, start=START, comm="python3"):
    """One process of a snapshot: ((ppid, own core-s, reaped children's core-s, start ticks, comm), role)."""
    return (ppid, own, reaped, start, comm), role


def family(controller=0.0, worker=0.0, worker_reaped=0.0):
    return {1: proc(0, controller, CONTROLLER), 10: proc(1, worker, WORKER, worker_reaped)}


def profile(pid=11, submission="alice", worker="gw0", worker_pid=10, at=0.0, **cpu):
    cpu = {"start and imports": 0.0, "compiling": 0.0, "op watch": 0.0, "student calls": 0.0,
           "waiting for the GPU": 0.0, "runner's own": 0.0, **cpu}
    return {"pid": pid, "submission": submission, "at": at, "worker": worker, "worker_pid": worker_pid, "cpu": cpu}


def span(worker, submission, start, stop, when="call"):
    return {"worker": worker, "test": f"grading/checks/test_flash.py::test_forward[x]@{submission}/pytorch",
            "when": when, "start": start, "stop": stop, "outcome": "passed"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def feed(samples):
    ledger = ProcessLedger()
    for wall, snapshot in samples:
        ledger.sample(wall, snapshot)
    return ledger


def account_of(tmp_path, samples, profiles=(), timeline=(), busy_core_s=None):
    cpu_log = write_jsonl(tmp_path / "cpu.jsonl", profiles)
    spans = write_jsonl(tmp_path / "timeline.jsonl", timeline)
    return account(feed(samples), cpu_log, spans, busy_core_s)


def test_a_runner_is_split_as_its_profile_and_the_rest_is_after_its_last_reply(tmp_path):
    """/proc measured 8.5 s of the runner, whose last reply's profile said 6.5 s: the 6.5 s split
    in the profile's proportions, the 2.0 s it used after that reply under "after the last reply".
    The cpu log's last line for a pid is the one that counts."""
    samples = [(99.0, family()),
               (101.0, {**family(), 11: proc(10, 4.0, RUNNER)}),  # new since the first sample: counts from 0
               (104.0, {**family(), 11: proc(10, 8.5, RUNNER)}),
               (106.0, family(worker_reaped=8.5))]  # the worker reaped it: nothing it was not seen using
    earlier = profile(**{"start and imports": 1.0, "process": 1.0})
    last = profile(**{"start and imports": 1.0, "compiling": 2.0, "student calls": 3.0, "runner's own": 0.5,
                      "process": 6.5})
    alice = account_of(tmp_path, samples, [earlier, last])["submissions"]["alice"]
    assert alice["start and imports"] == 1.0
    assert alice["compiling"] == 2.0
    assert alice["student calls"] == 3.0
    assert alice["runner's own"] == 0.5
    assert alice["op watch"] == alice["waiting for the GPU"] == 0.0
    assert alice["after the last reply"] == 2.0
    assert alice["total"] == 8.5


def test_a_short_lived_child_is_compiling_and_a_rank_seen_alive_counts_once(tmp_path):
    """Between two samples the runner's reaped time grows by 0.7 s that no process seen accounts
    for (a ptxas that came and went): alice's "compiling". A rank (pid 12) seen using 3.0 s exits
    and the runner's reaped time grows by those 3.0 s: the rank's column holds them, and the
    runner's reaped growth adds nothing more, the ledger having subtracted what it saw of the rank."""
    samples = [(99.0, family()),
               (101.0, {**family(), 11: proc(10, 1.0, RUNNER), 12: proc(11, 1.5, RANKS)}),
               (102.0, {**family(), 11: proc(10, 2.0, RUNNER, reaped=0.7), 12: proc(11, 3.0, RANKS)}),
               (103.0, {**family(), 11: proc(10, 2.5, RUNNER, reaped=3.7)})]  # 0.7 + the rank's 3.0
    report = account_of(tmp_path, samples, [profile(**{"start and imports": 1.0, "student calls": 1.5,
                                                       "process": 2.5})])
    alice = report["submissions"]["alice"]
    assert alice["compiling"] == 0.7
    assert alice[RANKS] == 3.0
    assert alice["start and imports"] == 1.0 and alice["student calls"] == 1.5
    assert alice["after the last reply"] == 0.0
    assert alice["total"] == 6.2  # 2.5 of the runner, 0.7 of ptxas, 3.0 of the rank: once each
    assert report["accounted_core_s"] == 6.2


def test_a_role_stays_known_once_the_command_line_reads_empty(tmp_path):
    """An exiting rank's command line reads empty, so a later snapshot calls it "other (python3)":
    the same pid and start time keep "distributed ranks" and its CPU stays in that column. A role
    first read as "other" is replaced once known; a reused pid (another start time) is another."""
    samples = [(99.0, family()),
               (101.0, {**family(), 11: proc(10, 1.0, RUNNER), 12: proc(11, 1.0, RANKS),
                        13: proc(11, 0.1, "other (python3)")}),  # forked, not yet exec'd
               (102.0, {**family(), 11: proc(10, 1.0, RUNNER), 12: proc(11, 1.6, "other (python3)"),
                        13: proc(11, 0.4, COMPILERS)}),
               (103.0, {**family(), 11: proc(10, 1.0, RUNNER), 12: proc(11, 0.2, "other (python3)", start=2000)})]
    ledger = feed(samples)
    assert ledger.procs[(12, START)]["role"] == RANKS
    assert ledger.procs[(13, START)]["role"] == COMPILERS
    assert ledger.procs[(12, 2000)]["role"] == "other (python3)"
    report = account(ledger, write_jsonl(tmp_path / "cpu.jsonl", [profile(**{"student calls": 1.0, "process": 1.0})]),
                     tmp_path / "no-timeline.jsonl", None)
    alice = report["submissions"]["alice"]
    assert alice[RANKS] == 1.6
    assert alice["compiling"] == 0.4  # the compiler, a child of the runner
    assert alice["runners' other children"] == 0.2  # the new process that reused pid 12


def test_a_workers_cpu_goes_to_the_submission_it_was_grading_then(tmp_path):
    """The worker's own CPU, sample by sample, goes to the submission whose test the timeline
    shows it running at that wall time: between two tests to the next one (its setup), after the
    last test to the last. Each worker by its own schedule."""
    timeline = [span("gw0", "alice", 100.0, 105.0), span("gw0", "bob", 106.0, 110.0),
                span("gw1", "carol", 100.0, 120.0)]
    profiles = [profile(), profile(pid=21, submission="carol", worker="gw1", worker_pid=20)]

    def snapshot(worker, other):
        return {**family(worker=worker), 20: proc(1, other, WORKER)}

    samples = [(99.0, snapshot(0.0, 0.0)),
               (103.0, snapshot(1.0, 0.5)),   # +1.0 while alice's test runs
               (105.5, snapshot(1.5, 0.5)),   # +0.5 between tests: bob's, the next
               (108.0, snapshot(3.5, 0.5)),   # +2.0 while bob's runs
               (112.0, snapshot(4.0, 0.5))]   # +0.5 after the last test: bob's, the last
    subs = account_of(tmp_path, samples, profiles, timeline)["submissions"]
    assert subs["alice"]["grader worker"] == 1.0
    assert subs["bob"]["grader worker"] == 3.0
    assert subs["carol"]["grader worker"] == 0.5


def test_processes_outside_the_run_are_apart_and_the_total_is_every_delta_fed(tmp_path):
    """A process with no controller, worker or runner above it (and its child) is "outside the
    run"; the controller's own CPU is the run's but no submission's; and the account's total is
    the sum of every delta the snapshots fed in, the short-lived child's included."""
    samples = [
        (99.0, {**family(10.0, 3.0), 500: proc(0, 50.0, "other (sshd)")}),  # the first sample: baselines
        (101.0, {**family(10.5, 3.0), 11: proc(10, 2.0, RUNNER), 500: proc(0, 51.0, "other (sshd)"),
                 501: proc(500, 0.3, "other (bash)")}),
        (103.0, {**family(11.0, 4.0), 11: proc(10, 3.0, RUNNER, reaped=0.4), 500: proc(0, 51.0, "other (sshd)"),
                 501: proc(500, 0.5, "other (bash)")}),
        (104.0, {**family(11.0, 4.0, worker_reaped=3.4), 500: proc(0, 51.0, "other (sshd)", reaped=0.5)}),
    ]
    fed = {"controller": 1.0, "worker": 1.0, "runner": 3.0, "ptxas": 0.4, "sshd": 1.0, "bash": 0.5}
    report = account_of(tmp_path, samples, [profile(**{"student calls": 3.0, "process": 3.0})],
                        [span("gw0", "alice", 100.0, 105.0)], busy_core_s=7.5)
    assert report["outside_the_run"] == {"other (sshd)": 1.0, "other (bash)": 0.5}
    assert report["everything_else"] == {"grader controller": 1.0}
    alice = report["submissions"]["alice"]
    assert (alice["student calls"], alice["compiling"], alice["grader worker"]) == (3.0, 0.4, 1.0)
    assert report["accounted_core_s"] == pytest.approx(sum(fed.values()))
    assert report["busy_core_s"] == 7.5


def test_a_runner_and_its_rank_exiting_together_count_once(tmp_path):
    """The runner (1.0 s) and its rank (2.0 s), both seen, exit between the same two samples; the
    worker's reaped time grows by 3.0 s, the runner's own and its reaped rank's. Nothing went
    unseen, so the account holds 3.0 s."""
    samples = [(99.0, family()),
               (101.0, {**family(), 11: proc(10, 1.0, RUNNER), 12: proc(11, 2.0, RANKS)}),
               (102.0, family(worker_reaped=3.0))]
    report = account_of(tmp_path, samples, [profile(**{"student calls": 1.0, "process": 1.0})],
                        [span("gw0", "alice", 100.0, 105.0)])
    assert report["accounted_core_s"] == 3.0  # got 5.0: the rank's 2.0 again, as the worker's


def test_a_runner_under_its_launcher_is_split_by_the_launchers_profile(tmp_path):
    """Sandbox mode "userns": the pid the harness knows and logs (11) is the launcher's; it forks
    the PID namespace's init (12), which forks the runner (13), all three of the runner's role.
    The runner's 6.0 s are split by the profile logged under the launcher's pid, none of it
    "unprofiled"; the launcher's and the init's own 0.2 s count too, and nothing twice."""
    samples = [(99.0, family()),
               (101.0, {**family(), 11: proc(10, 0.1, RUNNER), 12: proc(11, 0.1, RUNNER),
                        13: proc(12, 6.0, RUNNER)})]
    cpu = profile(**{"start and imports": 1.0, "student calls": 5.0, "process": 6.0})
    alice = account_of(tmp_path, samples, [cpu], [span("gw0", "alice", 100.0, 102.0)])["submissions"]["alice"]
    assert alice["runner, unprofiled"] == 0.0
    assert alice["student calls"] == pytest.approx(5.0 + 0.2 * 5 / 6, abs=0.05)  # rows are rounded to 0.1
    assert alice["total"] == pytest.approx(6.2)


def test_runs_are_compared_on_the_submissions_every_run_finished():
    """A submission one run did not finish (its limit cut it) is left out: its total there is part
    of its work. The rest side by side, the largest first, with the last run's change."""
    def run(finished, totals):
        return {"finished_s": dict.fromkeys(finished, 1.0),
                "cpu_account": {"submissions": {name: {"total": t} for name, t in totals.items()}}}
    before = run(["alice", "bob", "carol"], {"alice": 100.0, "bob": 300.0, "carol": 50.0})
    after = run(["alice", "bob"], {"alice": 40.0, "bob": 240.0, "carol": 10.0})
    assert compare_accounts([before, after]) == [("bob", [300.0, 240.0], pytest.approx(-0.2)),
                                                 ("alice", [100.0, 40.0], pytest.approx(-0.6))]


def test_torch_compiles_cache_counts_are_summed_over_a_submissions_runners(tmp_path):
    """Each runner's last totals carry its torch.compile cache counts (cpu_profile.cache_counts):
    a submission's are the sum over its runners, and a submission whose runners never imported
    torch.compile has none."""
    samples = [(99.0, family()), (101.0, {**family(), 11: proc(10, 4.0, RUNNER), 12: proc(10, 3.0, RUNNER),
                                          13: proc(10, 1.0, RUNNER)})]
    first = profile(pid=11, process=4.0, compiling=4.0, fxgraph_cache_miss=3, autograd_cache_miss=1)
    second = profile(pid=12, process=3.0, compiling=3.0, fxgraph_cache_hit=2, fxgraph_cache_miss=1,
                     autograd_cache_hit=1)
    other = profile(pid=13, submission="bob", process=1.0)
    subs = account_of(tmp_path, samples, [first, second, other])["submissions"]
    assert subs["alice"]["compile_cache"] == {"fxgraph_cache_hit": 2, "fxgraph_cache_miss": 4,
                                              "autograd_cache_hit": 1, "autograd_cache_miss": 1}
    assert subs["bob"]["compile_cache"] == {}
    assert subs["alice"]["total"] == 7.0  # the counts are not core-seconds


def test_the_runner_reads_torch_compiles_counters_without_importing_them(monkeypatch):
    import sys

    from fa2_sandbox.runner import cpu_profile
    monkeypatch.delitem(sys.modules, "torch._dynamo.utils", raising=False)
    assert cpu_profile.cache_counts() == {}
    assert "torch._dynamo.utils" not in sys.modules

    class Utils:
        counters = {"inductor": {"fxgraph_cache_hit": 2}}
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", Utils)
    assert cpu_profile.cache_counts() == {"fxgraph_cache_hit": 2, "fxgraph_cache_miss": 0,
                                          "autograd_cache_hit": 0, "autograd_cache_miss": 0}
