// The one table of every NCCL function ncclguard intercepts: every function declared in nccl.h.
//
// Each row: X(name, return type, kind, first NCCL version, (parameters), (arguments)).
// The wrappers, the real-symbol resolution, the linker version script and the export test are
// all generated from these rows. The compiler checks every row against the real declaration in
// nccl.h: a wrapper whose parameters differ from the header is a compile error (a C function
// cannot be overloaded), and the real function's pointer type is decltype of the declaration.
//
// Rows are grouped by the NCCL release that introduced them, so that ncclguard also builds
// against older headers (2.18 is the oldest supported); at run time every function is resolved
// lazily and a library that lacks one is tolerated. Adding a function is one row.
#pragma once

#include <nccl.h>

// Kinds, used by the watchdog to decide what a call means:
//   Collective, PointToPoint: an operation on a communicator's stream (recorded, timed);
//   Group: ncclGroupStart/End and friends; CommCreate: returns new communicators;
//   CommLifecycle: ends or changes a communicator; Query: reads state; Memory; Registration;
//   Error: error reporting; Debug: logging control.

#define NCCLGUARD_NCCL_API_2_18(X)                                                                           \
  X(ncclGetVersion, ncclResult_t, Query, NCCL_VERSION(2, 3, 0), (int* version), (version))                   \
  X(ncclGetUniqueId, ncclResult_t, Query, NCCL_VERSION(2, 3, 0), (ncclUniqueId * uniqueId), (uniqueId))      \
  X(ncclCommInitRank, ncclResult_t, CommCreate, NCCL_VERSION(2, 3, 0),                                       \
    (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank), (comm, nranks, commId, rank))            \
  X(ncclCommInitAll, ncclResult_t, CommCreate, NCCL_VERSION(2, 3, 0),                                        \
    (ncclComm_t * comm, int ndev, const int* devlist), (comm, ndev, devlist))                                \
  X(ncclCommInitRankConfig, ncclResult_t, CommCreate, NCCL_VERSION(2, 14, 0),                                \
    (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config),                    \
    (comm, nranks, commId, rank, config))                                                                    \
  X(ncclCommSplit, ncclResult_t, CommCreate, NCCL_VERSION(2, 18, 0),                                         \
    (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config),                        \
    (comm, color, key, newcomm, config))                                                                     \
  X(ncclCommFinalize, ncclResult_t, CommLifecycle, NCCL_VERSION(2, 14, 0), (ncclComm_t comm), (comm))        \
  X(ncclCommDestroy, ncclResult_t, CommLifecycle, NCCL_VERSION(2, 3, 0), (ncclComm_t comm), (comm))          \
  X(ncclCommAbort, ncclResult_t, CommLifecycle, NCCL_VERSION(2, 4, 0), (ncclComm_t comm), (comm))            \
  X(ncclGetErrorString, const char*, Error, NCCL_VERSION(2, 3, 0), (ncclResult_t result), (result))          \
  X(ncclGetLastError, const char*, Error, NCCL_VERSION(2, 13, 0), (ncclComm_t comm), (comm))                 \
  X(ncclCommGetAsyncError, ncclResult_t, Error, NCCL_VERSION(2, 4, 0),                                       \
    (ncclComm_t comm, ncclResult_t * asyncError), (comm, asyncError))                                        \
  X(ncclCommCount, ncclResult_t, Query, NCCL_VERSION(2, 3, 0), (const ncclComm_t comm, int* count),          \
    (comm, count))                                                                                           \
  X(ncclCommCuDevice, ncclResult_t, Query, NCCL_VERSION(2, 3, 0), (const ncclComm_t comm, int* device),      \
    (comm, device))                                                                                          \
  X(ncclCommUserRank, ncclResult_t, Query, NCCL_VERSION(2, 3, 0), (const ncclComm_t comm, int* rank),        \
    (comm, rank))                                                                                            \
  X(ncclRedOpCreatePreMulSum, ncclResult_t, Query, NCCL_VERSION(2, 11, 0),                                   \
    (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype, ncclScalarResidence_t residence,               \
     ncclComm_t comm),                                                                                       \
    (op, scalar, datatype, residence, comm))                                                                 \
  X(ncclRedOpDestroy, ncclResult_t, Query, NCCL_VERSION(2, 11, 0), (ncclRedOp_t op, ncclComm_t comm),        \
    (op, comm))                                                                                              \
  X(ncclReduce, ncclResult_t, Collective, NCCL_VERSION(2, 3, 0),                                             \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root,  \
     ncclComm_t comm, cudaStream_t stream),                                                                  \
    (sendbuff, recvbuff, count, datatype, op, root, comm, stream))                                           \
  X(ncclBcast, ncclResult_t, Collective, NCCL_VERSION(2, 3, 0),                                              \
    (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream),     \
    (buff, count, datatype, root, comm, stream))                                                             \
  X(ncclBroadcast, ncclResult_t, Collective, NCCL_VERSION(2, 3, 0),                                          \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, \
     cudaStream_t stream),                                                                                   \
    (sendbuff, recvbuff, count, datatype, root, comm, stream))                                               \
  X(ncclAllReduce, ncclResult_t, Collective, NCCL_VERSION(2, 3, 0),                                          \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,            \
     ncclComm_t comm, cudaStream_t stream),                                                                  \
    (sendbuff, recvbuff, count, datatype, op, comm, stream))                                                 \
  X(ncclReduceScatter, ncclResult_t, Collective, NCCL_VERSION(2, 3, 0),                                      \
    (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,        \
     ncclComm_t comm, cudaStream_t stream),                                                                  \
    (sendbuff, recvbuff, recvcount, datatype, op, comm, stream))                                             \
  X(ncclAllGather, ncclResult_t, Collective, NCCL_VERSION(2, 3, 0),                                          \
    (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,       \
     cudaStream_t stream),                                                                                   \
    (sendbuff, recvbuff, sendcount, datatype, comm, stream))                                                 \
  X(ncclSend, ncclResult_t, PointToPoint, NCCL_VERSION(2, 7, 0),                                             \
    (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,                 \
     cudaStream_t stream),                                                                                   \
    (sendbuff, count, datatype, peer, comm, stream))                                                         \
  X(ncclRecv, ncclResult_t, PointToPoint, NCCL_VERSION(2, 7, 0),                                             \
    (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream), \
    (recvbuff, count, datatype, peer, comm, stream))                                                         \
  X(ncclGroupStart, ncclResult_t, Group, NCCL_VERSION(2, 3, 0), (), ())                                      \
  X(ncclGroupEnd, ncclResult_t, Group, NCCL_VERSION(2, 3, 0), (), ())

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 19, 0)
#define NCCLGUARD_NCCL_API_2_19(X)                                                                      \
  X(ncclMemAlloc, ncclResult_t, Memory, NCCL_VERSION(2, 19, 0), (void** ptr, size_t size), (ptr, size)) \
  X(ncclMemFree, ncclResult_t, Memory, NCCL_VERSION(2, 19, 0), (void* ptr), (ptr))                      \
  X(ncclCommRegister, ncclResult_t, Registration, NCCL_VERSION(2, 19, 0),                               \
    (const ncclComm_t comm, void* buff, size_t size, void** handle), (comm, buff, size, handle))        \
  X(ncclCommDeregister, ncclResult_t, Registration, NCCL_VERSION(2, 19, 0),                             \
    (const ncclComm_t comm, void* handle), (comm, handle))
