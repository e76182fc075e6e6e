"""Words for the inputs a flash call changed in place, which the runner finds by comparing q, k,
v and dO bit for bit before and after the forward and the backward (fa2_sandbox/runner/input_changes.py).

The official tests never check this, but a class that writes into the caller's tensors corrupts
them, and its answers come from inputs other than the oracle's: a check that judges the answers
names the change first, so a student is not sent looking for a rounding bug (test_flash.py), and
the hygiene check fails for it.
"""

PHASES = ("forward", "backward")


def _amount(change: dict) -> str:
    """"64 of 131,072 elements, by up to 2.9e-04", from the runner's record of one tensor."""
    if not isinstance(change, dict):
        return "by an unknown amount"
    if isinstance(change.get("now"), str):  # its shape or dtype changed (resize_, set_)
        return f"it is now {change['now'][:100]}"
    counts = change.get("changed"), change.get("numel")
    elements = f"{counts[0]:,} of {counts[1]:,} elements" if all(isinstance(n, int) for n in counts) else "elements"
    largest = change.get("largest")
    return f"{elements}, by up to {largest:.2g}" if isinstance(largest, (int, float)) else \
        f"{elements}, some to inf or NaN"


def changed_inputs(reply, phases=PHASES) -> str:
    """What the call's `phases` changed in the caller's inputs, as a sentence ("the forward changed
    q in place (64 of 131,072 elements, by up to 2.9e-04)"), or "" where they changed nothing or the
    call did not answer."""
    found = reply.result.get("changed_inputs") if reply is not None and reply.ok else None
    if not isinstance(found, dict):
        return ""
    said = []
    for phase in phases:
        tensors = found.get(phase)
        if isinstance(tensors, dict) and tensors:
            named = [f"{str(name)[:20]} in place ({_amount(change)})" for name, change in list(tensors.items())[:4]]
            said.append(f"the {phase} changed " + (named[0] if len(named) == 1 else
                                                   ", ".join(named[:-1]) + " and " + named[-1]))
    return "; ".join(said)


def name_changed_inputs(check, reply, phases=PHASES) -> None:
    """Have `check`, which judges the call's answers against the oracle, say first, pass or fail,
    which inputs `phases` changed in place."""
    if changed := changed_inputs(reply, phases):
        check.preface(f"{changed}: the oracle was computed from the inputs as given")
