"""The built pages in a real browser: headless Chromium, driven from the command line.

Each test starts Chromium with --dump-dom (the DOM after the page's own script ran) and
--enable-logging=stderr, which prints every console message, uncaught exception and CSP
violation as an "INFO:CONSOLE" line. The sort is exercised through the page's own "#sort=col"
hook, which clicks the header, so the real click handler runs. Screenshots go to
reports/screenshots/ for a person to look at.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pytest

from reporting import build_reports

from .pages import FIXTURES, NAMES, PARTS, fixture_json, table_rows

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                "(apt-get install -y chromium); the browser checks did not run")
SCREENSHOTS = Path(__file__).parents[3] / "reports" / "screenshots"
# Flags that keep Chromium from reaching the network or a desktop session.
QUIET = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


@dataclass
class Loaded:
    dom: str
    console: list  # the page's console messages, errors included


def load(url: str, screenshot: Path = None, window=(1280, 1000), flags=()) -> Loaded:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [CHROMIUM, *QUIET, *flags, f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}"]
        if screenshot:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.unlink(missing_ok=True)
            cmd.append(f"--screenshot={screenshot}")
        proc = subprocess.run([*cmd, "--dump-dom", url], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "</html>" in proc.stdout, "Chromium printed no DOM"
    if screenshot:
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"no screenshot at {screenshot}"
    return Loaded(proc.stdout, [line for line in proc.stderr.splitlines() if ":CONSOLE" in line])


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    reports = tmp_path_factory.mktemp("browser") / "reports"
    shutil.copytree(FIXTURES, reports)
    build_reports(reports)
    return reports


def test_console_errors_are_seen(tmp_path):
    """The detector itself: without this, "no console errors" could be vacuous."""
    page = tmp_path / "canary.html"
    page.write_text('<!DOCTYPE html><html><body><script>null.canary();</script></body></html>')
    console = load(page.as_uri()).console
    assert any("Uncaught TypeError" in line and "canary" in line for line in console), console


def class_order(dom: str):
    return [attrs["data-name"] for attrs, _ in table_rows(dom, "class-table")]


def test_class_page_loads_cleanly_and_sorts_by_score(reports):
    page = load(reports.joinpath("index.html").as_uri() + "#sort=score",
                screenshot=SCREENSHOTS / "class.png", window=(1360, 1500))
    assert page.console == []
    assert '<html lang="en" data-sort-ready="yes">' in page.dom  # the script ran to its end
    scores = {n: fixture_json(n)["score"] for n in NAMES}
    assert class_order(page.dom) == sorted(NAMES, key=lambda n: scores[n])  # stable for bob = carol
    assert class_order(page.dom) != NAMES
    assert '<th data-col="score" class="num" tabindex="0" aria-sort="ascending">' in page.dom
    assert page.dom.count("<svg") == 1 and 'aria-label="score histogram"' in page.dom


@pytest.mark.parametrize("clicks, expected", [
    ("score,score", ["alice", "bob", "carol", "erin", "dave"]),  # second click: descending, stable
    ("name,name", ["erin", "dave", "carol", "bob", "alice"]),
    ("part-ddp", ["dave", "erin", "carol", "alice", "bob"]),  # by fraction: 0, 0, 2/3, 1, 1
    ("part-timing", ["erin", "dave", "bob", "carol", "alice"]),  # "not scored" (-1) sorts first
])
def test_class_table_sorts_by_any_column(reports, clicks, expected):
    page = load(reports.joinpath("index.html").as_uri() + f"#sort={clicks}")
    assert page.console == []
    assert class_order(page.dom) == expected


def visible(dom: str):
    """The class table's rows not hidden, in page order, and the part columns not hidden."""
    rows = [attrs["data-name"] for attrs, _ in table_rows(dom, "class-table") if "hidden" not in attrs]
    headers = re.findall(r'<th data-col="part-\w+" data-part="(\w+)"([^>]*)>', dom)
    return rows, [key for key, rest in headers if "hidden" not in rest]


# The filters are set through the address ("#only=failing", "#part=ddp"), which ticks the box and
# picks the option, then fires their change event: the handlers a person's click runs.
@pytest.mark.parametrize("setting, rows, parts", [
    ("only=failing", ["bob", "carol", "dave", "erin"], PARTS),  # alice has full marks
    ("part=ddp", ["dave", "erin", "carol", "alice", "bob"], ["ddp"]),  # every row, worst ddp first
    ("only=failing&part=ddp", ["dave", "erin", "carol"], ["ddp"]),
    # below full marks in timing: bob, carol (1.5/2), dave (not final); erin's is not scored
    ("part=timing&only=failing", ["dave", "bob", "carol"], ["timing"]),
    ("sort=name,name&only=failing", ["erin", "dave", "carol", "bob"], PARTS),  # sorting keeps the filter
])
def test_class_table_filters(reports, setting, rows, parts):
    page = load(reports.joinpath("index.html").as_uri() + f"#{setting}")
    assert page.console == []
    assert '<div id="class-filters" class="filters">' in page.dom  # the script showed the controls
    assert visible(page.dom) == (rows, parts)
    assert f'<output id="filter-count" aria-live="polite">showing {len(rows)} of {len(NAMES)}</output>' in page.dom
    for attrs, cells in table_rows(page.dom, "class-table"):  # each row shows the chosen part's cell alone
        assert [c["data-part"] for c, _ in cells if "data-part" in c and "hidden" not in c] == parts
    if "part=" in setting:  # one part: sorted by it, worst first
        key = setting.split("part=")[1].split("&")[0]
        assert f'<th data-col="part-{key}" data-part="{key}" class="num" tabindex="0" aria-sort="ascending">' \
            in page.dom


