"""Read reports/<name>/results.json into what the templates show: a SubmissionReport per file,
its parts, and its checks as grading.results.record.CheckRecord (CheckRecord.from_json: each entry
of results.json is a check file's JSON plus its score, read with the check file's own codec).

results.json is written by the grading plugin, but everything in it is treated as untrusted and
possibly incomplete: a missing key degrades to a dash, never a crash, because a page that fails
to build hides the very submission someone needs to look at.

Parts come in the order results.json lists them (the rubric's, as scoring.assemble writes
them), labelled as it labels them, the part's key standing in for a missing label.
"""
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from fa2_sandbox.wire import outcomes
from grading.results.record import CheckRecord, as_dict, as_number, as_text

from .badges import NEVER_RUN

# Gradescope shows these to students only later, so the student view leaves them out entirely.
HIDDEN_VISIBILITY = {"hidden", "after_due_date", "after_published"}
ENVIRONMENT_KEYS = ("device", "torch", "triton", "triton_interpreter", "python")


@dataclass
class Part:
    key: str
    label: str
    score: float
    max_score: float
    # The advice share of score / max_score; None when results.json does not say (older files).
    advice_score: float | None = None
    advice_max_score: float | None = None
    # False when none of the part's checks could be graded on the machine that graded it (they
    # need a GPU): its score is not 0 but unknown, and grades.csv leaves it blank.
    graded: bool = True

    @property
    def fraction(self):
        return self.score / self.max_score if self.max_score else None

    @property
    def has_advice(self):
        """True when some of this part's points are advice, shown apart from the requirements."""
        return bool(self.advice_max_score)

    @property
    def requirement_score(self):
        return self.score - (self.advice_score or 0.0)

    @property
    def requirement_max_score(self):
        return self.max_score - (self.advice_max_score or 0.0)


@dataclass
class GpuWait:
    """The checks of one part that a GPU will still grade (not graded on this machine)."""
    label: str
    checks: int
    points: float
    why: str


def _needs_gpu_reason(check) -> str:
    """Why a check was not graded here ("it needs a GPU: ..."), without the words every such
    check's output starts with."""
    return (check.diagnosis or check.output).strip().partition("\n")[0].removeprefix("not graded here: ")


