"""bench/timing_stability.py: which side's reading moves a budget's ratio between two runs, and
what the reference's own record says held a slow stretch."""
import json

from bench.timing_stability import cause, choices_said, load, main, pair_line, ratio_run_median, ratio_window


def run(folder, label, reference_by_submission, student=10.0, own=None):
    """A speed.json whose every window timed the student at `student` ms and the reference as given;
    each submission's window is the first of a worker of its own."""
    timing, workers = {}, {}
    for i, (submission, reference) in enumerate(reference_by_submission.items()):
        timing[f"{submission}::flash_triton"] = {
            "student_stretches_ms": [student, student * 1.01], "reference_stretches_ms": reference,
            "stopped_after_s": None}
        if own and submission in own:
            timing[f"{submission}::flash_triton"]["reference_own_stretches"] = own[submission]
        workers[f"gw{i}"] = {"groups": {f"{submission}/timing-triton": [0.0, 1.0, 1.0]}}
    folder.mkdir()
    (folder / "speed.json").write_text(json.dumps({"label": label, "timing": timing, "workers": workers}))
    return folder


def test_a_window_whose_reference_read_slow_moves_the_grader_s_ratio_not_the_run_median_s(tmp_path):
    steady = {f"s{i}": [1.6, 1.56, 1.58, 1.57] for i in range(5)}
    disturbed = {**steady, "s0": [2.1, 2.0, 2.05, 2.02]}  # that window's reference read 28% slow
    a = load(run(tmp_path / "a", "a", steady), "triton")
    b = load(run(tmp_path / "b", "b", disturbed), "triton")
    count, within, worst = pair_line(a, b, ratio_window)
    assert (count, within) == (5, 4) and worst > 0.2
    assert pair_line(a, b, ratio_run_median)[1:] == (5, 0.0)
    assert all(a["first"].values())


def test_the_reference_s_own_record_names_what_held_a_stretch():
    assert cause(2.0, {"own_ms": 1.57, "enqueue_ms": 0.3, "cpu_ms": 0.3, "gpu_ms": 1.5}) == "the messages' way"
    assert cause(2.0, {"own_ms": 2.0, "enqueue_ms": 1.9, "cpu_ms": 0.6, "gpu_ms": 1.9}) == "a thread waiting for a core"
    assert cause(2.0, {"own_ms": 2.0, "enqueue_ms": 1.9, "cpu_ms": 1.8, "gpu_ms": 1.9}) == "launches bound by the CPU"
    assert cause(2.0, {"own_ms": 2.0, "enqueue_ms": 0.3, "cpu_ms": 0.3, "gpu_ms": 1.98}) == "the GPU"


def test_the_tool_prints_pairs_first_windows_and_causes(tmp_path, capsys):
    steady = {f"s{i}": [1.6, 1.56, 1.58, 1.57] for i in range(5)}
    own = {"s0": [{"passes": 12, "own_ms": 2.0, "enqueue_ms": 0.3, "cpu_ms": 0.3, "gpu_ms": 1.98}] * 4}
    a = run(tmp_path / "a", "a", steady)
    b = run(tmp_path / "b", "b", {**steady, "s0": [2.1, 2.0, 2.05, 2.02]}, own=own)
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| a / b | 5 | 4 within 5%" in out
    assert "first windows of a worker's kept reference: 10 windows" in out and "1.28 (b s0)" in out
    assert "s0 stretch 1: 2.10 ms outside" in out and "-> the GPU" in out


def test_a_student_whose_own_reading_moved_is_shown_with_what_its_autotuners_chose():
    chose = [{"kernel": "fwd", "config": "BLOCK: 64"}, {"kernel": "bwd", "config": "BLOCK: 32"}]
    other = [{"kernel": "fwd", "config": "BLOCK: 32"}, {"kernel": "bwd", "config": "BLOCK: 32"}]
    assert choices_said([chose, list(chose)]) == "chose the same configs"
    assert choices_said([chose, other]) == "chose other configs: fwd BLOCK: 64 / BLOCK: 32"
    assert choices_said([chose, None]) == "no record of its choices"


def test_the_tool_names_the_moved_submissions(tmp_path, capsys):
    steady = {f"s{i}": [1.6, 1.56, 1.58, 1.57] for i in range(2)}
    a, b = run(tmp_path / "a", "a", steady, student=2.0), run(tmp_path / "b", "b", steady, student=2.3)
    assert main([str(a), str(b)]) == 0
    assert "a / b: the student's fastest stretch moved over 5%:\n    s0: +15.0%, no record of its choices" in \
        capsys.readouterr().out
