"""The rubric: points, visibility, timeouts, timing budgets and tolerance factors, from rubric.yaml.

The file is checked as it loads (the pydantic models below). A misspelt group would otherwise
score 0 without a word, an unknown tolerance key would error every flash check, and `1e-3`
(which PyYAML reads as a string) would fail deep inside a test. Instead the run stops with a
RubricError: one plain sentence per problem, naming the file's line, the key, what it holds and
what is allowed.
"""
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from reference.tolerance import GRAD_FACTOR, OUTPUT_FACTOR

DEFAULT_RUBRIC = Path(__file__).with_name("rubric.yaml")
ADVICE_PREFIX = "beyond the handout"
PARTS = ("flash_pytorch", "flash_triton", "ddp", "sharded_optimizer", "fsdp", "memory", "timing")
VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")  # Gradescope's
DTYPES = ("float32", "bfloat16", "float16")  # what a timing budget may run in
GROUP_HINT = "(or a prefix of one: part.check or part)"
NOT_A_GROUP = "is not a group of this grader (its groups are listed below)"


class RubricError(ValueError):
    """A rubric the grader cannot use; its message has one line per problem, `file:line: ...`."""


# -- the pieces of a rubric --------------------------------------------------------------------
# Each custom check raises its whole sentence ("is 'x'; allowed: ..."), so the error report below
# only has to put the file, line and key in front of it.
def _refuse(problem: str) -> PydanticCustomError:
    return PydanticCustomError("rubric", "{problem}", {"problem": problem})


def _one_of(choices: tuple, key: str = "") -> AfterValidator:
    """A value among `choices`; `key` names what a mapping's keys are ("part"), for their sentence."""
    def check(value):
        if value not in choices:
            said = f"is not a {key} of this grader; {key}s are" if key else f"is {_show(value)}; allowed"
            raise _refuse(f"{said}: {', '.join(choices)}")
        return value
    return AfterValidator(check)


def _group_key(key: str, info: ValidationInfo) -> str:
    """A group a check can land in: a known group, or the part.check or part that group_of tries next."""
    known = info.context["groups"]
    if key not in known and not any(k.startswith(key + ".") for k in known):
        raise _refuse(NOT_A_GROUP)
    return key


def _not_bool(value):
    # YAML reads `yes` and `true` as booleans, which pydantic would take as the number 1.
    if isinstance(value, bool):
        raise _refuse(f"is {_show(value)}; allowed: a number")
    return value


def _points_only(value):
    # `group: 5` is short for `group: {points: 5}`.
    return value if isinstance(value, dict) else {"points": value}


# Strings that parse as numbers ("1e-3", which PyYAML leaves a string) are taken as numbers.
Positive = Annotated[float, BeforeValidator(_not_bool), Field(gt=0, allow_inf_nan=False)]
Points = Annotated[float, BeforeValidator(_not_bool), Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, BeforeValidator(_not_bool), Field(gt=0)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Timeouts(Strict):  # seconds for one runner call
    import_: Positive | None = Field(None, alias="import")
    flash: Positive | None = None
    flash_interpreted: Positive | None = None
    distributed: Positive | None = None
    timing: Positive | None = None


class Tolerances(Strict):  # unset: reference/tolerance.py's defaults
    output_factor: Positive | None = None
    grad_factor: Positive | None = None


class Group(Strict):
    points: Points
    visibility: Annotated[str, _one_of(VISIBILITIES)] = "visible"
    source: str = ""


class Budget(Strict):  # as grading/checks/test_timing.py reads it
    ratio: Positive
    n: Count
    d: Count
    dtype: Annotated[str, _one_of(DTYPES)]
    causal: bool
    batch: Count


class Budgets(Strict):
    flash_triton: Budget | None = None
    flash_pytorch: Budget | None = None


GroupKey = Annotated[str, AfterValidator(_group_key)]
GroupValue = Annotated[Group, BeforeValidator(_points_only)]


class RubricFile(Strict):
    timeouts: Timeouts | None = None
    tolerances: Tolerances | None = None
    parts: dict[Annotated[str, _one_of(PARTS, key="part")], str] | None = None
    groups: dict[GroupKey, GroupValue] | None = None
    budgets: Budgets | None = None


def default_groups() -> tuple:
    """The groups of the default rubric, in its order: the groups the grader's checks are made for."""
    return tuple(yaml.safe_load(DEFAULT_RUBRIC.read_text())["groups"])


# -- turning pydantic's errors into sentences --------------------------------------------------
def _show(value) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value) if isinstance(value, str) else str(value)


