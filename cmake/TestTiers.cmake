# Every test is in one tier, named by its directory's label (scripts/test.sh):
#   quick     unit and ABI tests, in one process or a few: the edit loop (scripts/test.sh --quick)
#   standard  end-to-end jobs on the emulator, the deployment, the benchmarks' smoke runs: with
#             quick, what CI runs (scripts/test.sh)
#   full      the slow reruns (the end-to-end suites on a Redis board): scripts/test.sh --full
# tests.tiers (tests/check_tiers.py) checks that every test has exactly one.
set(NCCLGUARD_TIERS quick standard full)
function(ncclguard_tier tier)
  if(NOT tier IN_LIST NCCLGUARD_TIERS)
    message(FATAL_ERROR "unknown test tier ${tier}: one of ${NCCLGUARD_TIERS}")
  endif()
  set_property(DIRECTORY PROPERTY LABELS ${tier})
endfunction()
