// Groups, argument checking and launching: every operation becomes part of a task that runs as a
// host function on the user's stream, in order with the rest of that stream's work.
#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "api.h"
#include "comm.h"
#include "debug.h"

namespace ncclemu {
namespace {

struct PendingOperation {
  std::shared_ptr<CommCore> core;
  Operation operation;
};

struct GroupState {
  int depth = 0;
  std::vector<PendingOperation> operations;
  std::vector<Job> jobs;
};

thread_local GroupState t_group;

ncclResult_t runJob(Job& job) {
  const ncclResult_t result = job.run();
  job.core->setAsyncResult(result);
  return result;
}

// Jobs of one group (e.g. the inits of all ranks one thread drives) wait for each other at the
// rendezvous, so they run concurrently.
ncclResult_t runJobs(std::vector<Job> jobs) {
  const bool all_blocking =
      std::all_of(jobs.begin(), jobs.end(), [](const Job& job) { return job.core->blocking; });
  if (!all_blocking) {
    for (Job& job : jobs) std::thread([job]() mutable { runJob(job); }).detach();
    return ncclInProgress;
  }
  if (jobs.size() == 1) return runJob(jobs[0]);
  std::vector<ncclResult_t> results(jobs.size(), ncclSuccess);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < jobs.size(); ++i) threads.emplace_back([&, i] { results[i] = runJob(jobs[i]); });
  for (std::thread& thread : threads) thread.join();
  for (ncclResult_t result : results) {
    if (result != ncclSuccess) return result;
  }
  return ncclSuccess;
}

bool isSpecialStream(CUstream stream) {
  return stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
}

// The legacy and per-thread streams belong to the current context's device; launch them as the
// communicator's device, as NCCL does when one thread drives several GPUs.
ncclResult_t launchHostFunction(CommCore& core, CUstream stream, CUhostFn function, Task* task) {
  CUcontext previous = nullptr;
  const bool switch_context = isSpecialStream(stream) && core.context &&
                              cuCtxGetCurrent(&previous) == CUDA_SUCCESS && previous != core.context;
  if (switch_context) cuCtxSetCurrent(core.context);
  const CUresult launched = cuLaunchHostFunc(stream, function, task);
  if (switch_context) cuCtxSetCurrent(previous);
  if (launched == CUDA_SUCCESS) return ncclSuccess;
  const char* text = "unknown";
  cuGetErrorString(launched, &text);
  EMU_WARN("Cuda failure '%s' launching on stream %p", text, static_cast<void*>(stream));
  return ncclUnhandledCudaError;
}

// The graph a stream is capturing into, or null when work queued on it runs now.
CUgraph capturingGraph(CUstream stream) {
  if (isSpecialStream(stream)) return nullptr;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = nullptr;
  const CUresult queried =
      cuStreamGetCaptureInfo(stream, &status, nullptr, &graph, nullptr, nullptr, nullptr);
  return queried == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? graph : nullptr;
}

void CUDA_CB deleteCapturedTask(void* task) { delete static_cast<Task*>(task); }

// A captured task runs at every launch of its graph, so the graph owns it (through a user
// object, as NCCL's persistent plans are owned) and frees it when the last graph using it goes.
// The group's other streams take part in the capture, which the driver replays as one sequence.
ncclResult_t launchCapturedTask(const std::shared_ptr<CommCore>& core, std::vector<Operation> operations,
                                CUstream stream, CUgraph graph) {
  auto* task = new Task{core, std::move(operations), 0, false, true};
  CUuserObject owner = nullptr;
  if (cuUserObjectCreate(&owner, task, deleteCapturedTask, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) !=
      CUDA_SUCCESS) {
    delete task;
    EMU_WARN("Cuda failure creating the user object of a captured operation");
    return ncclUnhandledCudaError;
  }
  if (cuGraphRetainUserObject(graph, owner, 1, CU_GRAPH_USER_OBJECT_MOVE) != CUDA_SUCCESS) {
    cuUserObjectRelease(owner, 1);
    EMU_WARN("Cuda failure attaching a captured operation to its graph");
    return ncclUnhandledCudaError;
  }
  // The graph cannot be launched before the capture ends, so the task is read only after this.
  void* kernel_launch = profilerStartKernelLaunch(*core, task->operations, stream);
  const ncclResult_t result = launchHostFunction(*core, stream, runCapturedTask, task);
  profilerStopKernelLaunch(*core, kernel_launch);
  // Without proxy work NCCL hands a captured plan over once, at capture; else at every replay.
  if (result == ncclSuccess && !profilerHasProxyWork(*core, task->operations)) {
    profilerHandOver(*core, task->operations, true);
  }
  return result;
}

ncclResult_t launchTask(const std::shared_ptr<CommCore>& core, std::vector<Operation> operations) {
  std::vector<CUstream> streams;
  for (const Operation& op : operations) {
    if (std::find(streams.begin(), streams.end(), op.stream) == streams.end()) streams.push_back(op.stream);
  }
  const size_t captured =
      std::count_if(streams.begin(), streams.end(), [](CUstream s) { return capturingGraph(s); });
  if (captured != 0 && captured != streams.size()) {
    // A captured task runs at every launch, an uncaptured one once: they cannot wait for each other.
    EMU_WARN("a group's operations must be captured on all their streams or on none (%zu of %zu capture)",
             captured, streams.size());
    return ncclInvalidUsage;
  }
  if (captured != 0)
    return launchCapturedTask(core, std::move(operations), streams[0], capturingGraph(streams[0]));
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(core->mutex);
    ticket = core->next_ticket++;
    core->outstanding_tasks += static_cast<int>(streams.size());
    // Numbered at launch, so the faults' seq= counts what really runs on the communicator.
    for (Operation& op : operations) op.seq = ++core->issued_operations;
  }
  auto* task = new Task{core, std::move(operations), ticket, false, false};
  // The task waits for handed_over, so it is still ours to read and fill until that is set.
  void* kernel_launch = profilerStartKernelLaunch(*core, task->operations, streams[0]);
  ncclResult_t result = launchHostFunction(*core, streams[0], runTask, task);
  const bool launched_first = result == ncclSuccess;
  // Every stream of the group waits for the group's work, as in NCCL.
  for (size_t i = 1; i < streams.size() && result == ncclSuccess; ++i) {
    result = launchHostFunction(*core, streams[i], runTask, new Task{core, {}, ticket, true, true});
  }
  profilerStopKernelLaunch(*core, kernel_launch);
  if (launched_first) {
    profilerHandOver(*core, task->operations, false);
    std::lock_guard<std::mutex> lock(core->mutex);
    task->handed_over = true;
    core->changed.notify_all();
  } else {
    delete task;  // never queued
  }
  if (result != ncclSuccess) {
    // The stream refused the work: this communicator can no longer keep its order.
    core->setAsyncResult(result);
    core->interrupt();
  }
  return result;
}

