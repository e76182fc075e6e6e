"""A Triton error inside a kernel names the student's file and line, and quotes the line
(fa2_sandbox/runner/errors.py `triton_place`).

Triton's own position ("CompilationError: at 208:4:") counts lines from the kernel's `def`, so a
student who opened line 208 of the file found the wrong code (issue 58: the faulty store was at
line 216). On a GPU a mistake is a CompilationError; under the interpreter (TRITON_INTERPRET=1)
the same mistake is an InterpreterError. Both must say "cs336_systems/kern.py, line N: `source`",
N counted from the top of the file and the path relative to the submission, not to the grader's
scratch copy of it.

The compile path runs Triton's real code generator for a Hopper target, which needs no GPU: the
error is raised before anything reaches a device. Each mode runs in a fresh Python, since
@triton.jit reads TRITON_INTERPRET when the kernel is defined.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

from fa2_sandbox.harness.client import SubmissionRunner
from fa2_sandbox.harness.discover import load_submission
from fa2_sandbox.wire.cases import FlashCase
from fa2_sandbox.wire.requests import Flash

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "submissions" / "examples" / "triton_backward_dot_dtype"
DTYPE_MISMATCH = "AssertionError: Both operands must be same dtype. Got fp32 and bf16"

# Blank lines and a comment above the kernels, so that a line counted from a `def` is not the file's.
KERNELS = '''
import triton
import triton.language as tl

# a few lines, so that the kernels' own line numbers differ from the file's


@triton.jit
def helper(a, b):
    return tl.dot(a, b)


@triton.jit
def kern(o_ptr, x_ptr, y_ptr,
         BLOCK: tl.constexpr, NESTED: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs[:, None] * BLOCK + offs[None, :]).to(tl.float32)
    y = tl.load(y_ptr + offs[:, None] * BLOCK + offs[None, :])
    if NESTED:
        acc = helper(x, y)
    else:
        acc = tl.dot(x, y)
    tl.store(o_ptr + offs[:, None] * BLOCK + offs[None, :], acc)
'''

# Compiles (or, interpreted, runs) `kern` with a float32 x and a bf16 y, and prints describe()'s line.
DRIVER = '''
import os, sys
import torch
sys.path.insert(0, sys.argv[1])
from cs336_systems import kern
from fa2_sandbox.runner.errors import describe
nested = int(sys.argv[2])
try:
    if os.environ.get("TRITON_INTERPRET") == "1":
        x = torch.randn(16, 16, dtype=torch.bfloat16)
        kern.kern[(1,)](torch.empty(16, 16), x, x.clone(), BLOCK=16, NESTED=nested)
    else:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        signature = {"o_ptr": "*fp32", "x_ptr": "*bf16", "y_ptr": "*bf16"}
        triton.compile(ASTSource(kern.kern, signature, {"BLOCK": 16, "NESTED": nested}),
                       target=GPUTarget("cuda", 90, 32))
except Exception as exc:
    print(describe(exc, sys.argv[1]))
'''


def line_of(text: str, source: str) -> int:
    """The 1-based line of `text` that holds `source`."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if source in line)


def described(tmp_path, interpret: bool, nested: bool) -> str:
    # laid out as the grader's scratch copy is: the submission in a folder of a temporary folder
    root = tmp_path / "grade-xyz" / "submission"
    (root / "cs336_systems").mkdir(parents=True)
    (root / "cs336_systems" / "__init__.py").write_text("")
    (root / "cs336_systems" / "kern.py").write_text(KERNELS)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TRITON_DEFAULT_FP_FUSION": "1",
           **({"TRITON_INTERPRET": "1"} if interpret else {})}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVER), str(root), str(int(nested))], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.stdout.strip(), run.stderr[-3000:]
    return run.stdout.strip().splitlines()[-1]


def expected(kind: str, nested: bool) -> str:
    if nested:
        where = (f"cs336_systems/kern.py, line {line_of(KERNELS, 'return tl.dot(a, b)')} (in helper, called from line "
                 f"{line_of(KERNELS, 'acc = helper(x, y)')}): `return tl.dot(a, b)`")
    else:
        where = f"cs336_systems/kern.py, line {line_of(KERNELS, 'acc = tl.dot(x, y)')}: `acc = tl.dot(x, y)`"
    return f"{kind}: {where}: {DTYPE_MISMATCH}"


