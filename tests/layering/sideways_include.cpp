// Compiled as part of runtime/io (tests/layering/CMakeLists.txt): io/ depends on no
// other room of runtime/, so data/'s headers must not be found either.
#include "packtrain/runtime/data/data_error.h"
