/* fwd_internal: the forward state: the dense path's buffers (forward.c)
 * and, for each feature the model has, that feature's own state, so a
 * dense model carries none of theirs. Not part of the model API (tests
 * set the attention split's fields). */
#ifndef LOOM_FWD_INTERNAL_H
#define LOOM_FWD_INTERNAL_H

#include "model/forward.h"
#include "model/fwd_buf.h"
#include "model/linear_attn.h"
#include "model/moe.h"
#include "model/ple.h"

struct loom_fwd_state {
    int step_tokens, max_ctx, n_threads;
    /* loom_fwd_set_taps: the hidden states after these layers go to taps */
    const int *tap_layers;   /* [n_taps] borrowed */
    int n_taps;
    float *taps;             /* borrowed [step_tokens, n_taps * hidden] */
    float *x;          /* (step_tokens, hidden) residual stream */
    float *xb;         /* (step_tokens, hidden) normed input / block output */
    float *qraw;       /* (step_tokens, max_q_dim) q_proj output (with gate) */
    float *q;          /* (step_tokens, n_heads * max_head_dim) */
    float *gate;       /* (step_tokens, n_heads * max_head_dim) attention output gate */
    float *kx, *vx;    /* (step_tokens, kv_dim) this step's keys and values */
    float *att;        /* (step_tokens, n_heads * max_head_dim) attention output */
    float *hb, *hb2;   /* (step_tokens, max_inter) */
    float *cos, *sin;  /* (n_ropes, step_tokens, max_rot / 2) */
    int max_rot;
    float *scores;     /* (n_threads, att_slots, max_ctx) attention scores */
    int att_slots;     /* query rows an attention task may hold */
    int *tiles;        /* [2 * step_tokens] attention tiles [ta, tb) */
    float *att_tmp;    /* (n_threads, att_tmp_per) attention tiles' scratch (forward.c) */
    size_t att_tmp_per;
    /* Decode tokens whose key span reaches att_split (0: never) attend by
     * chunks of att_chunk positions over all KV heads (forward.c). */
    int att_split, att_chunk;
    int att_parts;     /* (token, chunk) partial results one dispatch may hold */
    long att_split_tokens; /* decode tokens that went by chunks (tests read it) */
    float *att_part;   /* (att_parts, n_heads, max_head_dim + 2) chunk outputs, max, sum */
    int *split_task;   /* [3 * att_parts] a chunk task's token and positions [p0, p1) */
    int *split_tok;    /* [step_tokens] tokens taking the chunked path */
    float *split_tmp;  /* (n_threads, split_tmp_per) K or V rows of all heads */
    size_t split_tmp_per;
    int *tok_row;      /* [step_tokens] row of each token */
    int *tok_pos;      /* [step_tokens] position of each token */
    int *rot_pos;      /* [3 * step_tokens] rope positions (t, h, w) of each token */
    int *tok_first;    /* [step_tokens] first key position its span allows (its own position
                          outside bidirectional spans; a sliding window may start later) */
    int *tok_last;     /* [step_tokens] last key position (its span's last, else its own) */
    loom_fwd_bufs mem;    /* owns the buffers above and the feature states below */
    float *logits;     /* owned (logits_cap / vocab, vocab), grown on demand */
    size_t logits_cap;
    loom_moe_state *moe;  /* in mem; MoE models only (moe.c) */
    loom_lin_state *lin;  /* in mem; linear-attention layers only (linear_attn.c) */
    loom_ple_state *ple;  /* in mem; gemma4 per-layer inputs only (ple.c) */
};

#endif
