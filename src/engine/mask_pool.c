/* The mask workers: a generation counter under a lock announces each run; every worker takes part
 * in every run (it may find no row left) and the run returns once all have reported, so no worker
 * is still reading a run's arrays when the next one starts. Rows go out through an atomic index. */
#include "engine/mask_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "util/error.h"

typedef struct mask_job {
    grammar_mask_cache *cache;
    grammar_matcher *const *matchers;
    uint32_t *const *masks;
    int32_t n;
} mask_job;

struct mask_pool {
    pthread_t *threads;
    int n_threads;
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    uint64_t generation; // runs announced
    int finished;        // workers done with the current run
    int stop;
    mask_job job;        // the current run's, set under lock before it is announced
    atomic_int next;     // its next row
    atomic_int empty;    // the lowest row whose mask allows nothing (n: none)
};

static void take_rows(mask_pool *p, const mask_job *job) {
    for (;;) {
        const int j = atomic_fetch_add(&p->next, 1);
        if (j >= job->n) return;
        if (grammar_token_mask_shared(job->cache, job->matchers[j], job->masks[j]) == 0) {
            int seen = atomic_load(&p->empty);
            while (j < seen && !atomic_compare_exchange_weak(&p->empty, &seen, j)) {}
        }
    }
}

static void *worker_main(void *arg) {
    mask_pool *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->start, &p->lock);
        if (p->stop) break;
        seen = p->generation;
        const mask_job job = p->job;
        pthread_mutex_unlock(&p->lock);
        take_rows(p, &job);
        pthread_mutex_lock(&p->lock);
        if (++p->finished == p->n_threads) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

nopad_status mask_pool_create(int n_workers, mask_pool **out) {
    *out = NULL;
    if (n_workers < 1)
        return nopad_set_error(NOPAD_ERR_INVALID_ARGUMENT, "mask pool: %d workers; at least 1", n_workers);
    mask_pool *p = calloc(1, sizeof *p);
    if (!p) return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "mask pool: out of memory");
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = malloc((size_t)n_workers * sizeof *p->threads);
    if (!p->threads) {
        mask_pool_free(p);
        return nopad_set_error(NOPAD_ERR_OUT_OF_MEMORY, "mask pool: out of memory");
    }
    for (int i = 0; i < n_workers; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
            mask_pool_free(p);
            return nopad_set_error(NOPAD_ERR_BACKEND, "mask pool: cannot start worker %d of %d", i, n_workers);
        }
        p->n_threads++;
    }
    *out = p;
    return NOPAD_OK;
}

void mask_pool_free(mask_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p);
}

int32_t mask_pool_run(mask_pool *p, grammar_mask_cache *cache, grammar_matcher *const *matchers,
                      uint32_t *const *masks, int32_t n) {
    const mask_job job = {.cache = cache, .matchers = matchers, .masks = masks, .n = n};
    pthread_mutex_lock(&p->lock);
    p->job = job;
    atomic_store(&p->next, 0);
    atomic_store(&p->empty, n);
    p->finished = 0;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    take_rows(p, &job);
    pthread_mutex_lock(&p->lock);
    while (p->finished < p->n_threads) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    const int32_t empty = atomic_load(&p->empty);
    return empty < n ? empty : -1;
}
