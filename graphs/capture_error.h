// CaptureError: a step that cannot be captured as a CUDA graph, most often because
// it synchronizes the host with the device (.item(), .cpu(), nonzero, a shape that
// depends on data). The message names the step and what to change.
#pragma once

#include <stdexcept>
#include <string>

namespace packtrain::graphs {

class CaptureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace packtrain::graphs
