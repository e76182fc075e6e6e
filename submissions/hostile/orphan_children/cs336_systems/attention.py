"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

import os
import subprocess
import sys

SLEEP = "import time; time.sleep(1000)"


def spawn():
    subprocess.Popen([sys.executable, "-c", SLEEP, "hostile-orphan-popen"])
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", SLEEP, "hostile-orphan-fork"])
    if os.fork() == 0:  # double fork + setsid: a daemon outside the runner's process group
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", SLEEP, "hostile-orphan-setsid"])
        os._exit(0)


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        spawn()
        return NaiveAttention.forward(ctx, q, k, v, is_causal)

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
