"""A course repo imports in the grader as it does under `uv run` in its own folder
(fa2_sandbox/wire/course_env.py): its path dependencies inside the repo join sys.path with metadata,
the runner's DDP ranks get them too, paths leaving the repo are refused with a note, and
declared packages this Python lacks are named in one finding that says how to fix it.

The repos are written here into tmp_path, shaped like the course's (tests/adapters.py importing
cs336_basics at its top, cs336_systems calling importlib.metadata.version with no fallback, a
cs336-basics/ folder with its own pyproject.toml), and run through the real runner on the CPU.
"""
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from fa2_sandbox.harness.client import SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.wire import course_env
from fa2_sandbox.wire.requests import Distributed
from grading.check import Check

ROOT_PYPROJECT = '''
[project]
name = "cs336-systems"
version = "1.0.0"
dependencies = ["cs336-basics", "torch", "pytest>=8"{extra}]

[tool.uv.sources]
cs336-basics = {{ path = "{basics}", editable = true }}
'''

BASICS_PYPROJECT = '''
[project]
name = "cs336_basics"
version = "1.0.0"
dependencies = ["torch~=2.11.0", "numpy>=2; sys_platform == 'never'"{extra}]

[tool.uv.build-backend]
module-name = "cs336_basics"
module-root = "{module_root}"
'''

ADAPTERS = '''
from cs336_basics.model import scale
import cs336_systems


def get_flashattention_autograd_function_pytorch():
    return scale


def get_ddp(module):
    from cs336_basics.ddp import wrap  # imported lazily, in the spawned rank
    return wrap(module)


def ddp_on_after_backward(model, optimizer):
    from cs336_basics.ddp import sync
    sync(model)
'''

DDP = '''
import torch.distributed as dist


def wrap(module):
    for p in module.parameters():
        dist.broadcast(p.data, src=0)
    return module


def sync(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
'''


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def course_repo(root: Path, basics: str = "./cs336-basics", ship_basics: bool = True, namespace: bool = False,
                src_layout: bool = False, extra_root: str = "", extra_basics: str = "",
                adapters: str = ADAPTERS) -> Path:
    """A repo shaped like the course's assignment 2, with the student's cs336-basics/ inside."""
    write(root / "pyproject.toml", ROOT_PYPROJECT.format(basics=basics, extra=extra_root))
    write(root / "cs336_systems" / "__init__.py",
          'import importlib.metadata\n\n__version__ = importlib.metadata.version("cs336-systems")\n')
    write(root / "tests" / "__init__.py", "")
    write(root / "tests" / "adapters.py", adapters)
    if ship_basics:
        folder = root / "cs336-basics"
        write(folder / "pyproject.toml", BASICS_PYPROJECT.format(module_root="src" if src_layout else "",
                                                                extra=extra_basics))
        package = folder / ("src" if src_layout else "") / "cs336_basics"
        if not namespace:  # the course's: no fallback, so the metadata must be there
            write(package / "__init__.py", 'import importlib.metadata\n\n'
                                           '__version__ = importlib.metadata.version("cs336_basics")\n')
        write(package / "model.py", "def scale(x):\n    return 2 * x\n")
        write(package / "ddp.py", DDP)
    return root


def start(root: Path):
    runner = SubmissionRunner(load_submission(root), import_timeout=120)
    try:
        return runner, runner.start()
    except BaseException:
        runner.close()
        raise


# -- the pure functions -----------------------------------------------------------------------

def test_path_dependency_inside_the_repo(tmp_path):
    root = course_repo(tmp_path / "repo")
    env = course_env.read(root)
    assert env.paths == [str((root / "cs336-basics").resolve())]
    assert env.distributions == ["cs336_basics"]
    assert env.refused == []
    # the repo's own package and its path dependency are not requirements; a marker for another
    # platform drops numpy; torch and pytest are installed here
    assert set(env.requirements) == {"torch", "pytest"}
    assert env.requirements["torch"] == ["pyproject.toml", "cs336-basics/pyproject.toml"]
    assert course_env.missing(env) == {}
    assert course_env.notes(root) == []


