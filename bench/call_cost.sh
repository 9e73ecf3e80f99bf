#!/usr/bin/env bash
# What ncclguard adds per collective on the application's own thread, counted by valgrind's
# callgrind on the emulator: instructions, and calls into the CUDA driver.
#
#   bench/call_cost.sh <build directory> [--smoke]
#
# collective_loop issues N small AllReduces per rank back to back, then one wait: on a one-rank
# communicator (which NCCL's profiler does not see: timed by CUDA events), and as one process
# driving two GPUs (a group of two AllReduces per step, timed by NCCL's profiler at the defaults).
# Each runs with N = 2,000 and 6,000, without ncclguard, with it at the defaults and with
# NCCLGUARD_PROFILER=0 (CUDA events). Per collective: the difference of the two runs over the
# extra collectives, the same difference without ncclguard subtracted; and, of that, ncclguard's
# own: the instructions of libncclguard.so and its core, and of what they call outside NCCL (libc,
# the loader, the driver), wherever on the thread they run (NCCL calls its profiler callbacks).
# The rest is NCCL's: the real calls, and NCCL's own work for a loaded profiler plugin.
# Only the main thread is counted (callgrind --separate-threads); the watchdog's and NCCL's own
# threads are not the application's. --smoke runs N = 20 and 60 and only checks that every figure
# is printed. Exit status 77 (skipped) where valgrind is not installed.
set -euo pipefail

if [[ $# -lt 1 || ! -d $1 ]]; then
  echo "usage: $0 <build directory> [--smoke]" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
small=2000
large=6000
if [[ ${2:-} == --smoke ]]; then
  small=20
  large=60
fi
if ! command -v valgrind >/dev/null; then
  echo "$0: valgrind is not installed (apt-get install valgrind): skipped" >&2
  exit 77
fi
program=$build/bench/collective_loop
preload=$build/lib/libncclguard.so
emulator=$build/emulator/lib
for needed in "$program" "$preload" "$emulator/libnccl.so.2" "$emulator/libcuda.so.1"; do
  [[ -e $needed ]] || { echo "$0: $needed is missing: build the collective_loop target" >&2; exit 2; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/ncclguard-call-cost.XXXXXX")
trap 'rm -rf "$work"' EXIT

# <name> <collectives> [environment...]: runs the program under callgrind; prints, as JSON, the main
# thread's instructions and its calls into libcuda by function.
measure() {
  local name=$1 count=$2
  shift 2
  local out=$work/$name-$count
  mkdir -p "$out"
  env LD_LIBRARY_PATH="$emulator" NCCLEMU_DEVICES=2 NCCLGUARD_DUMP_DIR="$work/dumps" NCCL_DEBUG=WARN "$@" \
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out/callgrind.out" \
    "$program" "$count" "$ranks" >"$out/log" 2>&1 || { cat "$out/log" >&2; echo "$0: $name failed" >&2; exit 1; }
  python3 - "$out/callgrind.out-01" <<'PY'
import collections, os, re, sys
names = {"ob": {}, "fn": {}}
def name(kind, text):
    m = re.match(r"\((\d+)\)(?: (.*))?", text)
    if not m:
        return text
    table = names["fn" if kind in ("fn", "cfn") else "ob"]
    if m.group(2) is not None:
        table[m.group(1)] = m.group(2)
    return table.get(m.group(1), "?")
ob = callee_ob = callee_fn = ""
total = 0
own = 0  # ncclguard's code, and what it calls outside ncclguard and NCCL (libc, the loader, libcuda)
in_call = False
calls = collections.Counter()
def is_driver(obj):
    return os.path.basename(obj).startswith("libcuda.so")
def is_ours(obj):
    return os.path.basename(obj).startswith("libncclguard")
def is_nccl(obj):
    return os.path.basename(obj).startswith("libnccl.so")
with open(sys.argv[1]) as f:
    for line in f:
        line = line.rstrip("\n")
        if line.startswith("ob="):
            ob = name("ob", line[3:]); callee_ob = ""
        elif line.startswith("cob="):
            callee_ob = name("ob", line[4:])
        elif line.startswith("cfn="):
            callee_fn = name("cfn", line[4:])
        elif line.startswith("fn="):
            name("fn", line[3:]); callee_ob = ""
        elif line.startswith("calls="):
            count = int(line[6:].split()[0])
            target = callee_ob or ob
            if is_driver(target) and not is_driver(ob):
                calls[callee_fn] += count
            in_call = True
        elif line.startswith("totals:") or line.startswith("summary:"):
            total = int(line.split()[1])
        elif line[:1].isdigit() or line[:1] in "+-*":
            # A cost line: a call's inclusive cost right after its calls= line, else the function's own.
            parts = line.split()
            cost = int(parts[1]) if len(parts) > 1 else 0
            if in_call:
                target = callee_ob or ob
                if is_ours(ob) and not is_ours(target) and not is_nccl(target):
                    own += cost
                in_call = False
                callee_ob = ""
            elif is_ours(ob):
                own += cost
import json
print(json.dumps({"instructions": total, "own": own, "calls": dict(calls)}))
PY
}

for ranks in 1 2; do
  for variant in without defaults profiler_off; do
    case $variant in
      without) environment=() ;;
      defaults) environment=(LD_PRELOAD="$preload") ;;
      profiler_off) environment=(LD_PRELOAD="$preload" NCCLGUARD_PROFILER=0) ;;
    esac
    measure "$variant-$ranks" "$small" "${environment[@]}" >"$work/$variant-$ranks.small.json"
    measure "$variant-$ranks" "$large" "${environment[@]}" >"$work/$variant-$ranks.large.json"
  done
done

python3 - "$work" "$((large - small))" <<'PY'
import json, sys
work, extra = sys.argv[1], int(sys.argv[2])
def per_collective(variant, ranks):
    small = json.load(open(f"{work}/{variant}-{ranks}.small.json"))
    large = json.load(open(f"{work}/{variant}-{ranks}.large.json"))
    collectives = extra * ranks
    calls = {name: (large["calls"].get(name, 0) - small["calls"].get(name, 0)) / collectives
             for name in set(small["calls"]) | set(large["calls"])}
    own = (large["own"] - small["own"]) / collectives
    return (large["instructions"] - small["instructions"]) / collectives, own, calls
def show(label, ir, own, calls):
    named = ", ".join(f"{name} {count:+.2f}" for name, count in sorted(calls.items()) if abs(count) >= 0.005)
    print(f"{label:52} {ir:12.0f} {own:12} {sum(calls.values()):12.2f}  {named or '-'}")
print(f"{'per collective, main thread':52} {'instructions':>12} {'ncclguard':>12} {'driver calls':>12}  which")
for ranks, workload in ((1, "one rank"), (2, "two GPUs, one process")):
    base_ir, _, base_calls = per_collective("without", ranks)
    show(f"NCCL alone (emulator), {workload}", base_ir, "-", base_calls)
    for variant in ("defaults", "profiler_off"):
        ir, own, calls = per_collective(variant, ranks)
        added = {name: calls.get(name, 0) - base_calls.get(name, 0) for name in set(calls) | set(base_calls)}
        show(f"ncclguard adds ({variant}), {workload}", ir - base_ir, f"{own:.0f}", added)
        print(f"added_instructions_per_collective_{variant}_{ranks}_ranks={ir - base_ir:.0f}")
        print(f"ncclguard_instructions_per_collective_{variant}_{ranks}_ranks={own:.0f}")
        print(f"added_driver_calls_per_collective_{variant}_{ranks}_ranks={sum(added.values()):.2f}")
PY
