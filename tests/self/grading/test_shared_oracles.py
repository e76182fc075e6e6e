"""The CPU cases' oracles, shared by a run's workers (grading/checks/shared_oracles.py): computed by one
process, read by the others, never read from a file that its key did not sign."""
import dataclasses
import secrets
import subprocess
import sys
import textwrap

import torch

from grading.checks import flash_checks
from grading.checks.shared_oracles import SharedOracles
from grading.matrix import COURSE_CASE

ASK = textwrap.dedent("""
    import sys, time, torch
    from grading.checks.shared_oracles import SharedOracles

    def compute():
        with open(sys.argv[3], "a") as log:
            log.write("computed\\n")
        time.sleep(1.0)  # long enough for the other process to ask meanwhile
        return {"o": torch.arange(6.0, dtype=torch.float64).reshape(2, 3)}, (torch.ones(2),)

    value = SharedOracles(sys.argv[1], sys.argv[2]).get(("case", 1, "cpu"), compute)
    print(value[0]["o"].sum().item(), value[1][0].sum().item())
""")


def test_one_process_computes_and_the_others_read_it(tmp_path):
    key, log = secrets.token_hex(32), tmp_path / "log"
    folder = tmp_path / "oracles"
    folder.mkdir()
    asks = [subprocess.Popen([sys.executable, "-c", ASK, str(folder), key, str(log)], stdout=subprocess.PIPE, text=True)
            for _ in range(3)]
    outputs = [ask.communicate(timeout=120)[0].split() for ask in asks]
    assert outputs == [["15.0", "2.0"]] * 3
    assert log.read_text() == "computed\n"


def test_a_file_the_key_did_not_sign_is_computed_again(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"o": torch.full((3,), 2.0, dtype=torch.float64)}

    oracles = SharedOracles(tmp_path, secrets.token_hex(32))
    assert oracles.get("what", compute)["o"].tolist() == [2.0] * 3
    assert oracles.get("what", compute)["o"].tolist() == [2.0] * 3 and len(calls) == 1
    (written,) = tmp_path.glob("*.pt")
    forged = SharedOracles(tmp_path, secrets.token_hex(32))  # another key: what a runner could write
    forged._write(written, {"o": torch.zeros(3, dtype=torch.float64)})
    assert oracles.get("what", compute)["o"].tolist() == [2.0] * 3 and len(calls) == 2
    data = bytearray(written.read_bytes())
    data[-1] ^= 1  # a torn or changed file
    written.write_bytes(bytes(data))
    assert oracles.get("what", compute)["o"].tolist() == [2.0] * 3 and len(calls) == 3


def test_a_shared_oracle_is_the_one_computed_here(tmp_path):
    computed = flash_checks.expected(COURSE_CASE, 4242, "cpu")
    shared = SharedOracles(tmp_path, secrets.token_hex(32))
    first = flash_checks.expected(COURSE_CASE, 4242, "cpu", shared)  # computed, and written
    again = flash_checks._expected.__wrapped__(COURSE_CASE, 4242, "cpu", shared)  # read
    assert len(list(tmp_path.glob("*.pt"))) == 1
    for value in (first, again):
        assert all(torch.equal(a, b) for a, b in zip(value[0], computed[0]))
        for got, want in zip(value[1], computed[1]):
            for name in want:
                pairs = zip(got[name], want[name]) if isinstance(want[name], tuple) else [(got[name], want[name])]
                assert all(torch.equal(a, b) for a, b in pairs), name


def test_a_shared_mistaken_oracle_is_the_one_computed_here(tmp_path):
    """A diagnosis's mistaken oracle of a CPU case is computed once for the run's workers and read
    back bit for bit; a GPU case's is not written (each worker computes its own there)."""
    case = dataclasses.replace(COURSE_CASE, is_causal=True)
    shared = SharedOracles(tmp_path, secrets.token_hex(32))
    computed = flash_checks.mistaken.__wrapped__(case, 4242, "cpu", "non-causal")
    first = flash_checks.mistaken.__wrapped__(case, 4242, "cpu", "non-causal", shared)  # computed, written
    written = set(tmp_path.glob("*.pt"))
    again = flash_checks.mistaken.__wrapped__(case, 4242, "cpu", "non-causal", shared)  # read
    assert len(written) == 2  # the case's oracle (the mistake's inputs come with it) and the mistake's
    assert set(tmp_path.glob("*.pt")) == written
    for value in (first, again):
        assert value.keys() == computed.keys() and all(torch.equal(value[n], computed[n]) for n in computed)
    assert not torch.equal(first["o"], flash_checks.expected(case, 4242, "cpu")[1][0]["o"])  # not the oracle
