"""One runner's scratch folder: what it holds, who owns what, and how the runner is started there.

The folder is a fresh temporary folder with no name of the submission in it (the system's temp
folder is listable by all), mode 0711: others pass through it but cannot list it. Inside:

- `trusted/`: a copy of just the modules the runner trusts (TRUSTED_MODULES: fa2_sandbox/runner/
  and fa2_sandbox/wire/). The runner imports trusted modules from it (first on its PYTHONPATH),
  never from the project root, so the reference solutions and the oracle are not on its path;
  the oracle and the hidden rubric live only in the grader's process and are never written
  where a runner can read them.
- `submission/`: a private copy of the submission's directory, the runner's working directory.
  Links are followed only while they stay inside the submission (a link to /etc/shadow or
  ../../reports must not be copied as root into a folder the student's code can read); only the
  bundled submissions of a grader checkout (BUNDLED_SUBMISSIONS) may link outside their folder,
  into that checkout's reference/ (`linked_reference`).
  Special files and what COPY_IGNORE names are skipped; every link not copied is noted.
- `exchange/` (where replies' tensors travel: fa2_sandbox.wire.tensors) and `home/` (its HOME,
  TMPDIR and caches). Its Triton cache, `home/.triton/cache`, starts as a copy of the kernels
  this submission's runners compiled before, where the caller keeps them (kernel_cache.py), and
  goes back there when the folder is removed.

The copy, `exchange/` and `home/` are mode 0700. Where the runner has a uid of its own, it owns
them and the grader owns the scratch folder itself and `trusted/` (read-only to the runner), so
the runner can change none of the code it trusts and no other runner can read its files; where
it has none (sandbox mode "none", which its log says), it can read and write all of them; in
mode "userns" all but `trusted/`, which its root holds read-only.

The sandbox spec (for fa2_sandbox.harness.confinement's launcher) sets hard limits: no core dumps,
FILE_LIMIT bytes per file, the runner's memory limit as RLIMIT_DATA where the sandbox probe says
it works, NPROC_LIMIT processes for a uid of its own; in a namespace, a root holding only system
folders, Python and this scratch folder (the project, the submission's original and GRADER_HIDE
hidden; the grader's packages installed in that Python covered by empty folders). Of the grader's
environment the runner gets only the variables ENV_KEEP names (no tokens, no paths), besides its
own folders.
"""
import os
import shutil
import sys
import tempfile
from pathlib import Path

from fa2_sandbox import PROJECT_ROOT
from fa2_sandbox.harness import confinement, kernel_cache
from fa2_sandbox.harness.discover import Submission

COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "wandb", "*.pt", "*.ckpt")
# What the runner imports from the project: copied into its scratch folder, nothing else.
# The runner side and the wire: exactly the code the runner trusts.
TRUSTED_MODULES = ["fa2_sandbox/__init__.py", "fa2_sandbox/runner/*.py", "fa2_sandbox/wire/*.py"]
# A checkout's bundled submissions link into its reference/: the only links that may leave a submission.
# The bundled submissions that link to the checkout's reference/ package (a link the copy follows).
BUNDLED_SUBMISSIONS = ["submissions/reference", "submissions/slow/tiles16",
                       "submissions/examples/triton_backward_python_loop", "submissions/examples/triton_asserts_cuda"]
ENV_KEEP = ("PATH", "LANG", "LC_", "TZ", "TERM", "LD_LIBRARY_PATH", "CUDA_", "NVIDIA_", "OMP_", "MKL_",
            "OPENBLAS_", "KMP_", "TRITON_", "TORCH_", "PYTORCH_", "NCCL_", "GLOO_", "TORCHINDUCTOR_",
            "FLASH_TRITON_",  # the reference solution's own switches (FLASH_TRITON_AUTOTUNE)
            "GRADER_AUTOTUNE_SIDE_BY_SIDE")  # 0: autotuned configs compiled one by one (runner/parallel_autotune.py)
FILE_LIMIT = int(float(os.environ.get("GRADER_FILE_LIMIT_GB", 2)) * (1 << 30))  # one file's size
NPROC_LIMIT = 4096  # processes + threads of the runner's uid


def linked_reference(root: Path) -> Path | None:
    """The reference/ folder the submission at `root` (a real path) may link into: where `root` is
    one of BUNDLED_SUBMISSIONS of a grader checkout (this one, or the one a grader installed from
    a wheel grades), that checkout's reference/; None for every other submission."""
    for bundled in BUNDLED_SUBMISSIONS:
        depth = bundled.count("/") + 1
        if root.as_posix().endswith("/" + bundled) and len(root.parents) > depth:
            checkout = root.parents[depth - 1]
            if (checkout / "pyproject.toml").is_file() and (checkout / "reference" / "oracle.py").is_file():
                return Path(os.path.realpath(checkout / "reference"))
    return None


