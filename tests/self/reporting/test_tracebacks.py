"""Tracebacks on a report page (reporting/tracebacks.py, templates/macros.html.j2 `traced_text`):
the student's files are named by their path in the repo, not the grader's scratch copy; the
grader's runner frames and the libraries' frames fold away so that the student's own frames stand
out; the full trace stays one click away, in a <details>.

And the runner's side (fa2_sandbox/runner/errors.py format_traceback): the traceback it sends
names the submission's files relative to its copy of the submission."""
import json
import re
from html import unescape

from fa2_sandbox.runner.errors import format_traceback
from reporting import build_reports
from reporting.tracebacks import fold, repo_paths
from tests.self.reporting.pages import copy_fixtures, fixture_json

SCRATCH = "/tmp/grade-idbsa615"
SITE = "/usr/lib/python3.12/site-packages"
# The shape of a real one (issue 58): the runner's frames, torch's, the student's, Triton's.
TRACE = f'''Traceback (most recent call last):
  File "{SCRATCH}/trusted/fa2_sandbox/runner/serve.py", line 254, in flash
    grads = flash_call.backward(inputs, o, do)
            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "{SCRATCH}/trusted/fa2_sandbox/runner/flash_call.py", line 25, in backward
    o.backward(do)
  File "{SITE}/torch/_tensor.py", line 623, in backward
    torch.autograd.backward(
  File "{SITE}/torch/autograd/function.py", line 325, in apply
    return user_fn(self, *args)
           ^^^^^^^^^^^^^^^^^^^^
  File "{SCRATCH}/submission/cs336_systems/triton_kernels_flash_attention_2.py", line 750, in backward
    _bwd_kernel[grid](q, k, v, do, dq, dk, dv)
  File "{SITE}/triton/runtime/jit.py", line 375, in <lambda>
    return lambda *args, **kwargs: self.run(grid=grid, warmup=False, *args, **kwargs)
  File "/usr/lib/python3.12/functools.py", line 909, in wrapper
    return dispatch(args[0].__class__)(*args, **kw)
triton.compiler.errors.CompilationError: at 208:4:
Block element type(bf16) and value element type(fp32) mismatch'''
STUDENT = "cs336_systems/triton_kernels_flash_attention_2.py"


def test_the_students_frames_stay_and_the_others_fold():
    folded = fold(TRACE)
    assert f'File "{STUDENT}", line 750, in backward' in folded
    assert "_bwd_kernel[grid](q, k, v, do, dq, dk, dv)" in folded
    assert "  [4 frames of the grader's runner and torch folded]" in folded
    assert "  [2 frames of triton and Python folded]" in folded
    assert "serve.py" not in folded and "torch/_tensor.py" not in folded and "functools" not in folded
    assert folded.endswith("Block element type(bf16) and value element type(fp32) mismatch")


def test_the_full_trace_names_the_students_file_by_its_repo_path():
    full = repo_paths(TRACE)
    assert f'File "{STUDENT}", line 750' in full and f"{SCRATCH}/submission" not in full
    assert f"{SCRATCH}/trusted/fa2_sandbox/runner/serve.py" in full  # the grader's frames stay, in full


def test_text_with_no_frame_to_fold_is_left_as_it_is():
    assert fold("max error 0.3 at index (1, 2)\nRuntimeError: boom") is None
    assert fold('Traceback (most recent call last):\n  File "cs336_systems/a.py", line 3, in f\n    x()\nE: m') is None


def test_a_page_folds_a_traceback_and_keeps_the_full_one_a_click_away(tmp_path):
    reports = copy_fixtures(tmp_path / "reports")
    results = fixture_json("carol")
    failed = next(t for t in results["tests"] if t["name"] == "carol::flash_triton::forward[fp32-113x203-d64-full]")
    failed["output"] = failed["diagnosis"] + "\n" + TRACE
    (reports / "carol" / "results.json").write_text(json.dumps(results))
    build_reports(reports)
    page = (reports / "carol" / "index.html").read_text()

    assert f"{SCRATCH}/submission" not in page
    folded = re.search(r'<pre class="traceback">(.*?)</pre>', page, re.S)
    assert folded, "no folded traceback on the page"
    shown = unescape(folded[1])
    assert f'File "{STUDENT}", line 750, in backward' in shown and "[4 frames of the grader's runner and torch" in shown
    assert "torch/autograd/function.py" not in shown
    full = re.search(r'<details class="full-traceback"><summary>[^<]*</summary><pre>(.*?)</pre></details>', page, re.S)
    assert full, "the full traceback is not one click away"
    assert "torch/autograd/function.py" in unescape(full[1]) and f'File "{STUDENT}", line 750' in unescape(full[1])


def test_the_runner_names_the_submissions_files_relative_to_its_copy(tmp_path):
    root = tmp_path / "grade-abc" / "submission"
    (root / "cs336_systems").mkdir(parents=True)
    student = root / "cs336_systems" / "attention.py"
    student.write_text("def forward():\n    raise ValueError('bad shape')\n")
    namespace = {}
    exec(compile(student.read_text(), str(student), "exec"), namespace)
    try:
        namespace["forward"]()
    except ValueError as exc:
        trace = format_traceback(exc, root)
    assert 'File "cs336_systems/attention.py", line 2, in forward' in trace, trace
    assert "raise ValueError('bad shape')" in trace and str(root) not in trace
    assert trace.rstrip().endswith("ValueError: bad shape")
