"""The reference DDP wrappers and sharded optimizer, checked on 2 gloo ranks on CPU.

The standard data-parallel argument: each rank trains on its slice of the batch, the loss is
a mean over equal slices, so averaged gradients equal full-batch gradients and a DDP run must
end where a single process trained on the concatenated batch ends.

Spawning ranks costs a few seconds, so each flavour spawns once (module-scoped fixture) and
runs all its scenarios; the test functions only compare the returned snapshots.

At the end, the grader's judgments of what the handout asks and what is advice beyond it
(ddp::buffers, ddp::bucketing, sharded_optimizer::state_sharded and state_balanced) on hand-made
evidence, and the probes the ranks run on structures the official tests never touch.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from fa2_sandbox.runner.distributed_ops import on_device_of, read_buffers, state_held
from fa2_sandbox.runner.ranks import run_on_ranks
from fa2_sandbox.wire.toy_models import BufferedModel, ToyModel, ToyModelWithTiedWeights, UnevenModel
from grading.checks import test_distributed as sharded_checks
from grading.checks.distributed_checks import (
    greedy_buckets,
    judge_bucketing,
    judge_buffers,
    judge_state_balanced,
    judge_state_sharded,
    rank_error,
    state_unmeasured,
)
from reference import ddp
from reference.sharded_optimizer import ShardedOptimizer, state_numel

WORLD_SIZE = 2
SEED = 0

# ---------------------------------------------------------------------------------------------
# DDP: both flavours, both toy models, against single-process training on the full batch.
# ---------------------------------------------------------------------------------------------

DDP_STEPS = 5
LOCAL_BATCH = 4
DDP_MODELS = {"toy": ToyModel, "tied": ToyModelWithTiedWeights, "buffered": BufferedModel}
# One bucket for everything; a few mixed buckets (~1 KB); and a limit every parameter exceeds.
BUCKET_SIZES_MB = [None, 0.001, 1e-6]
FLAVOURS = {
    # name: (wrap, on_train_batch_start, on_after_backward), through the adapter functions
    "individual": (lambda m, _: ddp.get_ddp_individual_parameters(m),
                   lambda model, opt: None,
                   ddp.ddp_individual_parameters_on_after_backward),
    "bucketed": (ddp.get_ddp_bucketed,
                 ddp.ddp_bucketed_on_train_batch_start,
                 ddp.ddp_bucketed_on_after_backward),
}


def _scenarios(flavour):
    sizes = BUCKET_SIZES_MB if flavour == "bucketed" else [None]
    return [(name, mb) for name in DDP_MODELS for mb in sizes]


def _snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _ddp_data():
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(DDP_STEPS, WORLD_SIZE * LOCAL_BATCH, 10, generator=g)
    y = torch.randn(DDP_STEPS, WORLD_SIZE * LOCAL_BATCH, 5, generator=g)
    return x, y


class AllReduceSpy:
    """Swaps dist.all_reduce in this process for a wrapper that records when it is called.

    The wrappers look dist.all_reduce up at call time, so they go through the spy. The test
    loop sets `in_backward` around loss.backward(). The first layer's gradient is the last one
    autograd computes, so a call made while it is still None overlaps with backward work.
    """

    def __init__(self, first_layer_weight):
        self.first_layer_weight = first_layer_weight
        self.in_backward = False
        self.calls = self.during_backward = self.before_first_layer_grad = 0

    def __enter__(self):
        self._real = dist.all_reduce
        dist.all_reduce = self._record
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self._real

    def _record(self, *args, **kwargs):
        self.calls += 1
        self.during_backward += self.in_backward
        self.before_first_layer_grad += self.first_layer_weight.grad is None
        return self._real(*args, **kwargs)


def _ddp_worker(rank, world_size, flavour, x, y):
    wrap, on_batch_start, on_after_backward = FLAVOURS[flavour]
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)  # this rank's shard
    results = {}
    for name, bucket_mb in _scenarios(flavour):
        torch.manual_seed(SEED + rank)  # different init per rank: the wrapper must broadcast
        module = DDP_MODELS[name]()
        before = _snapshot(module)
        model = wrap(module, bucket_mb)
        after_wrap = _snapshot(module)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with AllReduceSpy(module.fc1.weight) as spy:
            for step in range(DDP_STEPS):
                on_batch_start(model, optimizer)
                optimizer.zero_grad(set_to_none=True)
                loss = F.mse_loss(model(x[step, rows]), y[step, rows])
                spy.in_backward = True
                loss.backward()
                spy.in_backward = False
                on_after_backward(model, optimizer)
                optimizer.step()
        results[(name, bucket_mb)] = {
            "before": before, "after_wrap": after_wrap, "final": _snapshot(module),
            "calls": spy.calls, "during_backward": spy.during_backward,
            "before_first_layer_grad": spy.before_first_layer_grad,
            "bucket_lengths": [len(b) for b in getattr(model, "buckets", [])],
        }
    return results


def _train_single_process(name, x, y):
    torch.manual_seed(SEED)  # rank 0's seed: the run DDP must reproduce
    model = DDP_MODELS[name]()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(DDP_STEPS):
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(model(x[step]), y[step]).backward()
        optimizer.step()
    return _snapshot(model)


@pytest.fixture(scope="module", params=list(FLAVOURS))
def ddp_run(request):
    x, y = _ddp_data()
    ranks = run_on_ranks(_ddp_worker, request.param, x, y, world_size=WORLD_SIZE)
    return request.param, x, y, ranks


def test_ddp_matches_single_process_training(ddp_run):
    flavour, x, y, ranks = ddp_run
    for name, bucket_mb in _scenarios(flavour):
        expected = _train_single_process(name, x, y)
        for rank, res in enumerate(ranks):
            final = res[(name, bucket_mb)]["final"]
            for key in expected:
                torch.testing.assert_close(
                    final[key], expected[key],
                    msg=lambda m: f"{flavour} {name} bucket={bucket_mb} rank {rank} {key}: {m}")
        # Identical all-reduced grads and identical optimizers: ranks agree bit for bit.
        for key in expected:
            assert torch.equal(ranks[0][(name, bucket_mb)]["final"][key],
                               ranks[1][(name, bucket_mb)]["final"][key]), (name, bucket_mb, key)


def test_ddp_broadcasts_rank0_parameters_and_buffers(ddp_run):
    flavour, _, _, ranks = ddp_run
    for scenario in _scenarios(flavour):
        r0, r1 = ranks[0][scenario], ranks[1][scenario]
        # Seeded differently, the ranks start out different (frozen param and the buffered model's
        # buffer included; the tied model's buffer comes from a fixed generator, equal everywhere)...
        for key in r0["before"]:
            same = scenario[0] == "tied" and key == "input_shift"
            assert torch.equal(r0["before"][key], r1["before"][key]) == same, (scenario, key)
        # ...and wrapping makes every entry of the state dict equal to rank 0's.
        for key in r0["before"]:
            assert torch.equal(r1["after_wrap"][key], r0["before"][key]), (scenario, key)
            assert torch.equal(r0["after_wrap"][key], r0["before"][key]), (scenario, key)


def test_ddp_overlaps_communication_with_backward(ddp_run):
    flavour, _, _, ranks = ddp_run
    for scenario in _scenarios(flavour):
        for res in ranks:
            r = res[scenario]
            assert r["calls"] >= DDP_STEPS, scenario
            # Every all_reduce is issued from a grad hook, i.e. before backward returns.
            assert r["during_backward"] == r["calls"], scenario
            several_buckets = flavour == "individual" or len(r["bucket_lengths"]) > 1
            if several_buckets:
                # ...and some even before the first layer's gradient exists.
                assert r["before_first_layer_grad"] > 0, scenario


@pytest.mark.parametrize("ddp_run", ["bucketed"], indirect=True)
def test_ddp_bucketing(ddp_run):
    flavour, _, _, ranks = ddp_run
    for name, bucket_mb in _scenarios(flavour):
        lengths = ranks[0][(name, bucket_mb)]["bucket_lengths"]
        # Every trainable parameter in exactly one bucket: tied weight once, frozen one never.
        trainable = [p for p in DDP_MODELS[name]().parameters() if p.requires_grad]
        assert sum(lengths) == len(trainable), (name, bucket_mb, lengths)
        limit = float("inf") if bucket_mb is None else bucket_mb * 1024 ** 2
        assert len(lengths) == greedy_buckets([p.numel() * p.element_size() for p in trainable], limit)
        if bucket_mb is None:
            assert lengths == [len(trainable)]
        elif bucket_mb == 1e-6:
            assert lengths == [1] * len(trainable)
        else:
            assert 1 < len(lengths) < len(trainable), (name, bucket_mb, lengths)


# ---------------------------------------------------------------------------------------------
# Sharded optimizer: against the unsharded optimizer, same model and data.
# ---------------------------------------------------------------------------------------------

SHARDED_STEPS = 10


def _decay_groups(model):  # the usual AdamW setup: no weight decay on biases
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if n.endswith("weight")]},
            {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0}]


SHARDED_SCENARIOS = {
    # name: (optimizer class, kwargs, params at construction, param group added mid-training)
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1), _decay_groups, None),
    "sgd_momentum": (torch.optim.SGD, dict(lr=5e-2, momentum=0.9),
                     lambda m: m.parameters(), None),
    "adamw_add_param_group": (
        torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1),
        lambda m: [p for n, p in m.named_parameters() if not n.startswith("fc4.")],
        lambda m: {"params": list(m.fc4.parameters()), "lr": 3e-2, "weight_decay": 0.0}),
}


def _sharded_data():
    g = torch.Generator().manual_seed(4321)
    return (torch.randn(SHARDED_STEPS, 8, 16, generator=g),
            torch.randn(SHARDED_STEPS, 8, 4, generator=g))


def _train_uneven(scenario, x, y, sharded):
    """Same code with or without sharding. Every rank sees the same full batch, so grads
    agree without DDP and the comparison isolates the optimizer."""
    optimizer_cls, kwargs, initial_params, late_group = SHARDED_SCENARIOS[scenario]
    torch.manual_seed(SEED)
    model = UnevenModel()
    if sharded:
        optimizer = ShardedOptimizer(initial_params(model), optimizer_cls, **kwargs)
    else:
        optimizer = optimizer_cls(initial_params(model), **kwargs)
    for step in range(SHARDED_STEPS):
        if late_group is not None and step == SHARDED_STEPS // 2:
            optimizer.add_param_group(late_group(model))
        if step == SHARDED_STEPS - 3:  # what an LR scheduler does: edit the outer param_groups
            for group in optimizer.param_groups:
                group["lr"] *= 0.1
        model.zero_grad(set_to_none=True)  # also clears grads of params not yet in the optimizer
        F.mse_loss(model(x[step]), y[step]).backward()
        optimizer.step()
    return model, optimizer


def _sharded_worker(rank, world_size, x, y):
    results = {}
    for scenario in SHARDED_SCENARIOS:
        model, optimizer = _train_uneven(scenario, x, y, sharded=True)
        results[scenario] = {"final": _snapshot(model), "state_numel": state_numel(optimizer),
                             "numel_per_rank": optimizer.numel_per_rank, "state_held": state_held(optimizer)}
    return results


@pytest.fixture(scope="module")
def sharded_run():
    x, y = _sharded_data()
    return x, y, run_on_ranks(_sharded_worker, x, y, world_size=WORLD_SIZE)


@pytest.mark.parametrize("scenario", list(SHARDED_SCENARIOS))
def test_sharded_optimizer_matches_unsharded(sharded_run, scenario):
    x, y, ranks = sharded_run
    expected = _snapshot(_train_uneven(scenario, x, y, sharded=False)[0])
    for rank, res in enumerate(ranks):
        for key in expected:
            torch.testing.assert_close(res[scenario]["final"][key], expected[key],
                                       msg=lambda m: f"{scenario} rank {rank} {key}: {m}")
    for key in expected:  # the broadcast leaves every rank with the same bits
        assert torch.equal(ranks[0][scenario]["final"][key], ranks[1][scenario]["final"][key])


@pytest.mark.parametrize("scenario", list(SHARDED_SCENARIOS))
def test_sharded_optimizer_state_is_partitioned(sharded_run, scenario):
    x, y, ranks = sharded_run
    _, full = _train_uneven(scenario, x, y, sharded=False)
    per_param = [sum(v.numel() for v in s.values() if torch.is_tensor(v))
                 for s in full.state.values()]
    total, largest = sum(per_param), max(per_param)
    held = [res[scenario]["state_numel"] for res in ranks]
    # Each parameter's state lives on exactly one rank (params added late included)...
    assert sum(held) == total, (held, total)
    # ...and the split is balanced up to one parameter's worth.
    for h in held:
        assert 0 < h <= total / WORLD_SIZE + largest, (held, total, largest)
    # All ranks computed the same owner assignment: same per-rank numel tallies.
    assert ranks[0][scenario]["numel_per_rank"] == ranks[1][scenario]["numel_per_rank"]
    # The grader's count (fa2_sandbox.runner.distributed_ops.state_held) sees the same elements, and each
    # parameter with state on exactly one rank.
    assert [res[scenario]["state_held"][0] for res in ranks] == held
    assert sum(res[scenario]["state_held"][1] for res in ranks) == len(full.state)


# ---------------------------------------------------------------------------------------------
# The grader's judgments: the handout's requirement and the advice beyond it, kept apart.
# ---------------------------------------------------------------------------------------------

def test_tied_model_buffer_is_equal_on_every_rank_and_buffered_model_differs():
    """ddp::equivalence trains the tied model: its buffer must not depend on the rank's seed."""
    def build(cls, seed):
        torch.manual_seed(seed)
        return cls()
    a, b = build(ToyModelWithTiedWeights, 0), build(ToyModelWithTiedWeights, 1)
    assert torch.equal(a.input_shift, b.input_shift)
    assert not torch.equal(a.frozen_scale, b.frozen_scale)  # a weight: ddp::broadcast judges it
    assert not torch.equal(build(BufferedModel, 0).input_shift, build(BufferedModel, 1).input_shift)


