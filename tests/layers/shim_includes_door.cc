// Must compile: the door, the API table and in-process recovery's interface are what the shim sees.
#include "watchdog/common/in_process_recovery.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/record/hooks.h"
