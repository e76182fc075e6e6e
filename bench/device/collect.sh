# usage: bash bench/device/collect.sh NAME WAIT: wait up to WAIT s for the run, report progress, tar it if done;
# if not, tar what it has written so far (its reports and timeline.json, no speed.json) as NAME-partial.tgz, so
# that a last call cut short by the session's device time still brings back the verdicts recorded
set -u
name=$1; wait=$2; t0=$(date +%s)
while [ ! -e /tmp/$name.done ] && [ $(( $(date +%s) - t0 )) -lt $wait ]; do
  sleep 20
  n=$(find /tmp/$name/reports -name '*.json' 2>/dev/null | wc -l)
  # a grader error says the run is not worth its next call (every timing check's, once: notes/grading-speed.md)
  e=$(grep -rl '"outcome": "grader_error"' --include='*.json' /tmp/$name/reports 2>/dev/null | grep -c /checks/)
  echo "$(date +%T) $name: $n check files, $e grader errors, load $(cut -d' ' -f1 /proc/loadavg)"
done
if [ -e /tmp/$name.done ]; then
  cp /tmp/$name.out /tmp/$name/run.out
  find /tmp/$name -type f | sed "s|/tmp/||" > /tmp/$name/kept-files.txt
  tar -C /tmp --exclude='*.html' --exclude='*cache*' --exclude='*.png' -czf $OUT/$name.tgz $name
  ls -la $OUT; tail -60 /tmp/$name.out
else
  echo "$name still running"; tail -5 /tmp/$name.out
  tar -C /tmp --exclude='*.html' --exclude='*cache*' --exclude='*.png' -czf $OUT/$name-partial.tgz $name $name.out
  ls -la $OUT
fi
