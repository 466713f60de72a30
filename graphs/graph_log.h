// Where the graph layer reports what it decided (a fallback to eager and its reason,
// a capture). Never silent: the default writes one line to stderr.
#pragma once

#include <functional>
#include <string>

namespace packtrain::graphs {

using GraphLog = std::function<void(const std::string& message)>;

// Writes "[packtrain] <message>" to stderr.
void log_to_stderr(const std::string& message);

}  // namespace packtrain::graphs
