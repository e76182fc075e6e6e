"""What a submission expects from the Python it runs in, read from its pyproject.toml files.

The course's repos are run with `uv run`, which installs the repo itself, its path
dependencies (`[tool.uv.sources] cs336-basics = { path = "./cs336-basics", editable = true }`)
and everything their `[project].dependencies` declare. The grader installs nothing: the runner
puts the path dependencies that live inside the submission on sys.path (with dist-info metadata,
since modules call importlib.metadata.version on them), and the report says which declared
packages this grader's Python lacks, so whoever runs the grader can install them.

Reads files only, never imports the submission's code: the harness (fa2_sandbox.harness.discover) calls it
for the report's notes and the runner (fa2_sandbox.runner.serve) for its sys.path. A path that leaves the
submission (`../cs336-assignment1`, an absolute path, a link outside) is refused and reported,
never followed.
"""
import ast
import importlib.metadata
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# Imported now, with the runner's other trusted modules: later the submission's folders are on
# sys.path, where a `packaging/` of its own would shadow these.
try:
    import tomllib  # Python 3.11+; the grader's own requirement is 3.10
except ImportError:
    tomllib = None
try:
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # a plain regex then, with no environment markers
    InvalidRequirement = Requirement = None

# The path dependency the course's repos ship at their root (its assignment 1 solution); used
# even when no [tool.uv.sources] entry names it, or when the entry points outside the repo.
COURSE_BASICS = "cs336-basics"
# What the grader's `course` extra installs (pyproject.toml): the packages the course's own
# cs336_basics imports at module level, and pandas, which the course declares.
COURSE_PACKAGES = ("einops", "einx", "jaxtyping", "pandas")
# Where a distribution's import name is not its normalised name (for the imported-by check).
IMPORT_NAMES = {"pyyaml": "yaml", "hydra-core": "hydra", "pillow": "PIL", "scikit-learn": "sklearn",
                "beautifulsoup4": "bs4", "opencv-python": "cv2", "protobuf": "google"}
MAX_PYPROJECT_BYTES = 1 << 20
MAX_SCANNED_FILES = 2000  # .py files read for imports; a repo of the course holds a few dozen
MAX_SCANNED_BYTES = 1 << 20  # per file
SKIPPED_FOLDERS = {".git", ".venv", "venv", "__pycache__", "node_modules", "site-packages", "wandb", ".tox"}


@dataclass
class CourseEnv:
    """What one submission's pyproject files ask for. `paths` are absolute sys.path entries,
    all inside the submission; `distributions` are the names to give dist-info metadata;
    `refused` holds one plain sentence per thing not used (a path dependency outside the repo or
    missing, an unreadable pyproject.toml); `requirements`
    maps each declared requirement name (neither the repo's own nor a path dependency) to the
    pyproject files, relative to the root, that declare it."""
    paths: list = field(default_factory=list)
    distributions: list = field(default_factory=list)
    refused: list = field(default_factory=list)
    requirements: dict = field(default_factory=dict)


def _table(data, *keys) -> dict:
    """data[k1][k2]... when each is a TOML table, else {} (a pyproject may hold anything)."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else {}


def normalise(name: str) -> str:
    """PEP 503's form of a distribution name: cs336_basics, CS336.Basics -> cs336-basics."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pyproject(folder: Path) -> tuple:
    """(the parsed pyproject.toml of `folder`, or {}; a sentence saying why it could not be read,
    or None). A missing file is not a problem: many submissions have none."""
    path = folder / "pyproject.toml"
    if not path.is_file():
        return {}, None
    if tomllib is None:
        return {}, None
    try:
        if path.stat().st_size > MAX_PYPROJECT_BYTES:
            return {}, f"{path.name} is over {MAX_PYPROJECT_BYTES >> 20} MiB; the grader ignored it."
        data = tomllib.loads(path.read_text(errors="replace"))
    except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        return {}, f"{path.name} could not be read ({exc}); the grader ignored it."
    return (data if isinstance(data, dict) else {}), None


def requirement_name(text: str) -> str | None:
    """The distribution name of a PEP 508 requirement ("einx>=0.4", "torch~=2.2; sys_platform ==
    'darwin'"), or None when its environment marker excludes this machine or it is not one."""
    if not isinstance(text, str):
        return None
    if Requirement is not None:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            return None
        try:
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                return None
        except Exception:  # a marker packaging cannot evaluate: keep the requirement
            pass
        return requirement.name
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
    return match.group(1) if match else None


