/* tokenize: loading tokenizer.json / tokenizer_config.json, the added-token
 * matcher, the encode pipeline and the id <-> token lookups. See
 * tok_internal.h for the pipeline order. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenize/tok_internal.h"

/* Ids index dense tables; real vocabularies stay far below this. */
#define TK_MAX_ID (1 << 24)




static const char *cjson_type_name(const cJSON *v) {
    if (!v) return "nothing";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

/* ---- trie ------------------------------------------------------------------- */

static int trie_init(tk_trie *tr) {
    tr->cap = 64;
    tr->nodes = malloc((size_t)tr->cap * sizeof *tr->nodes);
    if (!tr->nodes) return -1;
    tr->nodes[0] = (tk_trie_node){.child = -1, .sibling = -1, .token = -1};
    tr->n = 1;
    for (int i = 0; i < 256; i++) tr->root_child[i] = -1;
    return 0;
}

static int32_t trie_child(const tk_trie *tr, int32_t node, uint8_t b) {
    if (node == 0) return tr->root_child[b];
    for (int32_t c = tr->nodes[node].child; c >= 0; c = tr->nodes[c].sibling)
        if (tr->nodes[c].byte == b) return c;
    return -1;
}

static int trie_insert(tk_trie *tr, const char *s, size_t n, int32_t token) {
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = trie_child(tr, node, b);
        if (c < 0) {
            if (tr->n == tr->cap) {
                tk_trie_node *p = realloc(tr->nodes, (size_t)tr->cap * 2 * sizeof *p);
                if (!p) return -1;
                tr->nodes = p;
                tr->cap *= 2;
            }
            c = tr->n++;
            tr->nodes[c] = (tk_trie_node){.child = -1, .sibling = tr->nodes[node].child,
                                          .token = -1, .byte = b};
            tr->nodes[node].child = c;
            if (node == 0) tr->root_child[b] = c;
        }
        node = c;
    }
    /* the first token inserted keeps a duplicated content */
    if (tr->nodes[node].token < 0) tr->nodes[node].token = token;
    return 0;
}

/* Longest token starting at s[pos]; returns its index and end, or -1. */
static int32_t trie_longest(const tk_trie *tr, const char *s, size_t n,
                            size_t pos, size_t *end) {
    int32_t node = 0, best = -1;
    for (size_t i = pos; i < n; i++) {
        node = trie_child(tr, node, (uint8_t)s[i]);
        if (node < 0) break;
        if (tr->nodes[node].token >= 0) {
            best = tr->nodes[node].token;
            *end = i + 1;
        }
    }
    return best;
}

/* ---- added-token splitting -------------------------------------------------------- */

static uint32_t last_cp(const char *s, size_t n) {
    size_t k = n - 1;
    while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
    uint32_t cp;
    tk_utf8_next(s + k, n - k, &cp);
    return cp;
}

/* Cuts the added tokens of trie tr out of s[0..n) and appends the pieces
 * (text pieces with id -1) to out, as the reference's find_matches does. */
static loom_status split_added(const loom_tok *t, const tk_trie *tr,
                               const char *s, size_t n, int origin,
                               tk_pieces *out) {
    size_t start_offset = 0, pos = 0;
    while (pos < n) {
        size_t mend = 0;
        if (tr->root_child[(uint8_t)s[pos]] < 0) { pos++; continue; }
        int32_t k = trie_longest(tr, s, n, pos, &mend);
        if (k < 0) { pos++; continue; }
        const tk_added *a = &t->added[k];
        size_t start = pos, stop = mend;
        pos = mend;
        if (a->single_word) {
            uint32_t cp;
            int start_space = start == 0 || !tk_is_alnum_word(last_cp(s, start));
            int stop_space = stop == n;
            if (!stop_space) {
                tk_utf8_next(s + stop, n - stop, &cp);
                stop_space = !tk_is_alnum_word(cp);
            }
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t q = ns - 1;
                while (q > 0 && ((uint8_t)s[q] & 0xC0) == 0x80) q--;
                uint32_t cp;
                tk_utf8_next(s + q, ns - q, &cp);
                if (!tk_is_whitespace(cp)) break;
                ns = q;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                size_t l = (size_t)tk_utf8_next(s + stop, n - stop, &cp);
                if (!tk_is_whitespace(cp)) break;
                stop += l;
            }
        }
        if (start_offset < start &&
            tk_pieces_add(out, s + start_offset, start - start_offset, -1,
                          origin && start_offset == 0))
            return tk_nomem();
        if (tk_pieces_add(out, s + start, stop - start, a->id, origin && start == 0))
            return tk_nomem();
        /* the scan resumes at the match end even when rstrip took more, as
         * the reference's matcher does */
        start_offset = stop;
    }
    if (start_offset < n &&
        tk_pieces_add(out, s + start_offset, n - start_offset, -1,
                      origin && start_offset == 0))
        return tk_nomem();
    return LOOM_OK;
}

