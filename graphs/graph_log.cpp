#include "packtrain/graphs/graph_log.h"

#include <cstdio>

namespace packtrain::graphs {

void log_to_stderr(const std::string& message) { std::fprintf(stderr, "[packtrain] %s\n", message.c_str()); }

}  // namespace packtrain::graphs