def write_metadata(root: Path, env: CourseEnv, site: str) -> str:
    """Write into `site` a dist-info for the repo's own packages and its path dependencies, so
    `importlib.metadata.version("cs336-systems")` works in a plain checkout as it does after the
    course's `uv run` installed them. Returns `site`, for sys.path."""
    project = read_pyproject(Path(root))[0].get("project", {})
    names = set(env.distributions) | {str(project.get("name") or "") if isinstance(project, dict) else ""}
    names |= {p.name for p in Path(root).iterdir() if p.is_dir() and p.name.startswith("cs336")}
    for name in filter(None, (re.sub(r"[^A-Za-z0-9._-]", "_", str(n)).strip("._") for n in names)):
        dist = Path(site) / f"{name.replace('-', '_')}-0.0.0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)  # pyproject's "cs336-systems" and the folder cs336_systems meet here
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0\n")
    return site


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _import_path(folder: Path, pyproject: dict, name: str) -> Path:
    """Where a path dependency's package lives: the folder itself (`cs336-basics/cs336_basics/`)
    or its src/ (a src layout). uv_build's `module-root` says so outright when it is set."""
    backend = _table(pyproject, "tool", "uv", "build-backend")
    module = backend.get("module-name") or name.replace("-", "_").replace(".", "_")
    if isinstance(module, list):
        module = module[0] if module else ""
    module = str(module).split(".")[0]
    candidates = [folder, folder / "src"]
    if isinstance(backend.get("module-root"), str):
        candidates.insert(0, folder / backend["module-root"])
    for candidate in candidates:
        if (candidate / module).is_dir() or (candidate / f"{module}.py").is_file():
            return candidate
    return folder / "src" if (folder / "src").is_dir() else folder


