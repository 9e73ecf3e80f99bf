#!/usr/bin/env bash
# Installs what is needed, builds ncclguard, and runs every test: the full suite, then the core
# and shim tests again under AddressSanitizer+UndefinedBehaviorSanitizer and ThreadSanitizer, then
# the static checks (formatting, clang's thread-safety analysis, clang-tidy on changed files).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

scripts/install-deps.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$jobs"
(cd build && ctest --output-on-failure -j "$jobs")

# The sanitizer builds compile only the core, the shim and their tests (no emulator, no examples).
for sanitizer in address,undefined thread; do
  dir="build-${sanitizer%%,*}"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DNCCLGUARD_SANITIZE="$sanitizer"
  cmake --build "$dir" -j "$jobs" --target sanitized_tests
  (cd "$dir" && ctest --output-on-failure -j "$jobs" -L sanitized)
done

scripts/check-static.sh
