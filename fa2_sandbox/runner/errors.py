"""One line for an exception a submission raised, as the reports show it. Used by the runner and
by its ranks; imports nothing heavy, so tests can call it in their own process."""
import inspect
import linecache
import os
import sys
import traceback

QUOTED_CHARS = 100  # a quoted source line longer than this is cut, so the sentence stays one line
# The frames a traceback keeps of each exception, the innermost: enough to reach from the runner's
# call through the student's code into torch or Triton, where the error was raised; the page
# folds the grader's and the libraries' frames (reporting/tracebacks.py).
TRACEBACK_FRAMES = 24


def describe(exc: BaseException, root=None) -> str:
    """'TypeName: first line', with what the first line leaves out when it is only a place. With
    `root` (the submission's folder), a Triton error inside a kernel names the file under `root`,
    the line and its source instead of Triton's own position (triton_place)."""
    if root is not None and (place := _safe_triton_place(exc, root)):
        return place
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


def format_traceback(exc: BaseException, root, limit: int = TRACEBACK_FRAMES) -> str:
    """The exception's traceback, its causes' too, as Python prints it, with the innermost `limit`
    frames of each; a file under `root` (the runner's copy of the submission) is named by its path
    in the submission, as the student's repo names it, not by the scratch copy's."""
    # The source lines are read as the frames are taken (lookup_lines), before their files are renamed.
    shown = traceback.TracebackException(type(exc), exc, exc.__traceback__, limit=-limit, lookup_lines=True)
    part, seen = shown, set()
    while part is not None and id(part) not in seen:
        seen.add(id(part))
        for frame in part.stack:
            frame.filename = _inside(frame.filename, root) or frame.filename
        if isinstance(getattr(part, "filename", None), str):  # a SyntaxError's own file
            part.filename = _inside(part.filename, root) or part.filename
        part = part.__cause__ or part.__context__
    return "".join(shown.format())


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


# -- Triton errors inside a kernel -------------------------------------------------------------
#
# On a GPU, Triton compiles a kernel from its source and reports a mistake as a CompilationError
# "at 9:14:", counted from the kernel's `def` line (1) and its column, with the reason in the error
# it wraps; one inside a @triton.jit helper is wrapped again by each caller's CompilationError, at
# the call. Triton strips its code generator's frames from the traceback, so the kernel is found
# by the source the error carries (CompilationError.src is the JITFunction's `src`). Under the
# interpreter (TRITON_INTERPRET=1) the kernel runs as Python: the same mistake is an
# InterpreterError wrapping the error, and the kernel's frames keep their true lines.

def triton_place(exc: BaseException, root) -> str | None:
    """'CompilationError: cs336_systems/flash.py, line 216 (in helper, called from line 190):
    `tl.store(o_ptr, acc)`: AssertionError: ...' for a Triton error whose place is in the
    submission's files under `root`; None for any other error, or where the place is not found."""
    chain = _chain(exc)
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    if "CompilationError" in kinds:
        places = _compile_places(chain, root)
    elif "InterpreterError" in kinds:
        places = _interpreted_places(chain, root)
    else:
        return None
    if not places:
        return None
    (path, line, function), callers = places[-1], places[:-1]
    where = f"{path}, line {line}"
    if callers:
        called = ", in turn from ".join(_caller(place, path) for place in reversed(callers))
        where += f" (in {function}, called from {called})"
    source = linecache.getline(os.path.join(os.path.abspath(root), path), line).strip()
    if len(source) > QUOTED_CHARS:
        source = source[:QUOTED_CHARS].rstrip() + "..."
    quoted = f": `{source}`" if source else ""
    return f"{type(exc).__name__}: {where}{quoted}: {_reason(chain)}"


def _safe_triton_place(exc: BaseException, root) -> str | None:
    """triton_place, or None where finding the place fails: it reads the student's objects (their
    kernels, modules and frames), and a sentence must come whatever they hold."""
    try:
        return triton_place(exc, root)
    except Exception:
        return None


def _chain(exc: BaseException) -> list:
    """The exception and those it wraps, outermost first (each one's cause, or else its context)."""
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _inside(path, root) -> str | None:
    """`path` relative to `root` when it is a file under it, else None."""
    if not path or path.startswith("<"):
        return None
    # as imported first (a file a link of the submission leads to keeps its place in it), then resolved
    for resolve in (os.path.abspath, os.path.realpath):
        base, full = resolve(root), resolve(path)
        if full.startswith(base + os.sep):
            return os.path.relpath(full, base)
    return None


