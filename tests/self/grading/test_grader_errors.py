"""When the grader fails, or runs only part of a class, no score pretends otherwise.

- A grading test in which the grader's own code raises is run once more; if it raises again the
  check is a "grader_error": unscored (0 / 0, no pass/fail status), and the submission is marked
  incomplete in results.json, on its page, on the class page and in grades.csv.
- info.json has one writer, the controller, and is written whole (no JSONDecodeError however
  many processes write it at once); workers send their facts on the test reports.
- A run with -k keeps the other checks' last results; a run stopped by -x (or Ctrl-C, or a dead
  worker) leaves the submission incomplete ("incomplete: N of M checks graded"), never a total
  that looks final.

The grading runs here grade the reference (or one example) on a handful of CPU checks; a
throwaway plugin (-p) makes the grader's own code raise where a test needs it to.
"""
import csv
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from grading.results import scoring, store
from grading.results.gradescope import status_of
from grading.results.record import CheckRecord, grader_error_diagnosis
from grading.rubric import Rubric
from reporting import build_reports
from tests.self.reporting.pages import table_rows

ROOT = Path(__file__).resolve().parents[3]
FORWARD = "reference::flash_pytorch::forward[fp32-128x128-d64-full]"
BACKWARD = "reference::flash_pytorch::backward[fp32-128x128-d64-full]"
BACKWARD_ID = "grading/checks/test_flash.py::test_backward[reference-pytorch-fp32-128x128-d64-full]"
PYTORCH_COURSE = "pytorch and 128x128 and not replay"  # -k: the PyTorch class's course forward and backward

# Makes the oracle comparison (test_flash.judge) of the tests named by FLAKY_TEST raise
# FLAKY_FAILS times in this process, then behave: a grader bug, flaky or not.
FLAKY_PLUGIN = '''
import os

state = {"calls": 0}


def pytest_collection_finish(session):
    for item in session.items:
        module = getattr(item, "module", None)
        if module is None or not hasattr(module, "judge") or getattr(module.judge, "flaky", False):
            continue
        original = module.judge

        def judge(*args, _original=original, **kwargs):
            if os.environ["FLAKY_TEST"] in os.environ.get("PYTEST_CURRENT_TEST", ""):
                state["calls"] += 1
                if state["calls"] <= int(os.environ["FLAKY_FAILS"]):
                    raise KeyError(f"oracle broke ({state['calls']})")
            return _original(*args, **kwargs)

        judge.flaky = True
        module.judge = judge
'''

# Workers may not write under reports/: any attempt fails the run.
NO_WORKER_WRITES = '''
def pytest_configure(config):
    if hasattr(config, "workerinput"):
        from grading.results import store

        def refuse(path, data):
            raise AssertionError(f"a worker wrote {path}")
        store.write_json = refuse
'''

# Each process holds its own role's state only: the controller's, or the worker's where checks run.
ONE_STATE_EACH = '''
def pytest_sessionstart(session):
    from grading.controller import CONTROLLER_STATE
    from grading.session import WORKER_STATE

    worker, stash = hasattr(session.config, "workerinput"), session.config.stash
    held = (CONTROLLER_STATE in stash, WORKER_STATE in stash)
    assert held == (not worker, worker), f"worker {worker} holds (controller's, worker's) {held}"
'''


