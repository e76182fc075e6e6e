"""The grader installed from its wheel grades from any folder, without the checkout's code.

The wheel is built once (`pip wheel`), installed into a venv that sees this Python's packages (so
torch is not installed again) and run with `python -P` from an empty folder, so that neither the
checkout nor its editable install is imported: the engine, its checks, the rubric, the pytest
settings and the templates all come from the wheel. Where this Python has the checkout installed
editable too, both register the same pytest11 entry point name and pluggy loads the first, the
venv's.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from grading.results.gradescope import status_of

ROOT = Path(__file__).resolve().parents[3]
# What a grading run reads besides Python modules, and the reference submission the timing check runs.
SHIPPED = ["grading/rubric.yaml", "grading/pytest.ini", "reporting/templates/class.html.j2",
           "reporting/templates/sort.js", "reference/oracle.py", "submissions/reference/tests/adapters.py",
           "submissions/reference/cs336_systems/flash_pytorch.py", "grading/checks/test_flash.py"]
FAST = "pytorch and 128x128"  # the PyTorch class's course forward, backward and replay: seconds


# Not copied for the build: output, caches, and what an earlier build left (setuptools' build/lib
# keeps a module deleted since, which would ship).
LEFT_OUT = {".git", "reports", "build", "corpus", ".speed", ".whl", ".pytest_cache", "__pycache__"}


def source_copy(to: Path) -> Path:
    # A virtual environment inside the checkout (a newcomer's `python -m venv .venv`, torch and all)
    # is no source of the wheel, and copying it cost more than building the wheel.
    def ignore(folder, names):
        return [n for n in names if n in LEFT_OUT or n.endswith(".egg-info") or Path(folder, n, "pyvenv.cfg").is_file()]
    shutil.copytree(ROOT, to, symlinks=True, ignore=ignore)
    return to


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = source_copy(tmp_path_factory.mktemp("source") / "fa2-grader")
    try:  # this Python's setuptools when it can build the project: no download
        import setuptools
        isolation = [] if int(setuptools.__version__.split(".")[0]) < 64 else ["--no-build-isolation"]
    except ImportError:
        isolation = []
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, str(source),
                           "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = out.glob("fa2_grader-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """The venv's python, with the wheel installed, and the packages of the Python running these
    tests (torch, pytest, ...) importable in it: `system_site_packages` gives a venv its *base*
    interpreter's packages, which, when these tests run in a venv of their own (a newcomer's
    `python -m venv .venv`), lack torch, and the installed grader failed with "No module named
    'torch'" (issue 35). So the running Python's site-packages are named in a .pth file, as plain
    folders: their own .pth files are not read, so a checkout's editable install of the grader
    does not follow (the wheel is what is tested)."""
    env = tmp_path_factory.mktemp("venv") / "env"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env)
    python = env / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    Path(site, "outer-python.pth").write_text("".join(f"{folder}\n" for folder in ours))
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return python


def test_the_wheel_holds_what_grading_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [name for name in SHIPPED if name not in names], sorted(names)
    assert not [name for name in names if name.startswith("tests/")]  # the project's own tests stay out


def checkout_count() -> int:
    """How many checks the checkout collects for the reference submission (GPU-only cases differ by machine)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co",
                           "--impl=submissions/reference", "--reports=/nonexistent-never-written"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    return sum(1 for line in proc.stdout.splitlines() if line.startswith("grading/checks/") and "::" in line)