def _caller(place: tuple, innermost_path: str) -> str:
    path, line, _ = place
    return f"line {line}" if path == innermost_path else f"{path}, line {line}"


def _reason(chain: list) -> str:
    """What went wrong: the error Triton wrapped ('AssertionError: Both operands must be same dtype'),
    or, where it wrapped none, the message of the innermost CompilationError."""
    wrapped = [e for e in chain if not _is_triton_wrapper(e)]
    if wrapped:
        lines = str(wrapped[0]).strip().splitlines()
        return f"{type(wrapped[0]).__name__}" + (f": {lines[-1].strip()}" if lines else "")
    innermost = chain[-1]
    return (getattr(innermost, "error_message", None) or str(innermost)).strip().splitlines()[-1]


def _is_triton_wrapper(exc: BaseException) -> bool:
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    return "CompilationError" in kinds or "InterpreterError" in kinds


def _compile_places(chain: list, root) -> list:
    """(path under root, line in the file, function) of each CompilationError of the chain that has a
    position, outermost first: the calls that led to the mistake, then the mistake."""
    kernels = _jit_functions(chain, root)
    places = []
    for error in chain:
        node, src = getattr(error, "node", None), getattr(error, "src", None)
        if not isinstance(src, str) or getattr(node, "lineno", None) is None:
            continue
        kernel = next((k for k in kernels if k.src is src), None) or next((k for k in kernels if k.src == src), None)
        path = _inside(_file(kernel), root) if kernel is not None else None
        if path is None:
            continue
        def_line = _def_line(kernel)
        if def_line is None:
            continue
        # node.lineno counts from the `def` line (1), so the file's line is the def's plus it, less one
        places.append((path, def_line + node.lineno - 1, _name(kernel)))
    return places


def _file(kernel) -> str | None:
    """The kernel's file: Triton's record of it, or its Python function's own."""
    return getattr(kernel, "file_name", None) or getattr(getattr(getattr(kernel, "fn", None), "__code__", None),
                                                         "co_filename", None)


def _def_line(kernel) -> int | None:
    """The file's line of the kernel's `def`: Triton's own record of it, or, in a Triton that keeps
    only the first line of the decorators (starting_line_number), counted from there."""
    if isinstance(getattr(kernel, "def_file_line_number", None), int):
        return kernel.def_file_line_number
    try:
        lines, first = inspect.getsourcelines(kernel.fn)
    except (AttributeError, OSError, TypeError):
        return None
    return next((first + i for i, line in enumerate(lines) if line.lstrip().startswith("def ")), None)


def _interpreted_places(chain: list, root) -> list:
    """(path under root, line, function) of the submission's innermost frame in each exception the
    outermost InterpreterError wraps, outermost first: the kernel frames, the mistake last. The
    outermost's own frames are the launch from Python, not the kernel's."""
    places = []
    for error in chain[1:]:
        frames = [(path, frame.lineno, frame.name) for frame in traceback.extract_tb(error.__traceback__)
                  if (path := _inside(frame.filename, root)) is not None]
        if frames:
            places.append(frames[-1])
    return places


def _name(kernel) -> str:
    return getattr(getattr(kernel, "fn", None), "__name__", None) or getattr(kernel, "__name__", "the kernel")


def _jit_functions(chain: list, root) -> list:
    """The @triton.jit functions that a CompilationError's source can come from: those the frames of
    the chain hold (the kernel being compiled, its launcher), and those of the submission's modules
    (its helpers, autotuned or not)."""
    found = []
    for error in chain:
        for frame, _ in traceback.walk_tb(error.__traceback__):
            found += [_unwrap(value) for value in list(frame.f_locals.values())]
    for module in list(sys.modules.values()):
        if _inside(getattr(module, "__file__", None), root) is not None:
            found += [_unwrap(value) for value in list(vars(module).values())]
    return [fn for fn in found if fn is not None]


def _unwrap(value, depth: int = 4):
    """The JITFunction under a value (an Autotuner or Heuristics wraps one as `.fn`; an ASTSource
    holds one as `.fn`), or None. Recognised by what Triton's JITFunction has, so that this module
    need not import Triton."""
    for _ in range(depth):
        try:
            if isinstance(getattr(value, "src", None), str) and callable(getattr(value, "parse", None)):
                return value
            value = getattr(value, "fn", None)
        except Exception:  # a student's object whose attributes raise: not a kernel
            return None
        if value is None:
            return None
    return None