@dataclass
class SubmissionReport:
    """One submission's results.json, as its page shows it."""
    name: str
    student: str | None
    score: float
    max_score: float
    parts: list
    environment: dict
    seed: object
    ungradable: str | None
    runner_log: str
    output: str
    wall_seconds: float | None  # its grading run's wall clock, from its first check to its last; None if unknown
    check_seconds: float | None  # its checks' own times, summed (they overlap under -n)
    checks: list  # [CheckRecord]
    student_view: bool = False
    hidden_count: int = 0
    stdout_visible: bool = True
    notes: list = field(default_factory=list)  # sentences about the whole submission to act on
    # Not final: some checks were not graded (the grader itself failed, or they never ran).
    incomplete: bool = False
    interrupted: str | None = None  # "not graded (Slurm job 12_3 ended: TIMEOUT)"
    ungraded: list = field(default_factory=list)  # [{"name", "reason"}]: the checks not graded, as shown
    hidden_ungraded: int = 0  # ungraded checks left out of the student view
    checks_graded: int | None = None
    checks_expected: int | None = None
    # Provisional: some checks need a GPU and were not graded on this machine; they count 0 for now.
    provisional: bool = False
    # How the runner was confined: {"mode": "namespace" | "uid" | "userns" | "none", "note": a
    # sentence}, or {} when results.json does not say (an older grader, or no runner started).
    isolation: dict = field(default_factory=dict)

    @property
    def isolated(self):
        """False when the student's code ran with the grader's own rights; None when unknown.
        "userns" counts as isolated (namespaces confine it) though its uid is the grader's:
        `isolation_caveat` says so."""
        mode = as_text(self.isolation.get("mode"))
        return None if not mode else mode != "none"

    @property
    def isolation_caveat(self) -> str:
        """What the page says before the note where the confinement is weaker than a uid of its own."""
        if as_text(self.isolation.get("mode")) == "userns":
            return "user namespaces only, no uid of its own (outside them it ran as the grading user)"
        return ""
    student_id: str | None = None  # a group's joined with ", ", like `student`
    email: str | None = None
    students: list = field(default_factory=list)  # [{"name", "sid", "email"}] (None where unknown), one a member

    @property
    def runner_output(self) -> dict:
        """The runner log split by who wrote each line (split_runner_log)."""
        return split_runner_log(self.runner_log)

    @property
    def incomplete_reason(self):
        """Why the total is not final, in one sentence ("" when it is final)."""
        if not self.incomplete:
            return ""
        if self.ungradable and self.ungradable.startswith("results.json could not be read"):
            return "results.json could not be read: the total is not final; regrade."
        if self.student_view:
            count = len(self.ungraded) + self.hidden_ungraded
            return f"{count} check{'s' if count != 1 else ''} not graded yet: the total is not final."
        if self.interrupted:  # the grading run of this submission ended early, and says why
            return f"{self.interrupted}: the total is not final; regrade."
        broken = sum(1 for u in self.ungraded if u["name"])
        never = len(self.ungraded) - broken
        why = ([f"the grader itself failed on {broken}"] if broken else []) + ([f"{never} never ran"] if never else [])
        if self.checks_expected is not None and self.checks_graded is not None:
            head = f"{self.checks_graded} of {self.checks_expected} checks graded"
        else:
            head = f"{len(self.ungraded)} check{'s' if len(self.ungraded) != 1 else ''} not graded"
        return f"{head}{' (' + ', '.join(why) + ')' if why else ''}: the total is not final; regrade."

    @property
    def waiting_for_gpu(self) -> list:
        """What a GPU will still grade, a part a row in the page's order: [GpuWait]. Its reason is
        the one most of the part's checks give."""
        rows = []
        for part in self.parts:
            checks = [c for c in self.checks if c.state == outcomes.STATE_NOT_HERE and c.part == part.key]
            if checks:
                reasons = Counter(_needs_gpu_reason(c) for c in checks)
                rows.append(GpuWait(part.label, len(checks), sum(c.max_score for c in checks),
                                    reasons.most_common(1)[0][0]))
        return rows

    def part(self, key):
        return next((p for p in self.parts if p.key == key), None)

    def shown_cause(self, check):
        """The failed check of this page that `check`'s failure comes from (its see_also: the forward
        check of a case whose call got no answer, say), or None where that check is not on the page
        or did not fail: the page links only to what it shows."""
        if not check.see_also:
            return None
        return next((c for c in self.checks if c.local_name == check.see_also and c is not check
                     and c.state == outcomes.STATE_FAILED), None)

    def by_state(self, checks=None):
        """The checks (all, or `checks`) by page state: .failed, .passed, .skipped, .ungraded,
        .not_here (outcomes.STATES), so a template names a section rather than spell a word."""
        checks = self.checks if checks is None else checks
        return SimpleNamespace(**{state: [c for c in checks if c.state == state] for state in outcomes.STATES})

    @property
    def failed_by_part(self):
        """[(Part, [CheckRecord])] in part order; only parts with failures."""
        return self.failed_by_part_in(self.checks)

    def failed_by_part_in(self, checks):
        """The same for a subset of the checks (one section of the page)."""
        groups = []
        for part in self.parts:
            failed = [c for c in checks if c.state == outcomes.STATE_FAILED and c.part == part.key]
            if failed:
                groups.append((part, failed))
        return groups

    @property
    def sections(self):
        """[(kind, [CheckRecord])] for the page: ("requirements", ...) then ("advice", ...) when the
        results say where checks come from; one ("all", ...) for older results that do not."""
        if not any(c.source or c.advice for c in self.checks):
            return [("all", self.checks)]
        sections = [("requirements", [c for c in self.checks if not c.advice])]
        advice = [c for c in self.checks if c.advice]
        if advice:
            sections.append(("advice", advice))
        return sections

    @property
    def advice_score(self):
        return sum(p.advice_score or 0.0 for p in self.parts)

    @property
    def advice_max_score(self):
        return sum(p.advice_max_score or 0.0 for p in self.parts)

    @staticmethod
    def by_diagnosis(checks):
        """[[CheckRecord]]: checks sharing a diagnosis, in first-seen order.

        A page with 23 copies of "not attempted: ... raised NotImplementedError" buries the one
        failure that matters; one card per diagnosis keeps it short.
        """
        groups = {}
        for check in checks:
            groups.setdefault(check.diagnosis, []).append(check)
        return list(groups.values())

    @property
    def top_diagnosis(self):
        """The diagnosis shared by most failed checks, among work that was attempted ('not
        attempted' says less than the bug in what was) and among the course's requirements
        before advice; ties go to the first in part order, forward checks first (a wrong
        forward is usually why the backward is wrong too)."""
        if self.ungradable:
            return self.ungradable
        failed = [c for _, checks in self.failed_by_part for c in sorted(checks, key=lambda c: c.check != "forward")]
        failed = [c for c in failed if not c.advice] or failed
        pool = [c for c in failed if c.outcome != outcomes.NOT_ATTEMPTED] or failed
        counts = Counter(c.diagnosis for c in pool)
        return max(pool, key=lambda c: counts[c.diagnosis]).diagnosis if pool else ""

    @property
    def fraction(self):
        return self.score / self.max_score if self.max_score else None


