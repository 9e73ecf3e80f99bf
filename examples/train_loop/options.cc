#include "options.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* kUsage = R"(usage: train_loop [options]
A small data-parallel training job on the CUDA driver API and NCCL.

  --ranks N              launch N rank processes and wait for them
  --timeout SEC          with --ranks: stop ranks still running after SEC seconds (0: never)
  --steps S              training steps (default 100)
  --count C              float elements per AllReduce (default 1024)
  --model-count M        float elements broadcast from rank 0 at start (default: C)
  --nccl-loader L        linked | dlopen | rtld-local (default linked)
  --workers K            fork K data-loader workers after init
  --rendezvous FILE      unique id exchange through FILE (one rank per process, RANK/WORLD_SIZE set)
  --rendezvous-timeout SEC  how long ranks other than 0 wait for FILE (default 120)
  --verbose              one line per step
  --stop-early R:S       rank R stops issuing collectives after step S and exits 0
  --sleep R:S:SEC        rank R saves a checkpoint for SEC seconds after step S, then continues
  --slow R:MS[:F-L]      rank R computes MS milliseconds longer every step, or in steps F to L
                         only (a straggler, for a while)
  --exit R:S             rank R exits with code 3 after step S
  --desync R:S           rank R uses C+1048576 elements in the AllReduce of step S
)";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "train_loop: %s\n(see train_loop --help)\n", message.c_str());
  std::exit(kUsageExitCode);
}

long parse_integer(std::string_view text, const std::string& flag, long minimum) {
  const std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(copy.c_str(), &end, 10);
  if (copy.empty() || *end != '\0' || errno != 0 || value < minimum) {
    usage_error(flag + " expects an integer >= " + std::to_string(minimum) + ", got '" + copy + "'");
  }
  return value;
}

double parse_seconds(std::string_view text, const std::string& flag) {
  const std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || *end != '\0' || errno != 0 || !(value >= 0)) {
    usage_error(flag + " expects a number of seconds >= 0, got '" + copy + "'");
  }
  return value;
}

std::vector<std::string_view> split_fields(std::string_view text, size_t expected, const std::string& flag,
                                           const char* shape) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t colon = text.find(':', start);
    fields.push_back(text.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start));
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  if (fields.size() != expected) usage_error(flag + " expects " + shape + ", got '" + std::string(text) + "'");
  return fields;
}

RankStep parse_rank_step(std::string_view text, const std::string& flag) {
  const auto fields = split_fields(text, 2, flag, "RANK:STEP");
  return RankStep{static_cast<int>(parse_integer(fields[0], flag + " rank", 0)), parse_integer(fields[1], flag + " step", 0)};
}

// RANK:MILLISECONDS, or RANK:MILLISECONDS:FIRST-LAST (steps, 1-based, inclusive).
SlowRank parse_slow(std::string_view text, const std::string& flag) {
  const char* shape = "RANK:MILLISECONDS[:FIRST-LAST]";
  const auto fields = split_fields(text, text.find(':') != text.rfind(':') ? 3 : 2, flag, shape);
  SlowRank slow{static_cast<int>(parse_integer(fields[0], flag + " rank", 0)),
                parse_seconds(fields[1], flag)};
  if (fields.size() == 3) {
    const size_t dash = fields[2].find('-');
    if (dash == std::string_view::npos)
      usage_error(flag + " expects " + shape + ", got '" + std::string(text) + "'");
    slow.first = parse_integer(fields[2].substr(0, dash), flag + " first step", 1);
    slow.last = parse_integer(fields[2].substr(dash + 1), flag + " last step", slow.first);
  }
  return slow;
}

NcclLoader parse_loader(std::string_view text) {
  for (NcclLoader loader : {NcclLoader::linked, NcclLoader::dlopen, NcclLoader::rtld_local}) {
    if (text == loader_name(loader)) return loader;
  }
  usage_error("--nccl-loader expects linked, dlopen or rtld-local, got '" + std::string(text) + "'");
}

void check_fault_step(const std::optional<RankStep>& fault, const char* flag, long first_step, long steps) {
  if (fault && (fault->step < first_step || fault->step > steps)) {
    usage_error(std::string(flag) + " step must be between " + std::to_string(first_step) + " and --steps (" +
                std::to_string(steps) + ")");
  }
}

}  // namespace

std::string_view loader_name(NcclLoader loader) {
  switch (loader) {
    case NcclLoader::linked:
      return "linked";
    case NcclLoader::dlopen:
      return "dlopen";
    case NcclLoader::rtld_local:
      return "rtld-local";
  }
  return "?";
}

