#!/usr/bin/env bash
# Installs what is needed, builds ncclguard, and runs its tests, by tier (cmake/TestTiers.cmake):
#
#   scripts/test.sh --quick   unit and ABI tests only: the edit loop, minutes
#   scripts/test.sh           what CI runs: the quick and standard tiers, then the core and shim
#                             tests again under AddressSanitizer+UndefinedBehaviorSanitizer and
#                             ThreadSanitizer, then the static checks (sizes, formatting, clang's
#                             thread-safety analysis, clang-tidy on changed files)
#   scripts/test.sh --full    the same with the full tier too (the end-to-end suites on Redis)
#
# Prints at the end how long each stage took.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# Tests run two per core: most end-to-end tests wait on stall timeouts and status intervals, not
# on the CPU (the default tier's tests used 246 CPU seconds in 549 s at one per core on 2 cores),
# and the ASan+UBSan ones on Redis servers and threads (35 CPU seconds in 49 s). Three per core
# was faster still (223-238 s) but failed 2 of 328 tests once on a loaded machine: tests that wait
# for a watchdog round. ThreadSanitizer's tests keep one per core: it slows their threads most.
test_jobs=$((jobs * 2))
tier=default
case "${1:-}" in
  --quick) tier=quick ;;
  --full) tier=full ;;
  "") ;;
  *)
    echo "usage: $0 [--quick | --full]" >&2
    exit 2
    ;;
esac

stages=()
stage_start=$SECONDS
current=""
# stage <name>: ends the stage under way (its time is kept) and starts the next.
stage() {
  [[ -n $current ]] && stages+=("$(printf '%6d s  %s' $((SECONDS - stage_start)) "$current")")
  current=$1
  stage_start=$SECONDS
  echo "== $1"
}
report_stages() {
  local status=$? outcome=""
  ((status == 0)) || outcome=" (failed)"
  [[ -n $current ]] && stages+=("$(printf '%6d s  %s%s' $((SECONDS - stage_start)) "$current" "$outcome")")
  echo "== time per stage (tier $tier)"
  printf '%s\n' "${stages[@]}"
  printf '%6d s  in all\n' "$SECONDS"
}
trap 'report_stages' EXIT

stage "dependencies"
scripts/install-deps.sh

# A compiler cache where one is installed: a clean clone's first run gains nothing from it, the
# runs after it recompile only what changed. Precompiled headers need the sloppiness below.
cache=()
if command -v ccache >/dev/null 2>&1; then
  cache=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros}"
fi

stage "build (RelWithDebInfo)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cache[@]}"
cmake --build build -j "$jobs"

case $tier in
  quick) selection=(-L '^quick$') ;;
  default) selection=(-LE '^full$') ;;
  full) selection=() ;;
esac
stage "tests, tier $tier"
(cd build && ctest --output-on-failure -j "$test_jobs" "${selection[@]}")
[[ $tier == quick ]] && exit 0

# The sanitizer builds compile only the core, the shim and their tests (no emulator, no examples),
# at -O0 (-O1 would make their tests faster but their compiles 40 to 80 % slower) with -g1: line
# tables, enough for the file and line of every frame of a sanitizer's report, without the
# variables' descriptions (6 % of the ASan+UBSan build's CPU time).
# sanitized <dir> <test jobs>: builds the sanitizer build configured in <dir> and runs its tests.
sanitized() {
  cmake --build "$1" -j "$jobs" --target sanitized_tests
  (cd "$1" && ctest --output-on-failure -j "$2" -L sanitized)
}
stage "sanitizer build and tests (address,undefined)"
cmake -S . -B build-address -DCMAKE_BUILD_TYPE=Debug -DNCCLGUARD_SANITIZE=address,undefined "${cache[@]}" \
  -DCMAKE_C_FLAGS_DEBUG=-g1 -DCMAKE_CXX_FLAGS_DEBUG=-g1
sanitized build-address "$test_jobs"
# ThreadSanitizer's is the one clang build (scripts/configure-clang.sh): its compile is also the
# thread-safety analysis, and its compile commands serve the static checks below.
stage "sanitizer build and tests (thread, clang)"
scripts/configure-clang.sh "${cache[@]}"
sanitized build-clang-thread "$jobs"

stage "static checks"
scripts/check-static.sh
