/* context: one sequence over a private KV pool: the simplest way to run a
 * model (CLI logits/generate, tests, benchmarks). The engine serves many
 * sequences over one shared pool with the same forward. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/context.h"
#include "engine/exec.h"
#include "engine/kv.h"
#include "engine/kvconfig.h"
#include "model/forward.h"
#include "sample/sample.h"

#define CTX_DEFAULT_MAX 32768
#define CTX_BLOCK 16

struct loom_context {
    loom_model *m;         /* borrowed */
    loom_kv_pool *kv;      /* owned */
    loom_kv_seq seq;       /* owned block table */
    loom_exec *exec;       /* owned: CPU or device forwards */
    loom_seq_state *state; /* owned; recurrent state, NULL without linear layers */
    int n_ctx, n_batch;
    int pos_delta;         /* rope offset of a prepared prompt's continuation */
    const loom_fwd_input *next_in; /* borrowed: the next eval's prepared input */
};

loom_context_params loom_context_default_params(void) {
    return (loom_context_params){.n_ctx = 0, .n_batch = 0};
}

loom_status loom_context_create(loom_model *m, const loom_context_params *params,
                                loom_context **out) {
    *out = NULL;
    loom_context_params p = params ? *params : loom_context_default_params();
    if (p.n_ctx < 0 || p.n_batch < 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "context: n_ctx and n_batch must be >= 0");
    int n_ctx = p.n_ctx ? p.n_ctx : LOOM_MIN(m->cfg.max_positions, CTX_DEFAULT_MAX);
    if (n_ctx <= 0) n_ctx = CTX_DEFAULT_MAX;
    int n_batch = p.n_batch ? p.n_batch : 512;
    n_batch = LOOM_MIN(n_batch, n_ctx);
    loom_context *c = calloc(1, sizeof *c);
    if (!c) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    c->m = m;
    c->n_ctx = n_ctx;
    c->n_batch = n_batch;
    const loom_config *cfg = &m->cfg;
    loom_kv_spec *spec = calloc((size_t)cfg->n_layers, sizeof *spec);
    loom_status s = spec ? LOOM_OK : loom_err(LOOM_ERR_NOMEM, "out of memory");
    for (int l = 0; spec && l < cfg->n_layers; l++) spec[l].type = p.kv_type;
    if (!s && p.kv_config)
        s = loom_kv_config_load(p.kv_config, cfg->n_layers, loom_model_kv_dim(m), p.kv_type, spec);
    if (!s)
        s = loom_kv_pool_create_spec(cfg->n_layers, loom_model_kv_dim(m), CTX_BLOCK,
                                     (n_ctx + CTX_BLOCK - 1) / CTX_BLOCK, spec, &c->kv);
    free(spec);
    if (s == LOOM_OK) s = loom_exec_create(m, c->kv, n_batch, n_ctx, &c->exec);
    if (s == LOOM_OK) s = loom_seq_state_create(m, &c->state);
    if (s != LOOM_OK) {
        loom_context_free(c);
        return s;
    }
    *out = c;
    return LOOM_OK;
}

void loom_context_free(loom_context *c) {
    if (!c) return;
    if (c->kv) loom_kv_seq_release(c->kv, &c->seq);
    loom_kv_pool_free(c->kv);
    loom_exec_free(c->exec);
    loom_seq_state_free(c->state);
    free(c);
}

int loom_context_length(const loom_context *c) { return c->seq.n_tokens; }

loom_status loom_context_truncate(loom_context *c, int pos) {
    if (pos < 0 || pos > c->seq.n_tokens)
        return loom_err(LOOM_ERR_RANGE, "truncate: position %d outside [0, %d]", pos,
                        c->seq.n_tokens);
    loom_kv_seq_truncate(c->kv, &c->seq, pos);
    if (pos == 0) c->pos_delta = 0;
    return LOOM_OK;
}

/* loom_context_eval; picks/samp as loom_exec_forward_picks for the last
 * token's row (NULL: logits). */
