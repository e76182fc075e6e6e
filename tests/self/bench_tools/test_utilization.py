"""bench/utilization.py: what grade_speed.py reports of how busy the CPUs and GPUs were."""
from bench.utilization import Utilization, cpu_times


def test_busy_shares_come_from_the_first_and_last_samples_and_gpus_are_integrated():
    use = Utilization()
    use.samples = [(0.0, (100, 1000), [(0.0, 500.0), (100.0, 1024.0)]),
                   (10.0, (400, 1500), [(100.0, 40960.0), (100.0, 1024.0)]),
                   (20.0, (850, 2000), [(100.0, 2048.0), (0.0, 3072.0)])]
    summary = use.summary()
    assert summary["cpu_busy"] == 0.75  # 750 busy jiffies of 1000
    assert summary["gpu_busy_s"] == [15.0, 15.0]  # trapezoids: 5 + 10 s, and 10 + 5 s
    assert summary["seconds"] == 20.0
    assert summary["gpu_memory_max_gib"] == [40.0, 3.0]  # the highest sample of each GPU, in GiB


def test_a_real_run_samples_at_its_start_and_end():
    with Utilization(period=60) as use:
        sum(range(100_000))
    assert len(use.samples) == 2
    summary = use.summary()
    if cpu_times() is not None:  # Linux
        assert summary["cpu_busy"] is None or 0.0 <= summary["cpu_busy"] <= 1.0


def test_stretches_with_idle_cpus_and_no_kernel_running_are_listed():
    use = Utilization(period=1.0)
    busy, idle = 900, 10  # jiffies of 1000 per second
    cpu = [busy, busy, idle, idle, idle, idle, busy, idle, busy]  # each second's busy jiffies
    gpu = [50, 0, 0, 0, 0, 0, 0, 0, 0]  # each second's utilization, in percent
    t, jiffies = 0, 0
    use.samples = [(0.0, (0, 0), [(0.0, 0.0)])]
    for c, g in zip(cpu, gpu):
        t, jiffies = t + 1, jiffies + c
        use.samples.append((float(t), (jiffies, t * 1000), [(float(g), 0.0)]))
    assert use.both_idle() == [[2.0, 4.0]]  # seconds 3 to 6; second 8 alone is under IDLE_GAP_S


def test_the_cpu_of_each_process_goes_to_its_role():
    """A busy child process named like a runner: its core-seconds land under the runner's role.
    Only a lower bound: the sampler reads every process of the machine, and under `-n 2` the other
    worker's tests start real runners (3.4 s of runners was read in a newcomer's run)."""
    import subprocess
    import sys
    import time

    from bench.utilization import Utilization
    # A second of its own CPU, however loaded the machine, then alive a while: the sampler counts a
    # process's time only while it sees it (an exit between two samples loses the last stretch).
    spin = "import time\nwhile time.process_time() < 1.0: pass\ntime.sleep(1.0)\n"
    with Utilization(period=0.25) as use:
        child = subprocess.Popen([sys.executable, "-c", spin, "fa2_sandbox.runner.serve"])
        child.wait()
        time.sleep(0.3)
    roles = use.summary()["cpu_by_role"]
    assert roles.get("runner (student code)", 0) >= 0.8, roles
