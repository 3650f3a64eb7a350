#include "util/types.h"

size_t nopad_dtype_size(nopad_dtype dtype) { return dtype == NOPAD_DTYPE_F32 ? 4 : 2; }
