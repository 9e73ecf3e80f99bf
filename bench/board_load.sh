#!/usr/bin/env bash
# The job board's load model, on both backends: what a job of N ranks costs the board while nothing
# is wrong, how soon a stall reaches every rank, and what analysing the job takes.
#
#   bench/board_load.sh <build directory> [--ranks "1024 16384 131072"] [--seconds N] [--smoke]
#
# 1. The cost of one rank, measured: a healthy four-rank train_loop under ncclguard for N seconds
#    (default 30) with the job directory, then with a redis-server on loopback
#    (bench/job_dir_load.sh): file-system metadata operations and Redis commands per rank and second
#    at the defaults.
# 2. For each job size: the status interval the job runs with on each board (stretched so that the
#    whole job writes at most 1,000 statuses a second on a file system, 10,000 on Redis), the load
#    the whole job sends the board (the measured cost of a rank at a 2 s interval, scaled to that
#    interval), and the time for a dump request to reach every rank (one interval: each rank
#    looks once per interval).
# 3. For each job size and board: `analyze_bench` writes a synthetic job with one late rank (the
#    statuses on the board, the dumps in the job directory) and times the reading and the verdict,
#    with the process's peak memory. Writing 131,072 ranks takes minutes.
# --smoke: 10 s jobs and 64 ranks: checks that every figure is printed (ctest bench.board_load_smoke).
set -euo pipefail

usage() {
  echo "usage: $0 <build directory> [--ranks \"N ...\"] [--seconds N] [--smoke]" >&2
  exit 2
}
[[ $# -ge 1 && -d $1 ]] || usage
build=$(cd "$1" && pwd)
shift
here=$(cd "$(dirname "$0")" && pwd)
sizes="1024 16384 131072"
seconds=30
while [[ $# -gt 0 ]]; do
  case $1 in
    --ranks) [[ -n ${2:-} ]] || usage; sizes=$2; shift 2 ;;
    --seconds) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; seconds=$2; shift 2 ;;
    --smoke) sizes=64; seconds=10; shift ;;
    *) usage ;;
  esac
done
bench=$build/cli/analyze_bench
[[ -x $bench ]] || { echo "$0: $bench is missing: build the target analyze_bench" >&2; exit 2; }
command -v redis-server >/dev/null || { echo "$0: redis-server is missing (scripts/install-deps.sh)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/ncclguard-board-load.XXXXXX")
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  --logfile "$work/redis.log" --daemonize no &
redis_pid=$!
trap 'kill "$redis_pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done

echo "== the cost of one rank (a four-rank job, ${seconds} s, the defaults)"
# Exit status 77 (ctest: skipped) where strace cannot trace, as job_dir_load.sh.
status=0
directory_lines=$("$here/job_dir_load.sh" "$build" --seconds "$seconds") || status=$?
((status == 0)) || { echo "$directory_lines"; exit "$status"; }
directory_line=$(grep '^job_dir_metadata_ops_per_s' <<<"$directory_lines")
redis_lines=$("$here/job_dir_load.sh" "$build" --seconds "$seconds" --redis)
echo "directory board: $directory_line"
echo "redis board:     $(grep '^job_dir_metadata_ops_per_s' <<<"$redis_lines")"
echo "redis board:     $(grep '^redis_commands_per_s' <<<"$redis_lines")"
per_rank_fs=$(sed -n 's/^job_dir_metadata_ops_per_s per rank \([0-9.]*\).*/\1/p' <<<"$directory_line")
per_rank_redis=$(grep '^redis_commands_per_s' <<<"$redis_lines" | sed -n 's/.*per rank \([0-9.]*\).*/\1/p')

echo
echo "== the whole job, quiet (from the cost of one rank at a 2 s interval)"
printf '%-8s | %-10s | %-22s | %-16s | %-10s | %-18s | %-16s\n' ranks "dir interval" "fs metadata ops/s" \
  "request reaches all" "redis interval" "redis commands/s" "request reaches all"
for n in $sizes; do
  awk -v n="$n" -v fs="$per_rank_fs" -v rd="$per_rank_redis" 'BEGIN {
    di = n / 1000; if (di < 2) di = 2
    ri = n / 10000; if (ri < 2) ri = 2
    printf "%-8d | %-10s | %-22.0f | %-16s | %-10s | %-18.0f | %-16s\n", n, sprintf("%.1f s", di),
      fs * n * 2 / di, sprintf("<= %.1f s", di), sprintf("%.1f s", ri), rd * n * 2 / ri, sprintf("<= %.1f s", ri)
  }'
done

echo
echo "== analysing a job with one late rank (analyze_bench)"
for n in $sizes; do
  for store in "" "redis://127.0.0.1:$port/0"; do
    label=${store:+redis}
    status=0
    out=$("$bench" --ranks "$n" ${store:+--store "$store"} 2>&1) || status=$?
    printf '%-8d %-9s %s\n' "$n" "${label:-directory}" "$(grep -E '^(generate_seconds|analyze_seconds|read_seconds|analyze_peak_rss_mb|processes_read|verdict):' <<<"$out" | tr '\n' ' ')"
    # analyze_bench fails when the verdict is not the late rank alone.
    ((status == 0)) || { echo "$out" | tail -n 5; exit 1; }
  done
done
