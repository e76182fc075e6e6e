"""Find submissions on disk. Reads files only: nothing here imports a submission's code.

A submission is a directory holding `tests/adapters.py` (the course's layout) or `adapters.py`
at its root. An optional `submission.yaml` may name the student (with the student id and email
that match them on Gradescope's roster), the adapters file and extra path entries:

    student: Alice Liddell
    student_id: "012345"
    email: alice@example.edu
    adapters: src/tests/adapters.py
    paths: [src]

Gradescope's own record of who submitted wins over submission.yaml's student fields when the
submission's folder holds one (integrations/gradescope/run_autograder copies it there):
`submission_metadata.json` (what an autograder gets: {"users": [{"name", "email", "id"}]}) or
`submission_metadata.yml` (Ruby-style keys, `:users:` or the "Export Submissions" zip's
`:submitters:`, each with `:name:`, `:sid:`, `:email:`). The export's file, which sits beside the
submission folders and names each by its folder, is read from the parent folder too. A group
submission lists several students. `id` is Gradescope's account number, not the student id, and
is not used. All of these are untrusted: a field of the wrong type is ignored and one too long is
clipped, with a note in the report, never a crash.
"""
import glob
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from fa2_sandbox.wire import course_env

ADAPTER_LOCATIONS = ("tests/adapters.py", "adapters.py")


@dataclass
class Submission:
    name: str
    root: Path
    adapters_file: str | None  # relative to root; None when there is none
    student: str | None = None  # the students' names, joined with ", " for a group
    extra_paths: list = field(default_factory=list)
    problem: str | None = None  # why it cannot be graded at all, in one sentence
    notes: list = field(default_factory=list)  # facts about its environment for the report (course_env)
    student_id: str | None = None  # joined like `student`
    email: str | None = None
    students: list = field(default_factory=list)  # [{"name", "sid", "email"}] (None where unknown), one a member


class _TextLoader(yaml.SafeLoader):
    """Safe YAML that keeps numbers as written (student id 012345 is text, not the octal 5349)
    and reads a Ruby tag (`!ruby/object:...`) as the plain value under it instead of failing."""


_TextLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_TextLoader.add_multi_constructor("!", lambda loader, _tag, node: (
    loader.construct_mapping(node) if isinstance(node, yaml.MappingNode)
    else loader.construct_sequence(node) if isinstance(node, yaml.SequenceNode) else loader.construct_scalar(node)))

IDENTITY_CHARS = 200  # a name, id or email is clipped to this many characters
METADATA_FILES = ("submission_metadata.yml", "submission_metadata.json")
METADATA_BYTES = 16 << 20  # larger metadata files are not read


def load_submission(root: Path) -> Submission:
    root = root.resolve()
    settings, notes = {}, []
    if (root / "submission.yaml").is_file():
        try:
            settings = yaml.load((root / "submission.yaml").read_text(), Loader=_TextLoader) or {}
        except (yaml.YAMLError, ValueError, RecursionError) as exc:  # a bad file is a note, not ungradable
            notes.append(f"submission.yaml is not valid YAML ({_text(str(exc), 'error', [])}); it was ignored.")
    if not isinstance(settings, dict):
        settings = {}
        notes.append("submission.yaml is not a mapping of settings (student: ..., adapters: ...); it was ignored.")
    candidates = [settings["adapters"]] if settings.get("adapters") else list(ADAPTER_LOCATIONS)
    adapters_file = next((c for c in candidates if (root / c).is_file()), None)
    problem = None
    if adapters_file is None:
        problem = (f"the folder holds no {candidates[0]}, the adapters file its submission.yaml names"
                   if settings.get("adapters") else "the folder holds neither tests/adapters.py nor adapters.py")
    students = identify(root, settings, notes)

    def joined(key):
        return ", ".join(s[key] for s in students if s[key]) or None

    return Submission(name=str(settings.get("name") or root.name), root=root, adapters_file=adapters_file,
                      student=joined("name"), student_id=joined("sid"), email=joined("email"), students=students,
                      extra_paths=list(settings.get("paths", [])), problem=problem,
                      notes=notes + environment_notes(root))


