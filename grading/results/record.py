"""One check's record, from the test that makes it to the page that shows it, in one format.

A CheckRecord is what the grader found for one check (grading/check.py Check fills it). Its JSON
(`to_json`, read back by `from_json`) is its one stored format: what travels from an xdist worker
to the controller (on the test report), what a check file holds (grading/results/store.py), and,
with the score fields added once scored (`to_scored_json`, grading/results/scoring.py), one entry
of results.json's `tests[]`, which the report pages read back with `from_json` too
(reporting/page_model.py). Only the Gradescope export (grading/results/gradescope.py, written as
gradescope.json) knows Gradescope's shape.

A new evidence field is a field below and its name in EVIDENCE: the JSON and its reader follow
from those (`_read` reads a field by its annotation), and a template shows it.

Invariants:
- `name` is "<submission>::<part>::<check>[<case>]" (no brackets without a case): check files
  are named after it and Gradescope shows it, so it never changes form.
- `case` is the case's id; `case_fields` its fields as plain JSON data (FlashCase.to_json() for
  an attention case: batch, n_queries, n_keys, head_dim, dtype, is_causal, noncontiguous,
  score_scale, score_shift), or {} for a check whose case is only a name (DDP flavours, say).
- Evidence fields are None when the check has none; None fields are left out of the JSON.
- results.json is untrusted and possibly incomplete: `from_json` never raises on a missing or
  malformed key, it falls back to the field's default. A results.json of a grader older than this
  format (Gradescope's entries, the record in `extra_data`) is not read: regrade it.
"""
import json
import os
import re
import threading
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import get_args

from fa2_sandbox.wire.outcomes import ERROR, FAILED, GRADER_ERROR, NOT_GRADED_HERE, PASSED, UNSETTLED, row_of  # noqa: F401

# The outcome words, and what each means for scoring and the pages: fa2_sandbox/wire/outcomes.py
# OUTCOMES, read here through row_of (NOT_GRADED_HERE and UNSETTLED are imported here too, for the
# modules that read records).
# A check's source starting with this is advice (grading/rubric.py says the same).
ADVICE_PREFIX = "beyond the handout"
# Keys of one verdict the pages read; filled with None when results.json lacks them.
VERDICT_KEYS = ("ok", "reason", "max_err", "max_bound", "mean_err", "mean_bound", "worst_index",
                "oracle_at_worst", "actual_at_worst")
# Evidence a check may carry, in the order its JSON lists it.
EVIDENCE = ("verdicts", "heatmap", "timing", "memory", "precision", "attempts", "retried_after", "see_also")


def grader_error_diagnosis(attempts: list) -> str:
    """The sentence for a check the grader itself failed on; attempts: what each attempt raised."""
    if len(attempts) > 1 and len(set(attempts)) == 1:
        what = f"{attempts[0]}, on both attempts"
    else:
        what = "; then ".join(attempts) or "unknown error"
    return (f"not graded: the grader itself failed ({what}); this check will be regraded, and counts "
            f"neither for nor against the submission until then.")


