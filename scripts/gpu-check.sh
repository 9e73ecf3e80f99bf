#!/usr/bin/env bash
# What only a GPU can show, on a machine with an NVIDIA GPU, the real driver and the real
# libnccl; one GPU is enough. Builds what it needs from this repository, runs every check,
# prints every figure, and exits non-zero if any check fails.
#
#   scripts/gpu-check.sh [--build-dir DIR] [--no-build] [--nccl-lib DIR] [--emulator]
#
#   --build-dir DIR  the CMake build tree (default: build-gpu-check in the repository)
#   --no-build       use the build tree as it is
#   --nccl-lib DIR   the directory of the real libnccl.so.2 (default: found with ldconfig, then
#                    in the CUDA toolkit)
#   --emulator       a rehearsal of every check on the CPU emulator instead of a GPU (what the
#                    ctest gpu_check.emulator runs); it checks the script, not the GPU
#
# The checks:
#   loaders    one-rank train_loop jobs through every way of loading NCCL (linked, dlopen,
#              rtld-local), with and without ncclguard: same checksums, and ncclguard names
#              the real libnccl behind the communicator
#   timing     large AllReduces: the GPU time ncclguard records for each lies within the host's
#              wall-clock window around it and agrees with the program's own CUDA events
#   stall      the stream is held before an AllReduce: ncclguard reports it as not started, then
#              records it started and completed once the stream moves
#   graph      an AllReduce captured into a CUDA graph, the graph launched three times: right
#              results, recorded as captured, never reported as a stall
#   cudart     an NCCL program built by nvcc against the CUDA runtime, one thread driving every
#              device and one thread per device, with and without ncclguard (skipped, with the
#              reason, when nvcc is missing)
#   abort      a communicator aborted with an operation queued behind a held stream
#   parked     facts about a stream parked at a cuStreamWaitValue32 gate on a page-locked word
#              (what ncclguard's in-process recovery does to an application stream): does a host
#              function's write let it go on, and how fast; do ncclCommAbort (of a communicator
#              whose AllReduce is queued before the gate), cuMemFree and cudaFree return while it
#              is parked, or only once the gate opens. It passes when it measured every answer,
#              whichever they are; the rehearsal runs it with the emulator's default (frees wait,
#              as on the real driver) and with NCCLEMU_FREES_WAIT=0, and checks each gives its own
#              answer
#   profiler   NCCL's profiler plugin API: NCCL_DEBUG=INFO says NCCL loaded ncclguard's profiler
#              (which ncclguard points NCCL_PROFILER_PLUGIN at), and the exit dump holds what it
#              reported of a one-rank communicator's AllReduces and Send/Recv to itself: per
#              operation algorithm, protocol, channels, kernel channels with the GPU's timer
#              (figures for each); then the host and wall time per Send+Recv group (what NCCL
#              profiles on one rank) with NCCLGUARD_PROFILER=0 and with the profiler on
#   overhead   the overhead benchmark on this driver: host time per ncclAllReduce, intercepted
#              and direct, in the same run, and their ratio
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$repo/build-gpu-check
do_build=1
nccl_lib=
cudart_lib=
emulator=0

usage() {
  sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

while (($#)); do
  case $1 in
    --build-dir) build=${2:?--build-dir needs a directory}; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --nccl-lib) nccl_lib=${2:?--nccl-lib needs a directory}; shift 2 ;;
    --emulator) emulator=1; shift ;;
    *) usage ;;
  esac
done

failures=0
checks=0
pass() { checks=$((checks + 1)); echo "PASS $1: $2"; }
fail() { checks=$((checks + 1)); failures=$((failures + 1)); echo "FAIL $1: $2"; }
skip() { echo "SKIP $1: $2"; }
figure() { echo "  $1: $2"; }

# --- The machine --------------------------------------------------------------------------------

