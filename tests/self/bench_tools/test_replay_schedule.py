"""bench/replay_schedule.py: a class run's recorded checks, replayed through the scheduler."""
import json

from bench.replay_schedule import recorded_groups, replay, timed_out

FLASH = "grading/checks/test_flash.py::test_forward"


def rows(group, seconds, start):
    submission = group.split("/")[0]
    return [{"worker": "gw0", "when": "call", "test": f"{FLASH}[{submission}-case{k}]@{group}",
             "start": start + sum(seconds[:k]), "stop": start + sum(seconds[:k + 1]), "outcome": "passed"}
            for k in range(len(seconds))]


def test_a_replay_keeps_each_checks_time_and_fills_in_the_unrecorded(tmp_path):
    timeline = rows("a/pytorch", [10.0, 10.0], 0.0) + rows("b/pytorch", [4.0], 0.0) \
        + rows("c/triton-fp32-full", [5.0, 5.0], 0.0)
    main = [{**row, "worker": "main"} for row in timeline]  # the controller's copies: left out
    (tmp_path / "timeline.json").write_text("\n".join(json.dumps(r) for r in timeline + main))
    groups, seconds = recorded_groups(tmp_path)
    assert len(groups["a/pytorch"]) == len(groups["b/pytorch"]) == 2  # b's second check, unrecorded: at b's mean
    assert sum(seconds[n] for n in groups["b/pytorch"]) == 8.0
    end, steals, _ = replay(groups, seconds, ("triton", "pytorch"), workers=2)
    assert end == 20.0 and steals == 0  # gw0: c (10 s) then b (8 s); gw1: a (20 s)


def test_a_timed_out_submissions_unrecorded_triton_checks_wait_out_one_timeout_per_group(tmp_path):
    """A check still running at the stop may have been waiting out a timeout: its group's mean is
    then far too short. With --timed-out, each Triton group of that submission gets one check of the
    timeout, and its later unrecorded checks none (its runner fails every larger case at once)."""
    timeline = rows("a/triton-fp32-full", [5.0, 5.0, 5.0], 0.0) + rows("b/triton-fp32-full", [5.0], 0.0) \
        + rows("b/pytorch", [2.0], 0.0) + rows("a/pytorch", [2.0, 2.0], 0.0)
    (tmp_path / "timeline.json").write_text("\n".join(json.dumps(r) for r in timeline))
    groups, seconds = recorded_groups(tmp_path)
    timed_out(groups, seconds, "b", 300.0)
    assert [seconds[n] for n in groups["b/triton-fp32-full"]] == [5.0, 300.0, 0.0]
    assert [seconds[n] for n in groups["b/pytorch"]] == [2.0, 2.0]  # not a Triton group: its mean


def test_a_replayed_triton_check_that_runs_long_promotes_its_submission_on_the_replays_clock(tmp_path):
    """The scheduler reads the replay's clock: a's first Triton check runs 100 s on gw0, and at 60 s
    (PROMOTE_S), when gw1 ends a check of b, a's queued Triton track moves to the head of the queue, as
    the run's scheduler moved it."""
    triton = [{"worker": "gw0", "when": "call", "start": start, "stop": start + took, "outcome": "passed",
               "test": f"{FLASH}[a-triton-fp32-{case}-d64-full]@a/triton-fp32-full"}
              for start, took, case in ((0.0, 100.0, "17x17"), (100.0, 5.0, "1x239"), (105.0, 5.0, "128x128"))]
    triton += rows("a/triton-bf16-full", [5.0], 110.0)
    timeline = rows("b/pytorch", [30.0, 30.0, 30.0], 0.0) + triton + rows("c/pytorch", [30.0, 30.0], 0.0)
    (tmp_path / "timeline.json").write_text("\n".join(json.dumps(r) for r in timeline))
    groups, seconds = recorded_groups(tmp_path)
    _, _, promotions = replay(groups, seconds, ("triton-fp32", "pytorch", "triton-bf16"), workers=2)
    assert promotions == ["a: 1 Triton track(s) moved to the head of the queue, since "
                          "test_forward[a-triton-fp32-17x17-d64-full] had run 60 s"]
