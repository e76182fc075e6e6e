"""What the distributed checks share (test_distributed.py: DDP and the sharded optimizer;
test_fsdp.py: FSDP): the runner call that spawns the ranks, reading the ranks' records, and the
judges of what the ranks hold (pure functions, which tests/self tests directly). What the ranks
are compared with, and how, is grading/baselines.py.
"""
import math
import re

from fa2_sandbox.wire import outcomes, requests
from grading.baselines import WORLD_SIZE, close, max_diff, names

# -- talking to the runner --------------------------------------------------------------------

def distributed_call(session, submission, kind, spec, what):
    """One spawn of WORLD_SIZE gloo ranks running `kind` ("ddp", "sharded", "fsdp") on `spec`,
    shared by every check that reads it."""
    timeout = session.rubric.timeout("distributed")
    request = requests.Distributed(kind, session.seed, spec, WORLD_SIZE, timeout_s=max(30.0, timeout - 20))
    # One spawn per kind and DDP flavour for each submission: the checks of one make the same request.
    return session.call_cached(submission, request, timeout, what)


def settle_scenario(c, reply, scenario, labels=None):
    """Per-rank records of one scenario, or fail the check the way the ranks failed."""
    c.settle_reply(reply)
    ranks = reply.result["scenarios"].get(scenario)
    if ranks and all(s["status"] == outcomes.OK for s in ranks):
        return ranks
    if ranks and any(s["status"] == outcomes.NOT_ATTEMPTED for s in ranks):
        c.fail(f"not attempted: {next(s['message'] for s in ranks if s['status'] == outcomes.NOT_ATTEMPTED)}",
               outcome=outcomes.NOT_ATTEMPTED)
    if ranks and any(s["status"] == outcomes.ERROR for s in ranks):
        sentence, traceback = rank_error(ranks, labels)
        c.fail(sentence, traceback, outcome=outcomes.ERROR)
    earlier = next((name for name, rs in reply.result["scenarios"].items()
                    if any(s["status"] == outcomes.ERROR for s in rs)), None)
    why = f" ({rank_error(reply.result['scenarios'][earlier], labels)[0]})" if earlier else ""
    c.fail(f"not run: the {earlier or 'previous'} scenario of the same run failed first{why}", outcome=outcomes.ERROR)


COMMUNICATION_FAILURES = ("gloo", "timeout", "timed out", "closed by peer", "pair closure", "connection reset")


def where_raised(status: dict, labels: dict | None) -> str:
    """Where in the scenario a rank raised, counting training steps from 1: "in the optimizer's step,
    during training step 4". add_param_group is called between two steps (`step` counts the steps
    done before it): "in add_param_group, called after training step 3"."""
    label = (labels or {}).get(status.get("phase"), status.get("phase"))
    step = status.get("step", -1)
    if step is None or step < 0:
        return f"in {label}"
    if status.get("phase") == "add_param_group":
        return f"in {label}, called " + (f"after training step {step}" if step else "before the first training step")
    return f"in {label}, during training step {step + 1}"


def rank_error(ranks, labels):
    """(sentence, traceback) for the first rank that raised. A rank left waiting for a peer that
    raised fails later inside gloo (timeout, connection closed): show the cause, not that."""
    def where(s):
        return where_raised(s, labels)

    def short(message):
        message = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", message)  # gloo's source location
        return message.split(". ")[0][:200]

    errors = [(r, s) for r, s in enumerate(ranks) if s["status"] == outcomes.ERROR]
    own = [(r, s) for r, s in errors if not any(w in s["message"].lower() for w in COMMUNICATION_FAILURES)]
    if own:
        r, s = own[0]
        return f"rank {r} raised {s['message']} ({where(s)}).", s.get("traceback", "")
    each = "; ".join(f"rank {r}: {short(s['message'])} ({where(s)})" for r, s in errors)
    return (f"a collective never completed (timeout or peer gone): the ranks did not issue the same "
            f"collectives in the same order. {each}.", errors[0][1].get("traceback", ""))


# -- the judges of what the ranks hold (pure functions of the records: tests/self tests them) --

