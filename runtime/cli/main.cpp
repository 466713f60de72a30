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
// Exit status: 0 success, 2 bad input (arguments, data, checkpoints, config),
// 130 interrupted (after saving a checkpoint when asked), 1 internal error.
#include "packtrain/runtime/cli/cli_common.h"
#include "packtrain/runtime/cli/commands.h"
#include "packtrain/runtime/cli/range_checks.h"
#include "packtrain/runtime/data/data_error.h"
#include "packtrain/runtime/data/input_file.h"
#include "packtrain/runtime/distributed/process_group.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"packtrain: train many small models as one (packed ensembles, captured training steps).\n"
               "Run `packtrain <command> --help` for a command's options."};
  app.require_subcommand(1);
  app.set_config("--config", "", "TOML file of `flag = value` lines for the command (command-line flags win)");
  app.config_formatter(std::make_shared<SubcommandConfig>(&app));
  app.allow_config_extras(CLI::config_extras_mode::error);
  int threads = 0;
  app.add_option("--threads", threads,
                 "CPU threads for LibTorch's operators (0: its default, one per core). Small packs on a busy machine "
                 "often run fastest with 1.")
      ->check(packtrain::cli::non_negative());
  app.parse_complete_callback([&threads] {
    if (threads > 0) at::set_num_threads(threads);
  });
  int status = 0;
  packtrain::cli::add_train_commands(app, status);
  packtrain::cli::add_predict_commands(app, status);
  packtrain::cli::add_active_learn_command(app, status);
  packtrain::cli::add_info_commands(app, status);
  packtrain::cli::add_multitask_commands(app, status);
  packtrain::cli::add_launch_command(app, status);

  std::vector<std::string> args = hoist_config(std::vector<std::string>(argv + 1, argv + argc));
  const std::string config = args.size() > 1 && args[0] == "--config" ? args[1] : "";
  std::reverse(args.begin(), args.end());  // CLI11 takes them last-first
  try {
    // A config that cannot be read whole (a device, a FIFO, a huge file) is an error,
    // never silently the defaults.
    if (!config.empty()) packtrain::runtime::check_input_file(config, "config file", uint64_t{1} << 20);
    app.parse(args);
  } catch (const CLI::ConfigError& e) {
    fmt::print(stderr, "packtrain: error: {}: {} (the keys are the command's flags without dashes)\n", config, e.what());
    return 2;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    fmt::print(stderr, "packtrain: error: {}\n", e.what());
    return 2;
  } catch (const packtrain::runtime::DataError& e) {
    fmt::print(stderr, "packtrain: error: {}\n", e.what());
    return 2;
  } catch (const packtrain::cli::UsageError& e) {
    fmt::print(stderr, "packtrain: error: {}\n", e.what());
    return 2;
  } catch (const packtrain::runtime::distributed::CollectiveError& e) {
    fmt::print(stderr, "packtrain: error: {}\n", e.what());  // a peer died or hangs: not bad input, not a bug
    // An NCCL abort may still be running on a thread of its own: end without the
    // static destructors it could race (checkpoints are committed files already).
    std::fflush(nullptr);
    std::_Exit(1);
  } catch (const c10::Error& e) {
    fmt::print(stderr, "packtrain: internal error: {}\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "packtrain: internal error: {}\n", e.what());
    return 1;
  }
  return standard_output_written(status);
}