# The directory of a system library: the dynamic linker's cache first, then the usual places.
find_library_dir() {
  local name=$1 candidate
  candidate=$(ldconfig -p 2>/dev/null | awk -v name="$name" '$1 == name && /x86-64|AArch64|64bit/ {print $NF; exit}')
  if [[ -n $candidate ]]; then dirname "$candidate"; return; fi
  for candidate in "${CUDA_HOME:-/usr/local/cuda}/lib" "${CUDA_HOME:-/usr/local/cuda}/lib64" \
    /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu; do
    if [[ -e $candidate/$name ]]; then echo "$candidate"; return; fi
  done
}

# Drops the emulator's directory from an inherited LD_LIBRARY_PATH: the real libraries must win.
path_without_emulator() {
  local entry kept=()
  local IFS=:
  for entry in ${LD_LIBRARY_PATH:-}; do
    [[ -n $entry && $entry != */emulator/lib ]] && kept+=("$entry")
  done
  echo "${kept[*]}"
}

if ((emulator)); then
  echo "== rehearsal on the CPU emulator: this checks the script, not a GPU"
  export NCCLEMU_DEVICES=1
else
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "FAIL machine: no NVIDIA GPU answers nvidia-smi; this check needs one (--emulator rehearses it)"
    exit 1
  fi
  echo "== machine"
  figure gpus "$(nvidia-smi -L | tr '\n' ';')"
  figure driver "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
  [[ -n $nccl_lib ]] || nccl_lib=$(find_library_dir libnccl.so.2)
  if [[ -z $nccl_lib || ! -e $nccl_lib/libnccl.so.2 ]]; then
    echo "FAIL machine: libnccl.so.2 not found (give --nccl-lib DIR)"
    exit 1
  fi
  nccl_lib=$(cd "$nccl_lib" && pwd)
  figure libnccl "$(readlink -f "$nccl_lib/libnccl.so.2")"
  # The nvcc-built program needs NVIDIA's runtime; it may live outside the linker's cache.
  cudart_lib=$(find_library_dir libcudart.so.13)
  figure libcudart "${cudart_lib:-not found}"
fi

# --- Build --------------------------------------------------------------------------------------

targets=(ncclguard train_loop train_loop_linked train_nccl_module watchdog_e2e_capture gpu_check_probe gpu_check_parked
  watchdog_bench)
if ((do_build)); then
  echo "== build ($build)"
  mkdir -p "$build"
  if ! cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/gpu-check-configure.log" 2>&1; then
    echo "FAIL build: cmake configure failed, see $build/gpu-check-configure.log" \
      "(scripts/install-deps.sh installs what the build needs)"
    exit 1
  fi
  # Built only where CMake found nvcc.
  if cmake --build "$build" --target help 2>/dev/null | grep -q cudart_nccl_program; then
    targets+=(cudart_nccl_program)
  fi
  if ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$build/gpu-check-build.log" 2>&1; then
    echo "FAIL build: cmake --build failed, see $build/gpu-check-build.log"
    exit 1
  fi
fi
build=$(cd "$build" && pwd)
preload=$build/lib/libncclguard.so
train_loop=$build/examples/train_loop
probe=$build/tests/gpu_check/gpu_check_probe
parked=$build/tests/gpu_check/gpu_check_parked
capture=$build/tests/watchdog_e2e/watchdog_e2e_capture
cudart_program=$build/tests/cudart_e2e/cudart_nccl_program
bench=$build/bench/watchdog_bench
for needed in "$preload" "$train_loop" "$probe" "$parked" "$capture" "$bench"; do
  if [[ ! -x $needed && ! -f $needed ]]; then
    echo "FAIL build: $needed is missing"
    exit 1
  fi
done

if ((emulator)); then
  library_path=$build/emulator/lib
  expected_nccl=$build/emulator/lib/libnccl.so.2
else
  library_path=$nccl_lib${cudart_lib:+:$cudart_lib}
  other=$(path_without_emulator)
  [[ -n $other ]] && library_path=$library_path:$other
  expected_nccl=$nccl_lib/libnccl.so.2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/ncclguard-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

# No ncclguard setting leaks in from the caller's environment: each check sets its own, as a
# prefix assignment to run.
while IFS='=' read -r name _; do
  [[ $name == NCCLGUARD_* ]] && unset "$name"
