# Finds NCCL's header (nccl.h) and, for tools that want it, libnccl.
#
# Honours NCCL_ROOT (variable or environment), then the CUDA toolkit directory,
# where NVIDIA's toolkit images put NCCL beside nvcc. libncclguard uses only the
# header: the real library is the application's and is resolved at run time.
#
# Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY (may be empty),
# NCCL_VERSION (major.minor.patch) and the imported target NCCL::headers.
include(FindPackageHandleStandardArgs)

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
if(CUDAToolkit_BIN_DIR)
  list(APPEND _nccl_hints "${CUDAToolkit_BIN_DIR}/..")
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND _nccl_hints "${_dir}/..")
  endforeach()
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR)
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_defines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} ([0-9]+).*" "\\1" NCCL_${_part} "${_nccl_defines}")
  endforeach()
  set(NCCL_VERSION "${NCCL_MAJOR}.${NCCL_MINOR}.${NCCL_PATCH}")
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION
  REASON_FAILURE_MESSAGE "nccl.h was not found: set NCCL_ROOT to the directory that holds include/nccl.h")

if(NCCL_FOUND AND NOT TARGET NCCL::headers)
  add_library(NCCL::headers INTERFACE IMPORTED)
  set_target_properties(NCCL::headers PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
