#include "runtime/dataset.h"
