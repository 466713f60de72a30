#include "runtime/checkpoint_file.h"
