#include "runtime/model_export.h"
