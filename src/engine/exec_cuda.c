/* exec_cuda: the executor's CUDA backend (built with CUDA=1 only): the
 * device twin of the pool holds the K/V rows, the host pool the block
 * tables; the forward may pick tokens on the device, and exports a
 * drafter's hidden states to the host (loom_cuda_set_taps). */
#include <stdlib.h>

#include "base/base.h"
#include "cuda/cuda.h"
#include "engine/exec_int.h"

typedef struct cuda_exec {
    loom_exec base;
    loom_cuda *cuda;           /* owned, device */
    loom_cuda_model *gpu;      /* owned, device */
} cuda_exec;

static loom_status cuda_forward(loom_exec *x, loom_kv_pool *kv, loom_fwd_row *rows, int n_rows,
                                int32_t *picks, const loom_sample_pick *samp) {
    cuda_exec *g = (cuda_exec *)x;
    return loom_cuda_forward(g->gpu, &kv->lay, rows, n_rows, picks, samp);
}

static int cuda_set_taps(loom_exec *x, const int *layers, int n, float *out) {
    if (loom_cuda_set_taps(((cuda_exec *)x)->gpu, layers, n, out) == LOOM_OK) return 1;
    loom_log(LOOM_LOG_WARN, "%s", loom_last_error());
    return 0;
}

static void cuda_free(loom_exec *x) {
    cuda_exec *g = (cuda_exec *)x;
    loom_cuda_model_free(g->gpu);
    loom_cuda_free(g->cuda);
    free(g);
}

static const loom_exec_ops cuda_ops = {
    .forward = cuda_forward, .free = cuda_free, .set_taps = cuda_set_taps, .on_device = 1,
    .pick_top_k_max = LOOM_CUDA_TOPK_MAX,
};

loom_status loom_exec_cuda_create(loom_model *m, loom_kv_pool *kv, int step_tokens, int max_ctx,
                                  loom_exec **out) {
    *out = NULL;
    cuda_exec *g = calloc(1, sizeof *g);
    if (!g) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    g->base.ops = &cuda_ops;
    loom_status s;
    /* the device twin of the pool is one row layout for every layer */
    if (kv->lay.mixed)
        s = loom_err(LOOM_ERR_UNSUPPORTED,
                     "device cuda:%d: per-layer KV types (kv_config.json) are not supported on "
                     "CUDA; expected one KV type for every layer", m->device);
    else
        s = loom_cuda_create(m->device, &g->cuda);
    if (!s) s = loom_cuda_model_create(g->cuda, m, &kv->lay, step_tokens, max_ctx, &g->gpu);
    if (s) {
        cuda_free(&g->base);
        return s;
    }
    *out = &g->base;
    return LOOM_OK;
}