static loom_status ctx_eval(loom_context *c, const int32_t *tokens, int n,
                            const loom_fwd_input *in, int all_logits, float *logits,
                            int32_t *pick, const loom_sample_pick *samp) {
    int V = c->m->cfg.vocab_size;
    if (!in) in = c->next_in;
    c->next_in = NULL;
    if (n <= 0 || !tokens) return loom_err(LOOM_ERR_INVALID_ARG, "eval: no tokens given");
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return loom_err(LOOM_ERR_RANGE,
                            "token id %d at index %d is out of range (vocabulary has %d tokens: "
                            "0..%d)", tokens[i], i, V, V - 1);
    if (c->seq.n_tokens + n > c->n_ctx)
        return loom_err(LOOM_ERR_RANGE, "eval: %d + %d tokens exceed the context of %d",
                        c->seq.n_tokens, n, c->n_ctx);
    loom_status s = loom_kv_seq_reserve(c->kv, &c->seq, c->seq.n_tokens + n);
    if (s != LOOM_OK) return s;
    for (int off = 0; off < n; off += c->n_batch) {
        int cnt = LOOM_MIN(c->n_batch, n - off);
        int last = off + cnt == n;
        loom_fwd_row row = {
            .tokens = tokens + off,
            .n = cnt,
            .seq = &c->seq,
            .logits = !logits ? LOOM_LOGITS_NONE
                      : all_logits ? LOOM_LOGITS_ALL
                      : last ? LOOM_LOGITS_LAST : LOOM_LOGITS_NONE,
            .out = logits && all_logits ? logits + (size_t)off * V : logits,
            .state = c->state,
            .decode = n == 1,  /* one token at a time: what decoding does */
            .pos_delta = c->pos_delta,
        };
        loom_fwd_row_input(&row, in, c->m->cfg.hidden_size, off, n);
        s = last && pick ? loom_exec_forward_picks(c->exec, c->kv, &row, 1, pick, samp)
                         : loom_exec_forward(c->exec, c->kv, &row, 1);
        if (s) return s;
    }
    if (in) c->pos_delta = in->pos_delta;
    return LOOM_OK;
}

loom_status loom_context_eval(loom_context *c, const int32_t *tokens, int n,
                              int all_logits, float *logits) {
    return ctx_eval(c, tokens, n, NULL, all_logits, logits, NULL, NULL);
}

loom_status loom_context_eval_input(loom_context *c, const int32_t *tokens, int n,
                                    const loom_fwd_input *in, int all_logits, float *logits) {
    return ctx_eval(c, tokens, n, in, all_logits, logits, NULL, NULL);
}

void loom_context_prepare(loom_context *c, const loom_fwd_input *in) { c->next_in = in; }

loom_status loom_context_eval_next(loom_context *c, const int32_t *tokens, int n,
                                   loom_sampler *smp, float *logits, int32_t *id) {
    loom_sample_pick samp = {0};
    int32_t pick = -2;  /* -2: not asked */
    if (!smp || loom_exec_pick_for(c->exec, smp, &samp)) pick = -1;
    loom_status s = ctx_eval(c, tokens, n, NULL, 0, logits, pick == -1 ? &pick : NULL,
                             samp.temperature > 0 ? &samp : NULL);
    if (s != LOOM_OK) return s;
    if (pick >= 0) {
        *id = pick;
    } else if (!smp) {
        *id = loom_argmax(logits, c->m->cfg.vocab_size);
    } else {
        loom_sample_result r;
        loom_sampler_pick(smp, logits, -1, &r);
        *id = r.id;
    }
    return LOOM_OK;
}

loom_status loom_generate_greedy(loom_context *c, const int32_t *prompt, int n_prompt,
                                 int max_tokens, const int32_t *stop_ids, int n_stop,
                                 int32_t *out, int *n_out) {
    *n_out = 0;
    int V = c->m->cfg.vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (!logits) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    int32_t id;
    loom_status s = max_tokens > 0 ? loom_context_eval_next(c, prompt, n_prompt, NULL, logits, &id)
                                   : loom_context_eval(c, prompt, n_prompt, 0, NULL);
    for (int i = 0; s == LOOM_OK && i < max_tokens; i++) {
        out[(*n_out)++] = id;
        int stop = 0;
        for (int j = 0; j < n_stop; j++) stop |= stop_ids[j] == id;
        if (stop || i + 1 == max_tokens) break;
        s = loom_context_eval_next(c, &id, 1, NULL, logits, &id);
    }
    free(logits);
    return s;
}