/* ---- encode ------------------------------------------------------------------------ */

loom_status loom_tok_encode(const loom_tok *t, const char *text, size_t len,
                            int add_special, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && len))
        return loom_err(LOOM_ERR_INVALID_ARG, "tok_encode: expected a tokenizer and text");
    if (add_special < LOOM_TOK_NO_SPECIAL || add_special > LOOM_TOK_ADD_SPECIAL_CONFIG)
        return loom_err(LOOM_ERR_INVALID_ARG, "tok_encode: expected add_special 0, 1 or 2, found %d",
                        add_special);
    /* the ids that wrap the text */
    const int32_t *pre = NULL, *suf = NULL;
    int n_pre = 0, n_suf = 0;
    int32_t cfg_pre[1], cfg_suf[1];
    if (add_special == LOOM_TOK_ADD_SPECIAL_CONFIG &&
        (t->add_bos_cfg >= 0 || t->add_eos_cfg >= 0)) {
        if (t->add_bos_cfg == 1 && t->bos_id >= 0) cfg_pre[n_pre++] = t->bos_id;
        if (t->add_eos_cfg == 1 && t->eos_id >= 0) cfg_suf[n_suf++] = t->eos_id;
        pre = cfg_pre;
        suf = cfg_suf;
    } else if (add_special) {
        pre = t->post_prefix;
        n_pre = t->n_post_prefix;
        suf = t->post_suffix;
        n_suf = t->n_post_suffix;
    }
    if (!tk_utf8_valid(text, len))
        return loom_err(LOOM_ERR_INVALID_ARG, "tok_encode: expected UTF-8 text, found invalid bytes");
    loom_status st = LOOM_OK;
    tk_pieces raw = {0}, norm = {0};
    tk_buf nb = {0};
    tk_ids out = {0};
    tk_bpe_scratch sc = {0};
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return tk_nomem();

    if (len) st = split_added(t, &t->trie_raw, text, len, 1, &raw);
    for (size_t i = 0; i < raw.n && !st; i++) {
        const tk_piece *p = &raw.v[i];
        const char *s = raw.text.p + p->off;
        if (p->id >= 0) {
            if (tk_pieces_add(&norm, s, p->len, p->id, p->origin)) st = tk_nomem();
            continue;
        }
        if (t->norm) {
            nb.n = 0;
            st = tk_norm_apply(t->norm, s, p->len, &nb, md);
            if (st) break;
            s = nb.p ? nb.p : "";
            if (nb.n == 0) continue;
            if (t->has_norm_added) {
                st = split_added(t, &t->trie_norm, s, nb.n, p->origin, &norm);
                continue;
            }
            if (tk_pieces_add(&norm, s, nb.n, -1, p->origin)) st = tk_nomem();
            continue;
        }
        if (t->has_norm_added)
            st = split_added(t, &t->trie_norm, s, p->len, p->origin, &norm);
        else if (tk_pieces_add(&norm, s, p->len, -1, p->origin))
            st = tk_nomem();
    }
    if (!st && t->pre) st = tk_pre_apply(t->pre, &norm, md);
    for (int i = 0; i < n_pre && !st; i++)
        if (tk_ids_push(&out, pre[i])) st = tk_nomem();
    for (size_t i = 0; i < norm.n && !st; i++) {
        const tk_piece *p = &norm.v[i];
        if (p->id >= 0) {
            if (tk_ids_push(&out, p->id)) st = tk_nomem();
        } else {
            st = tk_bpe_word(t, norm.text.p + p->off, p->len, &out, &sc);
        }
    }
    for (int i = 0; i < n_suf && !st; i++)
        if (tk_ids_push(&out, suf[i])) st = tk_nomem();

    tk_bpe_scratch_free(&sc);
    tk_pieces_free(&raw);
    tk_pieces_free(&norm);
    tk_buf_free(&nb);
    pcre2_match_data_free(md);
    if (st) {
        free(out.v);
        return st;
    }
    if (out.n == 0) {
        free(out.v);
        out.v = NULL;
    }
    *ids = out.v;
    *n_ids = out.n;
    return LOOM_OK;
}

/* ---- lookups -------------------------------------------------------------------------- */

int loom_tok_vocab_size(const loom_tok *t) { return t->n_ids; }