def test_the_installed_grader_grades_from_an_empty_folder(installed, tmp_path):
    folder = tmp_path / "class"
    folder.mkdir()
    # --impl=PATH in one word: pytest looks for settings from the folder it runs in, not from the
    # submission, whose checkout's pyproject.toml would put the checkout's code on sys.path.
    proc = subprocess.run([str(installed), "-P", "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"--impl={ROOT / 'submissions' / 'reference'}", "-k", FAST],
                          cwd=folder, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    site = Path(subprocess.run([str(installed), "-P", "-c", "import grading; print(grading.__path__[0])"],
                               capture_output=True, text=True, cwd=folder, check=True).stdout.strip())
    assert site.parent != ROOT and site.is_relative_to(installed.parent.parent)
    # The wheel's engine, settings and rubric graded, from this folder.
    assert f"rubric: {site / 'rubric.yaml'}" in out, out[-5000:]
    assert f"rootdir: {folder}" in out and "pytest.ini" in re.search(r"configfile: (\S+)", out)[1]
    collected, selected = map(int, re.search(r"collected (\d+) items / \d+ deselected / (\d+) selected", out).groups())
    assert collected == checkout_count() and selected == 3
    results = json.loads((folder / "reports" / "reference" / "results.json").read_text())
    passed = [t["name"] for t in results["tests"] if status_of(t) == "passed"]
    assert len(passed) == 3 and all("[fp32-128x128-d64-full]" in name for name in passed), results["output"]
    assert (folder / "reports" / "index.html").is_file() and (folder / "reports" / "grades.csv").is_file()


def test_grading_that_collects_no_check_stops_and_writes_nothing(installed, tmp_path):
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    proc = subprocess.run([str(installed), "-P", "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"--impl={ROOT / 'submissions' / 'reference'}", "test_other.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4, out[-3000:]
    assert "grading collects no check: none of the paths given (test_other.py) holds the grader's checks" in out
    reports = tmp_path / "reports"  # its secret seed may be drawn already; no page, no result
    assert not [path for path in reports.rglob("*") if path.name != ".seed"]


# A submission whose PyTorch slot looks for the installed grader's packages and reports what it found.
SNOOPING_ADAPTERS = """
import json, os


def attempt(name, fn):
    try:
        return fn()
    except Exception as exc:
        return type(exc).__name__


def get_flashattention_autograd_function_pytorch():
    site = {site!r}
    out = {{
        "import oracle": attempt("", lambda: __import__("reference.oracle") and "allowed"),
        "import grading": attempt("", lambda: __import__("grading.rubric") and "allowed"),
        "import harness": attempt("", lambda: __import__("fa2_sandbox.harness.confinement") and "allowed"),
        "read rubric": attempt("", lambda: open(os.path.join(site, "grading", "rubric.yaml")).read() and "allowed"),
        "list reference": attempt("", lambda: os.listdir(os.path.join(site, "reference"))),
        "list submissions": attempt("", lambda: os.listdir(os.path.join(site, "submissions"))),
        "list fa2_sandbox": attempt("", lambda: os.listdir(os.path.join(site, "fa2_sandbox"))),
        "read wheel metadata": attempt("", lambda: open(os.path.join(site, {metadata!r})).read() and "allowed"),
    }}
    raise RuntimeError("REPORT " + json.dumps(out))
"""
# Run by the venv's python: one runner of the installed harness, confined as this machine allows.
GRADE_ONE_CALL = """
import json, sys, tempfile
from pathlib import Path
from fa2_sandbox.harness import confinement
from fa2_sandbox.harness.client import SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.wire.cases import FlashCase
from fa2_sandbox.wire.requests import Flash

isolation = confinement.isolation(tempfile.gettempdir())
if isolation["mode"] not in ("namespace", "userns"):
    print(json.dumps(isolation))
    sys.exit(0)
runner = SubmissionRunner(load_submission(Path(sys.argv[1])), import_timeout=60)
case = FlashCase(batch=(1,), n_queries=16, n_keys=16, head_dim=16)
try:
    reply = runner.call(Flash("pytorch", case, seed=1), 60)
finally:
    runner.close()
print(json.dumps({**isolation, "status": reply.status, "message": reply.message}))
"""


@pytest.mark.parametrize("sandbox_mode", ["default", "userns"])
def test_a_runner_of_the_installed_grader_cannot_reach_its_packages(installed, tmp_path, sandbox_mode):
    """The wheel puts the reference solutions, the oracle and the rubric in site-packages, which the
    runner's root holds (it is the Python install): in a namespace they are empty folders there."""
    site = Path(subprocess.run([str(installed), "-P", "-c", "import grading; print(grading.__path__[0])"],
                               capture_output=True, text=True, cwd=tmp_path, check=True).stdout.strip()).parent
    (metadata,) = site.glob("fa2_grader-*.dist-info/METADATA")
    submission = tmp_path / "mallory"
    (submission / "tests").mkdir(parents=True)
    (submission / "tests" / "adapters.py").write_text(textwrap.dedent(SNOOPING_ADAPTERS).format(
        site=str(site), metadata=str(metadata.relative_to(site))))
    env = {k: v for k, v in os.environ.items() if k != "GRADER_SANDBOX"}
    if sandbox_mode == "userns":
        env["GRADER_SANDBOX"] = "userns"
    proc = subprocess.run([str(installed), "-P", "-c", GRADE_ONE_CALL, str(submission)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    if "status" not in found:
        pytest.skip(f"no namespace for the runner here ({found['mode']}): {found['note']}")
    assert found["mode"] == ("userns" if sandbox_mode == "userns" else "namespace"), found
    assert found["status"] == "error" and "REPORT " in found["message"], found
    out = json.loads(found["message"].split("REPORT ", 1)[1].splitlines()[0])
    assert out["read wheel metadata"] == "allowed", out  # site-packages is there: only the grader's folders are empty
    assert out["import oracle"] == out["import grading"] == out["import harness"] == "ModuleNotFoundError", out
    assert out["read rubric"] == "FileNotFoundError", out
    assert out["list reference"] == out["list submissions"] == out["list fa2_sandbox"] == [], out
