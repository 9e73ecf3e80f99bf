#!/usr/bin/env bash
# The demo, on an already built tree (default: build/). scripts/demo.sh installs, builds, runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
guard="$build/lib/libncclguard.so"
emulator="$build/emulator/lib"
train_loop="$build/examples/train_loop"
real_nccl=$(dirname "$(grep -m1 '^NCCL_LIBRARY:' "$build/CMakeCache.txt" | cut -d= -f2-)")
jobs=$(mktemp -d)
trap 'rm -rf "$jobs"' EXIT

# A paragraph of explanation: its first line starts a new section.
say() {
  printf '\n\033[1m%s\033[0m\n' "$1"
  shift
  for line in "$@"; do printf '\033[1m%s\033[0m\n' "$line"; done
}
# A job on the CPU emulator of CUDA and NCCL, under ncclguard.
watched() {
  LD_LIBRARY_PATH="$emulator" LD_PRELOAD="$guard" NCCLGUARD_DUMP_DIR="$jobs" "$@"
}

say "1. A healthy four-rank training job, NCCL loaded the way Paddle does (dlopen + dlsym)." \
    "   ncclguard names the NCCL library behind each communicator; the job prints its checksums."
NCCLGUARD_LOG_LEVEL=info watched "$train_loop" --ranks 4 --steps 50 --nccl-loader dlopen 2>&1 |
  grep -E 'created by|checksum|all 4 ranks'

say "2. The same job, but rank 2's 20th AllReduce never completes (a fault injected in the" \
    "   emulated NCCL, as a broken transport would). Without ncclguard this job hangs forever." \
    "   With NCCLGUARD_TIMEOUT=3 every rank reports the stall within seconds, dumps its state," \
    "   and with NCCLGUARD_ACTION=abort the job fails promptly instead of hanging:"
start=$(date +%s)
NCCLEMU_FAULTS="hang:rank=2,seq=20" NCCLGUARD_TIMEOUT=3 NCCLGUARD_ACTION=abort \
  watched "$train_loop" --ranks 4 --steps 50 --timeout 60 2>&1 |
  grep -E 'ncclguard WARN|job failed|rank [0-9] (exited|failed|was killed)' || true
echo "   (the job ended after $(( $(date +%s) - start )) s)"