@dataclass
class CheckRecord:
    submission: str
    part: str
    check: str
    case: str = ""  # the case's id, e.g. "bf16-113x203-d64-causal-4d-strided-x8"
    case_fields: dict = field(default_factory=dict)  # the case as data; {} when it is only a name
    tier: str = ""
    group: str = ""  # the rubric group that scores it ("" for a stand-in)
    source: str = ""  # where the requirement comes from: official tests, handout, or beyond it
    advice: bool = False  # beyond the handout: a best practice worth few points
    outcome: str = ERROR  # passed, failed, skipped, not_graded_here, not_attempted, timeout, crash, error,
    # grader_error...
    diagnosis: str = ""
    output: str = ""  # the diagnosis and its evidence as text (a traceback, for a grader error)
    seconds: float = 0.0
    # Evidence, each None when the check has none.
    verdicts: dict | None = None  # {"dq": {"ok": False, "max_err": ..., ...}}
    heatmap: dict | list | None = None
    timing: dict | None = None
    memory: dict | None = None
    precision: str | None = None  # "tf32": an fp32 check that passed only under the TF32 rule
    attempts: list | None = None  # what each attempt raised, for a grader error
    retried_after: str | None = None  # the first attempt's grader error, when the retry settled it
    # The check of the same submission whose failure is this one's cause (its local_name): the
    # forward check of a case whose call got no answer, say. The page links to it where it is shown.
    see_also: str | None = None
    # Its test's id, "grading.checks.test_flash::test_forward[...]" (grading/check.py check_id): the same
    # from any rootdir, without xdist's "@group".
    check_id: str | None = None
    recorded_at: float | None = None  # when the controller wrote the check file
    stand_in: bool = False  # made by the plugin for a test that failed before it made its check
    # What scoring adds (scoring.assemble): results.json's entries hold them, check files do not.
    score: float = 0.0
    max_score: float = 0.0
    visibility: str = "visible"

    # -- identity ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"{self.submission}::{self.local_name}"

    @property
    def local_name(self) -> str:
        """Its name within its submission: "flash_pytorch::forward[fp32-128x128-d64-full]"."""
        return f"{self.part}::{self.check}" + (f"[{self.case}]" if self.case else "")

    @property
    def anchor(self) -> str:
        """The id of its entry on its submission's page, for a link from another check."""
        return "check-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", self.local_name).strip("-")

    # -- the check file, and the worker-to-controller message -------------------------------
    def to_json(self) -> dict:
        """The check file's JSON (also what a worker sends): what the grader found, not its score."""
        data = {"submission": self.submission, "part": self.part, "check": self.check, "case": self.case,
                "tier": self.tier, "group": self.group, "source": self.source, "advice": self.advice,
                "name": self.name, "outcome": self.outcome, "diagnosis": self.diagnosis,
                "output": self.output, "seconds": self.seconds}
        for key in (*EVIDENCE, "check_id", "recorded_at"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.stand_in:
            data["stand_in"] = True
        if self.case_fields:
            data["case_fields"] = self.case_fields
        return data

    @classmethod
    def from_json(cls, data, submission: str = "", default_visibility: str = "visible") -> "CheckRecord":
        """A record from its JSON: a worker's message, a check file, or a results.json entry (which
        adds the score fields). Never raises: a key missing or of the wrong type gives the field's
        default (None for evidence), since the pages read results.json as untrusted. Keys it does not
        know ("name", derived) are ignored.

        submission / default_visibility: what a results.json entry that lacks them falls back to.
        """
        data = as_dict(data)
        record = cls(**{f.name: _read(data.get(f.name), f) for f in fields(cls)})
        # A check file or results.json of an earlier grader holds the id under "nodeid": still current until regraded.
        record.check_id = record.check_id or as_text(data.get("nodeid")) or None
        record.submission = record.submission or submission
        record.part = record.part or "other"
        record.check = record.check or as_text(data.get("name")) or "(unnamed check)"
        record.output = record.output.strip("\n")
        if not record.diagnosis and record.outcome != PASSED:  # the page groups and heads a check by it
            record.diagnosis = (grader_error_diagnosis([]) if record.outcome == GRADER_ERROR
                                else record.output.partition("\n")[0])
        if not isinstance(data.get("advice"), bool):  # not said: the rule the grader uses
            record.advice = record.source.lower().startswith(ADVICE_PREFIX)
        record.visibility = as_text(data.get("visibility")) or default_visibility
        return record

    def update(self, **values):
        """Set what a test found, by name; None leaves a field as it is. Any other name (a typo, or
        the check's identity) is a grader bug, raised rather than dropped."""
        for key, value in values.items():
            if key not in _SETTABLE:
                raise TypeError(f"a test cannot set {key!r} on a check (only {', '.join(sorted(_SETTABLE))})")
            if value is not None:
                setattr(self, key, value)

    def to_scored_json(self) -> dict:
        """One entry of results.json `tests[]`: the check file's JSON plus what scoring gave it."""
        return {**self.to_json(), "score": round(self.score, 4), "max_score": round(self.max_score, 4),
                "visibility": self.visibility}

    @property
    def passed(self) -> bool:
        """Counts as a pass: a skipped check passes (0 / 0)."""
        return self.row.passed

    # -- what the pages show ----------------------------------------------------------------
    @property
    def row(self):
        """Its outcome's row of the table (fa2_sandbox/wire/outcomes.py OUTCOMES): the state, whether
        it counts as a pass, a fail or neither, the badge's words, the sentence."""
        return row_of(self.outcome)

    @property
    def state(self) -> str:
        """What a page groups by (outcomes.STATES): passed, skipped, ungraded (a grader error),
        not_here (not graded on this machine) or failed."""
        return self.row.state

    @property
    def evidence(self) -> str:
        """The output, without its first line when that only repeats the diagnosis."""
        output = self.output.strip("\n")
        first, _, rest = output.partition("\n")
        shown = rest if self.diagnosis and first.strip() == self.diagnosis.strip() else output
        return shown.strip("\n")

    @property
    def verdict_rows(self) -> list:
        """[{"tensor": "dq", "ok": ..., "max_err": ..., ...}], every VERDICT_KEYS key present."""
        return [{"tensor": tensor, **{k: as_dict(v).get(k) for k in VERDICT_KEYS}}
                for tensor, v in (self.verdicts or {}).items()]

    @property
    def heatmaps(self) -> list:
        """The heatmaps, one or several, as a list of dicts."""
        maps = [self.heatmap] if isinstance(self.heatmap, dict) else self.heatmap or []
        return [h for h in maps if isinstance(h, dict)]

    @property
    def has_charts(self) -> bool:
        return bool(self.heatmaps or self.timing or self.memory)

    def bound_for(self, tensor):
        """The verdict's max_bound for `tensor`, which splits that tensor's heatmap colours."""
        return as_dict((self.verdicts or {}).get(tensor)).get("max_bound")

    @property
    def evidence_key(self) -> str:
        """Equal for checks whose evidence would render identically."""
        return json.dumps([self.evidence, self.verdict_rows, self.heatmaps, self.timing, self.memory],
                          sort_keys=True, default=str)

    @property
    def has_evidence(self) -> bool:
        return bool(self.evidence or self.verdicts or self.has_charts)


# update() sets what a test finds; identity, scoring and the plugin's bookkeeping it leaves alone.
_SETTABLE = {"outcome", "diagnosis", "output", "seconds", *EVIDENCE}


def points(value) -> str:
    """How points read everywhere (the terminal, results.json's sentences, the pages, the CSVs,
    Gradescope's text): two decimals, trailing zeros dropped, so 4.144 reads "4.14" and 20.0 "20"."""
    return f"{float(value):.2f}".rstrip("0").rstrip(".")


def _read(value, f):
    """`value` as field `f` of a record holds it: text for a text field, a number for a number,
    else the value where it has the field's type, and the field's default where it has not (None
    for an evidence field). A new evidence field is read by its annotation, with no code here."""
    kinds = get_args(f.type) or (f.type,)
    optional = type(None) in kinds
    kinds = tuple(k for k in kinds if k is not type(None))
    if optional:
        default = None
    elif f.default_factory is not MISSING:
        default = f.default_factory()
    else:  # a field without a default (the identity's) reads as empty text
        default = f.default if f.default is not MISSING else kinds[0]()
    if kinds == (str,):
        return as_text(value) or default
    if kinds == (float,):
        return as_number(value, default)
    return value if isinstance(value, kinds) else default


# Readers of untrusted JSON values (results.json): a wrong type gives the default, never an error.
def as_dict(value):
    return value if isinstance(value, dict) else {}


def as_number(value, default=0.0):
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def as_text(value):
    return "" if value is None else str(value)


def write_whole(path, text: str) -> None:
    """Write `text` whole: to a temporary file of this process and thread, then os.replace, so a
    reader (another process, a browser) never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8", newline="\n")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


# -- the class file, reports/class.json: the submissions the class page, grades.csv and
# gradescope_scores.csv list. The engine writes it at the end of a run (grading/controller.py,
# grading/slurm.py) and so does `build-reports --keep-others`; both read it. It is read and
# written here, with the records, because the pages import nothing else of the engine.
CLASS_FILE = "class.json"


def class_to_json(names, skipped) -> dict:
    return {"submissions": sorted(set(names)), "skipped": [str(p) for p in skipped]}


def class_from_json(data) -> dict | None:
    """{"submissions": [names], "skipped": [paths]} from class.json's `data`, or None where it holds
    none (no run wrote it: a folder of an older grader, whose class is every submission in it)."""
    if not isinstance(data, dict) or not isinstance(data.get("submissions"), list):
        return None
    skipped = data.get("skipped") if isinstance(data.get("skipped"), list) else []
    return {"submissions": [str(n) for n in data["submissions"]], "skipped": [str(p) for p in skipped]}


def read_class(reports) -> dict | None:
    """{"submissions": [names], "skipped": [paths]} of `reports`, or None where no run wrote it (a
    folder of an older grader: then every submission in it is the class)."""
    try:
        data = json.loads((Path(reports) / CLASS_FILE).read_text())
    except (OSError, ValueError):  # an unreadable one says no more than a missing one
        data = None
    return class_from_json(data)


def write_class(reports, names, skipped=(), keep_others: bool = False) -> dict:
    """Make `names` the class of `reports` (with keep_others, every submission graded into it as well);
    `skipped`: the folders a glob matched that hold no adapters file, as the run names them."""
    data = class_to_json(set(names) | set(graded_folders(reports) if keep_others else ()), skipped)
    write_whole(Path(reports) / CLASS_FILE, json.dumps(data, indent=1))
    return data


def add_others(reports) -> dict:
    """Make every submission graded into `reports` part of its class, in class.json too, so that a
    later build without --keep-others lists them as well; the skipped folders stay the last run's."""
    known = read_class(reports) or class_to_json([], [])
    return write_class(reports, known["submissions"], known["skipped"], keep_others=True)


def graded_folders(reports) -> list:
    """The names of the submissions graded into `reports` by any run: its folders holding an
    info.json (written at the start of a run) or a results.json."""
    return sorted({p.parent.name for pattern in ("*/info.json", "*/results.json") for p in Path(reports).glob(pattern)})


def left_out(reports, members) -> list:
    """The submissions graded into `reports` that its class (`members`) leaves out, by name: earlier
    runs' (None: a folder without class.json, whose class is every submission)."""
    if members is None:
        return []
    return [name for name in graded_folders(reports) if name not in members]
