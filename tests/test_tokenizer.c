/* Tokenizer tests: encode/decode against the reference fixtures of six
 * tokenizers, the streaming detokenizer against full decode, and malformed
 * inputs. Fixtures are read unpacked from $LOOM_BUILD/fixtures/tokenizers. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "base/base.h"
#include "test.h"
#include "tokenize/tokenizer.h"

static const char *names[] = {"qwen3", "llama3_1", "llama2", "gemma3",
                              "deepseek_v3", "gptoss"};

static char fixdir[1024];

static const char *fixture(const char *name, const char *file) {
    static char p[2048];
    snprintf(p, sizeof p, "%s/%s/%s", fixdir, name, file);
    return p;
}

static cJSON *load_json(const char *path) {
    char *s;
    size_t n;
    if (loom_read_file(path, &s, &n)) return NULL;
    cJSON *j = cJSON_ParseWithLength(s, n);
    loom_free(s);
    return j;
}

/* cJSON strings end at the first NUL, and one fixture row holds U+0000: the
 * raw values of a key are decoded here, in file order, with their lengths. */
typedef struct jstrs {
    char **s;
    size_t *len;
    size_t n;
} jstrs;

static unsigned hex4(const char *p) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 32) - 'a' + 10);
    }
    return v;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)); o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static jstrs raw_strings(const char *raw, const char *key) {
    jstrs r = {0};
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    size_t cap = 0;
    for (const char *p = strstr(raw, pat); p; p = strstr(p, pat)) {
        p += strlen(pat);
        const char *q = p;
        while (*q && *q != '"') q += *q == '\\' ? 2 : 1;
        char *o = malloc((size_t)(q - p) + 1);
        size_t n = 0;
        while (p < q) {
            if (*p != '\\') { o[n++] = *p++; continue; }
            char c = p[1];
            p += 2;
            switch (c) {
            case 'n': o[n++] = '\n'; break;
            case 't': o[n++] = '\t'; break;
            case 'r': o[n++] = '\r'; break;
            case 'b': o[n++] = '\b'; break;
            case 'f': o[n++] = '\f'; break;
            case 'u': {
                unsigned cp = hex4(p);
                p += 4;
                if (cp >= 0xD800 && cp < 0xDC00 && p[0] == '\\' && p[1] == 'u') {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(p + 2) - 0xDC00);
                    p += 6;
                }
                n += put_utf8(o + n, cp);
                break;
            }
            default: o[n++] = c;
            }
        }
        o[n] = 0;
        if (r.n == cap) {
            cap = cap ? cap * 2 : 256;
            r.s = realloc(r.s, cap * sizeof *r.s);
            r.len = realloc(r.len, cap * sizeof *r.len);
        }
        r.s[r.n] = o;
        r.len[r.n++] = n;
        p = q;
    }
    return r;
}

static void jstrs_free(jstrs *r) {
    for (size_t i = 0; i < r->n; i++) free(r->s[i]);
    free(r->s);
    free(r->len);
}

static int ids_from_json(const cJSON *a, int32_t **out) {
    int n = cJSON_GetArraySize(a);
    *out = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) (*out)[i++] = (int32_t)e->valueint;
    return n;
}

static void print_ids(const char *what, const int32_t *v, size_t n) {
    fprintf(stderr, "    %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 60; i++) fprintf(stderr, " %d", (int)v[i]);
    if (n > 60) fprintf(stderr, " ...");
    fputc('\n', stderr);
}

static int ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static int valid_utf8(const char *s, size_t n) {
    /* strict check, independent of the module's own */
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        int len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2
                : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!len || i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        if (len == 3 && ((c == 0xE0 && u[i + 1] < 0xA0) || (c == 0xED && u[i + 1] > 0x9F))) return 0;
        if (len == 4 && ((c == 0xF0 && u[i + 1] < 0x90) || (c == 0xF4 && u[i + 1] > 0x8F))) return 0;
        i += (size_t)len;
    }
    return 1;
}

static size_t last_flush_len; /* what the last detok_matches got from flush */

/* Streams ids through a detokenizer; returns 1 if the pieces are valid
 * UTF-8 and concatenate to decode(ids). */
