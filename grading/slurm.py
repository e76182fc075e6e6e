"""Grade a class on a Slurm cluster: `fa2-grade slurm --impl 'submissions/*' --reports DIR ...`.

    fa2-grade slurm --impl 'class/*' --reports /shared/grades [--partition gpu] [--gpus-per-task 1]
                    [--tasks 8] [--time 02:00:00] [--dry-run] [-- extra pytest options]
    fa2-grade slurm --regrade 3 --reports /shared/grades          # one array task again

Plain sbatch, no scheduler of our own: the class's submissions are split into the tasks of one
array job; each task runs the ordinary grader (`python -m pytest -n auto --impl ...`) on its
share, on a node of its own, writing into the shared reports folder (every file there is
per submission or written whole, and the seed is drawn once per folder: grading/results/store.py). A job
that depends on the whole array (afterany) then runs `fa2-grade slurm-finish`: it asks Slurm
how each task ended, marks every submission of a task that did not end normally as
"not graded (Slurm job J_T ended: TIMEOUT)" on its page and the class page, and builds the
class page and grades.csv once.

What it needs of the cluster: the reports folder and this checkout on a file system every node
sees, and the grader's Python (torch, triton, the course's packages) on the compute nodes.
The scripts and their logs go to DIR/.slurm/ (the sbatch scripts, each task's share of the
class, one log per task).
"""
import argparse
import json
import math
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from fa2_sandbox import PROJECT_ROOT
from fa2_sandbox.harness.discover import NotASubmission, find_submissions


def run_folder(reports: Path) -> Path:
    """Where a job's commands run: the grader's checkout, or, installed without one, the reports
    folder (the installed plugin collects its own checks from any folder)."""
    return PROJECT_ROOT if (PROJECT_ROOT / "pyproject.toml").is_file() else reports
PYTEST_STATUS_OK = (0, 1)  # 1: some checks failed, which is a grading result, not a failed task


def task_script(reports: Path, shares: int, args, extra: list) -> str:
    """The array job: task T grades the submissions listed in DIR/.slurm/share-T.txt."""
    slurm = reports / ".slurm"
    options = [f"--job-name={args.job_name}", f"--array=0-{shares - 1}", f"--output={slurm}/task-%A_%a.log",
               f"--time={args.time}", f"--cpus-per-task={args.cpus_per_task}"]
    options += [f"--partition={args.partition}"] if args.partition else []
    options += [f"--gpus-per-task={args.gpus_per_task}"] if args.gpus_per_task else []
    workers = args.workers or args.cpus_per_task  # the task's own cores, not the node's
    # --keep-others: a task's own page build lists what the other tasks graded too; the finishing
    # job then makes the class exactly the job's submissions.
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", workers,
              f"--reports={reports}", "--keep-others", *extra]
    return "\n".join(
        ["#!/bin/bash"] + [f"#SBATCH {o}" for o in options] + [
            "# One share of the class per array task; the ordinary grader on it.",
            f"cd {shlex.quote(str(run_folder(reports)))}",
            f'mapfile -t share < {shlex.quote(str(slurm))}/share-"$SLURM_ARRAY_TASK_ID".txt',
            'impls=(); for s in "${share[@]}"; do impls+=("--impl=$s"); done',
            f'{shlex.join(pytest)} "${{impls[@]}}"',
            "status=$?",
            "# pytest's 1 means some checks failed: a grading result. More is a broken run.",
            f"[ $status -le {max(PYTEST_STATUS_OK)} ] && exit 0 || exit $status", ""])


def finish_script(reports: Path, args) -> str:
    """The job that runs once every task has ended, however it ended (afterany)."""
    options = [f"--job-name={args.job_name}-finish", f"--output={reports}/.slurm/finish-%j.log",
               "--time=00:30:00", "--cpus-per-task=1"]
    options += [f"--partition={args.partition}"] if args.partition else []
    finish = [sys.executable, "-m", "grading.slurm", "slurm-finish", f"--reports={reports}",
              '--job="$1"'] + ([f"--rubric={args.rubric}"] if args.rubric else [])
    return "\n".join(["#!/bin/bash"] + [f"#SBATCH {o}" for o in options] + [
        f"cd {shlex.quote(str(run_folder(reports)))}", " ".join(finish), ""])


# What sbatch says when the controller was too busy to take the job, not when it refused it.
BUSY = ("timed out", "temporarily", "try again")
SUBMIT_TRIES, SUBMIT_WAIT_S = 3, 10


class SubmitFailed(Exception):
    """sbatch did not take a job; the message is a sentence for the person who submitted."""


