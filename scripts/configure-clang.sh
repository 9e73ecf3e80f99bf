#!/usr/bin/env bash
# scripts/configure-clang.sh [CMAKE_ARGUMENTS...]
# Configures build-clang-thread, the one clang build: ThreadSanitizer's build of the core, the shim
# and their tests (scripts/test.sh builds its target sanitized_tests and runs the tests labelled
# `sanitized`), whose compile is also clang's thread-safety analysis of ncclguard's own code
# (-Wthread-safety as errors, CMakeLists.txt) and whose compile database serves clang-tidy and
# scripts/check-static.sh. At -O0 with -g1, as the other sanitizer build (scripts/test.sh says why).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-clang-thread -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DNCCLGUARD_SANITIZE=thread -DCMAKE_C_FLAGS_DEBUG=-g1 -DCMAKE_CXX_FLAGS_DEBUG=-g1 "$@"
