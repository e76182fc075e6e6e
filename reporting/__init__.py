"""HTML reports, grades.csv and charts from the grading plugin's reports/<name>/results.json."""
from .build import build_reports, main

__all__ = ["build_reports", "main"]