static int detok_matches(const loom_tok *t, const int32_t *ids, size_t n,
                         int skip_special, int verbose) {
    char *full;
    size_t full_len;
    if (loom_tok_decode(t, ids, n, skip_special, &full, &full_len)) return 0;
    loom_detok *d;
    if (loom_detok_create(t, skip_special, &d)) { free(full); return 0; }
    char *acc = malloc(full_len * 2 + 64);
    size_t acc_n = 0, acc_cap = full_len * 2 + 64;
    int ok = 1;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *p;
        size_t l;
        loom_status st = i < n ? loom_detok_push(d, ids[i], &p, &l)
                               : loom_detok_flush(d, &p, &l);
        if (st || !valid_utf8(p, l)) { ok = 0; break; }
        if (i == n) last_flush_len = l;
        if (acc_n + l > acc_cap) {
            acc_cap = (acc_n + l) * 2;
            acc = realloc(acc, acc_cap);
        }
        memcpy(acc + acc_n, p, l);
        acc_n += l;
    }
    if (ok && (acc_n != full_len || memcmp(acc, full, full_len) != 0)) ok = 0;
    if (!ok && verbose) {
        fprintf(stderr, "    detok: \"%.*s\"\n    decode: \"%s\"\n", (int)acc_n, acc, full);
        print_ids("ids", ids, n);
    }
    free(acc);
    free(full);
    loom_detok_free(d);
    return ok;
}

/* Appends a random piece of text: words, whitespace runs, digits, code
 * punctuation, letters of several scripts, combining marks, emoji with ZWJ,
 * and the tokenizer's own special-token strings. */
static size_t rand_text(unsigned long long *seed, char *o, size_t cap, const loom_tok *t,
                        int allow_added) {
    static const unsigned ranges[][2] = {
        {0x20, 0x7E}, {0xA0, 0xFF}, {0x400, 0x44F}, {0x4E00, 0x4FFF}, {0xAC00, 0xAD00},
        {0x300, 0x36F}, {0x1F600, 0x1F64F}, {0x1F300, 0x1F3FF}, {0x600, 0x6FF},
        {0x900, 0x97F}, {0x3040, 0x30FF}, {0x2000, 0x206F}, {0x0, 0x1F},
    };
    static const char *words[] = {"the", " of", "Hello", " world", "  ", "\n", "\n\n", "\t",
                                  "123", "3.14", "'s", "'LL", "def", "(x)", "{}", "==", "    ",
                                  "\r\n", "\xE2\x80\x8D", "\xC2\x85", "\xE1\xA0\x8E"};
    size_t n = 0;
    int parts = 1 + (int)(test_rand_u32(seed) % 12);
    for (int k = 0; k < parts; k++) {
        unsigned r = test_rand_u32(seed) % 10;
        char tmp[64];
        size_t l = 0;
        if (r < 4) {
            const char *w = words[test_rand_u32(seed) % LOOM_ARRAY_LEN(words)];
            l = strlen(w);
            memcpy(tmp, w, l);
        } else if (r < 9) {
            int m = 1 + (int)(test_rand_u32(seed) % 4);
            const unsigned *rg = ranges[test_rand_u32(seed) % LOOM_ARRAY_LEN(ranges)];
            for (int i = 0; i < m; i++) {
                unsigned cp = rg[0] + test_rand_u32(seed) % (rg[1] - rg[0] + 1);
                if (cp == 0) cp = 1;
                l += put_utf8(tmp + l, cp);
            }
        } else {
            /* an added token's text, if the id has one */
            int32_t id = (int32_t)(test_rand_u32(seed) % (unsigned)loom_tok_vocab_size(t));
            for (int tries = 0; tries < 64 && !loom_tok_is_added(t, id); tries++)
                id = (id + 1) % loom_tok_vocab_size(t);
            size_t tl;
            const char *ts = loom_tok_id_to_token(t, id, &tl);
            if (allow_added && ts && tl < sizeof tmp && loom_tok_is_added(t, id)) {
                memcpy(tmp, ts, tl);
                l = tl;
            }
        }
        if (n + l >= cap) break;
        memcpy(o + n, tmp, l);
        n += l;
    }
    o[n] = 0;
    return n;
}

/* decode(encode(text)) gives back the text (after NFC where the tokenizer
 * normalizes that way) for random strings of many kinds. llama2 prepends
 * "▁" to the text after each added token, which decodes as a space, so it
 * gets no added-token strings here. */