def _text(value, what: str, notes: list) -> str | None:
    """An untrusted name, id or email as one line of at most IDENTITY_CHARS characters; None
    (with a note) when it is not text or a number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        notes.append(f"{what} is not text; it was ignored.")
        return None
    text = " ".join(str(value).split())
    if len(text) > IDENTITY_CHARS:
        notes.append(f"{what} is longer than {IDENTITY_CHARS} characters; it was clipped.")
    return text[:IDENTITY_CHARS] or None


def _keys(value) -> dict:
    """A mapping with Ruby-style symbol keys (":users") read as plain ones ("users")."""
    return {k.lstrip(":") if isinstance(k, str) else k: v for k, v in value.items()} if isinstance(value, dict) else {}


@lru_cache(maxsize=8)
def _read_metadata(path: Path, mtime: float):
    """One metadata file, parsed (cached: the export's file is read once for all its folders)."""
    if path.stat().st_size > METADATA_BYTES:
        raise ValueError(f"larger than {METADATA_BYTES >> 20} MB")
    text = path.read_text(encoding="utf-8", errors="replace")
    return json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_TextLoader)


def _metadata_students(data, folder: str, own: bool, what: str, notes: list) -> list | None:
    """[{"name", "sid", "email"}] from the submission's own record (`own`: the file is in its
    folder), else from the export's file, one record per submission folder, by the folder's name
    (or the only record, in its own folder); None when it names no one."""
    data = _keys(data)
    if not (own and {"users", "submitters"} & data.keys()):
        records = [v for v in data.values() if isinstance(v, dict)]
        data = _keys(data.get(folder) if folder in data else records[0] if own and len(records) == 1 else None)
    users = data.get("users", data.get("submitters"))
    if not isinstance(users, list):
        return None
    students = []
    for i, user in enumerate(users[:50]):
        user = _keys(user)
        student = {"name": _text(user.get("name"), f"{what}: user {i + 1}'s name", notes),
                   "sid": _text(user.get("sid"), f"{what}: user {i + 1}'s sid", notes),
                   "email": _text(user.get("email"), f"{what}: user {i + 1}'s email", notes)}
        if any(student.values()):
            students.append(student)
    return students or None


def identify(root: Path, settings: dict, notes: list) -> list:
    """Who submitted, as [{"name", "sid", "email"}]: from Gradescope's metadata when it names
    anyone (the folder's own file first, then the export's beside it), else from submission.yaml.
    Anything unreadable becomes a note in `notes`; this never raises."""
    for path in [root / name for name in METADATA_FILES] + [root.parent / METADATA_FILES[0]]:
        try:
            if not path.is_file():
                continue
            data = _read_metadata(path, path.stat().st_mtime)
        except Exception as exc:  # untrusted: a bad file loses the names, never the grading
            why = _text(f"{type(exc).__name__}: {exc}", "error", [])
            notes.append(f"{path.name} could not be read ({why}); its names were ignored.")
            continue
        folder_notes = []
        students = _metadata_students(data, root.name, path.parent == root, path.name, folder_notes)
        if students:
            notes += folder_notes
            return students
        if path.parent == root:
            notes.append(f"{path.name} names no students; it was ignored.")
    student = {"name": _text(settings.get("student"), "submission.yaml: student", notes),
               "sid": _text(settings.get("student_id"), "submission.yaml: student_id", notes),
               "email": _text(settings.get("email"), "submission.yaml: email", notes)}
    return [student] if any(student.values()) else []


def environment_notes(root: Path) -> list[str]:
    """What the submission's pyproject files ask of the grader's Python that it lacks (path
    dependencies outside the repo, declared packages not installed), read from files only."""
    if not root.is_dir():
        return []
    try:
        return course_env.notes(root)
    except Exception as exc:  # the report must still be written
        return [f"The grader could not read the submission's pyproject.toml files ({exc!r})."]


