"""The fake class's pages, built once per module: as staff see them, and as students do."""
import pytest

from reporting import build_reports
from tests.self.reporting.pages import copy_fixtures


@pytest.fixture(scope="module")
def staff(tmp_path_factory):
    reports = copy_fixtures(tmp_path_factory.mktemp("staff") / "reports")
    return reports, build_reports(reports)


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    reports = copy_fixtures(tmp_path_factory.mktemp("student") / "reports")
    build_reports(reports, student_view=True)
    return reports