static void test_roundtrip(const loom_tok *t, const char *name) {
    unsigned long long seed = 0x1234567ULL + (unsigned long long)strlen(name) * 7919;
    int nfc = !strcmp(name, "qwen3"), ok = 0, n_try = 400, shown = 0;
    for (int k = 0; k < n_try; k++) {
        char text[512];
        size_t n = rand_text(&seed, text, sizeof text, t, strcmp(name, "llama2") != 0);
        char *want = text;
        utf8proc_uint8_t *norm = NULL;
        if (nfc && n) {
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)n, &norm,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r >= 0) { want = (char *)norm; }
        }
        int32_t *ids = NULL;
        size_t ni = 0;
        char *back = NULL;
        size_t bl = 0;
        int good = loom_tok_encode(t, text, n, 0, &ids, &ni) == LOOM_OK &&
                   loom_tok_decode(t, ids, ni, 0, &back, &bl) == LOOM_OK &&
                   bl == strlen(want) && !memcmp(back, want, bl) &&
                   detok_matches(t, ids, ni, 0, 0);
        if (good) ok++;
        else if (!shown++)
            fprintf(stderr, "%s: roundtrip of \"%s\" gave \"%s\"\n", name, text, back ? back : "(error)");
        free(ids);
        free(back);
        free(norm);
    }
    CHECKF(ok == n_try, "%s: roundtrip %d/%d", name, ok, n_try);
}

/* Primes a detokenizer with ids[0..k) and streams the rest: the output must
 * be decode(ids) minus decode(ids[0..k)) whenever the latter is a prefix of
 * the former. Returns 1 if it holds or does not apply. */
static int prime_matches(const loom_tok *t, const int32_t *ids, size_t n, size_t k) {
    char *full, *head;
    size_t fl, hl;
    if (loom_tok_decode(t, ids, n, 0, &full, &fl)) return 0;
    if (loom_tok_decode(t, ids, k, 0, &head, &hl)) { free(full); return 0; }
    int applies = hl <= fl && !memcmp(full, head, hl);
    int ok = 1;
    if (applies) {
        loom_detok *d;
        if (loom_detok_create(t, 0, &d)) { free(full); free(head); return 0; }
        size_t an = 0;
        char *acc = malloc(fl + 64);
        ok = loom_detok_prime(d, ids, k) == LOOM_OK;
        for (size_t i = k; i <= n && ok; i++) {
            const char *p;
            size_t l;
            loom_status st = i < n ? loom_detok_push(d, ids[i], &p, &l) : loom_detok_flush(d, &p, &l);
            if (st || an + l > fl) { ok = 0; break; }
            memcpy(acc + an, p, l);
            an += l;
        }
        ok = ok && an == fl - hl && !memcmp(acc, full + hl, an);
        free(acc);
        loom_detok_free(d);
    }
    free(full);
    free(head);
    return ok;
}