ncclResult_t launchOperations(std::vector<PendingOperation> pending) {
  std::vector<std::pair<std::shared_ptr<CommCore>, std::vector<Operation>>> per_comm;
  for (PendingOperation& item : pending) {
    auto found = std::find_if(per_comm.begin(), per_comm.end(),
                              [&](const auto& entry) { return entry.first == item.core; });
    if (found == per_comm.end()) {
      per_comm.emplace_back(item.core, std::vector<Operation>{});
      found = per_comm.end() - 1;
    }
    found->second.push_back(item.operation);
  }
  ncclResult_t first_error = ncclSuccess;
  for (auto& [core, operations] : per_comm) {
    const ncclResult_t result = launchTask(core, std::move(operations));
    if (first_error == ncclSuccess) first_error = result;
  }
  return first_error;
}

bool isReducing(OpKind kind) {
  return kind == OpKind::AllReduce || kind == OpKind::Reduce || kind == OpKind::ReduceScatter;
}

ncclResult_t resolveReduction(CommCore& core, ncclRedOp_t op, ncclDataType_t datatype, const char* name,
                              Reduction* reduction) {
  switch (op) {
    case ncclSum:
      reduction->kind = ReduceKind::Sum;
      return ncclSuccess;
    case ncclProd:
      reduction->kind = ReduceKind::Prod;
      return ncclSuccess;
    case ncclMax:
      reduction->kind = ReduceKind::Max;
      return ncclSuccess;
    case ncclMin:
      reduction->kind = ReduceKind::Min;
      return ncclSuccess;
    case ncclAvg:
      if (isFloatingDatatype(datatype)) {
        reduction->kind = ReduceKind::PreMulSum;
        encodeReciprocal(datatype, core.nranks, reduction->scalar);
      } else {
        reduction->kind = ReduceKind::SumPostDiv;
        reduction->divisor = static_cast<uint64_t>(core.nranks);
      }
      return ncclSuccess;
    default:
      break;
  }
  std::lock_guard<std::mutex> lock(core.mutex);
  auto found = core.user_reductions.find(static_cast<int>(op));
  if (found == core.user_reductions.end()) {
    EMU_WARN("%s : invalid reduction operation %d", name, static_cast<int>(op));
    return ncclInvalidArgument;
  }
  if (found->second.datatype != datatype) {
    EMU_WARN("%s : reduction operation %d was created for datatype %d, not %d", name, static_cast<int>(op),
             static_cast<int>(found->second.datatype), static_cast<int>(datatype));
    return ncclInvalidArgument;
  }
  *reduction = found->second.reduction;
  return ncclSuccess;
}

