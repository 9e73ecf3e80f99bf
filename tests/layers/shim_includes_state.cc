// Must not compile: the shim sees only the core's door.
#include "watchdog/state/registry.h"
