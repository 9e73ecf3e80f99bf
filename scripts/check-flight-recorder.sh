#!/usr/bin/env bash
# PyTorch's own Flight Recorder analyzer (torchfrtrace, unmodified, from Debian's python3-torch) on
# the Flight Recorder files that ncclguard writes for jobs on the emulator.
#
#   scripts/check-flight-recorder.sh [--chroot DIR] [BUILD_DIR]
#
# BUILD_DIR (default build/) holds a built tree. DIR (default $NCCLGUARD_TORCH_CHROOT, else
# /var/tmp/ncclguard-torch-sid) is a Debian sid chroot with python3-torch: made with debootstrap
# from deb.debian.org when it has no torchfrtrace yet (about 1 GB downloaded), reused otherwise.
# Needs root (debootstrap, chroot); exits 77 (skipped) without it. For each scene it runs the job
# under libncclguard.so, writes the files with `ncclguard analyze --flight-recorder` (and at dump
# time with NCCLGUARD_FLIGHT_RECORDER_DIR), runs torchfrtrace on them inside the chroot, prints what
# it said and checks that it names what it should. Exits 0 when every scene passed.
set -euo pipefail
if ((EUID != 0)); then
  echo "check-flight-recorder: skipped: needs root (debootstrap and chroot)" >&2
  exit 77
fi
cd "$(dirname "$0")/.."
root=${NCCLGUARD_TORCH_CHROOT:-/var/tmp/ncclguard-torch-sid}
if [[ ${1:-} == --chroot ]]; then
  root=$2
  shift 2
fi
build=$(cd "${1:-build}" && pwd)
job_script=$PWD/tests/flight_recorder/fr_job.py

# Debian's sid moves daily; a mirror's Release file may be past its Valid-Until on a machine whose
# clock runs ahead. The signatures are still checked.
apt_options=(-o Acquire::Check-Valid-Until=false -o Dpkg::Use-Pty=0)
if [[ ! -x $root/usr/bin/torchfrtrace ]]; then
  echo "== making a Debian sid chroot with python3-torch in $root"
  command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap
  [[ -x $root/usr/bin/apt-get ]] || debootstrap --variant=minbase sid "$root" http://deb.debian.org/debian
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  chroot "$root" apt-get "${apt_options[@]}" update
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get "${apt_options[@]}" install -y \
    --no-install-recommends python3-torch python3-tabulate
fi
mounted=0
if ! mountpoint -q "$root/proc"; then
  mount -t proc proc "$root/proc"
  mounted=1
