// The error bad input data raises: names the file, and the line and column where
// that applies, so the CLI can print one line and exit with status 2.
#pragma once

#include <stdexcept>
#include <string>

namespace packtrain::runtime {

class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace packtrain::runtime
