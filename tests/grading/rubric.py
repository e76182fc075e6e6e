"""The rubric: points, visibility, timeouts, timing budgets and tolerance factors, from rubric.yaml."""
from pathlib import Path

import yaml

from reference.tolerance import GRAD_FACTOR, OUTPUT_FACTOR

DEFAULT_RUBRIC = Path(__file__).with_name("rubric.yaml")
ADVICE_PREFIX = "beyond the handout"


class Rubric:
    def __init__(self, path: Path | None = None):
        self.path = Path(path or DEFAULT_RUBRIC)
        data = yaml.safe_load(self.path.read_text())
        self.timeouts = data.get("timeouts", {})
        self.parts = data.get("parts", {})
        self.budgets = data.get("budgets", {})
        # The factors of reference/tolerance.py's rule, which holds their defaults; a rubric may override them.
        self.tolerances = {"output_factor": OUTPUT_FACTOR, "grad_factor": GRAD_FACTOR, **(data.get("tolerances") or {})}
        self.groups = {}
        for key, value in data.get("groups", {}).items():
            value = value if isinstance(value, dict) else {"points": value}
            self.groups[key] = {"points": float(value.get("points", 0)),
                                "visibility": value.get("visibility", "visible"),
                                "source": str(value.get("source", ""))}

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
