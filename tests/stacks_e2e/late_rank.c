/* A rank of a job that all-reduces in a loop, written as a user's own C program would be. After
 * step LATE_STEP, rank LATE_RANK writes a checkpoint shard and blocks in a read that never returns
 * (a stuck file system, stood in for by a pipe nobody writes). RANK and WORLD_SIZE come from the
 * launcher; every rank derives the same unique id from NCCL_COMM_ID. */
#include <cuda.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void check_cuda(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) {
    fprintf(stderr, "%s failed: %d\n", call, (int)result);
    exit(EXIT_FAILURE);
  }
}

static void check_nccl(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) {
    fprintf(stderr, "%s failed: %s\n", call, ncclGetErrorString(result));
    exit(EXIT_FAILURE);
  }
}

static int env_int(const char* name, int fallback) {
  const char* value = getenv(name);
  return value != NULL ? atoi(value) : fallback;
}

/* noinline: the test looks for this very frame in the late rank's stack. */
static __attribute__((noinline)) void write_checkpoint_shard(int rank) {
  int fds[2];
  char byte;
  if (pipe(fds) != 0) exit(EXIT_FAILURE);
  fprintf(stderr, "rank %d: writing its checkpoint shard\n", rank);
  while (read(fds[0], &byte, 1) <= 0) {
  }
}

int main(void) {
  const int rank = env_int("RANK", 0);
  const int nranks = env_int("WORLD_SIZE", 1);
  const int late_rank = env_int("LATE_RANK", 1);
  const int late_step = env_int("LATE_STEP", 10);
  const int steps = 1000;
  const size_t count = 1024;
  CUdevice device;
  CUcontext context;
  CUstream stream;
  CUdeviceptr buffer;
  ncclUniqueId id;
  ncclComm_t comm;

  check_cuda(cuInit(0), "cuInit");
  check_cuda(cuDeviceGet(&device, rank), "cuDeviceGet");  /* one GPU per rank */
  check_cuda(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  check_cuda(cuCtxSetCurrent(context), "cuCtxSetCurrent");
  check_cuda(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  check_cuda(cuMemAlloc(&buffer, count * sizeof(float)), "cuMemAlloc");
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  check_nccl(ncclCommInitRank(&comm, nranks, id, rank), "ncclCommInitRank");
  fprintf(stderr, "rank %d/%d: pid %d\n", rank, nranks, (int)getpid());
  for (int step = 1; step <= steps; ++step) {
    check_nccl(ncclAllReduce((void*)buffer, (void*)buffer, count, ncclFloat32, ncclSum, comm, stream),
               "ncclAllReduce");
    check_cuda(cuStreamSynchronize(stream), "cuStreamSynchronize");
    if (rank == late_rank && step == late_step) write_checkpoint_shard(rank);
  }
  check_nccl(ncclCommDestroy(comm), "ncclCommDestroy");
  return 0;
}
