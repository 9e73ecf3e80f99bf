#!/usr/bin/env bash
# launch.sh N SECONDS PROGRAM [ARGS...]: starts N ranks of PROGRAM (RANK and WORLD_SIZE set), and
# after SECONDS kills every one still running with SIGKILL at once, as a scheduler ends a job at
# its time limit.
set -u
n=$1
seconds=$2
shift 2
pids=()
for ((rank = 0; rank < n; rank++)); do
  RANK=$rank WORLD_SIZE=$n "$@" &
  pids+=($!)
done
sleep "$seconds"
kill -KILL "${pids[@]}" 2>/dev/null
wait
echo "launch.sh: killed the job after $seconds s"
