"""The diagnoses name the mistake behind a wrong tensor, and the stub finder reads templates right.

Wrong tensors are built here from the float64 oracle by hand (a scaled gradient, a base-2 LSE,
a strict causal mask, ...), independently of grading/diagnoses/mistakes.py where that is possible.
"""
import math

import pytest
import torch

from fa2_sandbox.harness.discover import defined_functions, load_submission, stub_functions
from fa2_sandbox.wire.cases import FlashCase, make_inputs
from grading.diagnoses import flash as diagnose
from grading.diagnoses import mistakes
from reference.oracle import attention_and_grads, scores
from reference.tolerance import expected_attention, judge_attention


def sentence_for(case, wrong: dict, seed=7):
    """The diagnosis the grader gives when the student's tensors are the oracle's, except `wrong`."""
    q, k, v, do = make_inputs(case, seed=seed)
    oracle, baseline = expected_attention(q, k, v, do, case.is_causal)
    names = ["o", "L"] if {"o", "L"} & set(wrong) else ["dq", "dk", "dv"]
    tensors = {n: wrong.get(n, oracle[n]).to(torch.float32 if n == "L" else q.dtype) for n in names}
    verdicts = judge_attention(tensors, q, k, v, do, case.is_causal, (oracle, baseline))
    assert not all(v.ok for v in verdicts.values()), "the wrong tensors passed: the test builds them badly"

    def mistaken(name):
        return mistakes.oracle_of(name, (q, k, v, do), case)

    return diagnose.explain(verdicts, tensors, oracle, case, mistaken)[0], oracle, (q, k, v, do)


CAUSAL = FlashCase(batch=(2,), n_queries=96, n_keys=96, head_dim=32, is_causal=True)
FULL = FlashCase(batch=(2,), n_queries=80, n_keys=112, head_dim=32)


def test_missing_dk_scale():
    q, k, v, do = make_inputs(FULL, seed=7)
    dk = attention_and_grads(q, k, v, do)["dk"] * math.sqrt(32)
    assert "its 1/sqrt(d) scale is missing" in sentence_for(FULL, {"dk": dk})[0]


def test_an_output_never_written_is_said_to_be_zero():
    """A forward returning the zeros it allocated (tamper_late_write, an unfilled output): not "a
    constant factor is wrong"."""
    q, k, v, do = make_inputs(FULL, seed=7)
    said = sentence_for(FULL, {"o": torch.zeros_like(q)})[0]
    assert said.startswith("o is zero everywhere") and "factor" not in said


def test_base2_lse():
    q, k, v, do = make_inputs(FULL, seed=7)
    assert "base 2" in sentence_for(FULL, {"L": attention_and_grads(q, k, v, do)["L"] / math.log(2)})[0]


def test_causal_ignored():
    q, k, v, do = make_inputs(CAUSAL, seed=7)
    assert "is_causal is ignored" in sentence_for(CAUSAL, {"o": attention_and_grads(q, k, v, do, False)["o"]})[0]


def test_diagonal_masked():
    q, k, v, do = (t.double() for t in make_inputs(CAUSAL, seed=7))
    s = (q @ k.transpose(-1, -2) / math.sqrt(32)).masked_fill(torch.ones(96, 96).triu().bool(), -1e6)
    assert "hides each query's own key" in sentence_for(CAUSAL, {"o": torch.softmax(s, -1) @ v})[0]


def test_accumulator_not_rescaled_when_l_is_right():
    q, k, v, do = make_inputs(FULL, seed=7)
    o = attention_and_grads(q, k, v, do)["o"]
    o[:, 40:] *= 1.5  # o wrong from some row on, L right
    assert "o is wrong while L is right" in sentence_for(FULL, {"o": o})[0]


def test_dropped_tail_rows_of_a_partial_tile():
    q, k, v, do = make_inputs(FULL, seed=7)
    o = attention_and_grads(q, k, v, do)["o"]
    o[:, 64:] = 0  # 80 rows = one tile of 64 and a partial tile of 16
    L = attention_and_grads(q, k, v, do)["L"].clone()
    L[:, 64:] = 0
    assert "query rows >= 64" in sentence_for(FULL, {"o": o, "L": L})[0]


def test_a_second_full_tile_is_not_called_partial():
    case = FlashCase(batch=(2,), n_queries=128, n_keys=128, head_dim=32)
    q, k, v, do = make_inputs(case, seed=7)
    right = attention_and_grads(q, k, v, do)
    o, L = right["o"].clone(), right["L"].clone()
    o[:, 64:], L[:, 64:] = 0, 0
    assert "partial" not in sentence_for(case, {"o": o, "L": L})[0]


