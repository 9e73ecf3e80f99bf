#!/usr/bin/env bash
# Installs what is needed, builds what the demo runs, and shows ncclguard at work. The tests are
# not built here (scripts/test.sh builds and runs them): building them first kept a fresh machine
# silent for minutes before the demo began.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
log=build/demo-build.log

echo "demo: checking what the build and the demo need, installing what is missing (scripts/install-deps.sh --demo)"
scripts/install-deps.sh --demo

echo "demo: configuring build/"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

# What scripts/demo-run.sh runs: the library, the command (`ncclguard analyze`, `ncclguard run`),
# the emulator's libcuda, libcudart, libnccl and libnvidia-ml, train_loop; and the program built
# by nvcc for its last part, where CMake found nvcc (demo-run.sh skips that part without it).
targets=(ncclguard ncclguard_cli emu_cuda emu_cudart emu_nccl emu_nvml train_loop)
if grep -q '^NCCLGUARD_NVCC:FILEPATH=/' build/CMakeCache.txt; then targets+=(cudart_nccl_program); fi

# One line per target built, as it is built (each target's dependencies say "Built target" again:
# said once), so that a long build is seen to progress; the compiler's output goes to the log, its
# end shown on failure. Read by bash, line by line: awk (Debian's mawk) reads a pipe in blocks, which
# held every line back until the build ended.
progress() {
  local line
  local -A seen=()
  while IFS= read -r line; do
    [[ $line =~ ^\[\ *[0-9]+%\]\ Built\ target\ (.+)$ ]] || continue
    [[ -z ${seen[${BASH_REMATCH[1]}]:-} ]] || continue
    seen[${BASH_REMATCH[1]}]=1
    echo "demo:   built ${BASH_REMATCH[1]}"
  done
}

start=$(date +%s)
echo "demo: building the ${#targets[@]} targets the demo needs with $jobs jobs (${targets[*]}); the log: $log"
if ! cmake --build build -j "$jobs" --target "${targets[@]}" 2>&1 | tee "$log" | progress; then
  tail -n 40 "$log" >&2
  echo "demo: the build failed; the whole log is $log" >&2
  exit 1
fi
echo "demo: built in $(($(date +%s) - start)) s"

echo "demo: running the demo (scripts/demo-run.sh build)"
exec scripts/demo-run.sh build
