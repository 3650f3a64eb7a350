/* libFuzzer target: the safetensors header parser and validator on arbitrary bytes.
 * Beyond "no crash, no leak", a successful parse must keep its promises to the loader: every
 * tensor's bytes lie inside the buffer, they tile the data buffer exactly, names are sorted and
 * found by safetensors_find, and the float conversions read only their own bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    safetensors_file f;
    if (safetensors_parse(data, size, "fuzz", &f) == NOPAD_OK) {
        size_t covered = 0;
        for (int i = 0; i < f.n_tensors; i++) {
            const safetensors_tensor *t = &f.tensors[i];
            const uint8_t *p = t->data;
            if (p < data || p > data + size || t->nbytes > (size_t)(data + size - p))
                __builtin_trap();
            if (t->nbytes != (size_t)t->n_elements * safetensors_dtype_size(t->dtype))
                __builtin_trap();
            if (t->ndim < 0 || t->ndim > SAFETENSORS_MAX_DIMS) __builtin_trap();
            if (i > 0 && strcmp(f.tensors[i - 1].name, t->name) >= 0) __builtin_trap();
            if (safetensors_find(&f, t->name) != t) __builtin_trap();
            covered += t->nbytes;
            /* Touch the tensor's bytes so ASan checks the range, and convert small float ones. */
            if (t->nbytes) {
                volatile uint8_t sink = p[0];
                sink = p[t->nbytes - 1];
                (void)sink;
            }
            if (t->n_elements <= 4096 &&
                (t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16)) {
                float *out = malloc(((size_t)t->n_elements + 1) * sizeof *out);
                if (out && safetensors_to_f32(t, out) != NOPAD_OK) __builtin_trap();
                free(out);
            }
        }
        /* 8-byte length + header + data == file, and the tensors cover the data exactly */
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = (n << 8) | data[i];
        if (covered != size - 8 - (size_t)n) __builtin_trap();
    }
    safetensors_close(&f);
    return 0;
}
