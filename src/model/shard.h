/* shard: one rank's part of a model under tensor parallelism (the
 * Megatron split): rank r of n keeps q heads [r nh/n, (r+1) nh/n) and the
 * KV heads they read (split when there are at least n, else the one its
 * heads share, replicated), the gate/up rows [r I/n, (r+1) I/n), and the
 * o and down projections' matching columns; embeddings and norms whole,
 * the head on rank 0 only (the others name the embeddings there, which
 * they never multiply by), and the o projection's bias on rank 0 only. The ranks' o and
 * down outputs then sum (an all-reduce) to the unsplit model's, up to the
 * order of that sum. Row slices borrow the model's weights; column slices
 * are copied. Dense attention models only (no MoE, linear attention,
 * per-layer inputs or shared KV), F32/F16/BF16 weights, as stored (a
 * model loaded for a device, or on the CPU with no_copy). */
#ifndef LOOM_SHARD_H
#define LOOM_SHARD_H

#include "model/model.h"

/* *out borrows m (which must outlive it); free it with loom_model_shard_free,
 * never loom_model_free. n = 1 gives a copy of the whole model's views. */
loom_status loom_model_shard(const loom_model *m, int rank, int n, loom_model **out);
void loom_model_shard_free(loom_model *s);

#endif
