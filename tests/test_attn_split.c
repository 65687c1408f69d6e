/* Decode attention over a long span by chunks of positions (forward.c
 * split_task) against the per-head path: a prompt of L tokens, then greedy
 * decode steps, on models with GQA, sliding windows, softcapping, other
 * head sizes and KV stored as f32, f16, bf16 and q8. The logits must agree
 * within TOL and the greedy tokens exactly; batched beside another long
 * sequence (over two dispatches when few partial results fit), a
 * token must give the same bits as alone. A prompt token alone in its row
 * (the rest of the prompt cached) must give the bits of the whole prompt. */
#include <stdint.h>

#include "base/base.h"
#include "engine/kv.h"
#include "model/fwd_internal.h"
#include "ops/ops.h"
#include "test.h"

#define TOL 1e-5

enum { L = 700, LB = 300, PRE = 128, N_DEC = 6, CTX = 1024 };

typedef struct split_cfg {
    int split, chunk; /* state's att_split (0: per head) and att_chunk */
    int parts;        /* att_parts when > 0 */
    int batched;      /* decode beside a second sequence */
} split_cfg;

/* Prefills tok[0, L) in chunks of PRE, then N_DEC greedy decode steps:
 * their logits into lg (N_DEC, V) and tokens into out. 0 on a failure. */
static int run(loom_model *m, loom_kv_type kt, split_cfg sc, const int32_t *tok, float *lg,
               int32_t *out) {
    int V = loom_model_vocab_size(m), ok = 1;
    loom_kv_pool *kv = NULL;
    loom_fwd_state *fs = NULL;
    loom_kv_seq sq[2] = {{0}};
    loom_seq_state *st[2] = {0};
    float *junk = malloc(sizeof(float) * (size_t)PRE * V);
    CHECK(loom_kv_pool_create(m->cfg.n_layers, loom_model_kv_dim(m), 16, 128, kt, &kv) == LOOM_OK);
    CHECK(loom_fwd_state_create(m, PRE, CTX, &fs) == LOOM_OK);
    if (!kv || !fs) {
        ok = 0;
        goto out;
    }
    fs->att_split = sc.split;
    fs->att_chunk = sc.chunk;
    if (sc.parts > 0) fs->att_parts = sc.parts;
    for (int i = 0; i < 2; i++) CHECK(loom_seq_state_create(m, &st[i]) == LOOM_OK);
    CHECK(loom_kv_seq_reserve(kv, &sq[0], L + N_DEC) == LOOM_OK);
    CHECK(loom_kv_seq_reserve(kv, &sq[1], LB + N_DEC) == LOOM_OK);
    int32_t tb[LB + N_DEC];
    for (int i = 0; i < LB; i++) tb[i] = tok[(i * 7 + 3) % L];
    for (int off = 0; ok && off < L; off += PRE) {
        int n = LOOM_MIN(PRE, L - off);
        loom_fwd_row r = {tok + off, n, &sq[0], LOOM_LOGITS_LAST, junk, st[0], 0, NULL};
        ok = loom_forward(m, fs, &kv->lay, &r, 1) == LOOM_OK;
    }
    out[0] = loom_argmax(junk, V);
    for (int off = 0; ok && sc.batched && off < LB; off += PRE) {
        int n = LOOM_MIN(PRE, LB - off);
        loom_fwd_row r = {tb + off, n, &sq[1], LOOM_LOGITS_LAST, junk, st[1], 0, NULL};
        ok = loom_forward(m, fs, &kv->lay, &r, 1) == LOOM_OK;
    }
    for (int i = 0; ok && i < N_DEC; i++) {
        loom_fwd_row r[2] = {
            {tb + LB + i, 1, &sq[1], LOOM_LOGITS_LAST, junk, st[1], 1, NULL},
            {out + i, 1, &sq[0], LOOM_LOGITS_LAST, lg + (size_t)i * V, st[0], 1, NULL},
        };
        tb[LB + i] = (int32_t)(i * 13 % V);
        ok = loom_forward(m, fs, &kv->lay, sc.batched ? r : r + 1, sc.batched ? 2 : 1) == LOOM_OK;
        if (i + 1 < N_DEC) out[i + 1] = loom_argmax(lg + (size_t)i * V, V);
    }
    CHECKF(ok, "forward: %s", loom_last_error());
    /* the decode rows went by chunks when the split was on, never when off */
    if (ok) CHECK(sc.split > 0 ? fs->att_split_tokens > 0 : fs->att_split_tokens == 0);
out:
    for (int i = 0; i < 2; i++) {
        if (kv) loom_kv_seq_release(kv, &sq[i]);
        loom_seq_state_free(st[i]);
    }
    free(junk);
    loom_fwd_state_free(fs);
    loom_kv_pool_free(kv);
    return ok;
}