done < <(env)

run() {
  local job=$1 guarded=$2
  shift 2
  local variables=(LD_LIBRARY_PATH="$library_path" NCCLGUARD_DUMP_DIR="$work/$job" NCCLGUARD_JOB_ID="$job")
  [[ $guarded == guarded ]] && variables+=(LD_PRELOAD="$preload")
  env -u LD_PRELOAD -u NCCLEMU_FAULTS -u NCCLEMU_FREES_WAIT "${variables[@]}" "$@"
}

# The dump a job's process wrote at exit (NCCLGUARD_DUMP_ON_EXIT=1), or nothing.
exit_dump() {
  python3 - "$work/$1" <<'PYTHON'
import glob, json, os, sys
for path in glob.glob(os.path.join(sys.argv[1], "**", "dump-*.json"), recursive=True):
    try:
        if json.load(open(path)).get("reason") == "exit":
            print(path)
            break
    except (OSError, ValueError):
        pass
PYTHON
}

# --- loaders ------------------------------------------------------------------------------------

check_loaders() {
  echo "== loaders"
  local loader out unguarded guarded line
  for loader in linked dlopen rtld-local; do
    out=$work/loaders-$loader
    run loaders-$loader plain "$train_loop" --ranks 1 --steps 20 --nccl-loader "$loader" --timeout 120 \
      >"$out.plain" 2>&1
    local plain_status=$?
    NCCLGUARD_LOG_LEVEL=info run loaders-$loader guarded "$train_loop" --ranks 1 --steps 20 \
      --nccl-loader "$loader" --timeout 120 >"$out.guarded" 2>&1
    local guarded_status=$?
    unguarded=$(grep -o 'checksum 0x[0-9a-f]*' "$out.plain")
    guarded=$(grep -o 'checksum 0x[0-9a-f]*' "$out.guarded")
    line=$(grep -o 'created by ncclCommInitRank .*' "$out.guarded" | head -n 1)
    figure "$loader" "${guarded:-no checksum}; ${line:-no creation line}"
    if ((plain_status != 0 || guarded_status != 0)); then
      fail "loaders/$loader" "exit codes $plain_status (plain) and $guarded_status (ncclguard); see below"
      tail -n 5 "$out.plain" "$out.guarded"
    elif [[ -z $unguarded || $unguarded != "$guarded" ]]; then
      fail "loaders/$loader" "checksums differ: '$unguarded' without ncclguard, '$guarded' with"
    elif [[ $(readlink -f "${line##* at }") != "$(readlink -f "$expected_nccl")" ]]; then
      fail "loaders/$loader" "ncclguard does not name $expected_nccl: '$line'"
    else
      pass "loaders/$loader" "same checksum with and without ncclguard, NCCL at $expected_nccl"
    fi
  done
}

# --- timing -------------------------------------------------------------------------------------

