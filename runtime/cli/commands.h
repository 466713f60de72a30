// The packtrain subcommands. Each add_* registers its subcommands, their flags and
// --help text on `app`; a subcommand's callback runs it and writes its exit status
// (0 success, 2 bad input, 130 interrupted) to `status`. Errors propagate as
// exceptions: DataError and UsageError mean bad input (main prints one line, exits 2).
#pragma once

#include <CLI/CLI.hpp>

namespace packtrain::cli {

void add_train_commands(CLI::App& app, int& status);    // train, resume
void add_predict_commands(CLI::App& app, int& status);  // predict, evaluate, acquire, export
void add_active_learn_command(CLI::App& app, int& status);
void add_info_commands(CLI::App& app, int& status);       // info, profile
void add_multitask_commands(CLI::App& app, int& status);  // multitask train, resume, score, generate
void add_launch_command(CLI::App& app, int& status);      // launch --nproc N -- <command>

}  // namespace packtrain::cli
