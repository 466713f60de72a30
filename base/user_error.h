// The one type of error a user can fix: bad input, arguments, data, checkpoints or
// configuration. The CLI prints its message and exits with status 2; Python raises
// ValueError. Anything else escaping a command is a bug ("internal error", status 1).
//
//   throw packtrain::UserError("--count 0: choose at least one row");
//
// Layers may keep their own names for it (runtime::DataError, cli::UsageError) by
// deriving from it; a library programmer's misuse stays TORCH_CHECK or
// std::invalid_argument, and our own invariants TORCH_INTERNAL_ASSERT.
#pragma once

#include <stdexcept>

namespace packtrain {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace packtrain
