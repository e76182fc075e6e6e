"""The rubric is checked as it loads (grading/rubric.py): a mistake stops the run with one
plain sentence per problem, naming the file's line, instead of scoring 0 or erroring later."""
from pathlib import Path

import pytest

from grading.rubric import DEFAULT_RUBRIC, PARTS, Rubric, RubricError

PROJECT_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_TEXT = DEFAULT_RUBRIC.read_text()


def bad_rubric(tmp_path, old: str, new: str) -> tuple:
    """The default rubric with `old` replaced by `new` (once), and the line `new` starts on."""
    assert DEFAULT_TEXT.count(old) >= 1, old
    text = DEFAULT_TEXT.replace(old, new, 1)
    path = tmp_path / "my_rubric.yaml"
    path.write_text(text)
    return path, text[:text.index(new)].count("\n") + 1


def test_the_default_rubric_loads_and_its_total_is_the_sum_of_its_groups():
    rubric = Rubric()
    assert rubric.groups and set(rubric.parts) == set(PARTS)
    assert rubric.total() == pytest.approx(sum(g["points"] for g in rubric.groups.values()))
    assert rubric.total() == pytest.approx(sum(rubric.part_total(part) for part in rubric.parts))
    assert rubric.points("flash_pytorch.forward.course") == 5.0
    assert rubric.visibility("flash_triton.forward.robustness") == "after_due_date"
    assert set(rubric.budgets) == {"flash_triton", "flash_pytorch"} and rubric.budgets["flash_triton"]["batch"] == 64
    assert rubric.timeout("import") == 120.0


def test_the_hostile_rubric_loads():
    rubric = Rubric(PROJECT_ROOT / "tests" / "self" / "fixtures" / "hostile_rubric.yaml")
    assert rubric.tolerances == {"output_factor": 2.0, "grad_factor": 3.0} and rubric.timeout("flash") == 30.0


@pytest.mark.parametrize("old, new, expected", [
    ("flash_pytorch.forward.course:", "flash_pytorch.forwrd.course:",
     "groups.flash_pytorch.forwrd.course is not a group of this grader (its groups are listed below)\n"
     "The groups of this grader are: flash_pytorch.forward.course, "),
    ("visibility: after_due_date", "visibility: after_due",
     "groups.flash_pytorch.forward.robustness.visibility is 'after_due'; "
     "allowed: visible, hidden, after_due_date, after_published"),
    ("tolerances: {}", "tolerances: {output_fator: 2}",
     "tolerances.output_fator is not a known key here; allowed: output_factor, grad_factor"),
    ("  timing: 120", "  timings: 120",
     "timeouts.timings is not a known key here; allowed: import, flash, flash_interpreted, distributed, timing"),
    ("memory.forward: {points: 3,", "memory.forward: {points: abc,",
     "groups.memory.forward.points is 'abc'; allowed: a number"),
    ("ddp.overlap: {points: 2,", "ddp.overlap: {points: -2,",
     "groups.ddp.overlap.points is -2; allowed: a number >= 0"),
    ("parts:", "colours: red\nparts:",
     "colours is not a known key here; allowed: timeouts, tolerances, parts, groups, budgets"),
    ("  fsdp: FSDP", "  fsd: FSDP",
     "parts.fsd is not a part of this grader; parts are: flash_pytorch, flash_triton, ddp, sharded_optimizer, "),
    ("dtype: bfloat16", "dtype: bf16", "budgets.flash_triton.dtype is 'bf16'; allowed: float32, bfloat16, float16"),
])
def test_a_mistake_is_named_with_its_line_and_what_is_allowed(tmp_path, old, new, expected):
    path, line = bad_rubric(tmp_path, old, new)
    with pytest.raises(RubricError) as raised:
        Rubric(path)
    assert str(raised.value).startswith(f"{path}:{line}: {expected}")
    # one sentence, not a dump (and the list of groups once, on a line of its own)
    assert "pydantic" not in str(raised.value) and str(raised.value).count("\n") == expected.count("\n")