static void test_fixture(const char *name) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/%s", fixdir, name);
    loom_tok *t = NULL;
    double t0 = loom_now();
    loom_status st = loom_tok_load_dir(dir, &t);
    double load_s = loom_now() - t0;
    CHECKF(st == LOOM_OK, "%s: load: %s", name, loom_last_error());
    if (st) return;
    cJSON *enc = load_json(fixture(name, "encodings.json"));
    CHECKF(enc != NULL, "%s: encodings.json", name);
    if (!enc) { loom_tok_free(t); return; }
    char *raw = NULL;
    loom_read_file(fixture(name, "encodings.json"), &raw, NULL);
    jstrs texts = raw_strings(raw ? raw : "", "text");
    jstrs decs = raw_strings(raw ? raw : "", "decoded");
    loom_free(raw);
    CHECKF(texts.n == (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(enc, "rows")) &&
           decs.n == texts.n, "%s: raw text scan found %zu rows", name, texts.n);
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(enc, "rows");
    int n_rows = 0, ok_enc = 0, ok_spec = 0, ok_dec = 0, ok_detok = 0;
    int shown_enc = 0, shown_spec = 0, shown_dec = 0, shown_detok = 0;
    double enc_s = 0;
    size_t enc_bytes = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, rows) {
        if ((size_t)n_rows >= texts.n) break;
        const char *text = texts.s[n_rows], *decoded = decs.s[n_rows];
        size_t text_len = texts.len[n_rows], decoded_len = decs.len[n_rows];
        int32_t *want, *want_sp, *got = NULL;
        size_t nw = (size_t)ids_from_json(cJSON_GetObjectItemCaseSensitive(r, "ids"), &want);
        size_t nws = (size_t)ids_from_json(
            cJSON_GetObjectItemCaseSensitive(r, "ids_with_special"), &want_sp);
        size_t ng = 0;
        n_rows++;
        double e0 = loom_now();
        st = loom_tok_encode(t, text, text_len, 0, &got, &ng);
        enc_s += loom_now() - e0;
        enc_bytes += text_len;
        if (st == LOOM_OK && ids_equal(got, ng, want, nw)) ok_enc++;
        else if (!shown_enc++) {
            fprintf(stderr, "%s: encode mismatch for \"%s\" (%s)\n", name, text,
                    st ? loom_last_error() : "ok");
            print_ids("want", want, nw);
            print_ids("got ", got, ng);
        }
        free(got);
        got = NULL;
        st = loom_tok_encode(t, text, text_len, 1, &got, &ng);
        if (st == LOOM_OK && ids_equal(got, ng, want_sp, nws)) ok_spec++;
        else if (!shown_spec++) {
            fprintf(stderr, "%s: encode(add_special) mismatch for \"%s\"\n", name, text);
            print_ids("want", want_sp, nws);
            print_ids("got ", got, ng);
        }
        free(got);
        char *dec = NULL;
        size_t dl;
        st = loom_tok_decode(t, want, nw, 0, &dec, &dl);
        if (st == LOOM_OK && dl == decoded_len && !memcmp(dec, decoded, dl)) ok_dec++;
        else if (!shown_dec++)
            fprintf(stderr, "%s: decode mismatch:\n    want \"%s\"\n    got  \"%s\"\n", name,
                    decoded, dec ? dec : "(error)");
        free(dec);
        /* byte-level streams hold nothing once the text is complete */
        int bytelevel = strcmp(name, "llama2") && strcmp(name, "gemma3");
        if (detok_matches(t, want, nw, 0, !shown_detok) &&
            (!bytelevel || last_flush_len == 0) &&
            detok_matches(t, want_sp, nws, 1, !shown_detok) &&
            prime_matches(t, want, nw, nw / 2))
            ok_detok++;
        else if (!shown_detok++)
            fprintf(stderr, "%s: detok mismatch for \"%s\"\n", name, text);
        free(want);
        free(want_sp);
    }
    CHECKF(ok_enc == n_rows, "%s: encode %d/%d", name, ok_enc, n_rows);
    CHECKF(ok_spec == n_rows, "%s: encode add_special %d/%d", name, ok_spec, n_rows);
    CHECKF(ok_dec == n_rows, "%s: decode %d/%d", name, ok_dec, n_rows);
    CHECKF(ok_detok == n_rows, "%s: detok %d/%d", name, ok_detok, n_rows);
    fprintf(stderr, "%-12s load %.3f s, encode %.1f MB/s; rows %d: encode %d, +special %d, "
            "decode %d, detok %d\n", name, load_s, enc_bytes / 1e6 / (enc_s > 0 ? enc_s : 1e-9),
            n_rows, ok_enc, ok_spec, ok_dec, ok_detok);
    cJSON_Delete(enc);
    jstrs_free(&texts);
    jstrs_free(&decs);

    /* chat renders: the rendered text encoded without specials gives ids.
     * deepseek_v3's chat ids come from a pipeline that drops the byte-level
     * spaces ("You are" -> "You", "are"), unlike its tokenizer.json and its
     * encodings.json; there the rows are only reported. */
    int chat_strict = strcmp(name, "deepseek_v3") != 0;
    cJSON *chat = load_json(fixture(name, "chat.json"));
    int n_chat = 0, ok_chat = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(chat, "rows")) {
        const cJSON *rendered = cJSON_GetObjectItemCaseSensitive(r, "rendered");
        if (!cJSON_IsString(rendered)) continue;
        int32_t *want, *got = NULL;
        size_t nw = (size_t)ids_from_json(cJSON_GetObjectItemCaseSensitive(r, "ids"), &want);
        size_t ng = 0;
        n_chat++;
        st = loom_tok_encode(t, rendered->valuestring, strlen(rendered->valuestring), 0, &got, &ng);
        if (!st && ids_equal(got, ng, want, nw)) ok_chat++;
        else if (n_chat - ok_chat == 1) {
            fprintf(stderr, "%s: chat render mismatch for \"%s\"\n", name, rendered->valuestring);
            print_ids("want", want, nw);
            print_ids("got ", got, ng);
        }
        free(got);
        free(want);
    }
    if (chat_strict) CHECKF(ok_chat == n_chat, "%s: chat %d/%d", name, ok_chat, n_chat);
    fprintf(stderr, "%-12s chat renders %d/%d%s\n", name, ok_chat, n_chat,
            chat_strict ? "" : " (not checked)");
    cJSON_Delete(chat);

    /* random id streams through the detokenizer */
    unsigned long long seed = 0x9E3779B97F4A7C15ULL ^ (unsigned long long)strlen(name);
    int vs = loom_tok_vocab_size(t), ok_rand = 0, n_rand = 300;
    for (int k = 0; k < n_rand; k++) {
        int32_t ids[48];
        size_t n = 1 + test_rand_u32(&seed) % 47;
        for (size_t i = 0; i < n; i++) {
            unsigned u = test_rand_u32(&seed);
            /* bias towards low ids (bytes, byte-fallback tokens) */
            ids[i] = (int32_t)((u & 3) == 0 ? (u >> 2) % 600 : (u >> 2) % (unsigned)vs);
        }
        if (detok_matches(t, ids, n, k & 1, ok_rand == k)) ok_rand++;
    }
    CHECKF(ok_rand == n_rand, "%s: random detok %d/%d", name, ok_rand, n_rand);

    /* config-driven specials: deepseek_v3's config asks for a BOS that its
     * tokenizer.json post-processor does not add; elsewhere they agree */
    {
        const char *hello = "Hello world";
        int32_t *a = NULL, *b = NULL, *c = NULL;
        size_t na = 0, nb = 0, nc = 0;
        CHECK(loom_tok_encode(t, hello, strlen(hello), 0, &a, &na) == LOOM_OK);
        CHECK(loom_tok_encode(t, hello, strlen(hello), 1, &b, &nb) == LOOM_OK);
        CHECK(loom_tok_encode(t, hello, strlen(hello), 2, &c, &nc) == LOOM_OK);
        if (!strcmp(name, "deepseek_v3"))
            CHECKF(nc == na + 1 && c[0] == loom_tok_bos_id(t) && ids_equal(c + 1, nc - 1, a, na),
                   "%s: config BOS", name);
        else
            CHECKF(ids_equal(b, nb, c, nc), "%s: config specials differ from post-processor", name);
        free(a);
        free(b);
        free(c);
    }

    test_roundtrip(t, name);

    /* priming with the prompt keeps the continuation's leading space */
    {
        int32_t *ids = NULL;
        size_t ni = 0;
        CHECK(loom_tok_encode(t, "Hello world", 11, 0, &ids, &ni) == LOOM_OK && ni == 2);
        loom_detok *d;
        if (ni == 2 && loom_detok_create(t, 0, &d) == LOOM_OK) {
            const char *p, *q;
            size_t l, m;
            CHECK(loom_detok_prime(d, ids, 1) == LOOM_OK);
            CHECK(loom_detok_push(d, ids[1], &p, &l) == LOOM_OK);
            char got[64];
            snprintf(got, sizeof got, "%.*s", (int)l, p);
            CHECK(loom_detok_flush(d, &q, &m) == LOOM_OK && m == 0);
            CHECKF(!strcmp(got, " world"), "%s: primed continuation \"%s\"", name, got);
            loom_detok_free(d);
        }
        free(ids);
    }

    /* lookups */
    int32_t eos = loom_tok_eos_id(t);
    CHECKF(eos >= 0, "%s: eos id", name);
    if (eos >= 0) {
        size_t l;
        const char *s = loom_tok_id_to_token(t, eos, &l);
        CHECK(s && loom_tok_token_to_id(t, s, l) == eos);
        CHECK(loom_tok_is_special(t, eos));
    }
    loom_tok_free(t);
}

