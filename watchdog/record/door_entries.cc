// The core's one export when it is built as libncclguard-core.so: the door, as a table the front end
// (shim/door.cc) looks up by name once.
#include "watchdog/record/door_entries.h"

// clang-format off
#define NCCLGUARD_DOOR_ENTRY(field, function, result, parameters, arguments, without_core) \
  .field = &::ncclguard::function,
// NOLINTNEXTLINE(readability-identifier-naming): the name the front end looks up.
extern "C" __attribute__((visibility("default"))) const ncclguard::DoorEntries ncclguard_core_entries = {
    .abi = ncclguard::DoorAbi(),
    NCCLGUARD_FOR_EACH_DOOR_FUNCTION(NCCLGUARD_DOOR_ENTRY)
};
#undef NCCLGUARD_DOOR_ENTRY
// clang-format on
