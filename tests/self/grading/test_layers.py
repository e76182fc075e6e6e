"""The top-level folders import each other in one direction only (README, "Layout"):

    reference    the math, importing none of the others
    fa2_sandbox  the trust boundary (harness, runner, wire): none of grading or reporting, since
                 its runner's trusted copy holds only fa2_sandbox and must import nothing else
    grading      the engine: the sandbox, the references, its results layer (grading/results)
    reporting    the pages: the records' codec (grading/results/record.py) only, never the rest of
                 the engine, and the outcome words of the wire

and inside the engine, the checks ask the diagnoses for a sentence, never the reverse: both hold
the ranks to grading/baselines.py, which imports nothing of the engine.

Read from the source with ast, so an import inside a function counts too."""
import ast
import re
from dataclasses import fields
from pathlib import Path

from fa2_sandbox.wire import outcomes

ROOT = Path(__file__).resolve().parents[3]
TOP = ("reference", "fa2_sandbox", "grading", "reporting")


def imports(package: str) -> dict:
    """{module file: the dotted names it imports}, for every module under `package`."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
        found[str(path.relative_to(ROOT))] = names
    return found


def crossing(package: str, allowed) -> list:
    """The imports of `package` into another top-level folder that `allowed(name)` refuses."""
    return [f"{where}: {name}" for where, names in imports(package).items() for name in sorted(names)
            if name.split(".")[0] in TOP and name.split(".")[0] != package and not allowed(name)]


def test_the_references_import_no_other_folder():
    assert crossing("reference", lambda name: False) == []


def test_the_sandbox_imports_nothing_of_the_engine_or_the_pages():
    assert crossing("fa2_sandbox", lambda name: False) == []


def test_the_pages_read_the_engine_only_through_the_records_codec():
    """The pages read results.json and class.json in the format the engine writes them in
    (grading/results/record.py), never through the rest of the results layer (store, scoring,
    gradescope), which is the engine's own code for writing them."""
    codec = "grading.results.record"
    allowed = lambda name: name == codec or name.startswith((f"{codec}.", "fa2_sandbox.wire.outcomes"))  # noqa: E731
    assert crossing("reporting", allowed) == []


def string_constants(package: str) -> dict:
    """{module file: the string literals it holds}, for every module under `package`."""
    return {str(path.relative_to(ROOT)): {node.value for node in ast.walk(ast.parse(path.read_text(), str(path)))
                                          if isinstance(node, ast.Constant) and isinstance(node.value, str)}
            for path in sorted((ROOT / package).rglob("*.py"))}


def test_the_wire_carries_no_page_styles():
    """The wire is the protocol of the runner, which draws no page: the styles base.html.j2 draws
    (`.badge.<style>`, `.check.<style>`) are named in reporting alone."""
    css = (ROOT / "reporting" / "templates" / "base.html.j2").read_text()
    styles = set(re.findall(r"\.(?:badge|check)\.([a-z_]+)", css))
    assert styles
    found = string_constants("fa2_sandbox/wire")
    assert found and [f"{w}: {s}" for w, strings in found.items() for s in sorted(strings & styles)] == []


def identifiers(package: str) -> dict:
    """{module file: every name it defines or reads (variables, attributes, fields, functions, arguments)}."""
    keys = ("id", "attr", "name", "arg", "asname")
    return {str(path.relative_to(ROOT)): {getattr(node, key) for node in ast.walk(ast.parse(path.read_text()))
                                          for key in keys if isinstance(getattr(node, key, None), str)}
            for path in sorted((ROOT / package).rglob("*.py"))}


def test_the_wire_carries_no_gradescope_statuses():
    """Gradescope's statuses are the Gradescope export's (grading/results/gradescope.py): a row of the
    wire says only whether its outcome counts as a pass, a fail or neither, so the runner's protocol
    names no Gradescope field or constant, and no row holds "passed" or "failed" but as its own word
    or page state (Gradescope's two words are also two outcomes' and two states')."""
    found = identifiers("fa2_sandbox/wire")
    assert found and [f"{w}: {n}" for w, names in found.items() for n in sorted(names)
                      if "gradescope" in n.lower()] == []
    rows = [*outcomes.OUTCOMES.values(), outcomes.row_of("someday_new")]
    assert [f"{row.word}: {f.name}" for row in rows for f in fields(row)
            if f.name not in ("word", "state") and getattr(row, f.name) in ("passed", "failed")] == []


def test_the_engine_calls_the_pages_through_their_one_entry_point():
    """The engine builds the pages with reporting.build_reports, and uses nothing else of them."""
    entry_point = lambda name: not name.startswith("reporting") or name == "reporting.build_reports"  # noqa: E731
    assert crossing("grading", entry_point) == []


def test_the_results_layer_reads_no_pages():
    results = {where: names for where, names in imports("grading").items() if where.startswith("grading/results/")}
    assert results and not [f"{w}: {n}" for w, names in results.items() for n in names if n.startswith("reporting")]


def engine_imports(prefix: str) -> dict:
    """{module file under grading/`prefix`: the grading modules it imports}."""
    return {where: {name for name in names if name.startswith("grading.")}
            for where, names in imports("grading").items() if where.startswith(f"grading/{prefix}")}


def test_the_diagnoses_read_the_baselines_not_the_checks():
    found = engine_imports("diagnoses/")
    assert found and [f"{w}: {n}" for w, names in found.items() for n in sorted(names)
                      if not n.startswith(("grading.baselines", "grading.diagnoses"))] == []


def test_the_baselines_import_nothing_of_the_engine():
    assert engine_imports("baselines.py") == {"grading/baselines.py": set()}


def test_the_checks_use_the_engine_below_them_never_its_plugins():
    """A check reaches its session through the `session` fixture, never by importing the plugins'
    modules: the checks are the engine's leaves."""
    below = ("grading.checks", "grading.diagnoses", "grading.baselines", "grading.matrix", "grading.tracks",
             "grading.check", "grading.results")
    found = engine_imports("checks/")
    assert found and [f"{w}: {n}" for w, names in found.items() for n in sorted(names)
                      if not n.startswith(below)] == []