static void expect_error(const char *json, loom_status want, const char *needle) {
    loom_tok *t = (loom_tok *)1;
    loom_status st = loom_tok_load_mem(json, strlen(json), NULL, 0, &t);
    CHECKF(st == want && t == NULL, "status %s, want %s (%s)", loom_status_str(st),
           loom_status_str(want), loom_last_error());
    CHECKF(strstr(loom_last_error(), needle) != NULL, "error \"%s\" lacks \"%s\"",
           loom_last_error(), needle);
    if (st == LOOM_OK) loom_tok_free(t);
}

static void test_malformed(void) {
    loom_tok *t = (loom_tok *)1;
    CHECK(loom_tok_load_dir("/nonexistent/dir", &t) == LOOM_ERR_IO && t == NULL);
    CHECK(strstr(loom_last_error(), "tokenizer.json") != NULL);

    /* truncated real file */
    char *s;
    size_t n;
    if (loom_read_file(fixture("llama2", "tokenizer.json"), &s, &n) == LOOM_OK) {
        CHECK(loom_tok_load_mem(s, n / 2, NULL, 0, &t) == LOOM_ERR_FORMAT && t == NULL);
        CHECK(strstr(loom_last_error(), "JSON") != NULL);
        loom_free(s);
    }
    expect_error("", LOOM_ERR_FORMAT, "JSON");
    expect_error("[1, 2]", LOOM_ERR_FORMAT, "object");
    expect_error("{\"normalizer\": null}", LOOM_ERR_FORMAT, "model");
    expect_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", LOOM_ERR_UNSUPPORTED,
                 "Unigram");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": [1], \"merges\": []}}",
                 LOOM_ERR_FORMAT, "vocab");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}",
                 LOOM_ERR_FORMAT, "vocab");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}",
                 LOOM_ERR_FORMAT, "merges");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                 " \"normalizer\": {\"type\": \"Precompiled\"}}",
                 LOOM_ERR_UNSUPPORTED, "Precompiled");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                 " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
                 "[{\"type\": \"Frobnicate\"}]}}",
                 LOOM_ERR_UNSUPPORTED, "Frobnicate");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                 " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"},"
                 " \"behavior\": \"Isolated\"}}",
                 LOOM_ERR_UNSUPPORTED, "regex");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                 " \"decoder\": {\"type\": \"CTC\"}}",
                 LOOM_ERR_UNSUPPORTED, "CTC");
    expect_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                 " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
                 "[{\"SpecialToken\": {\"id\": \"<s>\"}}], \"special_tokens\": {}}}",
                 LOOM_ERR_FORMAT, "<s>");
}