def grade(reports: Path, *args, impl="submissions/reference", plugin=None, env=None, timeout=600):
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--impl={impl}",
               f"--reports={reports}", *args]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    if plugin:
        folder = reports.parent / f"{reports.name}-plugin"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "throwaway_plugin.py").write_text(textwrap.dedent(plugin))
        environ["PYTHONPATH"] = os.pathsep.join([str(folder), environ.get("PYTHONPATH", "")])
        command[3:3] = ["-p", "throwaway_plugin"]
    proc = subprocess.run(command, cwd=ROOT, env={**environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    assert "INTERNALERROR" not in proc.stdout + proc.stderr, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc


def load(reports: Path, name="reference") -> dict:
    return json.loads((reports / name / "results.json").read_text())


def by_name(graded: dict) -> dict:
    return {t["name"]: t for t in graded["tests"]}


def full_count(impl="submissions/reference") -> int:
    """How many checks a full run collects for one submission, here (GPU-only cases differ)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co",
                           f"--impl={impl}", "--reports=/nonexistent-never-written"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return sum(1 for line in proc.stdout.splitlines() if line.startswith("grading/") and "::" in line)


# -- grading runs ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broken_then_regraded(tmp_path_factory):
    """Run 1: the oracle raises twice in the forward check (a grader bug), the backward passes.
    Run 2, same reports: `-k` regrades the forward alone, the oracle raising once (flaky)."""
    reports = tmp_path_factory.mktemp("regrade") / "reports"
    first = grade(reports, "-k", PYTORCH_COURSE, plugin=FLAKY_PLUGIN,
                  env={"FLAKY_TEST": "test_forward", "FLAKY_FAILS": "2"})
    after_first = load(reports)
    csv_first = (reports / "grades.csv").read_text()
    class_first = (reports / "index.html").read_text()
    page_first = (reports / "reference" / "index.html").read_text()
    second = grade(reports, "-k", f"{PYTORCH_COURSE} and test_forward", plugin=FLAKY_PLUGIN,
                   env={"FLAKY_TEST": "test_forward", "FLAKY_FAILS": "1"})
    after_second = load(reports)
    third = grade(reports, f"{BACKWARD_ID}")  # one test by its id: pytest collects only that one
    return {"first": first, "after_first": after_first, "csv_first": csv_first, "class_first": class_first,
            "page_first": page_first, "second": second, "after_second": after_second, "third": third,
            "after_third": load(reports), "reports": reports}


def test_grader_error_is_retried_once_then_unscored(broken_then_regraded):
    run = broken_then_regraded
    assert run["first"].returncode == 1, run["first"].stdout[-3000:]  # the grader failed: the run says so
    graded = run["after_first"]
    tests = by_name(graded)
    forward = tests[FORWARD]
    assert forward["outcome"] == "grader_error"
    # Unscored: no status, and its share of the group is withheld (0 of it until regraded), while
    # the maximum stays the rubric's, as on every run.
    assert forward["score"] == 0 and forward["max_score"] > 0
    assert status_of(forward) is None  # neither passed nor failed
    assert forward["diagnosis"].startswith("not graded: the grader itself failed (KeyError:")
    assert "this check will be regraded" in forward["diagnosis"]
    attempts = forward["attempts"]  # both attempts' messages
    assert len(attempts) == 2
    assert "oracle broke (1)" in attempts[0] and "oracle broke (2)" in attempts[1]
    assert "grading/checks/test_flash.py" in attempts[0] or "throwaway_plugin" in attempts[0]
    # The forward's share of the group is withheld, not handed to the backward.
    assert status_of(tests[BACKWARD]) == "passed" and tests[BACKWARD]["max_score"] > 0
    assert graded["score"] == pytest.approx(tests[BACKWARD]["score"], abs=0.005)  # the total in hundredths
    assert graded["max_score"] == pytest.approx(Rubric().total())
    extra = graded["extra_data"]
    assert extra["incomplete"] is True
    assert FORWARD in [u["name"] for u in extra["ungraded"]]
    assert graded["output"].startswith("incomplete: 1 of ")
    assert "not final" in graded["output"]


def test_incomplete_submission_is_red_on_the_class_page_and_in_grades_csv(broken_then_regraded):
    run = broken_then_regraded
    rows = {a["data-name"]: (a, c) for a, c in table_rows(run["class_first"], "class-table")}
    attrs, cells = rows["reference"]
    assert "incomplete" in attrs["class"].split()
    assert cells[-2][1].startswith("Incomplete: 1 of ") and "the grader itself failed on 1" in cells[-2][1]
    assert "not final" in cells[1][1]
    row = next(csv.DictReader(run["csv_first"].splitlines()))
    assert row["state"] == "incomplete" and float(row["total"]) >= 0  # the total a number, its state apart
    assert list(row)[-1] == "notes" and list(row)[:2] == ["name", "student"]
    page = run["page_first"]
    assert '<div class="banner bad" id="incomplete">' in page
    banner = page[page.index('id="incomplete"'):page.index("</div>", page.index('id="incomplete"'))]
    assert f"<code>{FORWARD}</code>" in banner and "grader error" in banner
    assert "oracle broke" in banner


def test_k_regrades_one_check_and_keeps_the_others(broken_then_regraded):
    run = broken_then_regraded
    assert run["second"].returncode == 0, run["second"].stdout[-3000:]
    tests = by_name(run["after_second"])
    forward, backward = tests[FORWARD], tests[BACKWARD]
    # The forward ran again and passed on its retry; the first attempt's error is kept for staff.
    assert status_of(forward) == "passed" and forward["max_score"] > 0
    assert "oracle broke (1)" in forward["retried_after"]
    # The backward did not run in this session: its last result stands, unchanged.
    assert backward == by_name(run["after_first"])[BACKWARD]
    extra = run["after_second"]["extra_data"]
    # Everything else was never graded in these reports: still incomplete, nothing final-looking.
    assert extra["incomplete"] is True and extra["checks_graded"] == 2
    assert extra["checks_expected"] > 2
    assert all(u["name"] is None for u in extra["ungraded"])  # no grader error left
    assert run["after_second"]["output"].startswith(f"incomplete: 2 of {extra['checks_expected']} checks graded")


def test_a_test_named_by_id_regrades_it_and_keeps_the_others(broken_then_regraded):
    """Collected alone, one test says nothing of its module's others: theirs stand, and the
    full run's list (collected.json, from the earlier sessions) still decides what is missing."""
    run = broken_then_regraded
    assert run["third"].returncode == 0, run["third"].stdout[-3000:]
    before, after = by_name(run["after_second"]), by_name(run["after_third"])
    assert after[FORWARD] == before[FORWARD]  # kept
    assert status_of(after[BACKWARD]) == "passed"
    assert set(after) == set(before)
    extra = run["after_third"]["extra_data"]
    assert extra["incomplete"] is True and extra["checks_graded"] == 2
    assert extra["checks_expected"] == run["after_second"]["extra_data"]["checks_expected"]


def test_workers_never_write_reports_and_info_json_gets_their_facts(tmp_path):
    """Under xdist the controller alone writes, and holds the controller's state alone: the workers'
    runner facts reach info.json."""
    reports = tmp_path / "reports"
    proc = grade(reports, "-n", "2", "-k", f"{PYTORCH_COURSE} and test_forward",
                 plugin=NO_WORKER_WRITES + ONE_STATE_EACH)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    info = json.loads((reports / "reference" / "info.json").read_text())
    assert info["seed"] is not None and info["environment"]
    assert info["runner_log_tail"]  # the runner's log, sent by the worker on the test report
    graded = load(reports)
    assert status_of(by_name(graded)[FORWARD]) == "passed"
    # The workers told the controller what a full run holds: the rest count as not graded.
    assert graded["extra_data"]["incomplete"] is True and graded["extra_data"]["checks_graded"] == 1
    assert graded["extra_data"]["checks_expected"] == full_count()


# -- info.json: one writer, written whole ------------------------------------------------------

def _hammer(reports: str, seconds: float, tag: int):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        store.write_info(Path(reports), "alice",
                                {"writer": tag, "n": n, "runner_log_tail": "x" * (20000 + tag)})
        n += 1


def test_info_json_written_by_several_processes_is_always_whole(tmp_path):
    store.write_info(tmp_path, "alice", {"writer": -1})
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_hammer, args=(str(tmp_path), 3.0, i)) for i in range(3)]
    for w in writers:
        w.start()
    reads = 0
    try:
        while any(w.is_alive() for w in writers) or reads == 0:
            text = (tmp_path / "alice" / "info.json").read_text()
            json.loads(text)  # a JSONDecodeError here fails the test
            reads += 1
    finally:
        for w in writers:
            w.join(10)
    assert all(w.exitcode == 0 for w in writers)
    assert reads > 10
    assert not [p.name for p in (tmp_path / "alice").iterdir() if p.name != "info.json"]  # no temp files left


