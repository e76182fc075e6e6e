"""Fixtures that several modules of the project's own tests share, and their Triton mode."""
import os

import pytest
import torch

# Without a GPU, Triton kernels run in its interpreter. The reference reads TRITON_INTERPRET when
# it is imported (it picks its autotuning configs by it), so it is set here, before any test module
# is imported. Set in test_flash_triton.py, a module imported before it in the same process left
# the reference tuning every config in the interpreter: 6.1 s against 2.1 s for one 17x17 case
# (torch 2.13, triton 3.9); a previous session saw all 28 of its tests fail that way.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def hostile_class_run(tmp_path_factory):
    """test_hostile.py's class session (the hostile examples, the reference and a buggy control,
    `-n 2`), graded once per session however xdist spreads the modules that read it:
    test_hostile judges each example's findings, test_determinism and test_nonroot_class grade
    part of the class again in another way and compare."""
    from tests.self.fa2_sandbox.test_hostile import once, run_class  # lazily: a grading run never loads tests/self

    return once(tmp_path_factory, "class", run_class)