def test_judge_buffers():
    mine, theirs = {"input_shift": torch.zeros(3)}, {"input_shift": torch.ones(3)}
    own = [mine, theirs]
    sentence, _, _ = judge_buffers(mine, [mine, mine], [mine, mine], own)
    assert sentence is None
    sentence, note, _ = judge_buffers(mine, [mine, theirs], [mine, mine], own)  # torch DDP: at forward
    assert sentence is None and "after the first forward" in note
    sentence, _, evidence = judge_buffers(mine, [mine, theirs], [mine, theirs], own)
    assert sentence.startswith("rank 1 kept its own buffer input_shift: buffers are not broadcast from rank 0")
    assert "The handout asks for the weights only, so this is advice" in sentence and "rank 1" in evidence


def _adamw_state(numels):
    return [2 * n + 1 for n in numels]  # exp_avg, exp_avg_sq and a scalar step tensor


@pytest.mark.parametrize("how", ["round-robin", "greedy", "lopsided", "full", "one rank"])
def test_judge_state_sharded_and_balanced(how):
    """On UnevenModel with AdamW: round-robin by count meets the handout (about 1/world_size of
    the parameters) and fails only the advice (balance by numel); greedy by numel (2 and 6
    parameters) meets both; full state everywhere, or all of it on one rank, fails the
    requirement."""
    numels = [p.numel() for p in UnevenModel().parameters()]
    state = _adamw_state(numels)
    count, total, largest = len(state), sum(state), max(state)
    owners = {"round-robin": [i % WORLD_SIZE for i in range(count)],
              "lopsided": [0, 1, 0, 1, 0, 0, 0, 0],  # rank 0: 6 of 8 parameters, 10894 of 11088 elements
              "one rank": [0] * count}.get(how)
    if how == "greedy":
        load, owners = [0] * WORLD_SIZE, [0] * count
        for i in sorted(range(count), key=lambda i: -numels[i]):
            owners[i] = min(range(WORLD_SIZE), key=load.__getitem__)
            load[owners[i]] += numels[i]
    if how == "full":
        params, held = [count] * WORLD_SIZE, [total] * WORLD_SIZE
    else:
        params = [sum(o == r for o in owners) for r in range(WORLD_SIZE)]
        held = [sum(s for s, o in zip(state, owners) if o == r) for r in range(WORLD_SIZE)]
    sharded, _ = judge_state_sharded(count, total, largest, params, held)
    balanced, _ = judge_state_balanced(count, total, largest, params, held)
    if how == "round-robin":
        assert held == [10756, 332]  # the numbers every round-robin student submission got
        assert sharded is None
        assert balanced.startswith("assign parameters by size (numel), not by count: rank 0 holds 10756 of 11088")
        assert "so this is advice" in balanced
    elif how == "greedy":
        assert params == [2, 6] and held == [6146, 4942]  # unbalanced by count, balanced by size
        assert sharded is None and balanced is None
    elif how == "lopsided":  # more than 1/world_size by count and by size
        assert sharded.startswith("rank 0's optimizer holds state for 6 of the 8 parameters")
    elif how == "full":
        assert "every rank holds the full optimizer state" in sharded
        assert "no split to balance" in balanced
    else:
        assert "rank 1 holds no optimizer state" in sharded