/* A tiny hand-written tokenizer exercising added-token flags and the
 * SentencePiece path without fixtures. */
static void test_small(void) {
    const char *json =
        "{\"added_tokens\": ["
        "{\"id\": 10, \"content\": \"<x>\", \"special\": true, \"lstrip\": true,"
        " \"rstrip\": true, \"single_word\": false, \"normalized\": false},"
        "{\"id\": 11, \"content\": \"ab\", \"special\": false, \"lstrip\": false,"
        " \"rstrip\": false, \"single_word\": true, \"normalized\": true}],"
        "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
        " {\"type\": \"Prepend\", \"prepend\": \"\\u2581\"},"
        " {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
        "\"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
        " {\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"},"
        " {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
        " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
        "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true,"
        " \"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"\\u2581\": 1, \"a\": 2,"
        " \"b\": 3, \"\\u2581a\": 4, \"<0xC3>\": 5, \"<0xA9>\": 6, \"c\": 7, \"ab\": 8,"
        " \"\\u2581ab\": 9},"
        " \"merges\": [[\"\\u2581\", \"a\"], \"a b\", \"\\u2581a b\"]}}";
    loom_tok *t;
    loom_status st = loom_tok_load_mem(json, strlen(json), NULL, 0, &t);
    CHECKF(st == LOOM_OK, "small: %s", loom_last_error());
    if (st) return;
    CHECK_EQ_INT(loom_tok_vocab_size(t), 12);
    struct { const char *text; int n; int32_t ids[8]; } cases[] = {
        {"ab", 1, {11}},                /* normalized added token "\u2581ab" */
        {"a <x>  b", 4, {4, 10, 1, 3}}, /* lstrip/rstrip eat the spaces */
        {"\xC3\xA9", 3, {1, 5, 6}},      /* byte fallback */
        {"zz", 2, {1, 0}},              /* fused unk */
        {"c ab", 3, {1, 7, 9}},         /* single_word: not after a word char */
        {"c. ab", 4, {1, 7, 0, 11}},    /* ...but after punctuation */
        {"cab", 3, {1, 7, 8}},
    };
    for (size_t k = 0; k < LOOM_ARRAY_LEN(cases); k++) {
        int32_t *ids;
        size_t n;
        st = loom_tok_encode(t, cases[k].text, strlen(cases[k].text), 0, &ids, &n);
        CHECKF(st == LOOM_OK && ids_equal(ids, n, cases[k].ids, (size_t)cases[k].n),
               "small: \"%s\"", cases[k].text);
        if (!(st == LOOM_OK && ids_equal(ids, n, cases[k].ids, (size_t)cases[k].n)))
            print_ids("got", ids, n);
        free(ids);
    }
    int32_t bad[] = {5, 2, 5, 6};   /* lone 0xC3 run, then a valid one */
    char *s;
    st = loom_tok_decode(t, bad, 4, 0, &s, NULL);
    CHECK(st == LOOM_OK && !strcmp(s, "\xEF\xBF\xBD" "a\xC3\xA9"));
    free(s);
    CHECK(detok_matches(t, bad, 4, 0, 1));
    int32_t oob = 99;
    CHECK(loom_tok_decode(t, &oob, 1, 0, &s, NULL) == LOOM_ERR_RANGE);
    CHECK(loom_tok_encode(t, "\xC3", 1, 0, (int32_t **)&s, &(size_t){0}) == LOOM_ERR_INVALID_ARG);
    loom_tok_free(t);
}

