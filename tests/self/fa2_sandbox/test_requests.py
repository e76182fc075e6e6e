"""The runner's requests (fa2_sandbox/wire/requests.py): each survives the channel as it was made,
the runner serves every one, and the seeds and GPU memory each derives are the ones the grader's
oracle and ledger use."""
import json
import types

import pytest

from fa2_sandbox.runner.serve import Runner
from fa2_sandbox.wire import requests
from fa2_sandbox.wire.cases import FlashCase

CASE = FlashCase(batch=(2, 3), n_queries=33, n_keys=47, head_dim=16, dtype="bfloat16", is_causal=True)
TIMING_CASE = FlashCase(batch=(64,), n_queries=4096, n_keys=4096)

EXAMPLES = [
    requests.Flash("triton", CASE, seed=7, device="cuda", backward=False, warmup=True, second_input=True),
    requests.WarmTiming("pytorch", CASE, seed=7, once_over_s=1.5),
    requests.PrepareTiming("triton", CASE, seed=7, passes=12),
    requests.TimePasses(CASE, passes=24, per_sync=12, cycle=True),
    requests.EndTiming(save=True),
    requests.Distributed("fsdp", seed=7, spec={"model": "toy", "steps": 3}, world_size=2, timeout_s=90.0),
]


def test_every_operation_has_an_example_here():
    assert {type(r) for r in EXAMPLES} == set(requests.OPERATIONS.values())


@pytest.mark.parametrize("request_", EXAMPLES, ids=lambda r: r.op)
def test_a_request_comes_out_of_the_channel_as_it_went_in(request_):
    sent = json.loads(json.dumps(requests.envelope(request_, "call1-abcd", 3 << 30)))  # the channel's JSON lines
    assert sent["op"] == request_.op and sent["tag"] == "call1-abcd" and sent["gpu_allowance"] == 3 << 30
    assert requests.from_json(sent) == request_


def test_the_runner_serves_every_operation():
    runner = Runner(types.SimpleNamespace(send=lambda message: None), types.SimpleNamespace(), None)
    assert set(runner.handlers) == set(requests.OPERATIONS.values())


def test_a_message_that_is_no_request_is_refused_with_a_sentence():
    with pytest.raises(ValueError, match="no runner operation is called 'op_flash'; the operations are flash, "):
        requests.from_json({"op": "op_flash"})


def test_the_second_input_and_the_timed_passes_draw_seeds_no_other_call_draws():
    flash = requests.Flash("pytorch", CASE, seed=1000)
    assert flash.input_seed == 1000
    second = requests.Flash("pytorch", CASE, seed=1000, second_input=True).input_seed
    timed = requests.PrepareTiming("pytorch", CASE, seed=1000, passes=12).seeds
    assert timed == list(range(1001, 1013))  # never the warm-up's own seed
    assert second not in timed and second % 2**32 != 1000


def test_the_distributed_kinds_train_on_batches_of_their_own_seeds():
    seeds = {kind: requests.Distributed(kind, seed=50).data_seed for kind in requests.DATA_SEED_OFFSET}
    assert len(set(seeds.values())) == len(seeds) and 50 not in seeds.values()
    assert requests.Distributed("ddp", seed=50).model_seed == 50
    assert [requests.rank_model_seed(50, rank) for rank in range(2)] == [50, 51]


def test_only_flash_cases_on_cuda_get_a_gpu_allowance():
    assert requests.Flash("triton", TIMING_CASE, seed=1, device="cuda").gpu_allowance() == 19 << 30
    assert requests.TimePasses(TIMING_CASE, passes=3).gpu_allowance(dense_backward=False) == 3 << 30
    assert requests.Flash("triton", TIMING_CASE, seed=1, device="cpu").gpu_allowance() is None
    assert requests.EndTiming().gpu_allowance() is None
    assert requests.Distributed("ddp", seed=1).gpu_allowance() is None
