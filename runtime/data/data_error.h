// The error bad input data raises: names the file, and the line and column where
// that applies, so the CLI can print one line and exit with status 2. A UserError
// (base/user_error.h): Python sees ValueError.
#pragma once

#include "packtrain/base/user_error.h"

namespace packtrain::runtime {

class DataError : public UserError {
 public:
  using UserError::UserError;
};

}  // namespace packtrain::runtime
