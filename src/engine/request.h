/* request: one generation request as the engine sees it, with its event
 * channel and trace.
 *
 * Ownership: a request is shared by the caller's handle and the engine;
 * `refs` counts both and the last release frees it. Fields under "engine
 * thread" are touched only by the engine thread; the channel is guarded by
 * `mu`; `abort` is atomic. */
#ifndef LOOM_REQUEST_H
#define LOOM_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/kv.h"
#include "grammar/grammar.h"
#include "sample/sample.h"

typedef enum rq_state {
    RQ_WAITING,   /* queued, holds no KV */
    RQ_RESTORING, /* admitted, holds its blocks; waiting for blocks read from disk */
    RQ_PREFILL,   /* admitted, prompt (or recompute) being prefilled */
    RQ_DECODE,    /* generating one token per step */
    RQ_DONE,      /* final event sent; awaiting release */
} rq_state;

/* One attribute of a span: a static key and an integer value. */
typedef struct rq_attr {
    const char *key;
    int64_t value;
} rq_attr;

#define RQ_MAX_ATTRS 8

typedef struct rq_span {
    const char *name;          /* static */
    const char *mechanism;     /* static, or NULL: the spans the seed tags */
    double t0, t1;             /* seconds, monotonic */
    rq_attr attrs[RQ_MAX_ATTRS];
    int n_attrs;
} rq_span;

/* The attribute list argument of loom_rq_span: RQ_ATTRS({"workId", w}, ...). */
#define RQ_ATTRS(...) \
    (const rq_attr[]){__VA_ARGS__}, (int)(sizeof((rq_attr[]){__VA_ARGS__}) / sizeof(rq_attr))

struct loom_request {
    /* frozen at submit */
    uint64_t id;
    int n_prompt, max_tokens, logprobs, chunk, trace, ignore_eos;
    int prompt_logprobs;       /* -1 none, else top n */
    int32_t *stop_ids;         /* owned [n_stop] */
    int n_stop;
    int pooling, normalize;    /* an embedding request when pooling != NONE */
    int dim;                   /* its vector's width (hidden size), else 0 */
    atomic_int abort;
    atomic_int refs;
    /* images (vision-language prompts) */
    loom_request_image *images; /* owned [n_images], each pixels owned until features */
    float **features;          /* owned [n_images], each owned or NULL: the image's tower
                                  output (loom_vision_image.features), kept to the end so
                                  a recompute after preemption runs no tower again */
    int n_images;
    int pos_delta;             /* rope delta of rows past the prompt (M-RoPE) */
    int32_t *keys;             /* the tokens the prefix cache, the disk tier and
                                  sessions key by: tokens, each image's
                                  placeholders holding its hash (negative, so
                                  never a token id); owned [cap] with images,
                                  else == tokens */
    loom_grammar *grammar;     /* a reference, or NULL: constrained output */

    /* engine thread */
    int32_t *tokens;           /* owned [cap]: prompt then generated */
    int n_tokens, cap;
    int n_generated;
    loom_sampler sampler;
    loom_gmatcher gm;          /* the output so far against grammar */
    uint32_t *gmask;           /* owned [(vocab + 31) / 32] allowed tokens, with grammar */
    rq_state state;
    loom_kv_seq seq;           /* KV holds tokens [0, seq.n_tokens) */
    int plan_end;              /* planned prefill chunk end; 0 = none */
    int n_cached;              /* prompt tokens mapped from the prefix cache */
    int plp_next;              /* next prompt position whose logprob is due;
                                  n_prompt when none is (prompt_logprobs) */
    int snap[2];               /* boundaries to save recurrent state at (0 = none) */
    uint64_t ns;               /* prefix-cache namespace of this request */
    uint64_t save_key, save_alias; /* session keys to park the sequence under (0 = none) */
    uint64_t resume_key;       /* session to continue (0 = none) */
    struct loom_restore_job *restore; /* owned while RQ_RESTORING */
    struct loom_seq_state *rstate; /* owned recurrent state, or NULL */
    int prefill_len;           /* tokens to prefill before sampling */
    struct loom_vision_prompt *prompt; /* owned while prompt rows are due: their
                                  prepared input (embeddings, M-RoPE, deepstack) */
    loom_status prep_status;   /* preparing the prompt failed: finish with it */
    char prep_msg[256];
    uint64_t order;            /* admission order, for preemption */
    /* speculative decoding (engine/spec.c) */
    int spec_k;                /* proposals the next round may carry; adapts to acceptance */
    int spec_idle;             /* plain steps since spec_k fell to 0 */
    loom_kv_seq draft_seq;     /* a draft model's KV of tokens [0, draft_seq.n_tokens) */
    struct loom_seq_state *draft_state; /* owned: a draft's recurrent state, or NULL */
    void *draft_snap;          /* owned: that state after draft_snap_at tokens */
    int draft_snap_at;
    void *spec_state;          /* owned: the recurrent state before a round, or NULL */
    float *dfl_ctx;            /* owned: a projected-context drafter's rows of positions
                                  [dfl_lo, dfl_n) (model/dflash.h), room for dfl_cap */
    int dfl_lo, dfl_n, dfl_cap;
    float *dfl_raw;            /* owned: the target's tap states of decode positions
                                  [dfl_n, dfl_raw_n), not projected yet */
    int dfl_raw_n;
    double t_submit, t_admit;
    double *pool_sum;          /* owned [dim]: mean pooling's sum so far */
    float *embed;              /* owned [dim]: the vector, complete at the final event */
    rq_span *spans;            /* owned [n_spans] */
    int n_spans, span_cap;

    /* channel, guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    loom_event *events;        /* owned ring [ev_cap] */
    int ev_head, ev_len, ev_cap;
    int finished;              /* the final event is queued */
    loom_event final;
    char error[256];
};

/* The tokens r's KV is keyed by (requests made outside loom_engine_submit,
 * as the scheduler's tests make them, may leave keys NULL). */
static inline int32_t *loom_rq_keys(const loom_request *r) { return r->keys ? r->keys : r->tokens; }

/* Appends an event (copies it); wakes the reader. */
void loom_rq_push(loom_request *r, const loom_event *ev);
/* Records a span when the request is traced (engine thread; nothing else
 * happens for an untraced one). mechanism may be NULL; n attributes at
 * most RQ_MAX_ATTRS are kept. */
void loom_rq_span(loom_request *r, const char *name, const char *mechanism, double t0, double t1,
                  const rq_attr *attrs, int n);
/* Writes the request's spans as one JSON line:
 * {"request":id,"prompt_tokens":n,"generated_tokens":n,"spans":[...]}, each
 * span as loom_request_trace_json writes it. */
void loom_rq_write_trace(const loom_request *r, FILE *f);
/* Drops one reference; frees on the last. */
void loom_rq_release(loom_request *r);

#endif