def test_src_layout(tmp_path):
    root = course_repo(tmp_path / "repo", src_layout=True)
    assert course_env.read(root).paths == [str((root / "cs336-basics" / "src").resolve())]


def test_shipped_cs336_basics_is_used_without_a_uv_source(tmp_path):
    root = course_repo(tmp_path / "repo")
    (root / "pyproject.toml").write_text('[project]\nname = "cs336-systems"\ndependencies = []\n')
    env = course_env.read(root)
    assert env.paths == [str((root / "cs336-basics").resolve())] and env.refused == []


@pytest.mark.parametrize("where", ["../cs336-assignment1", "/opt/cs336-basics", "./link-out"])
def test_source_outside_the_repo_is_refused(tmp_path, where):
    outside = tmp_path / "cs336-assignment1"
    (outside / "cs336_basics").mkdir(parents=True)
    root = course_repo(tmp_path / "repo", basics=where)
    (root / "link-out").symlink_to(outside)
    env = course_env.read(root)
    assert env.paths == [str((root / "cs336-basics").resolve())]  # the repo's own folder instead
    assert env.refused == [f"pyproject.toml's [tool.uv.sources] points cs336-basics at {where}, outside the "
                           f"submission; the grader used the repo's own cs336-basics/ folder instead."]
    assert course_env.notes(root) == env.refused


def test_source_outside_with_no_folder_of_its_own(tmp_path):
    root = course_repo(tmp_path / "repo", basics="../cs336-assignment1", ship_basics=False)
    env = course_env.read(root)
    assert env.paths == []
    assert env.refused == ["pyproject.toml's [tool.uv.sources] points cs336-basics at ../cs336-assignment1, "
                           "outside the submission; the grader could not import it and the submission has no "
                           "cs336-basics/ folder of its own. Put it in the submission (as cs336-basics/) and "
                           "grade again."]


def test_source_to_a_missing_folder(tmp_path):
    root = course_repo(tmp_path / "repo", basics="./assignment1")
    env = course_env.read(root)
    assert env.paths == [str((root / "cs336-basics").resolve())]
    assert env.refused == ["pyproject.toml's [tool.uv.sources] points cs336-basics at ./assignment1, which is not "
                           "a folder in the submission; the grader used the repo's own cs336-basics/ folder instead."]


MISSING_BASICS = ("cs336_basics is the path dependency cs336-basics, which pyproject.toml's [tool.uv.sources] finds "
                  "at ./cs336-basics, and the submission lacks it there: add the cs336-basics/ folder (with its files) "
                  "to the submission and grade again.")


def test_a_path_dependency_left_an_empty_submodule_names_the_folder_to_add(tmp_path):
    """The course's cs336-basics/ is often a git submodule: not checked out, its folder is there and
    empty, and every check that imports it fails with "No module named 'cs336_basics'"."""
    root = course_repo(tmp_path / "repo", ship_basics=False)
    (root / "cs336-basics").mkdir()
    env = course_env.read(root)
    assert env.paths == [] and env.distributions == []
    assert env.refused == ["pyproject.toml's [tool.uv.sources] points cs336-basics at ./cs336-basics, a folder that is "
                           "empty in the submission (a git submodule not checked out, say), so the grader could not "
                           "import it. Add the cs336-basics/ folder's files to the submission (`git submodule update "
                           "--init`, or copy them in) and grade again."]
    assert load_submission(root).notes == env.refused  # the page's first lines (test_report_sources)
    assert course_env.missing_path_dependency(root, "cs336_basics.model") == MISSING_BASICS
    # A check failing with the import error ends with the folder to add (grading/check.py), once.
    diagnosis = "rank 0 raised ModuleNotFoundError: No module named 'cs336_basics' (in get_fsdp)."
    check = SimpleNamespace(root=root)
    assert Check.missing_folder(check, diagnosis) == f"{diagnosis} {MISSING_BASICS}"
    assert Check.missing_folder(check, f"{diagnosis} {MISSING_BASICS}") == f"{diagnosis} {MISSING_BASICS}"
    # Another module, or a repo that ships the folder, gets no such sentence.
    assert Check.missing_folder(check, "raised ModuleNotFoundError: No module named 'einops'") == \
        "raised ModuleNotFoundError: No module named 'einops'"
    assert course_env.missing_path_dependency(course_repo(tmp_path / "whole"), "cs336_basics") is None


