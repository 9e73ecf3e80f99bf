// Must not compile: state/ sits below detect/.
#include "watchdog/detect/watchdog.h"
