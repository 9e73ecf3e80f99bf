#!/usr/bin/env bash
# What a quiet job costs the file system that holds its job directory: metadata operations per
# second, per rank and per 1,000 ranks, at the defaults (NCCLGUARD_STATUS_INTERVAL 2 s).
#
#   bench/job_dir_load.sh <build directory> [--seconds N] [--preload LIBRARY] [--redis] [--smoke]
#
# Runs a healthy four-rank train_loop on the emulator for about N seconds (default 30) under
# strace and counts the system calls on the job directory that a shared file system's metadata
# server answers: opens, creations, renames, removals, links, stats by name, mode changes,
# truncations and listings (reads and writes of open files, and fstat() of an open file, are not
# counted). Only the steady state counts: from 5 s after the first call to 2 s before the last.
# --preload measures another build of libncclguard.so the same way. --redis: the job's board is a
# redis-server started on a free loopback port (NCCLGUARD_STORE): the file system's figure is then
# what is left on the job directory, and the commands Redis received in the same window
# (redis-cli MONITOR) are counted too. --smoke: ten seconds; fails only if the job fails or
# nothing could be counted, never on the figure.
set -euo pipefail

usage() {
  echo "usage: $0 <build directory> [--seconds N] [--preload LIBRARY] [--redis] [--smoke]" >&2
  exit 2
}
[[ $# -ge 1 && -d $1 ]] || usage
build=$(cd "$1" && pwd)
shift
seconds=30
preload=$build/lib/libncclguard.so
redis=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; seconds=$2; shift 2 ;;
    --preload) [[ -n ${2:-} ]] || usage; preload=$2; shift 2 ;;
    --redis) redis=1; shift ;;
    --smoke) seconds=10; shift ;;
    *) usage ;;
  esac
done
emulator=$build/emulator/lib
train_loop=$build/examples/train_loop
for needed in "$preload" "$emulator/libnccl.so.2" "$train_loop"; do
  [[ -e $needed ]] || { echo "$0: $needed is missing: build ncclguard with the emulator first" >&2; exit 2; }
done
# Exit status 77 (ctest: skipped) where nothing can be traced: no strace, or ptrace not allowed.
if ! command -v strace >/dev/null || ! strace -qq -o /dev/null true 2>/dev/null; then
  echo "skipped: strace cannot trace here"
  exit 77
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ncclguard-job-dir-load.XXXXXX")
trap 'rm -rf "$work"' EXIT
store=()
if ((redis)); then
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    { echo "$0: --redis needs redis-server and redis-cli (scripts/install-deps.sh)" >&2; exit 2; }
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    --logfile "$work/redis.log" --daemonize no &
  redis_pid=$!
  trap 'kill "$redis_pid" 2>/dev/null; kill "${monitor_pid:-}" 2>/dev/null; rm -rf "$work"' EXIT
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$port" monitor >"$work/monitor" &
  monitor_pid=$!
  store=(NCCLGUARD_STORE="redis://127.0.0.1:$port/0")
fi
ranks=4
step_ms=50
steps=$((seconds * 1000 / step_ms))
metadata=openat,open,creat,mkdir,mkdirat,rename,renameat,renameat2,unlink,unlinkat,rmdir,link,linkat,symlinkat
metadata+=,stat,lstat,newfstatat,statx,access,faccessat,faccessat2,chmod,fchmod,fchmodat,truncate,ftruncate
metadata+=,getdents64,utimensat
env -u NCCL_COMM_ID -u NCCLEMU_FAULTS LD_LIBRARY_PATH="$emulator" NCCLGUARD_DUMP_DIR="$work/dumps" \
  NCCLGUARD_JOB_ID=load "${store[@]}" strace -f -qq -ttt -y -e trace="$metadata" -o "$work/trace" \
  env LD_PRELOAD="$preload" "$train_loop" --ranks "$ranks" --steps "$steps" --slow 0:"$step_ms" \
  --timeout $((seconds * 3)) >"$work/job.log" 2>&1 || {
  echo "$0: the job failed" >&2
  tail -n 20 "$work/job.log" >&2
  exit 1
}
# Lines naming the job directory (strace -y prints the path behind every descriptor), less fstat()
# of an open file (glibc makes it newfstatat(fd, "", ..., AT_EMPTY_PATH)).
grep -F "$work/dumps" "$work/trace" | grep -v -e ' resumed>' -e AT_EMPTY_PATH >"$work/job-dir-calls" || true
# The job's first and last traced call bound the run.
first=$(head -n 1 "$work/trace" | awk '{ print $2 }')
last=$(tail -n 1 "$work/trace" | awk '{ print $2 }')
awk -v ranks="$ranks" -v first="$first" -v last="$last" -v redis="$redis" '
  { time[NR] = $2; name = $3; sub(/\(.*/, "", name); calls[NR] = name }
  END {
    # On a Redis board nothing but dumps need touch the job directory.
    if (NR == 0 && !redis) { print "no call on the job directory was seen" > "/dev/stderr"; exit 1 }
    from = first + 5; to = last - 2
    if (to <= from) { print "the job ran too short to have a steady state" > "/dev/stderr"; exit 1 }
    for (i = 1; i <= NR; i++) if (time[i] >= from && time[i] <= to) { counted++; by[calls[i]]++ }
    rate = counted / (to - from) / ranks
    detail = ""
    for (c in by) detail = detail sprintf(" %s %d", c, by[c])
    printf "job_dir_metadata_ops_per_s per rank %.3f, per 1000 ranks %.0f (%d calls in %.1f s, %d ranks;%s)\n",
      rate, rate * 1000, counted, to - from, ranks, detail
  }' "$work/job-dir-calls"
if ((redis)); then
  # MONITOR's lines: "<epoch seconds> [<db> <client>] "COMMAND" ...", the same clock as strace -ttt.
  awk -v ranks="$ranks" -v first="$first" -v last="$last" '
    $1 ~ /^[0-9]+\.[0-9]+$/ { from = first + 5; to = last - 2
      if ($1 >= from && $1 <= to) { name = $4; gsub(/"/, "", name); counted++; by[toupper(name)]++ } }
    END {
      from = first + 5; to = last - 2
      detail = ""
      for (c in by) detail = detail sprintf(" %s %d", c, by[c])
      rate = counted / (to - from) / ranks
      printf "redis_commands_per_s per rank %.3f, per 1000 ranks %.0f (%d commands in %.1f s, %d ranks;%s)\n",
        rate, rate * 1000, counted, to - from, ranks, detail
    }' "$work/monitor"
fi
