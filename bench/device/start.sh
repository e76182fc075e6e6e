# usage: bash bench/device/start.sh NAME GRADER_DIR LIMIT WAIT [SELECT]   (on the device, from the checkout's root)
# The corpus class (bench/grade_speed.py corpus, as notes/grading-speed.md's runs) on a lent GPU, in
# a run that may outlast one device call. Copies this checkout (the bench) and the corpus to
# /tmp/g_NAME and grades with the grader in GRADER_DIR: `.`, this checkout's, or an older one for a
# same-machine comparison (corpus/.old-grader, written by `bench/grade_corpus.py prepare
# --old-commit REV`, travels with the corpus); prints the machine's
# calibration (a Python loop's core-seconds: machines differ by 2x, so compare runs of one machine),
# starts the run in a session of its own, and waits up to WAIT s for it; a later call's
# `bash bench/device/collect.sh NAME WAIT` waits on and brings back the same run. The device call
# carries ["corpus", ".whl"]: the corpus built by bench/grade_corpus.py's
# notes, the wheels the device's image lacks (pydantic and its parts, einx). SELECT, pytest's -k, grades a
# part of the rubric ("pytorch or test_timing": the PyTorch tracks and the timing checks), for a call too
# short for the whole class.
set -u
name=$1; src=$2; limit=$3; wait=$4; select=${5:-}
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps .whl/*.whl 2>&1 | tail -2
g=/tmp/g_$name; rm -rf $g; mkdir -p $g
(tar --exclude=./corpus --exclude=./.speed --exclude=./.mirror --exclude=./.whl --exclude=./.venv --exclude=./reports --exclude=./.git -cf - .) | tar -C $g -xf -
cp -a corpus $g/corpus
grader=$g/${src#./}; grader=${grader%/.}  # the grader under test, inside the copy
python3 -m pip install -q --no-deps --no-build-isolation -e $grader 2>&1 | tail -2
python3 - <<'PY'
import time, subprocess
t = time.process_time(); s = 0
for i in range(30_000_000): s += i
print(f"calibration: python loop {time.process_time() - t:.2f} core-s")
t = time.time(); subprocess.run(["python3", "-c", "import torch, triton"]); print(f"calibration: import torch+triton {time.time() - t:.2f} s")
PY
nproc; nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader
cd $g
setsid nohup bash -c "python3 bench/grade_speed.py corpus --out /tmp/$name --limit $limit --workers 16 --seed 424242 --fresh-caches --also submissions/examples/triton_backward_python_loop --time-limit 300 --grader $grader --label $name ${select:+-k \"$select\"} > /tmp/$name.out 2>&1; echo done > /tmp/$name.done" < /dev/null > /dev/null 2>&1 &
cd - > /dev/null
echo "started $name at $(date +%T), setup $(( $(date +%s) - t0 )) s"
bash bench/device/collect.sh $name $(( wait - ($(date +%s) - t0) ))