# Lines of a runner's log that its own code did not print: the grader's notes ("[grader] ...", the
# runner's "[runner] ...", "--- the runner of <track> ---" between tracks' logs), torch's C++ log
# ("[W1128 02:48:10.716180679 socket.cpp:207] [c10d] The hostname of the client socket cannot be
# retrieved", glog's prefix: severity, date, time, file:line) and warnings raised in torch's or
# Triton's Python (their source line after them, indented).
GRADER_LINE = re.compile(r"^(\[grader\] |\[runner\] |--- the runner of .* ---$)")
TORCH_LOG_LINE = re.compile(r"^\[[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ [^\]]*\] ")
LIBRARY_WARNING = re.compile(r"^\S*[/\\](torch|triton)[/\\]\S*\.py:\d+: \w*Warning: ")


def split_runner_log(text: str) -> dict:
    """{"own": lines the submission printed, "torch": lines from torch or Triton, "grader": the
    grader's notes}, each a text, from a runner log tail."""
    found = {"own": [], "torch": [], "grader": []}
    after_warning = False
    for line in text.splitlines():
        if GRADER_LINE.match(line):
            kind = "grader"
        elif TORCH_LOG_LINE.match(line) or LIBRARY_WARNING.match(line) or (after_warning and line[:1].isspace()):
            kind = "torch"
        else:
            kind = "own"
        after_warning = bool(LIBRARY_WARNING.match(line))
        found[kind].append(line)
    return {kind: "\n".join(lines).strip("\n") for kind, lines in found.items()}


