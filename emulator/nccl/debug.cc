#include "debug.h"

#include <cuda.h>
#include <pwd.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

namespace ncclemu {
namespace {

enum class Level { None, Version, Warn, Info, Trace };

struct DebugState {
  std::mutex mutex;
  bool initialized = false;
  Level level = Level::None;
  FILE* output = stdout;  // NCCL's default, unless NCCL_DEBUG_FILE names a file
  char last_error[1024] = "";
};

// Leaked on purpose: stream workers may still log while static destructors run at exit.
DebugState& state() {
  static DebugState* debug_state = new DebugState;
  return *debug_state;
}

thread_local int t_log_device = -1;

// NAME=VALUE lines, as NCCL's setEnvFile reads them: '#' lines and lines without '=' skipped,
// name and value cut at 1023 characters, what the environment has kept.
void loadConfigFile(const std::string& path) {
  FILE* file = fopen(path.c_str(), "r");
  if (file == nullptr) return;
  char* line = nullptr;
  size_t capacity = 0;
  ssize_t length = 0;
  while ((length = getline(&line, &capacity, file)) != -1) {
    std::string text(line, static_cast<size_t>(length));
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    const size_t equals = text.find('=');
    if (text.empty() || text[0] == '#' || equals == std::string::npos) continue;
    const std::string name = text.substr(0, std::min<size_t>(equals, 1023));
    const std::string value = text.substr(equals + 1, 1023);
    setenv(name.c_str(), value.c_str(), 0);
  }
  free(line);
  fclose(file);
}

void loadConfigFiles() {
  const char* user_file = getenv("NCCL_CONF_FILE");
  if (user_file != nullptr && *user_file != '\0') {
    loadConfigFile(user_file);
  } else if (const passwd* user = getpwuid(getuid()); user != nullptr && user->pw_dir != nullptr) {
    loadConfigFile(std::string(user->pw_dir) + "/.nccl.conf");
  }
  loadConfigFile("/etc/nccl.conf");
}

std::string shortHostName() {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  if (char* dot = strchr(host, '.')) *dot = '\0';
  return host;
}

// NCCL_DEBUG_FILE expands %h to the host name, %p to the pid and %% to %, like NCCL; any other
// % sequence stays as it is.
std::string expandDebugFileName(const char* pattern) {
  std::string name;
  for (const char* p = pattern; *p; ++p) {
    if (p[0] == '%' && p[1] == 'h') {
      name += shortHostName();
      ++p;
    } else if (p[0] == '%' && p[1] == 'p') {
      name += std::to_string(getpid());
      ++p;
    } else if (p[0] == '%' && p[1] == '%') {
      name += '%';
      ++p;
    } else {
      name += *p;
    }
  }
  return name;
}

void initLocked(DebugState& s) {
  if (s.initialized) return;
  s.initialized = true;
  // A reset closes the previous file: output goes back to stdout unless NCCL_DEBUG_FILE says otherwise.
  if (s.output != stdout) fclose(s.output);
  s.output = stdout;
  s.level = Level::None;
  if (const char* env = getNcclEnv("NCCL_DEBUG")) {
    if (strcasecmp(env, "VERSION") == 0)
      s.level = Level::Version;
    else if (strcasecmp(env, "WARN") == 0 || strcasecmp(env, "ABORT") == 0)
      s.level = Level::Warn;
    else if (strcasecmp(env, "INFO") == 0)
      s.level = Level::Info;
    else if (strcasecmp(env, "TRACE") == 0)
      s.level = Level::Trace;
  }
  // Like NCCL, the file is only created when there is more than the version line to write.
  const char* file = getNcclEnv("NCCL_DEBUG_FILE");
  if (s.level > Level::Version && file && *file) {
    if (FILE* opened = fopen(expandDebugFileName(file).c_str(), "w")) s.output = opened;
  }
}

}  // namespace

const char* getNcclEnv(const char* name) {
  static std::once_flag loaded;
  std::call_once(loaded, loadConfigFiles);
  return getenv(name);
}

namespace {

int currentLogDevice() {
  if (t_log_device >= 0) return t_log_device;
  CUdevice device = 0;
  if (cuCtxGetDevice(&device) != CUDA_SUCCESS) return 0;
  return device;
}

// NCCL's default NCCL_DEBUG_TIMESTAMP_LEVELS / _FORMAT: WARN lines start with "[%F %T] ".
std::string warnTimestamp() {
  const time_t now = time(nullptr);
  struct tm local {};
  localtime_r(&now, &local);
  char stamp[64] = "";
  strftime(stamp, sizeof(stamp), "[%F %T] ", &local);
  return stamp;
}

void emit(DebugState& s, const char* prefix_format, const std::string& timestamp, const char* file, int line,
          const char* format, va_list args) {
  char text[1024];
  int length = snprintf(text, sizeof(text), prefix_format, timestamp.c_str(), shortHostName().c_str(),
                        getpid(), static_cast<int>(syscall(SYS_gettid)), currentLogDevice(), file, line);
  if (length < 0 || static_cast<size_t>(length) >= sizeof(text)) length = 0;
  vsnprintf(text + length, sizeof(text) - length, format, args);
  fprintf(s.output, "%s\n", text);
  fflush(s.output);
}

void vlogWarn(const char* file, int line, const char* format, va_list args) {
  DebugState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  initLocked(s);
  va_list copy;
  va_copy(copy, args);
  vsnprintf(s.last_error, sizeof(s.last_error), format, copy);
  va_end(copy);
  if (s.level < Level::Warn) return;
  // NCCL names its source files relative to src/ (e.g. transport/p2p.cc); ours by base name,
  // whether the compiler saw them by absolute path or, through a compiler cache with a base
  // directory, relative to the build directory (../../emulator/nccl/init.cc).
  const bool own_source = file[0] == '/' || file[0] == '.';
  const char* slash = strrchr(file, '/');
  const char* base = own_source && slash ? slash + 1 : file;
  // The leading newline is NCCL's own: WARN lines stand out in a stream of INFO lines.
  emit(s, "\n%s%s:%d:%d [%d] %s:%d NCCL WARN ", warnTimestamp(), base, line, format, args);
}

// INFO lines, and TRACE lines (same layout, "NCCL TRACE") when NCCL_DEBUG=TRACE.
void vlogInfo(Level level, const char* format, va_list args) {
  DebugState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  initLocked(s);
  if (s.level < level) return;
  emit(s, level == Level::Trace ? "%s%s:%d:%d [%d] NCCL TRACE " : "%s%s:%d:%d [%d] NCCL INFO ", "", "", 0,
       format, args);
}

}  // namespace

void logWarn(const char* file, int line, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vlogWarn(file, line, format, args);
  va_end(args);
}

void logInfo(const char* format, ...) {
  va_list args;
  va_start(args, format);
  vlogInfo(Level::Info, format, args);
  va_end(args);
}

void logAtLevel(int level, const char* file, int line, const char* format, va_list args) {
  if (format == nullptr) return;
  // NCCL's levels: 1 VERSION, 2 WARN, 3 INFO, 4 ABORT (printed as a WARN), 5 TRACE.
  if (level == 2 || level == 4)
    vlogWarn(file && *file ? file : "?", line, format, args);
  else if (level == 3)
    vlogInfo(Level::Info, format, args);
  else if (level == 5)
    vlogInfo(Level::Trace, format, args);
}

bool infoEnabled() {
  DebugState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  initLocked(s);
  return s.level >= Level::Info;
}

const char* lastErrorText() { return state().last_error; }

void resetDebugInit() {
  DebugState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.initialized = false;
}

LogDeviceScope::LogDeviceScope(int device) : previous_(t_log_device) { t_log_device = device; }
LogDeviceScope::~LogDeviceScope() { t_log_device = previous_; }

}  // namespace ncclemu
