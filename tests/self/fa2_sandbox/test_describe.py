"""A runner's one-line account of an exception (fa2_sandbox/runner/errors.py `describe`).

Compiler errors put the place on their first line and the reason in the exception they wrap. On
the H100 the corpus's reports said only "raised CompilationError: at 90:51:" (Triton: tl.dot of
fp32 and bf16, in 35 checks of Pointer0111) and "the backward raised BackendCompilerFailed:
backend='inductor' raised:" (torch.compile's inductor on a bf16 dtype mismatch).
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fa2_sandbox.runner.errors import describe, import_failure

ROOT = Path(__file__).resolve().parents[3]


def raised(make):
    try:
        make()
    except Exception as exc:  # noqa: BLE001
        return exc
    pytest.fail("nothing was raised")


def test_a_triton_compilation_error_says_its_reason():
    # Raised as Triton's code generator raises it (compiler/code_generator.py:
    # `raise CompilationError(self.jit_fn.src, self.cur_node, None) from e`), in a fresh Python.
    code = textwrap.dedent('''
        import ast
        from triton.compiler.errors import CompilationError
        from fa2_sandbox.runner.errors import describe, import_failure
        src = "def kernel(a, b):\\n    return tl.dot(a, b)"
        try:
            try:
                raise AssertionError("Both operands must be same dtype. Got fp32 and bf16")
            except AssertionError as e:
                raise CompilationError(src, ast.parse(src).body[0].body[0], None) from e
        except CompilationError as exc:
            print(describe(exc))
    ''')
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    text = run.stdout.strip()
    assert text.startswith("CompilationError: at 2:4:"), text + run.stderr[-2000:]
    assert text.endswith("AssertionError: Both operands must be same dtype. Got fp32 and bf16"), text


class BackendCompilerFailed(Exception):
    """torch._dynamo.exc.BackendCompilerFailed's shape (torch 2.11 and 2.13): the message names the
    backend, the original exception is `inner_exception`, and it is raised `from None`. Not
    imported: importing torch._dynamo costs seconds, and this is all describe() reads of it."""

    def __init__(self, inner_exception: Exception):
        self.inner_exception = inner_exception
        super().__init__(f"backend='inductor' raised:\n{type(inner_exception).__name__}: {inner_exception}")


def test_a_torch_compile_backend_failure_says_its_reason():
    inner = RuntimeError("expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16")
    text = describe(BackendCompilerFailed(inner))
    assert text.endswith("raised: RuntimeError: expected mat1 and mat2 to have the same dtype, "
                         "but got: float != c10::BFloat16"), text


def test_a_plain_error_is_its_first_line():
    assert describe(ValueError("too many values to unpack (expected 3)")) == \
        "ValueError: too many values to unpack (expected 3)"
    assert describe(SystemExit(3)) == "SystemExit: sys.exit(3) was called"


def test_an_import_failure_names_the_file_and_line_in_the_submission(tmp_path, monkeypatch):
    """One sentence for every check of a submission whose adapters do not import: the error's first
    line and where in the submission's files it was raised (fa2_sandbox/runner/errors.py)."""
    package = tmp_path / "i42_systems"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "attention.py").write_text("import math\nimport not_a_module_anywhere\n")
    (tmp_path / "adapters.py").write_text("from i42_systems import attention\n")
    (tmp_path / "broken.py").write_text("import torch\n\n\ndef f(:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = {}
    for name in ("adapters.py", "broken.py"):
        path = tmp_path / name
        found[name] = import_failure(name, raised(lambda: exec(compile(path.read_text(), str(path), "exec"), {})),
                                     tmp_path)
    assert found == {
        "adapters.py": "adapters.py failed to import: ModuleNotFoundError: No module named 'not_a_module_anywhere' "
                       "(i42_systems/attention.py, line 2)",
        "broken.py": "broken.py failed to import: SyntaxError: invalid syntax (broken.py, line 4)"}