int32_t loom_tok_token_to_id(const loom_tok *t, const char *s, size_t len) {
    int32_t id = tk_strmap_get(&t->added_map, &t->added_tab, s, len);
    if (id >= 0) return id;
    return tk_strmap_get(&t->vocab_map, &t->vocab, s, len);
}

const char *loom_tok_id_to_token(const loom_tok *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids) return NULL;
    int32_t a = t->added_of_id[id];
    if (a >= 0) {
        if (len) *len = t->added[a].len;
        return t->added[a].content;
    }
    if (id < t->vocab.n && t->vocab.s[id]) {
        if (len) *len = t->vocab.len[id];
        return t->vocab.s[id];
    }
    return NULL;
}

int loom_tok_is_added(const loom_tok *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->added_of_id[id] >= 0;
}

int loom_tok_is_special(const loom_tok *t, int32_t id) {
    return loom_tok_is_added(t, id) && t->added[t->added_of_id[id]].special;
}

static int has_bytelevel(const tk_dec *d) {
    if (!d) return 0;
    if (d->type == TK_DEC_BYTELEVEL) return 1;
    for (int i = 0; d->type == TK_DEC_SEQUENCE && i < d->n_sub; i++)
        if (has_bytelevel(&d->sub[i])) return 1;
    return 0;
}

int loom_tok_token_bytes(const loom_tok *t, int32_t id, char *out, size_t cap) {
    size_t n;
    const char *s = loom_tok_id_to_token(t, id, &n);
    if (!s || loom_tok_is_special(t, id)) return -1;
    tk_buf b = {0};
    int bad = 0;
    if (loom_tok_is_added(t, id)) bad = tk_buf_put(&b, s, n);
    else if (has_bytelevel(t->dec)) bad = tk_bytelevel_bytes(s, n, &b);
    else if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>') {
        unsigned v;
        bad = sscanf(s + 3, "%2x", &v) != 1 || tk_buf_putc(&b, (int)v);
    } else {
        for (size_t k = 0; k < n && !bad; k++) {
            if (k + 3 <= n && !memcmp(s + k, "\xe2\x96\x81", 3)) {
                bad = tk_buf_putc(&b, ' ');
                k += 2;
            } else bad = tk_buf_putc(&b, s[k]);
        }
    }
    int len = bad ? -1 : (int)b.n;
    if (len > 0) memcpy(out, b.p, LOOM_MIN(b.n, cap));
    tk_buf_free(&b);
    return len;
}

int32_t loom_tok_bos_id(const loom_tok *t) { return t->bos_id; }
int32_t loom_tok_eos_id(const loom_tok *t) { return t->eos_id; }
int32_t loom_tok_pad_id(const loom_tok *t) { return t->pad_id; }
int loom_tok_config_add_bos(const loom_tok *t) { return t->add_bos_cfg; }
int loom_tok_config_add_eos(const loom_tok *t) { return t->add_eos_cfg; }
const char *loom_tok_chat_template(const loom_tok *t) { return t->chat_template; }

/* ---- decode ------------------------------------------------------------------------------ */

loom_status loom_tok_decode(const loom_tok *t, const int32_t *ids, size_t n,
                            int skip_special, char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    if (!t || (!ids && n))
        return loom_err(LOOM_ERR_INVALID_ARG, "tok_decode: expected a tokenizer and ids");
    tk_pieces toks = {0};
    tk_buf out = {0};
    loom_status st = LOOM_OK;
    for (size_t i = 0; i < n && !st; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids) {
            st = loom_err(LOOM_ERR_RANGE, "tok_decode: ids[%zu]: expected a token id in [0, %d), found %d",
                          i, t->n_ids, (int)ids[i]);
            break;
        }
        size_t l;
        const char *s = loom_tok_id_to_token(t, ids[i], &l);
        if (!s || (skip_special && loom_tok_is_special(t, ids[i]))) continue;
        if (tk_pieces_add(&toks, s, l, -1, 0)) st = tk_nomem();
    }
    if (!st) {
        tk_dec_ctx ctx = {.at_start = 1, .strip_left = tk_dec_initial_strip(t->dec),
                          .final = 1};
        st = tk_decode_tokens(t->dec, &toks, &ctx, &out, NULL);
    }
    tk_pieces_free(&toks);
    if (!st && tk_buf_reserve(&out, 0)) st = tk_nomem();
    if (st) {
        tk_buf_free(&out);
        return st;
    }
    out.p[out.n] = 0;
    *text = out.p;
    if (len) *len = out.n;
    return LOOM_OK;
}

/* ---- loading ------------------------------------------------------------------------------- */

