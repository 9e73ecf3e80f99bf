// The one table of ncclguard's settings: every NCCLGUARD_* environment variable, its type, its
// default and one line of documentation. The parser, the start-up log of effective values and the
// table of variables in docs/settings.md all come from these rows (a test compares the two).
//
// Row: X(NAME after "NCCLGUARD_", field, type, default, documentation)
#pragma once

#define NCCLGUARD_FOR_EACH_OPTION(X)                                                                 \
  X(DISABLE, disable, bool, false,                                                                   \
    "Kill switch: `1` turns every wrapper into a pure pass-through to NCCL; ncclguard then loads "   \
    "nothing beyond `libncclguard.so`, starts nothing, writes nothing and logs nothing.")            \
  X(LOG_LEVEL, log_level, LogLevel, LogLevel::kWarn,                                                 \
    "Least severe message logged: `trace` (every call with its arguments), `debug` (every call "     \
    "with its result), `info`, `warn`, `error` or `off`.")                                           \
  X(LOG_FILE, log_file, std::string, "",                                                             \
    "Write the log to this file instead of stderr. `%h` becomes the host name and `%p` the "         \
    "process id, as in `NCCL_DEBUG_FILE`.")                                                          \
  X(NCCL_LIBRARY, nccl_library, std::string, "",                                                     \
    "Path of the libnccl that the NCCL functions exported by ncclguard forward to. Default: the "    \
    "next definition after ncclguard in the process's symbol lookup order, else an NCCL library "    \
    "the process has already loaded. ncclguard loads no libnccl itself unless this names one.")      \
  X(TIMEOUT, timeout, Seconds, Seconds{120},                                                         \
    "An operation that started on the GPU and has not completed after this many seconds is a "       \
    "stall (one still queued behind earlier work on its stream is reported as not started).")        \
  X(HARD_TIMEOUT, hard_timeout, Seconds, Seconds{1800},                                              \
    "While the cross-rank verdict says a late rank is alive and busy outside NCCL (saving a "        \
    "checkpoint, evaluating), the watchdog warns every `NCCLGUARD_TIMEOUT` and acts only after "     \
    "this many seconds.")                                                                            \
  X(INIT_TIMEOUT, init_timeout, Seconds, Seconds{300},                                               \
    "A communicator initialisation that has not completed after this many seconds is a stall.")      \
  X(ACTION, action, Action, Action::kWarn,                                                           \
    "What to do at a stall: `warn` (log and dump, keep waiting), `abort` (also abort the stuck "     \
    "communicators, so the application gets errors instead of hanging), `exit` (dump, abort "        \
    "and exit with code 75, which launchers can restart on) or `reinit` (like `exit`; when the "     \
    "verdict is `p2p_suspect`, every process of the job also records it in the job directory, "      \
    "so that the restarted job runs with P2P disabled).")                                            \
  X(RECOVER, recover, RecoverMode, RecoverMode::kOff,                                                \
    "`inprocess`: ncclguard hands the application communicator handles of its own, and a stall "     \
    "of one of a communicator's first operations (`NCCLGUARD_PROBATION_OPS`) is recovered in the "   \
    "running process: every rank re-creates the communicator with P2P disabled and replays the "     \
    "operation, all ranks or none (then `NCCLGUARD_ACTION` applies). `off`: the application gets "   \
    "NCCL's own handles and nothing is held.")                                                       \
  X(PROBATION_OPS, probation_ops, Count, Count{4},                                                   \
    "With `NCCLGUARD_RECOVER=inprocess`: how many of each new communicator's first operations are "  \
    "on probation, with those queued behind them. Work the application queues on the stream after "  \
    "one waits on the GPU until the operation is seen complete (or replayed); an operation issued "  \
    "while an earlier one is on probation is held and issued by ncclguard in order; the calling "    \
    "thread never waits.")                                                                           \
  X(PROBATION_MAX_BYTES, probation_max_bytes, Count, Count{268435456},                               \
    "With `NCCLGUARD_RECOVER=inprocess`: an in-place reduction on probation (its input is its "      \
    "output) is copied first, up to this many bytes, so that it can be replayed; a larger one "      \
    "cannot be, and its stall falls back to `NCCLGUARD_ACTION`.")                                    \
  X(P2P, p2p, P2pMode, P2pMode::kAuto,                                                               \
    "Before the process's first communicator: `off` sets `NCCL_P2P_DISABLE=1`; `auto` sets it "      \
    "when an earlier attempt of this job recorded a `p2p_suspect` verdict or a known-bad entry "     \
    "with action `disable` matches; `on` never sets it. A `NCCL_P2P_DISABLE` or `NCCL_P2P_LEVEL` "   \
    "set by the user always wins.")                                                                  \
  X(P2P_VERDICT, p2p_verdict, std::string, "",                                                       \
    "Set by `ncclguard run` for the attempts after one that recorded a `p2p_suspect` verdict: "      \
    "what the record says. Under `NCCLGUARD_P2P=auto` the process then turns P2P off without "       \
    "waiting for the job board at its first NCCL call.")                                             \
  X(KNOWN_BAD_FILE, known_bad_file, std::string, "",                                                 \
    "The known-bad configurations to check at the first init. Default: the file shipped with "       \
    "ncclguard, `share/ncclguard/known-bad.json` beside its `lib/`.")                                \
  X(DUMP_DIR, dump_dir, std::string, "",                                                             \
    "Directory of the jobs' coordination directories, one per job: dumps, status files and "         \
    "dump requests. Default: `$TMPDIR/ncclguard-<uid>` (`/tmp/ncclguard-<uid>`). Use a shared "      \
    "file system for jobs that span nodes.")                                                         \
  X(JOB_ID, job_id, std::string, "",                                                                 \
    "Name of this job's directory. Default: every launcher job id present, joined (`SLURM_JOB_ID` "  \
    "with `SLURM_STEP_ID`, `TORCHELASTIC_RUN_ID`, `PADDLE_JOB_ID`, ...), else one derived from the " \
    "first communicator's unique id, which every rank shares.")                                      \
  X(LAUNCH_ID, launch_id, std::string, "",                                                           \
    "What the attempts of one job share and no other job does, even under the same job id: a P2P "   \
    "verdict on the job board is followed at start only by a process of the same launch id. "        \
    "`ncclguard run` sets it for its command. Default: every launcher job id present, else empty.")  \
  X(STORE, store, std::string, "",                                                                   \
    "The job board where the processes of a job publish their status, ask each other for dumps and " \
    "meet to recover: empty or `dir` for the job directory, `redis://host[:port][/db]` for a Redis " \
    "server (for jobs of thousands of ranks; needs libhiredis; an IPv6 address in brackets, "        \
    "`redis://[::1]:6379/0`; `rediss://` for TLS where hiredis's SSL library is installed; the "     \
    "credentials in NCCLGUARD_STORE_AUTH_FILE, never in the URL). Dumps stay files of the job "      \
    "directory either way.")                                                                         \
  X(STORE_AUTH_FILE, store_auth_file, std::string, "",                                               \
    "File holding the Redis board's credentials, never the URL: one line, the password "             \
    "(`requirepass`), or two, an ACL user then its password. Mode 0600, owned by the job's user; "   \
    "read again at each reconnection, so a corrected file is used without a restart.")               \
  X(RING_SIZE, ring_size, Count, Count{2048},                                                        \
    "Operations kept per communicator in the flight recorder (preallocated).")                       \
  X(DUMP_SIGNAL, dump_signal, Signal, Signal{SIGUSR2},                                               \
    "Signal that makes a process dump its state (`SIGUSR2`, `USR2` or a number; `0` turns it "       \
    "off): `SIGUSR1`, `SIGUSR2`, a real-time signal, or one whose default action is to ignore it "   \
    "(`SIGWINCH`, `SIGURG`, `SIGCHLD`). An application's own handler of that signal is still "       \
    "called. At most one dump per second; further signals are counted.")                             \
  X(STACK_SIGNAL, stack_signal, Signal, Signal{SIGRTMAX - 3},                                        \
    "Signal sent to each thread of a process, one at a time, when it dumps, so that the thread "     \
    "writes its own native stack (same rules as `NCCLGUARD_DUMP_SIGNAL`; `0` turns native stacks "   \
    "off). Left alone when the application handles it. Threads in `sleep()`, `poll()` and the like " \
    "are not sent it (it would cut their wait short): they are described from `/proc`.")             \
  X(DUMP_ON_EXIT, dump_on_exit, bool, false, "`1`: every process dumps its state when it exits.")    \
  X(METRICS_DIR, metrics_dir, std::string, "",                                                       \
    "Directory where each process keeps a Prometheus text-format file, `ncclguard_<job>_<host>_"     \
    "<pid>.prom` (mode 0644, rewritten atomically with each status and at each stall, dump, "        \
    "recovery and exit), for the node exporter's textfile collector: stalls, verdicts, dumps, "      \
    "recoveries, operations watched, watchdog health (docs/metrics.md). Empty: none.")               \
  X(FLIGHT_RECORDER_DIR, flight_recorder_dir, std::string, "",                                       \
    "With a directory: each dump also writes the process's operations there as PyTorch's Flight "    \
    "Recorder does, `nccl_trace_rank_<rank>` (format 2.10, for `torchfrtrace`; one per device "      \
    "of a process that drives several), replacing the previous one. Only communicators whose "       \
    "members a process knows alone are in it (of a single rank, of the launcher's world size, or "   \
    "its devices' widest); `ncclguard analyze --flight-recorder` writes all.")                       \
  X(PROFILER, profiler, bool, true,                                                                  \
    "`0`: ncclguard leaves `NCCL_PROFILER_PLUGIN` alone. Otherwise it points NCCL at the profiler "  \
    "plugin that `libncclguard.so` serves, before the first communicator, and forwards every event " \
    "to the plugin the user named there, if any, so that both work (`none` keeps NCCL's profiler "   \
    "off).")                                                                                         \
  X(POLL_INTERVAL, poll_interval, Seconds, Seconds{0.1},                                             \
    "How often the watchdog looks at outstanding operations, in seconds.")                           \
  X(STATUS_INTERVAL, status_interval, Seconds, Seconds{2},                                           \
    "How often each process rewrites its status file in the job directory, in seconds.")             \
  X(SLOW_INTERVAL, slow_interval, Seconds, Seconds{15},                                              \
    "How often the process holding rank 0 of the largest communicator reads the job's statuses "     \
    "to name a slow link or a slow rank (`slow_link`, `slow_rank`), in seconds; never more often "   \
    "than the status interval. `0`: never.")

// The accepted range of each numeric setting, inclusive: a value outside is reported like any bad
// value and the default is used (a poll interval of a nanosecond burns a core, a ring of millions
// of records costs gigabytes per communicator).
//
// Row: X(NAME after "NCCLGUARD_", least, greatest)
#define NCCLGUARD_FOR_EACH_RANGE(X)        \
  X(TIMEOUT, 1, 604800)                    \
  X(HARD_TIMEOUT, 1, 604800)               \
  X(INIT_TIMEOUT, 1, 604800)               \
  X(RING_SIZE, 16, 65536)                  \
  X(PROBATION_OPS, 1, 16)                  \
  X(PROBATION_MAX_BYTES, 1, 1099511627776) \
  X(POLL_INTERVAL, 0.01, 10)               \
  X(STATUS_INTERVAL, 0.1, 600)             \
  X(SLOW_INTERVAL, 0, 3600)
