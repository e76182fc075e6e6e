"""Which runner of its submission a grading test uses: one submission spread over xdist workers.

Under xdist a submission's tests go to workers by xdist group (`--dist loadgroup`), here a
submission's track, and each worker holds one runner per track. With one track per submission, a
submission is graded by one
process: a correct Triton kernel compiles and autotunes for every case, one case after another,
and one submission took many minutes (notes/grading-speed.md, "one runner per submission").
So a submission's tests are split into tracks that share nothing but the student's code (tracks, not
shards: in the handout a shard is the sharded optimizer's and FSDP's):

- the Triton slot by (dtype, causal, head dim): the key Triton compiles a kernel for, so no
  two tracks compile the same kernel, and each track's autotuning covers its own lengths; in a
  class whose Triton tracks by (dtype, causal) fill the workers, by (dtype, causal) (per_kernel_tracks);
- the PyTorch slot as one track (it runs on the CPU, where compiling costs nothing);
- the distributed checks (DDP, the sharded optimizer, FSDP) as one track: its runner keeps its
  ranks from one call to the next (fa2_sandbox/runner/ranks.py RankPool), so one spawn serves
  them all where a track each cost a runner start and a spawn each;
- timing by slot (the PyTorch slot's runs_on_cuda joins its timing runner, so that the slot's
  runner on the CPU never starts CUDA), and the Triton slot's memory (its own runner at N = 16384 on a GPU). The
  PyTorch slot's memory check joins the PyTorch track: it runs on the CPU at MEMORY_CASE, one of
  the slot's own cases, so the slot's cached reply serves it at no cost, and the "tiled, never
  N x N" requirement is graded wherever the slot is (a memory track of its own ran the case a
  second time in a runner of its own, and went ungraded where that track did not run).

A Triton slot that is the template's NotImplementedError stub stays one track: splitting it
would start a runner per track only to learn that it is not attempted. Without a GPU, without
xdist or with one worker there is one track per submission: there is no compiling to spread,
and each track would add a runner start, which made the reference slower on a CPU of few cores
(notes/grading-speed.md, "A submission spreads over the workers").

A submission's track is named "<submission>/<track>" (submission_track), its xdist group's name;
xdist splits group names at "@", so neither part may hold one (a directory name never holds "/").
"""
from dataclasses import dataclass, field

import pytest

from fa2_sandbox.wire.cases import FLASH_SLOTS, SHORT, FlashCase
from grading.declaration import declaration

SEPARATOR = "/"


@dataclass(frozen=True)
class Kind:
    """What every track of a kind shares: its place in the run order, and whether its check holds
    the GPU alone for a measured window (timing) or runs at N = 16384 (memory)."""
    rank: int
    timing: bool = False
    memory: bool = False


# The kinds, longest first: xdist's loadgroup hands groups to idle workers in collection order, so
# a run whose longest tracks come last ends with a few workers busy while the rest wait. Triton
# memory comes first of all: it runs the Triton slot at 16384x16384, where a slot that is PyTorch
# tiles in a Python loop takes minutes (the example triton_slot_without_triton). Then the PyTorch
# slot and the distributed checks, then the Triton tracks. The Triton tracks before the PyTorch
# slot, tried on the corpus class (one H200, -n 16), recorded fewer checks, finished fewer
# submissions and cut more advice checks: every submission's compiling and autotuning at once made
# each slower, the Triton checks used up the submissions' time limits first, and the slow PyTorch
# slots (a tiled loop under torch.compile) came last (notes/grading-speed.md, "The Triton shards
# first"). Timing tracks sort last here, but the scheduler (grading/scheduler.py) spreads them
# through the run, a few at a time per GPU: their measured windows pause the others' GPU calls
# (gpu_ledger.py), and handed out together at the end they queued behind each other.
KINDS = {
    "memory-triton": Kind(rank=0, memory=True),
    "pytorch": Kind(rank=1),
    "distributed": Kind(rank=2),  # one runner, its ranks kept between calls
    "triton": Kind(rank=3),  # "triton-<dtype>-<causal>[-d<head dim>]", or "triton" for a stub
    "timing-triton": Kind(rank=4, timing=True),
    "timing-pytorch": Kind(rank=5, timing=True),
    "": Kind(rank=6),  # the whole submission, one runner: one track (a CPU, one worker)
}
HEAVY_FIRST = tuple(kind for kind in KINDS if kind)
# The kinds whose runners run the Triton slot's flash cases (its timing runner measures one only).
TRITON_CASES = (KINDS["triton"], KINDS["memory-triton"])