STATE_SLACK = 16  # elements: room for a few scalar state entries


def judge_buffers(want: dict, got: list, later: list, own: list):
    """(failure sentence or None, note, evidence) for ddp::buffers. want: rank 0's buffers at
    construction; per rank: its buffers right after wrapping, after the first forward ({} if
    not recorded) and at its own construction."""
    evidence = "; ".join(
        f"{n} after wrapping, max difference from rank 0's initial value: "
        + ", ".join(f"rank {r}: {max_diff(got[r], {n: b})[0]:.2g}" for r in range(len(got)))
        + " (at construction: " + ", ".join(f"rank {r}: {max_diff(own[r], {n: b})[0]:.2g}" for r in range(len(got)))
        + ")" for n, b in want.items())
    at_forward = []
    for r in range(len(got)):
        bad = [n for n in want if not close(got[r][n], want[n])]
        if not bad:
            continue
        if r == 0:
            return (f"rank 0's buffers {names(bad)} changed when wrapping: the broadcast must send rank 0's "
                    f"values (src=0)."), "", evidence
        if later[r] and all(close(later[r][n], want[n]) for n in want):
            at_forward.append(r)  # synchronised in the first forward, as torch's DDP does
            continue
        if kept := [n for n in bad if close(got[r][n], own[r][n])]:
            return (f"rank {r} kept its own buffer {names(kept)}: buffers are not broadcast from rank 0. The "
                    f"handout asks for the weights only, so this is advice: with buffers that differ across "
                    f"ranks (BatchNorm statistics, random buffers) the ranks compute different forwards."), "", evidence
        return (f"after wrapping, rank {r}'s buffer {names(bad)} matches neither rank 0's initial value nor its "
                f"own."), "", evidence
    when = (f"after the first forward (rank {', '.join(map(str, at_forward))} still had its own right after "
            f"wrapping)" if at_forward else "right after wrapping")
    which = f"buffer {names(want)}, which differs" if len(want) == 1 else f"buffers {names(want)}, which differ"
    return None, f"every rank holds rank 0's {which} across ranks at construction, {when}", evidence


def state_unmeasured(ranks: list):
    """Why the ranks' optimizer state cannot be counted (a sentence), or None. The count reads the
    .state of the returned optimizer and of torch.optim.Optimizer objects held in its attributes;
    state kept anywhere else (a subclass that never calls Optimizer.__init__ and keeps its own
    dicts, say) is invisible to it, which says nothing about the submission."""
    for r, s in enumerate(ranks):
        if s.get("state_unread"):
            return f"rank {r}: {s['state_unread']}"
    if all(not s.get("state_numel") for s in ranks):
        return ("no rank's optimizer state was found: the check counts the .state of the returned optimizer "
                "and of the torch.optim.Optimizer objects its attributes hold, and this optimizer keeps its "
                "state elsewhere")
    return None


def balanced_bound(total: int, largest: int, world_size: int) -> int:
    """State elements a rank may hold when parameters are shared out by size: 1/world_size of
    the total, plus the largest parameter's state (a parameter is not split), plus slack."""
    return total // world_size + largest + STATE_SLACK


def judge_state_sharded(count: int, total: int, largest: int, params: list, held: list):
    """(failure sentence or None, evidence) for state_sharded: per rank, `params` parameters with
    optimizer state and `held` state elements, of `count` and `total` unsharded. A rank may hold
    about 1/world_size of the parameters by count (round-robin) or by size (numel-balanced):
    it fails only when it holds more by both measures, or all of them."""
    world_size = len(held)
    allowed, bound = math.ceil(count / world_size) + 1, balanced_bound(total, largest, world_size)
    evidence = (f"parameters with optimizer state per rank: {params} of {count} (about 1/{world_size} by count: "
                f"at most {allowed}); optimizer-state elements per rank: {held} of {total} (about 1/{world_size} "
                f"by size: at most {bound})")
    if all(h >= total for h in held):
        return (f"every rank holds the full optimizer state ({held[0]} elements of {total}): state is not "
                f"sharded."), evidence
    if empty := [r for r, h in enumerate(held) if h == 0]:
        return (f"rank {empty[0]} holds no optimizer state while rank {held.index(max(held))} holds {max(held)} "
                f"of {total}: the parameters are not shared out between the ranks."), evidence
    if over := [r for r, (k, h) in enumerate(zip(params, held)) if k >= count or (k > allowed and h > bound)]:
        r = over[0]
        return (f"rank {r}'s optimizer holds state for {params[r]} of the {count} parameters ({held[r]} of {total} "
                f"elements), more than about 1/{world_size} of them by count or by size: each rank must handle "
                f"only its own subset."), evidence
    return None, evidence