/* Metaspace pre-tokenizer and decoder (older SentencePiece exports), which
 * none of the fixtures use: prepend_scheme "first" only prepends at the
 * start of the text, not after an added token. */
static void test_metaspace(void) {
    for (int scheme = 0; scheme < 2; scheme++) {
        char json[2048];
        snprintf(json, sizeof json,
                 "{\"added_tokens\": [{\"id\": 0, \"content\": \"<s>\", \"special\": true}],"
                 "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\","
                 " \"prepend_scheme\": \"%s\", \"split\": true},"
                 "\"decoder\": {\"type\": \"Metaspace\", \"replacement\": \"\\u2581\","
                 " \"prepend_scheme\": \"%s\", \"split\": true},"
                 "\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"<s>\": 0,"
                 " \"\\u2581Hi\": 1, \"Hi\": 2, \"\\u2581there\": 3, \"\\u2581\": 4}, \"merges\": []}}",
                 scheme ? "always" : "first", scheme ? "always" : "first");
        loom_tok *t;
        loom_status st = loom_tok_load_mem(json, strlen(json), NULL, 0, &t);
        CHECKF(st == LOOM_OK, "metaspace: %s", loom_last_error());
        if (st) continue;
        int32_t *ids;
        size_t n;
        int32_t w1[] = {1, 3}, w2f[] = {0, 2, 3}, w2a[] = {0, 1, 3};
        CHECK(loom_tok_encode(t, "Hi there", 8, 0, &ids, &n) == LOOM_OK && ids_equal(ids, n, w1, 2));
        free(ids);
        CHECK(loom_tok_encode(t, "<s>Hi there", 11, 0, &ids, &n) == LOOM_OK &&
              ids_equal(ids, n, scheme ? w2a : w2f, 3));
        free(ids);
        char *s;
        CHECK(loom_tok_decode(t, w1, 2, 0, &s, NULL) == LOOM_OK && !strcmp(s, "Hi there"));
        free(s);
        CHECK(loom_tok_decode(t, w2f, 3, 0, &s, NULL) == LOOM_OK && !strcmp(s, "<s>Hi there"));
        free(s);
        CHECK(detok_matches(t, w1, 2, 0, 1) && detok_matches(t, w2a, 3, 0, 1));
        loom_tok_free(t);
    }
}

