"""A rank of a small job that reaches CUDA and NCCL through ctypes, for the Flight Recorder scenes of
scripts/check-flight-recorder.sh. RANK and WORLD_SIZE come from the launcher; every rank derives the
same unique id from NCCL_COMM_ID. SCENE picks what each step does:

  pipeline   a pipeline's forward pass: each rank receives its activations from the rank before it
             and sends its own to the rank after it (ncclRecv, ncclSend), then the ranks all-reduce
             their gradients. After step LATE_STEP, rank LATE_RANK loads its next batch for ever and
             never posts its receive.
  stages     the same pipeline with each rank's receive and send in one ncclGroupStart/End block
             (as batch_isend_irecv issues them); rank LATE_RANK stops the same way.
  buckets    two gradient buckets all-reduced in one ncclGroupStart/End block, then an AllGather
             and a ReduceScatter (an FSDP-like step). A fault of the emulator (NCCLEMU_FAULTS) stops
             a link or a rank.
  ring       an exchange with both neighbours in one block, then the buckets' step.
  devices    LOCAL_DEVICES devices per process, as JAX drives them: one communicator spans every
             device of the job (global rank: process × LOCAL_DEVICES + device), each process
             initialises its devices' ranks and all-reduces on each in one block. After step
             LATE_STEP, process LATE_RANK loads its next batch for ever.
"""
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from nccl_ctypes import NCCL_BFLOAT16, NCCL_FLOAT32, NCCL_SUM, UniqueId, check, cuda, nccl  # noqa: E402

# More than the emulator's (and NCCL's) per-peer buffer: a send completes only once it is received.
COUNT = 1 << 20


class Job:
    def __init__(self):
        self.rank = int(os.environ["RANK"])
        self.nranks = int(os.environ["WORLD_SIZE"])
        if os.environ.get("SCENE") == "devices":
            return
        device = ctypes.c_int()
        context = ctypes.c_void_p()
        self.stream = ctypes.c_void_p()
        check(cuda.cuInit(0), "cuInit")
        check(cuda.cuDeviceGet(ctypes.byref(device), self.rank), "cuDeviceGet")
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        check(cuda.cuStreamCreate(ctypes.byref(self.stream), 1), "cuStreamCreate")
        self.buffers = [self.alloc(COUNT * 4 * self.nranks) for _ in range(3)]
        unique_id = UniqueId()
        self.comm = ctypes.c_void_p()
        check(nccl.ncclGetUniqueId(ctypes.byref(unique_id)), "ncclGetUniqueId")
        check(nccl.ncclCommInitRank(ctypes.byref(self.comm), self.nranks, unique_id, self.rank), "ncclCommInitRank")
        print(f"rank {self.rank}/{self.nranks}: pid {os.getpid()}", file=sys.stderr, flush=True)

    @staticmethod
    def alloc(size):
        pointer = ctypes.c_uint64()
        check(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)), "cuMemAlloc")
        return ctypes.c_void_p(pointer.value)

    def send(self, peer, count=COUNT):
        check(nccl.ncclSend(self.buffers[0], ctypes.c_size_t(count), NCCL_FLOAT32, peer, self.comm, self.stream),
              "ncclSend")

    def recv(self, peer, count=COUNT):
        check(nccl.ncclRecv(self.buffers[1], ctypes.c_size_t(count), NCCL_FLOAT32, peer, self.comm, self.stream),
              "ncclRecv")

    def all_reduce(self, buffer, count, dtype=NCCL_FLOAT32):
        check(nccl.ncclAllReduce(buffer, buffer, ctypes.c_size_t(count), dtype, NCCL_SUM, self.comm, self.stream),
              "ncclAllReduce")

    def all_gather(self, count):
        check(nccl.ncclAllGather(self.buffers[0], self.buffers[2], ctypes.c_size_t(count), NCCL_BFLOAT16, self.comm,
                                 self.stream), "ncclAllGather")

    def reduce_scatter(self, count):
        check(nccl.ncclReduceScatter(self.buffers[2], self.buffers[0], ctypes.c_size_t(count), NCCL_BFLOAT16,
                                     NCCL_SUM, self.comm, self.stream), "ncclReduceScatter")

    def synchronize(self):
        check(cuda.cuStreamSynchronize(self.stream), "cuStreamSynchronize")


def load_batch(job, step):
    if job.rank == int(os.environ.get("LATE_RANK", "-1")) and step > int(os.environ.get("LATE_STEP", "0")):
        print(f"rank {job.rank}: loading the batch of step {step}", file=sys.stderr, flush=True)
        time.sleep(600)  # the loader that never returns