check_timing() {
  echo "== timing"
  local count=$((64 << 20)) repeats=5
  ((emulator)) && count=$((1 << 20))
  if ! NCCLGUARD_POLL_INTERVAL=0.05 NCCLGUARD_DUMP_ON_EXIT=1 run timing guarded "$probe" timing "$count" "$repeats" >"$work/timing.out" 2>&1; then
    fail timing "the probe failed: $(tail -n 3 "$work/timing.out")"
    return
  fi
  local dump
  dump=$(exit_dump timing)
  if [[ -z $dump ]]; then
    fail timing "no dump at exit"
    return
  fi
  # Each operation's GPU time (between ncclguard's events) within its host window and within
  # 20 % (or 0.5 ms) of the time between the program's own events around the same call; seen
  # starting (start_ns: when ncclguard saw it) no earlier than it was issued.
  if python3 - "$work/timing.out" "$dump" <<'PYTHON'
import json, sys
probe = {}
for line in open(sys.argv[1]):
    if line.startswith("seq="):
        fields = dict(item.split("=") for item in line.split())
        probe[int(fields["seq"])] = fields
dump = json.load(open(sys.argv[2]))
ops = [op for comm in dump["communicators"] for op in comm["ops"] if op["op"] == "AllReduce"]
bad = 0
for op in ops:
    mine = probe.get(op["seq"])
    if mine is None:
        continue
    window_ms = (int(mine["host_end_ns"]) - int(mine["host_start_ns"])) / 1e6
    event_ms = float(mine["event_ms"])
    gpu_ms = op["gpu_ms"]
    ok = (op["state"] == "completed" and gpu_ms > 0 and gpu_ms <= window_ms + 0.5
          and abs(gpu_ms - event_ms) <= max(0.5, 0.2 * event_ms)
          and op["start_ns"] >= int(mine["host_start_ns"]) - 50e6)
    bad += not ok
    gbps = int(mine["bytes"]) / (gpu_ms * 1e6) if gpu_ms > 0 else 0
    print(f'  AllReduce #{op["seq"]}: {mine["bytes"]} bytes, ncclguard gpu_ms {gpu_ms:.4f}, '
          f'program events {event_ms:.4f} ms, host window {window_ms:.4f} ms, {gbps:.1f} GB/s, '
          f'state {op["state"]}{"" if ok else "  <-- inconsistent"}')
if len([op for op in ops if op["seq"] in probe]) != len(probe):
    print(f"  the dump holds {len(ops)} AllReduces, the program ran {len(probe)}")
    bad += 1
sys.exit(1 if bad else 0)
PYTHON
  then
    pass timing "GPU times consistent with wall time and the program's own events"
  else
    fail timing "see the operations marked above"
  fi
}

# --- stall --------------------------------------------------------------------------------------

check_stall() {
  echo "== stall"
  local out=$work/stall.out
  if ! NCCLGUARD_TIMEOUT=1 NCCLGUARD_POLL_INTERVAL=0.05 NCCLGUARD_DUMP_ON_EXIT=1 run stall guarded "$probe" stall 4 >"$out" 2>&1; then
    fail stall "the probe failed: $(tail -n 3 "$out")"
    return
  fi
  local reported
  reported=$(grep -m 1 'AllReduce #2 .*has not started on the GPU' "$out")
  figure report "${reported:-none}"
  local dump
  dump=$(exit_dump stall)
  local released
  released=$(sed -n 's/^released_at_ns=\([0-9]*\).*/\1/p' "$out")
  local state
  state=$(python3 - "$dump" "${released:-0}" <<'PYTHON'
import json, sys
dump = json.load(open(sys.argv[1])) if sys.argv[1] else {"communicators": []}
ops = [op for comm in dump["communicators"] for op in comm["ops"] if op["seq"] == 2]
if not ops:
    print("missing")
else:
    op = ops[0]
    late = (op["start_ns"] - int(sys.argv[2])) / 1e6
    print(f'{op["state"]} start_after_release_ms={late:.1f} gpu_ms={op["gpu_ms"]:.4f}')
PYTHON
)
  figure "AllReduce #2 at exit" "$state"
  if [[ -z $reported ]]; then
    fail stall "ncclguard did not report AllReduce #2 as not started"
  elif grep -q 'has not completed' "$out"; then
    fail stall "a held stream was reported as a started collective: $(grep -m 1 'has not completed' "$out")"
  elif [[ $state != completed* ]]; then
    fail stall "AllReduce #2 was not recorded as completed once the stream moved: $state"
  elif ! awk '{split($2, a, "="); exit !(a[2] > -50)}' <<<"$state"; then
    fail stall "AllReduce #2's GPU start precedes the stream's release: $state"
  else
    pass stall "reported as not started while held, then started and completed after the release"
  fi
}

# --- graph --------------------------------------------------------------------------------------