# ---------------------------------------------------------------------------------------------
# Bucketing, and the probes of what the official tests never read (guarded: advice only).
# ---------------------------------------------------------------------------------------------

def _trainable_bytes(cls):
    return [p.numel() * p.element_size() for p in cls().parameters() if p.requires_grad]


def test_greedy_buckets_counts_the_reference_buckets():
    """greedy_buckets counts what reference/ddp.py DDPBucketed builds; the ranks above record its
    bucket lists for the same models and sizes (test_ddp_bucketing)."""
    counts = {ToyModel: {None: 1, 0.001: 4, 1e-6: 5}, ToyModelWithTiedWeights: {None: 1, 0.001: 6, 1e-6: 7}}
    for cls, by_size in counts.items():
        for mb, want in by_size.items():
            limit = float("inf") if mb is None else mb * 1024 ** 2
            assert greedy_buckets(_trainable_bytes(cls), limit) == want, (cls.__name__, mb)
    # the grader's bucket size: several parameters share a bucket, whichever megabyte is meant
    for cls in (ToyModel, ToyModelWithTiedWeights):
        sizes = _trainable_bytes(cls)
        assert greedy_buckets(sizes, 0.0025 * 1024 ** 2) <= 3 < len(sizes)
        assert greedy_buckets(sizes, 0.0025 * 10 ** 6) <= 3
        assert greedy_buckets(list(reversed(sizes)), 0.0025 * 10 ** 6) <= 3  # filled in forward order