/* The model on 2 threads and the prompt tok[0, L); NULL on a failure. */
static loom_model *load(const char *dir, int32_t *tok) {
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 2;
    loom_model *m = NULL;
    CHECKF(loom_model_load(dir, &mp, &m) == LOOM_OK, "%s: %s", dir, loom_last_error());
    if (!m) return NULL;
    int V = loom_model_vocab_size(m);
    for (int i = 0; i < L; i++) tok[i] = (int32_t)((i * 37 + i / 11) % V);
    return m;
}

/* Whether this table's matmuls give a token the same bits in any batch. */
static int batch_invariant(void) {
    const loom_kernels *k = loom_kernels_get();
    int invariant = k->matmul_f32 == loom_kernels_ref.matmul_f32;
#if defined(__x86_64__)
    invariant |= k->matmul_f32 == loom_kernels_avx512_dense.matmul_f32;
#endif
    return invariant;
}

static void check(const char *dir, loom_kv_type kt, int split, int chunk) {
    int32_t tok[L], o_ref[N_DEC], o_split[N_DEC], o_bat[N_DEC];
    loom_model *m = load(dir, tok);
    if (!m) return;
    int invariant = batch_invariant(), V = loom_model_vocab_size(m);
    float *ref = malloc(sizeof(float) * N_DEC * V), *got = malloc(sizeof(float) * N_DEC * V);
    float *bat = malloc(sizeof(float) * N_DEC * V);
    if (run(m, kt, (split_cfg){0, chunk, 0, 0}, tok, ref, o_ref) &&
        run(m, kt, (split_cfg){split, chunk, 0, 0}, tok, got, o_split)) {
        double e = test_rel_err(got, ref, (size_t)N_DEC * V);
        CHECKF(e <= TOL, "%s kv %d split %d chunk %d: rel err %.3g", dir, (int)kt, split, chunk, e);
        CHECKF(!memcmp(o_ref, o_split, sizeof o_ref), "%s kv %d: greedy tokens differ", dir, (int)kt);
        /* beside a second sequence, with room for one sequence's chunks
         * per dispatch */
        int parts = (L + N_DEC) / chunk + 2;
        if (run(m, kt, (split_cfg){split, chunk, parts, 1}, tok, bat, o_bat) && invariant)
            CHECKF(!memcmp(got, bat, sizeof(float) * N_DEC * V),
                   "%s kv %d: alone and batched differ", dir, (int)kt);
    }
    free(ref);
    free(got);
    free(bat);
    loom_model_free(m);
}

/* The last-token logits of tok[0, L) prefilled in chunks of PRE, with the
 * last token in a row of its own when last_alone (as after a prefix cache
 * hit on the rest), as a prompt or a decode row. */
