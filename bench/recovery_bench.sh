#!/usr/bin/env bash
# How long in-process recovery (NCCLGUARD_RECOVER=inprocess) takes, measured on the emulator.
#
#   bench/recovery_bench.sh <build directory> [--runs N | --smoke]
#
# Runs scenario S2 N times (default 5): a four-rank train_loop whose P2P transfers never complete
# (driver 545.23.08, injected), under LD_PRELOAD=libncclguard.so. Its first Broadcast stalls; every
# rank re-creates the communicator with P2P disabled on a private NCCL instance and replays it.
# Each rank logs "<N> ms after the stall was found" once the replay has completed; a run's figure
# is the largest over its ranks (the job goes on only when the last rank does). Prints the median
# and maximum over runs. Then what probation costs a healthy job's first collectives: ddp_habits'
# six Broadcasts, queued back to back as DDP queues them (the last five are held and issued by
# ncclguard) or each waited for, under NCCLGUARD_RECOVER=off and inprocess, N runs each (figure:
# the slowest rank's time, median and maximum over runs). Then S2 in one process driving four
# GPUs, the way NCCL's benchmarks run (if cudart_nccl_program is built). Last, handles_bench's
# translation cost if it is built.
# --smoke: one run, handles_bench very briefly. Fails if a job fails, a rank did not recover, or a
# figure is missing; never on timing.
set -euo pipefail

usage() {
  echo "usage: $0 <build directory> [--runs N | --smoke]" >&2
  exit 2
}
[[ $# -ge 1 && -d $1 ]] || usage
build=$(cd "$1" && pwd)
shift
runs=5
smoke=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --smoke) smoke=1; runs=1; shift ;;
    --runs) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || usage; runs=$2; shift 2 ;;
    *) usage ;;
  esac
done

preload=$build/lib/libncclguard.so
emulator=$build/emulator/lib
train_loop=$build/examples/train_loop
for needed in "$preload" "$emulator/libnccl.so.2" "$emulator/libcuda.so.1" "$train_loop"; do
  if [[ ! -e $needed ]]; then
    echo "$0: $needed is missing: build ncclguard with the emulator first" >&2
    exit 2
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ncclguard-recovery-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

# "median <m> max <x>" of the numbers on standard input, one a line, printed with `format`.
median_max() {
  sort -n | awk -v format="$1" '
    { value[NR] = $1 }
    END {
      median = NR % 2 ? value[(NR + 1) / 2] : (value[NR / 2] + value[NR / 2 + 1]) / 2
      printf "median " format " max " format, median, value[NR]
    }'
}

ranks=4
figures=()
for ((run = 1; run <= runs; run++)); do
  dumps=$(mktemp -d "$work/dumps.XXXXXX")
  log=$work/run-$run.log
  status=0
  env -u NCCL_COMM_ID LD_LIBRARY_PATH="$emulator" LD_PRELOAD="$preload" \
    NCCLGUARD_DUMP_DIR="$dumps" NCCLGUARD_JOB_ID=recovery-bench NCCLGUARD_RECOVER=inprocess \
    NCCLGUARD_TIMEOUT=1 NCCLGUARD_POLL_INTERVAL=0.05 NCCLGUARD_STATUS_INTERVAL=0.2 \
    NCCLEMU_FAULTS="p2p_stall:after=0" NCCLEMU_DRIVER_VERSION=545.23.08 \
    "$train_loop" --ranks "$ranks" --steps 5 --timeout 30 >"$log" 2>&1 || status=$?
  rm -rf "$dumps"
  # "<rank> <ms>" for each rank's line saying its replay completed.
  recovered=$(sed -nE 's/.*\[([0-9]+)\] ncclguard WARN comm [0-9a-f]+ #[0-9]+ [A-Za-z]+: re-created .* ([0-9]+) ms after the stall was found.*/\1 \2/p' "$log")
  recovered_ranks=$(cut -d' ' -f1 <<<"$recovered" | sort -nu | paste -sd' ')
  if ((status != 0)) || [[ $recovered_ranks != "$(seq -s ' ' 0 $((ranks - 1)))" ]]; then
    echo "$0: run $run: the job exited $status; ranks that recovered in-process: ${recovered_ranks:-none}" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  largest=$(cut -d' ' -f2 <<<"$recovered" | sort -n | tail -n 1)
  figures+=("$largest")
  per_rank=$(sort -n <<<"$recovered" | cut -d' ' -f2 | paste -sd, | sed 's/,/, /g')
  echo "run $run of $runs: detection_to_replay_ms $largest (ranks 0 to $((ranks - 1)): $per_rank)"
done

