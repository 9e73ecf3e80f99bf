// Must compile: the door and the API table are what the shim sees.
#include "watchdog/common/nccl_api.h"
#include "watchdog/record/hooks.h"
