// NCCL-style logging: WARN/INFO lines in NCCL's own format, NCCL_DEBUG / NCCL_DEBUG_FILE, and
// the process-wide "last error" buffer behind ncclGetLastError.
#pragma once

#include <cstdarg>

namespace ncclemu {

// Every WARN lands in the last-error buffer, whatever NCCL_DEBUG says; printing depends on it.
void logWarn(const char* file, int line, const char* format, ...) __attribute__((format(printf, 3, 4)));
void logInfo(const char* format, ...) __attribute__((format(printf, 1, 2)));
bool infoEnabled();
// What NCCL hands a plugin as its logger (ncclDebugLog): a line at NCCL's level number (1 VERSION,
// 2 WARN, 3 INFO, 4 ABORT, 5 TRACE), filtered and formatted like the library's own lines.
void logAtLevel(int level, const char* file, int line, const char* format, va_list args);
const char* lastErrorText();
// An NCCL variable as NCCL reads it (its ncclGetEnv): the first read in the process loads the
// config files into the environment, never overriding what is set there: $NCCL_CONF_FILE, else
// ~/.nccl.conf; then /etc/nccl.conf.
const char* getNcclEnv(const char* name);
// Makes the next log line re-read NCCL_DEBUG and NCCL_DEBUG_FILE.
void resetDebugInit();

// The "[dev]" of a log line is the device of the communicator being worked on, else CUDA's
// current device, like cudaGetDevice() in real NCCL.
class LogDeviceScope {
 public:
  explicit LogDeviceScope(int device);
  ~LogDeviceScope();
  LogDeviceScope(const LogDeviceScope&) = delete;
  LogDeviceScope& operator=(const LogDeviceScope&) = delete;

 private:
  int previous_;
};

}  // namespace ncclemu

#define EMU_WARN(...) ::ncclemu::logWarn(__FILE__, __LINE__, __VA_ARGS__)
#define EMU_INFO(...) ::ncclemu::logInfo(__VA_ARGS__)