fi
work=$(mktemp -d "$root/tmp/ncclguard-fr.XXXXXX")
inside=${work#"$root"}
cleanup() {
  rm -rf "$work"
  if ((mounted)); then umount "$root/proc"; fi
}
trap cleanup EXIT
echo "== $(chroot "$root" python3 -c 'import torch; print("torch", torch.__version__)')"

failures=0
# launch SECONDS N COMMAND...: N ranks (RANK, WORLD_SIZE set), killed together after SECONDS.
launch() {
  local seconds=$1 n=$2 pids=() rank
  shift 2
  for ((rank = 0; rank < n; rank++)); do RANK=$rank WORLD_SIZE=$n "$@" & pids+=($!); done
  local end=$((SECONDS + seconds))
  while ((SECONDS < end)) && kill -0 "${pids[@]}" 2>/dev/null; do sleep 0.2; done
  kill -KILL "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
# guarded NAME [VARIABLE=VALUE...] COMMAND...: COMMAND (a program or launch) under ncclguard on
# the emulator, job id NAME; then the files of `ncclguard analyze --flight-recorder` in
# $work/NAME-fr, those written at dump time in $work/NAME-own.
guarded() {
  local name=$1
  shift
  (
    export LD_LIBRARY_PATH="$build/emulator/lib" LD_PRELOAD="$build/lib/libncclguard.so"
    export NCCLGUARD_DUMP_DIR="$work/jobs" NCCLGUARD_JOB_ID="$name" NCCLGUARD_TIMEOUT=2
    export NCCLGUARD_STATUS_INTERVAL=0.2 NCCLGUARD_FLIGHT_RECORDER_DIR="$work/$name-own"
    export NCCL_COMM_ID="127.0.0.1:$((20000 + ($$ + RANDOM) % 20000))"
    while [[ $1 == *=* ]]; do
      export "${1?}"
      shift
    done
    "$@"
  ) >"$work/$name.log" 2>&1 || true
  "$build/bin/ncclguard" analyze "$work/jobs/$name" --flight-recorder "$work/$name-fr" >"$work/$name.analyze" || true
}
# analyzer DIR [OPTIONS...]: torchfrtrace on DIR inside the chroot, as a user types it; its output
# in $said, its exit status in $status.
analyzer() {
  local dir=$1
  shift
  echo "\$ torchfrtrace ${*:+$* }${dir##*/}"
  status=0
  said=$(chroot "$root" torchfrtrace "$@" "$inside/$dir" 2>&1) || status=$?
  { grep -v 'does not have a coalesced end' <<<"$said" || true; } | head -n 40 | sed 's/^/  /'
}
expect() {
  if ((status != 0)) || grep -q Traceback <<<"$said"; then
    echo "FAILED: torchfrtrace exited $status" >&2
    failures=$((failures + 1))
  fi
  for text in "$@"; do
    if ! grep -qF -- "$text" <<<"$said"; then
      echo "FAILED: torchfrtrace did not say: $text" >&2
      failures=$((failures + 1))
    fi
  done
}
refuse() {
  for text in "$@"; do
    if grep -qF -- "$text" <<<"$said"; then
      echo "FAILED: torchfrtrace said: $text" >&2
      failures=$((failures + 1))
    fi
  done
}

echo "== uneven data: rank 3 of 4 stops after step 20; the others wait in AllReduce #22"
guarded uneven "$build/examples/train_loop" --ranks 4 --steps 60 --stop-early 3:20 --timeout 10
analyzer uneven-fr
expect "Not all ranks joining collective, sequence number: 22" "collective: nccl:all_reduce" "missing ranks: {3}"
analyzer uneven-fr -j
expect "all_reduce(input_sizes=[[1024]], state=scheduled)"
# At dump time: rank 3 exits normally and dumps nothing, unless every process dumps as it exits.
guarded uneven-exit NCCLGUARD_DUMP_ON_EXIT=1 "$build/examples/train_loop" --ranks 4 --steps 60 --stop-early 3:20 \
  --timeout 10
analyzer uneven-exit-own
expect "Not all ranks joining collective, sequence number: 22" "missing ranks: {3}"

echo "== a healthy job: 4 ranks, 30 steps, every rank exits normally"
guarded healthy "$build/examples/train_loop" --ranks 4 --steps 30 --timeout 30
analyzer healthy-fr
expect
refuse "missing ranks" "has errors" "MISMATCH" "Missing dump files"

echo "== a desync: rank 2 all-reduces 1,048,576 more elements in step 12; then waits in #31 alone"
guarded desync "$build/examples/train_loop" --ranks 4 --steps 30 --desync 2:12 --timeout 10
analyzer desync-fr
# Ranks 0, 1 and 3 exited normally and left their last operation only (their status files): the
# analyzer sees #31 completed there and scheduled on rank 2.
expect "Collective sequence number: 31 has errors" "Culprit rank 2" "COLLECTIVE_STATE_MISMATCH"

echo "== a 2-stage pipeline through ctypes: stage 1 never posts its receive of step 6"
guarded pipeline SCENE=pipeline LATE_RANK=1 LATE_STEP=5 launch 12 2 python3 "$job_script"
for files in pipeline-fr pipeline-own; do
  analyzer "$files"
  expect "collective: nccl:send 0->1" "missing ranks: {1}" "pipeline_step at $job_script"
done

echo "== 4 pipeline stages, each stage's receive and send in one block, then an AllReduce"
guarded stages SCENE=stages LATE_RANK=2 LATE_STEP=5 launch 12 4 python3 "$job_script"
analyzer stages-fr
# The first step's blocks and its AllReduce match on every rank (the analyzer's matching of the
# second step's blocks fails on any pipeline: it pops as many entries of every rank's block as the
# first rank's holds, and the first stage's block is shorter).
expect "Match"
refuse "missing ranks: {1, 2}"

echo "== FSDP-like steps: two AllReduces in one block, AllGather, ReduceScatter; rank 1's #19 hangs"
guarded buckets NCCLEMU_FAULTS=hang:rank=1,seq=19 SCENE=buckets STEPS=20 launch 10 4 python3 "$job_script"
analyzer buckets-fr
expect
refuse "MISMATCH" "missing ranks" "has errors" "not a supported operation"
analyzer buckets-fr -j
expect "all_gather(input_sizes=[[1024]], state=scheduled)" "reduce_scatter(input_sizes=[[4096]]"

echo "== 2 processes that drive 2 devices each, as JAX does; process 1 stops after step 5"
guarded devices SCENE=devices LOCAL_DEVICES=2 LATE_RANK=1 LATE_STEP=5 launch 12 2 python3 "$job_script"
for files in devices-fr devices-own; do
  analyzer "$files"
  expect "Not all ranks joining collective, sequence number: 6" "missing ranks: {2, 3}" "world size: 4" \
    "run_devices at $job_script"
done

if ((failures > 0)); then
  echo "check-flight-recorder: $failures checks failed; the scenes' files are kept in $work" >&2
  trap - EXIT
  if ((mounted)); then umount "$root/proc"; fi
  exit 1
fi
echo "check-flight-recorder: PyTorch's analyzer read every scene as expected"