def pipeline_step(job, step):
    load_batch(job, step)
    if job.rank > 0:
        job.recv(job.rank - 1)
    if job.rank < job.nranks - 1:
        job.send(job.rank + 1)
    job.synchronize()
    job.all_reduce(job.buffers[2], 4096)
    job.synchronize()


def stages_step(job, step):
    load_batch(job, step)
    check(nccl.ncclGroupStart(), "ncclGroupStart")
    if job.rank > 0:
        job.recv(job.rank - 1)
    if job.rank < job.nranks - 1:
        job.send(job.rank + 1)
    check(nccl.ncclGroupEnd(), "ncclGroupEnd")
    job.synchronize()
    job.all_reduce(job.buffers[2], 4096)
    job.synchronize()


def exchange(job):
    check(nccl.ncclGroupStart(), "ncclGroupStart")
    job.send((job.rank + 1) % job.nranks)
    job.recv((job.rank - 1) % job.nranks)
    check(nccl.ncclGroupEnd(), "ncclGroupEnd")


def buckets_step(job, step):
    load_batch(job, step)
    check(nccl.ncclGroupStart(), "ncclGroupStart")
    job.all_reduce(job.buffers[1], 4096)
    job.all_reduce(job.buffers[2], 2048, NCCL_BFLOAT16)
    check(nccl.ncclGroupEnd(), "ncclGroupEnd")
    job.all_gather(1024)
    job.reduce_scatter(1024)
    job.synchronize()


def ring_step(job, step):
    exchange(job)
    job.synchronize()
    buckets_step(job, step)


class Device:
    """One device of a process that drives several, with its rank of the job's communicator."""

    def __init__(self, index, rank):
        self.rank = rank
        device = ctypes.c_int()
        context = ctypes.c_void_p()
        self.stream = ctypes.c_void_p()
        self.comm = ctypes.c_void_p()
        check(cuda.cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
        self.context = context
        check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        check(cuda.cuStreamCreate(ctypes.byref(self.stream), 1), "cuStreamCreate")
        self.buffer = Job.alloc(4096 * 4)


def run_devices(job):
    local = int(os.environ.get("LOCAL_DEVICES", "2"))
    check(cuda.cuInit(0), "cuInit")
    devices = [Device(job.rank * local + d, job.rank * local + d) for d in range(local)]
    unique_id = UniqueId()
    check(nccl.ncclGetUniqueId(ctypes.byref(unique_id)), "ncclGetUniqueId")
    check(nccl.ncclGroupStart(), "ncclGroupStart")
    for device in devices:
        check(cuda.cuCtxSetCurrent(device.context), "cuCtxSetCurrent")
        check(nccl.ncclCommInitRank(ctypes.byref(device.comm), job.nranks * local, unique_id, device.rank),
              "ncclCommInitRank")
    check(nccl.ncclGroupEnd(), "ncclGroupEnd")
    print(f"process {job.rank}: ranks {[d.rank for d in devices]}, pid {os.getpid()}", file=sys.stderr, flush=True)
    for step in range(1, int(os.environ.get("STEPS", "20")) + 1):
        load_batch(job, step)
        check(nccl.ncclGroupStart(), "ncclGroupStart")
        for device in devices:
            check(nccl.ncclAllReduce(device.buffer, device.buffer, ctypes.c_size_t(4096), NCCL_FLOAT32, NCCL_SUM,
                                     device.comm, device.stream), "ncclAllReduce")
        check(nccl.ncclGroupEnd(), "ncclGroupEnd")
        for device in devices:
            check(cuda.cuStreamSynchronize(device.stream), "cuStreamSynchronize")
    for device in devices:
        check(nccl.ncclCommDestroy(device.comm), "ncclCommDestroy")
    print(f"process {job.rank}: done", file=sys.stderr, flush=True)


def main():
    job = Job()
    if os.environ.get("SCENE") == "devices":
        run_devices(job)
        return
    step_of = {"pipeline": pipeline_step, "stages": stages_step, "buckets": buckets_step,
               "ring": ring_step}[os.environ.get("SCENE", "pipeline")]
    for step in range(1, int(os.environ.get("STEPS", "20")) + 1):
        step_of(job, step)
    check(nccl.ncclCommDestroy(job.comm), "ncclCommDestroy")
    print(f"rank {job.rank}: done", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
