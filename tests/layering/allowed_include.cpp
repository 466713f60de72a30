// The control of upward_include.cpp: the same room's own header, and a lower
// layer's, compile in the same setting.
#include "packtrain/ensemble/packed_mlp.h"
#include "packtrain/runtime/data/data_split.h"