def _fields_at(loc: tuple) -> list:
    """The keys the mapping at loc may hold (its model's fields), for an unknown key's sentence."""
    if not loc:
        model = RubricFile
    elif len(loc) == 1:
        model = {"timeouts": Timeouts, "tolerances": Tolerances, "budgets": Budgets}[loc[0]]
    else:
        model = Budget if loc[0] == "budgets" else Group
    return [field.alias or name for name, field in model.model_fields.items()]


def _problem(error: dict, loc: tuple) -> str:
    """What is wrong at loc, as the end of a sentence that starts with the key."""
    kind, ctx, found = error["type"], error.get("ctx") or {}, _show(error.get("input"))
    if kind == "rubric":
        return ctx["problem"]
    if kind == "extra_forbidden":
        return f"is not a known key here; allowed: {', '.join(_fields_at(loc[:-1]))}"
    if kind == "missing":
        return "is missing"
    if kind == "model_type":
        return f"is {found}; allowed: a mapping of {', '.join(_fields_at(loc))}"
    if kind == "dict_type":
        return f"is {found}; allowed: a mapping"
    if "gt" in ctx or "ge" in ctx:
        return f"is {found}; allowed: a number {'>' if 'gt' in ctx else '>='} {ctx.get('gt', ctx.get('ge'))}"
    if kind.startswith("float") or kind == "finite_number":
        return f"is {found}; allowed: a number"
    if kind.startswith("int"):
        return f"is {found}; allowed: a whole number"
    if kind.startswith("bool"):
        return f"is {found}; allowed: true or false"
    if kind.startswith("string"):
        return f"is {found}; allowed: text"
    return f"is {found}; {error['msg']}"


def _line(root, loc: tuple) -> int:
    """The line of the YAML key at loc, or of the deepest key on the way there that exists."""
    node, line = root, (root.start_mark.line + 1 if root is not None else 1)
    for key in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        pair = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == str(key)), None)
        if pair is None:
            break
        line, node = pair[0].start_mark.line + 1, pair[1]
    return line


def _explain(path: Path, text: str, exc: ValidationError, known_groups: tuple) -> RubricError:
    root = yaml.compose(text)
    found = []
    for error in exc.errors():
        loc = tuple(part for part in error["loc"] if part != "[key]")  # a dict key's own check
        key = ".".join(str(part) for part in loc) or "the rubric"
        found.append((_line(root, loc), f"{key} {_problem(error, loc)}"))
    lines = [f"{path}:{line}: {problem}" for line, problem in sorted(found, key=lambda f: f[0])]
    if any(problem.endswith(NOT_A_GROUP) for _, problem in found):  # the list once, not per line
        lines.append(f"The groups of this grader are: {', '.join(known_groups)} {GROUP_HINT}.")
    return RubricError("\n".join(lines))


def load(path: Path, known_groups: tuple) -> RubricFile:
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise RubricError(f"{path}:{mark.line + 1 if mark else 1}: the file is not valid YAML: "
                          f"{getattr(exc, 'problem', None) or exc}") from None
    try:
        return RubricFile.model_validate(data, context={"groups": known_groups})
    except ValidationError as exc:
        raise _explain(path, text, exc, known_groups) from None


