"""A rank of a job that all-reduces in a loop, reaching CUDA and NCCL through ctypes (as JAX, vLLM
and Python tools do). After step LATE_STEP, rank LATE_RANK saves a checkpoint that takes for ever.
RANK and WORLD_SIZE come from the launcher; every rank derives the same unique id from
NCCL_COMM_ID."""
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from nccl_ctypes import NCCL_FLOAT32, NCCL_SUM, UniqueId, check, cuda, nccl  # noqa: E402

COUNT = 1024


def save_checkpoint(step):
    print(f"rank {os.environ['RANK']}: saving the checkpoint of step {step}", file=sys.stderr, flush=True)
    time.sleep(600)  # the save that never ends


def main():
    rank = int(os.environ["RANK"])
    nranks = int(os.environ["WORLD_SIZE"])
    late_rank = int(os.environ.get("LATE_RANK", "1"))
    late_step = int(os.environ.get("LATE_STEP", "10"))
    device = ctypes.c_int()
    context = ctypes.c_void_p()
    stream = ctypes.c_void_p()
    buffer = ctypes.c_uint64()
    check(cuda.cuInit(0), "cuInit")
    check(cuda.cuDeviceGet(ctypes.byref(device), rank), "cuDeviceGet")  # one GPU per rank
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    check(cuda.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    check(cuda.cuMemAlloc_v2(ctypes.byref(buffer), ctypes.c_size_t(COUNT * 4)), "cuMemAlloc")
    unique_id = UniqueId()
    comm = ctypes.c_void_p()
    check(nccl.ncclGetUniqueId(ctypes.byref(unique_id)), "ncclGetUniqueId")
    check(nccl.ncclCommInitRank(ctypes.byref(comm), nranks, unique_id, rank), "ncclCommInitRank")
    print(f"rank {rank}/{nranks}: pid {os.getpid()}", file=sys.stderr, flush=True)
    data = ctypes.c_void_p(buffer.value)
    for step in range(1, 1001):
        check(nccl.ncclAllReduce(data, data, ctypes.c_size_t(COUNT), NCCL_FLOAT32, NCCL_SUM, comm, stream),
              "ncclAllReduce")
        check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
        if rank == late_rank and step == late_step:
            save_checkpoint(step)
    check(nccl.ncclCommDestroy(comm), "ncclCommDestroy")


if __name__ == "__main__":
    main()
