"""DELIBERATELY HOSTILE test code: a submission's conftest.py trying to take over the grading
session. The grader never collects it; if it were ever loaded, the session would end at once."""
import pytest


def pytest_configure(config):
    pytest.exit("HOSTILE CONFTEST LOADED: it took over the grading session", returncode=0)


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(pytest.mark.skip(reason="HOSTILE CONFTEST skipped everything"))


@pytest.fixture(autouse=True)
def _skip_all():
    pytest.skip("HOSTILE CONFTEST skipped everything")