check_graph() {
  echo "== graph"
  local out=$work/graph.out
  if ! NCCLGUARD_TIMEOUT=1 NCCLGUARD_DUMP_ON_EXIT=1 run graph guarded "$capture" 0.5 1.5 >"$out" 2>&1; then
    fail graph "the program failed: $(tail -n 3 "$out")"
    return
  fi
  local state
  state=$(python3 - "$(exit_dump graph)" <<'PYTHON'
import json, sys
dump = json.load(open(sys.argv[1])) if sys.argv[1] else {"communicators": []}
print(",".join(op["state"] for comm in dump["communicators"] for op in comm["ops"]) or "none")
PYTHON
)
  figure "recorded states" "$state"
  if ! grep -q 'capture ok' "$out"; then
    fail graph "the graph's launches delivered wrong data"
  elif grep -qE 'has not (completed|started)' "$out"; then
    fail graph "a captured collective was reported as a stall"
  elif [[ $state != captured ]]; then
    fail graph "the captured AllReduce was recorded as '$state'"
  else
    pass graph "three launches right, recorded as captured, no stall reported"
  fi
}

# --- cudart -------------------------------------------------------------------------------------

check_cudart() {
  echo "== cudart"
  if [[ ! -x $cudart_program ]]; then
    skip cudart "$cudart_program was not built (nvcc not found)"
    return
  fi
  local mode guarded out expected="kernel ran"
  ((emulator)) && expected="kernel launch refused: cudaErrorNotSupported"
  for mode in group threads; do
    for guarded in plain guarded; do
      out=$work/cudart-$mode-$guarded.out
      run "cudart-$mode-$guarded" "$guarded" "$cudart_program" "$mode" --timeout 60 >"$out" 2>&1
      local status=$?
      figure "$mode ($guarded)" "exit $status; $(head -n 1 "$out")"
      if ((status != 0)) || ! grep -qx ok "$out" || ! grep -q "$expected" "$out"; then
        fail "cudart/$mode/$guarded" "exit $status: $(tail -n 3 "$out" | tr '\n' ' ')"
      elif grep -q 'ncclguard WARN' "$out"; then
        fail "cudart/$mode/$guarded" "$(grep -m 1 'ncclguard WARN' "$out")"
      else
        pass "cudart/$mode/$guarded" "results right, $expected"
      fi
    done
  done
}

# --- abort --------------------------------------------------------------------------------------

check_abort() {
  echo "== abort"
  local out=$work/abort.out
  run abort guarded timeout 60 "$probe" abort 3 >"$out" 2>&1
  local status=$?
  figure abort "$(grep -h '^abort_result\|^stream_after_abort' "$out" | tr '\n' ' ')"
  if ((status != 0)) || ! grep -q '^abort done' "$out"; then
    fail abort "exit $status: $(tail -n 3 "$out" | tr '\n' ' ')"
  elif grep -q 'ncclguard WARN' "$out"; then
    fail abort "$(grep -m 1 'ncclguard WARN' "$out")"
  else
    pass abort "ncclCommAbort returned success and the held stream drained"
  fi
}

# --- parked -------------------------------------------------------------------------------------

# One run of the parked program, plain (the driver and NCCL alone), with the variables given after
# `expected`. Every answer is printed; with `expected`, cuMemFree, cudaFree and abort must all
# give that one.
parked_run() {
  local label=$1 expected=$2
  shift 2
  local out=$work/parked-$label.out limit=10
  ((emulator)) && limit=2
  # Each of the four scenarios waits at most three limits.
  run "parked-$label" plain env "$@" timeout $((12 * limit + 60)) "$parked" "$limit" >"$out" 2>&1
  local status=$?
  local scenario line answers=()
  for scenario in gate cuMemFree cudaFree abort; do
    line=$(grep -m 1 "^$scenario " "$out")
    figure "$scenario ($label)" "${line#"$scenario "}"
    [[ $scenario == gate ]] || answers+=("$(sed -n 's/.*answer=\([a-z_]*\).*/\1/p' <<<"$line")")
  done
  local unknown
  unknown=$(printf '%s\n' "${answers[@]}" | grep -cvxE 'returns_while_parked|waits_for_parked_stream|skipped')
  if ((status != 0)) || ! grep -q '^parked done' "$out" || ! grep -q '^gate .*went_on=' "$out"; then
    fail "parked/$label" "exit $status: $(grep -v '^gate \|^cuMemFree \|^cudaFree \|^abort ' "$out" | tail -n 3 | tr '\n' ' ')"
  elif ((unknown != 0)); then
    fail "parked/$label" "an answer could not be measured: ${answers[*]}"
  elif [[ -n $expected ]] && [[ "${answers[*]}" != "$expected $expected $expected" ]]; then
    fail "parked/$label" "cuMemFree, cudaFree, abort answered '${answers[*]}', expected $expected from each"
  else
    pass "parked/$label" "cuMemFree ${answers[0]}, cudaFree ${answers[1]}, abort ${answers[2]}"
  fi
}

