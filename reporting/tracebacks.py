"""Tracebacks as a report page shows them: the student's own frames stand out, named by their path
in the student's repo; the grader's runner frames and the libraries' frames (torch, Triton, other
site-packages, Python's standard library) fold into one line per run of them. The page keeps the
full trace one click away (templates/macros.html.j2 `evidence`).

The runner already names the submission's files relative to its copy of the submission
(fa2_sandbox/runner/errors.py format_traceback); a trace recorded otherwise (a DDP rank's, an
older results.json) may still name the scratch copy, /tmp/grade-xxxx/submission/..., which is
rewritten here to the repo's path."""
import re

# A frame's first line, as Python's traceback module writes it.
FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<path>[^"]+)", line (?P<line>\d+)(?P<rest>.*)$')
# The grader's scratch copy of a submission (fa2_sandbox/harness/scratch.py): grade-XXXX/submission/.
SCRATCH_COPY = re.compile(r'(?:/[^"/\s]+)*/grade-[^/"\s]+/submission/')


def repo_paths(text: str) -> str:
    """`text` with the scratch copy's paths of the submission's files made the repo's paths."""
    return SCRATCH_COPY.sub("", text)


def owner(path: str) -> str | None:
    """Whose code a frame's file is: None for the student's (a path in the repo), else the words a
    folded line names it by."""
    path = repo_paths(path)
    if not path.startswith(("/", "<")):
        return None
    if "/fa2_sandbox/" in path or "/grading/" in path:
        return "the grader's runner"
    for library in ("torch", "triton"):
        if f"/site-packages/{library}/" in path or f"/dist-packages/{library}/" in path:
            return library
    if "/site-packages/" in path or "/dist-packages/" in path:
        return "other libraries"
    if path.startswith("<") or re.search(r"/lib/python\d[\d.]*/", path):
        return "Python"
    return None  # a file elsewhere on the machine: maybe the student's, so it stays in view


def frames(lines: list) -> list:
    """[(is_frame, owner, [lines])]: the text cut into frames (a File line with its indented source
    and carets, and whose code it is: owner) and single other lines (is_frame False)."""
    pieces, i = [], 0
    while i < len(lines):
        match = FRAME.match(lines[i])
        if not match:
            pieces.append((False, None, [lines[i]]))
            i += 1
            continue
        indent = len(match["indent"])
        body = [lines[i]]
        i += 1
        while i < len(lines) and lines[i].startswith(" " * (indent + 2)) and not FRAME.match(lines[i]):
            body.append(lines[i])
            i += 1
        pieces.append((True, owner(match["path"]), body))
    return pieces


def folded_line(indent: str, owners: list) -> str:
    """'[6 frames of the grader's runner and torch folded]'."""
    names = list(dict.fromkeys(owners))
    whose = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"{indent}[{len(owners)} frame{'s' if len(owners) != 1 else ''} of {whose} folded]"


def fold(text: str) -> str | None:
    """The traceback(s) in `text` with the student's frames in view and every run of other frames
    folded into one line; None when `text` holds no frame to fold (show it as it is)."""
    out, run, indent, folded_any = [], [], "", False
    for is_frame, who, body in frames(repo_paths(text).splitlines()):
        if is_frame and who is not None:
            run.append(who)
            indent = FRAME.match(body[0])["indent"]
            continue
        if run:
            out.append(folded_line(indent, run))
            run, folded_any = [], True
        out.extend(body)
    if run:
        out.append(folded_line(indent, run))
        folded_any = True
    return "\n".join(out) if folded_any else None
