"""What the grader asks a runner: one frozen dataclass per operation.

The harness sends a request as JSON (`to_json`, with the call's tag and GPU allowance around it:
`envelope`), and the runner reads it back (`from_json`) and dispatches on its class
(fa2_sandbox/runner/serve.py). Each operation says here, once, for both sides of the channel:
- `op`, its name on the wire;
- the seeds it draws its inputs from, derived from the check's seed: the runner draws them, and
  the grader's oracle draws the same ones from the same rule;
- the GPU memory it may use (`gpu_allowance`), which the harness's GPU ledger reserves
  (fa2_sandbox/harness/gpu_ledger.py); None for an operation that runs no flash case on a GPU.
"""
from dataclasses import dataclass, field, fields
from typing import ClassVar

from fa2_sandbox.wire.cases import FlashCase

# What the harness wraps around a request's own fields: the tag the reply must carry, and the
# allowance the runner holds itself to (serve.py hold_to_allowance).
ENVELOPE = ("tag", "gpu_allowance")


def second_input_seed(seed: int) -> int:
    """The seed of a case's second input (grading/checks/flash_checks.py run_case): it changes
    the low 32 bits, the only ones the CPU generator keeps, and in a pattern that adding a few
    thousand (the timing passes' seeds) cannot give."""
    return seed ^ 0x9E3779B9


def timed_seeds(seed: int, count: int) -> list:
    """The seeds of a side's timed passes: one input each, none the warm pass's (`seed`)."""
    return [seed + 1 + i for i in range(count)]


# Each distributed kind trains on batches of its own seed, the check's seed plus its offset; the
# models start from the check's seed itself.
DATA_SEED_OFFSET = {"ddp": 1, "sharded": 2, "fsdp": 3}


def data_seed(kind: str, seed: int) -> int:
    """The seed of the batches a distributed kind trains on."""
    return seed + DATA_SEED_OFFSET[kind]


def rank_model_seed(seed: int, rank: int) -> int:
    """The seed of the model a DDP rank builds before the wrapper broadcasts rank 0's: each rank
    starts from weights of its own, so a wrapper that skips the broadcast shows."""
    return seed + rank


class Request:
    """What every operation shares: its wire form."""
    op: ClassVar[str]

    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if isinstance(data.get("case"), FlashCase):
            data["case"] = data["case"].to_json()
        return {"op": self.op, **data}

    def gpu_allowance(self, dense_backward: bool = True) -> int | None:
        return None


@dataclass(frozen=True)
class FlashRequest(Request):
    """Shared by the operations that run a slot's class on a flash case: the GPU memory one
    call of the case may use there (FlashCase.gpu_allowance_bytes)."""

    def gpu_allowance(self, dense_backward: bool = True) -> int | None:
        if self.device != "cuda":
            return None
        return self.case.gpu_allowance_bytes(dense_backward)


@dataclass(frozen=True)
class Flash(FlashRequest):
    """One forward (and backward) of a slot's class on a case's inputs, which come back as tensors.
    `warmup` runs the case once first, so compiling and autotuning stay out of what is measured."""
    op: ClassVar[str] = "flash"
    slot: str
    case: FlashCase
    seed: int  # the check's
    device: str = "cpu"
    backward: bool = True
    warmup: bool = False
    second_input: bool = False  # the case's second input, which nothing else draws
    # Watch every aten op the call makes (library attention called, the largest tensor built):
    # only the checks that read these ask for it (grading/matrix.py WATCHED_CASES), since a
    # Python dispatch mode on every op made a PyTorch tile loop 3 to 5 times as costly in CPU.
    watch_ops: bool = False

    @property
    def input_seed(self) -> int:
        return second_input_seed(self.seed) if self.second_input else self.seed


@dataclass(frozen=True)
class WarmTiming(FlashRequest):
    """A timing budget's warm-up: a pass that compiles and autotunes, and a second unless the first
    took over `once_over_s`. Its inputs are drawn from the check's seed."""
    op: ClassVar[str] = "warm_timing"
    slot: str
    case: FlashCase
    seed: int
    device: str = "cuda"
    once_over_s: float | None = None  # None: always the second pass


@dataclass(frozen=True)
class PrepareTiming(FlashRequest):
    """Draw the inputs of `passes` timed passes (timed_seeds) and keep them on the device."""
    op: ClassVar[str] = "prepare_timing"
    slot: str
    case: FlashCase
    seed: int
    passes: int
    device: str = "cuda"

    @property
    def seeds(self) -> list:
        return timed_seeds(self.seed, self.passes)


@dataclass(frozen=True)
class TimePasses(FlashRequest):
    """`passes` forward+backward passes on the prepared inputs, synchronized after every `per_sync`;
    with `cycle` (the reference only) round the prepared inputs, which stay."""
    op: ClassVar[str] = "time_passes"
    case: FlashCase
    passes: int
    per_sync: int = 1
    cycle: bool = False
    device: str = "cuda"


@dataclass(frozen=True)
class EndTiming(Request):
    """The prepared inputs go; with `save`, the last timed pass's outputs come back with its seed."""
    op: ClassVar[str] = "end_timing"
    save: bool = False


@dataclass(frozen=True)
class Distributed(Request):
    """`world_size` gloo ranks training `kind` ("ddp", "sharded", "fsdp") on `spec` (the models,
    steps, batch and learning rate: fa2_sandbox/runner/distributed_ops.py). The models start from
    the check's seed, the batches from data_seed(kind, seed)."""
    op: ClassVar[str] = "distributed"
    kind: str
    seed: int
    spec: dict = field(default_factory=dict)
    world_size: int = 2
    timeout_s: float = 180.0

    @property
    def model_seed(self) -> int:
        return self.seed

    @property
    def data_seed(self) -> int:
        return data_seed(self.kind, self.seed)


OPERATIONS = {cls.op: cls for cls in (Flash, WarmTiming, PrepareTiming, TimePasses, EndTiming, Distributed)}


def envelope(request: Request, tag: str, gpu_allowance: int | None = None) -> dict:
    """The message the harness sends: the request's fields, its tag and its allowance."""
    return {**request.to_json(), "tag": tag, "gpu_allowance": gpu_allowance}


def from_json(data: dict) -> Request:
    """The request a message carries (the envelope's fields left out); ValueError for a message
    that is no request of OPERATIONS."""
    cls = OPERATIONS.get(data.get("op")) if isinstance(data, dict) else None
    if cls is None:
        raise ValueError(f"no runner operation is called {data.get('op') if isinstance(data, dict) else data!r}; "
                         f"the operations are {', '.join(OPERATIONS)}")
    given = {k: v for k, v in data.items() if k != "op" and k not in ENVELOPE}
    if isinstance(given.get("case"), dict):
        given["case"] = FlashCase.from_json(given["case"])
    return cls(**given)