ncclResult_t checkBuffers(const Operation& op, int rank, const char* name) {
  const bool at_root = op.root_or_peer == rank;
  bool needs_send = op.kind != OpKind::Recv;
  bool needs_recv = op.kind != OpKind::Send;
  if (op.kind == OpKind::Broadcast || op.kind == OpKind::Scatter) needs_send = at_root;
  if (op.kind == OpKind::Reduce || op.kind == OpKind::Gather) needs_recv = at_root;
  if (op.count == 0) return ncclSuccess;
  if (needs_send && op.send == nullptr) {
    EMU_WARN("%s : sendbuff is NULL", name);
    return ncclInvalidArgument;
  }
  if (needs_recv && op.recv == nullptr) {
    EMU_WARN("%s : recvbuff is NULL", name);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

}  // namespace

const char* opName(OpKind kind) {
  switch (kind) {
    case OpKind::AllReduce:
      return "AllReduce";
    case OpKind::Broadcast:
      return "Broadcast";
    case OpKind::Reduce:
      return "Reduce";
    case OpKind::AllGather:
      return "AllGather";
    case OpKind::ReduceScatter:
      return "ReduceScatter";
    case OpKind::AlltoAll:
      return "AlltoAll";
    case OpKind::Gather:
      return "Gather";
    case OpKind::Scatter:
      return "Scatter";
    case OpKind::Send:
      return "Send";
    case OpKind::Recv:
      return "Recv";
  }
  return "?";
}

bool insideGroup() { return t_group.depth > 0; }

ncclResult_t launchJob(Job job) {
  if (insideGroup()) {
    t_group.jobs.push_back(std::move(job));
    return ncclSuccess;
  }
  std::vector<Job> jobs;
  jobs.push_back(std::move(job));
  return runJobs(std::move(jobs));
}

void groupStartInternal() { ++t_group.depth; }

namespace {
ncclResult_t endGroup() {
  if (t_group.depth == 0) {
    EMU_WARN("ncclGroupEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  profilerLeaveGroup();
  if (--t_group.depth > 0) return ncclSuccess;
  std::vector<Job> jobs = std::move(t_group.jobs);
  std::vector<PendingOperation> operations = std::move(t_group.operations);
  t_group.jobs.clear();
  t_group.operations.clear();
  ncclResult_t result = jobs.empty() ? ncclSuccess : runJobs(std::move(jobs));
  if (result != ncclSuccess && result != ncclInProgress) return result;
  const ncclResult_t launched = launchOperations(std::move(operations));
  return launched != ncclSuccess ? launched : result;
}
}  // namespace

ncclResult_t groupEndInternal() {
  const ncclResult_t result = endGroup();
  // As NCCL's ncclGroupEndInternal ends: after the launch, whatever happened.
  profilerStopGroupApi();
  return result;
}

ncclResult_t enqueueOperation(ncclComm_t comm, Operation op, ncclRedOp_t reduce_op) {
  const char* name = opName(op.kind);
  ncclResult_t result = ncclSuccess;
  auto core = liveCore(comm, name, &result);
  if (!core) return result;
  LogDeviceScope log_device(core->cuda_dev);
  if ((result = ensureReady(*core)) != ncclSuccess) return result;
  if (core->revoked.load() || core->finalized.load()) {
    EMU_WARN("%s : communicator %p has been %s", name, static_cast<void*>(comm),
             core->revoked.load() ? "revoked" : "finalized");
    return ncclInvalidUsage;
  }
  if (!isValidDatatype(op.datatype)) {
    EMU_WARN("%s : invalid type %d", name, static_cast<int>(op.datatype));
    return ncclInvalidArgument;
  }
  if (isReducing(op.kind) &&
      (result = resolveReduction(*core, reduce_op, op.datatype, name, &op.reduction)) != ncclSuccess) {
    return result;
  }
  const bool rooted = op.kind == OpKind::Broadcast || op.kind == OpKind::Reduce ||
                      op.kind == OpKind::Gather || op.kind == OpKind::Scatter;
  const bool peered = op.kind == OpKind::Send || op.kind == OpKind::Recv;
  if ((rooted || peered) && (op.root_or_peer < 0 || op.root_or_peer >= core->nranks)) {
    EMU_WARN("%s : invalid %s %d (%s should be in the 0..%d range)", name, rooted ? "root" : "peer",
             op.root_or_peer, rooted ? "root" : "peer", core->nranks - 1);
    return ncclInvalidArgument;
  }
  if ((result = checkBuffers(op, core->rank, name)) != ncclSuccess) return result;
  // NCCL wraps each call in a group of its own (ncclEnqueueCheck): the profiler's API events
  // start in it, and the launch comes at its end unless a group of the user's is open.
  profilerEnterApiCall();
  profilerAppendTasks(core, op, t_group.depth + 1, capturingGraph(op.stream) != nullptr);
  profilerLeaveGroup();
  if (insideGroup()) {
    t_group.operations.push_back({core, op});
  } else {
    result = launchOperations({{core, op}});
  }
  profilerStopGroupApi();
  return result;
}

}  // namespace ncclemu

using namespace ncclemu;

namespace {
Operation makeOperation(OpKind kind, const void* send, void* recv, size_t count, ncclDataType_t datatype,
                        int root_or_peer, cudaStream_t stream) {
  return Operation{kind, send, recv, count, datatype, Reduction{}, root_or_peer, stream, 0, {}};
}
}  // namespace

NCCL_EXPORT(ncclResult_t, ncclAllReduce, const void* sendbuff, void* recvbuff, size_t count,
            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueueOperation(
      comm, makeOperation(OpKind::AllReduce, sendbuff, recvbuff, count, datatype, 0, stream), op);
}

NCCL_EXPORT(ncclResult_t, ncclBroadcast, const void* sendbuff, void* recvbuff, size_t count,
            ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueueOperation(
      comm, makeOperation(OpKind::Broadcast, sendbuff, recvbuff, count, datatype, root, stream), ncclSum);
}

NCCL_EXPORT(ncclResult_t, ncclBcast, void* buff, size_t count, ncclDataType_t datatype, int root,
            ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  // Through the exported symbol, as NCCL does: an interposer on ncclBroadcast sees this call.
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

NCCL_EXPORT(ncclResult_t, ncclReduce, const void* sendbuff, void* recvbuff, size_t count,
            ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueueOperation(
      comm, makeOperation(OpKind::Reduce, sendbuff, recvbuff, count, datatype, root, stream), op);
}

NCCL_EXPORT(ncclResult_t, ncclAllGather, const void* sendbuff, void* recvbuff, size_t sendcount,
            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueueOperation(
      comm, makeOperation(OpKind::AllGather, sendbuff, recvbuff, sendcount, datatype, 0, stream), ncclSum);
}

NCCL_EXPORT(ncclResult_t, ncclReduceScatter, const void* sendbuff, void* recvbuff, size_t recvcount,
            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return enqueueOperation(
      comm, makeOperation(OpKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, 0, stream), op);
}

NCCL_EXPORT(ncclResult_t, ncclAlltoAll, const void* sendbuff, void* recvbuff, size_t count,
            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream) {
  return enqueueOperation(
      comm, makeOperation(OpKind::AlltoAll, sendbuff, recvbuff, count, datatype, 0, stream), ncclSum);
}

NCCL_EXPORT(ncclResult_t, ncclGather, const void* sendbuff, void* recvbuff, size_t count,
            ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  return enqueueOperation(
      comm, makeOperation(OpKind::Gather, sendbuff, recvbuff, count, datatype, root, stream), ncclSum);
}

NCCL_EXPORT(ncclResult_t, ncclScatter, const void* sendbuff, void* recvbuff, size_t count,
            ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                         int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueueOperation(
      comm, makeOperation(OpKind::Scatter, sendbuff, recvbuff, count, datatype, root, stream), ncclSum);
}

NCCL_EXPORT(ncclResult_t, ncclSend, const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
            ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return enqueueOperation(comm, makeOperation(OpKind::Send, sendbuff, nullptr, count, datatype, peer, stream),
                          ncclSum);
}

NCCL_EXPORT(ncclResult_t, ncclRecv, void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
            ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return enqueueOperation(comm, makeOperation(OpKind::Recv, nullptr, recvbuff, count, datatype, peer, stream),
                          ncclSum);
}

NCCL_EXPORT(ncclResult_t, ncclGroupStart);
ncclResult_t ncclGroupStart() {
  groupStartInternal();
  return ncclSuccess;
}

NCCL_EXPORT(ncclResult_t, ncclGroupEnd);
ncclResult_t ncclGroupEnd() { return groupEndInternal(); }

NCCL_EXPORT(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (simInfo == nullptr || simInfo->magic != 0x74685283) {
    EMU_WARN("ncclGroupSimulateEnd: simInfo was not initialised with NCCL_SIM_INFO_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (t_group.depth == 0) {
    EMU_WARN("ncclGroupSimulateEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  // The same group end as ncclGroupEnd for the profiler's API events; nothing is launched.
  profilerLeaveGroup();
  if (--t_group.depth > 0) return ncclSuccess;
  // A simple cost model (microseconds): a fixed launch latency plus bytes over a PCIe-class link.
  constexpr double kLatencyUs = 8.0;
  constexpr double kBytesPerUs = 12e3;
  double estimate = 0;
  for (const PendingOperation& item : t_group.operations) {
    const Operation& op = item.operation;
    estimate += kLatencyUs + static_cast<double>(op.count * datatypeSize(op.datatype)) / kBytesPerUs;
  }
  simInfo->estimatedTime = static_cast<float>(estimate);
  t_group.operations.clear();
  std::vector<Job> jobs = std::move(t_group.jobs);
  t_group.jobs.clear();
  const ncclResult_t result = jobs.empty() ? ncclSuccess : runJobs(std::move(jobs));
  profilerStopGroupApi();
  return result;
}
