"""HTML reports, grades.csv and charts from the grading plugin's reports/<name>/results.json.

build_reports is the one entry point the engine calls (grading/controller.py at the end of a run,
grading/slurm.py after a Slurm class): the pages read the results layer (grading/results), and
the engine knows nothing else of them (tests/self/grading/test_layers.py)."""
from .build import build_reports, main

__all__ = ["build_reports", "main"]
