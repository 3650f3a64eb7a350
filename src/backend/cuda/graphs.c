/* The CUDA backend's cache of recorded forwards: a key (the caller's description of a forward's
 * shape) seen twice is recorded into a CUDA graph by stream capture and replayed from then on, up
 * to GRAPH_CACHE_SIZE graphs, the least recently used evicted. */
#ifdef NOPAD_HAVE_CUDA

#include <string.h>

#include "backend/cuda/state.h"

void cuda_graph_clear(nopad_backend *be) {
    cuda_state *s = state_of(be);
    cuda_use_device(s);
    if (s->n_graphs) cudaStreamSynchronize(s->stream); /* none may still be running */
    for (int i = 0; i < s->n_graphs; i++) cudaGraphExecDestroy(s->graphs[i].exec);
    s->n_graphs = 0;
    be->graphs_held = 0;
    memset(s->seen, 0, sizeof s->seen);
}

/* Records record(ctx) by stream capture (the kernels are noted, not run) into *exec. Any failure,
 * of the ops or of the capture, leaves *exec NULL with the CUDA error state cleared. */
static void record_graph(cuda_state *s, nopad_status (*record)(void *ctx), void *ctx,
                         cudaGraphExec_t *exec) {
    *exec = NULL;
    /* thread-local mode: other threads of the process may keep calling CUDA while we capture */
    if (cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    nopad_status st = record(ctx);
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(s->stream, &graph);
    if (st == NOPAD_OK && err == cudaSuccess && graph) err = cudaGraphInstantiate(exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (st != NOPAD_OK || err != cudaSuccess) {
        cudaGetLastError();
        *exec = NULL;
    }
}

/* A key is recorded the second time it is seen: a shape that comes once is not worth the
 * recording (about as long as running it, plus instantiation). */
static int seen_before(cuda_state *s, const int64_t key[4]) {
    for (int i = 0; i < SEEN_KEYS; i++)
        if (memcmp(s->seen[i], key, sizeof s->seen[i]) == 0) return 1;
    memcpy(s->seen[s->next_seen], key, sizeof s->seen[0]);
    s->next_seen = (s->next_seen + 1) % SEEN_KEYS;
    return 0;
}

nopad_status cuda_graph_run(nopad_backend *be, const int64_t key[4],
                            nopad_status (*record)(void *ctx), void *ctx) {
    CUDA_ENTER(be, s);
    /* the caller is recording our stream into a graph of its own: the ops go there directly */
    enum cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s->stream, &capturing) != cudaSuccess) cudaGetLastError();
    if (capturing != cudaStreamCaptureStatusNone) return record(ctx);
    graph_entry *e = NULL;
    for (int i = 0; i < s->n_graphs && !e; i++)
        if (memcmp(s->graphs[i].key, key, sizeof s->graphs[i].key) == 0) e = &s->graphs[i];
    if (!e) {
        if (s->cannot_record || !seen_before(s, key)) return record(ctx);
        cudaGraphExec_t exec;
        record_graph(s, record, ctx, &exec);
        if (!exec) {
            /* run the ops directly: a genuine error shows there; if they succeed, it was the
             * capture that failed (e.g. a caller's stream that cannot be captured) */
            nopad_status st = record(ctx);
            if (st == NOPAD_OK) s->cannot_record = 1;
            return st;
        }
        if (s->n_graphs == GRAPH_CACHE_SIZE) { /* evict the least recently used */
            int lru = 0;
            for (int i = 1; i < s->n_graphs; i++)
                if (s->graphs[i].last_use < s->graphs[lru].last_use) lru = i;
            cudaStreamSynchronize(s->stream);
            cudaGraphExecDestroy(s->graphs[lru].exec);
            s->graphs[lru] = s->graphs[--s->n_graphs];
        }
        e = &s->graphs[s->n_graphs++];
        memcpy(e->key, key, sizeof e->key);
        e->exec = exec;
        be->graphs_recorded++;
        be->graphs_held = s->n_graphs;
    }
    e->last_use = ++s->graph_clock;
    be->graph_replays++;
    return cuda_check(cudaGraphLaunch(e->exec, s->stream), "graph launch");
}

void cuda_graph_destroy_all(cuda_state *s) {
    for (int i = 0; i < s->n_graphs; i++) cudaGraphExecDestroy(s->graphs[i].exec);
    s->n_graphs = 0;
}

#endif /* NOPAD_HAVE_CUDA */
