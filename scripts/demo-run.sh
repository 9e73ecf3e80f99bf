#!/usr/bin/env bash
# The demo, on an already built tree (default: build/). scripts/demo.sh installs, builds, runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
guard="$PWD/$build/shim/libncclguard.so"
emulator="$PWD/$build/emulator/lib"
real_nccl=$(dirname "$(grep -m1 '^NCCL_LIBRARY:' "$build/CMakeCache.txt" | cut -d= -f2-)")

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "A two-rank training job on the CPU emulator of CUDA and NCCL, loading NCCL the way Paddle"
say "does (dlopen + dlsym), with ncclguard preloaded. ncclguard's lines say which NCCL serves"
say "each communicator; the job's own lines give each rank's checksum."
LD_LIBRARY_PATH="$emulator" LD_PRELOAD="$guard" NCCLGUARD_LOG_LEVEL=info \
  "$build/examples/train_loop" --ranks 2 --steps 20 --nccl-loader dlopen

say "The same calls, one line each (NCCLGUARD_LOG_LEVEL=debug), for one rank of a shorter job:"
LD_LIBRARY_PATH="$emulator" LD_PRELOAD="$guard" NCCLGUARD_LOG_LEVEL=debug \
  "$build/examples/train_loop" --ranks 2 --steps 2 --nccl-loader linked 2>&1 |
  grep -E '^\S+:[0-9]+:[0-9]+ \[?0?\]? ?ncclguard' | head -n 12 || true

if [[ -e "$real_nccl/libnccl.so.2" ]]; then
  say "The real NCCL of the CUDA toolkit ($real_nccl), through Python ctypes. Without a GPU it"
  say "fails ncclCommInitRank with ncclUnhandledCudaError; ncclguard forwards exactly that."
  LD_LIBRARY_PATH="$real_nccl" LD_PRELOAD="$guard" NCCLGUARD_LOG_LEVEL=debug python3 - <<'PY'
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
