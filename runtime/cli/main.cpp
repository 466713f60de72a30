// The packtrain command line: one binary, one subcommand per job (commands.h).
//
//   packtrain train | resume | predict | evaluate | export | active-learn | profile | info
//   packtrain multitask train | resume | score | generate
//   packtrain launch --nproc N -- <command>
//
// `--config FILE` (TOML, anywhere on the line) gives any subcommand's flags as
// `key = value` lines (the flag's name without dashes); flags on the command line
// win; an unknown key is an error.
//
// Exit status: 0 success; 2 bad input (arguments, data, checkpoints, config: a
// packtrain::UserError, or a flag CLI11 rejects); 130 interrupted (after saving a
// checkpoint when asked); 1 a failed write (a full disk), a failed collective (a
// peer died or hangs), or an internal error (a bug: any other exception).
#include "packtrain/base/user_error.h"
#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/commands.h"
#include "packtrain/runtime/cli/config_file.h"
#include "packtrain/runtime/cli/output_paths.h"
#include "packtrain/runtime/cli/range_checks.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/distributed/cpu_share.h"
#include "packtrain/runtime/distributed/process_group.h"
#include "packtrain/runtime/distributed/rank_info.h"
#include "packtrain/runtime/io/checkpoint_file.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

// One catch maps every user error to status 2 (below): the CLI's own must be one.
static_assert(std::is_base_of_v<packtrain::UserError, packtrain::cli::UsageError>);
static_assert(std::is_base_of_v<packtrain::UserError, packtrain::runtime::DataError>);

// Config keys outside any [section] belong to the subcommand being run, so a file
// of `members = 8` lines works for `packtrain train --config f.toml` (and `epochs = 2`
// for `packtrain multitask train --config f.toml`).
class SubcommandConfig : public CLI::ConfigTOML {
 public:
  explicit SubcommandConfig(const CLI::App* app) : app_(app) {}
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(input);
    // The chain of chosen subcommands: {"train"}, or {"multitask", "train"}.
    std::vector<std::string> chain;
    for (const CLI::App* at = app_; !at->get_subcommands().empty(); at = at->get_subcommands().front()) {
      chain.push_back(at->get_subcommands().front()->get_name());
    }
    if (chain.empty()) return items;
    for (CLI::ConfigItem& item : items) {
      if (item.parents.empty()) item.parents = chain;
    }
    return items;
  }

 private:
  const CLI::App* app_;
};

// CLI11 reads the config option of the top-level app only: move `--config F`
// (or --config=F) from wherever the user wrote it to the front.
std::vector<std::string> hoist_config(std::vector<std::string> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") break;  // after --, the arguments are another command's (packtrain launch)
    if (args[i] == "--config" && i + 1 < args.size()) {
      const std::string file = args[i + 1];
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
      args.insert(args.begin(), {"--config", file});
      break;
    }
    if (args[i].rfind("--config=", 0) == 0) {
      const std::string option = args[i];
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
      args.insert(args.begin(), option);
      break;
    }
  }
  return args;
}

// Everything printed on stdout (predictions, --json reports, generated text) must
// have reached its file: a full disk or a closed pipe is an error, never exit 0.
int standard_output_written(int status) {
  errno = 0;
  if (std::fflush(stdout) == 0 && std::ferror(stdout) == 0) return status;
  const int error = errno;
  fmt::print(stderr, "packtrain: error: cannot write to standard output: {}\n",
             error != 0 ? std::strerror(error) : "write error");
  return status != 0 ? status : 1;
}

// The global --threads option into `threads` (which must outlive parsing), else
// $PACKTRAIN_THREADS, applied to LibTorch once the command line is parsed.
void add_threads_option(CLI::App& app, int& threads) {
  // More threads than cores only queue up (and a pool of 100000 takes minutes to
  // start): at most 4 per core the machine reports.
  const int max_threads = 4 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("--threads", threads,
                 fmt::format("CPU threads for LibTorch's operators, at most 4 per core ({} here). 0 (the default, "
                             "unless PACKTRAIN_THREADS or OMP_NUM_THREADS is set): the CPUs this process may use that "
                             "no other work is running on at start, shared among the ranks on this host, at most "
                             "LibTorch's default (one per core when idle, 1 on a busy machine: OpenMP threads wait on "
                             "each other behind other work)",
                             max_threads))
      ->check(packtrain::cli::between(0, max_threads));
  // --threads, else $PACKTRAIN_THREADS; exported once chosen, so the ranks of
  // `packtrain --threads 1 launch ...` (which inherit the environment) use it too.
  app.parse_complete_callback([&threads, max_threads] {
    if (const char* env = std::getenv("PACKTRAIN_THREADS"); threads == 0 && env != nullptr && *env != '\0') {
      char* end = nullptr;
      const long value = std::strtol(env, &end, 10);
      if (*end != '\0' || value < 0 || value > max_threads) {
        throw packtrain::cli::UsageError(
            fmt::format("PACKTRAIN_THREADS='{}': must be an integer between 0 and {}", env, max_threads));
      }
      threads = static_cast<int>(value);
    }
    if (threads > 0) {
      at::set_num_threads(threads);
      ::setenv("PACKTRAIN_THREADS", std::to_string(threads).c_str(), 1);
    } else if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp == nullptr || *omp == '\0') {
      // Nobody chose: from the free CPUs, per process (not exported: each rank of
      // `launch` or torchrun decides for itself, sharing with the others).
      packtrain::runtime::distributed::RankInfo rank;
      try {
        rank = packtrain::runtime::distributed::rank_info_from_environment();
      } catch (const packtrain::UserError&) {  // the command names the bad variable
      }
      // At most LibTorch's own default (an idle machine computes exactly as before).
      at::set_num_threads(static_cast<int>(packtrain::runtime::distributed::default_cpu_threads(
          packtrain::runtime::distributed::read_cpu_load(), rank, at::get_num_threads())));
    }
  });
}

