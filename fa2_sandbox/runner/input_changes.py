"""Which of a flash call's inputs the submission's code changed in place, compared bit for bit.

The grader judges answers against an oracle of the inputs as they were drawn; a class that writes
into the caller's q, k, v or dO (even by less than bf16's rounding step, which the bf16 cases never
show) corrupts the caller's tensors, and its answers come from other inputs. The runner copies the
inputs before a call and compares after it: a change is counted where the bits differ, so -0.0
for 0.0 and a rewritten NaN count too.
"""
import torch

# Bound now, before any submission is imported: a submission that patched them could hide a change.
EQUAL = torch.equal
CLONE = torch.Tensor.clone
VIEW = torch.Tensor.view
SAME_SIZE_INTEGER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def snapshot(tensors: dict) -> dict:
    """Copies of `tensors` (name -> tensor) as they are now."""
    return {name: CLONE(t) for name, t in tensors.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return VIEW(t, SAME_SIZE_INTEGER[t.element_size()])


def changes(before: dict, after: dict) -> dict:
    """For each tensor of `after` whose bits differ from its copy in `before`: {"changed": how many
    elements, "numel": of how many, "largest": the largest absolute change, or None where it is not
    finite (a value became inf or NaN) or the tensor's shape changed}. Unchanged tensors are left out."""
    found = {}
    for name, now in after.items():
        was = before[name]
        if now.shape != was.shape or now.dtype != was.dtype:
            found[name] = {"changed": was.numel(), "numel": was.numel(), "largest": None,
                           "now": f"{str(now.dtype).replace('torch.', '')} of shape {list(now.shape)}"}
            continue
        if EQUAL(_bits(now), _bits(was)):
            continue
        differs = _bits(now) != _bits(was)
        delta = (now.double() - was.double()).abs()[differs]
        largest = delta.max().item()
        found[name] = {"changed": int(differs.sum().item()), "numel": was.numel(),
                       "largest": largest if bool(torch.isfinite(delta).all()) else None}
    return found