# -- assembling from check records ---------------------------------------------------------------

def record(name, outcome="passed", check_id=None, group="flash_pytorch.forward.course", **extra):
    part, rest = name.split("::")
    check, _, case = rest.partition("[")
    return CheckRecord(submission="alice", part=part, check=check, case=case.rstrip("]"), tier="course",
                       group=group, outcome=outcome, output=outcome, seconds=1.0, check_id=check_id, **extra)


MOD = "grading.checks.test_flash"  # a record names its check by module and test (grading/check.py check_id)


def ids(*cases):
    return {f"{MOD}::test_forward[alice-pytorch-{c}]" for c in cases}


def test_assemble_counts_only_current_records(tmp_path):
    rubric = Rubric()
    write = lambda r: store.write_check(tmp_path, r)
    write(record("flash_pytorch::forward[a]", check_id=f"{MOD}::test_forward[alice-pytorch-a]"))
    write(record("flash_pytorch::forward[b]", check_id=f"{MOD}::test_forward[alice-pytorch-b]"))
    write(record("flash_pytorch::forward[old]", "failed", check_id=f"{MOD}::test_forward[alice-pytorch-old]"))
    write(record("flash_pytorch::forward[legacy]", "failed"))  # an older grader's record: no test id
    write(record("ddp::equivalence[x]", "passed", check_id="grading.checks.test_distributed::test_ddp[alice-x]",
                 group="ddp.equivalence"))
    (tmp_path / "alice" / "checks" / "garbage.json").write_text('{"name": "alice::x", "outc')  # unreadable

    # A session that collected test_flash.py only: the renamed case ("old") and the legacy record
    # do not count; the DDP record, from a module this session did not collect, keeps its result.
    graded = scoring.assemble(tmp_path, "alice", rubric, expected=ids("a", "b"), modules={MOD})
    names = sorted(t["name"] for t in graded["tests"])
    assert names == ["alice::ddp::equivalence[x]", "alice::flash_pytorch::forward[a]",
                     "alice::flash_pytorch::forward[b]"]
    assert graded["extra_data"]["incomplete"] is False
    assert graded["output"] == "All 3 checks passed."
    points = rubric.points("flash_pytorch.forward.course")
    assert by_name(graded)["alice::flash_pytorch::forward[a]"]["max_score"] == pytest.approx(round(points / 2, 4))

    # One more collected case that never ran: incomplete, and the output says so first.
    graded = scoring.assemble(tmp_path, "alice", rubric, expected=ids("a", "b", "c"), modules={MOD})
    assert graded["extra_data"]["incomplete"] is True
    assert graded["output"].startswith("incomplete: 3 of 4 checks graded (1 never run)")
    assert [u["check_id"] for u in graded["extra_data"]["ungraded"]] == sorted(ids("c"))


