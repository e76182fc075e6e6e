"""The fork server: one process that has imported torch and Triton, and forks each runner from itself.

A runner started afresh spends seconds of CPU before it reads its first request: a Python, then
torch, Triton and torch.compile's modules imported, in each of the hundreds of runners a class
starts (the largest share of a class's CPU with compiling: notes/grading-speed.md, "where a class's
CPU goes"). Forked from a process that holds them already, it starts in a few milliseconds and
shares their pages.

    python -P fork_server.py CONTROL_FD LAUNCHER_PY MODULE...   (started by fa2_sandbox/harness/forked.py)

Run as a script, not as a package module: it imports nothing of the project, so the runners it
forks import the trusted modules from their own copy (their PYTHONPATH), as an exec'd runner does.
It holds no secret and never runs a submission's code: it imports the MODULEs, then only forks. A
child confines itself exactly as the launcher confines an exec'd runner (launcher.launch, with the
runner started in place of the exec), then runs fa2_sandbox.runner.serve as `python -m` would.

The server stays single-threaded and never touches CUDA or runs an operator: a fork copies only the
calling thread, and a CUDA context or an OpenMP pool does not survive one. After each preload it
checks that it still has one thread; if a module started one, the server says so and stops, and
the harness starts runners the usual way.

Protocol, on a SOCK_SEQPACKET socket (each message one JSON object):
- server -> harness: {"ready": true} once imported, or {"error": why}; {"started": pid} for each
  request; {"exited": pid, "returncode": code} as each child ends (Popen's code: -N for signal N).
- harness -> server: {"spec": the launcher's spec or null, "cwd": ..., "env": {...}}, with the
  runner's three descriptors (requests in, replies out, its log) passed along (SCM_RIGHTS).
"""
import atexit
import gc
import importlib.util
import json
import os
import runpy
import select
import signal
import socket
import sys

MAX_MESSAGE = 1 << 20
PR_SET_NAME, PR_SET_PDEATHSIG = 15, 1


def send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def name_process(name: bytes) -> None:
    """What `ps` and bench/utilization.py see of this process (its command line is the server's)."""
    import ctypes
    ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def preload(modules: list) -> str | None:
    """Import `modules`; None, or why the server cannot fork safely."""
    for name in modules:
        try:
            __import__(name)
        except Exception:  # optional: a runner imports it itself if it needs it
            pass
        if threads() != 1:
            return f"importing {name} started a thread ({threads()} now): forking would not be safe"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "a preloaded module initialised CUDA, which a fork does not survive"
    return None


def receive(sock: socket.socket):
    """(the request, its descriptors), or None once the harness has closed its end."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
    if not data:
        return None
    return json.loads(data), list(fds)


def become_runner(request: dict, fds: list, launcher) -> None:
    """In the forked child: the runner's descriptors, folder and environment, its confinement,
    then serve. Never returns."""
    code = 71
    try:
        reads, writes, log = fds
        name_process(b"fa2-runner")
        gc.enable()
        os.setsid()  # its own process group, as start_new_session gives an exec'd runner
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        keep = {0, 1, 2, reads, writes}
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        os.chdir(request["cwd"])
        own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p] + \
            [p for p in sys.path if p not in own]
        import tempfile
        tempfile.tempdir = None  # TMPDIR is the runner's now
        if "multiprocessing.process" in sys.modules:  # where spawned ranks resolve the main module from
            sys.modules["multiprocessing.process"].ORIGINAL_DIR = os.path.abspath(request["cwd"])
        import site
        site.USER_BASE = site.USER_SITE = None
        site.getusersitepackages()  # from the runner's HOME, as its own start would have
        if "numpy.random" in sys.modules:  # its global generator, seeded at its import (`random` reseeds itself)
            sys.modules["numpy.random"].seed()
        sys.argv = ["fa2_sandbox.runner.serve", str(reads), str(writes)]
        spec = request.get("spec")
        if spec is not None:
            launcher.launch(spec, sys.argv, start=serve)
        else:  # no sandbox here: a runner dies with the grader all the same
            import ctypes
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            serve()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException as exc:
        print(f"[grader] the runner's sandbox could not be set up: {exc!r}", file=sys.stderr, flush=True)
    os._exit(code)


def serve() -> None:
    """The runner, as `python -m fa2_sandbox.runner.serve` runs it; exits as that would."""
    code = 0
    try:
        runpy.run_module("fa2_sandbox.runner.serve", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    spec = importlib.util.spec_from_file_location("fa2_launcher", sys.argv[2])
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)  # standard library only, like the script it is
    import ctypes
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # gone with its grader worker
    name_process(b"fa2-forkserver")
    # Python's own advice for a process that forks without exec (the gc module's freeze): no
    # collection here, and what the imports made frozen, so a runner's collections skip it and
    # leave its pages shared.
    gc.disable()
    unsafe = preload(sys.argv[3:])
    gc.freeze()
    send(sock, {"error": unsafe} if unsafe else {"ready": True})
    if unsafe:
        return
    children = set()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.2)
        while children:  # reap, and tell
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            send(sock, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})
        if not readable:
            continue
        got = receive(sock)
        if got is None:  # the harness is gone: so are its runners (their parent-death signal)
            return
        request, fds = got
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            send(sock, {"error": f"a request came with {len(fds)} descriptors, not 3"})
            continue
        pid = os.fork()
        if pid == 0:
            sock.close()
            become_runner(request, fds, launcher)
        children.add(pid)
        for fd in fds:  # the runner's alone now: its pipes close when it ends
            os.close(fd)
        send(sock, {"started": pid})


if __name__ == "__main__":
    main()
