"""torch.compile's CPU probe, once per run (fa2_sandbox/harness/vec_isa_probe.py): a runner is told
to skip its own probe only where the controller's found every claimed instruction set to build,
and the controller probes only where two submissions may compile. The probe script itself runs on
every class run (its answer shows in bench/grade_speed.py's account as the runners' probes gone);
here a stand-in script keeps the test fast, and the fork server's side is in test_fork_server.py."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fa2_sandbox.harness import vec_isa_probe


def answered(tmp_path: Path, answer: dict) -> Path:
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(answer))
    return path


@pytest.mark.parametrize("answer, env", [
    ({"built": ["avx512", "avx2"], "claimed": ["avx512", "avx2"]}, {vec_isa_probe.ENV: "1"}),
    ({"built": ["avx2"], "claimed": ["avx512", "avx2"]}, {}),  # AVX-512 claimed but not built: each runner finds out
    ({"built": [], "claimed": []}, {}),
    ({"error": "exit status 1"}, {}),
])
def test_a_runner_skips_its_probe_only_where_every_claimed_set_built(tmp_path, answer, env):
    assert vec_isa_probe.runner_env(answered(tmp_path, answer)) == env


def test_no_answer_yet_or_no_probe_leaves_the_runner_to_probe(tmp_path):
    assert vec_isa_probe.runner_env(None) == {}
    assert vec_isa_probe.runner_env(tmp_path / "not-yet.json") == {}
    (tmp_path / "half.json").write_text('{"built": ["av')
    assert vec_isa_probe.runner_env(tmp_path / "half.json") == {}


def submission(root: Path, files: dict) -> SimpleNamespace:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return SimpleNamespace(root=root)


def test_the_probe_is_run_only_for_two_submissions_that_call_torch_compile(tmp_path):
    compiled = submission(tmp_path / "a", {"cs336_systems/flash.py": "f = torch.compile(g)\n"})
    also = submission(tmp_path / "b", {"bench.py": "@torch.compile\ndef f(): pass\n"})
    plain = submission(tmp_path / "c", {"cs336_systems/flash.py": "import torch\n"})
    in_venv = submission(tmp_path / "d", {".venv/lib/x.py": "torch.compile\n", "README.md": "torch.compile\n"})
    assert not vec_isa_probe.worth_probing([compiled, plain, in_venv])
    assert vec_isa_probe.worth_probing([compiled, plain, also])


@pytest.mark.parametrize("script, expected", [
    ('print("warning first"); print(\'{"built": ["avx2"], "claimed": ["avx2"]}\')', {vec_isa_probe.ENV: "1"}),
    ("import sys; sys.exit(3)", {}),
    ('print("not json")', {}),
])
def test_the_controllers_probe_writes_an_answer_whatever_the_script_does(tmp_path, monkeypatch, script, expected):
    monkeypatch.setattr(vec_isa_probe, "PROBE", script)
    path = tmp_path / "answer.json"
    vec_isa_probe.start(path).join(timeout=60)
    assert path.exists() and not path.with_suffix(".partial").exists()
    assert vec_isa_probe.runner_env(path) == expected, path.read_text()