check_parked() {
  echo "== parked"
  if ((emulator)); then
    parked_run default waits_for_parked_stream
    parked_run frees-return returns_while_parked NCCLEMU_FREES_WAIT=0
  else
    parked_run gpu ""
  fi
}

# --- profiler -----------------------------------------------------------------------------------

# What the exit dump's profiles hold, per NCCL function: "key=value" lines for the figures, and a
# last line "ops=N timed=T" (operations reported; of them, every kernel channel stopped with GPU
# timer readings).
profile_summary() {
  python3 - "$1" <<'PYTHON'
import collections, json, sys
try:
    dump = json.load(open(sys.argv[1]))
except (OSError, ValueError) as error:
    print(f"unreadable={error}")
    print("ops=0 timed=0")
    sys.exit()
by_func = collections.defaultdict(list)
for comm in dump.get("communicators", []):
    for op in comm.get("profile", []):
        by_func[op.get("func", "?")].append(op)
ops = timed = 0
for func, reported in sorted(by_func.items()):
    kernels = [k for op in reported for k in op.get("kernel_channels", [])]
    proxies = [p for op in reported for p in op.get("proxy_ops", [])]
    good = [op for op in reported if op.get("kernel_channels") and all(
        k.get("stopped") and 0 < k.get("gpu_start_ns", 0) <= k.get("gpu_stop_ns", 0) for k in op["kernel_channels"])]
    ops += len(reported)
    timed += len(good)
    spans = [k["gpu_stop_ns"] - k["gpu_start_ns"] for k in kernels if k.get("gpu_stop_ns", 0) > k.get("gpu_start_ns", 0) > 0]
    print(f"{func}=ops {len(reported)}, algo/proto {sorted({op.get('algo', '') + '/' + op.get('proto', '') for op in reported})}, "
          f"channels {sorted({op.get('channels', 0) for op in reported})}, kernel channels {len(kernels)} "
          f"({sum(1 for k in kernels if k.get('stopped'))} stopped), proxy operations {len(proxies)}, "
          f"kernel channel time {min(spans) / 1000 if spans else 0:.1f}-{max(spans) / 1000 if spans else 0:.1f} us")
if not any(func not in ("Send", "Recv") for func in by_func):
    print("collectives=none reported (expected: NCCL runs a one-rank collective as a local copy, outside its planner)")
print(f"ops={ops} timed={timed}")
PYTHON
}

check_profiler() {
  echo "== profiler"
  local count=$((16 << 20)) out=$work/profiler.out
  ((emulator)) && count=$((1 << 16))
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCLGUARD_DUMP_ON_EXIT=1 NCCLGUARD_POLL_INTERVAL=0.05 \
    run profiler guarded "$probe" profiler "$count" 5 >"$out" 2>&1
  local status=$?
  grep -i 'PROFILER/Plugin\|profiler plugin\|NCCL_PROFILER_PLUGIN' "$out" | head -n 6 | while read -r line; do figure "NCCL" "$line"; done
  local loaded dump summary
  loaded=$(grep -ci 'PROFILER/Plugin: loaded ncclguard' "$out")
  dump=$(exit_dump profiler)
  summary=$(profile_summary "${dump:-/nonexistent}")
  grep -v '^ops=' <<<"$summary" | while read -r line; do figure "${line%%=*}" "${line#*=}"; done
  local ops timed
  ops=$(sed -n 's/^ops=\([0-9]*\) .*/\1/p' <<<"$summary")
  timed=$(sed -n 's/.* timed=\([0-9]*\)$/\1/p' <<<"$summary")
  figure "operations reported" "${ops:-0}, ${timed:-0} with every kernel channel stopped and timed by the GPU"
  if ((status != 0)) || ! grep -q '^profiler done' "$out"; then
    fail profiler/events "the probe failed: $(tail -n 3 "$out" | tr '\n' ' ')"
  elif ((loaded == 0)); then
    fail profiler/events "NCCL_DEBUG=INFO does not say NCCL loaded ncclguard's profiler"
  elif [[ -z $dump ]]; then
    fail profiler/events "no exit dump"
  elif ((${ops:-0} == 0 || ${timed:-0} == 0)); then
    fail profiler/events "NCCL loaded ncclguard's profiler but reported no timed operation of a one-rank communicator"
  else
    pass profiler/events "NCCL loaded ncclguard's profiler and reported $ops operations, $timed timed"
  fi
  profiler_overhead
}