say "3. What one rank's dump says about the stalled operation and its communicator:"
dump=$(ls "$jobs"/*/dump-*.json | head -n 1)
python3 - "$dump" <<'PY'
import json, sys
dump = json.load(open(sys.argv[1]))
print(f"   {sys.argv[1]}")
print(f"   format {dump['format']} v{dump['format_version']}, ncclguard {dump['ncclguard_version']}, "
      f"host {dump['host']}, pid {dump['pid']}, rank {dump['rank']}, reason {dump['reason']}")
stall = dump.get("stall") or {}
print(f"   stall: {stall.get('message', '-')}")
for view in dump["watchdog"]["progress"]:
    print(f"   watchdog's view of comm {view['comm_id']}: last enqueued #{view['last_enqueued']}, "
          f"started #{view['last_started']}, completed #{view['last_completed']}")
for comm in dump["communicators"]:
    print(f"   flight recorder of comm {comm['id']} (rank {comm['rank']} of {comm['nranks']}, "
          f"{comm['library_path']}), last entries:")
    for op in comm["ops"][-3:]:
        gpu = f", {op['gpu_ms']:.3f} ms on the GPU" if op["gpu_ms"] >= 0 else ""
        print(f"     #{op['seq']} {op['op']} {op['dtype']} x {op['count']}: {op['state']}{gpu}")
PY

say "4. Scenario S4, uneven data: rank 3 runs out of data after step 40 and stops issuing" \
    "   collectives; the others wait in the next AllReduce for ever. Every rank's stall line" \
    "   already carries the cross-rank verdict, which names rank 3:"
NCCLGUARD_TIMEOUT=3 NCCLGUARD_JOB_ID=uneven-data \
  watched "$train_loop" --ranks 4 --steps 60 --stop-early 3:40 --timeout 8 2>&1 |
  grep -E 'ncclguard WARN.*verdict' | head -n 1 | fold -s -w 110 || true
say "   ncclguard analyze on the job directory, after the launcher gave up on the job:"
"$build/bin/ncclguard" analyze "$jobs/uneven-data" --html "$jobs/uneven-data.html" | head -n 12 || true
say "   The same as a page to open in a browser or attach to the incident (one file, no network):" \
    "   $jobs/uneven-data.html"

say "5. Scenario S5, a timeout after saving a checkpoint: after step 30 rank 1 saves a checkpoint" \
    "   that does not end (its writer never finishes); the others wait in the next AllReduce. They" \
    "   ask every process to dump, rank 1 too, whose dump holds every thread's stack. The waiting" \
    "   ranks then say where rank 1 is: in which function, blocked on what, for how long:"
NCCLGUARD_TIMEOUT=3 NCCLGUARD_JOB_ID=slow-save \
  watched "$train_loop" --ranks 4 --steps 60 --sleep 1:30:600 --timeout 9 2>&1 |
  grep -E '\[0\] ncclguard WARN.*still waiting; verdict' | head -n 1 | fold -s -w 110 || true
say "   The launcher killed the whole job at its time limit; ncclguard analyze afterwards keeps what" \
    "   the ranks saw alive, and prints the late rank's stack under its verdict:"
"$build/bin/ncclguard" analyze "$jobs/slow-save" --html "$jobs/slow-save.html" |
  grep -vE '^  evidence:|^    (completed_ranks|late_ranks|op|waited_seconds|waiting_ranks|Report page)' |
  head -n 30 | fold -s -w 120 || true
say "   The report page, with rank 1 late and its stack: $jobs/slow-save.html"

say "6. Scenario S2, a hang right after init: with driver 545.23.08, NCCL's P2P transfers never" \
    "   complete (injected). ncclguard warns at init that this driver is known-bad; the first" \
    "   collective stalls; the verdict is p2p_suspect; with NCCLGUARD_ACTION=reinit every rank" \
    "   records it and exits 75. \`ncclguard run\` starts the job again, which now turns P2P off" \
    "   before its first communicator, and the job completes (NCCL goes through shared memory):"
LD_LIBRARY_PATH="$emulator" NCCLGUARD_DUMP_DIR="$jobs" NCCLGUARD_JOB_ID=hang-after-init \
  NCCLEMU_FAULTS="p2p_stall:after=0" NCCLEMU_DRIVER_VERSION=545.23.08 NCCL_DEBUG=INFO \
  NCCLGUARD_ACTION=reinit NCCLGUARD_TIMEOUT=3 \
  "$build/bin/ncclguard" run -- "$train_loop" --ranks 4 --steps 50 --timeout 60 2>&1 |
  grep -E 'ncclguard run|\[0\] ncclguard (WARN|ERROR)|\[0\] NCCL INFO Channel 00.* 0\[0\] -> 1|all 4 ranks|rank 0 checksum' |
  fold -s -w 120 || true
echo "   (exit status of ncclguard run: ${PIPESTATUS[0]})"

say "7. Scenario S2 again, recovered in-process: the same job, the same fault, the same driver, run" \
    "   once under LD_PRELOAD with NCCLGUARD_RECOVER=inprocess and no \`ncclguard run\`. The first" \
    "   collective stalls as before; every rank re-creates the communicator on a private copy of" \
    "   libnccl with P2P disabled and replays the stalled Broadcast. The processes go on (their pids" \
    "   do not change), the job finishes, and nobody restarted it. NCCL's first communicator goes" \
    "   through P2P, the re-created one through shared memory:"
status=0
LD_LIBRARY_PATH="$emulator" LD_PRELOAD="$guard" NCCLGUARD_DUMP_DIR="$jobs" NCCLGUARD_JOB_ID=hang-after-init-inprocess \
  NCCLEMU_FAULTS="p2p_stall:after=0" NCCLEMU_DRIVER_VERSION=545.23.08 NCCL_DEBUG=INFO \
  NCCLGUARD_RECOVER=inprocess NCCLGUARD_TIMEOUT=3 \
  "$train_loop" --ranks 4 --steps 50 --timeout 60 >"$jobs/inprocess.log" 2>&1 || status=$?
grep -E '\[0\] ncclguard (WARN|ERROR)|\[0\] NCCL INFO Channel 00.* 0\[0\] -> 1|train_loop: all 4 ranks|rank 0 checksum' \
  "$jobs/inprocess.log" | fold -s -w 120 || true
# The same job without the fault and without ncclguard gives the checksums to expect.
healthy=$(LD_LIBRARY_PATH="$emulator" "$train_loop" --ranks 4 --steps 50 --timeout 60 2>&1 |
  grep -E '^rank [0-9]+ checksum' | sort || true)
recovered=$(grep -E '^rank [0-9]+ checksum' "$jobs/inprocess.log" | sort || true)
same="DIFFERENT"
[[ -n $healthy && $healthy == "$recovered" ]] && same="same as a healthy run"
echo "   (exit status of the job: $status; the checksums of its 4 ranks: $same)"

if [[ -e "$real_nccl/libnccl.so.2" ]]; then
  say "8. The real NCCL of the CUDA toolkit, through Python ctypes. There is no GPU here, so" \
      "   ncclCommInitRank fails with ncclUnhandledCudaError; ncclguard forwards exactly that:"
  LD_LIBRARY_PATH="$real_nccl" LD_PRELOAD="$guard" NCCLGUARD_DUMP_DIR="$jobs" NCCLGUARD_LOG_LEVEL=debug \
    python3 - <<'PY' 2>&1 | grep -vE 'dumped state|job directory'
import ctypes
nccl = ctypes.CDLL("libnccl.so.2")
class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
version, uid, comm = ctypes.c_int(), UniqueId(), ctypes.c_void_p()
nccl.ncclGetVersion(ctypes.byref(version))
nccl.ncclGetUniqueId(ctypes.byref(uid))
result = nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0)
nccl.ncclGetLastError.restype = ctypes.c_char_p
print(f"python: NCCL {version.value}, ncclCommInitRank returned {result}: "
      f"{nccl.ncclGetLastError(None).decode()}")
PY
fi

say "9. Which link? Over the network (P2P and shared memory off, as between nodes), rank 1's sends" \
    "   to rank 2 stop arriving in the 10th AllReduce (injected). Every rank is inside it and none" \
    "   finishes; NCCL's profiler, which ncclguard serves, shows rank 1's step posted and never" \
    "   received, so every rank's verdict names that link, its channel and step:"
NCCLEMU_FAULTS="hang:rank=1,peer=2,seq=10" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCLGUARD_TIMEOUT=3 \
  NCCLGUARD_JOB_ID=link watched "$train_loop" --ranks 4 --steps 20 --count 262144 --timeout 8 2>&1 |
  grep -E '\[0\] ncclguard WARN.*verdict' | head -n 1 | sed -E 's/ — dump: .*//' | fold -s -w 110 || true
say "   ncclguard analyze says the same, and --trace writes a timeline for ui.perfetto.dev with a" \
    "   track per channel, where both ranks of the stopped link are marked:"
"$build/bin/ncclguard" analyze "$jobs/link" --trace "$jobs/link.trace.json" | grep -E '^[A-Z_]+  comm|^  ranks:' || true
python3 - "$jobs/link.trace.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
for e in events:
    verdict = e.get("args", {}).get("verdict", "") if e.get("ph") == "X" else ""
    if verdict.startswith("link_stalled: "):  # the channel tracks; the operation tracks say the kind only
        print(f"   rank {e['pid'] - 1}, track '{tracks.get((e['pid'], e['tid']))}': {e['name']} — {verdict}")
PY

say "10. Slow, not hung: the same network ring of eight ranks, every link jittering by 10 %, and rank 3's" \
    "   link to rank 4 three times slower until operation #300. Nothing stalls and nothing fails; the" \
    "   job runs at that link's pace. Rank 0 judges the job's pace from the statuses every 4 s and" \
    "   names the link while the job goes on, then says when it is fast again:"
start=$(date +%s)
NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCLEMU_LINKS="gbps=1,jitter=0.1" \
  NCCLEMU_FAULTS="slow_link:rank=3,peer=4,factor=3,until=300" NCCLGUARD_JOB_ID=slow-link NCCLGUARD_SLOW_INTERVAL=4 \
  watched "$train_loop" --ranks 8 --steps 800 --count 262144 --timeout 300 2>&1 |
  grep -E 'ncclguard WARN slow|all 8 ranks' | sed -E 's/^.*ncclguard WARN /   /; s/ \(it was: .*\)$//' || true
echo "   (the job ran $(( $(date +%s) - start )) s)"

program="$build/tests/cudart_e2e/cudart_nccl_program"
if [[ -x "$program" ]]; then
  say "11. A program written the way NCCL's own benchmarks and JAX are: built by nvcc against the CUDA" \
      "   runtime, one process driving four GPUs, their communicators created inside one group." \
      "   It runs on the emulator's libcudart; rank 2's fourth AllReduce hangs (injected). ncclguard" \
      "   describes each communicator once NCCL has created it, so the stall names all four ranks:"
  watched env NCCLEMU_DEVICES=4 NCCLEMU_FAULTS="hang:rank=2,seq=4" NCCLGUARD_JOB_ID=grouped NCCLGUARD_TIMEOUT=2 \
    "$program" group --timeout 6 2>&1 | grep -E 'devices|ncclguard WARN' | sed -E 's/ — verdict: ([a-z_]+).*/ — verdict: \1/' || true
  "$build/bin/ncclguard" analyze "$jobs/grouped" | grep -E '^[A-Z_]+  comm|^  ranks:' || true
  say "   The same program with the hang of step 6 (driver 545.23.08) and NCCLGUARD_RECOVER=inprocess," \
      "   four warm-up AllReduces queued back to back as the benchmarks do: the four ranks this process" \
      "   drives are re-created together in one group and replayed, and every result checks (\"ok\"):"
  watched env NCCLEMU_DEVICES=4 NCCLEMU_FAULTS="p2p_stall:after=0" NCCLEMU_DRIVER_VERSION=545.23.08 \
    NCCLGUARD_JOB_ID=grouped-inprocess NCCLGUARD_TIMEOUT=2 NCCLGUARD_RECOVER=inprocess \
    "$program" group --warmup 4 --timeout 30 2>&1 | grep -E '^ok$|ncclguard WARN' |
    sed -E 's/ — verdict: ([a-z_]+).*/ — verdict: \1/; s/^.*ncclguard WARN known-bad.*/(the known-bad driver warning)/' || true
fi