bool is_launcher_flag(const std::string& argument, bool& takes_value) {
  for (std::string_view flag : {"--ranks", "--timeout"}) {
    if (argument == flag) {
      takes_value = true;
      return true;
    }
    if (argument.starts_with(std::string(flag) + "=")) {
      takes_value = false;
      return true;
    }
  }
  return false;
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int index = 1; index < argc; ++index) {
    std::string flag = argv[index];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(EXIT_SUCCESS);
    }
    if (flag == "--verbose") {
      options.verbose = true;
      continue;
    }
    std::string value;
    if (const size_t equals = flag.find('='); flag.starts_with("--") && equals != std::string::npos) {
      value = flag.substr(equals + 1);
      flag.resize(equals);
    } else if (index + 1 < argc) {
      value = argv[++index];
    } else {
      usage_error(flag.starts_with("--") ? flag + " needs a value" : "unexpected argument '" + flag + "'");
    }

    if (flag == "--ranks") {
      options.launch_ranks = static_cast<int>(parse_integer(value, flag, 1));
    } else if (flag == "--timeout") {
      options.launch_timeout_s = parse_seconds(value, flag);
    } else if (flag == "--steps") {
      options.steps = parse_integer(value, flag, 0);
    } else if (flag == "--count") {
      options.count = static_cast<size_t>(parse_integer(value, flag, 1));
    } else if (flag == "--model-count") {
      options.model_count = static_cast<size_t>(parse_integer(value, flag, 1));
    } else if (flag == "--nccl-loader") {
      options.loader = parse_loader(value);
    } else if (flag == "--workers") {
      options.workers = static_cast<int>(parse_integer(value, flag, 0));
    } else if (flag == "--rendezvous") {
      options.rendezvous_file = value;
    } else if (flag == "--rendezvous-timeout") {
      options.rendezvous_timeout_s = parse_seconds(value, flag);
    } else if (flag == "--stop-early") {
      options.stop_early = parse_rank_step(value, flag);
    } else if (flag == "--exit") {
      options.exit_after = parse_rank_step(value, flag);
    } else if (flag == "--desync") {
      options.desync = parse_rank_step(value, flag);
    } else if (flag == "--sleep") {
      const auto fields = split_fields(value, 3, flag, "RANK:STEP:SECONDS");
      options.sleep = SleepAfterStep{static_cast<int>(parse_integer(fields[0], flag + " rank", 0)),
                                     parse_integer(fields[1], flag + " step", 0), parse_seconds(fields[2], flag)};
    } else if (flag == "--slow") {
      options.slow = parse_slow(value, flag);
    } else {
      usage_error("unknown option '" + flag + "'");
    }
  }

  if (options.model_count == 0) options.model_count = options.count;
  if (options.launch_ranks > 0 && !options.rendezvous_file.empty()) {
    usage_error("--rendezvous is for ranks started by another launcher; --ranks makes its own");
  }
  if (options.launch_ranks == 0 && options.launch_timeout_s > 0) usage_error("--timeout needs --ranks");
  check_fault_step(options.stop_early, "--stop-early", 0, options.steps);
  check_fault_step(options.exit_after, "--exit", 0, options.steps);
  check_fault_step(options.desync, "--desync", 1, options.steps);
  if (options.sleep) check_fault_step(RankStep{options.sleep->rank, options.sleep->step}, "--sleep", 0, options.steps);
  if (options.slow && options.slow->last > options.steps) {
    usage_error("--slow last step must be at most --steps (" + std::to_string(options.steps) + ")");
  }
  return options;
}

void check_fault_ranks(const Options& options, int world_size) {
  auto check = [world_size](std::optional<int> rank, const char* flag) {
    if (rank && *rank >= world_size) {
      usage_error(std::string(flag) + " names rank " + std::to_string(*rank) + " but the job has " +
                  std::to_string(world_size) + " ranks");
    }
  };
  auto rank_of = [](const std::optional<RankStep>& fault) { return fault ? std::optional<int>(fault->rank) : std::nullopt; };
  check(rank_of(options.stop_early), "--stop-early");
  check(rank_of(options.exit_after), "--exit");
  check(rank_of(options.desync), "--desync");
  check(options.sleep ? std::optional<int>(options.sleep->rank) : std::nullopt, "--sleep");
  check(options.slow ? std::optional<int>(options.slow->rank) : std::nullopt, "--slow");
}
