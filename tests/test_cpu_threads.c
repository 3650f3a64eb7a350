/* The CPU backend's thread use on a decode step: the row ops on one token (embedding, norm,
 * residual add, add + norm, rotary + KV store, SwiGLU) must not ask OpenMP for a second thread,
 * which would have nothing to do but still be woken and waited for, a stall per op when the
 * cores are shared (docs/cpu.md). With several tokens they still use the backend's threads.
 *
 * The library is linked statically into this program, so its calls to libgomp's GOMP_parallel
 * (where GCC sends `#pragma omp parallel` and `parallel for` with a static schedule) land on the
 * definition below, which counts the regions by the thread count asked for and calls libgomp's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "testutil.h"

static int regions, regions_multi; /* regions asked for; those with more than one thread */

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    static void (*libgomp_parallel)(void (*)(void *), void *, unsigned, unsigned);
    if (!libgomp_parallel) *(void **)&libgomp_parallel = dlsym(RTLD_NEXT, "GOMP_parallel");
    regions++;
    if (num_threads != 1) regions_multi++; /* 0: the runtime's default, several */
    libgomp_parallel(fn, data, num_threads, flags);
}

enum { DIM = 128, HEADS = 2, KV_HEADS = 1, HEAD = 64, FF = 256, VOCAB = 16, MAX_TOKENS = 8 };

/* Every decoder row op once on n_tokens tokens (values are irrelevant: only the regions count). */
static void decoder_row_ops(nopad_backend *be, int32_t n_tokens) {
    static float h[MAX_TOKENS * DIM], x[MAX_TOKENS * DIM], out[MAX_TOKENS * DIM], w[DIM];
    static float word[VOCAB * DIM], inv_freq[HEAD / 2];
    static float qkv[MAX_TOKENS * (HEADS + 2 * KV_HEADS) * HEAD];
    static float k_cache[MAX_TOKENS * KV_HEADS * HEAD], v_cache[MAX_TOKENS * KV_HEADS * HEAD];
    static float gate_up[MAX_TOKENS * 2 * FF], act[MAX_TOKENS * FF];
    int32_t tokens[MAX_TOKENS], positions[MAX_TOKENS];
    for (int32_t t = 0; t < n_tokens; t++) tokens[t] = positions[t] = t;
    assert_int_equal(be->embed_tokens(be, h, tokens, NULL, NULL, n_tokens, VOCAB, 0, VOCAB, 0, word, NULL, DIM), NOPAD_OK);
    assert_int_equal(be->norm(be, out, h, w, NULL, 1e-5f, n_tokens, DIM, 1), NOPAD_OK);
    assert_int_equal(be->residual_add(be, h, x, n_tokens, DIM), NOPAD_OK);
    assert_int_equal(be->add_norm(be, out, h, x, w, NULL, 1e-5f, n_tokens, DIM, 1), NOPAD_OK);
    assert_int_equal(be->rope_kv_store(be, qkv, k_cache, v_cache, positions, positions, n_tokens,
                                       HEADS, KV_HEADS, HEAD, inv_freq),
                     NOPAD_OK);
    assert_int_equal(be->swiglu(be, act, gate_up, n_tokens, FF), NOPAD_OK);
}

static void test_one_token_runs_on_the_calling_thread(void **state) {
    nopad_backend *be;
    assert_int_equal(nopad_backend_cpu_create(2, &be), NOPAD_OK);
    regions = regions_multi = 0;
    decoder_row_ops(be, 1);
    assert_true(regions > 0); /* the counting above sees the library's regions */
    assert_int_equal(regions_multi, 0);

    regions = regions_multi = 0;
    decoder_row_ops(be, MAX_TOKENS);
    assert_true(regions_multi > 0); /* several tokens: still split across the threads */
    be->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_token_runs_on_the_calling_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
