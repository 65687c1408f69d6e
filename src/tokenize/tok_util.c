/* tokenize utilities: growable buffers, UTF-8 handling, the character
 * classes the reference library uses, the string->id hash map and the
 * byte-level alphabet. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenize/tok_internal.h"

/* ---- buffers ------------------------------------------------------------- */

int tk_buf_reserve(tk_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tk_buf_put(tk_buf *b, const void *s, size_t n) {
    if (tk_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int tk_buf_putc(tk_buf *b, int c) {
    char ch = (char)c;
    return tk_buf_put(b, &ch, 1);
}

int tk_buf_put_cp(tk_buf *b, uint32_t cp) {
    uint8_t u[4];
    utf8proc_ssize_t n = utf8proc_encode_char((utf8proc_int32_t)cp, u);
    return tk_buf_put(b, u, (size_t)n);
}

void tk_buf_free(tk_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int tk_ids_push(tk_ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

int tk_pieces_add(tk_pieces *l, const char *s, size_t n, int32_t id,
                  int origin) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        tk_piece *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    size_t off = l->text.n;
    if (tk_buf_put(&l->text, s, n)) return -1;
    l->v[l->n++] = (tk_piece){.off = off, .len = n, .id = id, .origin = origin};
    return 0;
}

void tk_pieces_free(tk_pieces *l) {
    tk_buf_free(&l->text);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* ---- UTF-8 ---------------------------------------------------------------- */

/* Length of the well-formed sequence lead byte b starts, and the allowed
 * range of the second byte (Unicode table 3-7); 0 for a byte that cannot
 * start one. */
static int utf8_lead(uint8_t b, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b == 0xE0) { *lo = 0xA0; return 3; }
    if (b >= 0xE1 && b <= 0xEC) return 3;
    if (b == 0xED) { *hi = 0x9F; return 3; }
    if (b >= 0xEE && b <= 0xEF) return 3;
    if (b == 0xF0) { *lo = 0x90; return 4; }
    if (b >= 0xF1 && b <= 0xF3) return 4;
    if (b == 0xF4) { *hi = 0x8F; return 4; }
    return 0;
}

/* Examines the sequence at s[0..n). Returns its length if well-formed (>0);
 * otherwise -k where k is the length of the maximal ill-formed subpart, and
 * sets *truncated when the subpart is a valid prefix cut by the end. */
static int utf8_seq(const uint8_t *s, size_t n, int *truncated) {
    uint8_t lo, hi;
    *truncated = 0;
    int len = utf8_lead(s[0], &lo, &hi);
    if (len == 0) return -1;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) {
            *truncated = 1;
            return -i;
        }
        uint8_t a = i == 1 ? lo : 0x80, z = i == 1 ? hi : 0xBF;
        if (s[i] < a || s[i] > z) return -i;
    }
    return len;
}

int tk_utf8_next(const char *s, size_t n, uint32_t *cp) {
    const uint8_t *u = (const uint8_t *)s;
    int tr;
    int len = utf8_seq(u, n, &tr);
    if (len <= 0) {
        *cp = 0xFFFD;
        return 1;
    }
    switch (len) {
    case 1: *cp = u[0]; break;
    case 2: *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F); break;
    case 3:
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) |
              (u[2] & 0x3F);
        break;
    default:
        *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
              ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    }
    return len;
}

int tk_utf8_valid(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int tr;
        int len = utf8_seq(u + i, n - i, &tr);
        if (len <= 0) return 0;
        i += (size_t)len;
    }
    return 1;
}

size_t tk_utf8_incomplete_tail(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int tr;
        int len = utf8_seq(u + i, n - i, &tr);
        if (len > 0) { i += (size_t)len; continue; }
        if (tr) return n - i;
        i += (size_t)(-len);
    }
    return 0;
}