def test_a_path_dependency_whose_folder_is_absent_names_it_too(tmp_path):
    root = course_repo(tmp_path / "repo", ship_basics=False)
    assert course_env.notes(root) == ["pyproject.toml's [tool.uv.sources] points cs336-basics at ./cs336-basics, "
                                      "which is not a folder in the submission; the grader could not import it and "
                                      "the submission has no cs336-basics/ folder of its own. Put it in the "
                                      "submission (as cs336-basics/) and grade again."]
    assert course_env.missing_path_dependency(root, "cs336_basics") == MISSING_BASICS
    outside = course_repo(tmp_path / "outside", basics="../cs336-assignment1", ship_basics=False)
    assert course_env.missing_path_dependency(outside, "cs336_basics").endswith(
        "add the cs336-basics/ folder (with its files) to the submission and grade again.")


def test_adapters_that_import_a_missing_path_dependency_say_which_folder_to_add(tmp_path):
    root = course_repo(tmp_path / "repo", ship_basics=False)
    (root / "cs336-basics").mkdir()
    runner, ready = start(root)
    try:
        assert ready["import_error"] == ("tests/adapters.py failed to import: ModuleNotFoundError: No module named "
                                         f"'cs336_basics' (tests/adapters.py, line 2). {MISSING_BASICS}")
    finally:
        runner.close()


def test_declared_packages_missing_make_one_finding(tmp_path):
    root = course_repo(tmp_path / "repo", extra_root=', "definitely-not-installed-pkg>=1; python_version >= \'3\'"',
                       extra_basics=', "Also_Not.Installed[extra]==2", "ruff-like-tool-not-installed"')
    write(root / "cs336_systems" / "bench.py",
          "def run():\n    import definitely_not_installed_pkg\n    from also_not_installed import x\n")
    env = course_env.read(root)
    assert set(course_env.missing(env)) == {"definitely-not-installed-pkg", "also-not-installed",
                                            "ruff-like-tool-not-installed"}
    # a script nothing graded imports cannot break grading: no finding
    assert course_env.notes(root) == []
    write(root / "cs336_systems" / "__init__.py", "from . import bench\n")
    # the tool nobody imports cannot break grading: it is left out of the finding
    assert course_env.notes(root) == [
        "The submission declares also-not-installed and definitely-not-installed-pkg (pyproject.toml, "
        "cs336-basics/pyproject.toml), which this grader's Python lacks; cs336_systems/bench.py imports them. "
        "Install them where the grader runs "
        "(`pip install also-not-installed definitely-not-installed-pkg`) and grade again."]
    assert load_submission(root).notes == course_env.notes(root)


def test_course_packages_point_at_the_extra():
    note = course_env.missing_note({"einx": ["cs336-basics/pyproject.toml"]}, ["a.py", "b.py", "c.py", "d.py"])
    assert note == ("The submission declares einx (cs336-basics/pyproject.toml), which this grader's Python lacks; "
                    "a.py, b.py, c.py and 1 more file import it. Install it where the grader runs "
                    "(`pip install einx`; `pip install -e '.[course]'` in the grader's folder installs the course's "
                    "einops, einx, jaxtyping and pandas) and grade again.")


