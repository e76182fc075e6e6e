"""`fa2-grade slurm` on a real Slurm: a single-node cluster (Debian's slurmctld, slurmd and munge)
started on this machine with a configuration the test writes.

A small mixed class (correct, buggy, hostile) is graded as an array job, one task per
submission; one task is cancelled, so its submission must show "not graded (Slurm job J_T ended:
CANCELLED)"; the others must equal a local run of the same class, check by check; then the
cancelled task is regraded alone and its submission must equal the local run too.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grading.results.gradescope import status_of

ROOT = Path(__file__).resolve().parents[3]
CLASS = [ROOT / "submissions" / "reference", ROOT / "submissions" / "examples" / "no_softmax_scale",
         ROOT / "submissions" / "hostile" / "crash_sysexit_forward"]
SELECT = ["--seed", "20261123", "-k", "pytorch and (128x128 or hygiene)"]
DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "munge")


def clean_env(**extra) -> dict:
    """This test's environment without its own xdist worker's variables (a job inherits it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    return {**env, **extra}


def wait_for(what: str, ready, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := ready():
            return value
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def slurm_conf(folder: Path, host: str) -> str:
    return "\n".join([
        "ClusterName=fa2test", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        "SlurmctldPort=16817", "SlurmdPort=16818", "AuthType=auth/munge",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log", f"SlurmdLogFile={folder}/slurmd.log",
        # no cgroups, no accounting: what a container allows; ended jobs stay in scontrol for 10 min
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "MinJobAge=600", "MpiDefault=none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "MessageTimeout=60",  # not 10 s: on CI's 2 cores, busy with the other tests, a regrade's sbatch once failed
        f"NodeName={host} CPUs=4 State=UNKNOWN",  # more than the machine's 2: every task of the class runs at once
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""])


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """SLURM_CONF of a running single-node cluster; skipped, with the reason, where none can start."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}): apt-get install slurmctld slurmd "
                    "slurm-client munge")
    if os.geteuid() != 0:
        pytest.skip("starting slurmd needs root on this machine")
    folder = tmp_path_factory.mktemp("slurm")
    (folder / "state").mkdir()
    (folder / "spool").mkdir()
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, socket.gethostname()))
    env = clean_env(SLURM_CONF=str(conf))
    started = []
    if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:  # no munged running yet
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
        started.append("munged")
    daemons = [subprocess.Popen([f"/usr/sbin/{d}", "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT) for d in ("slurmctld", "slurmd")]
    try:
        wait_for("the node idle in sinfo", lambda: "idle" in subprocess.run(
            ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout, 60)
    except AssertionError:
        for d in daemons:
            d.kill()
        log = (folder / "slurmctld.log").read_text()[-1500:] if (folder / "slurmctld.log").exists() else ""
        pytest.skip(f"a single-node Slurm could not start here: {log}")
    yield env
    for d in daemons:
        d.terminate()
        d.wait(timeout=30)
    if started:
        subprocess.run(["pkill", "-x", "munged"])


def job_state(env, job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job, "--oneliner"], env=env, capture_output=True, text=True).stdout
    return m.group(1) if (m := re.search(r"JobState=(\S+)", out)) else ""


def checks(reports: Path, name: str) -> dict:
    results = json.loads((reports / name / "results.json").read_text())
    return {t["name"]: (status_of(t), t["score"], t["max_score"]) for t in results["tests"]}


@pytest.mark.slow
def test_a_class_on_slurm_equals_a_local_run(slurm, tmp_path):
    reports, local = tmp_path / "slurm-reports", tmp_path / "local-reports"
    grade = [sys.executable, "-m", "grading.slurm", "slurm", f"--reports={reports}", "--cpus-per-task=1",
             "--workers=0", "--time=00:10:00", *[f"--impl={s}" for s in CLASS], "--", *SELECT]
    started = time.monotonic()
    submitted = subprocess.run(grade, cwd=ROOT, env=slurm, capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = json.loads((reports / ".slurm" / "job.json").read_text())
    # a task that dies while it grades (cancelled while pending, a task would leave no record without accounting)
    wait_for("task 2 running", lambda: job_state(slurm, f"{job['array']}_2") == "RUNNING", 120)
    subprocess.run(["scancel", f"{job['array']}_2"], env=slurm, check=True)
    wait_for("the finishing job", lambda: job_state(slurm, job["finish"]) == "COMPLETED", 400)
    tasks = [job_state(slurm, f"{job['array']}_{t}") for t in range(3)]
    print(f"\narray job {job['array']}, finishing job {job['finish']}: {time.monotonic() - started:.0f} s; "
          f"tasks {tasks}")
    assert tasks == ["COMPLETED", "COMPLETED", "CANCELLED"]

    names = [s.name for s in CLASS]
    local_run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--reports={local}",
                                *[f"--impl={s}" for s in CLASS], *SELECT], cwd=ROOT, env=clean_env(),
                               capture_output=True, text=True, timeout=600)
    assert local_run.returncode in (0, 1), local_run.stdout[-3000:]
    for name in names[:2]:
        assert checks(reports, name) == checks(local, name), name
    dead = json.loads((reports / names[2] / "results.json").read_text())
    expected = f"not graded (Slurm job {job['array']}_2 ended: CANCELLED)"
    assert dead["extra_data"]["interrupted"] == expected and dead["output"].startswith(expected)
    assert expected in (reports / "index.html").read_text()

    regrade = subprocess.run([sys.executable, "-m", "grading.slurm", "slurm", "--regrade", "2",
                              f"--reports={reports}"], cwd=ROOT, env=slurm, capture_output=True, text=True)
    assert regrade.returncode == 0, regrade.stdout + regrade.stderr
    again = json.loads((reports / ".slurm" / "job.json").read_text())["regrades"][-1]
    wait_for("the regrade's finishing job", lambda: job_state(slurm, again["finish"]) == "COMPLETED", 300)
    print(f"regrade: array job {again['job']}, finishing job {again['finish']}: {time.monotonic() - started:.0f} s")
    for name in names:  # nothing else lost, and the regraded one now as graded locally
        assert checks(reports, name) == checks(local, name), name
    assert "interrupted" not in json.loads((reports / names[2] / "info.json").read_text())
    assert expected not in (reports / "index.html").read_text()


def test_dry_run_prints_the_scripts_and_submits_nothing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "grading.slurm", "slurm", f"--reports={tmp_path}",
                          "--partition=gpu", "--gpus-per-task=1", "--tasks=2", "--dry-run",
                          *[f"--impl={s}" for s in CLASS], "--", "-k", "course"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "#SBATCH --array=0-1" in text and "#SBATCH --gpus-per-task=1" in text and "#SBATCH --partition=gpu" in text
    assert "-k course" in text and "--dependency=afterany:ARRAY" in text
    assert "# share-0.txt" in text and "# share-1.txt" in text and not (tmp_path / ".slurm").exists()


def test_a_path_that_is_not_a_submission_submits_nothing_and_help_names_the_defaults(tmp_path, capsys, monkeypatch):
    from grading.slurm import main

    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps the help to the terminal: no line breaks in a default
    assert main(["slurm", f"--reports={tmp_path}", f"--impl={tmp_path / 'missing'}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fa2-grade slurm: --impl {tmp_path / 'missing'}: there is no such file or folder; expected")
    assert not (tmp_path / ".slurm").exists()
    with pytest.raises(SystemExit):
        main(["slurm", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 16)", "(default: 02:00:00)", "(default: one per submission)",
                    "(default: --cpus-per-task)", "(default: fa2-grade)", "(default: none asked for)"):
        assert default in shown, default


def fake_sbatch(folder: Path, replies: list) -> Path:
    """An `sbatch` on PATH that answers its n-th call with replies[n]: (exit status, what it prints;
    stdout on success, stderr otherwise), and logs its arguments to calls.txt."""
    script = folder / "sbatch"
    (folder / "replies.json").write_text(json.dumps(replies))
    script.write_text(f"""#!{sys.executable}
import json, sys
folder = {str(folder)!r}
with open(folder + "/calls.txt", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
calls = open(folder + "/calls.txt").read().count("\\n")
status, said = json.load(open(folder + "/replies.json"))[calls - 1]
print(said, file=sys.stdout if status == 0 else sys.stderr)
sys.exit(status)
""")
    script.chmod(0o755)
    return folder


def submit_with(tmp_path, monkeypatch, replies):
    from grading import slurm

    (tmp_path / "bin").mkdir()
    bin_folder = fake_sbatch(tmp_path / "bin", replies)
    monkeypatch.setenv("PATH", f"{bin_folder}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "SUBMIT_WAIT_S", 0)
    reports = tmp_path / "reports"
    status = slurm.main(["slurm", f"--reports={reports}", *[f"--impl={s}" for s in CLASS]])
    calls = (bin_folder / "calls.txt").read_text().splitlines()
    return status, reports, calls


def test_a_busy_controller_is_asked_again_and_the_job_goes_in(tmp_path, capsys, monkeypatch):
    busy = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"
    status, reports, calls = submit_with(tmp_path, monkeypatch, [(1, busy), (1, busy), (0, "41"), (0, "42")])
    assert status == 0, capsys.readouterr().err
    assert len(calls) == 4 and calls[3].startswith("--parsable --dependency=afterany:41")
    job = json.loads((reports / ".slurm" / "job.json").read_text())
    assert (job["array"], job["finish"]) == ("41", "42")


def test_a_refused_job_is_named_in_sbatchs_words_not_a_traceback(tmp_path, capsys, monkeypatch):
    refused = "sbatch: error: Batch job submission failed: Invalid partition name specified"
    status, reports, calls = submit_with(tmp_path, monkeypatch, [(1, refused)])
    err = capsys.readouterr().err
    assert status == 1 and len(calls) == 1  # not asked again: the controller answered
    assert err.startswith("fa2-grade slurm: sbatch ") and refused in err and "Traceback" not in err
    assert not (reports / ".slurm" / "job.json").exists()


def test_an_array_without_its_finishing_job_says_how_to_undo_it(tmp_path, capsys, monkeypatch):
    busy = "sbatch: error: Slurm temporarily unable to accept job"
    status, reports, calls = submit_with(tmp_path, monkeypatch, [(0, "41"), (1, busy), (1, busy), (1, busy)])
    err = capsys.readouterr().err
    assert status == 1 and len(calls) == 4
    assert "(3 tries)" in err and "Array job 41 was submitted" in err and "scancel 41" in err
