/* exec_cpu: the executor's CPU backend: loom_forward over a host
 * loom_fwd_state. It draws no tokens itself: every row gets logits. */
#include <stdlib.h>

#include "base/base.h"
#include "engine/exec_int.h"

typedef struct cpu_exec {
    loom_exec base;
    loom_model *m;             /* borrowed */
    loom_fwd_state *fwd;       /* owned */
} cpu_exec;

static loom_status cpu_forward(loom_exec *x, loom_kv_pool *kv, loom_fwd_row *rows, int n_rows,
                               int32_t *picks, const loom_sample_pick *samp) {
    cpu_exec *c = (cpu_exec *)x;
    (void)picks;  /* the CPU forward always writes logits */
    (void)samp;
    return loom_forward(c->m, c->fwd, &kv->lay, rows, n_rows);
}

static int cpu_set_taps(loom_exec *x, const int *layers, int n, float *out) {
    loom_fwd_set_taps(((cpu_exec *)x)->fwd, layers, n, out);
    return 1;
}

static void cpu_free(loom_exec *x) {
    cpu_exec *c = (cpu_exec *)x;
    loom_fwd_state_free(c->fwd);
    free(c);
}

static const loom_exec_ops cpu_ops = {
    .forward = cpu_forward, .free = cpu_free, .set_taps = cpu_set_taps, .on_device = 0, .pick_top_k_max = 0,
};

loom_status loom_exec_cpu_create(loom_model *m, int step_tokens, int max_ctx, loom_exec **out) {
    *out = NULL;
    cpu_exec *c = calloc(1, sizeof *c);
    if (!c) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    c->base.ops = &cpu_ops;
    c->m = m;
    loom_status s = loom_fwd_state_create(m, step_tokens, max_ctx, &c->fwd);
    if (s) {
        cpu_free(&c->base);
        return s;
    }
    *out = &c->base;
    return LOOM_OK;
}
