"""Fixtures that several modules of the project's own tests share."""
import pytest


@pytest.fixture(scope="session")
def hostile_class_run(tmp_path_factory):
    """test_hostile.py's class session (the hostile examples, the reference and a buggy control,
    `-n 2`), graded once per session however xdist spreads the modules that read it:
    test_hostile judges each example's findings, test_determinism and test_nonroot_class grade
    part of the class again in another way and compare."""
    from tests.self.test_hostile import once, run_class  # lazily: a grading run never loads tests/self

    return once(tmp_path_factory, "class", run_class)
