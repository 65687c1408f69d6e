/* test_kv: the KV layout (block-table addressing, the row codec) with no
 * pool behind it, and the pool's prefix-cache counters as the engine reads
 * them (loom_kv_counters). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv.h"
#include "model/kv_layout.h"
#include "test.h"

static void layout_rows(void) {
    loom_kv_spec spec[2] = {{LOOM_KV_F32, 0}, {LOOM_KV_Q8, 0}};
    loom_kv_layout lay;
    CHECK(loom_kv_layout_init(&lay, 2, 64, 4, 3, spec) == LOOM_OK);
    CHECK(lay.mixed);
    CHECK_EQ_INT(lay.row_bytes, 0);
    CHECK_EQ_INT(lay.layer[0].row_bytes, loom_kv_row_bytes(LOOM_KV_F32, 64));
    CHECK_EQ_INT(lay.layer[1].row_bytes, loom_kv_row_bytes(LOOM_KV_Q8, 64));
    /* a table of blocks 2 then 0: position 5 is slot 1 of block 0 */
    int blocks[2] = {2, 0};
    loom_kv_seq s = {.blocks = blocks, .n_blocks = 2, .cap = 2, .n_tokens = 6};
    CHECK((char *)loom_kv_k_row(&lay, &s, 1, 5) ==
          (char *)loom_kv_block_k(&lay, 1, 0) + lay.layer[1].row_bytes);
    CHECK((char *)loom_kv_v_row(&lay, &s, 0, 2) ==
          (char *)loom_kv_block_v(&lay, 0, 2) + 2 * lay.layer[0].row_bytes);

    float x[64], tmp[64];
    unsigned long long seed = 7;
    for (int i = 0; i < 64; i++) x[i] = test_rand_f(&seed);
    void *r0 = loom_kv_k_row(&lay, &s, 0, 5), *r1 = loom_kv_k_row(&lay, &s, 1, 5);
    loom_kv_layer_store(&lay, 0, r0, x, 64);
    loom_kv_layer_store(&lay, 1, r1, x, 64);
    const float *y = loom_kv_layer_load(&lay, 0, r0, 0, 64, tmp);
    CHECK(!memcmp(y, x, sizeof x));
    /* q8: within half a level of (max - min) / 255, plus the f16 scale */
    y = loom_kv_layer_load(&lay, 1, r1, 0, 64, tmp);
    float err = 0;
    for (int i = 0; i < 64; i++) err = fmaxf(err, fabsf(y[i] - x[i]));
    CHECKF(err < 2.0f / 255, "q8 row: error %g", (double)err);
    loom_kv_layout_release(&lay);
    CHECK(lay.k == NULL && lay.layer == NULL);

    /* q4 in groups of 48 cannot store rows: nothing is kept */
    loom_kv_spec bad = {LOOM_KV_Q4, 48};
    CHECK(loom_kv_layout_init(&lay, 1, 96, 4, 1, &bad) == LOOM_ERR_INVALID_ARG);
    CHECK(lay.k == NULL && lay.layer == NULL);
}

static void pool_counters(void) {
    loom_kv_pool *p;
    CHECK(loom_kv_pool_create(1, 8, 4, 8, LOOM_KV_F32, &p) == LOOM_OK);
    if (!p) return;
    CHECK(loom_kv_cache_enable(p, 0) == LOOM_OK);
    int32_t tok[13];
    for (int i = 0; i < 13; i++) tok[i] = i + 1;
    uint64_t ns = loom_kv_namespace("test", 4);

    /* an empty cache: the three full blocks before the last token miss */
    loom_kv_seq a = {0};
    CHECK_EQ_INT(loom_kv_cache_lookup(p, &a, tok, 13, ns), 0);
    CHECK(loom_kv_seq_reserve(p, &a, 13) == LOOM_OK);
    a.n_tokens = 13; /* as the forward would */
    loom_kv_cache_commit(p, &a, tok, ns);
    loom_kv_seq_release(p, &a);
    loom_kv_counts c = loom_kv_counters(p);
    CHECK_EQ_INT(c.hits, 0);
    CHECK_EQ_INT(c.misses, 3);
    CHECK_EQ_INT(c.evictions, 0);

    /* the same prompt again: all three are cached */
    loom_kv_seq b = {0};
    CHECK_EQ_INT(loom_kv_cache_lookup(p, &b, tok, 13, ns), 12);
    loom_kv_seq_release(p, &b);
    c = loom_kv_counters(p);
    CHECK_EQ_INT(c.hits, 3);
    CHECK_EQ_INT(c.misses, 3);

    /* two of the misses restored from the tier by someone else */
    loom_kv_count_restored(p, 2);
    c = loom_kv_counters(p);
    CHECK_EQ_INT(c.hits, 5);
    CHECK_EQ_INT(c.misses, 1);
    CHECK_EQ_INT(c.tier_hits, 2);

    /* the whole pool for one sequence: 5 free blocks, then the 3 cached */
    loom_kv_seq d = {0};
    CHECK(loom_kv_seq_reserve(p, &d, 32) == LOOM_OK);
    CHECK_EQ_INT(loom_kv_counters(p).evictions, 3);
    loom_kv_seq_release(p, &d);
    loom_kv_pool_free(p);
}

int main(void) {
    layout_rows();
    pool_counters();
    return test_report("test_kv");
}
