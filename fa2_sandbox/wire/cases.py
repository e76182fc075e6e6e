"""Attention test cases and their inputs, drawn the same way in the harness and the runner.

A case is plain data (it travels to the runner as JSON). Inputs come from a generator seeded by
the run's seed and the case, so the runner and the harness, in different processes, draw
identical tensors without ever sending them across.
"""
import zlib
from dataclasses import asdict, dataclass

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}
SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}
# The attention slots a request names, and the adapter function that returns each slot's class.
FLASH_SLOTS = {
    "pytorch": "get_flashattention_autograd_function_pytorch",
    "triton": "get_flashattention_autograd_function_triton",
}


@dataclass(frozen=True)
class FlashCase:
    batch: tuple = (4,)  # leading dims: (B,) gives 3-D inputs, (B, H) gives 4-D
    n_queries: int = 128
    n_keys: int = 128
    head_dim: int = 64
    dtype: str = "float32"
    is_causal: bool = False
    noncontiguous: bool = False  # q, k, v and dO arrive as strided views, not contiguous
    score_scale: float = 1.0  # q and k are multiplied by this: large-magnitude scores
    score_shift: float = 0.0  # every score moves by about this much (e.g. -200: all far below 0)

    @property
    def id(self) -> str:
        parts = [SHORT[self.dtype], f"{self.n_queries}x{self.n_keys}", f"d{self.head_dim}",
                 "causal" if self.is_causal else "full"]
        if len(self.batch) != 1:
            parts.append(f"{len(self.batch) + 2}d")
        if self.noncontiguous:
            parts.append("strided")
        if self.score_scale != 1.0:
            parts.append(f"x{self.score_scale:g}")
        if self.score_shift:
            parts.append(f"shift{self.score_shift:g}")
        return "-".join(parts)

    @property
    def kernel(self) -> str:
        """What a Triton kernel is compiled for: dtype, causal flag and head dim, which are its
        constexprs in every course solution, and whether each length divides by 16, which Triton
        specializes integer arguments on ("fp32-causal-d64-q16-k"). Two cases of one kernel share
        a compile in one runner; two of different kernels may compile side by side in two."""
        divides = lambda n: "16" if n % 16 == 0 else ""  # noqa: E731
        return (f"{SHORT[self.dtype]}-{'causal' if self.is_causal else 'full'}-d{self.head_dim}"
                f"-q{divides(self.n_queries)}-k{divides(self.n_keys)}")

    @property
    def work(self) -> int:
        """batch x N_q x N_k x d: what one call's matmuls cost, up to a constant, for sizing cases."""
        size = self.n_queries * self.n_keys * self.head_dim
        for b in self.batch:
            size *= b
        return size

    def gpu_allowance_bytes(self, dense_backward: bool = True) -> int:
        """The GPU memory a runner is allowed for one call of this case (gpu_ledger.py): 1 GiB of
        slack, 32 copies of q in float32 (inputs, outputs, gradients, accumulators) and, for a
        student's class, room for what the handout allows a backward: a dense one under
        torch.compile holds the scores S (or P), dP and dS in float32 and a temporary, 4 matrices
        of N_q x N_k. At the timing shape (64 x 4096 x 4096) that is 19 GiB (3 GiB without the
        dense backward: the reference's); at the course's (4 x 128 x 128), 1 GiB."""
        rows = self.work // self.head_dim // self.n_keys  # batch x N_q
        scores = 4 * 4 * rows * self.n_keys if dense_backward else 0
        return (1 << 30) + 32 * 4 * rows * self.head_dim + scores

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "FlashCase":
        return cls(**{**data, "batch": tuple(data["batch"])})


def _draw(shape, generator, case: FlashCase, device, scale=1.0) -> torch.Tensor:
    *batch, n, d = shape
    if case.noncontiguous:  # drawn as (N, *batch, d), then viewed as (*batch, N, d)
        t = torch.randn((n, *batch, d), generator=generator, device=device).movedim(0, -2)
    else:
        t = torch.randn(shape, generator=generator, device=device)
    return (t * scale).to(dtype=case.torch_dtype)


def make_inputs(case: FlashCase, seed: int, device="cpu"):
    """q, k, v and the upstream gradient dO for `case` under `seed`, drawn on `device` by that
    device's generator (large timing inputs would take seconds to draw on a CPU). Both sides
    of a comparison must therefore name the same device."""
    generator = torch.Generator(device=device).manual_seed(seed ^ zlib.crc32(case.id.encode()))
    q_shape = (*case.batch, case.n_queries, case.head_dim)
    kv_shape = (*case.batch, case.n_keys, case.head_dim)
    q = _draw(q_shape, generator, case, device, case.score_scale)
    k = _draw(kv_shape, generator, case, device, case.score_scale)
    if case.score_shift:
        # q + a*u and k - a*u for the unit vector u = (1, ..., 1)/sqrt(d): every score
        # (q.k)/sqrt(d) gains -a^2/sqrt(d) = score_shift, plus noise of about a*sqrt(2/d).
        a = (abs(case.score_shift) * case.head_dim ** 0.5) ** 0.5
        step = a / case.head_dim ** 0.5 * (1 if case.score_shift < 0 else -1)
        q, k = (q.float() + step).to(q.dtype), (k.float() - step).to(k.dtype)
    v = _draw(kv_shape, generator, case, device)
    do = _draw(q_shape, generator, case, device)
    return q, k, v, do