void loom_tok_free(loom_tok *t) {
    if (!t) return;
    free(t->arena);
    free(t->vocab.s);
    free(t->vocab.len);
    tk_strmap_free(&t->vocab_map);
    tk_merge_map_free(&t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    free(t->added);
    free(t->added_of_id);
    free(t->added_tab.s);
    free(t->added_tab.len);
    tk_strmap_free(&t->added_map);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    if (t->norm) { tk_norm_free(t->norm); free(t->norm); }
    if (t->pre) { tk_pre_free(t->pre); free(t->pre); }
    if (t->dec) { tk_dec_free(t->dec); free(t->dec); }
    free(t->post_prefix);
    free(t->post_suffix);
    free(t->chat_template);
    free(t);
}

static int ids_append(int32_t **v, int *n, const int32_t *src, int m,
                      int at_front) {
    int32_t *p = realloc(*v, (size_t)(*n + m + 1) * sizeof *p);
    if (!p) return -1;
    if (at_front) {
        memmove(p + m, p, (size_t)*n * sizeof *p);
        memcpy(p, src, (size_t)m * sizeof *p);
    } else {
        memcpy(p + *n, src, (size_t)m * sizeof *p);
    }
    *v = p;
    *n += m;
    return 0;
}

/* Reads the ids of special_tokens[name] of a TemplateProcessing. */
static loom_status template_ids(const cJSON *specials, const char *name,
                                int32_t *buf, int cap, int *n) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(specials, name);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(e, "ids");
    if (!cJSON_IsArray(ids))
        return loom_err(LOOM_ERR_FORMAT,
                        "post_processor TemplateProcessing: special token \"%s\": expected "
                        "an entry with an \"ids\" array in special_tokens", name);
    *n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, ids) {
        if (!cJSON_IsNumber(x) || *n >= cap)
            return loom_err(LOOM_ERR_FORMAT,
                            "post_processor TemplateProcessing: \"%s\": bad ids", name);
        buf[(*n)++] = (int32_t)x->valueint;
    }
    return LOOM_OK;
}

/* Wraps the current prefix/suffix with one post-processor's additions. */
static loom_status post_parse(loom_tok *t, const cJSON *j) {
    const char *type = tk_jstr(j, "type");
    if (!type) return loom_err(LOOM_ERR_FORMAT, "post_processor: expected a \"type\" string");
    if (!strcmp(type, "ByteLevel")) return LOOM_OK; /* offsets only */
    if (!strcmp(type, "Sequence")) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "processors");
        if (!cJSON_IsArray(a))
            return loom_err(LOOM_ERR_FORMAT, "post_processor Sequence: expected a \"processors\" array");
        const cJSON *e;
        cJSON_ArrayForEach(e, a) {
            loom_status st = post_parse(t, e);
            if (st) return st;
        }
        return LOOM_OK;
    }
    int32_t pre[64], suf[64];
    int npre = 0, nsuf = 0;
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
        if (!cJSON_IsArray(single))
            return loom_err(LOOM_ERR_FORMAT, "post_processor TemplateProcessing: expected a \"single\" array");
        int seen_seq = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, single) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
            if (sq) { seen_seq = 1; continue; }
            const char *name = tk_jstr(sp, "id");
            if (!name)
                return loom_err(LOOM_ERR_FORMAT,
                                "post_processor TemplateProcessing: expected SpecialToken or Sequence items");
            int m = 0;
            int32_t buf[32];
            loom_status st = template_ids(specials, name, buf, 32, &m);
            if (st) return st;
            int32_t *dst = seen_seq ? suf : pre;
            int *dn = seen_seq ? &nsuf : &npre;
            if (*dn + m > 64)
                return loom_err(LOOM_ERR_UNSUPPORTED, "post_processor TemplateProcessing: too many special ids");
            memcpy(dst + *dn, buf, (size_t)m * sizeof *buf);
            *dn += m;
        }
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(j, "cls");
        const cJSON *sep = cJSON_GetObjectItemCaseSensitive(j, "sep");
        if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || cJSON_GetArraySize(cls) != 2 ||
            cJSON_GetArraySize(sep) != 2 || !cJSON_IsNumber(cJSON_GetArrayItem(cls, 1)) ||
            !cJSON_IsNumber(cJSON_GetArrayItem(sep, 1)))
            return loom_err(LOOM_ERR_FORMAT, "post_processor %s: expected \"cls\" and \"sep\" as [token, id]", type);
        pre[npre++] = (int32_t)cJSON_GetArrayItem(cls, 1)->valueint;
        suf[nsuf++] = (int32_t)cJSON_GetArrayItem(sep, 1)->valueint;
    } else {
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "post_processor: expected one of TemplateProcessing, ByteLevel, "
                        "RobertaProcessing, BertProcessing, Sequence, found type \"%s\"", type);
    }
    if (ids_append(&t->post_prefix, &t->n_post_prefix, pre, npre, 1) ||
        ids_append(&t->post_suffix, &t->n_post_suffix, suf, nsuf, 0))
        return tk_nomem();
    return LOOM_OK;
}