def sbatch(*argv) -> str:
    """Submit; the job id sbatch gives back (--parsable: 'id' or 'id;cluster'). A controller too
    busy to answer (sbatch's message in BUSY) is asked again, SUBMIT_TRIES times in all; any other
    failure is reported in sbatch's own words."""
    for attempt in range(1, SUBMIT_TRIES + 1):
        done = subprocess.run(["sbatch", "--parsable", *argv], capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout.strip().split(";")[0]
        said = (done.stderr.strip() or done.stdout.strip() or f"no message, exit status {done.returncode}")
        if attempt == SUBMIT_TRIES or not any(word in said.lower() for word in BUSY):
            break
        time.sleep(SUBMIT_WAIT_S)
    tries = f" ({attempt} tries)" if attempt > 1 else ""
    raise SubmitFailed(f"sbatch {' '.join(argv)} failed{tries}: {said}")


def watched(array: str, finish_argv: list) -> str:
    """Submit the finishing job of `array`; if Slurm does not take it, say how to undo the array."""
    try:
        return sbatch(*finish_argv)
    except SubmitFailed as exc:
        raise SubmitFailed(f"{exc}. Array job {array} was submitted, but no job will build the class page when "
                           f"it ends: cancel it (scancel {array}) and submit again.") from exc


def submit(args, extra: list) -> int:
    reports = Path(args.reports).resolve()
    slurm = reports / ".slurm"
    if args.regrade is not None:
        state = json.loads((slurm / "job.json").read_text())
        script = slurm / "grade.sbatch"
        array = sbatch(f"--array={args.regrade}", str(script))
        finish = watched(array, [f"--dependency=afterany:{array}", str(slurm / "finish.sbatch"), array])
        state.setdefault("regrades", []).append({"task": args.regrade, "job": array, "finish": finish})
        (slurm / "job.json").write_text(json.dumps(state, indent=1))
        print(f"regrading task {args.regrade} ({', '.join(state['shares'][args.regrade])}): "
              f"array job {array}, then {finish} rebuilds the class page")
        return 0
    skipped = []
    try:
        subs = find_submissions(args.impl, skipped)
    except NotASubmission as exc:
        print("\n".join(f"fa2-grade slurm: {line}" for line in str(exc).splitlines()), file=sys.stderr)
        return 2
    if skipped:
        print(f"skipped {len(skipped)} folder{'s' * (len(skipped) != 1)} that --impl matched and that hold no "
              f"tests/adapters.py or adapters.py: {', '.join(map(str, skipped))}")
    per_task = math.ceil(len(subs) / min(args.tasks or len(subs), len(subs)))
    shares = [[str(s.root) for s in subs[i:i + per_task]] for i in range(0, len(subs), per_task)]
    grade, finish = task_script(reports, len(shares), args, extra), finish_script(reports, args)
    if args.dry_run:
        for i, share in enumerate(shares):
            print(f"# share-{i}.txt\n" + "\n".join(share))
        print(f"# grade.sbatch (sbatch {slurm}/grade.sbatch)\n{grade}")
        print(f"# finish.sbatch (sbatch --dependency=afterany:ARRAY {slurm}/finish.sbatch ARRAY)\n{finish}")
        return 0
    slurm.mkdir(parents=True, exist_ok=True)
    for i, share in enumerate(shares):
        (slurm / f"share-{i}.txt").write_text("\n".join(share) + "\n")
    (slurm / "grade.sbatch").write_text(grade)
    (slurm / "finish.sbatch").write_text(finish)
    array = sbatch(str(slurm / "grade.sbatch"))
    done = watched(array, [f"--dependency=afterany:{array}", str(slurm / "finish.sbatch"), array])
    names = [[Path(p).name for p in share] for share in shares]
    (slurm / "job.json").write_text(json.dumps({"array": array, "finish": done, "shares": names,
                                               "skipped": [str(p) for p in skipped]}, indent=1))
    print(f"{len(subs)} submissions in {len(shares)} array tasks: job {array} (logs: {slurm}/task-{array}_T.log); "
          f"job {done} builds {reports}/index.html and grades.csv when they have all ended.")
    return 0


def task_states(job: str) -> dict:
    """{array task index: Slurm state} from sacct (clusters keep accounting), or from scontrol
    (the controller remembers ended jobs for a few minutes) where accounting is off."""
    sacct = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "--format=JobID,State"],
                           capture_output=True, text=True)
    states = {}
    for line in sacct.stdout.splitlines() if sacct.returncode == 0 else []:
        job_id, _, state = line.partition("|")
        if m := re.fullmatch(rf"{job}_(\d+)", job_id.strip()):
            states[int(m.group(1))] = state.split()[0]  # "CANCELLED by 0" -> CANCELLED
    if states:
        return states
    shown = subprocess.run(["scontrol", "show", "job", job, "--oneliner"], capture_output=True, text=True)
    for line in shown.stdout.splitlines():
        task, state = re.search(r"ArrayTaskId=(\d+)", line), re.search(r"JobState=(\S+)", line)
        if task and state:
            states[int(task.group(1))] = state.group(1)
    return states


