/* Process-wide facts the CUDA op families share, callable from C and CUDA: the device a call runs
 * on, its SM count, and whether kernels launch with programmatic dependent launch. */
#ifndef NOPAD_BACKEND_CUDA_COMMON_H
#define NOPAD_BACKEND_CUDA_COMMON_H

#ifdef __cplusplus
extern "C" {
#endif

/* Per-device state (SM counts, kernels' shared-memory attributes) is kept in arrays of this many
 * device ordinals; a device at or above it gets the fallbacks below. */
enum { CUDA_MAX_DEVICES = 64 };

/* Per-device caches (a function attribute set, a query's answer) are filled by whichever thread
 * comes first; contexts on several threads may race to fill one, which is harmless (the value is
 * the same) as long as the slot itself is read and written atomically: these two do that. */
static inline int cuda_cache_load(const int *slot) { return __atomic_load_n(slot, __ATOMIC_ACQUIRE); }
static inline void cuda_cache_store(int *slot, int value) { __atomic_store_n(slot, value, __ATOMIC_RELEASE); }

/* The current device's ordinal, or -1 when the query fails or it is >= CUDA_MAX_DEVICES. */
int cuda_current_device(void);

/* SMs of the current device, read once per device; 132 (the H100 / H200 count) if the query fails:
 * only grid sizes and tile choices depend on it. */
int cuda_sm_count(void);

/* Programmatic dependent launch (Hopper): a kernel launched with programmatic stream serialisation
 * is scheduled while the kernel before it drains, loads what does not depend on it (weights,
 * biases) and waits in griddepcontrol.wait until that kernel's results are visible. Without the
 * attribute the wait returns at once. 1 unless NOPAD_PDL=0 (util/knobs.c). */
int cuda_pdl_enabled(void);

/* The same for the tensor-core kernels (CUTLASS GEMMs, attention): 1 unless NOPAD_PDL=0 or
 * NOPAD_PDL_TENSOR=0. */
int cuda_pdl_tensor_enabled(void);

#ifdef __cplusplus
}
#endif
#endif