def judge_state_balanced(count: int, total: int, largest: int, params: list, held: list):
    """(failure sentence or None, evidence) for state_balanced: no rank holds more than
    total/world_size + the largest parameter's state + STATE_SLACK elements."""
    bound = balanced_bound(total, largest, len(held))
    evidence = (f"optimizer-state elements per rank: {held}; unsharded AdamW holds {total}, largest parameter's "
                f"share {largest}, allowed per rank {bound}; parameters with state per rank: {params} of {count}")
    if all(h >= total for h in held):
        return "every rank holds the full optimizer state: there is no split to balance (see state_sharded).", \
            evidence
    if over := [r for r, h in enumerate(held) if h > bound]:
        r = over[0]
        return (f"assign parameters by size (numel), not by count: rank {r} holds {held[r]} of {total} "
                f"optimizer-state elements, more than the {bound} a balanced split allows (1/{len(held)} plus "
                f"the largest parameter's state); the handout asks only for about 1/world_size of the "
                f"parameters, so this is advice."), evidence
    return None, evidence


def greedy_buckets(sizes: list, limit: float) -> int:
    """How many buckets the reference (reference/ddp.py DDPBucketed) makes of parameters of
    `sizes` bytes (in parameters() order) with at most `limit` bytes each: filled in reverse
    order, a new bucket when the next one would overflow, one too large alone."""
    buckets, current = 0, None
    for size in reversed(sizes):
        if current is None or current + size > limit:
            buckets, current = buckets + 1, 0
        current += size
    return buckets


def judge_bucketing(sizes: list, limit: float, calls: list):
    """(failure sentence or None, evidence) for ddp::bucketing. sizes: bytes of each parameter
    that gets a gradient; limit: bucket_size_mb in bytes; calls: per rank, per step, the element
    counts of the reducing collectives issued. The handout (2025, ddp_overlap_bucketed) asks for
    buckets of at most bucket_size_mb "to reduce the total number of communication calls": a
    step with at least one call per parameter, where the bucket size lets several share one,
    never bucketed. How parameters are grouped is the student's choice, so only that is judged."""
    n, expected = len(sizes), greedy_buckets(sizes, limit)
    evidence = "; ".join(f"rank {r}: " + ", ".join(f"step {s + 1}: {len(c)} ({'+'.join(map(str, c))} elements)"
                                                  for s, c in enumerate(steps)) for r, steps in enumerate(calls))
    evidence = (f"{n} parameters get gradients ({sum(sizes)} bytes; bucket_size_mb = {limit / 1024 ** 2:g} MB = "
                f"{limit:.0f} bytes; the reference fills {expected} buckets); reducing collectives per step: "
                f"{evidence}")
    if expected >= n:
        return None, evidence  # every parameter needs a bucket of its own at this size: nothing to judge
    for r, steps in enumerate(calls):
        for s, c in enumerate(steps):
            if len(c) >= n:
                return (f"gradients are not bucketed: on rank {r}, step {s + 1} issued {len(c)} reducing "
                        f"collectives for the {n} parameters that get gradients, one per parameter, although "
                        f"buckets of {limit / 1024 ** 2:g} MB hold several of them (the reference needs {expected}). "
                        f"Fill each bucket up to bucket_size_mb megabytes of parameters (a common cause: a count of "
                        f"bytes compared with bucket_size_mb itself rather than with bucket_size_mb * 1024 ** 2)."), \
                    evidence
    return None, evidence