def test_nan_names_the_row():
    q, k, v, do = make_inputs(CAUSAL, seed=7)
    o = attention_and_grads(q, k, v, do, True)["o"].clone()
    o[:, 0] = float("nan")
    assert "query row 0 only" in sentence_for(CAUSAL, {"o": o})[0]


@pytest.mark.parametrize("body,stub", [
    ("raise NotImplementedError", True),
    ("raise NotImplementedError('todo')", True),
    ('"""Docstring."""\n    raise NotImplementedError', True),
    ("return MyDDP(module)", False),
    ("if module is None:\n        raise NotImplementedError\n    return module", False),
    ("raise ValueError('no')", False),
])
def test_stub_functions(tmp_path, body, stub):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "adapters.py").write_text(f"def get_ddp(module):\n    {body}\n")
    assert (stub_functions(load_submission(tmp_path)) == {"get_ddp"}) is stub


def test_adapters_that_import_their_functions_define_them(tmp_path):
    """An adapters file may re-export its functions by import or assignment: they count as defined
    (before, an FSDP given so was skipped as a 2025 template and a sharded optimizer 'not attempted')."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "adapters.py").write_text(
        "from cs336_systems.fsdp import get_fsdp, gather as fsdp_gather_full_params\n"
        "from cs336_systems import sharded\n"
        "get_sharded_optimizer = sharded.ShardedOptimizer\n"
        "def get_ddp(module):\n    raise NotImplementedError\n")
    submission = load_submission(tmp_path)
    assert {"get_fsdp", "fsdp_gather_full_params", "get_sharded_optimizer", "get_ddp"} <= defined_functions(submission)
    assert "gather" not in defined_functions(submission)
    assert stub_functions(submission) == {"get_ddp"}


def test_only_the_first_tiles_right_points_at_the_grid():
    case = FlashCase(batch=(2,), n_queries=256, n_keys=256, head_dim=32)
    q, k, v, do = make_inputs(case, seed=7)
    right = attention_and_grads(q, k, v, do)
    o, L = right["o"].clone(), right["L"].clone()
    o[:, 128:], L[:, 128:] = 0, 0  # what a grid of (B*H, tiles) read as (tiles, B*H) leaves unwritten
    assert "launch grid" in sentence_for(case, {"o": o, "L": L})[0]


def test_lse_without_the_row_max():
    q, k, v, do = (t.double() for t in make_inputs(FULL, seed=7))
    s = q @ k.transpose(-1, -2) / math.sqrt(32)
    L = torch.log(torch.exp(s - s.amax(-1, keepdim=True)).sum(-1))  # log(l), m left out
    assert "the running max m is missing" in sentence_for(FULL, {"L": L})[0]


def test_unmasked_key_padding_is_named_not_a_constant_factor():
    """Seen in the corpus: zero-padded keys past N_k counted in the softmax sum scale o by ~0.93
    in every row, which the constant-factor rule used to report."""
    case = FlashCase(batch=(2,), n_queries=127, n_keys=513, head_dim=64)
    q, k, v, do = make_inputs(case, seed=7)
    zeros = k.new_zeros((2, -513 % 64, 64))
    padded = attention_and_grads(q, torch.cat([k, zeros], 1), torch.cat([v, zeros], 1), do)
    sentence = sentence_for(case, {"o": padded["o"], "L": padded["L"]})[0]
    assert "513 keys plus 63 zero keys" in sentence and "constant factor" not in sentence


def test_a_rounding_error_is_not_named_padded_keys():
    """Issue 36: with scores x8 the softmax is one-hot, so zero keys past N_k get no weight and
    attention over them equals the oracle. An o that failed only its mean bound by rounding (the
    oracle rounded toward zero to bf16, as the Triton interpreter used to store it; this seed and
    case are the issue's) was told its last key tile reads past N_k, then, without that, to rescale
    its accumulator: it is told it is slightly wrong everywhere."""
    case, seed = FlashCase(batch=(2,), n_queries=32, n_keys=32, head_dim=64, dtype="bfloat16", score_scale=8.0), \
        1861009893
    q, k, v, do = make_inputs(case, seed=seed)
    oracle = attention_and_grads(q, k, v, do)
    assert torch.equal(mistakes.padded_keys(q, k, v, do, 64)["o"], oracle["o"]), "the padding should change nothing"
    truncated = (oracle["o"].float().view(torch.int32) & ~0xFFFF).view(torch.float32)
    sentence = sentence_for(case, {"o": truncated}, seed=seed)[0]
    assert sentence.startswith("o is slightly wrong almost everywhere: its mean error"), sentence


def test_nan_in_the_only_query_row_does_not_blame_the_diagonal():
    case = FlashCase(batch=(2,), n_queries=1, n_keys=239, head_dim=64, is_causal=True)
    q, k, v, do = make_inputs(case, seed=7)
    o = attention_and_grads(q, k, v, do, True)["o"].clone()
    o[:, 0, 0] = float("nan")
    assert "diagonal" not in sentence_for(case, {"o": o})[0]


def test_small_constant_lse_offset_is_a_bias_not_a_missing_max():
    q, k, v, do = make_inputs(FULL, seed=7)
    sentence = sentence_for(FULL, {"L": attention_and_grads(q, k, v, do)["L"] + 0.006})[0]
    assert "systematic bias" in sentence and "running max" not in sentence


def dense_backward_with_delta(q, k, v, do, is_causal, delta):
    """A dense backward (no tiles) from the oracle's P, with D = delta(P, dP, o)."""
    right = attention_and_grads(q, k, v, do, is_causal)
    q, k, v, do = (t.double() for t in (q, k, v, do))
    p = torch.exp(scores(q, k, is_causal) - right["L"][..., None])
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - delta(p, dp, right["o"]))
    scale = q.shape[-1] ** -0.5
    return {"dq": ds @ k * scale, "dk": ds.transpose(-1, -2) @ q * scale}


