"""bench/session_priority.py: the probe's rounds with nothing raised, its threads, its session, both."""
import os

import pytest

from bench.session_priority import main


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/proc/self/autogroup"),
                    reason="needs root and autogroups")
def test_the_tool_prints_the_four_ways(capsys):
    assert main(["--busy", "1", "--rounds", "5"]) == 0
    out = capsys.readouterr().out
    assert "1 busy sessions" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "ms" not in line]
    assert [row.split(" | ")[0] for row in rows] == ["| nothing", "| threads at nice -10", "| session at nice -10",
                                                     "| both"]
    assert all(float(cell) >= 2.0 for row in rows for cell in row.strip("| ").split(" | ")[1:])  # the 2 ms sleep
