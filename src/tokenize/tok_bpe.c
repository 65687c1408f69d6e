/* tokenize BPE model: the merge table and the per-word merge loop.
 *
 * A word starts as one symbol per character (unknown characters become
 * <0xNN> byte tokens with byte_fallback, else the unk token, fused when
 * fuse_unk). Merges then apply lowest rank first, ties to the leftmost
 * pair: candidate pairs sit in a binary min-heap keyed (rank, position) and
 * symbols form a doubly linked list, so a word of n characters costs
 * O(n log n). A popped pair is checked against the current neighbours and
 * skipped if stale. */
#include <stdlib.h>
#include <string.h>

#include "tokenize/tok_internal.h"

#define EMPTY_KEY UINT64_MAX

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static int merge_get(const tk_merge_map *m, int32_t a, int32_t b,
                     uint32_t *rank, int32_t *new_id) {
    if (!m->cap) return 0;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = m->cap - 1, i = mix64(k) & mask;
    while (m->key[i] != EMPTY_KEY) {
        if (m->key[i] == k) {
            *rank = m->rank[i];
            *new_id = m->new_id[i];
            return 1;
        }
        i = (i + 1) & mask;
    }
    return 0;
}

static void merge_put(tk_merge_map *m, int32_t a, int32_t b, uint32_t rank,
                      int32_t new_id) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = m->cap - 1, i = mix64(k) & mask;
    while (m->key[i] != EMPTY_KEY && m->key[i] != k) i = (i + 1) & mask;
    /* a repeated pair keeps the later rank, as the reference's map does */
    m->key[i] = k;
    m->rank[i] = rank;
    m->new_id[i] = new_id;
}

void tk_merge_map_free(tk_merge_map *m) {
    free(m->key);
    free(m->rank);
    free(m->new_id);
    memset(m, 0, sizeof *m);
}

static int32_t vocab_id(const loom_tok *t, const char *s, size_t n) {
    return tk_strmap_get(&t->vocab_map, &t->vocab, s, n);
}

static loom_status bad_merge(uint32_t i, const char *what) {
    return loom_err(LOOM_ERR_FORMAT, "model.merges[%u]: expected %s", i, what);
}