#else
#define NCCLGUARD_NCCL_API_2_19(X)
#endif

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 22, 0)
#define NCCLGUARD_NCCL_API_2_22(X) \
  X(ncclGroupSimulateEnd, ncclResult_t, Group, NCCL_VERSION(2, 22, 0), (ncclSimInfo_t * simInfo), (simInfo))
#else
#define NCCLGUARD_NCCL_API_2_22(X)
#endif

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 23, 0)
#define NCCLGUARD_NCCL_API_2_23(X)                                                                        \
  X(ncclCommInitRankScalable, ncclResult_t, CommCreate, NCCL_VERSION(2, 23, 0),                           \
    (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds, ncclConfig_t* config), \
    (newcomm, nranks, myrank, nId, commIds, config))
#else
#define NCCLGUARD_NCCL_API_2_23(X)
#endif

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
#define NCCLGUARD_NCCL_API_2_24(X) X(ncclResetDebugInit, void, Debug, NCCL_VERSION(2, 24, 0), (), ())
#else
#define NCCLGUARD_NCCL_API_2_24(X)
#endif

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define NCCLGUARD_NCCL_API_2_27(X)                                                       \
  X(ncclCommShrink, ncclResult_t, CommCreate, NCCL_VERSION(2, 27, 0),                    \
    (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm, \
     ncclConfig_t* config, int shrinkFlags),                                             \
    (comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags))           \
  X(ncclCommWindowRegister, ncclResult_t, Registration, NCCL_VERSION(2, 27, 0),          \
    (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags),         \
    (comm, buff, size, win, winFlags))                                                   \
  X(ncclCommWindowDeregister, ncclResult_t, Registration, NCCL_VERSION(2, 27, 0),        \
    (ncclComm_t comm, ncclWindow_t win), (comm, win))
#else
#define NCCLGUARD_NCCL_API_2_27(X)
#endif

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
#define NCCLGUARD_NCCL_API_2_28_3(X)                                                                         \
  X(ncclAlltoAll, ncclResult_t, Collective, NCCL_VERSION(2, 28, 3),                                          \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm,           \
     cudaStream_t stream),                                                                                   \
    (sendbuff, recvbuff, count, datatype, comm, stream))                                                     \
  X(ncclGather, ncclResult_t, Collective, NCCL_VERSION(2, 28, 3),                                            \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, \
     cudaStream_t stream),                                                                                   \
    (sendbuff, recvbuff, count, datatype, root, comm, stream))                                               \
  X(ncclScatter, ncclResult_t, Collective, NCCL_VERSION(2, 28, 3),                                           \
    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, \
     cudaStream_t stream),                                                                                   \
    (sendbuff, recvbuff, count, datatype, root, comm, stream))
#else
#define NCCLGUARD_NCCL_API_2_28_3(X)
#endif

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 7)
#define NCCLGUARD_NCCL_API_2_28_7(X)                                                                         \
  X(ncclCommRevoke, ncclResult_t, CommLifecycle, NCCL_VERSION(2, 28, 7), (ncclComm_t comm, int revokeFlags), \
    (comm, revokeFlags))
#else
#define NCCLGUARD_NCCL_API_2_28_7(X)
#endif

#define NCCLGUARD_FOR_EACH_NCCL_API(X) \
  NCCLGUARD_NCCL_API_2_18(X)           \
  NCCLGUARD_NCCL_API_2_19(X)           \
  NCCLGUARD_NCCL_API_2_22(X)           \
  NCCLGUARD_NCCL_API_2_23(X)           \
  NCCLGUARD_NCCL_API_2_24(X)           \
  NCCLGUARD_NCCL_API_2_27(X)           \
  NCCLGUARD_NCCL_API_2_28_3(X)         \
  NCCLGUARD_NCCL_API_2_28_7(X)
