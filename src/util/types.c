#include "util/types.h"

size_t nopad_dtype_size(nopad_dtype dtype) { return dtype == NOPAD_DTYPE_F32 ? 4 : 2; }

const char *nopad_dtype_name(nopad_dtype dtype) {
    return dtype == NOPAD_DTYPE_F32 ? "F32" : dtype == NOPAD_DTYPE_F16 ? "F16" : "BF16";
}