loom_status tk_merges_build(loom_tok *t, const char *js, tk_span_t span) {
    tk_merge_map *m = &t->merges;
    tk_lex x = {.p = js + span.s, .e = js + span.e, .base = js};
    /* count the entries to size the table */
    size_t n = 0;
    if (span.e) {
        tk_lex c = x;
        c.p++;
        tk_lex_ws(&c);
        while (c.p < c.e && *c.p != ']') {
            if (tk_lex_skip(&c, 1)) return bad_merge((uint32_t)n, "a JSON value");
            n++;
            tk_lex_ws(&c);
            if (c.p < c.e && *c.p == ',') c.p++;
        }
    }
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    m->key = malloc(cap * sizeof *m->key);
    m->rank = malloc(cap * sizeof *m->rank);
    m->new_id = malloc(cap * sizeof *m->new_id);
    m->cap = cap;
    if (!m->key || !m->rank || !m->new_id)
        return loom_err(LOOM_ERR_NOMEM, "tokenizer: out of memory for %zu merges", n);
    memset(m->key, 0xff, cap * sizeof *m->key);
    if (!span.e) return LOOM_OK;

    tk_buf sa = {0}, sb = {0}, joined = {0};
    loom_status st = LOOM_OK;
    uint32_t rank = 0, idx = 0;
    x.p++;
    for (;; idx++) {
        tk_lex_ws(&x);
        if (x.p < x.e && *x.p == ']') break;
        const char *a, *b;
        size_t la, lb;
        sa.n = sb.n = 0;
        if (x.p < x.e && *x.p == '"') {
            /* legacy "a b" form: exactly one space; "#version" lines are
             * comments that take no rank */
            if (tk_lex_string(&x, &sa)) { st = bad_merge(idx, "a string"); break; }
            const char *s = sa.p ? sa.p : "";
            const char *sp = memchr(s, ' ', sa.n);
            if (sa.n >= 8 && !memcmp(s, "#version", 8)) goto next;
            if (!sp || memchr(sp + 1, ' ', sa.n - (size_t)(sp + 1 - s))) {
                st = loom_err(LOOM_ERR_FORMAT,
                              "model.merges[%u]: expected \"left right\", found \"%.80s\"", idx, s);
                break;
            }
            a = s; la = (size_t)(sp - s);
            b = sp + 1; lb = sa.n - la - 1;
        } else if (x.p < x.e && *x.p == '[') {
            x.p++;
            tk_lex_ws(&x);
            if (tk_lex_string(&x, &sa)) { st = bad_merge(idx, "a pair [a, b] of strings"); break; }
            tk_lex_ws(&x);
            if (x.p >= x.e || *x.p != ',') { st = bad_merge(idx, "a pair [a, b] of strings"); break; }
            x.p++;
            tk_lex_ws(&x);
            if (tk_lex_string(&x, &sb)) { st = bad_merge(idx, "a pair [a, b] of strings"); break; }
            tk_lex_ws(&x);
            if (x.p >= x.e || *x.p != ']') { st = bad_merge(idx, "a pair [a, b] of strings"); break; }
            x.p++;
            a = sa.p; la = sa.n;
            b = sb.p; lb = sb.n;
        } else {
            st = bad_merge(idx, "a string \"a b\" or a pair [a, b]");
            break;
        }
        {
            int32_t ia = vocab_id(t, a, la), ib = vocab_id(t, b, lb);
            size_t skip = t->cont_prefix_len <= lb ? t->cont_prefix_len : lb;
            joined.n = 0;
            if (tk_buf_put(&joined, a, la) || tk_buf_put(&joined, b + skip, lb - skip)) {
                st = loom_err(LOOM_ERR_NOMEM, "tokenizer: out of memory");
                break;
            }
            int32_t inew = vocab_id(t, joined.p, joined.n);
            /* The reference refuses such files; skipping the merge is
             * harmless because it could never fire. */
            if (ia >= 0 && ib >= 0 && inew >= 0) merge_put(m, ia, ib, rank, inew);
            rank++;
        }
    next:
        tk_lex_ws(&x);
        if (x.p < x.e && *x.p == ',') x.p++;
    }
    tk_buf_free(&sa);
    tk_buf_free(&sb);
    tk_buf_free(&joined);
    return st;
}

/* ---- merge loop ---------------------------------------------------------------- */

typedef struct sym {
    int32_t id;
    int32_t prev, next;   /* linked list over live symbols, -1 ends */
    uint32_t len;         /* bytes covered; 0 marks a symbol merged away */
} sym;

typedef struct cand {
    uint32_t rank;
    int32_t pos;          /* left symbol */
    int32_t new_id;
} cand;