// Under torchrun, a failed rank's error goes to the file TORCHELASTIC_ERROR_FILE
// names, in torch.distributed.elastic's format, so torchrun's summary reports it
// (instead of "To enable traceback see ..."). Best effort: the line on stderr stays.
void record_error_for_torchrun(const std::string& message) {
  const char* file = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (file == nullptr || *file == '\0') return;
  const nlohmann::json error{
      {"message",
       {{"message", "packtrain: " + message},
        {"extraInfo", {{"py_callstack", ""}, {"timestamp", std::to_string(std::time(nullptr))}}}}}};
  std::ofstream(file) << error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "packtrain: train many small models as one (packed ensembles, captured training steps).\n"
      "Run `packtrain <command> --help` for a command's options."};
  app.require_subcommand(1);
  app.set_config("--config", "", "TOML file of `flag = value` lines for the command (command-line flags win)");
  app.config_formatter(std::make_shared<SubcommandConfig>(&app));
  app.allow_config_extras(CLI::config_extras_mode::error);
  int threads = 0;
  add_threads_option(app, threads);
  int status = 0;
  packtrain::cli::add_train_commands(app, status);
  packtrain::cli::add_predict_commands(app, status);
  packtrain::cli::add_active_learn_command(app, status);
  packtrain::cli::add_info_commands(app, status);
  packtrain::cli::add_multitask_commands(app, status);
  packtrain::cli::add_launch_command(app, status);
  packtrain::cli::make_integer_options_exact(app);  // every integer flag and config key, in one place

  std::vector<std::string> args = hoist_config(std::vector<std::string>(argv + 1, argv + argc));
  const std::string config = args.size() > 1 && args[0] == "--config"              ? args[1]
                             : !args.empty() && args[0].rfind("--config=", 0) == 0 ? args[0].substr(9)
                                                                                   : "";
  // The config is an input of whatever the command writes: no output may replace it.
  if (!config.empty()) packtrain::cli::add_read_file({"--config", config});
  const std::vector<std::string> command_line = args;  // parse() consumes `args`
  std::reverse(args.begin(), args.end());              // CLI11 takes them last-first
  // Whatever stdout holds (a run's results) goes out before the error line.
  const auto fail = [](int code, const std::string& message) {
    std::fflush(stdout);
    fmt::print(stderr, "packtrain: {}\n", message);
    record_error_for_torchrun(message);
    return code;
  };
  packtrain::cli::ConfigLines config_lines;
  try {
    // A config that cannot be read whole (a device, a FIFO, a huge file) is an error,
    // never silently the defaults; a line CLI11 would misread is named first.
    if (!config.empty()) config_lines = packtrain::cli::scan_config_file(config);
    app.parse(args);
  } catch (const CLI::ConfigError& e) {
    const std::string where = packtrain::cli::config_location(config_lines, e.what(), command_line);
    return fail(2, fmt::format("error: {}{} (the keys are the command's flags without dashes)",
                               where.empty() ? config + ": " : where, e.what()));
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return fail(2, "error: " + packtrain::cli::config_location(config_lines, e.what(), command_line) + e.what());
  } catch (const packtrain::UserError& e) {  // DataError, UsageError and every other bad input
    return fail(2, std::string("error: ") + e.what());
  } catch (const packtrain::runtime::WriteError& e) {
    return fail(1, std::string("error: ") + e.what());  // a full disk: not bad input, not a bug
  } catch (const packtrain::runtime::distributed::CollectiveError& e) {
    fail(1, std::string("error: ") + e.what());  // a peer died or hangs: not bad input, not a bug
    // An NCCL abort may still be running on a thread of its own: end without the
    // static destructors it could race (checkpoints are committed files already).
    std::fflush(nullptr);
    std::_Exit(1);
  } catch (const c10::Error& e) {
    return fail(1, std::string("internal error: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(1, std::string("internal error: ") + e.what());
  }
  return standard_output_written(status);
}
