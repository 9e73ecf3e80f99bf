// Must not compile: the shim reaches in-process recovery only through common/in_process_recovery.h.
#include "watchdog/recover/comm_handle.h"