def _notes(value) -> list:
    """extra_data.notes: a list of sentences (a lone string is taken as one)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return []
    return [as_text(n).strip() for n in value if as_text(n).strip()]


def _students(extra: dict) -> list:
    """extra_data.students as [{"name", "sid", "email"}], else the one student results.json names
    (older files, and submission.yaml's student): [] when it names no one."""
    found = []
    for entry in extra.get("students") if isinstance(extra.get("students"), list) else []:
        entry = as_dict(entry)
        student = {key: as_text(entry.get(key)).strip() or None for key in ("name", "sid", "email")}
        if any(student.values()):
            found.append(student)
    if not found:
        student = {key: as_text(extra.get(source)).strip() or None
                   for key, source in (("name", "student"), ("sid", "student_id"), ("email", "email"))}
        found = [student] if any(student.values()) else []
    return found


def _count(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ungraded(value, checks) -> list:
    """extra_data.ungraded as [{"name", "check_id", "reason"}] (name None: a check never run, known
    only by its test id), plus any grader-error check the list lacks."""
    found = []
    for entry in value if isinstance(value, list) else []:
        if isinstance(entry, str):
            entry = {"name": entry}
        if not isinstance(entry, dict):
            continue
        name = as_text(entry.get("name")) or None
        # an earlier grader's results.json holds it under "nodeid": a rebuild of its pages still lists it
        check_id = as_text(entry.get("check_id") or entry.get("nodeid")) or None
        if name or check_id:
            found.append({"name": name, "check_id": check_id, "reason": as_text(entry.get("reason")) or "not graded",
                          "row": outcomes.row_of(outcomes.GRADER_ERROR) if name else NEVER_RUN})
    named = {u["name"] for u in found}
    found += [{"name": c.name, "check_id": None, "reason": c.diagnosis or "the grader itself failed", "row": c.row}
              for c in checks if c.state == outcomes.STATE_UNGRADED and c.name not in named]
    return found


def _parts(declared: dict, checks: list, from_checks: bool) -> list:
    """Parts in results.json's order (the rubric's), then any other part a check names; scores
    summed from `checks` if asked.

    The advice share comes from the part's advice_score / advice_max_score, else from its
    checks marked advice; a part with neither has None (nothing to show apart).
    """
    keys = list(declared)
    keys += [key for key in dict.fromkeys(c.part for c in checks) if key not in declared]
    parts = []
    for key in keys:
        info = as_dict(declared.get(key))
        label = as_text(info.get("label")) or key
        mine = [c for c in checks if c.part == key]
        advice = [c for c in mine if c.advice]
        if from_checks or not info:
            part = Part(key, label, sum(c.score for c in mine), sum(c.max_score for c in mine))
        else:
            part = Part(key, label, as_number(info.get("score")), as_number(info.get("max_score")))
        if from_checks or not info:
            # not graded: some of its checks need a GPU, and none of the others was graded either
            part.graded = all(c.state != outcomes.STATE_NOT_HERE for c in mine) or \
                any(c.state not in (outcomes.STATE_NOT_HERE, outcomes.STATE_SKIPPED) for c in mine)
        else:
            part.graded = info.get("graded") is not False
        if not from_checks and "advice_max_score" in info:
            part.advice_score = as_number(info.get("advice_score"))
            part.advice_max_score = as_number(info.get("advice_max_score"))
        elif advice:
            part.advice_score = sum(c.score for c in advice)
            part.advice_max_score = sum(c.max_score for c in advice)
        parts.append(part)
    return parts


def load_report(path: Path, student_view: bool = False) -> SubmissionReport:
    """One results.json; an unreadable file still gives a SubmissionReport that says why."""
    name = path.parent.name
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("top level is not a JSON object")
    except (OSError, ValueError) as exc:
        return SubmissionReport(name=name, student=None, score=0.0, max_score=0.0, parts=[],
                                environment=dict.fromkeys(ENVIRONMENT_KEYS), seed=None,
                                ungradable=f"results.json could not be read: {exc}", runner_log="",
                                output="", wall_seconds=None, check_seconds=None, checks=[],
                                student_view=student_view,
                                incomplete=True)
    extra = as_dict(data.get("extra_data"))
    default_visibility = as_text(data.get("visibility")) or "visible"
    submission = as_text(extra.get("submission")) or name
    checks = [CheckRecord.from_json(t, submission, default_visibility)
              for t in data.get("tests") or [] if isinstance(t, dict)]
    hidden_count = 0
    if student_view:
        visible = [c for c in checks if c.visibility not in HIDDEN_VISIBILITY]
        hidden_count = len(checks) - len(visible)
        checks = visible
    parts = _parts(as_dict(extra.get("parts")), checks, from_checks=student_view)
    if student_view:
        score = sum(c.score for c in checks)
        max_score = sum(c.max_score for c in checks)
    else:
        score = as_number(data.get("score"), sum(c.score for c in checks))
        max_score = as_number(data.get("max_score"), sum(p.max_score for p in parts))
    # A results.json older than wall_seconds held the checks' summed times as execution_time.
    check_seconds = extra.get("check_seconds", data.get("execution_time"))
    ungraded = _ungraded(extra.get("ungraded"), checks)
    hidden_ungraded = 0
    if student_view:  # a hidden check's name or test id is not for the student's page
        shown = {c.name for c in checks}
        hidden_ungraded = sum(1 for u in ungraded if u["name"] not in shown)
        ungraded = [u for u in ungraded if u["name"] in shown]
    incomplete = extra.get("incomplete") is True or bool(ungraded) or bool(hidden_ungraded)
    return SubmissionReport(
        name=name,
        student=as_text(extra.get("student")) or None,
        student_id=as_text(extra.get("student_id")) or None, email=as_text(extra.get("email")) or None,
        students=_students(extra),
        score=score, max_score=max_score, parts=parts,
        environment={k: as_dict(extra.get("environment")).get(k) for k in ENVIRONMENT_KEYS},
        seed=extra.get("seed"),
        ungradable=as_text(extra.get("ungradable")) or None,
        runner_log=as_text(extra.get("runner_log_tail")),
        output=as_text(data.get("output")),
        wall_seconds=as_number(extra.get("wall_seconds"), None) if extra.get("wall_seconds") is not None else None,
        check_seconds=as_number(check_seconds, None) if check_seconds is not None else None,
        checks=checks, student_view=student_view, hidden_count=hidden_count,
        stdout_visible=as_text(data.get("stdout_visibility")) == "visible",
        notes=_notes(extra.get("notes")),
        incomplete=incomplete, ungraded=ungraded, hidden_ungraded=hidden_ungraded,
        interrupted=as_text(extra.get("interrupted")) or None,
        checks_graded=_count(extra.get("checks_graded")), checks_expected=_count(extra.get("checks_expected")),
        # Ungradable says it all: its total is not also provisional.
        provisional=not extra.get("ungradable") and (extra.get("provisional") is True
                                                     or any(c.state == outcomes.STATE_NOT_HERE for c in checks)),
        isolation={k: as_text(v) for k, v in as_dict(extra.get("isolation")).items() if k in ("mode", "note")},
    )


def load_all(reports_dir: Path, student_view: bool = False, names=None) -> list:
    """Every <name>/results.json of the folder, by name; `names`: only those submissions."""
    return [load_report(p, student_view) for p in sorted(Path(reports_dir).glob("*/results.json"))
            if names is None or p.parent.name in names]