int tk_utf8_lossy(tk_buf *out, const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, run = 0;
    if (tk_buf_reserve(out, n)) return -1;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int tr;
        int len = utf8_seq(u + i, n - i, &tr);
        if (len > 0) { i += (size_t)len; continue; }
        if (tk_buf_put(out, s + run, i - run)) return -1;
        if (tk_buf_put(out, "\xEF\xBF\xBD", 3)) return -1;
        i += (size_t)(-len);
        run = i;
    }
    return tk_buf_put(out, s + run, n - run);
}

/* ---- character classes ------------------------------------------------------ */

int tk_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int tk_is_alnum_word(uint32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
               (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

int tk_is_numeric(uint32_t c) {
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
        return 1;
    default:
        return 0;
    }
}

int tk_is_punct(uint32_t c) {
    if (c < 0x80)
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
               (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        return 1;
    default:
        return 0;
    }
}

/* ---- string -> id map -------------------------------------------------------- */

uint32_t tk_hash(const char *s, size_t n) {
    /* FNV-1a; the keys are short token strings. */
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 16777619u;
    }
    return h;
}

int tk_strmap_init(tk_strmap *m, size_t n_keys) {
    size_t cap = 16;
    while (cap < n_keys * 2) cap *= 2;
    m->hash = malloc(cap * sizeof *m->hash);
    m->id = malloc(cap * sizeof *m->id);
    m->cap = cap;
    if (!m->hash || !m->id) return -1;
    memset(m->id, 0xff, cap * sizeof *m->id);
    return 0;
}

static int key_eq(const tk_strtab *tab, int32_t id, const char *s, size_t n) {
    return tab->len[id] == n && memcmp(tab->s[id], s, n) == 0;
}

void tk_strmap_put(tk_strmap *m, const tk_strtab *tab, const char *s,
                   size_t n, int32_t id) {
    uint32_t h = tk_hash(s, n);
    size_t mask = m->cap - 1, i = h & mask;
    while (m->id[i] >= 0) {
        if (m->hash[i] == h && key_eq(tab, m->id[i], s, n)) break;
        i = (i + 1) & mask;
    }
    m->hash[i] = h;
    m->id[i] = id;
}

int32_t tk_strmap_get(const tk_strmap *m, const tk_strtab *tab, const char *s,
                      size_t n) {
    if (!m->cap) return -1;
    uint32_t h = tk_hash(s, n);
    size_t mask = m->cap - 1, i = h & mask;
    while (m->id[i] >= 0) {
        if (m->hash[i] == h && key_eq(tab, m->id[i], s, n)) return m->id[i];
        i = (i + 1) & mask;
    }
    return -1;
}

void tk_strmap_free(tk_strmap *m) {
    free(m->hash);
    free(m->id);
    memset(m, 0, sizeof *m);
}

/* ---- byte-level alphabet ------------------------------------------------------ */

/* GPT-2 maps the printable bytes (33..126, 161..172, 174..255) to themselves
 * and the rest, in byte order, to 256, 257, ... */
uint32_t tk_byte_to_cp(uint8_t b) {
    if (b <= 32) return 256u + b;
    if (b >= 127 && b <= 160) return 289u + (b - 127u);
    if (b == 173) return 323;
    return b;
}

int tk_cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) ||
        (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)(cp - 256);
    if (cp >= 289 && cp <= 322) return (int)(cp - 289 + 127);
    if (cp == 323) return 173;
    return -1;
}

/* ---- small shared helpers ------------------------------------------------------ */

loom_status tk_nomem(void) {
    return loom_err(LOOM_ERR_NOMEM, "tokenizer: out of memory");
}

const char *tk_jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int tk_jbool(const cJSON *o, const char *k, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

int tk_jint(const cJSON *o, const char *k, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valueint : dflt;
}

char *tk_dup_str(const char *s, size_t *len) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    if (len) *len = n;
    return d;
}

uint32_t tk_first_cp(const char *s, uint32_t dflt) {
    if (!s || !*s) return dflt;
    uint32_t cp;
    tk_utf8_next(s, strlen(s), &cp);
    return cp;
}