def kind_of(name: str) -> str:
    """The kind of a track's name: the kind itself, or the kind followed by "-" and its key."""
    kind = next((kind for kind in KINDS if name == kind or (kind and name.startswith(kind + "-"))), None)
    if kind is None:
        raise ValueError(f"no track kind named {name!r}: a track's name is one of {', '.join(HEAVY_FIRST)}, or one "
                         f"of them followed by '-' and its key. A new kind goes in grading/tracks.py KINDS, with "
                         f"its place in the run order.")
    return kind


@dataclass(frozen=True)
class Track:
    """One runner of a submission: its name ("triton-bf16-causal-d64", say), which its submission_track
    and its runner's log carry, and its kind's properties. An unknown name is refused."""
    name: str
    kind: Kind = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "kind", KINDS[kind_of(self.name)])

    @property
    def rank(self) -> int:
        return self.kind.rank

    @property
    def timing(self) -> bool:
        return self.kind.timing

    @property
    def memory(self) -> bool:
        return self.kind.memory

    def __str__(self) -> str:
        return self.name


WHOLE = Track("")
DISTRIBUTED = Track("distributed")


def is_distributed(item) -> bool:
    """DDP, the sharded optimizer and FSDP: checks whose runner calls run on its ranks."""
    return declared_track(item, True) == DISTRIBUTED


def declared_track(item, per_kernel: bool) -> Track:
    """The track a checks module gives a test of its own: each module under grading/checks
    declares `track(params, per_kernel)` in its `grading` marker (grading/declaration.py), so a
    new module says where its checks run."""
    track = declaration(item, "track")(item.callspec.params, per_kernel)
    if not isinstance(track, Track):
        raise pytest.UsageError(f"{item.module.__name__}'s track gave {track!r} for {item.originalname}, not a "
                                f"Track (grading/tracks.py)")
    return track


def track_of(item, stubs: set, per_kernel: bool = True) -> Track:
    """The track of a grading test, as its module declares it. A Triton slot that is the
    template's stub stays one track ("triton"), however its module would split it."""
    track = declared_track(item, per_kernel)
    if track.kind is KINDS["triton"] and FLASH_SLOTS["triton"] in stubs:
        return Track("triton")
    return track


def kernel_track(case: FlashCase, per_kernel: bool = True) -> Track:
    """The Triton track of a case: what Triton compiles a kernel for (dtype, causal flag, head
    dim), or without `per_kernel` the kernels of one dtype and causal flag."""
    name = f"triton-{SHORT[case.dtype]}-{'causal' if case.is_causal else 'full'}"
    return Track(f"{name}-d{case.head_dim}" if per_kernel else name)


def timing_track(slot: str) -> Track:
    """A slot's timing runner: the timing check, and for the PyTorch slot its runs_on_cuda check
    (the one other check that puts that class on CUDA)."""
    return Track(f"timing-{slot}")


# The Triton tracks of a submission without a track per kernel: bfloat16 and float32, each causal or not.
KERNEL_FAMILIES = 4


def per_kernel_tracks(submissions: int, workers: int) -> bool:
    """Whether the Triton slot gets a track per kernel. A track per kernel lets one submission's
    kernels compile on every worker at once, but each track starts a runner (seconds of a core:
    Python, torch, triton, the adapters), and the handout's matrix holds 19 kernels. Where the
    Triton tracks by (dtype, causal flag) already fill the workers, the starts are the CPU's cost
    and nothing is gained: the corpus class on a 2-GPU host, split per kernel, made many more
    tracks and ran CPU-bound, its runner starts taking more core time than one GPU's workers
    spent on theirs in a whole run, and it recorded fewer checks than one GPU by the same time
    (notes/grading-speed.md, "A shard per Triton kernel on two GPUs"). So a submission is
    spread that thin only while its class's (dtype, causal) tracks would leave workers idle."""
    return submissions * KERNEL_FAMILIES < workers


