"""torch.compile's vector-ISA probe runs once, in the controller, and runners adopt its answers
(fa2_sandbox/runner/vec_isa.py, fa2_sandbox/harness/shared_vec_isa.py); a worker asked on another
machine, or before the answers are written, leaves its runners to ask for themselves."""
import json
import subprocess
import sys
import textwrap

import pytest

from fa2_sandbox.harness import shared_vec_isa


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """The controller's file, from a real probe of this machine (gcc and a Python start per ISA)."""
    path = tmp_path_factory.mktemp("vec-isa") / "answers.json"
    shared_vec_isa.start(path).join()
    return path


@pytest.fixture
def worker(monkeypatch):
    """A worker's state: no file adopted yet."""
    monkeypatch.setattr(shared_vec_isa, "_adopted", {"path": None, "answers": None})


def picked_in_a_runner(answers, preload="import torch._dynamo") -> dict:
    """What a fresh process that adopted `answers` picks, and the CPU its children (gcc, the load
    checks' Pythons) spent."""
    code = textwrap.dedent(f"""
        import json, resource, sys
        import torch
        {preload}
        from fa2_sandbox.runner import vec_isa
        adopted = vec_isa.adopt(json.loads(sys.stdin.read()))
        from torch._inductor import cpu_vec_isa
        picked = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(json.dumps({{"adopted": adopted, "picked": picked, "children_s": children.ru_utime + children.ru_stime}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(answers), capture_output=True, text=True,
                          check=True, timeout=300)
    return json.loads(done.stdout.splitlines()[-1])


def test_the_probe_records_every_build_torch_tries(probed):
    written = json.loads(probed.read_text())
    assert written["question"] == shared_vec_isa.question()
    assert written.get("error") is None and written["answers"], written
    assert all(isinstance(result, bool) for result in written["answers"].values())


def test_a_runner_takes_the_probes_answers_without_building_anything(probed):
    answers = json.loads(probed.read_text())["answers"]
    runner = picked_in_a_runner(answers)
    assert runner["adopted"] and runner["children_s"] == 0.0, runner
    assert runner["picked"], "this x86 CPU runs at least AVX2: the probe's answers said so"
    refused = picked_in_a_runner(dict.fromkeys(answers, False))
    assert refused["picked"] == [] and refused["children_s"] == 0.0, "the answers were not the ones used"


def test_a_runner_without_torch_compiles_front_end_does_not_import_it_to_adopt(probed):
    runner = picked_in_a_runner(json.loads(probed.read_text())["answers"], preload="")
    assert not runner["adopted"]


def test_a_worker_adopts_the_file_once_written(tmp_path, worker):
    path = tmp_path / "answers.json"
    shared_vec_isa.adopt(path)
    assert shared_vec_isa.answers() is None  # the probe still runs: runners ask for themselves
    path.write_text(json.dumps({"question": shared_vec_isa.question(), "answers": {"VecAVX2 -mavx2 0": True}}))
    assert shared_vec_isa.answers() == {"VecAVX2 -mavx2 0": True}


def test_another_machines_answers_are_never_adopted(tmp_path, worker):
    path = tmp_path / "answers.json"
    elsewhere = {**shared_vec_isa.question(), "host": "another-node"}
    path.write_text(json.dumps({"question": elsewhere, "answers": {"VecAVX2 -mavx2 0": True}}))
    shared_vec_isa.adopt(path)
    assert shared_vec_isa.answers() is None


def test_a_probe_that_failed_leaves_runners_to_ask(tmp_path, worker):
    path = tmp_path / "answers.json"
    path.write_text(json.dumps({"question": shared_vec_isa.question(), "error": "TimeoutExpired"}))
    shared_vec_isa.adopt(path)
    assert shared_vec_isa.answers() is None
