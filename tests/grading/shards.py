"""Which runner of its submission a grading test uses: one submission spread over xdist workers.

Under xdist a submission's tests go to workers by group (`--dist loadgroup`), and each worker
holds one runner per group. With one group per submission, a submission is graded by one
process: a correct Triton kernel spent about 10 s compiling and autotuning per case, one case
after another, and one submission took over 9 minutes on an H100 (notes/grading-speed.md).
So a submission's tests are split into shards that share nothing but the student's code:

- the Triton slot by (dtype, causal, head dim): the key Triton compiles a kernel for, so no
  two shards compile the same kernel, and each shard's autotuning covers its own lengths;
- the PyTorch slot as one shard (it runs on the CPU, where compiling costs nothing);
- the distributed checks (DDP, the sharded optimizer, FSDP) as one shard: its runner keeps its
  ranks from one call to the next (fa2_adapters/runner/ranks.py RankPool), so one spawn serves
  them all where a shard each cost a runner start and a spawn each;
- timing and memory by slot.

A Triton slot that is the template's NotImplementedError stub stays one shard: splitting it
would start a runner per shard only to learn that it is not attempted. Without a GPU, without
xdist or with one worker there is one shard per submission: there is no compiling to spread,
and each shard would add a runner start (on a 2-core CPU the reference took 71 s instead of 45).

A shard's group name is "<submission>/<shard>"; xdist splits group names at "@", so neither
part may hold one (a directory name never holds "/").
"""
from fa2_adapters.wire.cases import FLASH_SLOTS, SHORT

SEPARATOR = "/"


def is_distributed(item) -> bool:
    """DDP, the sharded optimizer and FSDP: checks whose runner calls run on its ranks."""
    return item.module.__name__.rsplit(".", 1)[-1] in ("test_distributed", "test_fsdp")


def shard_of(item, stubs: set) -> str:
    """The shard of a grading test, from its module, its name and its parameters."""
    params = item.callspec.params
    module = item.module.__name__.rsplit(".", 1)[-1]
    if module in ("test_timing", "test_memory"):
        return f"{module.removeprefix('test_')}-{params['slot']}"
    if is_distributed(item):
        return "distributed"
    slot = params.get("slot", "pytorch")  # test_runs_on_cuda has no slot: the PyTorch class
    case = params.get("case")
    if slot != "triton" or FLASH_SLOTS["triton"] in stubs or case is None:
        return slot
    return f"triton-{SHORT[case.dtype]}-{'causal' if case.is_causal else 'full'}-d{case.head_dim}"


# Longest first: xdist's loadgroup hands groups to idle workers in collection order, so a run
# whose longest shards come last ends with a few workers busy while the rest wait. Measured on an
# H100, the bundled reference, cold / warm Triton cache (notes/grading-speed.md, 2026-11-25):
# the Triton timing shard 47 / 25 s; the PyTorch slot (79 checks on the CPU) 25 / 24 s; the
# distributed shard 21 / 22 s; the PyTorch timing shard 19 / 21 s; a Triton shard 18 to 43 /
# 15 to 21 s; Triton memory 31 / 15 s; PyTorch memory 13 s.
HEAVY_FIRST = ("timing-triton", "pytorch", "distributed", "timing-pytorch", "triton", "memory-triton")


def cost_rank(shard: str) -> int:
    """Where a shard's tests go in the run order: the position of its kind in HEAVY_FIRST."""
    return next((i for i, kind in enumerate(HEAVY_FIRST) if shard.startswith(kind)), len(HEAVY_FIRST))


def group_name(submission: str, shard: str) -> str:
    return f"{submission}{SEPARATOR}{shard}" if shard else submission


def submission_of_group(group: str) -> str:
    return group.split(SEPARATOR, 1)[0]
