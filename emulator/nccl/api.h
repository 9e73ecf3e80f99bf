// How the API is exported: like NCCL's own NCCL_API, every nccl* symbol is a weak definition with
// a strong pnccl* alias, so a profiler or interposer can take nccl* while pnccl* still reaches
// this library. Calls made inside the library to nccl* go through the PLT and are seen too.
#pragma once

#define NCCL_EXPORT(ret, name, ...)                                                       \
  extern "C" __attribute__((visibility("default"), alias(#name))) ret p##name(__VA_ARGS__); \
  extern "C" __attribute__((visibility("default"), weak)) ret name(__VA_ARGS__)
