# Writes the version script of libncclguard.so from the NCCL API table.
# In: COMPILER, INCLUDES (directories separated by "|"), INPUT, OUTPUT.
set(_flags -E -P -x c++)
string(REPLACE "|" ";" _include_dirs "${INCLUDES}")
foreach(_dir IN LISTS _include_dirs)
  list(APPEND _flags "-I${_dir}")
endforeach()
execute_process(COMMAND "${COMPILER}" ${_flags} "${INPUT}"
                OUTPUT_VARIABLE _preprocessed RESULT_VARIABLE _status ERROR_VARIABLE _errors)
if(NOT _status EQUAL 0)
  message(FATAL_ERROR "preprocessing ${INPUT} failed: ${_errors}")
endif()
# The preprocessed text holds all of nccl.h too; keep only the marked names.
string(REGEX MATCHALL "NCCLGUARD_EXPORT [A-Za-z0-9_]+" _lines "${_preprocessed}")
set(_script "{\n  global:\n    dlsym;\n")
foreach(_line IN LISTS _lines)
  string(REPLACE "NCCLGUARD_EXPORT " "    " _line "${_line}")
  string(APPEND _script "${_line};\n")
endforeach()
string(APPEND _script "  local:\n    *;\n};\n")
file(WRITE "${OUTPUT}.tmp" "${_script}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
