#!/usr/bin/env bash
# install-deps.sh [--demo]
# Installs what ncclguard needs on Debian 12. With --demo, only what building it and running
# scripts/demo-run.sh need; by default also what the tests and the static checks add (Redis,
# strace, Lmod, clang, its sanitizer runtimes and its tools). Idempotent and non-interactive:
# packages already present are not touched, and apt's lists are refreshed only when something is
# missing.
set -euo pipefail

demo=0
case ${1:-} in
  --demo) demo=1 ;;
  "") ;;
  *) echo "usage: install-deps.sh [--demo]" >&2; exit 2 ;;
esac

# To configure and build (CMake asks for Catch2 and Google Benchmark even when only the library is
# built), and python3 for the demo's reading of a dump.
packages=(
  build-essential cmake binutils python3
  libspdlog-dev libfmt-dev libabsl-dev catch2 nlohmann-json3-dev libsimdjson-dev libcli11-dev
  libbenchmark-dev
  libunwind-dev libdw-dev
  libhiredis-dev
)
if ((!demo)); then
  # The tests (a Redis board), the benchmarks (strace counts the job directory's file operations,
  # valgrind's callgrind the instructions per collective), clang's ThreadSanitizer build (its
  # sanitizer runtimes are only recommended by clang) and the static checks
  # (scripts/check-static.sh); Prometheus's own parser of the metrics files, and a browser that
  # renders the report page.
  packages+=(redis-server strace valgrind clang libclang-rt-dev clang-format clang-tidy python3-prometheus-client
             chromium)
  # Lmod, for the tests of the modulefiles. Debian's Lmod and Environment Modules conflict: a
  # machine that has the latter keeps it, and those tests are skipped there.
  if ! dpkg-query -W -f='${Status}' environment-modules 2>/dev/null | grep -q "install ok installed"; then
    packages+=(lmod)
  fi
fi

sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "ncclguard: installing ${missing[*]}" >&2
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# A clang-tidy that has misc-include-cleaner (clang-tidy 17 and later), where Debian offers one;
# without it scripts/check-static.sh runs Debian 12's clang-tidy 14, which lacks that check.
if ((!demo)) && ! command -v clang-tidy-19 >/dev/null 2>&1 && apt-cache show clang-tidy-19 >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends clang-tidy-19 ||
    echo "ncclguard: clang-tidy-19 could not be installed; using clang-tidy" >&2
fi

# NCCL and the CUDA toolkit are not Debian packages: they come with the machine
# (the toolkit directory beside nvcc holds include/nccl.h and lib/libnccl.so.2).
# Only their headers are used at build time; say clearly when they are absent.
if ! command -v nvcc >/dev/null 2>&1 && [[ -z "${CUDAToolkit_ROOT:-}" && ! -d /usr/local/cuda ]]; then
  echo "ncclguard: the CUDA toolkit was not found (no nvcc on PATH, no /usr/local/cuda);" \
       "install it or set CUDAToolkit_ROOT, and NCCL_ROOT for nccl.h" >&2
  exit 1
fi