def user_site_paths() -> list:
    """The grader's user site-packages (~/.local/...): a runner's PYTHONPATH holds them after its
    trusted copy, where a pip --user install put torch or triton."""
    return [p for p in sys.path if p.endswith("site-packages") and "/.local/" in p]


class ScratchFolder:
    """One runner's scratch folder, made now (without the submission's copy) and kept until remove().
    `uid` is the runner's own uid, or None where it runs as the grader's user; `kept_kernels`,
    where this runner's track keeps its autotuning results between runners (None: nothing kept),
    the submission's compiled kernels being kept beside it (kernel_cache.py)."""

    def __init__(self, submission: Submission, uid: int | None, kept_kernels: Path | None = None):
        self.submission = submission
        self.uid = uid
        self.path = Path(tempfile.mkdtemp(prefix="grade-"))  # no name: /tmp is listable by all
        os.chmod(self.path, 0o711)
        self.exchange = self.path / "exchange"
        self.home = self.path / "home"
        self.triton_cache = self.home / ".triton" / "cache"
        self.inductor_cache = self.home / ".inductor"
        for folder in (self.exchange, self.home, self.home / "tmp", self.triton_cache.parent, self.triton_cache,
                       self.inductor_cache):
            self._private_dir(folder)
        self.kept_kernels = kept_kernels
        self.kept_compiled = kernel_cache.kept_cache(submission.root)  # every track's compiled kernels
        self.kept_inductor = kernel_cache.kept_inductor_cache(submission.root)  # every track's torch.compile output
        if kept_kernels is not None:  # the submission's compiled kernels, then the track's autotuning
            kernel_cache.bring_in(self.kept_compiled, self.triton_cache, uid)
            kernel_cache.bring_in(kept_kernels, self.triton_cache, uid)
            kernel_cache.bring_in(self.kept_inductor, self.inductor_cache, uid)
        self.shared = kernel_cache.kernel_folders(self.triton_cache)  # kernels kept already, or brought in
        self.kernels_from_others = 0  # kernels another runner of the submission compiled while this one ran
        self.shared_bytes = 0  # what share_kernels kept of this runner's: at most MAX_TOTAL, as at its end
        self.trusted = self._copy_trusted()
        self.copy_notes = []  # links of the submission that were not copied

    def _private_dir(self, path: Path) -> None:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)

    def _copy_trusted(self) -> Path:
        trusted = self.path / "trusted"
        for pattern in TRUSTED_MODULES:
            for source in PROJECT_ROOT.glob(pattern):
                target = trusted / source.relative_to(PROJECT_ROOT)
                target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                os.chmod(target, 0o644)
        os.chmod(trusted, 0o755)
        return trusted

    def copy_submission(self, log) -> Path:
        """The private copy the runner owns, made on the first call; `log` gets each of its notes
        (a link not copied) once, when the copy is made. Links are followed only while they stay
        inside the submission; special files are skipped."""
        copy = self.path / "submission"
        if copy.exists():
            return copy
        root = Path(os.path.realpath(self.submission.root))
        reference = linked_reference(root)

        def ignore(directory, names):
            skipped = set(COPY_IGNORE(directory, names))
            here = os.path.realpath(directory)
            for name in set(names) - skipped:
                path = os.path.join(directory, name)
                target = os.path.realpath(path)
                if os.path.islink(path):
                    inside = confinement._is_under(target, str(root))
                    cycle = os.path.isdir(target) and confinement._is_under(here, target)
                    allowed = inside or (reference is not None and confinement._is_under(target, str(reference)))
                    if not os.path.exists(target) or cycle or not allowed:
                        skipped.add(name)
                        self.copy_notes.append(f"{os.path.relpath(path, self.submission.root)} (a link "
                                               f"leading outside the submission) was not copied")
                        continue
                if not (os.path.isdir(target) or os.path.isfile(target)):
                    skipped.add(name)  # FIFOs, sockets, devices
            return skipped

        shutil.copytree(self.submission.root, copy, symlinks=False, ignore=ignore)
        if self.uid is not None:
            for folder, dirs, files in os.walk(copy):
                for name in [folder] + [os.path.join(folder, n) for n in dirs + files]:
                    os.lchown(name, self.uid, self.uid)
        os.chmod(copy, 0o700)
        for note in self.copy_notes:
            log(note)
        return copy

    def sandbox_spec(self, isolation: dict, memory_limit: int) -> dict:
        """What the sandbox launcher confines the runner with, given what `isolation` (the sandbox
        probe's verdict for `memory_limit`) says works here."""
        limits = {"RLIMIT_CORE": 0, "RLIMIT_FSIZE": FILE_LIMIT}
        if memory_limit and isolation["data_limit"]:
            limits["RLIMIT_DATA"] = memory_limit
        spec = {"limits": limits, "uid": self.uid, "namespace": isolation["mode"] in ("namespace", "userns"),
                "network": isolation["network"]}
        if isolation["mode"] == "userns":  # no uid of its own: the code it trusts is mounted read-only
            spec.update(userns=True, readonly=[os.path.realpath(self.trusted)])
        if self.uid is not None:
            limits["RLIMIT_NPROC"] = NPROC_LIMIT
        if spec["namespace"]:  # the runner's root: system folders, Python, its scratch folder
            hide = [str(PROJECT_ROOT), str(self.submission.root)]
            hide += [p for p in os.environ.get("GRADER_HIDE", "").split(os.pathsep) if p]
            binds = confinement.root_binds(hide)
            spec.update(binds=binds, scratch=os.path.realpath(self.path),
                        covered=confinement.grader_package_folders(binds))
        return spec

    def runner_env(self, isolation: dict, overrides: dict) -> dict:
        """The runner's environment: what ENV_KEEP names, its own folders, then `overrides`."""
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_KEEP)}  # no tokens, no paths
        env.update({"PYTHONPATH": os.pathsep.join([str(self.trusted)] + user_site_paths()), "PYTHONUNBUFFERED": "1",
                    "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(self.home), "TMPDIR": str(self.home / "tmp"),
                    "USER": "grader", "LOGNAME": "grader", "XDG_CACHE_HOME": str(self.home / ".cache"),
                    "TRITON_CACHE_DIR": str(self.triton_cache), "GRADER_RUNNER": "1",
                    # in the scratch folder, which the runner can reach: not a folder of the grader's
                    # that a kept TORCHINDUCTOR_CACHE_DIR would name (fresh_caches in bench/grade_speed.py)
                    "TORCHINDUCTOR_CACHE_DIR": str(self.inductor_cache),
                    # Triton's home (its dump and override folders) is the runner's, not whatever
                    # HOME a process that imported Triton first had (a fork server's, forked.py)
                    "TRITON_HOME": str(self.home)})
        if self.kept_kernels is not None:  # autotuning results go into the kept cache too
            env["TRITON_CACHE_AUTOTUNING"] = "1"
        if isolation["network"]:
            env["GLOO_SOCKET_IFNAME"] = "lo"
        # torch.compile's default is a pool of one compile process per core in every runner: with a
        # runner per core that is cores^2 processes, and the pool's memory counts against the
        # runner's limit, which it pushed runners over (notes/corpus-class.md, "The compile fixes").
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        env.update(overrides)
        return env

    def share_kernels(self) -> None:
        """Between two calls: the kernels this runner compiled go where the submission's kernels are
        kept, and those its other runners kept meanwhile come in. A submission's runners run side by
        side, and some compile the same kernel (a Triton track's hygiene check calls the float32 twin
        of its case, whose kernels the float32 track compiles; a shared track's parts compile what
        the other parts do); what comes in only when a runner starts was compiled again by each of
        them. The grader copies between the folders, so no runner reads another's, and a kernel's
        index comes after its files, so one that is being kept comes whole or is compiled here."""
        if self.kept_kernels is None:
            return
        here = kernel_cache.kernel_folders(self.triton_cache)
        for key in sorted(here - self.shared):
            size = kernel_cache.folder_bytes(self.triton_cache / key)
            if self.shared_bytes + size > kernel_cache.MAX_TOTAL:
                continue  # untrusted files: a runner fills the kept folder no more between calls than at its end
            self.shared_bytes += size
            kernel_cache.take_back(self.triton_cache / key, self.kept_compiled / key,
                                   lambda relative: not kernel_cache.is_autotuning(relative))
        arrived = kernel_cache.kernel_folders(self.kept_compiled) - here
        for key in sorted(arrived):
            if kernel_cache.bring_in(self.kept_compiled / key, self.triton_cache / key, self.uid):
                self.kernels_from_others += 1
        self.shared = here | arrived

    def autotuned(self) -> bool:
        """Whether the submission's Triton kernels autotuned in this runner, or in an earlier runner of
        its track whose choices it brought in: on a GPU only, where autotuning results are kept."""
        return self.kept_kernels is not None and kernel_cache.holds_autotuning(self.triton_cache)

    def remove(self) -> None:
        if self.kept_kernels is not None:
            kernel_cache.take_back(self.triton_cache, self.kept_compiled,
                                   lambda relative: not kernel_cache.is_autotuning(relative))
            kernel_cache.take_back(self.triton_cache, self.kept_kernels, kernel_cache.is_autotuning)
            kernel_cache.take_back(self.inductor_cache, self.kept_inductor, kernel_cache.is_inductor_entry)
        shutil.rmtree(self.path, ignore_errors=True)
