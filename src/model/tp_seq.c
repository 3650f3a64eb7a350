/* Sequence parallelism (tp.h): the row split of a forward, and its two seams, where the CUDA
 * backend's fused communication GEMMs are to come in. */
#include "model/tp.h"
#include "util/types.h"

int tp_seq_plan(const tp_shard *tp, int32_t T, tp_seq *out) {
    if (!tp->comm || tp->seq_min_tokens <= 0 || T < tp->seq_min_tokens) return 0;
    out->chunk = (T + tp->size - 1) / tp->size;
    out->row0 = tp->rank * out->chunk;
    const int32_t left = T - out->row0;
    out->rows = left < 0 ? 0 : left < out->chunk ? left : out->chunk;
    return 1;
}

nopad_status tp_linear(nopad_backend *be, void *out, const void *x, const void *w, nopad_weight_format format,
                       const void *bias, int32_t T, int32_t K, int32_t N, nopad_epilogue epilogue,
                       nopad_activation act) {
    if (format == NOPAD_WEIGHT_DTYPE) return be->gemm(be, out, x, w, bias, NULL, T, K, N, epilogue, act);
    return be->gemm_q(be, out, x, w, format, bias, NULL, T, K, N, epilogue, act, 0);
}

/* The seams run the collective, then the GEMM (or the GEMM, then the collective). The CUDA backend's
 * fused kernels (backend/cuda/flux/, docs/parallel.md) do each pair in one: cuda_flux_ag_gemm
 * consumes the peers' chunks tile by tile as they arrive (cuda_flux_ag_push sending this rank's
 * chunk from a second stream), cuda_flux_gemm_rs writes each output tile into its owner's inbox as
 * it is done. They go here, where cuda_flux_wins(all_gather, T, K, N, size) says they pay, once the
 * peers are set up: per model, each rank's gathered buffer, inbox, signal and error words allocated,
 * exchanged over the communicator (cudaIpcGetMemHandle handles through a host all-gather, or NCCL
 * window pointers) into a cuda_flux_peers; a new epoch from a per-context counter each call, the
 * timeout NOPAD_COMM_TIMEOUT's, and cuda_flux_check at the step's end. Not built yet. */

nopad_status tp_ag_linear(nopad_backend *be, const tp_shard *tp, const tp_seq *sq, void *out, void *x,
                          const void *w, nopad_weight_format format, const void *bias, int32_t T, int32_t K,
                          int32_t N, nopad_epilogue epilogue, nopad_activation act) {
    const size_t part = (size_t)sq->chunk * K, es = nopad_dtype_size(be->dtype);
    nopad_status st = comm_all_gather(tp->comm, be, x, (char *)x + (size_t)tp->rank * part * es, part,
                                      comm_type_of(be->dtype));
    return st != NOPAD_OK ? st : tp_linear(be, out, x, w, format, bias, T, K, N, epilogue, act);
}

nopad_status tp_linear_rs(nopad_backend *be, const tp_shard *tp, const tp_seq *sq, void *out, const void *x,
                          const void *w, nopad_weight_format format, const void *bias, int32_t T, int32_t K,
                          int32_t N, nopad_epilogue epilogue, nopad_activation act) {
    nopad_status st = tp_linear(be, out, x, w, format, bias, T, K, N, epilogue, act);
    const size_t part = (size_t)sq->chunk * N, es = nopad_dtype_size(be->dtype);
    return st != NOPAD_OK ? st : comm_reduce_scatter(tp->comm, be, (char *)out + (size_t)tp->rank * part * es, out,
                                                     part, comm_type_of(be->dtype), COMM_SUM);
}
