"""A runner's one-line account of an exception (fa2_adapters/runner/serve.py `describe`).

Compiler errors put the place on their first line and the reason in the exception they wrap. On
the H100 the corpus's reports said only "raised CompilationError: at 90:51:" (Triton: tl.dot of
fp32 and bf16, in 35 checks of Pointer0111) and "the backward raised BackendCompilerFailed:
backend='inductor' raised:" (torch.compile's inductor on a bf16 dtype mismatch).
"""
import pytest
import triton
import triton.language as tl
from torch._dynamo.exc import BackendCompilerFailed
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fa2_adapters.runner.serve import describe


def raised(make):
    try:
        make()
    except Exception as exc:  # noqa: BLE001
        return exc
    pytest.fail("nothing was raised")


@triton.jit
def mixed_dot(out_ptr):  # tl.dot of fp32 and bf16: what a kernel that skips "cast P to V's dtype" does
    a = tl.zeros((16, 16), dtype=tl.float32)
    b = tl.zeros((16, 16), dtype=tl.bfloat16)
    tl.store(out_ptr + tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :], tl.dot(a, b))


def test_a_triton_compilation_error_says_its_reason():
    # Compiled for an H100 without one: the error comes from the Python front end, before any driver.
    source = ASTSource(fn=mixed_dot, signature={"out_ptr": "*fp32"}, constexprs={})
    exc = raised(lambda: triton.compile(source, target=GPUTarget("cuda", 90, 32)))
    text = describe(exc)
    assert text.startswith("CompilationError: at "), text
    assert text.endswith("AssertionError: Both operands must be same dtype. Got fp32 and bf16"), text


def test_a_torch_compile_backend_failure_says_its_reason():
    inner = RuntimeError("expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16")
    text = describe(BackendCompilerFailed(lambda: None, inner, None))
    assert text.endswith("raised: RuntimeError: expected mat1 and mat2 to have the same dtype, "
                         "but got: float != c10::BFloat16"), text


def test_a_plain_error_is_its_first_line():
    assert describe(ValueError("too many values to unpack (expected 3)")) == \
        "ValueError: too many values to unpack (expected 3)"
