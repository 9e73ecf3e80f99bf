// The one table of ncclguard's settings: every NCCLGUARD_* environment variable, its type, its
// default and one line of documentation. The parser, the start-up log of effective values and the
// README's table of variables all come from these rows (a test compares the README with them).
//
// Row: X(NAME after "NCCLGUARD_", field, type, default, documentation)
#pragma once

#define NCCLGUARD_FOR_EACH_OPTION(X)                                                               \
  X(DISABLE, disable, bool, false,                                                                 \
    "Kill switch: `1` turns every wrapper into a pure pass-through to NCCL; ncclguard then starts " \
    "nothing, writes nothing and logs nothing.")                                                   \
  X(LOG_LEVEL, log_level, LogLevel, LogLevel::kWarn,                                               \
    "Least severe message logged: `trace` (every call with its arguments), `debug` (every call "   \
    "with its result), `info`, `warn`, `error` or `off`.")                                         \
  X(LOG_FILE, log_file, std::string, "",                                                           \
    "Write the log to this file instead of stderr. `%h` becomes the host name and `%p` the "       \
    "process id, as in `NCCL_DEBUG_FILE`.")                                                        \
  X(NCCL_LIBRARY, nccl_library, std::string, "",                                                   \
    "Path of the libnccl that the NCCL functions exported by ncclguard forward to. Default: the "   \
    "next definition after ncclguard in the process's symbol lookup order, else an NCCL library "  \
    "the process has already loaded. ncclguard loads no libnccl itself unless this names one.")
