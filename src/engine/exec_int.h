/* exec_int: what a backend of the executor provides (engine/exec.h). A
 * backend's state starts with a struct loom_exec whose ops point at its
 * table; loom_exec_create picks the backend, and every other loom_exec_*
 * call goes through the table. */
#ifndef LOOM_EXEC_INT_H
#define LOOM_EXEC_INT_H

#include "engine/exec.h"

typedef struct loom_exec_ops {
    /* loom_exec_forward_picks; a backend that draws no tokens itself may
     * ignore picks and samp (the rows then get logits). */
    loom_status (*forward)(loom_exec *x, loom_kv_pool *kv, loom_fwd_row *rows, int n_rows,
                           int32_t *picks, const loom_sample_pick *samp);
    void (*free)(loom_exec *x);
    /* loom_exec_set_taps, or NULL: the backend exports no hidden states;
     * returns 0 where it cannot this time (the taps are then off) */
    int (*set_taps)(loom_exec *x, const int *layers, int n, float *out);
    int on_device;       /* 1: KV rows live on the device, the host pool holds no K/V data */
    int pick_top_k_max;  /* largest top-k the forward draws a token with (temperature, top-p,
                            min-p); 0: greedy picks only */
} loom_exec_ops;

struct loom_exec {
    const loom_exec_ops *ops; /* static */
};

/* The backends; each frees what it made on an error. */
loom_status loom_exec_cpu_create(loom_model *m, int step_tokens, int max_ctx, loom_exec **out);
/* Built with CUDA=1 only. */
loom_status loom_exec_cuda_create(loom_model *m, loom_kv_pool *kv, int step_tokens, int max_ctx,
                                  loom_exec **out);
/* The model split over m->tp_n ranks (exec_tp_cuda.c). */
loom_status loom_exec_tp_cuda_create(loom_model *m, loom_kv_pool *kv, int step_tokens,
                                     int max_ctx, loom_exec **out);

#endif