/* Random byte edits of a small valid file must load or fail cleanly; what
 * loads must encode and decode without faults (the suite runs under ASan). */
static void test_fuzz(void) {
    const char *base =
        "{\"added_tokens\": [{\"id\": 5, \"content\": \"<s>\", \"special\": true}],"
        "\"normalizer\": {\"type\": \"NFC\"},"
        "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
        " {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+|\\\\p{L}+\"},"
        "  \"behavior\": \"Isolated\", \"invert\": false},"
        " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
        "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["
        " {\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}],"
        " \"special_tokens\": {\"<s>\": {\"ids\": [5]}}},"
        "\"decoder\": {\"type\": \"ByteLevel\"},"
        "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2,"
        " \"\\u0120\": 3, \"\\u0120a\": 4}, \"merges\": [\"a b\", [\"\\u0120\", \"a\"]]}}";
    size_t n = strlen(base);
    loom_tok *t;
    loom_status st = loom_tok_load_mem(base, n, NULL, 0, &t);
    CHECKF(st == LOOM_OK, "fuzz base: %s", loom_last_error());
    if (st == LOOM_OK) {
        int32_t *ids;
        size_t ni;
        CHECK(loom_tok_encode(t, "ab ab<s>", 8, 1, &ids, &ni) == LOOM_OK);
        int32_t want[] = {5, 2, 3, 2, 5};
        CHECK(ids_equal(ids, ni, want, 5));
        free(ids);
        loom_tok_free(t);
    }
    char *buf = malloc(n + 1);
    unsigned long long seed = 12345;
    static const char alphabet[] = "{}[]\":,0123456789-truefalsnl\\ ab";
    int loaded = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, base, n + 1);
        int edits = 1 + (int)(test_rand_u32(&seed) % 4);
        size_t len = n;
        for (int e = 0; e < edits && len > 1; e++) {
            size_t pos = test_rand_u32(&seed) % len;
            unsigned op = test_rand_u32(&seed) % 3;
            if (op == 0) buf[pos] = alphabet[test_rand_u32(&seed) % (sizeof alphabet - 1)];
            else if (op == 1) { memmove(buf + pos, buf + pos + 1, len - pos); len--; }
            else len = pos + 1;  /* truncate */
        }
        st = loom_tok_load_mem(buf, len, NULL, 0, &t);
        if (st != LOOM_OK) {
            CHECKF(t == NULL && loom_last_error()[0], "fuzz %d: status %d without message", it, st);
            continue;
        }
        loaded++;
        int32_t *ids;
        size_t ni;
        const char *txt = "ab  b\xC3\xA9<s>a";
        if (loom_tok_encode(t, txt, strlen(txt), 1, &ids, &ni) == LOOM_OK) {
            char *s;
            for (size_t i = 0; i < ni; i++)
                if (ids[i] < 0 || ids[i] >= loom_tok_vocab_size(t)) ids[i] = 0;
            if (loom_tok_decode(t, ids, ni, 0, &s, NULL) == LOOM_OK) free(s);
            free(ids);
        }
        loom_tok_free(t);
    }
    free(buf);
    fprintf(stderr, "fuzz: %d of 3000 edited files loaded\n", loaded);
}

/* A tokenizer.json that is not UTF-8 is refused (a fuzzer found a token
 * with a stray byte loading and decoding to invalid text). */
static void test_not_utf8(void) {
    const char bad[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                       " \"added_tokens\": [{\"id\": 1, \"content\": \"x\xab\", \"special\": true}]}";
    loom_tok *t = NULL;
    CHECK(loom_tok_load_mem(bad, sizeof bad - 1, NULL, 0, &t) == LOOM_ERR_FORMAT && t == NULL);
    CHECK(strstr(loom_last_error(), "UTF-8") != NULL);
}

int main(void) {
    test_not_utf8();
    const char *b = getenv("LOOM_BUILD");
    snprintf(fixdir, sizeof fixdir, "%s/fixtures/tokenizers", b && *b ? b : "build");
    test_small();
    test_malformed();
    test_metaspace();
    test_fuzz();
    for (size_t i = 0; i < LOOM_ARRAY_LEN(names); i++) test_fixture(names[i]);
    return test_report("test_tokenizer");
}
