"""How each outcome's badge looks on the pages: the style reporting/templates/base.html.j2 draws as
`.badge.<style>` (and `.check.<style>`, a failed check's card, where the style has one).

The styles are named for how they look, never for an outcome, so a new outcome (its row in
fa2_sandbox/wire/outcomes.py OUTCOMES) picks one here and the CSS does not change. They live here
rather than on the wire: the runner speaks the outcome words and draws no page.
"""
from fa2_sandbox.wire import outcomes

GOOD, BAD, SLOW, DIRE, STUB, NEUTRAL, ALARM = "good", "bad", "slow", "dire", "stub", "neutral", "alarm"
PLAIN = "plain"  # an outcome this table does not know (an older results.json): no rule, grey
BADGES = (GOOD, BAD, SLOW, DIRE, STUB, NEUTRAL, ALARM)

STYLE_OF_OUTCOME = {
    outcomes.PASSED: GOOD,
    outcomes.FAILED: BAD,
    outcomes.SKIPPED: NEUTRAL,
    outcomes.NOT_GRADED_HERE: NEUTRAL,
    outcomes.GRADER_ERROR: ALARM,
    outcomes.ERROR: BAD,
    outcomes.NOT_ATTEMPTED: STUB,
    outcomes.TIMEOUT: SLOW,
    outcomes.CRASH: DIRE,
    outcomes.IMPORT_ERROR: BAD,
}

# The badge of a check that never ran (scoring lists it as not graded, with no record, so no
# outcome): what the pages show beside a grader error's, as an outcomes.Outcome row like the others;
# its words are the runner's for a scenario never reached ("not run").
NEVER_RUN = outcomes.Outcome(outcomes.NOT_RUN, outcomes.STATE_UNGRADED, None,
                             "never run: no result was recorded for this check; it counts 0 until regraded")


def badge_style(row: outcomes.Outcome) -> str:
    """The style of `row`'s badge, by its word: an outcome the table does not know is PLAIN, and so
    is a results.json's own "not_run" outcome, which is not NEVER_RUN."""
    if row is NEVER_RUN:
        return ALARM
    return STYLE_OF_OUTCOME.get(row.word, PLAIN)
