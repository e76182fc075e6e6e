"""pytest's FAILURES section: kept for one submission, left to the reports for a class (controller.py)."""
from types import SimpleNamespace

from grading.controller import ControllerPlugin


def left_to_reports(submissions: int, args=(), tbstyle="auto") -> bool:
    plugin = SimpleNamespace(state=SimpleNamespace(submissions=[object()] * submissions))
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=tuple(args)),
                             option=SimpleNamespace(tbstyle=tbstyle))
    return ControllerPlugin.failures_left_to_reports(plugin, config)


def test_a_class_leaves_its_failures_to_the_reports():
    assert left_to_reports(39)


def test_one_submission_keeps_them_for_the_student():
    assert not left_to_reports(1)


def test_a_traceback_style_given_on_the_command_line_wins():
    assert not left_to_reports(39, args=["--tb=short"])
    assert not left_to_reports(39, args=["--tb", "auto"])
    assert not left_to_reports(39, tbstyle="long")  # from addopts