static int prefill(loom_model *m, const int32_t *tok, int last_alone, int decode, float *lg) {
    int ok = 1;
    loom_kv_pool *kv = NULL;
    loom_fwd_state *fs = NULL;
    loom_kv_seq sq = {0};
    loom_seq_state *st = NULL;
    ok &= loom_kv_pool_create(m->cfg.n_layers, loom_model_kv_dim(m), 16, 64, LOOM_KV_F32, &kv) ==
          LOOM_OK;
    ok &= loom_fwd_state_create(m, PRE, CTX, &fs) == LOOM_OK;
    ok &= loom_seq_state_create(m, &st) == LOOM_OK;
    ok &= ok && loom_kv_seq_reserve(kv, &sq, L) == LOOM_OK;
    int end = last_alone ? L - 1 : L;
    for (int off = 0; ok && off < end; off += PRE) {
        int n = LOOM_MIN(PRE, end - off);
        loom_fwd_row r = {tok + off, n, &sq, LOOM_LOGITS_LAST, lg, st, 0, NULL};
        ok = loom_forward(m, fs, &kv->lay, &r, 1) == LOOM_OK;
    }
    if (ok && last_alone) {
        loom_fwd_row r = {tok + L - 1, 1, &sq, LOOM_LOGITS_LAST, lg, st, decode, NULL};
        ok = loom_forward(m, fs, &kv->lay, &r, 1) == LOOM_OK;
    }
    if (ok) CHECK(decode ? fs->att_split_tokens > 0 : fs->att_split_tokens == 0);
    CHECKF(ok, "prefill: %s", loom_last_error());
    if (kv) loom_kv_seq_release(kv, &sq);
    loom_seq_state_free(st);
    loom_fwd_state_free(fs);
    loom_kv_pool_free(kv);
    return ok;
}

static void check_prompt(const char *dir) {
    int32_t tok[L];
    loom_model *m = load(dir, tok);
    if (!m) return;
    /* the one-token matmuls give the many-token bits on these tables */
    int invariant = batch_invariant();
    size_t V = (size_t)loom_model_vocab_size(m);
    float *whole = malloc(sizeof(float) * V), *alone = malloc(sizeof(float) * V);
    float *dec = malloc(sizeof(float) * V);
    if (prefill(m, tok, 0, 0, whole) && prefill(m, tok, 1, 0, alone) &&
        prefill(m, tok, 1, 1, dec)) {
        if (!invariant)
            fprintf(stderr, "test_attn_split: %s: SKIP the bit-for-bit check (this kernel "
                    "table's matmuls are not batch-invariant)\n", dir);
        if (invariant)
            CHECKF(!memcmp(whole, alone, sizeof(float) * V),
                   "%s: the last prompt token alone gives other bits than the whole prompt", dir);
        CHECKF(test_rel_err(alone, whole, V) <= TOL, "%s: prompt token alone: rel err %.3g", dir,
               test_rel_err(alone, whole, V));
        /* as a decode row it goes by chunks: the same within TOL */
        CHECKF(test_rel_err(dec, whole, V) <= TOL, "%s: decode row: rel err %.3g", dir,
               test_rel_err(dec, whole, V));
    }
    free(whole);
    free(alone);
    free(dec);
    loom_model_free(m);
}

int main(void) {
    check_prompt("tests/fixtures/models/qwen3-tiny");
    check_prompt("tests/fixtures/models/gemma2-tiny");
    check("tests/fixtures/models/qwen3-tiny", LOOM_KV_F32, 256, 256);
    check("tests/fixtures/models/qwen3-tiny", LOOM_KV_Q8, 256, 256);
    check("tests/fixtures/models/llama3-tiny", LOOM_KV_F32, 300, 100);
    /* windows of 32 and 16 (gemma2: softcap too) over chunks of 12 */
    check("tests/fixtures/models/mistral-tiny-swa", LOOM_KV_BF16, 8, 12);
    check("tests/fixtures/models/gemma2-tiny", LOOM_KV_F16, 8, 12);
    check("tests/fixtures/models/gemma4-tiny", LOOM_KV_F32, 256, 160);
    check("tests/fixtures/models/qwen3.5-tiny-hybrid", LOOM_KV_F32, 256, 256);
    return test_report("test_attn_split");
}
