"""What the reporting tests share: the fake class in fixtures/results (written by
fixtures/make_results.py through the grader's own record type) and a reader of the pages' tables."""
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

FIXTURES = Path(__file__).parents[1] / "fixtures" / "results"
NAMES = ["alice", "bob", "carol", "dave", "erin"]
PARTS = ["flash_pytorch", "flash_triton", "ddp", "sharded_optimizer", "fsdp", "timing", "memory"]
PART_COLUMNS = [column for p in PARTS for column in (p, f"{p}_max")]
SPLIT_COLUMNS = [f"{p}_{kind}" for p in PARTS for kind in ("requirements", "advice")]  # every part, FSDP too


def fixture_json(name):
    return json.loads((FIXTURES / name / "results.json").read_text())


def copy_fixtures(dest: Path) -> Path:
    shutil.copytree(FIXTURES, dest)
    return dest


class Rows(HTMLParser):
    """Rows of the <tbody> of one table: [(tr attrs, [(td attrs, text)])]."""

    def __init__(self, table_id):
        super().__init__()
        self.table_id, self.depth, self.rows, self.in_body = table_id, 0, [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.depth += 1 if (self.depth or attrs.get("id") == self.table_id) else 0
        elif self.depth == 1 and tag == "tbody":
            self.in_body = True
        elif self.depth == 1 and self.in_body and tag == "tr":
            self.rows.append((attrs, []))
        elif self.depth == 1 and self.in_body and tag == "td":
            self.rows[-1][1].append([attrs, ""])

    def handle_endtag(self, tag):
        if tag == "table" and self.depth:
            self.depth -= 1
        elif tag == "tbody":
            self.in_body = False

    def handle_data(self, data):
        if self.depth == 1 and self.in_body and self.rows and self.rows[-1][1]:
            self.rows[-1][1][-1][1] += data


def table_rows(html: str, table_id: str):
    parser = Rows(table_id)
    parser.feed(html)
    return [(attrs, [(a, " ".join(t.split())) for a, t in cells]) for attrs, cells in parser.rows]
