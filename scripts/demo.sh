#!/usr/bin/env bash
# Installs what is needed, builds ncclguard, and shows it at work.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null

exec scripts/demo-run.sh build
