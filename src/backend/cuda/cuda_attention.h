/* The CUDA attention's C entry points now live in attention/attention.h; this name stays for
 * src/backend/attention_api.c until its include moves there. */
#include "backend/cuda/attention/attention.h"
