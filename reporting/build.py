"""Build the HTML reports and grades.csv from reports/*/results.json.

    python -m reporting --reports reports [--student-view]

Output depends only on the input files (no timestamps, sorted order), so rebuilding gives
byte-identical files and the reports can be diffed between grading runs.
"""
import argparse
import base64
import csv
import hashlib
import io
import os
import sys
from importlib import resources
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from . import classstats, plots
from .page_model import HIDDEN_VISIBILITY, load_all


def _points(x) -> str:
    """12.5 -> "12.5", 20.0 -> "20": points are shown without trailing zeros."""
    if x is None:
        return "—"
    return f"{float(x):.2f}".rstrip("0").rstrip(".")


def make_env() -> Environment:
    # Autoescape on for every template: all text in results.json is student-influenced.
    env = Environment(loader=PackageLoader("reporting", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      keep_trailing_newline=True, extensions=["jinja2.ext.do"])
    env.filters.update(points=_points, num=plots.fmt, colour=plots.heat_colour_fraction,
                       pct=lambda f: "—" if f is None else f"{100 * f:.0f}%")
    env.globals.update(plots=plots, hidden_visibility=HIDDEN_VISIBILITY)
    return env


def _write(path: Path, text: str, written: list):
    """Whole or not at all: a page open in a browser during a rebuild is never half written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8", newline="\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    written.append(path)


def grades_csv(submissions) -> str:
    """One row per submission: the part scores, total, max and seed as before, then, for each
    part that has advice anywhere in the class, <part>_requirements and <part>_advice (blank
    where a results.json does not say), then the submission's notes, then `complete`: "no" where
    the total is not final (a check the grader itself failed on, or one never run; regrade), and
    then that total reads "<points> (incomplete)", so it cannot pass for a grade."""
    part_keys = []
    for sub in submissions:
        part_keys += [p.key for p in sub.parts if p.key not in part_keys]
    advice_keys = [k for k in part_keys
                   if any(p.key == k and p.advice_max_score is not None for sub in submissions for p in sub.parts)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["name", "student", *part_keys, "total", "max", "seed",
                     *(f"{k}_{kind}" for k in advice_keys for kind in ("requirements", "advice")), "notes",
                     "complete"])
    for sub in submissions:
        parts = {p.key: p for p in sub.parts}
        split = []
        for key in advice_keys:
            part = parts.get(key)
            if part is None or part.advice_max_score is None:
                split += ["", ""]
            else:
                split += [_points(part.requirement_score), _points(part.advice_score)]
        writer.writerow([sub.name, sub.student or "",
                         *(_points(parts[k].score) if k in parts else "" for k in part_keys),
                         _points(sub.score) + (" (incomplete)" if sub.incomplete else ""), _points(sub.max_score),
                         "" if sub.seed is None else sub.seed,
                         *split, " ".join(sub.notes), "no" if sub.incomplete else "yes"])
    return out.getvalue()


def build_reports(reports_dir: Path, student_view: bool = False) -> list:
    """Write <name>/index.html for each results.json, then index.html and grades.csv.

    The class page and grades.csv are staff documents and always use every check; the student
    view only changes the per-submission pages.
    """
    reports_dir = Path(reports_dir)
    env = make_env()
    written = []
    page = env.get_template("submission.html.j2")
    for sub in load_all(reports_dir, student_view=student_view):
        _write(reports_dir / sub.name / "index.html", page.render(sub=sub), written)
    everyone = load_all(reports_dir)
    sort_js = resources.files("reporting").joinpath("templates/sort.js").read_text(encoding="utf-8")
    class_page = env.get_template("class.html.j2").render(
        sort_js=Markup(sort_js),  # our own code, not data: it must not be HTML-escaped
        script_hash=_csp_hash(sort_js),
        subs=everyone,
        part_columns=_part_columns(everyone),
        histogram=plots.histogram_svg(classstats.histogram(everyone)),
        check_rates=classstats.check_rates(everyone),
        family_rates=classstats.family_rates(everyone),
    )
    _write(reports_dir / "index.html", class_page, written)
    _write(reports_dir / "grades.csv", grades_csv(everyone), written)
    return written


def _csp_hash(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    return f"'sha256-{digest}'"


def _part_columns(submissions) -> list:
    """[(key, label)] over the whole class, in the first-seen (course) order."""
    columns = {}
    for sub in submissions:
        for part in sub.parts:
            columns.setdefault(part.key, part.label)
    return list(columns.items())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="build-reports", description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=Path("reports"),
                        help="folder holding <name>/results.json (default: reports)")
    parser.add_argument("--student-view", action="store_true",
                        help="leave hidden checks out of the per-submission pages")
    args = parser.parse_args(argv)
    if not args.reports.is_dir():
        print(f"build-reports: {args.reports} is not a folder", file=sys.stderr)
        return 2
    written = build_reports(args.reports, student_view=args.student_view)
    pages = len(written) - 2
    if pages == 0:
        print(f"build-reports: no {args.reports}/*/results.json found", file=sys.stderr)
    print(f"build-reports: {pages} submission page(s), {args.reports / 'index.html'}, "
          f"{args.reports / 'grades.csv'}")
    return 0