def test_a_check_file_of_an_earlier_grader_still_counts(tmp_path):
    """An earlier grader wrote a check's id under "nodeid": its check file stays current until regraded."""
    data = record("flash_pytorch::forward[a]", check_id=f"{MOD}::test_forward[alice-pytorch-a]").to_json()
    data["nodeid"] = data.pop("check_id")
    store.write_json(store.check_path(tmp_path, "alice", "alice::flash_pytorch::forward[a]"), data)
    graded = scoring.assemble(tmp_path, "alice", Rubric(), expected=ids("a"), modules={MOD})
    assert [t["name"] for t in graded["tests"]] == ["alice::flash_pytorch::forward[a]"]
    assert graded["extra_data"]["incomplete"] is False
    entry = graded["tests"][0]
    assert entry["check_id"] == f"{MOD}::test_forward[alice-pytorch-a]" and "nodeid" not in entry


def test_partial_credit_never_counts_an_unrun_check_as_earned(tmp_path):
    """A run stopped after 1 of 4 forward checks: that check earns its quarter of the group, not
    the group's whole points, and the maximum stays the rubric's (the unrun three hold theirs)."""
    rubric = Rubric()
    ran = record("flash_pytorch::forward[a]", check_id=f"{MOD}::test_forward[alice-pytorch-a]")
    store.write_check(tmp_path, ran)
    graded = scoring.assemble(tmp_path, "alice", rubric, expected=ids("a", "b", "c", "d"), modules={MOD})
    points = rubric.points("flash_pytorch.forward.course")
    assert graded["score"] == pytest.approx(points / 4, abs=0.005)
    assert graded["max_score"] == pytest.approx(rubric.total())
    assert graded["extra_data"]["incomplete"] is True
    grouped = json.loads((tmp_path / "alice" / "gradescope.json").read_text())
    forward = next(t for t in grouped["tests"] if t["extra_data"]["group"] == "flash_pytorch.forward.course")
    assert forward["score"] == pytest.approx(points / 4, abs=1e-3) and forward["max_score"] == points
    assert "status" not in forward and "never ran" in forward["output"]  # not "passed" with 3 checks to go


