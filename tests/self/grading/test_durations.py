"""The time summary every grading run ends with (grading/durations.py)."""
from grading.durations import Durations


def test_setup_and_teardown_count_for_the_check_they_belong_to():
    durations = Durations()
    record = {"part": "flash_triton", "check": "forward", "tier": "handout"}
    durations.add("alice", "t[a]", 2.0, None)  # setup: the kind is not known yet
    durations.add("alice", "t[a]", 5.0, record)  # the call, with its record
    durations.add("alice", "t[a]", 1.0, None)  # teardown
    durations.add("bob", "t[b]", 0.5, {"part": "ddp", "check": "equivalence", "tier": "default"})
    durations.add("bob", "t[crashed]", 0.25, None)  # a test that never recorded a check
    lines = durations.lines()
    assert lines[1].split() == ["8.0", "s", "1", "check", "flash_triton::forward[handout]"]
    assert any(line.split()[-1] == "ddp::equivalence" for line in lines)
    assert any("(tests without a check record)" in line for line in lines)
    assert lines[lines.index("time by submission (the 2 slowest of 2):") + 1].split() == ["8.0", "s", "alice"]


def test_the_wall_clock_is_split_at_the_marks_that_were_set():
    durations = Durations()
    start = durations.marks["started"]
    durations.marks.update({"first result": start + 12, "last result": start + 385, "scoring": start + 440,
                            "reports written": start + 445})
    line = durations.wall_clock()
    assert line.split(": ", 1)[1] == ("12 s until the first result, 373 s of checks, 55 s until scoring began, "
                                      "5 s scoring and writing reports")
    assert Durations().wall_clock().startswith("wall clock 0 s")


def test_the_timing_windows_are_summed_and_the_longest_named():
    durations = Durations()
    for nodeid, held in (("t[a]", 1.25), ("t[b]", 2.5)):
        durations.add("alice", nodeid, 9.0, {"part": "timing", "check": "flash_triton", "tier": "timing",
                                             "timing": {"window": {"held_s": held}}})
    durations.add("alice", "t[c]", 1.0, {"part": "timing", "check": "flash_pytorch", "tier": "timing"})  # not measured
    assert "timing windows: 2, the longest paused the other runners 2.5 s, all together 3.8 s" in durations.lines()