def tracks_together(items: list, track_of_item) -> None:
    """Each submission track's checks one after another, the tracks in the order they first appear,
    each keeping its own order (`track_of_item(item)`: its submission_track, or None for a test of none).

    xdist hands out whole tracks, but without it (-n 0) tests run in this list's order, which
    pytest's own reordering leaves interleaved across submissions; and a process closes a track's
    runner when the next track's check comes (session.WorkerState._switch_to). A submission's runner
    then restarted between two of its checks: a cost, and a verdict that depended on -n (a
    replaying submission's cache was lost, so a check it failed under -n 2 passed under -n 0)."""
    keys = [track_of_item(item) or ("no track", index) for index, item in enumerate(items)]
    first = {}
    for index, key in enumerate(keys):
        first.setdefault(key, index)
    order = sorted(range(len(items)), key=lambda index: first[keys[index]])  # stable
    items[:] = [items[index] for index in order]


def memory_early(items: list, track_of_item) -> None:
    """Within each submission track (`track_of_item(item)`, None for none), the memory checks go right
    after the track's first check of a flash case (its smallest, once smallest_case_first has run), or
    first where it has none; the distributed checks keep their places (first where a runner holds
    them: its ranks serve them one after another), the other checks their order.

    Collected last (test_memory.py after test_flash.py), the PyTorch slot's "tiled, never N x N"
    requirement came after some eighty cases: a runner that died on one of them left it failed or
    ungraded. Not first: a class that hangs must time out on the smallest case, not on the memory
    case and then again on every smaller one (SubmissionRunner.call fails larger cases at once)."""
    places = {}
    for index, item in enumerate(items):
        if (track := track_of_item(item)) is not None and not is_distributed(item):
            places.setdefault(track, []).append(index)
    for indices in places.values():
        members = [items[i] for i in indices]
        memory = [item for item in members if is_memory(item)]
        rest = [item for item in members if not is_memory(item)]
        first_case = next((k for k, item in enumerate(rest) if isinstance(flash_case(item), FlashCase)), -1)
        ordered = rest[:first_case + 1] + memory + rest[first_case + 1:]
        for index, item in zip(indices, ordered):
            items[index] = item


def is_memory(item) -> bool:
    return item.module.__name__.rsplit(".", 1)[-1] == "test_memory"


def smallest_case_first(items: list, track_of_item) -> None:
    """Within each submission track (`track_of_item(item)`, None for none), the checks that run a flash case
    go smallest case first, in the places those checks held; the other checks keep theirs.

    A runner fails at once every case no smaller than one that timed out (SubmissionRunner.call).
    Smallest first, a submission that hangs waits out one timeout per slot, not one per size: in
    collection order its PyTorch slot timed out on 128x128, then the 1024x1024 hygiene case, then
    17x17, a timeout each (tests/self's hostile rubric's, and the rubric's full timeout on a GPU)."""
    places = {}
    for index, item in enumerate(items):
        if isinstance(flash_case(item), FlashCase) and (track := track_of_item(item)) is not None:
            places.setdefault(track, []).append(index)
    for indices in places.values():
        ordered = sorted((items[i] for i in indices), key=lambda item: flash_case(item).work)  # stable
        for index, item in zip(indices, ordered):
            items[index] = item


def flash_case(item):
    """The FlashCase a grading test runs (its `case` parameter), or None."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("case") if callspec is not None else None


def submission_track(submission: str, track: Track) -> str:
    """A submission's track by name, "alice/triton-bf16-causal" ("alice" for WHOLE): its xdist group."""
    return f"{submission}{SEPARATOR}{track.name}" if track.name else submission
