/* CPU: losses (softmax cross-entropy, squared error) and optimiser steps (AdamW, LAMB) on float32
 * master weights. Per-element arithmetic runs in double: these are the reference for the fused
 * CUDA kernels, and one step of either optimiser is compared with PyTorch to 1e-5. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"

nopad_status cpu_cross_entropy(nopad_backend *be, float *losses, void *dlogits_,
                               const void *logits_, const int32_t *labels, int32_t n,
                               int32_t classes, float grad_scale) {
    float *dlogits = dlogits_;       // [n, classes], may alias logits
    const float *logits = logits_;   // [n, classes]
#pragma omp parallel for schedule(static) num_threads(cpu_threads(be))
    for (int32_t r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * classes;
        float *dx = dlogits + (size_t)r * classes;
        double max = -INFINITY, sum = 0;
        for (int32_t c = 0; c < classes; c++) max = x[c] > max ? x[c] : max;
        for (int32_t c = 0; c < classes; c++) sum += exp(x[c] - max);
        const double lse = max + log(sum);
        losses[r] = (float)(lse - x[labels[r]]);
        for (int32_t c = 0; c < classes; c++)
            dx[c] = (float)((exp(x[c] - lse) - (c == labels[r] ? 1.0 : 0.0)) * grad_scale);
    }
    return NOPAD_OK;
}

nopad_status cpu_squared_error(nopad_backend *be, float *losses, void *dpred_, const void *pred_,
                               const float *target, int32_t n, float grad_scale) {
    float *dpred = dpred_;       // [n], may alias pred
    const float *pred = pred_;   // [n]
    for (int32_t r = 0; r < n; r++) {
        const double diff = (double)pred[r] - target[r];
        losses[r] = (float)(diff * diff);
        dpred[r] = (float)(2.0 * diff * grad_scale);
    }
    return NOPAD_OK;
}

/* The CPU computes in float32: a compute copy, when a caller keeps one, is the weights as they are. */
static void copy_to_compute(const nopad_opt_tensor *t) {
    if (t->param_compute && t->param_compute != (void *)t->param)
        memcpy(t->param_compute, t->param, (size_t)t->n * sizeof(float));
}

nopad_status cpu_adamw(nopad_backend *be, const nopad_opt_tensor *tensors, int32_t n_tensors,
                       const nopad_opt_step *h) {
    const double b1 = h->beta1, b2 = h->beta2, lr = h->lr, eps = h->eps;
    const double bc1 = 1.0 - pow(b1, (double)h->step), bc2 = 1.0 - pow(b2, (double)h->step);
    for (int32_t k = 0; k < n_tensors; k++) {
        const nopad_opt_tensor *t = &tensors[k];
        const float *g = t->grad;
        const double decay = 1.0 - lr * t->weight_decay;
#pragma omp parallel for schedule(static) num_threads(cpu_threads(be))
        for (int64_t i = 0; i < t->n; i++) {
            const double m = b1 * t->m[i] + (1.0 - b1) * g[i];
            const double v = b2 * t->v[i] + (1.0 - b2) * (double)g[i] * g[i];
            t->m[i] = (float)m;
            t->v[i] = (float)v;
            /* torch.optim.AdamW: p·(1 - lr·wd), then - lr·m̂ / (√v̂ + eps) */
            t->param[i] = (float)(t->param[i] * decay - lr * (m / bc1) / (sqrt(v / bc2) + eps));
        }
        copy_to_compute(t);
    }
    return NOPAD_OK;
}

/* ‖(g_1, …, g_n)‖₂ over every tensor's gradient, summed in double. */
static double global_grad_norm(const nopad_opt_tensor *tensors, int32_t n_tensors, int n_threads) {
    double sum_sq = 0;
    for (int32_t k = 0; k < n_tensors; k++) {
        const float *g = tensors[k].grad;
#pragma omp parallel for schedule(static) reduction(+ : sum_sq) num_threads(n_threads)
        for (int64_t i = 0; i < tensors[k].n; i++) sum_sq += (double)g[i] * g[i];
    }
    return sqrt(sum_sq);
}

nopad_status cpu_lamb(nopad_backend *be, const nopad_opt_tensor *tensors, int32_t n_tensors,
                      const nopad_opt_step *h, float *grad_norm) {
    const int n_threads = cpu_threads(be);
    const double norm = global_grad_norm(tensors, n_tensors, n_threads);
    if (grad_norm) *grad_norm = (float)norm;
    /* apex divides the gradients by norm / max_grad_norm when the norm exceeds the bound */
    const double clip = h->max_grad_norm > 0 && norm > h->max_grad_norm ? norm / h->max_grad_norm : 1.0;
    const double b1 = h->beta1, b2 = h->beta2, eps = h->eps;
    const double bc1 = 1.0 - pow(b1, (double)h->step), bc2 = 1.0 - pow(b2, (double)h->step);
    for (int32_t k = 0; k < n_tensors; k++) {
        const nopad_opt_tensor *t = &tensors[k];
        const float *g = t->grad;
        const double wd = t->weight_decay;
        /* Pass 1: the moments, and the norms of the parameter and of the update
         * u = m̂ / (√v̂ + eps) + wd·p, which pass 2 recomputes rather than stores. */
        double p_sq = 0, u_sq = 0;
#pragma omp parallel for schedule(static) reduction(+ : p_sq, u_sq) num_threads(n_threads)
        for (int64_t i = 0; i < t->n; i++) {
            const double gc = g[i] / clip;
            const double m = b1 * t->m[i] + (1.0 - b1) * gc;
            const double v = b2 * t->v[i] + (1.0 - b2) * gc * gc;
            t->m[i] = (float)m;
            t->v[i] = (float)v;
            /* from the stored (float) moments, as pass 2 sees them */
            const double u = ((double)t->m[i] / bc1) / (sqrt((double)t->v[i] / bc2) + eps) +
                             wd * t->param[i];
            p_sq += (double)t->param[i] * t->param[i];
            u_sq += u * u;
        }
        double ratio = 1.0;
        if (wd != 0.0 && p_sq > 0 && u_sq > 0) ratio = sqrt(p_sq) / sqrt(u_sq);
        const double step = h->lr * ratio;
#pragma omp parallel for schedule(static) num_threads(n_threads)
        for (int64_t i = 0; i < t->n; i++) {
            const double u = ((double)t->m[i] / bc1) / (sqrt((double)t->v[i] / bc2) + eps) +
                             wd * t->param[i];
            t->param[i] = (float)(t->param[i] - step * u);
        }
        copy_to_compute(t);
    }
    return NOPAD_OK;
}

nopad_status cpu_clip_grad_norm(nopad_backend *be, const nopad_opt_tensor *tensors,
                                int32_t n_tensors, float max_norm, float *grad_norm) {
    const int n_threads = cpu_threads(be);
    const double norm = global_grad_norm(tensors, n_tensors, n_threads);
    if (grad_norm) *grad_norm = (float)norm;
    /* torch: clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1 */
    const double coef = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
    if (coef >= 1.0) return NOPAD_OK;
    for (int32_t k = 0; k < n_tensors; k++) {
        float *g = (float *)tensors[k].grad; /* the gradient buffer the caller handed in */
#pragma omp parallel for schedule(static) num_threads(n_threads)
        for (int64_t i = 0; i < tensors[k].n; i++) g[i] = (float)(g[i] * coef);
    }
    return NOPAD_OK;
}
