"""What a runner's profile charges a thread's stack to (fa2_sandbox/runner/cpu_profile.py): the files
on the stack decide, innermost first, so an autotuner's compile is compiling and its timing of the
compiled configs is autotuning, not the student's calls."""
import sys

from fa2_sandbox.runner import cpu_profile

ROOT = "/submissions/alice"


def stack(*frames):
    """The innermost frame of nested calls, outermost first: (file, function) each."""
    namespace = {"sys": sys, "innermost": None}
    callee = frames[-1][1]
    source = f"def {callee}():\n    global innermost\n    innermost = sys._getframe()\n"
    exec(compile(source, frames[-1][0], "exec"), namespace)
    for path, name in reversed(frames[:-1]):
        exec(compile(f"def {name}():\n    {callee}()\n", path, "exec"), namespace)
        callee = name
    namespace[callee]()
    return namespace["innermost"]


def activity(*frames):
    return cpu_profile.Profile(ROOT)._of(stack(*frames))


def test_a_compile_inside_the_autotuner_is_compiling_and_its_timing_is_autotuning():
    student = (f"{ROOT}/cs336_systems/flash.py", "forward")
    autotuner = ("/site-packages/triton/runtime/autotuner.py", "_bench")
    do_bench = ("/site-packages/triton/testing.py", "do_bench")
    launch = ("/site-packages/triton/backends/nvidia/driver.py", "__call__")
    compile_ = ("/site-packages/triton/compiler/compiler.py", "compile")
    assert activity(student, autotuner, do_bench, ("/site-packages/triton/runtime/jit.py", "run"), compile_) \
        == cpu_profile.COMPILING
    assert activity(student, autotuner, do_bench, launch) == cpu_profile.AUTOTUNING


def test_a_launch_is_the_students_call_and_building_its_launcher_is_compiling():
    student = (f"{ROOT}/cs336_systems/flash.py", "forward")
    jit = ("/site-packages/triton/runtime/jit.py", "run")
    assert activity(student, jit, ("/site-packages/triton/backends/nvidia/driver.py", "__call__")) \
        == cpu_profile.STUDENT
    assert activity(student, jit, ("/site-packages/triton/backends/nvidia/driver.py", "__init__"),
                    ("/site-packages/triton/backends/nvidia/driver.py", "compile_module_from_src")) \
        == cpu_profile.COMPILING


def test_the_graders_own_timing_of_a_kernel_is_not_autotuning():
    """The runner's timing calls triton.testing.do_bench itself: the student's kernel, not an autotuner."""
    runner = ("/trusted/fa2_sandbox/runner/serve.py", "timing")
    do_bench = ("/site-packages/triton/testing.py", "do_bench")
    student = (f"{ROOT}/cs336_systems/flash.py", "forward")
    assert activity(runner, do_bench, student) == cpu_profile.STUDENT
    assert activity(runner, do_bench) == cpu_profile.OWN
