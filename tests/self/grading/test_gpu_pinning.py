"""Workers on a host of several GPUs (grading/session.py WorkerState.worker_gpu): round-robin,
the same GPU for a worker's own CUDA work and for its runners, none where the user chose. And
the cores they share: those the process may run on, not all the machine's."""
import os
from types import SimpleNamespace

import pytest
import torch

from grading.session import WorkerState, usable_cores


def pinned(monkeypatch, worker, gpus, on_gpu=True, visible=None):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    grading = SimpleNamespace(on_gpu=on_gpu, threads=1)
    grading.worker_gpu = lambda: WorkerState.worker_gpu(grading)
    return WorkerState.worker_gpu(grading), WorkerState.worker_env(grading).get("CUDA_VISIBLE_DEVICES")


def test_workers_go_round_robin(monkeypatch):
    assert [pinned(monkeypatch, f"gw{i}", 2) for i in range(4)] == [(0, "0"), (1, "1"), (0, "0"), (1, "1")]


def test_no_pinning_with_one_gpu_none_or_a_users_choice(monkeypatch):
    assert pinned(monkeypatch, "gw3", 1) == (None, None)
    assert pinned(monkeypatch, "gw3", 2, on_gpu=False) == (None, None)
    assert pinned(monkeypatch, "gw3", 2, visible="2,3") == (None, None)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this OS")
def test_the_cores_shared_are_the_affinitys(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6})  # taskset -c 4-6, or a Slurm cpuset
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cores() == 3
