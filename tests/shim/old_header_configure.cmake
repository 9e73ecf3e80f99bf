# Configuring ncclguard against nccl.h older than 2.18 must fail with a message that says so.
# In: SOURCE_DIR, WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(WRITE "${WORK_DIR}/nccl/include/nccl.h"
     "#define NCCL_MAJOR 2\n#define NCCL_MINOR 17\n#define NCCL_PATCH 1\n")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build"
          "-DNCCL_ROOT=${WORK_DIR}/nccl" -DNCCLGUARD_BUILD_TESTS=OFF -DNCCLGUARD_BUILD_EMULATOR=OFF
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE_RECURSE "${WORK_DIR}")
if(status EQUAL 0)
  message(FATAL_ERROR "configuring against nccl.h 2.17.1 succeeded")
endif()
string(REGEX REPLACE "[ \n]+" " " err "${err}")  # CMake wraps long messages
if(NOT err MATCHES "is version 2\\.17\\.1; ncclguard needs the headers of NCCL 2\\.18\\.0 or newer")
  message(FATAL_ERROR "unexpected configure error:\n${err}")
endif()
message(STATUS "configure refused nccl.h 2.17.1 as expected")
