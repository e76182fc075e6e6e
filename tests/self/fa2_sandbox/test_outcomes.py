"""The table of outcomes (fa2_sandbox/wire/outcomes.py): every word the runner and the harness can
end a call with is a row, each row says all a reader needs, and the pages draw a row's style,
never an outcome's word. Read from the source with ast and regular expressions: no runner starts."""
import ast
import re
from pathlib import Path

import pytest

from fa2_sandbox.harness.client import Reply
from fa2_sandbox.wire import outcomes
from grading.results.gradescope import status_of
from reporting import badges

ROOT = Path(__file__).resolve().parents[3]
TEMPLATES = ROOT / "reporting" / "templates"
PRODUCERS = sorted([*(ROOT / "fa2_sandbox" / "runner").glob("*.py"), *(ROOT / "fa2_sandbox" / "harness").glob("*.py")])
# The words the pages must not spell; "ok" (answered) also names a tensor's verdict, which the
# verdict table's rows are styled by: another thing entirely.
WORDS = {*outcomes.OUTCOMES, *outcomes.STATUSES, *outcomes.STATES} - {outcomes.OK}
# The runner's own word, passed on: client.py accepts it only from outcomes.ANSWERED.
PASSED_ON = {"message['status']"}


def produced_statuses() -> dict:
    """{status expression: where}: the first argument of every Reply(...) and the value of every
    "status" key of a dict literal in the runner and the harness."""
    found = {}
    for path in PRODUCERS:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            values = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Reply" and node.args:
                values.append(node.args[0])
            if isinstance(node, ast.Dict):
                values += [v for k, v in zip(node.keys, node.values)
                           if isinstance(k, ast.Constant) and k.value == "status"]
            while values:
                value = values.pop()
                if isinstance(value, ast.IfExp):  # X if ... else Y: both
                    values += [value.body, value.orelse]
                else:
                    found.setdefault(ast.unparse(value), f"{path.relative_to(ROOT)}:{value.lineno}")
    return found


def test_every_status_the_runner_or_the_harness_produces_is_a_row():
    produced = produced_statuses()
    assert "outcomes.NOT_RUN" in produced and "outcomes.TIMEOUT" in produced  # the scan finds them
    assert "not in outcomes.ANSWERED" in (ROOT / "fa2_sandbox" / "harness" / "client.py").read_text()
    for expression, where in produced.items():
        if expression in PASSED_ON:
            continue
        # a constant of the table, never a word spelt by hand: the word is then a row by construction
        assert expression.startswith("outcomes."), f"{where}: status {expression} is not a constant of outcomes.py"
        word = getattr(outcomes, expression.removeprefix("outcomes."))
        assert word in outcomes.STATUSES, f"{where}: {word!r} is not a row of outcomes.STATUSES"


def test_every_status_fails_a_check_with_an_outcome_of_the_table():
    for s in outcomes.STATUSES.values():
        assert s.made_by in (outcomes.RUNNER, outcomes.HARNESS, outcomes.RANK)
        assert s.fails_as is None or s.fails_as in outcomes.OUTCOMES, s
    assert [w for w, s in outcomes.STATUSES.items() if s.fails_as is None] == [outcomes.OK]
    assert outcomes.ANSWERED == (outcomes.OK, outcomes.ERROR, outcomes.NOT_ATTEMPTED)


def test_every_row_says_its_state_pass_or_fail_badge_and_sentence():
    for word, row in outcomes.OUTCOMES.items():
        assert row.word == word
        assert row.state in outcomes.STATES
        assert row.passes in (True, False, None)
        assert badges.STYLE_OF_OUTCOME.get(word) in badges.BADGES, f"reporting/badges.py gives {word} no style"
        assert row.sentence


# The meanings the grader always gave the words (verdicts and pages must not move): outcome ->
# (page state, Gradescope status, the badge's words).
MEANINGS = {"passed": ("passed", "passed", "passed"), "skipped": ("skipped", "passed", "skipped"),
            "failed": ("failed", "failed", "failed"), "error": ("failed", "failed", "error"),
            "not_attempted": ("failed", "failed", "not attempted"), "timeout": ("failed", "failed", "timeout"),
            "crash": ("failed", "failed", "crash"), "import_error": ("failed", "failed", "import error"),
            "grader_error": ("ungraded", None, "grader error"),
            "not_graded_here": ("not_here", None, "not graded here"),
            "someday_new": ("failed", "failed", "someday new")}  # a word no row knows: an older results.json


@pytest.mark.parametrize("word", MEANINGS)
def test_each_word_means_what_it_always_meant(word):
    row = outcomes.row_of(word)
    assert (row.state, status_of({"outcome": word}), row.label) == MEANINGS[word]
    assert outcomes.state_of(word) == MEANINGS[word][0]


def test_a_call_fails_a_check_with_its_own_status_or_as_an_error():
    assert {s: outcomes.outcome_of_call(s) for s in outcomes.STATUSES if s != outcomes.OK} == {
        "error": "error", "not_attempted": "not_attempted", "not_run": "error", "timeout": "timeout",
        "crash": "crash", "import_error": "import_error"}
    assert outcomes.outcome_of_call("forged") == "error"
    assert {w for w, s in outcomes.STATUSES.items() if s.unanswered} == {"error", "timeout", "crash"}
    assert outcomes.CALL_OUTCOMES == ("error", "not_attempted", "timeout", "crash", "import_error")
    assert set(outcomes.UNSETTLED) == {"grader_error", "not_graded_here"}


PREDICATES = {"ok": "ok", "raised": "error", "not_attempted": "not_attempted", "timed_out": "timeout",
              "crashed": "crash", "import_failed": "import_error"}


def test_a_reply_answers_predicates_rather_than_words():
    for status in outcomes.STATUSES:
        reply = Reply(status)
        assert {p for p in PREDICATES if getattr(reply, p)} == {p for p, s in PREDICATES.items() if s == status}
        assert reply.unanswered == outcomes.STATUSES[status].unanswered
        if status != outcomes.OK:
            assert reply.outcome == outcomes.outcome_of_call(status)


def test_every_badge_style_has_its_rule_and_no_rule_names_a_word():
    css = (TEMPLATES / "base.html.j2").read_text()
    for style in badges.BADGES:
        assert re.search(rf"\.badge\.{style}\b", css), f"base.html.j2 has no .badge.{style} rule"
    named = set(re.findall(r"\.(?:badge|check)\.([a-z_]+)", css))
    assert not named & WORDS, f"CSS rules key on outcome words: {sorted(named & WORDS)}"


@pytest.mark.parametrize("template", sorted(p.name for p in TEMPLATES.glob("*.j2")))
def test_no_template_spells_an_outcome_word(template):
    """The templates take a check's style, words and sentence from its row (check.row, a page
    model's by_state), so an outcome word in a template would be a second vocabulary."""
    text = (TEMPLATES / template).read_text()
    spelt = [w for w in WORDS if re.search(rf"""["']{w}["']""", text)]  # a string literal: "failed"
    assert not spelt, f"{template} spells {spelt}"
    classes = " ".join(re.findall(r'class="([^"]*)"', text))
    assert not set(re.findall(r"[a-z_]+", classes)) & WORDS, f"{template}: a class attribute holds an outcome word"
    assert not re.search(r'class="[^"]*\{\{[^}]*\.outcome\b', text), f"{template} makes a class of an outcome"