def test_a_stopped_run_scores_its_complete_groups_in_full(tmp_path):
    """A run stopped after the PyTorch course checks, before the Triton ones (a time limit): every
    test's group is known from collection, so the PyTorch groups, all of whose checks ran, score
    in full, and only the Triton groups hold their points back. Neither gradescope.json nor the
    pages say that a PyTorch check never ran."""
    rubric = Rubric()
    ids, groups = [], {}
    for slot in ("pytorch", "triton"):
        for phase in ("forward", "backward"):
            for case in ("a", "b"):
                check_id = f"{MOD}::test_{phase}[alice-{slot}-{case}]"
                ids.append(check_id)
                groups[check_id] = f"flash_{slot}.{phase}.course"
                if slot == "pytorch":  # the Triton checks never ran
                    store.write_check(tmp_path, CheckRecord(
                        "alice", f"flash_{slot}", phase, case=case, tier="course", group=groups[check_id],
                        outcome="passed", output="passed", check_id=check_id))
    store.update_collected(tmp_path, "alice", ids, {MOD}, groups)
    graded = scoring.assemble(tmp_path, "alice", rubric)
    full = rubric.points("flash_pytorch.forward.course") + rubric.points("flash_pytorch.backward.course")
    assert graded["score"] == pytest.approx(full) and graded["max_score"] == pytest.approx(rubric.total())
    assert graded["extra_data"]["incomplete"] is True
    assert graded["extra_data"]["never_run_by_group"] == {"flash_triton.backward.course": 2,
                                                          "flash_triton.forward.course": 2}
    grouped = {t["extra_data"]["group"]: t for t in
               json.loads((tmp_path / "alice" / "gradescope.json").read_text())["tests"]}
    for phase in ("forward", "backward"):
        done, waiting = grouped[f"flash_pytorch.{phase}.course"], grouped[f"flash_triton.{phase}.course"]
        assert done["score"] == done["max_score"] == rubric.points(f"flash_pytorch.{phase}.course")
        assert done["status"] == "passed" and "never ran" not in done["output"]
        assert waiting["score"] == 0 and waiting["max_score"] == rubric.points(f"flash_triton.{phase}.course")
        assert "status" not in waiting and "Not graded yet" in waiting["output"]
    build_reports(tmp_path)
    page = (tmp_path / "alice" / "index.html").read_text()
    assert "4 never ran" in page and "alice-pytorch" not in page.split("never ran", 1)[1]
    # One Triton check ran after all: its group says how many of its checks did not.
    store.write_check(tmp_path, CheckRecord("alice", "flash_triton", "forward", case="a", tier="course",
                                            group="flash_triton.forward.course", outcome="passed",
                                            check_id=f"{MOD}::test_forward[alice-triton-a]"))
    scoring.assemble(tmp_path, "alice", rubric)
    grouped = {t["extra_data"]["group"]: t for t in
               json.loads((tmp_path / "alice" / "gradescope.json").read_text())["tests"]}
    half = grouped["flash_triton.forward.course"]
    assert half["score"] == pytest.approx(rubric.points("flash_triton.forward.course") / 2, abs=1e-3)
    assert "1 check of this group never ran" in half["output"] and "status" not in half


def test_assemble_takes_the_newest_record_of_a_test(tmp_path):
    check_id = f"{MOD}::test_forward[alice-pytorch-a]"
    store.write_check(tmp_path, record("flash_pytorch::forward[a]", "failed", check_id=check_id))
    time.sleep(0.01)
    # The same test, renamed check (a stand-in written when the grader failed in a fixture, say)
    store.write_check(tmp_path, record("grader::test_forward[a]", "grader_error", check_id=check_id, group="",
                                         stand_in=True, diagnosis="not graded: the grader itself failed (x)"))
    graded = scoring.assemble(tmp_path, "alice", Rubric(), expected={check_id}, modules={MOD})
    assert [t["name"] for t in graded["tests"]] == ["alice::grader::test_forward[a]"]
    assert "grader" not in graded["extra_data"]["parts"]  # a stand-in makes no part of its own
    assert graded["extra_data"]["incomplete"] is True and graded["score"] == 0
    assert graded["max_score"] == pytest.approx(Rubric().total())  # the rubric's, whatever ran