def test_a_per_tile_delta_is_named_with_its_tile():
    case = FlashCase(batch=(2,), n_queries=96, n_keys=112, head_dim=32)
    q, k, v, do = make_inputs(case, seed=7)
    wrong = mistakes.delta_per_tile(q, k, v, do, False, 32)
    sentence = sentence_for(case, {"dq": wrong["dq"], "dk": wrong["dk"]})[0]
    assert "dq and dk are wrong while dv is right: they match a D = rowsum(P * dP) taken over one key tile of " \
           "32 keys" in sentence, sentence


@pytest.mark.parametrize("case", [FlashCase(batch=(2,), n_queries=96, n_keys=112, head_dim=32),
                                  FlashCase(batch=(2,), n_queries=16, n_keys=16, head_dim=32)], ids=str)
def test_a_wrong_delta_without_tiles_blames_no_key_tile(case):
    """A dense backward has no tiles, and a case of one key tile cannot show a per-tile D: a wrong
    D there (here the row sum of dO * O without its last head-dim column) is not put on a tile."""
    q, k, v, do = make_inputs(case, seed=7)
    wrong = dense_backward_with_delta(q, k, v, do, False, lambda p, dp, o: (do[..., :-1].double() * o[..., :-1])
                                      .sum(-1, keepdim=True))
    sentence = sentence_for(case, wrong)[0]
    assert sentence.startswith("dq and dk are wrong while dv is right, so the error is in dS") and "tile" not in \
        sentence, sentence


def base2_forward(q, k, v, is_causal, scale=None):
    """A forward that takes exp2 of q.k * scale (default 1/sqrt(d)) without multiplying by log2(e),
    built here by hand: o, and its L as m + log2(l) in base 2 (convert with * ln 2)."""
    q, k, v = (t.double() for t in (q, k, v))
    s = q @ k.transpose(-1, -2) * (scale or q.shape[-1] ** -0.5)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:]).triu(1).bool(), -1e6)
    m = s.amax(-1, keepdim=True)
    p = torch.exp2(s - m)
    return p @ v / p.sum(-1, keepdim=True), (m[..., 0] + torch.log2(p.sum(-1)))


EXP2 = "the softmax uses exp2 but the scores were not multiplied by log2(e) = 1.4427, so it computes softmax(S ln 2)"


@pytest.mark.parametrize("case", [FlashCase(batch=(2,), n_queries=64, n_keys=64, head_dim=d, dtype=dtype, is_causal=c)
                                  for d, c in ((16, False), (32, False), (32, True), (128, False))
                                  for dtype in ("float32", "bfloat16")], ids=lambda case: case.id)
def test_exp2_without_log2e_is_named_not_a_hard_coded_head_dim(case):
    """Issue 34: a Triton forward using exp2 on unscaled scores computes softmax(S ln 2), attention
    scaled by ln 2/sqrt(d); at d = 32 that is within 2% of a hard-coded 1/8, and the student was
    told the head dim is hard-coded."""
    q, k, v, do = make_inputs(case, seed=7)
    o, L2 = base2_forward(q, k, v, case.is_causal)
    sentence = sentence_for(case, {"o": o, "L": L2 * math.log(2)})[0]
    assert sentence.startswith("o matches softmax(S ln 2) attention: " + EXP2) and "hard-coded" not in sentence, \
        sentence


def test_an_lse_of_exp2_left_in_base_2_is_named():
    """Only L wrong (o right): L = m + log2(l) of exp2 on unscaled scores, never converted."""
    _, L2 = base2_forward(*make_inputs(FULL, seed=7)[:3], False)
    sentence = sentence_for(FULL, {"L": L2})[0]
    assert sentence.startswith("L matches m + log2(l) of a softmax that uses exp2 on scores not multiplied by "
                               "log2(e)") and "L is left in base 2" in sentence, sentence