def finish(args) -> int:
    """Mark the submissions of every task that did not complete, then build the pages once."""
    from grading.results import scoring, store
    from grading.results.record import write_class
    from grading.rubric import Rubric
    from reporting import build_reports

    reports = Path(args.reports).resolve()
    state = json.loads((reports / ".slurm" / "job.json").read_text())
    states = task_states(args.job)
    rubric = Rubric(args.rubric)
    tasks = range(len(state["shares"])) if args.job == state["array"] else [
        r["task"] for r in state.get("regrades", []) if r["job"] == args.job]
    for task in tasks:
        ended = states.get(task, "UNKNOWN, Slurm keeps no record of it: cancelled before it started, or ended "
                                 "long ago on a cluster without accounting")
        for name in state["shares"][task]:
            info = store.read_info(reports, name)
            if ended == "COMPLETED":
                info.pop("interrupted", None)
            else:
                info["interrupted"] = f"not graded (Slurm job {args.job}_{task} ended: {ended})"
            store.write_info(reports, name, info)
            scoring.assemble(reports, name, rubric)
        print(f"task {task}: {ended} ({len(state['shares'][task])} submissions)"
              + ("" if ended == "COMPLETED" else f"; regrade it alone: fa2-grade slurm --regrade {task} "
                                                 f"--reports {reports}"))
    # The class is the job's: every share, whatever else earlier runs left in the folder.
    write_class(reports, [name for share in state["shares"] for name in share], state.get("skipped", []))
    build_reports(reports, warn=True)
    print(f"class page: {reports}/index.html")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fa2-grade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    slurm = commands.add_parser("slurm", help="grade a class as a Slurm array job (options after -- go to pytest)",
                                description="Grade a class as a Slurm array job; options after -- go to pytest.")
    slurm.add_argument("--impl", action="append", default=[], metavar="PATH",
                       help="submission folder or glob, repeatable (required unless --regrade)")
    slurm.add_argument("--reports", required=True, metavar="DIR",
                       help="the class's reports folder, on a file system every node sees (required)")
    slurm.add_argument("--tasks", type=int, default=None, metavar="N",
                       help="array tasks (default: one per submission)")
    slurm.add_argument("--partition", default=None, help="Slurm partition (default: the cluster's default)")
    slurm.add_argument("--gpus-per-task", default=None, metavar="G",
                       help="GPUs per task, e.g. 1 (default: none asked for)")
    slurm.add_argument("--cpus-per-task", default="16", metavar="C", help="cores per task (default: 16)")
    slurm.add_argument("--time", default="02:00:00", help="each task's time limit (default: 02:00:00)")
    slurm.add_argument("--workers", default=None, metavar="W",
                       help="pytest-xdist's -n in each task (default: --cpus-per-task)")
    slurm.add_argument("--job-name", default="fa2-grade", help="the jobs' name (default: fa2-grade)")
    slurm.add_argument("--rubric", default=None, metavar="FILE",
                       help="also passed to the grader (default: the grader's grading/rubric.yaml)")
    slurm.add_argument("--regrade", type=int, default=None, metavar="T",
                       help="submit array task T of the job in DIR again, alone")
    slurm.add_argument("--dry-run", action="store_true", help="print the sbatch scripts; submit nothing")
    done = commands.add_parser("slurm-finish", help="(the finishing job) mark dead tasks, build the class page")
    done.add_argument("--reports", required=True)
    done.add_argument("--job", required=True)
    done.add_argument("--rubric", default=None)
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.command == "slurm-finish":
        return finish(args)
    if args.rubric:
        extra = [f"--rubric={args.rubric}", *extra]
    if args.regrade is None and not args.impl:
        parser.error("slurm needs --impl (or --regrade T)")
    try:
        return submit(args, extra)
    except SubmitFailed as exc:
        print(f"fa2-grade slurm: {exc}\nSee `sinfo` and the controller's log; nothing else was submitted.",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
