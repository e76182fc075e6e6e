"""A runner's one-line account of an exception (fa2_adapters/runner/serve.py `describe`).

Compiler errors put the place on their first line and the reason in the exception they wrap. On
the H100 the corpus's reports said only "raised CompilationError: at 90:51:" (Triton: tl.dot of
fp32 and bf16, in 35 checks of Pointer0111) and "the backward raised BackendCompilerFailed:
backend='inductor' raised:" (torch.compile's inductor on a bf16 dtype mismatch).

Each case runs in a fresh Python, as the runner is one: importing the runner's modules patches
Triton in the importing process, which broke the Triton interpreter tests run after it.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def described(raise_it: str) -> str:
    """describe() of the exception that the code `raise_it` raises, in a fresh Python."""
    body = textwrap.indent(textwrap.dedent(raise_it), "    ")
    code = (f"from fa2_adapters.runner.serve import describe\ntry:\n{body}\n"
            f"except Exception as exc:\n    print(describe(exc))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def test_a_triton_compilation_error_says_its_reason():
    # Raised as Triton's code generator raises it (compiler/code_generator.py:
    # `raise CompilationError(self.jit_fn.src, self.cur_node, None) from e`).
    text = described('''
        import ast
        from triton.compiler.errors import CompilationError
        src = "def kernel(a, b):\\n    return tl.dot(a, b)"
        try:
            raise AssertionError("Both operands must be same dtype. Got fp32 and bf16")
        except AssertionError as e:
            raise CompilationError(src, ast.parse(src).body[0].body[0], None) from e
    ''')
    assert text.startswith("CompilationError: at 2:4:"), text
    assert text.endswith("AssertionError: Both operands must be same dtype. Got fp32 and bf16"), text


def test_a_torch_compile_backend_failure_says_its_reason():
    text = described('''
        from torch._dynamo.exc import BackendCompilerFailed
        inner = RuntimeError("expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16")
        raise BackendCompilerFailed(lambda: None, inner, None) from None
    ''')
    assert text.endswith("raised: RuntimeError: expected mat1 and mat2 to have the same dtype, "
                         "but got: float != c10::BFloat16"), text


def test_a_plain_error_is_its_first_line():
    assert described('raise ValueError("too many values to unpack (expected 3)")') == \
        "ValueError: too many values to unpack (expected 3)"