def test_broken_pyproject_is_a_note_not_a_crash(tmp_path):
    root = course_repo(tmp_path / "repo")
    (root / "pyproject.toml").write_text("[project\nname = ")
    env = course_env.read(root)
    assert env.paths == [str((root / "cs336-basics").resolve())]  # the shipped folder still counts
    assert len(env.refused) == 1 and "pyproject.toml could not be read" in env.refused[0]
    (root / "pyproject.toml").write_text('tool = 3\nproject = "x"\n[tool2.uv]\nsources = 1\n')
    assert course_env.read(root).paths == [str((root / "cs336-basics").resolve())]


def test_requirement_names():
    assert course_env.requirement_name("einx>=0.4") == "einx"
    assert course_env.requirement_name("torch~=2.2.2; sys_platform == 'never'") is None
    assert course_env.requirement_name("hydra-core[extra] @ https://example.org/x.whl") == "hydra-core"
    assert course_env.import_name("hydra-core") == "hydra" and course_env.import_name("Jax.Typing") == "jax_typing"


# -- through the real runner ------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["package", "namespace", "src", "outside-source"])
def test_course_repo_imports_in_the_runner(tmp_path, layout):
    root = course_repo(tmp_path / "repo", namespace=layout == "namespace", src_layout=layout == "src",
                       basics="../cs336-assignment1" if layout == "outside-source" else "./cs336-basics")
    runner, ready = start(root)
    try:
        assert ready.get("import_error") is None, ready
        assert ready["functions"] == ["ddp_on_after_backward", "get_ddp",
                                      "get_flashattention_autograd_function_pytorch"]
        if layout == "outside-source":
            assert "outside the submission; the grader used the repo's own cs336-basics/ folder" in runner.log_tail()
            assert load_submission(root).notes == course_env.read(root).refused
    finally:
        runner.close()


def test_missing_declared_package_ends_the_import_error_with_advice(tmp_path):
    root = course_repo(tmp_path / "repo", extra_basics=', "definitely-not-installed-pkg"',
                       adapters="import definitely_not_installed_pkg\n" + ADAPTERS)
    runner, ready = start(root)
    try:
        assert ready["import_error"] == (
            "tests/adapters.py failed to import: ModuleNotFoundError: No module named "
            "'definitely_not_installed_pkg' (tests/adapters.py, line 1). " + course_env.notes(root)[0])
        assert course_env.notes(root)[0].startswith("The submission declares definitely-not-installed-pkg "
                                                    "(cs336-basics/pyproject.toml), which this grader's Python "
                                                    "lacks; tests/adapters.py imports it. Install it")
    finally:
        runner.close()


def test_undeclared_missing_package_gets_no_advice(tmp_path):
    root = course_repo(tmp_path / "repo", adapters="import definitely_not_installed_pkg\n" + ADAPTERS)
    runner, ready = start(root)
    try:
        assert ready["import_error"] == ("tests/adapters.py failed to import: ModuleNotFoundError: "
                                         "No module named 'definitely_not_installed_pkg' (tests/adapters.py, line 1)")
    finally:
        runner.close()


def test_ddp_ranks_import_the_path_dependency(tmp_path):
    """The spawned ranks import tests.adapters again (cs336_basics at its top, cs336_systems'
    metadata) and cs336_basics.ddp lazily: the runner's sys.path must reach them."""
    runner, ready = start(course_repo(tmp_path / "repo"))
    try:
        assert ready.get("import_error") is None, ready
        spec = {"flavour": "ddp", "models": ["toy"], "steps": 1, "batch": 4, "lr": 0.1, "bucket_size_mb": 0.001}
        reply = runner.call(Distributed("ddp", seed=0, spec=spec, world_size=2, timeout_s=150),
                            timeout=180, what="DDP, 2 gloo ranks")
        assert reply.ok, (reply.status, reply.message, reply.traceback, runner.log_tail())
        statuses = [rank["status"] for rank in reply.result["scenarios"]["toy"]]
        messages = [rank.get("message") for rank in reply.result["scenarios"]["toy"]]
        assert statuses == ["ok", "ok"], messages
    finally:
        runner.close()