def read(root: Path) -> CourseEnv:
    """The submission's path dependencies, refused paths and declared requirements."""
    root = Path(root)
    real_root = os.path.realpath(root)
    env = CourseEnv()
    pyproject, problem = read_pyproject(root)
    if problem:
        env.refused.append(problem)
    project = _table(pyproject, "project")
    own = {normalise(str(project.get("name") or ""))}  # the repo's own packages: never "missing"
    own |= {normalise(p.name) for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()
    sources = _table(pyproject, "tool", "uv", "sources")

    folders = []  # (distribution name, folder) of each path dependency used
    for name, source in sources.items():
        if not isinstance(source, dict) or not (source.get("path") or source.get("workspace")):
            continue  # an index, a git or url source: not on disk
        own.add(normalise(name))
        if not source.get("path"):
            continue
        where = str(source["path"])
        if "\0" in where:
            env.refused.append(f"pyproject.toml's [tool.uv.sources] gives {name} a path the grader cannot use.")
            continue
        target = os.path.realpath(os.path.join(real_root, where))
        if os.path.isabs(where) or not _inside(target, real_root):
            env.refused.append(_refused_note(root, name, where, "outside the submission"))
        elif not os.path.isdir(target):
            env.refused.append(_refused_note(root, name, where, "which is not a folder in the submission"))
        elif _empty(target):
            env.refused.append(_empty_note(name, where))
        elif target != real_root:
            folders.append((name, Path(target)))

    if COURSE_BASICS not in {normalise(n) for n, _ in folders} and _ships_basics(root):
        folders.append((COURSE_BASICS, Path(os.path.realpath(root / COURSE_BASICS))))

    declared = [("pyproject.toml", project.get("dependencies"))]
    for name, folder in folders:
        sub, problem = read_pyproject(folder)
        if problem:
            env.refused.append(f"{os.path.relpath(folder, real_root)}/{problem}")
        sub_project = _table(sub, "project")
        dist = str(sub_project.get("name") or name)
        own |= {normalise(dist), normalise(name)}
        path = _import_path(folder, sub, dist)
        if _inside(os.path.realpath(path), real_root) and str(path) not in env.paths:
            env.paths.append(str(path))
        env.distributions.append(dist)
        declared.append((f"{os.path.relpath(folder, real_root)}/pyproject.toml", sub_project.get("dependencies")))

    for where, requirements in declared:
        for text in requirements if isinstance(requirements, list) else []:
            name = requirement_name(text)
            if name and normalise(name) not in own:
                files = env.requirements.setdefault(normalise(name), [])
                if where not in files:
                    files.append(where)
    return env


def _empty(folder: str) -> bool:
    """Whether a path dependency's folder holds nothing (a git submodule not checked out)."""
    try:
        return not any(entry.name != ".git" for entry in os.scandir(folder))
    except OSError:
        return False


def _empty_note(name: str, where: str) -> str:
    """The sentence for a uv source whose folder is there but empty."""
    folder = where.strip("/").removeprefix("./")
    return (f"pyproject.toml's [tool.uv.sources] points {name} at {where}, a folder that is empty in the submission "
            f"(a git submodule not checked out, say), so the grader could not import it. Add the {folder}/ folder's "
            f"files to the submission (`git submodule update --init`, or copy them in) and grade again.")


def missing_path_dependency(root: Path, module: str) -> str | None:
    """For a `No module named '<module>'` error: the sentence naming the folder to add, where the
    module is a path dependency the submission declares and lacks (the uv source's folder is absent
    or empty); else None."""
    wanted = module.split(".")[0]
    env = read(Path(root))
    if any(import_name(dist) == wanted for dist in env.distributions):
        return None  # it is there: the error is another one
    sources = _table(read_pyproject(Path(root))[0], "tool", "uv", "sources")
    for name, source in sources.items():
        if isinstance(source, dict) and source.get("path") and import_name(name) == wanted:
            where = str(source["path"])
            inside = not os.path.isabs(where) and _inside(os.path.realpath(os.path.join(root, where)),
                                                          os.path.realpath(root))
            folder = where.strip("/").removeprefix("./") if inside else name  # the grader never reads outside
            return (f"{wanted} is the path dependency {name}, which pyproject.toml's [tool.uv.sources] finds at "
                    f"{where}, and the submission lacks it there: add the {folder}/ folder (with its files) "
                    f"to the submission and grade again.")
    return None


def _ships_basics(root: Path) -> bool:
    """Whether the repo has its own cs336-basics/ folder (not a link leaving it)."""
    folder = root / COURSE_BASICS
    return folder.is_dir() and _inside(os.path.realpath(folder), os.path.realpath(root)) and not _empty(str(folder))


def _refused_note(root: Path, name: str, where: str, why: str) -> str:
    """The sentence for a uv source the grader did not follow, saying what it did instead."""
    said = f"pyproject.toml's [tool.uv.sources] points {name} at {where}, {why}"
    if normalise(name) == COURSE_BASICS and _ships_basics(root):
        return f"{said}; the grader used the repo's own {COURSE_BASICS}/ folder instead."
    package = name.replace("-", "_")
    if (root / package).is_dir():
        return f"{said}; the grader used the repo's own {package}/ package instead."
    return (f"{said}; the grader could not import it and the submission has no {name}/ folder of its own. "
            f"Put it in the submission (as {name}/) and grade again.")


def installed(name: str) -> bool:
    """Whether this Python has the distribution `name`, by its metadata or, failing that, by a
    module of the normalised name (a package put on the path by hand has no metadata)."""
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    except Exception:  # a broken metadata folder somewhere on the path
        pass
    try:
        return importlib.util.find_spec(import_name(name)) is not None
    except (ImportError, ValueError):
        return False


def import_name(distribution: str) -> str:
    """The module a distribution is usually imported as: beartype -> beartype, hydra-core -> hydra."""
    key = normalise(distribution)
    return IMPORT_NAMES.get(key, key.replace("-", "_"))


def missing(env: CourseEnv) -> dict:
    """{requirement: declaring files} for each declared requirement this Python lacks."""
    return {name: files for name, files in env.requirements.items() if not installed(name)}


def _parse(path: Path):
    try:
        if path.stat().st_size > MAX_SCANNED_BYTES:
            return None
        return ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _module_files(name: str, search: list, root: str) -> list:
    """The files inside the submission that importing dotted `name` runs: each package's
    __init__.py on the way and the module itself."""
    found = []
    for folder in search:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            base = Path(folder, *parts[:i])
            for candidate in (base / "__init__.py", base.with_suffix(".py")):
                if candidate.is_file() and _inside(os.path.realpath(candidate), root):
                    found.append(candidate)
    return found


def imported_modules(root: Path, start: Path, search: list) -> dict:
    """{top-level module name: files importing it, relative to root} over the files the
    adapters file `start` reaches through its imports (imports inside functions included, since
    the adapters import lazily), resolved in the submission's folders `search`. Read with ast,
    never run: a benchmark script that nothing graded imports does not count."""
    real_root = os.path.realpath(root)
    modules, seen, queue = {}, set(), [Path(start)]
    while queue and len(seen) < MAX_SCANNED_FILES:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        tree = _parse(path)
        if tree is None:
            continue
        where = os.path.relpath(path, root)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:  # relative: a file next to this one
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                prefix = f"{node.module}." if node.module else ""
                targets = ([node.module] if node.module else []) + [prefix + alias.name for alias in node.names]
                queue += [f for target in targets for f in _module_files(target, [str(base)], real_root)]
                continue
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                files = modules.setdefault(name.split(".")[0], [])
                if where not in files:
                    files.append(where)
                queue += _module_files(name, search, real_root)
    return modules


def adapters_path(root: Path) -> Path | None:
    """The adapters file where the course keeps it (tests/adapters.py) or at the root."""
    return next((root / p for p in ("tests/adapters.py", "adapters.py") if (root / p).is_file()), None)


def _and(words: list) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def missing_note(lacking: dict, importers: list = ()) -> str | None:
    """The one sentence of advice for declared packages this grader's Python lacks, or None.
    `lacking` maps each to the pyproject files declaring it; `importers` are the submission's
    files that import them, named so the reader can tell a benchmark script from the graded code."""
    if not lacking:
        return None
    names = sorted(lacking)
    files = sorted({f for name in names for f in lacking[name]}, key=lambda f: (f != "pyproject.toml", f))
    them = "them" if len(names) > 1 else "it"
    where = ""
    if importers:
        more = len(importers) - 3
        shown = list(importers[:3]) + ([f"{more} more file{'s' if more > 1 else ''}"] if more > 0 else [])
        where = f"; {_and(shown)} import{'s' if len(importers) == 1 else ''} {them}"
    course = (f"; `pip install -e '.[course]'` in the grader's folder installs the course's "
              f"{_and(list(COURSE_PACKAGES))}") if set(names) & set(COURSE_PACKAGES) else ""
    return (f"The submission declares {_and(names)} ({', '.join(files)}), which this grader's Python lacks{where}. "
            f"Install {them} where the grader runs (`pip install {' '.join(names)}`{course}) and grade again.")


def lacking(root: Path, env: CourseEnv, adapters_file: Path | None = None) -> tuple:
    """({declared package this Python lacks: declaring files}, [files importing them]), keeping
    only packages the graded code imports (the adapters file and what it reaches): a declared
    tool such as ruff, or a package only a benchmark script imports, cannot break grading and
    is not worth a finding."""
    found = missing(env)
    start = adapters_file or adapters_path(root)
    if not found or start is None:
        return {}, []
    imported = imported_modules(root, start, [str(root), *env.paths])
    kept = {name: files for name, files in found.items() if import_name(name) in imported}
    return kept, sorted({f for name in kept for f in imported[import_name(name)]})


def notes(root: Path, adapters_file: Path | None = None) -> list:
    """The report's notes about the submission's environment: the path dependencies not used,
    and one sentence naming the declared packages the graded code imports and this grader lacks."""
    env = read(root)
    note = missing_note(*lacking(root, env, adapters_file))
    return env.refused + ([note] if note else [])


def import_advice(root: Path, exc: BaseException) -> str | None:
    """For an import that failed with ModuleNotFoundError on a package the submission declares
    and this Python lacks: the same advice as the report's note, to end the import error with,
    so the ungradable reason says what to do; on a path dependency it lacks, the folder to add.
    Else None."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    if folder := missing_path_dependency(root, exc.name):
        return folder
    env = read(root)
    wanted = exc.name.split(".")[0]
    failing = {name: files for name, files in missing(env).items() if import_name(name) == wanted}
    if not failing:
        return None
    kept, importers = lacking(root, env)
    return missing_note({**kept, **failing}, importers)