def test_filtered_class_page_screenshot(reports):
    page = load(reports.joinpath("index.html").as_uri() + "#only=failing&part=ddp",
                screenshot=SCREENSHOTS / "class-filtered.png", window=(1360, 900))
    assert page.console == []
    assert visible(page.dom) == (["dave", "erin", "carol"], ["ddp"])


# Reads what is displayed into an attribute of <body>, for --dump-dom to print.
PROBE = """<script>
var shown = function (list) { return Array.prototype.filter.call(list, function (e) { return e.offsetWidth > 0; }); };
document.body.setAttribute("data-probe", JSON.stringify({
  filters: getComputedStyle(document.getElementById("class-filters")).display,
  rows: shown(document.querySelectorAll("#class-table tbody tr")).map(function (r) { return r.dataset.name; }),
  parts: shown(document.querySelectorAll("#class-table th[data-part]")).map(function (h) { return h.dataset.part; })}));
</script>"""


def test_without_its_script_every_row_shows_and_no_control(reports):
    """As with JavaScript off: the page without its script shows every row and part and no filter
    control. (--dump-dom needs JavaScript itself, so the page's script is taken out, with the CSP
    that would block the probe, and a probe of ours reads what is displayed.)"""
    html = reports.joinpath("index.html").read_text()
    html, scripts = re.subn(r"<script>.*?</script>", "", html, flags=re.S)
    html, policies = re.subn(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
    assert (scripts, policies) == (1, 1)
    page = reports / "without-script.html"  # beside index.html, so its links still resolve
    page.write_text(html.replace("</body>", PROBE + "</body>"))
    dom = load(page.as_uri() + "#only=failing&part=ddp").dom
    probe = json.loads(unescape(re.search(r'<body data-probe="([^"]*)"', dom).group(1)))
    assert probe == {"filters": "none", "rows": NAMES, "parts": PARTS}


def test_pass_rate_table_sorts_numerically(reports):
    page = load(reports.joinpath("index.html").as_uri() + "#sort=family-fail")
    assert page.console == []
    fractions = [float(cells[1][0]["data-sort"]) for _, cells in table_rows(page.dom, "family-rates")]
    assert fractions == sorted(fractions) and fractions[0] < fractions[-1]


def test_submission_page_with_failures(reports):
    page = load(reports.joinpath("bob", "index.html").as_uri(),
                screenshot=SCREENSHOTS / "bob.png", window=(1280, 2600))
    assert page.console == []
    assert 'aria-label="heatmap of dk error per tile"' in page.dom
    assert 'aria-label="heatmap of dq error per tile"' in page.dom
    assert 'aria-label="timing chart"' in page.dom


def test_injected_student_output_stays_text(reports):
    """carol's runner log holds <script> and <img onerror>: in the DOM they must be text."""
    page = load(reports.joinpath("carol", "index.html").as_uri(),
                screenshot=SCREENSHOTS / "carol.png", window=(1280, 2300))
    assert page.console == []
    assert "<img" not in page.dom and "<script" not in page.dom
    assert "&lt;script&gt;alert('pwned')&lt;/script&gt;" in page.dom
    assert 'aria-label="memory chart"' in page.dom


# A real class: FA2_BROWSER_REPORTS=DIR names the reports of a grading run (the course corpus on a
# GPU, say: notes/corpus-class.md). Its pages are rebuilt from its results.json with today's
# templates into a copy, then read in the browser like the fixtures' and photographed.
REAL = os.environ.get("FA2_BROWSER_REPORTS")


@pytest.fixture(scope="module")
def real_class(tmp_path_factory):
    if not REAL:
        pytest.skip("FA2_BROWSER_REPORTS is not set: no real class's reports to look at")
    reports = tmp_path_factory.mktemp("real") / "reports"
    for results in Path(REAL).glob("*/results.json"):
        (reports / results.parent.name).mkdir(parents=True)
        shutil.copyfile(results, reports / results.parent.name / "results.json")
    build_reports(reports)
    return reports


def test_a_real_class_page(real_class):
    names = sorted(p.parent.name for p in real_class.glob("*/results.json"))
    page = load(real_class.joinpath("index.html").as_uri() + "#sort=score",
                screenshot=SCREENSHOTS / "real-class.png", window=(1500, 2400))
    assert page.console == []
    assert sorted(class_order(page.dom)) == names  # every submission has its row
    scores = [float(attrs["data-sort"]) for _, cells in table_rows(page.dom, "class-table")
              for attrs, _ in cells[1:2]]
    assert scores == sorted(scores)
    filtered = load(real_class.joinpath("index.html").as_uri() + "#only=failing&part=flash_triton",
                    screenshot=SCREENSHOTS / "real-class-triton-failing.png", window=(1500, 1600))
    rows, parts = visible(filtered.dom)
    assert filtered.console == [] and parts == ["flash_triton"] and set(rows) <= set(names)


def test_a_real_student_page(real_class):
    """The page of the class's lowest score among submissions that could be graded: the one a
    TA opens first."""
    graded = [json.loads(p.read_text()) for p in real_class.glob("*/results.json")]
    worst = min((r for r in graded if not r["extra_data"].get("ungradable")), key=lambda r: r["score"])
    name = worst["extra_data"]["submission"]
    page = load(real_class.joinpath(name, "index.html").as_uri(),
                screenshot=SCREENSHOTS / "real-student.png", window=(1280, 3000))
    assert page.console == []
    assert "Failed checks (" in page.dom and "Course requirements" in page.dom