typedef struct vocab_entry {
    size_t off;       /* in the arena */
    uint32_t len;
    int32_t id;
} vocab_entry;

/* Reads model.vocab from the raw text into the arena buffer. */
static loom_status read_vocab(const char *js, tk_span_t span, tk_buf *arena,
                              vocab_entry **out, size_t *n_out) {
    tk_lex x = {.p = js + span.s, .e = js + span.e, .base = js};
    vocab_entry *v = NULL;
    size_t n = 0, cap = 0;
    loom_status st = LOOM_OK;
    x.p++;
    for (;;) {
        tk_lex_ws(&x);
        if (x.p < x.e && *x.p == '}') break;
        size_t off = arena->n;
        long long id;
        if (tk_lex_string(&x, arena) || tk_buf_putc(arena, 0)) {
            st = loom_err(LOOM_ERR_FORMAT, "tokenizer.json: model.vocab: expected a string key at entry %zu", n);
            break;
        }
        tk_lex_ws(&x);
        if (x.p < x.e && *x.p == ':') x.p++;
        tk_lex_ws(&x);
        if (tk_lex_int(&x, &id) || id < 0 || id >= TK_MAX_ID) {
            st = loom_err(LOOM_ERR_FORMAT,
                          "tokenizer.json: model.vocab[\"%.80s\"]: expected an integer id in [0, %d)",
                          arena->p + off, TK_MAX_ID);
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            vocab_entry *q = realloc(v, cap * sizeof *q);
            if (!q) { st = tk_nomem(); break; }
            v = q;
        }
        v[n++] = (vocab_entry){off, (uint32_t)(arena->n - off - 1), (int32_t)id};
        tk_lex_ws(&x);
        if (x.p < x.e && *x.p == ',') x.p++;
    }
    if (st) {
        free(v);
        return st;
    }
    *out = v;
    *n_out = n;
    return LOOM_OK;
}

