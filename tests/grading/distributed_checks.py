"""What the distributed checks share (test_distributed.py: DDP and the sharded optimizer;
test_fsdp.py: FSDP): the runner call that spawns the ranks, reading the ranks' records, and
comparing parameters.

Every comparison runs on the CPU in float32 over a few training steps, hence one tolerance
(ATOL, RTOL) for all of them.
"""
import contextlib
import re

import torch

WORLD_SIZE = 2
ATOL, RTOL = 1e-5, 1e-4  # float32 on the CPU, a few steps


# -- talking to the runner --------------------------------------------------------------------

def distributed_call(grading, submission, kind, spec, what):
    """One spawn of WORLD_SIZE gloo ranks running `kind` ("ddp", "sharded", "fsdp") on `spec`,
    shared by every check that reads it."""
    timeout = grading.rubric.timeout("distributed")
    request = {"op": "distributed", "kind": kind, "spec": spec, "world_size": WORLD_SIZE,
               "timeout_s": max(30.0, timeout - 20)}
    # call_cached keys every reply by its submission as well (replies never cross submissions),
    # so this is one spawn per kind and DDP flavour for each submission.
    key = ("distributed", kind, spec.get("flavour"))
    return grading.call_cached(submission, key, request, timeout, what)


def pick(tensors, scenario, rank, kind):
    prefix = f"{scenario}/{rank}/{kind}/"
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def settle_scenario(c, reply, scenario, labels=None):
    """Per-rank records of one scenario, or fail the check the way the ranks failed."""
    c.settle_reply(reply)
    ranks = reply.result["scenarios"].get(scenario)
    if ranks and all(s["status"] == "ok" for s in ranks):
        return ranks
    if ranks and any(s["status"] == "not_attempted" for s in ranks):
        c.fail(f"not attempted: {next(s['message'] for s in ranks if s['status'] == 'not_attempted')}",
               outcome="not_attempted")
    if ranks and any(s["status"] == "error" for s in ranks):
        sentence, traceback = rank_error(ranks, labels)
        c.fail(sentence, traceback, outcome="error")
    earlier = next((name for name, rs in reply.result["scenarios"].items()
                    if any(s["status"] == "error" for s in rs)), None)
    why = f" ({rank_error(reply.result['scenarios'][earlier], labels)[0]})" if earlier else ""
    c.fail(f"not run: the {earlier or 'previous'} scenario of the same run failed first{why}", outcome="error")


COMMUNICATION_FAILURES = ("gloo", "timeout", "timed out", "closed by peer", "pair closure", "connection reset")


def rank_error(ranks, labels):
    """(sentence, traceback) for the first rank that raised. A rank left waiting for a peer that
    raised fails later inside gloo (timeout, connection closed): show the cause, not that."""
    def where(s):
        step = f", step {s['step'] + 1}" if s.get("step", -1) >= 0 else ""
        return f"in {(labels or {}).get(s.get('phase'), s.get('phase'))}{step}"

    def short(message):
        message = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", message)  # gloo's source location
        return message.split(". ")[0][:200]

    errors = [(r, s) for r, s in enumerate(ranks) if s["status"] == "error"]
    own = [(r, s) for r, s in errors if not any(w in s["message"].lower() for w in COMMUNICATION_FAILURES)]
    if own:
        r, s = own[0]
        return f"rank {r} raised {s['message']} ({where(s)}).", s.get("traceback", "")
    each = "; ".join(f"rank {r}: {short(s['message'])} ({where(s)})" for r, s in errors)
    return (f"a collective never completed (timeout or peer gone): the ranks did not issue the same "
            f"collectives in the same order. {each}.", errors[0][1].get("traceback", ""))


@contextlib.contextmanager
def one_thread():
    """The ranks run with one thread each; the baselines do too, so matmuls round alike."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def close(a, b) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=ATOL, rtol=RTOL)


def max_diff(got: dict, want: dict):
    """(largest absolute difference, parameter name) over the parameters of `want`."""
    diffs = [((got[n].double() - want[n].double()).abs().max().item() if got[n].shape == want[n].shape
              else float("inf"), n) for n in want]
    return max(diffs) if diffs else (0.0, "")


def names(items) -> str:
    items = list(items)
    return ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")
