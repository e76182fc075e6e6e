"""A fix for the Triton interpreter's bf16 matmuls, applied wherever Triton runs on a CPU.

The interpreter (seen in Triton 3.9) multiplies bf16 tiles in tl.dot as their raw uint16 bit
patterns, so any correct bf16 kernel gives garbage on a CPU. Grading students' kernels under
it would fail them for the simulator's bug. `ensure_bf16_dot()` probes a 16x16 dot and, when it
is wrong, patches the interpreter to upcast bf16 operands to fp32 first, which is what tensor
cores compute anyway (bf16 products are exact in fp32). Kernels themselves are untouched.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def _dot_probe(A, B, C):
    o = tl.arange(0, 16)
    a = tl.load(A + o[:, None] * 16 + o[None, :])
    b = tl.load(B + o[:, None] * 16 + o[None, :])
    tl.store(C + o[:, None] * 16 + o[None, :], tl.dot(a, b))


def _bf16_dot_ok(device: str) -> bool:
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(16, 16, generator=g).to(torch.bfloat16).to(device) for _ in range(2))
    c = torch.empty(16, 16, device=device)
    _dot_probe[(1,)](a, b, c)
    return torch.allclose(c.cpu(), (a.float() @ b.float()).cpu(), atol=1e-3, rtol=1e-3)


def _patch_create_dot():
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, *args, **kwargs):
        if a.dtype.scalar == tl.bfloat16:
            a = self.cast_impl(a, tl.float32)
        if b.dtype.scalar == tl.bfloat16:
            b = self.cast_impl(b, tl.float32)
        return original(self, a, b, d, *args, **kwargs)

    builder.create_dot = create_dot


def ensure_bf16_dot(interpreted: bool) -> str:
    """'' if bf16 tl.dot is right (natively or once patched), else a sentence saying why not."""
    device = "cpu" if interpreted else "cuda"
    if _bf16_dot_ok(device):
        return ""
    if not interpreted:
        return "bf16 tl.dot is wrong on this device"
    try:
        _patch_create_dot()
        if _bf16_dot_ok(device):
            return ""
    except Exception as exc:  # the interpreter's internals differ in this Triton version
        return f"could not patch the interpreter's bf16 dot ({exc!r})"
    return "the interpreter's bf16 dot is wrong even after patching"
