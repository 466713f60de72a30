#include "runtime/data_split.h"
