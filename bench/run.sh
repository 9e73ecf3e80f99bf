#!/usr/bin/env bash
# Runs the watchdog benchmark on the emulator and prints its figures.
#
#   bench/run.sh <build directory> [--smoke] [Google Benchmark flags...]
#
# Two runs of watchdog_bench under LD_PRELOAD=libncclguard.so:
#   1. overhead: direct and intercepted ncclAllReduce in the same process. The watchdog polls every
#      10 ms here so that the pauses between timed batches, in which it catches up, stay short.
#   2. cpu and memory, with ncclguard's default settings.
# --smoke runs everything very briefly and only checks that every figure is printed.
set -euo pipefail

if [[ $# -lt 1 || ! -d $1 ]]; then
  echo "usage: $0 <build directory> [--smoke] [benchmark flags...]" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
shift
smoke=0
if [[ ${1:-} == --smoke ]]; then
  smoke=1
  shift
fi

bench=$build/bench/watchdog_bench
preload=$build/lib/libncclguard.so
emulator=$build/emulator/lib
for needed in "$bench" "$preload" "$emulator/libnccl.so.2" "$emulator/libcuda.so.1"; do
  if [[ ! -e $needed ]]; then
    echo "$0: $needed is missing: build the watchdog_bench target first" >&2
    exit 2
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ncclguard-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

if ((smoke)); then
  overhead_flags=(--benchmark_min_time=0.002 --benchmark_repetitions=1 "$@")
  load_flags=(--cpu_seconds=0.3 --communicators=1)
else
  overhead_flags=("$@")
  load_flags=(--cpu_seconds=5 --communicators=8)
fi

# Each run ends with a dump, which tells how many operations ncclguard left unrecorded (ring full).
run() {
  env LD_LIBRARY_PATH="$emulator${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LD_PRELOAD="$preload" \
    NCCLGUARD_DUMP_DIR="$work/dumps" NCCLGUARD_JOB_ID=bench "$@" --dump_at_end=1
}

echo "== overhead (NCCLGUARD_POLL_INTERVAL=0.01)"
NCCLGUARD_POLL_INTERVAL=0.01 run "$bench" --phases=overhead "${overhead_flags[@]}" | tee "$work/overhead.txt"
echo "== memory and watchdog CPU (default settings)"
run "$bench" --phases=memory,cpu "${load_flags[@]}" | tee "$work/load.txt"

if command -v python3 >/dev/null; then
  echo "== operations not recorded because the ring was full, per communicator"
  python3 - "$work/dumps" <<'PYTHON'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "dump-*.json"))):
    dump = json.load(open(path))
    progress = {p["comm_id"]: p["last_enqueued"] for p in dump["watchdog"]["progress"]}
    counts = ", ".join(f'{c["id"]}: {c["dropped"]} of {progress.get(c["id"], 0)}'
                       for c in dump["communicators"])
    print(f'pid {dump["pid"]}: {counts}')
PYTHON
fi

figure() {
  local line
  line=$(grep -h "^$1: " "$work/overhead.txt" "$work/load.txt" | tail -n 1)
  if [[ -z $line ]]; then
    echo "$0: watchdog_bench printed no $1" >&2
    exit 1
  fi
  echo "$line"
}
echo "== figures"
figure watchdog_cpu_percent
figure memory_per_communicator_bytes
"$build/bench/bookkeeping_bench" --benchmark_min_time=$([[ $smoke == 1 ]] && echo 0.01 || echo 0.2) \
  >"$work/bookkeeping.txt" 2>&1
grep -h "^bookkeeping_ns_per_collective: " "$work/bookkeeping.txt"
figure overhead_ns_per_collective