static int cand_less(const cand *a, const cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(cand *h, size_t *n, cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
    cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *best = &last;
        if (l < *n && cand_less(&h[l], best)) { m = l; best = &h[l]; }
        if (r < *n && cand_less(&h[r], best)) { m = r; }
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = last;
    return top;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

void tk_bpe_scratch_free(tk_bpe_scratch *sc) {
    free(sc->sym);
    free(sc->heap);
    memset(sc, 0, sizeof *sc);
}


loom_status tk_bpe_word(const loom_tok *t, const char *w, size_t n,
                        tk_ids *out, tk_bpe_scratch *sc) {
    if (n == 0) return LOOM_OK;
    if (t->ignore_merges) {
        int32_t id = vocab_id(t, w, n);
        if (id >= 0) return tk_ids_push(out, id) ? tk_nomem() : LOOM_OK;
    }
    /* a word of n bytes has at most n symbols (byte fallback: one per byte) */
    if (grow(&sc->sym, &sc->sym_cap, n + 1, sizeof(sym)) ||
        grow(&sc->heap, &sc->heap_cap, 2 * n + 2, sizeof(cand)))
        return tk_nomem();
    sym *s = sc->sym;
    cand *h = sc->heap;
    int32_t ns = 0;
    tk_buf tmp = {0};
    int32_t unk_len = 0; /* pending unk symbol (bytes), 0 none */
    loom_status st = LOOM_OK;

#define ADD_SYM(ID, LEN)                                                      \
    do {                                                                      \
        s[ns] = (sym){.id = (ID), .prev = ns - 1, .next = ns + 1,             \
                      .len = (uint32_t)(LEN)};                                \
        ns++;                                                                 \
    } while (0)

    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = (size_t)tk_utf8_next(w + i, n - i, &cp);
        const char *c = w + i;
        size_t clen = cl;
        int first = i == 0, last = i + cl == n;
        i += cl;
        if ((!first && t->cont_prefix_len) || (last && t->eow_suffix_len)) {
            tmp.n = 0;
            if (!first && tk_buf_put(&tmp, t->cont_prefix, t->cont_prefix_len)) { st = tk_nomem(); break; }
            if (tk_buf_put(&tmp, c, cl)) { st = tk_nomem(); break; }
            if (last && tk_buf_put(&tmp, t->eow_suffix, t->eow_suffix_len)) { st = tk_nomem(); break; }
            c = tmp.p;
            clen = tmp.n;
        }
        int32_t id = vocab_id(t, c, clen);
        if (id >= 0) {
            if (unk_len) { ADD_SYM(t->unk_id, unk_len); unk_len = 0; }
            ADD_SYM(id, cl);
            continue;
        }
        if (t->byte_fallback) {
            int ok = 1;
            for (size_t k = 0; k < clen; k++)
                if (t->byte_ids[(uint8_t)c[k]] < 0) ok = 0;
            if (ok) {
                /* the reference adds these without flushing a pending unk */
                if (grow(&sc->sym, &sc->sym_cap, (size_t)ns + clen + 2, sizeof(sym)) ||
                    grow(&sc->heap, &sc->heap_cap, 2 * ((size_t)ns + clen) + 2, sizeof(cand))) {
                    st = tk_nomem();
                    break;
                }
                s = sc->sym;
                h = sc->heap;
                for (size_t k = 0; k < clen; k++) ADD_SYM(t->byte_ids[(uint8_t)c[k]], 1);
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk_len && t->fuse_unk) {
                unk_len += (int32_t)cl;
            } else {
                if (unk_len) ADD_SYM(t->unk_id, unk_len);
                unk_len = (int32_t)cl;
            }
        }
        /* no unk token: the character is dropped, as the reference does */
    }
    tk_buf_free(&tmp);
    if (st) return st;
    if (unk_len) ADD_SYM(t->unk_id, unk_len);
#undef ADD_SYM
    if (ns == 0) return LOOM_OK;
    s[ns - 1].next = -1;

    size_t nh = 0;
    uint32_t rank;
    int32_t nid;
    for (int32_t i = 0; i + 1 < ns; i++)
        if (merge_get(&t->merges, s[i].id, s[i + 1].id, &rank, &nid))
            heap_push(h, &nh, (cand){rank, i, nid});
    while (nh) {
        cand top = heap_pop(h, &nh);
        sym *a = &s[top.pos];
        if (a->len == 0 || a->next < 0) continue;
        sym *b = &s[a->next];
        if (!merge_get(&t->merges, a->id, b->id, &rank, &nid) || nid != top.new_id)
            continue;
        int32_t bnext = b->next;
        a->id = top.new_id;
        a->len += b->len;
        a->next = bnext;
        b->len = 0;
        if (bnext >= 0) s[bnext].prev = top.pos;
        /* at most two new candidates per merge: the heap never holds more
         * than 2n entries beyond the initial n-1 */
        if (nh + 2 > sc->heap_cap) {
            if (grow(&sc->heap, &sc->heap_cap, nh + 2, sizeof(cand))) return tk_nomem();
            h = sc->heap;
        }
        if (a->prev >= 0 &&
            merge_get(&t->merges, s[a->prev].id, a->id, &rank, &nid))
            heap_push(h, &nh, (cand){rank, a->prev, nid});
        if (bnext >= 0 && merge_get(&t->merges, a->id, s[bnext].id, &rank, &nid))
            heap_push(h, &nh, (cand){rank, top.pos, nid});
    }
    for (int32_t i = 0; i >= 0; i = s[i].next)
        if (tk_ids_push(out, s[i].id)) return tk_nomem();
    return LOOM_OK;
}