def test_grader_error_withholds_its_share_and_nothing_else(tmp_path):
    rubric = Rubric()
    good = record("flash_pytorch::forward[a]", check_id="a")
    broken = record("flash_pytorch::forward[b]", "grader_error", check_id="b",
                    diagnosis=grader_error_diagnosis(["KeyError: 'o' at x.py:1", "KeyError: 'o' at x.py:1"]),
                    attempts=["KeyError: 'o' at x.py:1"] * 2)
    for r in (good, broken):
        store.write_check(tmp_path, r)
    graded = scoring.assemble(tmp_path, "alice", rubric, expected={"a", "b"}, modules={MOD})
    share = round(rubric.points("flash_pytorch.forward.course") / 2, 4)
    tests = by_name(graded)
    assert tests["alice::flash_pytorch::forward[a]"]["max_score"] == pytest.approx(share)
    # b's share stays in the maximum, unscored until regraded; a does not absorb it
    withheld = tests["alice::flash_pytorch::forward[b]"]
    assert withheld["max_score"] == pytest.approx(share) and withheld["score"] == 0 and status_of(withheld) is None
    assert "on both attempts" in withheld["diagnosis"]
    assert graded["score"] == pytest.approx(share, abs=0.005) and graded["max_score"] == pytest.approx(rubric.total())
    assert graded["output"].startswith("incomplete: 1 of 2 checks graded (1 not graded because the grader itself "
                                       "failed)")
    # The pages: the check is listed as not graded, not among the failures; the student view
    # lists a visible one too, but never a test id of a check it does not show.
    build_reports(tmp_path)
    page = (tmp_path / "alice" / "index.html").read_text()
    assert "<strong>Incomplete:</strong> 1 of 2 checks graded" in page and "1 not graded" in page
    assert "Failed checks (0)" in page


def test_student_view_hides_test_ids_of_checks_never_run(tmp_path):
    store.write_check(tmp_path, record("flash_pytorch::forward[a]", check_id="a"))
    scoring.assemble(tmp_path, "alice", Rubric(), expected={"a", "secret-hidden-case"}, modules={MOD})
    build_reports(tmp_path, student_view=True)
    page = (tmp_path / "alice" / "index.html").read_text()
    assert "secret-hidden-case" not in page
    assert "1 check not graded yet: the total is not final." in page


def test_collected_json_remembers_what_a_full_run_holds(tmp_path):
    flash, ddp = "grading.checks.test_flash", "grading.checks.test_distributed"
    store.update_collected(tmp_path, "alice", [f"{flash}::t[a]", f"{flash}::t[b]", f"{ddp}::d[x]"],
                                  {flash, ddp})
    # A later session names one flash test by its id: it adds, it does not shrink the module.
    store.update_collected(tmp_path, "alice", [f"{flash}::t[new]"], set())
    expected, whole = store.load_collected(tmp_path, "alice")
    assert expected == {f"{flash}::t[a]", f"{flash}::t[b]", f"{flash}::t[new]", f"{ddp}::d[x]"}
    assert whole == {flash, ddp}
    # The whole module collected again, a case renamed: the old one is gone.
    store.update_collected(tmp_path, "alice", [f"{flash}::t[a]", f"{flash}::t[b2]"], {flash})
    expected, _ = store.load_collected(tmp_path, "alice")
    assert expected == {f"{flash}::t[a]", f"{flash}::t[b2]", f"{ddp}::d[x]"}
    assert store.load_collected(tmp_path, "nobody") == (None, None)


# -- progress ------------------------------------------------------------------------------------

def test_progress_counts_each_submission_by_its_exact_name():
    """s1's pending checks are s1's alone: a test id of s10 contains "[s1" too. The controller
    counts by the submission of each id's identity (the workers send them), none for another test."""
    from grading.check import CheckIdentity
    from grading.controller import ControllerPlugin
    from grading.tracks import Track
    plugin = ControllerPlugin.__new__(ControllerPlugin)  # its state only, no pytest config
    plugin.state = SimpleNamespace(submissions=[SimpleNamespace(name="s1"), SimpleNamespace(name="s10")])
    graded = {f"{MOD}::test_forward[s1-pytorch-a]@s1": ("s1", ""),
              f"{MOD}::test_forward[s10-pytorch-a]@s10": ("s10", ""),
              f"{MOD}::test_backward[s10-pytorch-a]@s10": ("s10", ""),
              f"{MOD}::test_forward[s1-triton-b]@s1/triton-bf16-full-d64": ("s1", "triton-bf16-full-d64")}
    plugin.identities = {i: CheckIdentity(check_id=i, submission=name, track=Track(track), case="a")
                         for i, (name, track) in graded.items()}
    ids = [*graded, "tests/self/reference/test_oracle.py::test_x"]
    plugin.set_pending(plugin.submission_of_id(i) for i in ids)
    assert plugin.pending == {"s1": 2, "s10": 2}
