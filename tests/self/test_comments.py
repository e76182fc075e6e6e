"""Comments that stay true: no docstring or comment of the project's code carries a date or a
measured duration (issue 43). Figures go stale; they live in notes/, and the code cites the notes
section by its words ("notes/grading-speed.md, "A shard per Triton kernel on two GPUs"").

The rule, over every module of fa2_sandbox, grading, reporting, reference and bench, in its
docstrings (module, class, function: ast.get_docstring) and its comments (tokenize's COMMENT):

- no date: DATE, a YYYY-MM-DD of this century;
- no duration: DURATION, a number followed by a unit of time (ms, s, second, minute, min, hour, h),
  unless that number is a constant the code defines: a numeric literal of the same module's code
  (WINDOW_S = 3.0 lets a docstring say "3 s") or of grading/rubric.yaml, the rubric the checks read
  ("timed out after 300 s" quotes its flash timeout).

Read from the source with ast and tokenize, so nothing is imported."""
import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fa2_sandbox", "grading", "reporting", "reference", "bench")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
DURATION = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(?:ms|s|seconds?|minutes?|min|hours?|h)\b")
RUBRIC = ROOT / "grading" / "rubric.yaml"


def modules() -> list:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def numbers(tree) -> set:
    """The numeric literals of a module's code (docstrings are strings, so never among them)."""
    return {float(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and type(node.value) in (int, float)}


def rubric_numbers() -> set:
    """The numbers grading/rubric.yaml sets, read as words so the test needs no YAML parser."""
    code = "\n".join(line.split("#", 1)[0] for line in RUBRIC.read_text().splitlines())
    return {float(word) for word in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", code)}


def texts(path: Path, tree) -> list:
    """(line, text) of every docstring and comment of the module at `path`."""
    found = [(node.body[0].lineno, doc) for node in ast.walk(tree)
             if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
             and (doc := ast.get_docstring(node, clean=False)) is not None]
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return found + [(token.start[0], token.string) for token in tokens if token.type == tokenize.COMMENT]


def hits(path: Path, allowed: set, root: Path = ROOT) -> list:
    """'file:line: what' for each date and each duration not among `allowed` or the module's own numbers."""
    tree = ast.parse(path.read_text(), str(path))
    own = allowed | numbers(tree)
    where = path.relative_to(root)
    found = []
    for line, text in texts(path, tree):
        found += [f"{where}:{line}: a date, {m.group()}" for m in DATE.finditer(text)]
        found += [f"{where}:{line}: a duration, {m.group()!r}" for m in DURATION.finditer(text)
                  if float(m.group(1)) not in own]
    return found


def test_the_rule_sees_dates_durations_and_constants(tmp_path):
    module = tmp_path / "example.py"
    module.write_text('"""Measured on 2026-11-28: 2845 s of 400, 1.4 to 33 ms; WINDOW_S, 3 s."""\n'
                      "WINDOW_S = 3.0  # took 5 minutes on a GPU, 120 s under the rubric\n")
    assert [hit.split(": ", 1)[1] for hit in hits(module, {120.0}, tmp_path)] == [
        "a date, 2026-11-28", "a duration, '2845 s'", "a duration, '33 ms'", "a duration, '5 minutes'"]


def test_no_docstring_or_comment_carries_a_date_or_a_measured_duration():
    allowed = rubric_numbers()
    assert {300.0, 120.0} <= allowed
    found = [hit for path in modules() for hit in hits(path, allowed)]
    assert found == [], "a date or a measured figure belongs in notes/; cite the notes section instead:\n" + \
        "\n".join(found)


def test_the_rubric_comments_carry_no_date_or_measured_duration():
    """grading/rubric.yaml's comments by the same rule, the numbers it sets being its constants."""
    allowed = rubric_numbers()
    comments = [(n, line.split("#", 1)[1]) for n, line in enumerate(RUBRIC.read_text().splitlines(), 1) if "#" in line]
    found = [f"grading/rubric.yaml:{n}: {m.group()}" for n, text in comments
             for m in [*DATE.finditer(text), *(d for d in DURATION.finditer(text) if float(d.group(1)) not in allowed)]]
    assert found == []
