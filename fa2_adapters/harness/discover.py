"""Find submissions on disk. Reads files only: nothing here imports a submission's code.

A submission is a directory holding `tests/adapters.py` (the course's layout) or `adapters.py`
at its root. An optional `submission.yaml` may name the student, the adapters file and extra
path entries:

    student: Alice Liddell
    adapters: src/tests/adapters.py
    paths: [src]
"""
import glob
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fa2_adapters.runner import course_env

ADAPTER_LOCATIONS = ("tests/adapters.py", "adapters.py")


@dataclass
class Submission:
    name: str
    root: Path
    adapters_file: str | None  # relative to root; None when there is none
    student: str | None = None
    extra_paths: list = field(default_factory=list)
    problem: str | None = None  # why it cannot be graded at all, in one sentence
    notes: list = field(default_factory=list)  # facts about its environment for the report (course_env)


def load_submission(root: Path) -> Submission:
    root = root.resolve()
    settings = {}
    if (root / "submission.yaml").exists():
        try:
            settings = yaml.safe_load((root / "submission.yaml").read_text()) or {}
        except yaml.YAMLError as exc:
            return Submission(root.name, root, None, problem=f"submission.yaml is not valid YAML: {exc}")
    candidates = [settings["adapters"]] if settings.get("adapters") else list(ADAPTER_LOCATIONS)
    adapters_file = next((c for c in candidates if (root / c).is_file()), None)
    problem = None if adapters_file else (
        f"no adapters file found: expected {' or '.join(candidates)} in {root.name}/")
    return Submission(name=str(settings.get("name") or root.name), root=root, adapters_file=adapters_file,
                      student=settings.get("student"), extra_paths=list(settings.get("paths", [])),
                      problem=problem, notes=environment_notes(root))


def environment_notes(root: Path) -> list[str]:
    """What the submission's pyproject files ask of the grader's Python that it lacks (path
    dependencies outside the repo, declared packages not installed), read from files only."""
    if not root.is_dir():
        return []
    try:
        return course_env.notes(root)
    except Exception as exc:  # the report must still be written
        return [f"The grader could not read the submission's pyproject.toml files ({exc!r})."]


def looks_like_submission(path: Path) -> bool:
    return path.is_dir() and any((path / p).is_file() for p in (*ADAPTER_LOCATIONS, "submission.yaml"))


def find_submissions(patterns: list[str]) -> list[Submission]:
    """Expand --impl values. A directory named outright is always graded (and reported as
    ungradable if it holds no adapters); a glob keeps only the directories that look like
    submissions, so `submissions/*` skips folders of other things."""
    found = {}
    for pattern in patterns:
        if glob.has_magic(pattern):
            paths = [Path(p) for p in sorted(glob.glob(pattern)) if looks_like_submission(Path(p))]
        else:
            paths = [Path(pattern)]
        for path in paths:
            submission = load_submission(path)
            if submission.root in {s.root for s in found.values()}:
                continue
            if submission.name in found:  # same folder name under two parents
                submission.name = f"{submission.root.parent.name}-{submission.name}"
            found[submission.name] = submission
    return list(found.values())


def _function_defs(submission: Submission) -> dict:
    """The top-level function definitions of the adapters file, read with ast, never imported."""
    import ast

    if submission.adapters_file is None:
        return {}
    try:
        tree = ast.parse((submission.root / submission.adapters_file).read_text())
    except (SyntaxError, UnicodeDecodeError, OSError):
        return {}
    return {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def defined_functions(submission: Submission) -> set[str]:
    """Names of the top-level functions in the adapters file."""
    return set(_function_defs(submission))


def stub_functions(submission: Submission) -> set[str]:
    """Adapter functions whose whole body (after a docstring) is `raise NotImplementedError`: the
    course template's stubs. Knowing them spares spawning ranks only to hear 'not attempted'."""
    import ast

    def is_stub(node) -> bool:
        body = [b for b in node.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
        if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
            return False
        exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"

    return {name for name, node in _function_defs(submission).items() if is_stub(node)}