EXPECTED = "a submission folder (a course repo) holding tests/adapters.py or adapters.py"
EXPECTED_GLOB = "a glob of submission folders (course repos), each holding tests/adapters.py or adapters.py"


class NotASubmission(ValueError):
    """--impl names something that is not a submission: one sentence per such path, each naming
    the path and what was expected there. Nothing is graded then."""


def why_not_a_submission(path: Path, given: str) -> str | None:
    """The sentence that says why `path` (written `given` on the command line) is no submission,
    or None when it is one (a folder holding its adapters file)."""
    if not path.exists():
        return f"--impl {given}: there is no such file or folder; expected {EXPECTED}."
    if not path.is_dir():
        hint = ""
        if path.name == "adapters.py":  # the adapters file itself: its repo is the folder to name
            repo = path.parent.parent if path.parent.name == "tests" else path.parent
            hint = f" (name the folder that holds it: --impl {repo})"
        return f"--impl {given} is a file; expected {EXPECTED}{hint}."
    if (problem := load_submission(path).problem) is not None:
        return f"--impl {given}: {problem}; expected a submission folder (a course repo) with its adapters file there."
    return None


def find_submissions(patterns: list[str], skipped: list | None = None) -> list[Submission]:
    """Expand --impl values into the submissions they name, or raise NotASubmission.

    A path named outright must be a submission: a folder holding its adapters file. A glob must
    match at least one; the folders it matches that hold no adapters file are left out and, when
    `skipped` is a list, added to it (as paths), so `submissions/*` grades the submissions among
    other folders and can say which it passed over. Files a glob matches (a README) are ignored."""
    found, problems = {}, []
    for pattern in patterns:
        if glob.has_magic(pattern):
            folders = {Path(p): load_submission(Path(p)) for p in sorted(glob.glob(pattern)) if Path(p).is_dir()}
            loaded = [s for s in folders.values() if s.problem is None]
            if not folders:
                problems.append(f"--impl {pattern!r} matches no folder; expected {EXPECTED_GLOB}.")
            elif not loaded:
                names = ", ".join(p.name for p in list(folders)[:5]) + (", ..." if len(folders) > 5 else "")
                problems.append(f"--impl {pattern!r} matches {len(folders)} folder{'s' * (len(folders) > 1)} "
                                f"({names}) and none holds tests/adapters.py or adapters.py; expected {EXPECTED_GLOB}.")
            if skipped is not None:
                skipped += [p for p, s in folders.items() if s.problem is not None]
        elif (problem := why_not_a_submission(Path(pattern), pattern)) is not None:
            problems.append(problem)
            continue
        else:
            loaded = [load_submission(Path(pattern))]
        for submission in loaded:
            if submission.root in {s.root for s in found.values()}:
                continue
            if submission.name in found:  # same folder name under two parents
                submission.name = f"{submission.root.parent.name}-{submission.name}"
            found[submission.name] = submission
    if problems:
        raise NotASubmission("\n".join(problems))
    return list(found.values())


def _adapters_body(submission: Submission) -> list:
    """The top-level statements of the adapters file, read with ast, never imported."""
    import ast

    if submission.adapters_file is None:
        return []
    try:
        return ast.parse((submission.root / submission.adapters_file).read_text()).body
    except (SyntaxError, UnicodeDecodeError, OSError):
        return []


def _function_defs(submission: Submission) -> dict:
    """The top-level function definitions of the adapters file."""
    import ast

    return {node.name: node for node in _adapters_body(submission)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def defined_functions(submission: Submission) -> set[str]:
    """Names the adapters file defines at top level: its functions, and the names it imports or
    assigns (`from cs336_systems.fsdp import get_fsdp` provides get_fsdp as a def does)."""
    import ast

    names = set(_function_defs(submission))
    for node in _adapters_body(submission):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


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
