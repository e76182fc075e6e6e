"""`pytest --impl PATH` grades under the grader's own pytest settings, whatever PATH ships.

pytest chooses its settings file before the grader's options exist, so it takes the PATH of
`--impl PATH` (two words) for a test path, and a course repo's pyproject.toml (every CS336 repo
has [tool.pytest.ini_options]) became the run's settings, with the repo's conftest.py imported
into the grader. grading/pytest_plugin.py starts such a run again with the grader's own.
"""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_a_repo_with_pytest_settings_of_its_own_and_an_existing_reports_folder(tmp_path):
    repo = tmp_path / "alice"
    shutil.copytree(ROOT / "submissions" / "reference", repo, symlinks=True)
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-s"\ntestpaths = ["tests"]\n')
    (repo / "conftest.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    reports = tmp_path / "reports"
    reports.mkdir()  # an existing folder after --reports was a test path too
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--impl", str(repo), "--reports", str(reports), "-k", "no_such_test"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 5, out  # everything deselected, nothing broken
    assert "[grader] pytest took its settings from" in out and "Starting again with the grader's own" in out
    assert f"rootdir: {ROOT}" in out and "configfile: pyproject.toml" in out
    assert "errors" not in out.split("grades ===")[0]
    assert not (tmp_path / "imported").exists()  # the repo's conftest.py never ran in the grader


def test_workers_of_a_run_whose_reports_folder_is_new_grade(tmp_path):
    """`-n 2 --reports DIR` (two words) with DIR new: the run finds the grader's settings, makes
    DIR, and its workers, parsing the arguments again, took DIR for a test path, found no settings
    and each started again, which killed it (node down, again and again; "no tests ran")."""
    reports = tmp_path / "new-reports"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                           "--impl", "submissions/refer*", "--reports", str(reports), "-k", "test_budget and triton"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert "node down" not in out and "took its settings" not in out, out[-3000:]
    assert proc.returncode == 0 and "1 skipped" in out, out[-3000:]  # the timing check: not graded on a CPU
    assert (reports / "reference" / "results.json").is_file()


def test_the_installed_settings_are_the_checkouts():
    """Installed without its checkout, a grading run uses grading/pytest.ini instead of
    pyproject.toml's [tool.pytest.ini_options]: the same addopts (plus --noconftest, which only a
    run outside the checkout needs: the checkout's conftest.py holds its collection rules) and
    the same warning filters."""
    import configparser
    import shlex

    import tomllib

    checkout = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    ini = configparser.ConfigParser()
    ini.read(ROOT / "grading" / "pytest.ini")
    installed = ini["pytest"]
    assert shlex.split(installed["addopts"]) == shlex.split(checkout["addopts"]) + ["--noconftest"]
    assert [line for line in installed["filterwarnings"].splitlines() if line] == checkout["filterwarnings"]
