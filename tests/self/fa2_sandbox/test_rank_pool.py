"""A runner's ranks serve every distributed check of its submission (fa2_sandbox/runner/ranks.py):
kept from one successful call to the next, started afresh after any failure."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from fa2_sandbox.runner.ranks import RankPool


def _pid_and_sum(rank, world_size, value):
    t = torch.tensor([float(value + rank)])
    dist.all_reduce(t)
    return os.getpid(), t.item(), dist.get_world_size()


def _rank1_raises(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 broke")
    dist.barrier()  # rank 0 waits for a peer that never comes


def _rank1_dies(rank, world_size):
    if rank == 1:
        os._exit(0)  # a clean exit code is still a death: a pool's rank only ends when told to
    dist.barrier()


def test_the_ranks_stay_for_the_next_call():
    with RankPool(world_size=2) as pool:
        first = pool.run(_pid_and_sum, 1, timeout_s=60)
        second = pool.run(_pid_and_sum, 10, timeout_s=60)
    assert [r[1:] for r in first] == [(3.0, 2), (3.0, 2)]  # (1 + 0) + (1 + 1), a group of 2
    assert [r[1:] for r in second] == [(21.0, 2), (21.0, 2)]  # a fresh process group, same ranks
    assert [r[0] for r in first] == [r[0] for r in second]
    assert not pool.procs  # closed


@pytest.mark.parametrize("broken", [_rank1_raises, _rank1_dies])
def test_a_failed_call_ends_the_ranks_at_once_and_the_next_starts_fresh(broken):
    with RankPool(world_size=2) as pool:
        before = pool.run(_pid_and_sum, 0, timeout_s=60)
        started = time.monotonic()
        # whichever is seen first: rank 1's own error or death, or rank 0's peer gone
        with pytest.raises(RuntimeError, match="rank [01] of 2 failed:|rank\\(s\\) \\[1\\] exited with codes"):
            pool.run(broken, timeout_s=60, collective_timeout_s=30)
        assert time.monotonic() - started < 15  # rank 0 was killed, not waited for (30 s)
        assert not pool.procs
        after = pool.run(_pid_and_sum, 0, timeout_s=60)
    assert [r[1] for r in after] == [1.0, 1.0]
    assert not {r[0] for r in before} & {r[0] for r in after}
