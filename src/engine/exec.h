/* exec: where forwards run. An executor is one backend behind a small
 * table of functions (engine/exec_int.h), chosen once by loom_exec_create:
 * the CPU forward (exec_cpu.c: loom_forward over a host loom_fwd_state),
 * or, for a model loaded with device >= 0 in a binary built with CUDA=1,
 * the CUDA forward (exec_cuda.c: loom_cuda_forward, the host KV pool
 * keeping only the block tables). The engine and contexts hold one exec
 * each, next to their KV pool, and never name a backend. */
#ifndef LOOM_EXEC_H
#define LOOM_EXEC_H

#include "engine/kv.h"
#include "model/forward.h"
#include "sample/sample.h"

typedef struct loom_exec loom_exec;

/* Activations for step_tokens tokens per forward (all rows together) over
 * sequences of up to max_ctx positions, for the pool kv (which must outlive
 * the exec). */
loom_status loom_exec_create(loom_model *m, loom_kv_pool *kv, int step_tokens, int max_ctx,
                             loom_exec **out);
void loom_exec_free(loom_exec *x);
loom_status loom_exec_forward(loom_exec *x, loom_kv_pool *kv, loom_fwd_row *rows, int n_rows);

/* The same; picks NULL or [n_rows]: a row with picks[r] == -1 and logits
 * LAST may come back with its token there instead of logits in out: the
 * greedy one, or, when samp is given and samp[r].temperature > 0, one drawn
 * with samp[r] (the device forward does it; the CPU forward leaves picks
 * alone, so -1 afterwards means "sample from out"). */
loom_status loom_exec_forward_picks(loom_exec *x, loom_kv_pool *kv, loom_fwd_row *rows,
                                    int n_rows, int32_t *picks, const loom_sample_pick *samp);
/* Until set again, forwards write the hidden states after layers[0..n)
 * of every token (rows in order) to out [tokens, n * hidden]
 * (loom_fwd_set_taps; on the device loom_cuda_set_taps, copied back with
 * the logits); out NULL stops it. Returns 0 where the backend cannot
 * (then the taps are off). */
int loom_exec_set_taps(loom_exec *x, const int *layers, int n, float *out);
/* 1 when the KV rows live on a device (the host pool holds no K/V data). */
int loom_exec_on_device(const loom_exec *x);

/* Whether the forward may pick sampler s's next token itself instead of
 * returning logits: greedy, or, on a backend that draws tokens (the
 * device: top-k up to 64), temperature with top-k from 2, top-p and min-p;
 * never with a logit bias or a penalty window (log-
 * probabilities are the caller's to rule out). 1: ask with picks[r] = -1
 * and *samp (a drawn pick has taken s's next uniform draw); 0: the row
 * needs its logits. */
int loom_exec_pick_for(const loom_exec *x, loom_sampler *s, loom_sample_pick *samp);

#endif
