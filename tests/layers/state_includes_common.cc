// Must compile: state/ may use common/.
#include "watchdog/common/config.h"
#include "watchdog/state/registry.h"
