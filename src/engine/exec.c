/* exec: picks the backend once and forwards every call through its table. */
#include "engine/exec.h"

#include <stddef.h>

#include "base/base.h"
#include "engine/exec_int.h"

loom_status loom_exec_create(loom_model *m, loom_kv_pool *kv, int step_tokens, int max_ctx,
                             loom_exec **out) {
    *out = NULL;
    if (m->device < 0) return loom_exec_cpu_create(m, step_tokens, max_ctx, out);
    /* the one place a build switch decides: the CUDA backend exists only with CUDA=1 */
#ifdef LOOM_CUDA
    if (m->tp_n > 0) return loom_exec_tp_cuda_create(m, kv, step_tokens, max_ctx, out);
    return loom_exec_cuda_create(m, kv, step_tokens, max_ctx, out);
#else
    (void)kv;
    return loom_err(LOOM_ERR_UNSUPPORTED,
                    "device cuda:%d: this loom was built without CUDA (make CUDA=1)", m->device);
#endif
}

void loom_exec_free(loom_exec *x) {
    if (x) x->ops->free(x);
}

loom_status loom_exec_forward(loom_exec *x, loom_kv_pool *kv, loom_fwd_row *rows, int n_rows) {
    return x->ops->forward(x, kv, rows, n_rows, NULL, NULL);
}

loom_status loom_exec_forward_picks(loom_exec *x, loom_kv_pool *kv, loom_fwd_row *rows,
                                    int n_rows, int32_t *picks, const loom_sample_pick *samp) {
    return x->ops->forward(x, kv, rows, n_rows, picks, samp);
}

int loom_exec_set_taps(loom_exec *x, const int *layers, int n, float *out) {
    if (!x->ops->set_taps) return 0;
    return x->ops->set_taps(x, layers, n, out);
}

int loom_exec_on_device(const loom_exec *x) { return x->ops->on_device; }

int loom_exec_pick_for(const loom_exec *x, loom_sampler *s, loom_sample_pick *samp) {
    const loom_sampling *p = &s->p;
    *samp = (loom_sample_pick){0};
    if (p->n_logit_bias || s->window) return 0;
    if (p->temperature <= 0 || p->top_k == 1) return 1;
    if (p->top_k < 2 || p->top_k > x->ops->pick_top_k_max || p->xtc_probability > 0) return 0;
    *samp = (loom_sample_pick){.temperature = p->temperature, .top_p = p->top_p,
                               .min_p = p->min_p, .top_k = p->top_k,
                               .u = loom_sampler_uniform(s)};
    return 1;
}