def test_judge_bucketing():
    sizes, limit = _trainable_bytes(ToyModel), 0.0025 * 1024 ** 2  # 5 parameters, 2 reference buckets
    numels = [s // 4 for s in sizes]
    alone = [[list(reversed(numels))] * 3 for _ in range(WORLD_SIZE)]  # one collective per parameter
    sentence, evidence = judge_bucketing(sizes, limit, alone)
    assert sentence.startswith("gradients are not bucketed: on rank 0, step 1 issued 5 reducing collectives for "
                               "the 5 parameters")
    assert "the reference needs 2" in sentence and "5 parameters get gradients" in evidence
    bucketed = [[[numels[4] + numels[3] + numels[2], numels[1] + numels[0]]] * 3 for _ in range(WORLD_SIZE)]
    assert judge_bucketing(sizes, limit, bucketed)[0] is None
    one_flat = [[[sum(numels)]] * 3 for _ in range(WORLD_SIZE)]  # grouped otherwise: the student's choice
    assert judge_bucketing(sizes, limit, one_flat)[0] is None
    # a bucket size no two parameters fit in: one per parameter is right, nothing to judge
    assert judge_bucketing(sizes, 1.0, alone)[0] is None


class _NoSuperInit(torch.optim.Optimizer):
    """A sharded optimizer that never calls Optimizer.__init__: no .state of its own."""

    def __init__(self, params, keep_inner=True):
        inner = torch.optim.AdamW(params)
        if keep_inner:
            self.inner = inner
        else:  # its state out of the count's reach: only a closure holds the inner optimizer
            self.step = lambda closure=None: inner.step(closure)


def test_state_held_reads_past_an_optimizer_without_state():
    p = torch.nn.Parameter(torch.ones(3))
    optimizer = _NoSuperInit([p])
    p.grad = torch.ones(3)
    optimizer.inner.step()
    assert state_held(optimizer) == (7, 1)  # exp_avg, exp_avg_sq and step, of one parameter


def test_state_unmeasured():
    assert state_unmeasured([{"state_numel": 7}, {"state_numel": 0}]) is None
    assert "keeps its state elsewhere" in state_unmeasured([{"state_numel": 0}, {"state_numel": 0}])
    raised = state_unmeasured([{"state_numel": 7}, {"state_unread": "reading the optimizer's state raised X"}])
    assert raised == "rank 1: reading the optimizer's state raised X"
    p = torch.nn.Parameter(torch.ones(3))
    hidden = _NoSuperInit([p], keep_inner=False)
    p.grad = torch.ones(3)
    hidden.step()
    numel, held = state_held(hidden)
    assert (numel, held) == (0, 0)
    assert state_unmeasured([{"state_numel": numel, "state_params": held}] * 2) is not None


class _PlainWrapper:
    """A DDP wrapper that is no nn.Module: the official tests read only these attributes."""

    def __init__(self, module, expose_module=True):
        if expose_module:
            self.module = module
        self._module = module

    def __call__(self, x):
        return self._module(x)

    def parameters(self):
        return self._module.parameters()

    def named_parameters(self):
        return self._module.named_parameters()


def test_read_buffers_of_a_plain_class_wrapper():
    model = BufferedModel()
    bare = dict(model.named_buffers())
    result = {}
    read_buffers(_PlainWrapper(model), bare, result, "buffers")  # through .module
    assert set(result) == {"buffers"} and torch.equal(result["buffers"]["input_shift"], model.input_shift)
    result = {}
    read_buffers(_PlainWrapper(model, expose_module=False), bare, result, "buffers")
    assert "buffers" not in result
    assert result["buffers_unread"] == "the wrapper (_PlainWrapper) has no named_buffers() and no .module that has"
    read_buffers(model, bare, result, "buffers1")  # once unread, the later probe keeps the first reason
    assert "buffers1" not in result


def test_data_go_to_the_device_of_the_parameters():
    """An FSDP wrapper may move the module to CUDA; the meta device stands in for it here."""
    x, y = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    moved = torch.nn.Linear(3, 3).to("meta")
    assert all(t.device.type == "meta" for t in on_device_of(list(moved.parameters()), x, y))
    assert on_device_of([], x, y) == (x, y)


def test_a_rank_error_counts_training_steps_from_one():
    """The add-group scenario adds its group after 3 steps, so a rank that raises in add_param_group
    says so ("called after training step 3"), and one that raises in a step names it counted from 1."""
    add_after = sharded_checks.SHARDED_SCENARIOS["adamw-add-group"]["add_after"]
    labels = sharded_checks.SHARDED_LABELS
    ranks = [{"status": "error", "message": "KeyError: 'params'", "phase": "add_param_group", "step": add_after},
             {"status": "ok"}]
    assert rank_error(ranks, labels)[0] == (
        f"rank 0 raised KeyError: 'params' (in add_param_group, called after training step {add_after}).")
    ranks[0].update(phase="step", step=add_after)
    assert rank_error(ranks, labels)[0] == (
        f"rank 0 raised KeyError: 'params' (in the optimizer's step, during training step {add_after + 1}).")
    ranks[0].update(phase="construct", step=-1)
    assert rank_error(ranks, labels)[0] == "rank 0 raised KeyError: 'params' (in get_sharded_optimizer)."
