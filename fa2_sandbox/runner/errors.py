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


def where_raised(exc: BaseException, root) -> str | None:
    """'cs336_systems/attention.py, line 3': where in the submission's files (under `root`) an
    error was raised, the innermost such place (a SyntaxError's, its own); None when no frame is there."""
    root = os.path.realpath(root)

    def inside(path) -> bool:
        return bool(path) and os.path.realpath(path).startswith(root + os.sep)

    if isinstance(exc, SyntaxError) and inside(exc.filename):
        path, line = exc.filename, exc.lineno
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if inside(f.filename)]
        if not frames:
            return None
        path, line = frames[-1].filename, frames[-1].lineno
    return f"{os.path.relpath(os.path.realpath(path), root)}, line {line}"


def import_failure(adapters_file: str, exc: BaseException, root) -> str:
    """The one sentence every check of a submission whose adapters do not import says: 'tests/adapters.py
    failed to import: SyntaxError: invalid syntax (tests/adapters.py, line 12)': the error's first line,
    and the file and line in the submission where it was raised."""
    if isinstance(exc, SyntaxError) and exc.msg:  # its own text names the file without its folder
        described = f"{type(exc).__name__}: {exc.msg}"
    else:
        described = describe(exc)
    where = where_raised(exc, root)
    return f"{adapters_file} failed to import: {described}" + (f" ({where})" if where else "")
