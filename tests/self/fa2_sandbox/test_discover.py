"""Which --impl paths are submissions (fa2_sandbox/harness/discover.py find_submissions): a path
named outright must be a folder holding its adapters file, a glob must match at least one, and
the folders a glob matches that hold none are left out and named. Anything else stops the run
with one sentence per path (grading/session.py turns it into pytest's usage error, exit status 4)."""
import re
from pathlib import Path

import pytest

from fa2_sandbox.harness.discover import NotASubmission, find_submissions


def repo(root, adapters="tests/adapters.py", yaml=None):
    root.mkdir(parents=True)
    if adapters:
        (root / adapters).parent.mkdir(parents=True, exist_ok=True)
        (root / adapters).write_text("")
    if yaml is not None:
        (root / "submission.yaml").write_text(yaml)
    return root


def refused(patterns) -> list:
    with pytest.raises(NotASubmission) as caught:
        find_submissions([str(p) for p in patterns])
    return str(caught.value).splitlines()


def test_every_path_that_is_not_a_submission_gets_its_own_sentence(tmp_path):
    alice = repo(tmp_path / "alice")
    empty = repo(tmp_path / "empty", adapters=None)
    named = repo(tmp_path / "named", adapters=None, yaml="adapters: src/my_adapters.py\n")
    lines = refused([alice, tmp_path / "missing", alice / "tests" / "adapters.py", empty, named,
                     tmp_path / "nowhere" / "*"])
    assert lines == [
        f"--impl {tmp_path}/missing: there is no such file or folder; expected a submission folder (a course repo) "
        f"holding tests/adapters.py or adapters.py.",
        f"--impl {alice}/tests/adapters.py is a file; expected a submission folder (a course repo) holding "
        f"tests/adapters.py or adapters.py (name the folder that holds it: --impl {alice}).",
        f"--impl {empty}: the folder holds neither tests/adapters.py nor adapters.py; expected a submission folder "
        f"(a course repo) with its adapters file there.",
        f"--impl {named}: the folder holds no src/my_adapters.py, the adapters file its submission.yaml names; "
        f"expected a submission folder (a course repo) with its adapters file there.",
        f"--impl '{tmp_path}/nowhere/*' matches no folder; expected a glob of submission folders (course repos), "
        f"each holding tests/adapters.py or adapters.py."]
    assert all("None" not in line for line in lines)


def test_a_glob_skips_the_folders_without_adapters_and_says_which(tmp_path):
    repo(tmp_path / "class" / "alice")
    repo(tmp_path / "class" / "bob", adapters="adapters.py")
    repo(tmp_path / "class" / "handouts", adapters=None)
    (tmp_path / "class" / "README.md").write_text("not a folder: ignored, not skipped")
    skipped = []
    found = find_submissions([f"{tmp_path}/class/*"], skipped)
    assert [s.name for s in found] == ["alice", "bob"] and skipped == [tmp_path / "class" / "handouts"]
    assert all(s.problem is None for s in found)


def test_a_glob_that_matches_only_folders_without_adapters_stops_the_run(tmp_path):
    repo(tmp_path / "class" / "handouts", adapters=None)
    assert refused([f"{tmp_path}/class/*"]) == [
        f"--impl '{tmp_path}/class/*' matches 1 folder (handouts) and none holds tests/adapters.py or adapters.py; "
        f"expected a glob of submission folders (course repos), each holding tests/adapters.py or adapters.py."]


def test_the_readmes_example_of_a_file_is_a_file_from_a_checkout(monkeypatch):
    """The README's table of mistakes names a file to give --impl; run from a checkout, that path must
    be a file, so that the run answers with the sentence the table quotes, not "no such file"."""
    root = Path(__file__).resolve().parents[3]
    row = next(line for line in (root / "README.md").read_text().splitlines()
               if line.startswith("| `--impl` names a file"))
    example = re.search(r"\(`([^`]+)` itself, say\)", row).group(1)
    monkeypatch.chdir(root)
    lines = refused([example])
    assert len(lines) == 1 and lines[0].startswith(f"--impl {example} is a file; expected"), lines
