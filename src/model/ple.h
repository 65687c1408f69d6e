/* ple: Gemma 4's per-layer inputs. Not part of the model API. */
#ifndef LOOM_PLE_H
#define LOOM_PLE_H

#include "model/fwd_buf.h"
#include "model/fwd_row.h"

/* The per-layer inputs of up to step_tokens tokens; only models with
 * per-layer inputs have one. Owned by the forward state. */
typedef struct loom_ple_state loom_ple_state;

/* The state and its buffers, recorded in b (the forward state's, which
 * frees them); NULL, with b->failed set, when out of memory. */
loom_ple_state *loom_ple_state_create(const loom_model *m, int step_tokens, loom_fwd_bufs *b);

/* Every layer's input for the rows' T tokens, from their scaled token
 * embeddings x (T, hidden). */
void loom_ple_inputs(loom_model *m, loom_ple_state *s, const float *x, const loom_fwd_row *rows,
                     int n_rows, int T);

/* After layer l: x (T, hidden) += its per-layer input block; xb (T,
 * hidden) is scratch. */
void loom_ple_block(loom_model *m, loom_ple_state *s, const loom_layer *L, int l, float *x,
                    float *xb, int T);

#endif