static loom_status load_model(loom_tok *t, const cJSON *model,
                              const cJSON *added_arr, const char *js,
                              tk_span_t vspan, tk_span_t mspan) {
    if (!cJSON_IsObject(model))
        return loom_err(LOOM_ERR_FORMAT, "tokenizer.json: expected a \"model\" object, found %s",
                        cjson_type_name(model));
    const char *type = tk_jstr(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (type && strcmp(type, "BPE"))
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "tokenizer.json: model: expected type \"BPE\", found \"%s\"", type);
    if (!type && !merges)
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "tokenizer.json: model: expected a BPE model (type or merges), found neither");
    if (!cJSON_IsObject(vocab) || !vspan.e)
        return loom_err(LOOM_ERR_FORMAT, "tokenizer.json: model.vocab: expected an object, found %s",
                        cjson_type_name(vocab));
    if (merges && !cJSON_IsNull(merges) && (!cJSON_IsArray(merges) || !mspan.e))
        return loom_err(LOOM_ERR_FORMAT, "tokenizer.json: model.merges: expected an array, found %s",
                        cjson_type_name(merges));
    if (added_arr && !cJSON_IsArray(added_arr) && !cJSON_IsNull(added_arr))
        return loom_err(LOOM_ERR_FORMAT, "tokenizer.json: added_tokens: expected an array, found %s",
                        cjson_type_name(added_arr));

    /* strings go to one arena; pointers are taken once it stops growing */
    tk_buf arena = {0};
    vocab_entry *ve = NULL;
    size_t n_vocab = 0;
    loom_status st = read_vocab(js, vspan, &arena, &ve, &n_vocab);
    int32_t max_id = -1;
    for (size_t i = 0; i < n_vocab; i++)
        if (ve[i].id > max_id) max_id = ve[i].id;

    int n_added = 0;
    int32_t max_added = -1;
    size_t *added_off = NULL;
    const cJSON *e;
    if (!st && cJSON_IsArray(added_arr)) {
        added_off = malloc(((size_t)cJSON_GetArraySize(added_arr) + 1) * sizeof *added_off);
        if (!added_off) st = tk_nomem();
        cJSON_ArrayForEach(e, added_arr) {
            if (st) break;
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
            const char *c = tk_jstr(e, "content");
            if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= TK_MAX_ID || !c) {
                st = loom_err(LOOM_ERR_FORMAT,
                              "tokenizer.json: added_tokens[%d]: expected \"id\" in [0, %d) and \"content\"",
                              n_added, TK_MAX_ID);
                break;
            }
            if (id->valueint > max_added) max_added = id->valueint;
            added_off[n_added++] = arena.n;
            if (tk_buf_put(&arena, c, strlen(c) + 1)) st = tk_nomem();
        }
    }
    if (st) {
        free(ve);
        free(added_off);
        tk_buf_free(&arena);
        return st;
    }
    t->arena = arena.p;
    t->arena_len = arena.n;
    t->arena_cap = arena.cap;
    t->n_ids = (max_id > max_added ? max_id : max_added) + 1;

    t->vocab.n = max_id + 1;
    t->vocab.s = calloc((size_t)t->vocab.n + 1, sizeof *t->vocab.s);
    t->vocab.len = calloc((size_t)t->vocab.n + 1, sizeof *t->vocab.len);
    t->added = calloc((size_t)n_added + 1, sizeof *t->added);
    t->added_of_id = malloc(((size_t)t->n_ids + 1) * sizeof *t->added_of_id);
    t->added_tab.n = t->n_ids;
    t->added_tab.s = calloc((size_t)t->n_ids + 1, sizeof *t->added_tab.s);
    t->added_tab.len = calloc((size_t)t->n_ids + 1, sizeof *t->added_tab.len);
    if (!t->vocab.s || !t->vocab.len || !t->added || !t->added_of_id ||
        !t->added_tab.s || !t->added_tab.len ||
        tk_strmap_init(&t->vocab_map, n_vocab) || tk_strmap_init(&t->added_map, (size_t)n_added)) {
        free(ve);
        free(added_off);
        return tk_nomem();
    }
    for (int32_t i = 0; i < t->n_ids; i++) t->added_of_id[i] = -1;
    for (size_t i = 0; i < n_vocab; i++) {
        t->vocab.s[ve[i].id] = t->arena + ve[i].off;
        t->vocab.len[ve[i].id] = ve[i].len;
    }
    for (size_t i = 0; i < n_vocab; i++)
        tk_strmap_put(&t->vocab_map, &t->vocab, t->arena + ve[i].off, ve[i].len, ve[i].id);
    free(ve);
    if (cJSON_IsArray(added_arr))
        cJSON_ArrayForEach(e, added_arr) {
            tk_added *a = &t->added[t->n_added];
            a->content = t->arena + added_off[t->n_added];
            a->len = (uint32_t)strlen(a->content);
            a->id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
            a->special = (uint8_t)tk_jbool(e, "special", 0);
            a->lstrip = (uint8_t)tk_jbool(e, "lstrip", 0);
            a->rstrip = (uint8_t)tk_jbool(e, "rstrip", 0);
            a->single_word = (uint8_t)tk_jbool(e, "single_word", 0);
            a->normalized = (uint8_t)tk_jbool(e, "normalized", !a->special);
            t->added_of_id[a->id] = t->n_added;
            t->added_tab.s[a->id] = a->content;
            t->added_tab.len[a->id] = a->len;
            tk_strmap_put(&t->added_map, &t->added_tab, a->content, a->len, a->id);
            t->n_added++;
        }
    free(added_off);

    /* model options */
    const char *p = tk_jstr(model, "continuing_subword_prefix");
    if (p && *p) {
        t->cont_prefix_len = strlen(p);
        if (!(t->cont_prefix = strdup(p))) return tk_nomem();
    }
    p = tk_jstr(model, "end_of_word_suffix");
    if (p && *p) {
        t->eow_suffix_len = strlen(p);
        if (!(t->eow_suffix = strdup(p))) return tk_nomem();
    }
    t->fuse_unk = tk_jbool(model, "fuse_unk", 0);
    t->byte_fallback = tk_jbool(model, "byte_fallback", 0);
    t->ignore_merges = tk_jbool(model, "ignore_merges", 0);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble > 0)
        loom_log(LOOM_LOG_WARN, "tokenizer: BPE dropout %g ignored (encoding is deterministic)",
                 drop->valuedouble);
    t->unk_id = -1;
    p = tk_jstr(model, "unk_token");
    if (p) t->unk_id = tk_strmap_get(&t->vocab_map, &t->vocab, p, strlen(p));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = tk_strmap_get(&t->vocab_map, &t->vocab, name, 6);
    }
    if (!cJSON_IsArray(merges)) mspan.e = 0;
    return tk_merges_build(t, js, mspan);
}

