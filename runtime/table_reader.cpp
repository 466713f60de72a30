#include "runtime/table_reader.h"
