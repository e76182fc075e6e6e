"""The replay check's pieces (grading/checks/test_flash.py test_replay): the second input of a
case is another draw, and a replayed answer is told from an answer of its own."""
import torch

from fa2_sandbox.wire.cases import make_inputs
from fa2_sandbox.wire.requests import second_input_seed
from grading.checks.test_flash import same_answers
from grading.matrix import COURSE_CASE
from reference.oracle import attention_and_grads

SEED = 20261125


def answers(seed):
    q, k, v, do = make_inputs(COURSE_CASE, seed)
    return {name: t.float() for name, t in attention_and_grads(q, k, v, do, COURSE_CASE.is_causal).items()}


def test_the_second_input_is_another_draw():
    for seed in (0, SEED, 2**40 + 7):  # the CPU generator keeps a seed's low 32 bits alone
        assert not torch.equal(make_inputs(COURSE_CASE, seed)[0], make_inputs(COURSE_CASE, second_input_seed(seed))[0])
    # nor one the timing checks draw (seed + 1000 * repeat + iteration)
    assert all(second_input_seed(SEED) % 2**32 != (SEED + n) % 2**32 for n in range(10_000))


def test_a_replayed_answer_is_told_from_an_answer_of_its_own():
    first, own = answers(SEED), answers(second_input_seed(SEED))
    compared, same = same_answers(first, own)
    assert compared == ["o", "L", "dq", "dk", "dv"] and same == []
    assert same_answers(first, first)[1] == ["o", "L", "dq", "dk", "dv"]
    nearly = {name: t + 1e-6 * torch.randn_like(t) for name, t in first.items()}  # replayed, with noise
    assert same_answers(first, nearly)[1] == ["o", "L", "dq", "dk", "dv"]


def test_an_answer_that_never_varies_is_left_to_the_other_checks():
    """All zeros twice is a bug the forward and backward checks judge, not a replay."""
    first, own = answers(SEED), answers(second_input_seed(SEED))
    zeros = {**first, "o": torch.zeros_like(first["o"]), "dq": torch.full_like(first["dq"], float("nan"))}
    compared, same = same_answers(zeros, {**own, "o": torch.zeros_like(own["o"]), "dq": zeros["dq"]})
    assert compared == ["L", "dk", "dv"] and same == []
