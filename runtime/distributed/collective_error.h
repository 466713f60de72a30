// CollectiveError: a collective that failed, timed out or found the ranks out of
// step (a peer died, hangs, or trained differently). `packtrain` prints its one line
// and exits with status 1 on every rank that sees it.
#pragma once

#include <stdexcept>

namespace packtrain::runtime::distributed {

class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace packtrain::runtime::distributed