def test_every_problem_gets_its_own_line(tmp_path):
    path, line = bad_rubric(tmp_path, "tolerances: {}", "tolerances:\n  output_factr: 2\n  grad_factor: abc")
    with pytest.raises(RubricError) as raised:
        Rubric(path)
    assert str(raised.value).splitlines() == [
        f"{path}:{line + 1}: tolerances.output_factr is not a known key here; allowed: output_factor, grad_factor",
        f"{path}:{line + 2}: tolerances.grad_factor is 'abc'; allowed: a number"]


def test_numbers_written_as_strings_are_numbers(tmp_path):
    path, _ = bad_rubric(tmp_path, "tolerances: {}", "tolerances: {output_factor: 1e-3}")
    assert Rubric(path).tolerances == {"output_factor": 0.001, "grad_factor": 3.0}  # PyYAML: the string "1e-3"


def test_a_prefix_of_a_group_is_a_group(tmp_path):
    path, _ = bad_rubric(tmp_path, "groups:\n", "groups:\n  ddp: 1\n  flash_triton.forward: 2\n")
    rubric = Rubric(path)
    assert rubric.group_of("flash_triton", "forward", "odd-tier") == "flash_triton.forward"
    assert rubric.group_of("ddp", "new_check", "x") == "ddp"


def test_the_point_table_lists_every_group_and_the_total():
    rubric = Rubric()
    table = rubric.point_table()
    for key, group in rubric.groups.items():
        assert any(key in line and f"{group['points']:g}" in line for line in table.splitlines()), key
    for part, label in rubric.parts.items():
        assert f"{label} ({part}): {rubric.part_total(part):g} points" in table
    assert f"Total: {rubric.total():g} points in {len(rubric.groups)} groups." in table
    assert "Every submission is graded out of this total" in table


def test_groups_that_do_not_apply_share_their_points_out():
    """Rubric.weights: every submission's maximum is the rubric's total, whichever groups apply."""
    rubric = Rubric()
    assert rubric.weights() == {key: group["points"] for key, group in rubric.groups.items()}
    for excused in ({"ddp.bucketing"}, {"sharded_optimizer.state_sharded"}, {"flash_triton.replay"},
                    {key for key in rubric.groups if key.startswith("fsdp.")},
                    {"ddp.bucketing", "flash_pytorch.replay", "sharded_optimizer.state_balanced"}):
        weights = rubric.weights(excused)
        assert sum(weights.values()) == pytest.approx(rubric.total()), excused
        assert all(weights[key] == 0 for key in excused)
        for part in rubric.parts:  # a part keeps its points, unless none of its groups is left
            left = sum(w for key, w in weights.items() if key.split(".")[0] == part)
            if left:
                assert left / sum(weights.values()) == pytest.approx(
                    rubric.part_total(part) / sum(rubric.part_total(p) for p in rubric.parts
                                                  if any(weights[k] for k in rubric.groups if k.startswith(p + "."))))
        # the groups left keep their proportions within their part
        kept = [key for key in rubric.groups if key not in excused and key.startswith("ddp.")]
        assert len({weights[key] / rubric.points(key) for key in kept}) == 1
    # DDP without bucketing: its 1 point goes to equivalence, broadcast, overlap and buffers, 12.5 -> 13.5
    weights = rubric.weights({"ddp.bucketing"})
    assert weights["ddp.equivalence"] == pytest.approx(8 * 13.5 / 12.5)
    assert weights["flash_triton.forward.course"] == rubric.points("flash_triton.forward.course")


def test_a_rubric_that_leaves_checks_without_a_group_is_refused(tmp_path):
    """A check lands in part.check.tier, part.check or part: a rubric with none of them for some
    check would score it 0 without a word, so it is refused, naming what it lacks."""
    line = next(line for line in DEFAULT_TEXT.splitlines(keepends=True) if line.startswith("  flash_triton.replay:"))
    path = tmp_path / "my_rubric.yaml"
    path.write_text(DEFAULT_TEXT.replace(line, ""))
    with pytest.raises(RubricError, match=r"no group of this rubric holds flash_triton\.replay \(nor its"):
        Rubric(path)
    path.write_text(DEFAULT_TEXT.replace(line, "  flash_triton: 1\n"))  # its part holds it: accepted
    assert Rubric(path).group_of("flash_triton", "replay", "replay") == "flash_triton"
