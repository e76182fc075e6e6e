"""Build the HTML reports, grades.csv and gradescope_scores.csv from reports/*/results.json.

    python -m reporting --reports reports [--student-view] [--keep-others]

Output depends only on the input files (no timestamps, sorted order), so rebuilding gives
byte-identical files and the reports can be diffed between grading runs.
"""
import argparse
import base64
import csv
import hashlib
import io
import sys
from importlib import resources
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from grading.results.record import add_others, left_out, points, read_class, write_whole

from . import classstats, plots, tracebacks
from .badges import badge_style
from .page_model import HIDDEN_VISIBILITY, load_all


def _points(x) -> str:
    """12.5 -> "12.5", 20.0 -> "20" (record.points, as everywhere); None -> a dash."""
    return "—" if x is None else points(x)


def make_env() -> Environment:
    # Autoescape on for every template: all text in results.json is student-influenced.
    env = Environment(loader=PackageLoader("reporting", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      keep_trailing_newline=True, extensions=["jinja2.ext.do"])
    env.filters.update(points=_points, num=plots.fmt, colour=plots.heat_colour_fraction,
                       pct=lambda f: "—" if f is None else f"{100 * f:.0f}%", badge_style=badge_style)
    env.globals.update(plots=plots, tracebacks=tracebacks, hidden_visibility=HIDDEN_VISIBILITY)
    return env


def _write(path: Path, text: str, written: list):
    """Whole or not at all: a page open in a browser during a rebuild is never half written."""
    write_whole(path, text)
    written.append(path)


def _cell(text) -> str:
    """Student-given text for a spreadsheet cell: one that starts like a formula (=, +, -, @) is
    quoted with a leading ' so that opening the CSV never runs it."""
    text = "" if text is None else str(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _identity(sub) -> list:
    """[student, student_id, email] for one row: a group's members joined with ", "."""
    return [_cell(", ".join(s[key] for s in sub.students if s[key])) for key in ("name", "sid", "email")]


STATES = ("final", "provisional", "incomplete", "ungradable")  # grades.csv's `state`, one per submission


def state(sub) -> str:
    """incomplete (a check the grader failed on or never ran, or results.json unreadable: regrade),
    ungradable (the adapters do not import: the total is 0, and final), provisional (checks that
    need a GPU were not graded on this machine and count 0), or final."""
    if sub.incomplete:
        return "incomplete"
    return "ungradable" if sub.ungradable else "provisional" if sub.provisional else "final"


def grades_csv(submissions) -> str:
    """One row per submission, every score a plain number a spreadsheet reads as one: name,
    student, student_id and email (a group's joined with ", "), then <part> and <part>_max for
    each part (both blank, not 0, where the part was not graded on the machine that graded it, or
    the submission has no such part: unknown), total, max, `state` (STATES: whether the total is
    final), seed, then <part>_requirements and <part>_advice for each part (the part's points on
    the course's requirements and on advice, beyond the handout; 0 advice for a part with none;
    blank where the part is, or where an older results.json does not say), then the notes."""
    part_keys = []
    for sub in submissions:
        part_keys += [p.key for p in sub.parts if p.key not in part_keys]

    def graded(sub, key):
        return next((p for p in sub.parts if p.key == key and p.graded), None)

    def split(sub, key, side):  # a part's requirement or advice points, blank where results.json does not say
        part = graded(sub, key)
        if part is None or part.advice_max_score is None:
            return ""
        return _points(part.requirement_score if side == "requirements" else part.advice_score)

    # The columns, each a header and how a submission fills it: the header row and every row come from this list.
    columns = [("name", lambda sub: sub.name),
               *((key, lambda sub, i=i: _identity(sub)[i]) for i, key in enumerate(("student", "student_id", "email"))),
               *((header, lambda sub, key=key, attr=attr: "" if (part := graded(sub, key)) is None
                  else _points(getattr(part, attr)))
                 for key in part_keys for header, attr in ((key, "score"), (f"{key}_max", "max_score"))),
               ("total", lambda sub: _points(sub.score)), ("max", lambda sub: _points(sub.max_score)),
               ("state", state),
               ("seed", lambda sub: "" if sub.seed is None else sub.seed),
               *((f"{key}_{side}", lambda sub, key=key, side=side: split(sub, key, side))
                 for key in part_keys for side in ("requirements", "advice")),
               ("notes", lambda sub: " ".join(sub.notes))]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([header for header, _ in columns])
    for sub in submissions:
        writer.writerow([value(sub) for _, value in columns])
    return out.getvalue()


# Gradescope's score upload matches a row to its roster by Email or SID. The columns are those of
# Gradescope's roster and score exports ("Name", "SID", "Email", "Total Score"): see the roster
# guide https://help.gradescope.com/article/w59nl02vyt-instructor-course-add-members (Name and
# Email columns) and the score export's "SID" and "Total Score" columns as read by
# https://gist.github.com/havron/554d0ffaec20a466a7f8ecca4d76c5da.
GRADESCOPE_COLUMNS = ["Name", "SID", "Email", "Total Score"]


def gradescope_csv(submissions) -> tuple[str, list]:
    """gradescope_scores.csv: one row per student (a group's members each get the group's total),
    and the warnings to print: rows Gradescope cannot match (no email and no SID), totals left
    blank because they are not final (incomplete, or provisional: checks not graded on this
    machine count 0), and students who appear in more than one submission."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(GRADESCOPE_COLUMNS)
    unmatched, not_final, seen = [], [], {}
    for sub in submissions:
        final = not (sub.incomplete or sub.provisional)
        if not final:
            not_final.append(sub.name)
        members = sub.students or [{"name": None, "sid": None, "email": None}]
        if any(not (m["sid"] or m["email"]) for m in members):
            unmatched.append(sub.name)
        for m in members:
            writer.writerow([_cell(m["name"] or sub.student or sub.name), _cell(m["sid"]), _cell(m["email"]),
                             _points(sub.score) if final else ""])
            for key in (m["sid"], m["email"] and m["email"].lower()):
                if key:
                    seen.setdefault(key, []).append(sub.name)
    warnings = []
    if unmatched:
        warnings.append(f"gradescope_scores.csv: no email or SID for {', '.join(unmatched)}: Gradescope cannot "
                        "match these rows to its roster (give them in submission.yaml, or grade with Gradescope's "
                        "submission_metadata).")
    if not_final:
        warnings.append(f"gradescope_scores.csv: total left blank for {', '.join(not_final)}: not final "
                        "(incomplete, or provisional); regrade before uploading.")
    for key, names in sorted(seen.items()):
        if len(set(names)) > 1:
            warnings.append(f"gradescope_scores.csv: {key} is in {len(set(names))} submissions "
                            f"({', '.join(sorted(set(names)))}): keep the row of the one that counts.")
    return out.getvalue(), warnings


def build_reports(reports_dir: Path, student_view: bool = False, keep_others: bool = False,
                  warn: bool = False) -> list:
    """Write <name>/index.html for each submission of the class, then index.html, grades.csv and
    gradescope_scores.csv. The class is what DIR/class.json lists (the last grading run's
    submissions), or every DIR/<name>/results.json where no run wrote one; keep_others makes every
    submission graded into DIR part of it. The rows not ready for Gradescope's upload are said on
    the class page, and with `warn` on stderr too (build-reports by hand: a grading run stays quiet).

    The class page and grades.csv are staff documents and always use every check; the student
    view only changes the per-submission pages.
    """
    reports_dir = Path(reports_dir)
    known = add_others(reports_dir) if keep_others else read_class(reports_dir)
    members = set(known["submissions"]) if known else None
    env = make_env()
    written = []
    page = env.get_template("submission.html.j2")
    for sub in load_all(reports_dir, student_view=student_view, names=members):
        _write(reports_dir / sub.name / "index.html", page.render(sub=sub), written)
    everyone = load_all(reports_dir, names=members)
    scores, warnings = gradescope_csv(everyone)
    sort_js = resources.files("reporting").joinpath("templates/sort.js").read_text(encoding="utf-8")
    class_page = env.get_template("class.html.j2").render(
        sort_js=Markup(sort_js),  # our own code, not data: it must not be HTML-escaped
        script_hash=_csp_hash(sort_js),
        subs=everyone,
        part_columns=_part_columns(everyone),
        histogram=plots.histogram_svg(classstats.histogram(everyone)),
        check_rates=classstats.check_rates(everyone),
        family_rates=classstats.family_rates(everyone),
        skipped=known["skipped"] if known else [],
        left_out=left_out(reports_dir, members),
        upload_warnings=warnings,
    )
    _write(reports_dir / "index.html", class_page, written)
    _write(reports_dir / "grades.csv", grades_csv(everyone), written)
    _write(reports_dir / "gradescope_scores.csv", scores, written)
    for line in warnings if warn else ():
        print(f"build-reports: warning: {line}", file=sys.stderr)
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
    parser.add_argument("--keep-others", action="store_true",
                        help="make every submission graded into the folder part of its class (default: the class "
                             "the last grading run wrote, DIR/class.json)")
    args = parser.parse_args(argv)
    if not args.reports.is_dir():
        print(f"build-reports: {args.reports} is not a folder", file=sys.stderr)
        return 2
    written = build_reports(args.reports, student_view=args.student_view, keep_others=args.keep_others, warn=True)
    pages = len(written) - 3
    if pages == 0:
        print(f"build-reports: no {args.reports}/*/results.json found", file=sys.stderr)
    print(f"build-reports: {pages} submission page{'s' * (pages != 1)}, {args.reports / 'index.html'}, "
          f"{args.reports / 'grades.csv'}, {args.reports / 'gradescope_scores.csv'}")
    return 0