@pytest.mark.parametrize("case", [FULL, CAUSAL], ids=lambda case: case.id)
def test_a_right_backward_after_an_exp2_forward_blames_the_forward(case):
    """The backward recomputes P = exp(S - L) from the forward's L, which is wrong: dq, dk, dv
    are wrong though the backward is right, and the sentence says to fix the forward."""
    q, k, v, do = make_inputs(case, seed=7)
    o, L2 = base2_forward(q, k, v, case.is_causal)
    q, k, v, do = (t.double() for t in (q, k, v, do))
    p = torch.exp(scores(q, k, case.is_causal) - L2[..., None] * math.log(2))
    ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    scale = 1 / math.sqrt(case.head_dim)
    wrong = {"dq": ds @ k * scale, "dk": ds.transpose(-1, -2) @ q * scale, "dv": p.transpose(-1, -2) @ do}
    sentence = sentence_for(case, wrong)[0]
    # all three named, and the forward's own check pointed at, whose sentence names the mistake
    assert sentence.startswith("dq, dk and dv match a right backward run on a wrong forward") and \
        "Fold log2(e) into the forward's softmax scale: the forward check of this case names the same mistake" \
        in sentence and diagnose.blames_the_forward(sentence), sentence


def test_a_backward_whose_three_gradients_are_wrong_names_all_three():
    """dq, dk and dv each wrong in their own way: the sentence about dq names dk and dv too."""
    q, k, v, do = make_inputs(FULL, seed=7)
    right = attention_and_grads(q, k, v, do)
    wrong = {"dq": right["dq"] * 1.3, "dk": right["dk"] + 0.5, "dv": right["dv"].flip(-2)}
    sentence = sentence_for(FULL, wrong)[0]
    assert sentence.startswith("dq is 1.3 times the oracle everywhere") and \
        sentence.endswith(" dk and dv are wrong too (each tensor's error is below)."), sentence
    only_dk = sentence_for(FULL, {"dk": right["dk"] * math.sqrt(32)})[0]
    assert "wrong too" not in only_dk, only_dk


@pytest.mark.parametrize("case", [FlashCase(batch=(2,), n_queries=64, n_keys=64, head_dim=d, dtype=dtype)
                                  for d in (16, 32, 128) for dtype in ("float32", "bfloat16")],
                         ids=lambda case: case.id)
def test_a_hard_coded_head_dim_and_a_missing_scale_are_not_called_exp2(case):
    q, k, v, do = make_inputs(case, seed=7)
    for scale, said in ((1 / 8, "the head dimension is hard-coded"), (1.0, "without the 1/sqrt(d) scale")):
        wrong = mistakes.with_scale(q, k, v, do, False, scale)
        sentence = sentence_for(case, {"o": wrong["o"], "L": wrong["L"]})[0]
        assert said in sentence and "exp2" not in sentence, sentence
    L = attention_and_grads(q, k, v, do)["L"] / math.log(2)  # a base-2 LSE of the right scores
    sentence = sentence_for(case, {"L": L})[0]
    assert "the LSE is stored in base 2" in sentence and "exp2" not in sentence, sentence


def test_exp2_and_a_hard_coded_head_dim_too_close_to_tell_apart_name_both():
    """At d = 32, ln 2/sqrt(32) = 0.1225 and 1/8 = 0.125: an o halfway between the two fits both
    equally, and the sentence names both rather than guess."""
    case = FlashCase(batch=(2,), n_queries=64, n_keys=64, head_dim=32)
    q, k, v, do = make_inputs(case, seed=7)
    o = (base2_forward(q, k, v, False)[0] + mistakes.with_scale(q, k, v, do, False, 1 / 8)["o"]) / 2
    sentence = sentence_for(case, {"o": o})[0]
    assert "either the head dimension is hard-coded" in sentence and "too close to tell apart" in sentence, sentence


def test_a_few_wrong_rows_are_counted_not_rounded_to_zero_percent():
    """3 wrong rows of 2 x 256 said "wrong in 1% of its rows" at best and "0%" with more rows:
    the sentence counts them."""
    case = FlashCase(batch=(2,), n_queries=256, n_keys=256, head_dim=32)
    q, k, v, do = make_inputs(case, seed=7)
    right = attention_and_grads(q, k, v, do)
    o, L = right["o"].clone(), right["L"].clone()
    for b, row in ((0, 5), (1, 77), (1, 200)):
        o[b, row] += 1.0
        L[b, row] += 1.0
    sentence = sentence_for(case, {"o": o, "L": L})[0]
    assert "o is wrong in 3 of its 512 query rows" in sentence and "%" not in sentence
