/* exec: CPU forward, or the CUDA forward when the model asks for a device. */
#include "engine/exec.h"

#include <stddef.h>
#include <stdlib.h>

#include "base/base.h"
#include "sample/sample.h"
#ifdef LOOM_CUDA
#include "cuda/cuda.h"
#endif

struct loom_exec {
    loom_model *m;             /* borrowed */
    loom_fwd_state *fwd;       /* owned, CPU */
#ifdef LOOM_CUDA
    loom_cuda *cuda;           /* owned, device */
    loom_cuda_model *gpu;      /* owned, device */
#endif
};

loom_status loom_exec_create(loom_model *m, loom_kv_pool *kv, int max_tokens, int max_ctx,
                             loom_exec **out) {
    *out = NULL;
    loom_exec *x = calloc(1, sizeof *x);
    if (!x) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    x->m = m;
    loom_status s;
    if (m->device < 0) {
        s = loom_fwd_state_create(m, max_tokens, max_ctx, &x->fwd);
    } else {
#ifdef LOOM_CUDA
        /* the device twin of the pool is one row layout for every layer */
        if (kv->lay.mixed)
            s = loom_err(LOOM_ERR_UNSUPPORTED,
                         "device cuda:%d: per-layer KV types (kv_config.json) are not supported on "
                         "CUDA; expected one KV type for every layer", m->device);
        else
            s = loom_cuda_create(m->device, &x->cuda);
        if (!s) s = loom_cuda_model_create(x->cuda, m, &kv->lay, max_tokens, max_ctx, &x->gpu);
#else
        (void)kv;
        s = loom_err(LOOM_ERR_UNSUPPORTED,
                     "device cuda:%d: this loom was built without CUDA (make CUDA=1)", m->device);
#endif
    }
    if (s) {
        loom_exec_free(x);
        return s;
    }
    *out = x;
    return LOOM_OK;
}

void loom_exec_free(loom_exec *x) {
    if (!x) return;
    loom_fwd_state_free(x->fwd);
#ifdef LOOM_CUDA
    loom_cuda_model_free(x->gpu);
    loom_cuda_free(x->cuda);
#endif
    free(x);
}

loom_status loom_exec_forward(loom_exec *x, loom_kv_pool *kv, loom_fwd_row *rows, int n_rows) {
    return loom_exec_forward_picks(x, kv, rows, n_rows, NULL, NULL);
}

#ifdef LOOM_CUDA
/* The two structs are one layout: the engine fills this one, the device
 * reads it as loom_cuda_sampling. */
_Static_assert(sizeof(loom_exec_sampling) == sizeof(loom_cuda_sampling) &&
                   offsetof(loom_exec_sampling, top_k) == offsetof(loom_cuda_sampling, top_k) &&
                   offsetof(loom_exec_sampling, u) == offsetof(loom_cuda_sampling, u),
               "loom_exec_sampling and loom_cuda_sampling differ");
#endif

loom_status loom_exec_forward_picks(loom_exec *x, loom_kv_pool *kv, loom_fwd_row *rows,
                                    int n_rows, int32_t *picks, const loom_exec_sampling *samp) {
#ifdef LOOM_CUDA
    if (x->gpu)
        return loom_cuda_forward(x->gpu, &kv->lay, rows, n_rows, picks,
                                 (const loom_cuda_sampling *)(const void *)samp);
#endif
    (void)picks;  /* the CPU forward always writes logits */
    (void)samp;
    return loom_forward(x->m, x->fwd, &kv->lay, rows, n_rows);
}

int loom_exec_on_device(const loom_exec *x) { return x->fwd == NULL; }

int loom_exec_pick_for(const loom_exec *x, loom_sampler *s, loom_exec_sampling *samp) {
    const loom_sampling *p = &s->p;
    *samp = (loom_exec_sampling){0};
    if (p->n_logit_bias || s->window) return 0;
    if (p->temperature <= 0 || p->top_k == 1) return 1;
    if (p->top_k < 2 || p->top_k > 64 || p->xtc_probability > 0 || !loom_exec_on_device(x))
        return 0;
    *samp = (loom_exec_sampling){.temperature = p->temperature, .top_p = p->top_p,
                                 .min_p = p->min_p, .top_k = p->top_k,
                                 .u = loom_sampler_uniform(s)};
    return 1;
}
