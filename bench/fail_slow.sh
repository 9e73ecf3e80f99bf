#!/usr/bin/env bash
# Fail-slow on the emulator: how long ncclguard takes to name a slow link and a slow rank while
# the job runs, whether a long healthy job gets any fail-slow line, and what judging the pace costs.
#
#   bench/fail_slow.sh <build directory> [--minutes M] [--smoke]
#
# Every job is train_loop, 8 ranks over the NET transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1,
# the only one whose proxy steps time each link), with links of 1 Gb/s (NCCLEMU_LINKS) and
# AllReduces of 262,144 floats: about 30 ms a step. Each output line is stamped when it is read.
# - slow_link: the link from rank 3 to rank 4 turns 3x slower from operation #201 (step 200) on
#   (NCCLEMU_FAULTS slow_link ...,from=201); the delay runs from rank 0's line of step 200 to the
#   judge's `slow_link:` line, at the default NCCLGUARD_SLOW_INTERVAL (15 s) and at 5 s.
# - slow_rank: rank 5 computes 150 ms longer in steps 100 to 250 (--slow 5:150:100-250); the
#   delay runs from rank 5's line of step 100 to the judge's `slow_rank:` line, at both intervals.
# - healthy: about M minutes (default 10) of a job with 20 % jitter on every link and a 5 s
#   checkpoint save by rank 2 halfway, judged every 5 s: the count of fail-slow lines (expected: 0).
# - the judge's cost: the wall time of 60,000 steps of 1,024 floats without link time (about 11 s,
#   collectives as short as the emulator makes them) with NCCLGUARD_SLOW_INTERVAL=0 (never
#   judged within the run) and =2 (judged as often as allowed), three runs each, the median. This
#   is what the judging process (rank 0's) adds to a job, reading every status every interval; the
#   pace summary itself is counted on each collective's own thread by bench/call_cost.sh.
# --smoke runs each part briefly and only checks that every figure is printed.
set -euo pipefail

usage() {
  echo "usage: $0 <build directory> [--minutes M] [--smoke]" >&2
  exit 2
}
[[ $# -ge 1 && -d $1 ]] || usage
build=$(cd "$1" && pwd)
shift
minutes=10
smoke=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --minutes) [[ $# -ge 2 ]] || usage; minutes=$2; shift 2 ;;
    --smoke) smoke=1; minutes=0.3; shift ;;
    *) usage ;;
  esac
done
program=$build/examples/train_loop
preload=$build/lib/libncclguard.so
emulator=$build/emulator/lib
for needed in "$program" "$preload" "$emulator/libnccl.so.2" "$emulator/libcuda.so.1"; do
  [[ -e $needed ]] || { echo "$0: $needed is missing: build train_loop and ncclguard" >&2; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/ncclguard-fail-slow.XXXXXX")
trap '[[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"' EXIT

# <name> [VAR=value...] -- <train_loop arguments>: runs the job under ncclguard; its stdout and
# stderr together, each line stamped with the seconds since the launch, in $work/<name>.log.
job() {
  local name=$1
  shift
  local settings=()
  while [[ $1 != -- ]]; do settings+=("$1"); shift; done
  shift
  mkdir -p "$work/$name"
  env HOME="$work/$name" LD_LIBRARY_PATH="$emulator" LD_PRELOAD="$preload" NCCLGUARD_DUMP_DIR="$work/$name" \
    NCCLGUARD_JOB_ID=job NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "${settings[@]}" \
    "$program" --ranks 8 "$@" 2>&1 |
    python3 -u -c '
import sys, time
start = time.monotonic()
for line in sys.stdin:
    sys.stdout.write("%.2f %s" % (time.monotonic() - start, line))' >"$work/$name.log" ||
    { tail -20 "$work/$name.log" >&2; echo "$0: job $name failed" >&2; exit 1; }
}

# <name> <start pattern> <line pattern>: seconds from the first line matching the first pattern
# to the first matching the second, or "not seen".
delay() {
  awk -v start="$2" -v seen="$3" '
    !s && index($0, start) { s = $1 }
    s && index($0, seen) { printf "%.1f s\n", $1 - s; found = 1; exit }
    END { if (!found) print "not seen" }' "$work/$1.log"
}

links=gbps=1,jitter=0.1
count=262144
steps=1000
slow_last=250
[[ $smoke == 1 ]] && steps=300 slow_last=200
for interval in 15 5; do
  [[ $smoke == 1 && $interval == 15 ]] && continue
  job "link$interval" NCCLGUARD_SLOW_INTERVAL=$interval NCCLEMU_LINKS=$links \
    NCCLEMU_FAULTS=slow_link:rank=3,peer=4,factor=3,from=201 -- --steps $steps --count $count --verbose
  echo "slow_link 3x, NCCLGUARD_SLOW_INTERVAL=$interval: named $(delay "link$interval" "rank 0: step 200:" \
    "WARN slow_link: the link from rank 3") after it began"
  job "rank$interval" NCCLGUARD_SLOW_INTERVAL=$interval NCCLEMU_LINKS=$links -- \
    --steps $steps --count $count --slow 5:150:100-$slow_last --verbose
  echo "slow_rank 150 ms a step, NCCLGUARD_SLOW_INTERVAL=$interval: named $(delay "rank$interval" \
    "rank 5: step 100: 150 ms longer" "WARN slow_rank: rank 5") after it began"
done

# Steps of 524,288 floats, about 50 ms each on the 2-core VM: a status's 8 blocks of 8 operations
# then span about 5 s, more than the 2 s by which the ranks' statuses can differ, so that the judge
# finds the blocks every rank completed (with shorter steps it may find too few to judge at all).
# The healthy job's steps for M minutes, its checkpoint halfway.
healthy_steps=$(python3 -c "print(max(100, int($minutes * 60 / 0.05)))")
job healthy NCCLGUARD_SLOW_INTERVAL=5 NCCLEMU_LINKS=gbps=1,jitter=0.2,seed=11 -- \
  --steps "$healthy_steps" --count 524288 --sleep "2:$((healthy_steps / 2)):5"
elapsed=$(tail -1 "$work/healthy.log" | cut -d' ' -f1)
echo "healthy, 20 % jitter and a 5 s checkpoint, $healthy_steps steps in ${elapsed} s:" \
  "$(grep -c -e 'slow_link' -e 'slow_rank' "$work/healthy.log" || true) fail-slow lines"

# <interval>: the median wall time of three runs of the short collectives, in seconds.
judged_run() {
  local times=()
  for run in 1 2 3; do
    local begin end
    begin=$(date +%s.%N)
    job "cost$1-$run" NCCLGUARD_SLOW_INTERVAL="$1" -- --steps "$cost_steps" --count 1024
    end=$(date +%s.%N)
    times+=("$(python3 -c "print($end - $begin)")")
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n 2p
}
cost_steps=60000
[[ $smoke == 1 ]] && cost_steps=200
off=$(judged_run 0)  # never judged
on=$(judged_run 2)
python3 -c "
off, on, steps = $off, $on, $cost_steps
print('judging the pace every 2 s: %d steps in %.2f s, against %.2f s never judged: %+.1f us a step (%+.1f %%)'
      % (steps, on, off, (on - off) / steps * 1e6, (on - off) / off * 100))"
