"""torch.compile's question "which vector instructions does this CPU run?", answered once per class.

The first torch.compile for the CPU in a process asks torch._inductor.cpu_vec_isa which SIMD
extensions work here: for each it knows (AVX2, AVX-512 and its VNNI and bf16 parts, AMX), it
compiles a small C++ file with gcc and loads the library in a new Python that imports torch
(VecISA.check_build). In a class on a GPU that is most of a minute of a core in every runner that
compiles a PyTorch slot on the CPU, the same answer each time (notes/grading-speed.md, "the
vector-ISA answers once per class"). Here the grader's own process asks once (`python -m
fa2_sandbox.runner.vec_isa`, started by fa2_sandbox/harness/shared_vec_isa.py), and each runner
adopts the answers before the submission is imported: a check_build the probe answered returns
what it returned there; any other runs as before.

    answers = probe()      # {"VecAVX512 -mavx512f ... <code hash>": True, ...}
    adopt(answers)         # in a runner: those check_builds are answered, not run

What is adopted is only this: the machine's answer to torch's own test programs. The grader asks on
the machine where the runners run (shared_vec_isa's question names the host, the CPU's flags and the
torch version), and a student's code never writes it.
"""
import hashlib
import json
import sys


def _key(isa, code: str) -> str:
    """One check_build: the ISA, the compiler flags it builds with (an ISA's extension checks add a
    flag for the call), and the program."""
    return f"{type(isa).__name__} {getattr(isa, '_arch_flags', '')} {hashlib.sha256(code.encode()).hexdigest()[:16]}"


def probe() -> dict:
    """Every check_build torch makes to pick the vector ISA here, with its result."""
    from torch._inductor import cpu_vec_isa

    answers = {}
    asked = cpu_vec_isa.VecISA.check_build

    def check_build(isa, code: str) -> bool:
        answers[_key(isa, code)] = result = bool(asked(isa, code))
        return result

    cpu_vec_isa.VecISA.check_build = check_build
    try:
        cpu_vec_isa.valid_vec_isa_list()
    finally:
        cpu_vec_isa.VecISA.check_build = asked
    return answers


def adopt(answers: dict | None) -> bool:
    """In a runner, before the submission's import: the check_builds `answers` holds are answered
    from it. Whether it was adopted: only where torch.compile's front end is imported already (a
    fork server's runner on a GPU, fa2_sandbox/harness/forked.py PRELOAD_COMPILE), since importing
    it costs more than a second of a core in a runner that may never compile; nor where this torch
    asks its question another way."""
    cpu_vec_isa = sys.modules.get("torch._inductor.cpu_vec_isa")
    asked = getattr(getattr(cpu_vec_isa, "VecISA", None), "check_build", None)
    if not answers or asked is None:
        return False

    def check_build(isa, code: str) -> bool:
        known = answers.get(_key(isa, code))
        return asked(isa, code) if known is None else known

    cpu_vec_isa.VecISA.check_build = check_build
    return True


if __name__ == "__main__":
    json.dump(probe(), sys.stdout)
