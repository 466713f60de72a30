// Compiled as part of runtime/data (tests/layering/CMakeLists.txt): data/ is the
// lowest room, so a trainers/ header must not be found. The test passes only when
// the compiler says so.
#include "packtrain/runtime/trainers/ensemble/ensemble_trainer.h"
