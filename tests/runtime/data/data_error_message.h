// The message of the DataError a callable throws, for the data-loading tests.
#pragma once

#include "packtrain/runtime/data/data_error.h"

#include <string>

namespace packtrain::runtime {

// The message of the DataError `f` throws, or "no error". Any other exception
// escapes and fails the test.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace packtrain::runtime