echo "detection_to_replay_ms $(printf '%s\n' "${figures[@]}" | median_max %g) ($runs runs, $ranks ranks, emulator)"

# The same in one process driving four GPUs, as NCCL's benchmarks do (-g 4: one thread and a group
# per iteration; -t 4: a thread per GPU), four warm-up AllReduces queued behind the first: the
# process's four ranks are recovered together, and log it once.
program=$build/tests/cudart_e2e/cudart_nccl_program
if [[ -x $program ]]; then
  for shape in group threads; do
    figures=()
    for ((run = 1; run <= runs; run++)); do
      dumps=$(mktemp -d "$work/dumps.XXXXXX")
      log=$work/devices-$shape-$run.log
      status=0
      env -u NCCL_COMM_ID LD_LIBRARY_PATH="$emulator" LD_PRELOAD="$preload" NCCLEMU_DEVICES=4 \
        NCCLGUARD_DUMP_DIR="$dumps" NCCLGUARD_JOB_ID=recovery-bench-devices NCCLGUARD_RECOVER=inprocess \
        NCCLGUARD_TIMEOUT=1 NCCLGUARD_POLL_INTERVAL=0.05 NCCLGUARD_STATUS_INTERVAL=0.2 \
        NCCLEMU_FAULTS="p2p_stall:after=0" NCCLEMU_DRIVER_VERSION=545.23.08 \
        "$program" "$shape" --warmup 4 --timeout 30 >"$log" 2>&1 || status=$?
      rm -rf "$dumps"
      took=$(sed -nE 's/.*ncclguard WARN comm [0-9a-f]+ #1 AllReduce: re-created .*4 ranks of it together.* ([0-9]+) ms after the stall was found.*/\1/p' "$log")
      if ((status != 0)) || [[ -z $took ]]; then
        echo "$0: one process, four GPUs ($shape), run $run: exit status $status, recovered together: ${took:-no}" >&2
        tail -n 30 "$log" >&2
        exit 1
      fi
      figures+=("$took")
    done
    echo "detection_to_replay_ms one process 4 GPUs $shape $(printf '%s\n' "${figures[@]}" | median_max %g) ($runs runs, emulator)"
  done
fi

# What probation costs the first collectives of a healthy job.
ddp_habits=$build/tests/recovery_e2e/ddp_habits
if [[ -x $ddp_habits ]]; then
  for shape in queued each-waited; do
    for recover in off inprocess; do
      figures=()
      for ((run = 1; run <= runs; run++)); do
        dumps=$(mktemp -d "$work/dumps.XXXXXX")
        log=$work/probation-$shape-$recover-$run.log
        flags=(--ranks "$ranks")
        [[ $shape == each-waited ]] && flags+=(--wait-each)
        if ! env -u NCCL_COMM_ID -u NCCLEMU_FAULTS LD_LIBRARY_PATH="$emulator" LD_PRELOAD="$preload" \
          NCCLGUARD_DUMP_DIR="$dumps" NCCLGUARD_JOB_ID=probation-bench NCCLGUARD_RECOVER="$recover" \
          "$ddp_habits" "${flags[@]}" >"$log" 2>&1; then
          echo "$0: ddp_habits ${flags[*]} failed under NCCLGUARD_RECOVER=$recover" >&2
          tail -n 30 "$log" >&2
          exit 1
        fi
        rm -rf "$dumps"
        slowest=$(sed -nE 's/^rank [0-9]+: sync_module_states: .* in ([0-9.]+) ms$/\1/p' "$log" | sort -n | tail -n 1)
        if [[ -z $slowest ]]; then
          echo "$0: ddp_habits printed no sync_module_states time" >&2
          exit 1
        fi
        figures+=("$slowest")
      done
      echo "first_6_broadcasts_ms $shape NCCLGUARD_RECOVER=$recover $(printf '%s\n' "${figures[@]}" | median_max %.2f) ($runs runs, emulator)"
    done
  done
fi

# What a handle costs an intercepted call (bench/README.md): four seconds at this minimum time,
# twenty at handles_bench's default.
handles_bench=$build/bench/handles_bench
if [[ -x $handles_bench ]]; then
  min_time=0.1
  ((smoke)) && min_time=0.005
  "$handles_bench" --benchmark_min_time=$min_time >"$work/handles.txt" 2>&1
  if ! grep -h '^translation_ns_per_call: ' "$work/handles.txt" >/dev/null; then
    echo "$0: handles_bench printed no translation_ns_per_call" >&2
    cat "$work/handles.txt" >&2
    exit 1
  fi
  grep -hE '^(intercepted_allreduce_ns|translation_ns_per_call): ' "$work/handles.txt"
fi
