"""One line for an exception a submission raised, as the reports show it. Used by the runner and
by its ranks; imports nothing heavy, so tests can call it in their own process."""
import os
import traceback


def describe(exc: BaseException) -> str:
    """'TypeName: first line', with what the first line leaves out when it is only a place."""
    if isinstance(exc, SystemExit):
        return f"SystemExit: sys.exit({exc.code!r}) was called"
    text = str(exc).strip().splitlines()
    described = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    # Compilers name the place first ("at 90:51:" from Triton, "backend='inductor' raised:" from
    # torch.compile) and keep the reason in the exception they wrap: say the reason on the same line.
    reason = exc.__cause__ or getattr(exc, "inner_exception", None)
    if reason is not None and text and text[0].rstrip().endswith(":"):
        lines = str(reason).strip().splitlines()
        described += f" {type(reason).__name__}" + (f": {lines[-1].strip()}" if lines else "")
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, TypeError) and frames and (frames[-1].line or "").startswith("raise NotImplemented"):
        # a common slip in the course's repos: Python's error names neither the line nor the cause
        where = f"{os.path.relpath(frames[-1].filename)}:{frames[-1].lineno}"
        described += (f" (`{frames[-1].line}` at {where}: NotImplemented is a constant, not an exception; "
                      f"raise NotImplementedError instead)")
    return described