static loom_status build_tries(loom_tok *t) {
    if (trie_init(&t->trie_raw) || trie_init(&t->trie_norm)) return tk_nomem();
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return tk_nomem();
    tk_buf nb = {0};
    loom_status st = LOOM_OK;
    /* special tokens take precedence in the reference's pattern order */
    for (int pass = 0; pass < 2 && !st; pass++)
        for (int i = 0; i < t->n_added && !st; i++) {
            const tk_added *a = &t->added[i];
            if (a->len == 0 || (pass == 0) != (a->special != 0)) continue;
            if (!a->normalized) {
                if (trie_insert(&t->trie_raw, a->content, a->len, i)) st = tk_nomem();
                continue;
            }
            const char *s = a->content;
            size_t n = a->len;
            if (t->norm) {
                nb.n = 0;
                st = tk_norm_apply(t->norm, s, n, &nb, md);
                s = nb.p ? nb.p : "";
                n = nb.n;
            }
            if (!st && n) {
                if (trie_insert(&t->trie_norm, s, n, i)) st = tk_nomem();
                t->has_norm_added = 1;
            }
        }
    tk_buf_free(&nb);
    pcre2_match_data_free(md);
    return st;
}

static int32_t config_token_id(const loom_tok *t, const cJSON *cfg,
                               const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : tk_jstr(v, "content");
    return s ? loom_tok_token_to_id(t, s, strlen(s)) : -1;
}

static loom_status load_config(loom_tok *t, const char *cfg_text, size_t n) {
    cJSON *cfg = cJSON_ParseWithLength(cfg_text, n);
    if (!cfg || !cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return loom_err(LOOM_ERR_FORMAT, "tokenizer_config.json: expected a JSON object");
    }
    t->bos_id = config_token_id(t, cfg, "bos_token");
    t->eos_id = config_token_id(t, cfg, "eos_token");
    t->pad_id = config_token_id(t, cfg, "pad_token");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    if (cJSON_IsBool(v)) t->add_bos_cfg = cJSON_IsTrue(v);
    v = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    if (cJSON_IsBool(v)) t->add_eos_cfg = cJSON_IsTrue(v);
    v = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *tmpl = cJSON_IsString(v) ? v->valuestring : NULL;
    if (cJSON_IsArray(v)) {
        /* named templates: take "default" */
        const cJSON *e;
        cJSON_ArrayForEach(e, v) {
            const char *name = tk_jstr(e, "name");
            if (name && !strcmp(name, "default")) tmpl = tk_jstr(e, "template");
        }
    }
    loom_status st = LOOM_OK;
    if (tmpl && !(t->chat_template = strdup(tmpl))) st = tk_nomem();
    cJSON_Delete(cfg);
    return st;
}