# -- the rubric the grader uses ----------------------------------------------------------------
class Rubric:
    def __init__(self, path: Path | None = None, known_groups: tuple | None = None):
        """known_groups: the groups checks can land in (default: the default rubric's); only a
        test's made-up catalogue of checks needs another."""
        self.path = Path(path or DEFAULT_RUBRIC)
        data = load(self.path, tuple(known_groups or default_groups()))

        def plain(section):
            return section.model_dump(by_alias=True, exclude_none=True) if section else {}

        self.timeouts = plain(data.timeouts)
        self.parts = dict(data.parts or {})
        self.budgets = plain(data.budgets)
        # The factors of reference/tolerance.py's rule, which holds their defaults; a rubric may override them.
        self.tolerances = {"output_factor": OUTPUT_FACTOR, "grad_factor": GRAD_FACTOR, **plain(data.tolerances)}
        self.groups = {key: group.model_dump() for key, group in (data.groups or {}).items()}
        # A check lands in its most specific group (group_of); one that lands in none would score 0
        # without a word, so a rubric must name every group the checks use, or its check or its part.
        known = known_groups or default_groups()
        if unplaced := [g for g in known if self.group_of(*(g.split(".") + ["", ""])[:3]) not in self.groups]:
            raise RubricError(f"{self.path}: no group of this rubric holds {', '.join(unplaced)} (nor its "
                              f"part.check, nor its part): those checks would score 0 without a word. Add each "
                              f"group, with points: 0 to leave its checks unscored.")

    def group_of(self, part: str, check: str, tier: str) -> str:
        """The most specific group naming this check: part.check.tier, then part.check, then part."""
        for key in (f"{part}.{check}.{tier}", f"{part}.{check}", part):
            if key in self.groups:
                return key
        return f"{part}.{check}.{tier}"  # unknown to the rubric: worth 0 points

    def points(self, group: str) -> float:
        return self.groups.get(group, {}).get("points", 0.0)

    def visibility(self, group: str) -> str:
        return self.groups.get(group, {}).get("visibility", "visible")

    def source(self, group: str) -> str:
        """Where the group's requirement comes from: the official tests, the handout, or beyond it."""
        return self.groups.get(group, {}).get("source", "")

    def advice(self, group: str) -> bool:
        """A check beyond the handout: advice, reported apart from the course's requirements."""
        return self.source(group).startswith(ADVICE_PREFIX)

    def timeout(self, name: str) -> float:
        return float(self.timeouts.get(name, 60))

    # -- totals: a group's points count once, however many checks share them ------------------
    def part_total(self, part: str) -> float:
        return sum(g["points"] for key, g in self.groups.items() if key.split(".")[0] == part)

    def total(self) -> float:
        return sum(g["points"] for g in self.groups.values())

    def weights(self, excused=()) -> dict:
        """Each group's points once the `excused` groups (every check of theirs skipped: it does not
        apply to the submission, or could not be measured on it) have shared theirs out, so that every
        submission is graded out of the same total. An excused group's points go to the other groups
        of its part, in proportion to their points; a part with no group left (FSDP for a
        2025-template submission) gives its points to the other parts the same way. A submission thus
        keeps, on what could be measured, the share of the total it earned there: an excused check
        costs nothing and gives nothing."""
        live = {key: points for key, group in self.groups.items()
                if key not in excused and (points := group["points"])}
        parts = {key.split(".")[0] for key in self.groups}
        kept = {part: sum(p for key, p in live.items() if key.split(".")[0] == part) for part in parts}
        scale = {part: self.part_total(part) / kept[part] for part in parts if kept[part]}
        overall = sum(self.part_total(part) for part in scale)
        overall = self.total() / overall if overall else 0.0
        return {key: live.get(key, 0.0) * scale.get(key.split(".")[0], 0.0) * overall for key in self.groups}

    def summary(self) -> str:
        """The totals in one line (what `pytest -q` prints)."""
        return (f"rubric {self.path}: {self.total():g} points in {len(self.groups)} groups, the maximum of every "
                f"submission (a group that does not apply, or could not be measured, shares its points out)")

    def point_table(self) -> str:
        """Every group under its part's label, with its points, its visibility unless visible and its
        source (shortened), then each part's subtotal and the grand total."""
        parts = list(self.parts) + sorted({k.split(".")[0] for k in self.groups} - set(self.parts))
        width = max((len(key) for key in self.groups), default=0)
        lines = []
        for part in parts:
            keys = [key for key in self.groups if key.split(".")[0] == part]
            lines.append(f"{self.parts.get(part, part)} ({part}): {self.part_total(part):g} points")
            for key in keys:
                group = self.groups[key]
                hidden = "" if group["visibility"] == "visible" else group["visibility"]
                source = group["source"] if len(group["source"]) <= 60 else group["source"][:57] + "..."
                lines.append(f"  {group['points']:>5g}  {key:{width}}  {hidden:15} {source}".rstrip())
        lines.append(f"Total: {self.total():g} points in {len(self.groups)} groups.")
        lines.append("Every submission is graded out of this total. A group that does not apply to a submission "
                     "(ddp.bucketing for a 2026-template one), or none of whose checks could be measured on it, "
                     "shares its points among its part's other groups, in proportion to their points; a part with "
                     "no group left (FSDP for a 2025-template submission) shares its points among the other parts.")
        return "\n".join(lines)