# The probe's cost figures without ncclguard's profiler and with it: host time per group of a Send
# and Recv to itself, and wall time per group with the GPU.
profiler_overhead() {
  local setting host=() wall=()
  for setting in 0 1; do
    local out=$work/profiler-overhead-$setting.out
    if ! NCCLGUARD_PROFILER=$setting run profiler-overhead-$setting guarded "$probe" profiler 256 1 >"$out" 2>&1; then
      fail profiler/overhead "the probe failed with NCCLGUARD_PROFILER=$setting: $(tail -n 3 "$out" | tr '\n' ' ')"
      return
    fi
    host+=("$(sed -n 's/^p2p_group_host_ns=\([0-9.]*\) .*/\1/p' "$out")")
    wall+=("$(sed -n 's/.* p2p_group_wall_ns=\([0-9.]*\)$/\1/p' "$out")")
  done
  if [[ -z ${host[0]} || -z ${host[1]} || -z ${wall[0]} || -z ${wall[1]} ]]; then
    fail profiler/overhead "the probe printed no p2p_group figures"
    return
  fi
  figure "host ns per Send+Recv group, profiler off / on" "${host[0]} / ${host[1]}"
  figure "wall ns per Send+Recv group with the GPU, profiler off / on" "${wall[0]} / ${wall[1]}"
  figure "profiler's host cost per group (ns)" \
    "$(awk -v on="${host[1]}" -v off="${host[0]}" 'BEGIN {printf "%.0f", on - off}')"
  pass profiler/overhead "measured with the profiler off and on, on this driver"
}

# --- overhead -----------------------------------------------------------------------------------

check_overhead() {
  echo "== overhead"
  local flags=()
  ((emulator)) && flags=(--benchmark_min_time=0.002 --benchmark_repetitions=1)
  local out=$work/overhead.out
  if ! NCCLGUARD_POLL_INTERVAL=0.01 run overhead guarded "$bench" --phases=overhead "${flags[@]}" >"$out" 2>&1; then
    fail overhead "watchdog_bench failed: $(tail -n 3 "$out" | tr '\n' ' ')"
    return
  fi
  local direct intercepted
  direct=$(sed -n 's/^direct_ns_per_collective: //p' "$out")
  intercepted=$(sed -n 's/^intercepted_ns_per_collective: //p' "$out")
  grep -E '^(direct|intercepted|driver_event_calls|ncclguard_bookkeeping|overhead)_ns_per_collective: ' "$out" |
    while read -r line; do figure "${line%%:*}" "${line#*: }"; done
  if [[ -z $direct || -z $intercepted ]]; then
    fail overhead "watchdog_bench printed no direct or intercepted figure"
    return
  fi
  figure "intercepted / direct" "$(awk -v i="$intercepted" -v d="$direct" 'BEGIN {printf "%.2f", i / d}')"
  pass overhead "measured in one run on this driver"
}

check_loaders
check_timing
check_stall
check_graph
check_cudart
check_abort
check_parked
check_profiler
check_overhead

echo "== $((checks - failures)) of $checks checks passed"
((failures == 0))
