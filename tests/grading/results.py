"""Results on disk: one file per finished check, assembled into Gradescope's results.json.

Checks are written the moment they finish (by the pytest controller), so a crashed worker loses
at most the check it was running. results.json is rebuilt from those files at session end.
"""
import json
import re
from pathlib import Path

from tests.grading.rubric import Rubric


def check_path(reports: Path, submission: str, name: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.split("::", 1)[-1])
    return reports / submission / "checks" / f"{safe}.json"


def write_check(reports: Path, record: dict) -> None:
    path = check_path(reports, record["submission"], record["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    tmp.replace(path)


def write_info(reports: Path, submission: str, info: dict) -> None:
    """Facts about a submission's run (environment, seed, ungradable reason, log tail)."""
    path = reports / submission / "info.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged.update({k: v for k, v in info.items() if v is not None})
    path.write_text(json.dumps(merged, indent=1, default=str))


def assemble(reports: Path, submission: str, rubric: Rubric) -> dict:
    """Score every check of one submission and write reports/<submission>/results.json."""
    folder = reports / submission
    records = [json.loads(p.read_text()) for p in sorted((folder / "checks").glob("*.json"))]
    info = json.loads((folder / "info.json").read_text()) if (folder / "info.json").exists() else {}
    counted = [r for r in records if r["outcome"] != "skipped"]
    group_sizes = {}
    for r in counted:
        group_sizes[r["group"]] = group_sizes.get(r["group"], 0) + 1

    parts = {key: {"label": label, "score": 0.0, "max_score": 0.0} for key, label in rubric.parts.items()}
    tests = []
    for r in sorted(records, key=lambda r: (r["part"], r["check"], r["tier"], r["name"])):
        skipped = r["outcome"] == "skipped"
        max_score = 0.0 if skipped else rubric.points(r["group"]) / group_sizes[r["group"]]
        passed = r["outcome"] in ("passed", "skipped")
        score = max_score if passed else 0.0
        part = parts.setdefault(r["part"], {"label": r["part"], "score": 0.0, "max_score": 0.0})
        part["score"] += score
        part["max_score"] += max_score
        if rubric.advice(r["group"]):  # of which advice (beyond the handout), reported apart
            part["advice_score"] = part.get("advice_score", 0.0) + score
            part["advice_max_score"] = part.get("advice_max_score", 0.0) + max_score
        tests.append({
            "name": r["name"], "score": round(score, 4), "max_score": round(max_score, 4),
            "status": "passed" if passed else "failed", "output": r["output"],
            "tags": [r["part"], r["tier"]] + (["advice"] if rubric.advice(r["group"]) else []),
            "visibility": rubric.visibility(r["group"]),
            "extra_data": {**{k: r.get(k) for k in ("part", "check", "case", "tier", "outcome", "diagnosis",
                                                    "verdicts", "heatmap", "timing", "memory", "seconds",
                                                    "precision") if r.get(k) is not None},
                           "source": rubric.source(r["group"]), "advice": rubric.advice(r["group"])},
        })
    score = sum(p["score"] for p in parts.values())
    max_score = sum(p["max_score"] for p in parts.values())
    failed = [t for t in tests if t["status"] == "failed"]
    summary = info.get("ungradable") or (f"{len(failed)} of {len(tests)} checks failed." if failed
                                         else f"All {len(tests)} checks passed.")
    results = {
        "score": round(score, 3), "max_score": round(max_score, 3),
        "execution_time": round(sum(r.get("seconds") or 0 for r in records), 2),
        "output": summary, "visibility": "visible", "stdout_visibility": "hidden",
        "extra_data": {"submission": submission, "student": info.get("student"), "seed": info.get("seed"),
                       "environment": info.get("environment", {}), "parts": parts,
                       "ungradable": info.get("ungradable"), "notes": info.get("notes", []),
                       "runner_log_tail": info.get("runner_log_tail", "")},
        "tests": tests,
    }
    (folder / "results.json").write_text(json.dumps(results, indent=1))
    return results
