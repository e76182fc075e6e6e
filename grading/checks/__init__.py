"""The checks: pytest tests, one per requirement, parametrized over the submissions under --impl.

Collected from wherever the package is installed (grading/pytest_plugin.py adds this folder
to a grading run's paths); their fixtures come from grading/fixtures.py, registered with the
grading plugin, since a conftest.py in an installed folder is fragile (pytest-dev/pytest#1596)."""