loom_status loom_tok_load_mem(const char *json, size_t json_len,
                              const char *config_json, size_t config_len,
                              loom_tok **out) {
    *out = NULL;
    if (!json) return loom_err(LOOM_ERR_INVALID_ARG, "tok_load: expected JSON text, found NULL");
    /* JSON is UTF-8; a token with stray bytes would decode to invalid text */
    if (!tk_utf8_valid(json, json_len))
        return loom_err(LOOM_ERR_FORMAT, "tokenizer.json: expected UTF-8 text, found invalid bytes");
    if (config_json && !tk_utf8_valid(config_json, config_len))
        return loom_err(LOOM_ERR_FORMAT, "tokenizer_config.json: expected UTF-8 text, found invalid bytes");
    /* The vocabulary and merges are read from the text directly; cJSON sees
     * a copy with those two values blanked. */
    tk_span_t vspan, mspan;
    char *small = NULL;
    size_t small_len = 0;
    if (tk_json_locate_model(json, json_len, &vspan, &mspan) == 0 && vspan.e) {
        tk_span_t cut[2] = {vspan, mspan};
        if (mspan.e && mspan.s < vspan.s) { cut[0] = mspan; cut[1] = vspan; }
        small = malloc(json_len + 8);
        if (!small) return tk_nomem();
        size_t from = 0;
        for (int i = 0; i < 2; i++) {
            if (!cut[i].e) continue;
            memcpy(small + small_len, json + from, cut[i].s - from);
            small_len += cut[i].s - from;
            small[small_len++] = json[cut[i].s];            /* '{' or '[' */
            small[small_len++] = json[cut[i].e - 1];        /* '}' or ']' */
            from = cut[i].e;
        }
        memcpy(small + small_len, json + from, json_len - from);
        small_len += json_len - from;
    } else {
        vspan.e = mspan.e = 0;
    }
    cJSON *root = small ? cJSON_ParseWithLength(small, small_len)
                        : cJSON_ParseWithLength(json, json_len);
    free(small);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= json && at <= json + json_len ? (size_t)(at - json) : json_len;
        return loom_err(LOOM_ERR_FORMAT,
                        "tokenizer.json: expected valid JSON, parse error at byte %zu of %zu",
                        off, json_len);
    }
    loom_tok *t = calloc(1, sizeof *t);
    if (!t) {
        cJSON_Delete(root);
        return tk_nomem();
    }
    t->bos_id = t->eos_id = t->pad_id = t->unk_id = -1;
    t->add_bos_cfg = t->add_eos_cfg = -1;
    loom_status st = LOOM_OK;
    if (!cJSON_IsObject(root))
        st = loom_err(LOOM_ERR_FORMAT, "tokenizer.json: expected an object at the top, found %s",
                      cjson_type_name(root));
    if (!st)
        st = load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"),
                        cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), json,
                        vspan, mspan);
    const cJSON *c;
    if (!st && (c = cJSON_GetObjectItemCaseSensitive(root, "normalizer")) && !cJSON_IsNull(c)) {
        if (!(t->norm = calloc(1, sizeof *t->norm))) st = tk_nomem();
        else st = tk_norm_parse(c, t->norm);
    }
    if (!st && (c = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")) && !cJSON_IsNull(c)) {
        if (!(t->pre = calloc(1, sizeof *t->pre))) st = tk_nomem();
        else st = tk_pre_parse(c, t->pre);
    }
    if (!st && (c = cJSON_GetObjectItemCaseSensitive(root, "decoder")) && !cJSON_IsNull(c)) {
        if (!(t->dec = calloc(1, sizeof *t->dec))) st = tk_nomem();
        else st = tk_dec_parse(c, t->dec);
    }
    if (!st && (c = cJSON_GetObjectItemCaseSensitive(root, "post_processor")) && !cJSON_IsNull(c))
        st = post_parse(t, c);
    for (int i = 0; !st && i < t->n_post_prefix + t->n_post_suffix; i++) {
        int32_t id = i < t->n_post_prefix ? t->post_prefix[i]
                                          : t->post_suffix[i - t->n_post_prefix];
        if (id < 0 || id >= t->n_ids)
            st = loom_err(LOOM_ERR_FORMAT, "post_processor: special id %d outside the vocabulary [0, %d)",
                          (int)id, t->n_ids);
    }
    if (!st) st = build_tries(t);
    cJSON_Delete(root);
    if (!st && config_json) st = load_config(t, config_json, config_len);
    if (st) {
        loom_tok_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
}

loom_status loom_tok_load(const char *json_path, const char *config_path,
                          loom_tok **out) {
    *out = NULL;
    if (!json_path) return loom_err(LOOM_ERR_INVALID_ARG, "tok_load: expected a path, found NULL");
    char *js = NULL, *cs = NULL;
    size_t jn = 0, cn = 0;
    loom_status st = loom_read_file(json_path, &js, &jn);
    if (st) return st;
    if (config_path) {
        st = loom_read_file(config_path, &cs, &cn);
        if (st) {
            loom_free(js);
            return st;
        }
    }
    st = loom_tok_load_mem(js, jn, cs, cn, out);
    if (st == LOOM_ERR_FORMAT || st == LOOM_ERR_UNSUPPORTED) loom_err_wrap(st, "%s", json_path);
    loom_free(js);
    loom_free(cs);
    return st;
}

loom_status loom_tok_load_dir(const char *dir, loom_tok **out) {
    *out = NULL;
    char jp[4096], cp[4096];
    loom_status st = loom_path_join(jp, sizeof jp, dir, "tokenizer.json");
    if (!st) st = loom_path_join(cp, sizeof cp, dir, "tokenizer_config.json");
    if (st) return st;
    FILE *f = fopen(cp, "rb");
    if (f) fclose(f);
    return loom_tok_load(jp, f ? cp : NULL, out);
}

int loom_tok_turn_end_ids(const loom_tok *t, int32_t *out, int cap) {
    static const char *const ends[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>",
                                       "<|return|>", "<|eom_id|>", "<turn|>"};
    int n = 0;
    for (size_t i = 0; i < sizeof ends / sizeof ends[0] && n < cap; i++) {
        int32_t id = loom_tok_token_to_id(t, ends[i], strlen(ends[i]));
        if (id >= 0) out[n++] = id;
    }
    if (n < cap && loom_tok_eos_id(t) >= 0) out[n++] = loom_tok_eos_id(t);
    return n;
}