def test_a_compile_error_names_the_file_line_and_quotes_it(tmp_path):
    assert described(tmp_path, interpret=False, nested=False) == expected("CompilationError", nested=False)


def test_a_compile_error_in_a_helper_names_the_helper_line_and_its_call(tmp_path):
    assert described(tmp_path, interpret=False, nested=True) == expected("CompilationError", nested=True)


def test_the_same_mistake_interpreted_names_the_same_place(tmp_path):
    assert described(tmp_path, interpret=True, nested=False) == expected("InterpreterError", nested=False)
    assert described(tmp_path / "nested", interpret=True, nested=True) == expected("InterpreterError", nested=True)


def test_the_bundled_example_names_its_true_line_through_the_runner():
    """triton_backward_dot_dtype, graded as a check grades it: its runner (on a scratch copy of the
    submission) answers a bf16 case whose backward fails; the sentence names the example's file and
    the line of the faulty tl.dot, as the student's repo numbers them."""
    source = (EXAMPLE / "cs336_systems" / "flash_triton.py").read_text()
    dot = "dk = tl.dot(ds_t, q, dk, input_precision=DOT_PRECISION)"
    # the non-causal call of the dK/dV helper: the last of the three
    call = max(i for i, line in enumerate(source.splitlines(), 1) if "= _attn_bwd_dkdv_inner(" in line)
    runner = SubmissionRunner(load_submission(EXAMPLE), env={"TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"},
                              import_timeout=120)
    try:
        case = FlashCase(batch=(1,), n_queries=20, n_keys=20, head_dim=16, dtype="bfloat16")
        reply = runner.call(Flash("triton", case, seed=1), 300)
        assert reply.ok, (reply.status, reply.message, runner.log_tail())
        message = reply.result["backward_error"]["message"]
    finally:
        runner.close()
    assert message == (f"InterpreterError: cs336_systems/flash_triton.py, line {line_of(source, dot)} "
                       f"(in _attn_bwd_dkdv_inner, called from line {call}): `{dot}`: {DTYPE_MISMATCH}"), message


def test_the_quoted_line_is_not_read_as_the_reason():
    """The quote is the student's code: a HEAD_DIM in it does not make a dtype mismatch a refusal
    of the head dim, nor a comment naming the GPU the machine's error (grading/checks/flash_checks.py)."""
    from grading.checks.flash_checks import machine_error, names_head_dim

    message = ("CompilationError: cs336_systems/flash_triton.py, line 40: `acc = tl.dot(p, v, acc)  # HEAD_DIM wide, "
               "on the GPU`: AssertionError: Both operands must be same dtype. Got fp32 and bf16")
    assert not names_head_dim(message, "", 48)
    assert not machine_error(message, "")


def test_a_triton_that_keeps_only_the_decorators_line_still_finds_the_def():
    """An older Triton's JITFunction has starting_line_number (the first decorator's line) and no
    def_file_line_number: the def's line is counted from the function's own source."""
    import functools
    import inspect
    from types import SimpleNamespace

    from fa2_sandbox.runner.errors import _def_line

    @functools.lru_cache
    @functools.lru_cache
    def kernel():
        pass

    lines, first = inspect.getsourcelines(kernel.__wrapped__.__wrapped__)
    assert _def_line(SimpleNamespace(fn=kernel.__wrapped__.__wrapped__)) == first + 2
    assert _def_line(SimpleNamespace(def_file_line_number=41)) == 41


def test_a_place_that_cannot_be_found_leaves_the_plain_sentence(monkeypatch, tmp_path):
    """Finding the place reads the student's objects; where that raises, the error keeps its own
    one-line sentence instead of taking the runner's reply down with it."""
    from fa2_sandbox.runner import errors

    def broken(exc, root):
        raise RuntimeError("a kernel object that raises when read")

    monkeypatch.setattr(errors, "triton_place", broken)
    assert errors.describe(ValueError("at 3:4: bad"), tmp_path) == "ValueError: at 3:4: bad"
