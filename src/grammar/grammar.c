/* grammar: the rule representation, the GBNF parser and the matcher.
 *
 * Design notes.
 *  1. The compiled grammar is one flat array `el` of elements: >= 0 a byte
 *     set id, < 0 a rule reference -(rule + 1), EL_END closing an
 *     alternative. A rule is a list of alternative start offsets. Element
 *     positions (indexes into `el`) are what stacks hold.
 *  2. A stack node is (pos, parent): pos is the byte set to match next,
 *     parent the node to continue with once pos's rule is done (-1: the
 *     root). Nodes are hash-consed, so equal stacks have equal ids. A
 *     continuation that is EL_END is never pushed (tail calls), so right
 *     recursion (x*) keeps stacks flat.
 *  3. A state is a sorted set of node ids plus a `done` bit (the root rule
 *     may end here), interned: state 0 is the dead state. Moving on a byte
 *     is memoised per (state, byte), and each state keeps its set of
 *     possible next bytes, so walking the token trie is a walk of a lazily
 *     built DFA.
 *  4. Rules are never left-recursive (checked at compile): expanding a
 *     position then always ends, at byte sets or at the end of the root.
 *  5. Caches only grow while the grammar lives, except token masks, which
 *     are bounded (MASK_CACHE_BYTES) and replaced when full.
 *  6. Text tokens. Most tokens are "text": code points none of which is a
 *     control, '"' or '\\' (the JSON string's plain characters), the last
 *     one possibly cut by the token's end (byte-level vocabularies split
 *     characters; the grammar only matches whole UTF-8, so a cut one is
 *     alive exactly where a whole one is). The vocabulary keeps, per
 *     k <= TEXT_MAX, the bitset of text tokens of at most k code points,
 *     and a trie of every other token as (its text prefix's length p, the
 *     bytes after that prefix). A state is uniform when every text code
 *     point leads it to one same state (its `uni`): read off its stacks
 *     when they sit at the start of a text rule (class_el's rule for
 *     exactly these code points) or take no byte a text code point begins
 *     with, else checked over all UTF-8 byte ranges; inside a JSON string
 *     every state is. Then with chain[k] the state after k text code
 *     points, the text tokens allowed are those of at most `reach` code
 *     points (one copy of a bitset), and each other token's rest is walked
 *     from chain[p]: a string's mask, bounded or not, visits only the
 *     rests (a few thousand nodes), never the whole vocabulary.
 *  7. Class indexes. Elsewhere (formats, patterns, numbers, keys) a state's
 *     stacks often take a class C of ASCII bytes wholly or not at all (an
 *     email's [a-zA-Z0-9_+-]): every byte of C then leads to one state, and
 *     the successor over C is one step. The vocabulary keeps, per class a
 *     grammar has asked for (at most MAX_FULL, built on first use under
 *     its lock, shared by every grammar over it), the trie cut into
 *     segments at the ASCII bytes not in C: each segment's tokens made of
 *     C's bytes after its first byte, by length, and its exits by (depth,
 *     byte). A mask copies the root's bitset of C-tokens no longer than
 *     the chain of C-successors stays alive, then walks only the exits the
 *     state can take at their depth. A segment whose chain meets a state
 *     not uniform over C is walked plainly (exact either way). */
#include "grammar/grammar.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "grammar/grammar_int.h"
#include "tokenize/tokenizer.h"

#define EL_END INT32_MIN
#define MAX_RULES 200000
#define MASK_CACHE_BYTES (32u << 20)
#define TEXT_MAX 24
#define CLASS_MIN 8     /* a state's byte class worth an index (design note 7) */
#define MAX_CLASSES 64 /* classes a vocabulary keeps (most of few tokens: a count) */
#define MAX_FULL 16    /* of which full indexes (a few MB each) */
#define CLASS_MIN_TOKENS 2048 /* tokens of the class an index must hold to be used (fewer in a small vocabulary) */
#define MAX_SEGMENTS 65536    /* an index cut finer than this is not kept (a plain walk is as quick) */
#define REST_P 254 /* longer text prefixes are walked byte by byte from the 254th */

/* ---- small vectors ---------------------------------------------------- */

typedef struct ivec {
    int32_t *v;
    int n, cap;
} ivec;

static int iv_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 8;
        int32_t *nv = realloc(a->v, sizeof *nv * (size_t)cap);
        if (!nv) return -1;
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* ---- builder ------------------------------------------------------------ */

typedef struct brule {
    char *name;       /* owned; NULL for a generated rule */
    ivec *alts;       /* owned [n_alts] */
    int n_alts, cap_alts;
    int defined;      /* a named rule: its definition was seen */
    long ref_at;      /* 1 + the text offset it was first referenced at, for errors */
    int text;         /* made by class_el for exactly the text code points (design note 6) */
    size_t name_len;
    uint64_t name_hash;
} brule;

typedef uint8_t bset[32];

typedef struct builder {
    brule *rules;
    int n_rules, cap_rules;
    bset *sets;
    int n_sets, cap_sets;
    int32_t byte_set[256]; /* single-byte set ids, -1 none yet */
    int32_t *set_ix;       /* [cap_set_ix] open addressing: set id + 1, 0 empty */
    size_t cap_set_ix;
    int32_t *names;        /* [cap_names] open addressing: rule id + 1, 0 empty */
    size_t cap_names;
    char *err;
    size_t err_cap;
    int failed;
} builder;

static int bfail(builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bfail(builder *b, const char *fmt, ...) {
    if (b->failed) return -1;
    b->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    if (b->err && b->err_cap) vsnprintf(b->err, b->err_cap, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

/* Adds rule r (named) to the name table, doubling it when half full. */
static int name_put(builder *b, int r) {
    if ((size_t)(b->n_rules + 1) * 2 > b->cap_names) {
        size_t cap = b->cap_names ? b->cap_names * 2 : 256;
        int32_t *nt = calloc(cap, sizeof *nt);
        if (!nt) return -1;
        for (size_t i = 0; i < b->cap_names; i++) {
            if (!b->names[i]) continue;
            size_t j = b->rules[b->names[i] - 1].name_hash & (cap - 1);
            while (nt[j]) j = (j + 1) & (cap - 1);
            nt[j] = b->names[i];
        }
        free(b->names);
        b->names = nt;
        b->cap_names = cap;
    }
    size_t j = b->rules[r].name_hash & (b->cap_names - 1);
    while (b->names[j]) j = (j + 1) & (b->cap_names - 1);
    b->names[j] = r + 1;
    return 0;
}

static int new_rule(builder *b, const char *name, size_t len) {
    if (b->n_rules >= MAX_RULES) return bfail(b, "grammar: more than %d rules", MAX_RULES);
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? b->cap_rules * 2 : 64;
        brule *nr = realloc(b->rules, sizeof *nr * (size_t)cap);
        if (!nr) return bfail(b, "out of memory");
        b->rules = nr;
        b->cap_rules = cap;
    }
    brule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = malloc(len + 1);
        if (!r->name) return bfail(b, "out of memory");
        memcpy(r->name, name, len);
        r->name[len] = 0;
        r->name_len = len;
        r->name_hash = name_hash(name, len);
        if (name_put(b, b->n_rules)) return bfail(b, "out of memory");
    }
    return b->n_rules++;
}

/* Opens a new alternative of rule r; returns it. */
static ivec *new_alt(builder *b, int r) {
    brule *R = &b->rules[r];
    if (R->n_alts == R->cap_alts) {
        int cap = R->cap_alts ? R->cap_alts * 2 : 4;
        ivec *na = realloc(R->alts, sizeof *na * (size_t)cap);
        if (!na) return bfail(b, "out of memory"), NULL;
        R->alts = na;
        R->cap_alts = cap;
    }
    ivec *a = &R->alts[R->n_alts++];
    memset(a, 0, sizeof *a);
    return a;
}

static int find_rule(builder *b, const char *name, size_t len) {
    if (!b->cap_names) return -1;
    uint64_t h = name_hash(name, len);
    for (size_t j = h & (b->cap_names - 1); b->names[j]; j = (j + 1) & (b->cap_names - 1)) {
        const brule *r = &b->rules[b->names[j] - 1];
        if (r->name_hash == h && r->name_len == len && !memcmp(r->name, name, len)) return b->names[j] - 1;
    }
    return -1;
}

/* Adds set id k to the set index, doubling it when half full. A pattern
 * with a length bound writes thousands of rules over a few hundred
 * classes: a linear search of the sets was most of their compile. */
static int set_ix_put(builder *b, int k) {
    if ((size_t)(b->n_sets + 1) * 2 > b->cap_set_ix) {
        size_t cap = b->cap_set_ix ? b->cap_set_ix * 2 : 256;
        int32_t *nt = calloc(cap, sizeof *nt);
        if (!nt) return -1;
        for (int i = 0; i < k; i++) {
            size_t j = name_hash((const char *)b->sets[i], sizeof(bset)) & (cap - 1);
            while (nt[j]) j = (j + 1) & (cap - 1);
            nt[j] = i + 1;
        }
        free(b->set_ix);
        b->set_ix = nt, b->cap_set_ix = cap;
    }
    size_t j = name_hash((const char *)b->sets[k], sizeof(bset)) & (b->cap_set_ix - 1);
    while (b->set_ix[j]) j = (j + 1) & (b->cap_set_ix - 1);
    b->set_ix[j] = k + 1;
    return 0;
}

static int32_t intern_set(builder *b, const bset s) {
    int single = -1, count = 0;
    for (int w = 0; w < 4; w++) {
        uint64_t x;
        memcpy(&x, s + 8 * w, 8);
        if (x && !count) single = 64 * w + __builtin_ctzll(x); /* little-endian: bit c of byte c >> 3 */
        count += __builtin_popcountll(x);
    }
    if (count == 1 && b->byte_set[single] >= 0) return b->byte_set[single];
    if (count != 1 && b->cap_set_ix)
        for (size_t j = name_hash((const char *)s, sizeof(bset)) & (b->cap_set_ix - 1); b->set_ix[j];
             j = (j + 1) & (b->cap_set_ix - 1))
            if (!memcmp(b->sets[b->set_ix[j] - 1], s, sizeof(bset))) return b->set_ix[j] - 1;
    if (b->n_sets == b->cap_sets) {
        int cap = b->cap_sets ? b->cap_sets * 2 : 64;
        bset *ns = realloc(b->sets, sizeof *ns * (size_t)cap);
        if (!ns) return bfail(b, "out of memory");
        b->sets = ns;
        b->cap_sets = cap;
    }
    memcpy(b->sets[b->n_sets], s, sizeof(bset));
    if (count == 1) b->byte_set[single] = b->n_sets;
    else if (set_ix_put(b, b->n_sets)) return bfail(b, "out of memory");
    return b->n_sets++;
}

static int32_t byte_el(builder *b, int c) {
    bset s = {0};
    s[c >> 3] = (uint8_t)(1u << (c & 7));
    return intern_set(b, s);
}

static int32_t range_el(builder *b, int lo, int hi) {
    bset s = {0};
    for (int c = lo; c <= hi; c++) s[c >> 3] |= (uint8_t)(1u << (c & 7));
    return intern_set(b, s);
}

static int32_t ref_el(int r) { return -(r + 1); }

/* ---- code point classes -> UTF-8 byte sequences ------------------------- */

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

static int utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

static int utf8_enc(uint32_t c, uint8_t *o) {
    if (c < 0x80) return o[0] = (uint8_t)c, 1;
    if (c < 0x800) return o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63)), 2;
    if (c < 0x10000)
        return o[0] = (uint8_t)(0xE0 | c >> 12), o[1] = (uint8_t)(0x80 | (c >> 6 & 63)),
               o[2] = (uint8_t)(0x80 | (c & 63)), 3;
    return o[0] = (uint8_t)(0xF0 | c >> 18), o[1] = (uint8_t)(0x80 | (c >> 12 & 63)),
           o[2] = (uint8_t)(0x80 | (c >> 6 & 63)), o[3] = (uint8_t)(0x80 | (c & 63)), 4;
}

/* Adds alternatives to rule r matching the UTF-8 of code points [lo, hi]
 * (same encoded length, no surrogates), split until every byte position is
 * one byte range (the usual UTF-8 range splitting). */
static int utf8_range_alts(builder *b, int r, uint32_t lo, uint32_t hi) {
    int n = utf8_len(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) return utf8_range_alts(b, r, lo, lo | m) || utf8_range_alts(b, r, (lo | m) + 1, hi);
            if ((hi & m) != m) return utf8_range_alts(b, r, lo, (hi & ~m) - 1) || utf8_range_alts(b, r, hi & ~m, hi);
        }
    }
    uint8_t a[4], z[4];
    utf8_enc(lo, a);
    utf8_enc(hi, z);
    ivec *alt = new_alt(b, r);
    if (!alt) return -1;
    for (int k = 0; k < n; k++)
        if (iv_push(alt, range_el(b, a[k], z[k]))) return bfail(b, "out of memory");
    return b->failed ? -1 : 0;
}

/* Sorts and merges ranges in place; returns the new count. */
static int cmp_range(const void *x, const void *y) {
    const cprange *a = x, *c = y;
    return a->lo < c->lo ? -1 : a->lo > c->lo;
}

static int norm_ranges(cprange *r, int n) {
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    int w = 0;
    for (int i = 0; i < n; i++) {
        if (w && r[i].lo <= r[w - 1].hi + 1) {
            if (r[i].hi > r[w - 1].hi) r[w - 1].hi = r[i].hi;
        } else r[w++] = r[i];
    }
    return w;
}

/* The element matching one code point of the set (sorted, merged): a byte
 * set when it is ASCII only, else a new rule. */
static int32_t class_el(builder *b, cprange *r, int n) {
    bset ascii = {0};
    int any_ascii = 0, wide = 0;
    for (int i = 0; i < n; i++) {
        for (uint32_t c = r[i].lo; c <= r[i].hi && c < 0x80; c++) ascii[c >> 3] |= (uint8_t)(1u << (c & 7)), any_ascii = 1;
        wide |= r[i].hi >= 0x80;
    }
    if (!wide) {
        if (!any_ascii) return bfail(b, "grammar: an empty character class");
        return intern_set(b, ascii);
    }
    int rule = new_rule(b, NULL, 0);
    if (rule < 0) return -1;
    b->rules[rule].text = n == 3 && r[0].lo == 0x20 && r[0].hi == '"' - 1 && r[1].lo == '"' + 1 &&
                          r[1].hi == '\\' - 1 && r[2].lo == '\\' + 1 && r[2].hi == 0x10FFFF;
    if (any_ascii) {
        ivec *a = new_alt(b, rule);
        if (!a || iv_push(a, intern_set(b, ascii))) return bfail(b, "out of memory");
    }
    static const uint32_t bounds[][2] = {{0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            uint32_t lo = LOOM_MAX(r[i].lo, bounds[k][0]), hi = LOOM_MIN(r[i].hi, bounds[k][1]);
            if (lo <= hi && utf8_range_alts(b, rule, lo, hi)) return -1;
        }
    return b->failed ? -1 : ref_el(rule);
}

/* ---- GBNF parser ---------------------------------------------------------- */

typedef struct gparse {
    builder *b;
    const char *s, *p;
    int depth;
} gparse;

static int line_of(const gparse *g, const char *at) {
    int line = 1;
    for (const char *q = g->s; q < at; q++) line += *q == '\n';
    return line;
}

static int perr(gparse *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(gparse *g, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char near[24];
    int k = 0;
    for (const char *q = g->p; *q && *q != '\n' && k < 20; q++) near[k++] = *q;
    near[k] = 0;
    return bfail(g->b, "grammar line %d: %s, found %s%s%s", line_of(g, g->p), msg, *g->p ? "'" : "",
                 *g->p ? near : "the end", *g->p ? "'" : "");
}

static void skip_space(gparse *g) {
    for (;;) {
        while (*g->p == ' ' || *g->p == '\t' || *g->p == '\n' || *g->p == '\r') g->p++;
        if (*g->p != '#') return;
        while (*g->p && *g->p != '\n') g->p++;
    }
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static size_t name_len(const char *p) {
    size_t n = 0;
    while (is_name_char(p[n])) n++;
    return n;
}

/* At the start of the next rule: `name ::=`. */
static int at_rule_start(const gparse *g) {
    size_t n = name_len(g->p);
    if (!n) return 0;
    const char *q = g->p + n;
    while (*q == ' ' || *q == '\t') q++;
    return q[0] == ':' && q[1] == ':' && q[2] == '=';
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class: an escape or a UTF-8 code point. */
static int read_char(gparse *g, uint32_t *cp) {
    const char *p = g->p;
    if (!*p) return perr(g, "expected a character");
    if (*p == '\\') {
        p++;
        int n = 0;
        switch (*p) {
        case 'n': *cp = '\n'; break;
        case 't': *cp = '\t'; break;
        case 'r': *cp = '\r'; break;
        case 'f': *cp = '\f'; break;
        case 'v': *cp = '\v'; break;
        case '0': *cp = 0; break;
        case 'x': n = 2; break;
        case 'u': n = 4; break;
        case 'U': n = 8; break;
        case 0: return perr(g, "expected an escaped character");
        default: *cp = (unsigned char)*p;
        }
        p++;
        if (n) {
            uint32_t v = 0;
            for (int i = 0; i < n; i++, p++) {
                int h = hexval(*p);
                if (h < 0) return g->p = p, perr(g, "expected %d hex digits", n);
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF) return perr(g, "code point above U+10FFFF");
            *cp = v;
        }
        g->p = p;
        return 0;
    }
    uint8_t c = (uint8_t)*p;
    int n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (!n) return perr(g, "expected UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? c & 31 : n == 3 ? c & 15 : c & 7;
    for (int i = 1; i < n; i++) {
        if (((uint8_t)p[i] & 0xC0) != 0x80) return perr(g, "expected UTF-8");
        v = v << 6 | ((uint8_t)p[i] & 63);
    }
    *cp = v;
    g->p = p + n;
    return 0;
}

static int parse_alternatives(gparse *g, int rule);

/* Appends the bytes of code point cp as elements. */
static int push_cp(builder *b, ivec *seq, uint32_t cp) {
    uint8_t u[4];
    int n = utf8_enc(cp, u);
    for (int i = 0; i < n; i++)
        if (iv_push(seq, byte_el(b, u[i]))) return bfail(b, "out of memory");
    return b->failed ? -1 : 0;
}

static int parse_class(gparse *g, ivec *seq) {
    g->p++; /* [ */
    int neg = *g->p == '^';
    if (neg) g->p++;
    cprange r[512];
    int n = 0;
    while (*g->p != ']') {
        if (!*g->p) return perr(g, "expected ']' closing the character class");
        if (n == (int)(sizeof r / sizeof *r)) return perr(g, "more than 512 ranges in one class");
        uint32_t lo, hi;
        if (read_char(g, &lo)) return -1;
        hi = lo;
        if (g->p[0] == '-' && g->p[1] != ']' && g->p[1]) {
            g->p++;
            if (read_char(g, &hi)) return -1;
            if (hi < lo) return perr(g, "a class range ends below its start");
        }
        r[n++] = (cprange){lo, hi};
    }
    g->p++;
    n = norm_ranges(r, n);
    if (neg) {
        cprange c[513];
        int m = 0;
        uint32_t next = 0;
        for (int i = 0; i < n; i++) {
            if (r[i].lo > next) c[m++] = (cprange){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= 0x10FFFF) c[m++] = (cprange){next, 0x10FFFF};
        memcpy(r, c, sizeof *c * (size_t)LOOM_MIN(m, 512));
        n = LOOM_MIN(m, 512);
    }
    int32_t e = class_el(g->b, r, n);
    if (g->b->failed) return -1;
    return iv_push(seq, e) ? bfail(g->b, "out of memory") : 0;
}

/* The elements seq[from..] repeated min..max times (max -1: unbounded). */
static int repeat(builder *b, ivec *seq, int from, int min, int max) {
    int n = seq->n - from;
    int32_t item;
    if (n == 1) item = seq->v[from];
    else {
        int r = new_rule(b, NULL, 0);
        ivec *a = r < 0 ? NULL : new_alt(b, r);
        if (!a) return -1;
        for (int i = 0; i < n; i++)
            if (iv_push(a, seq->v[from + i])) return bfail(b, "out of memory");
        item = ref_el(r);
    }
    seq->n = from;
    for (int i = 0; i < min; i++)
        if (iv_push(seq, item)) return bfail(b, "out of memory");
    if (max == min) return 0;
    int tail;
    if (max < 0) { /* R ::= item R | () */
        tail = new_rule(b, NULL, 0);
        ivec *a = tail < 0 ? NULL : new_alt(b, tail);
        if (!a || iv_push(a, item) || iv_push(a, ref_el(tail)) || !new_alt(b, tail)) return bfail(b, "out of memory");
    } else { /* O_k ::= item O_{k-1} | () */
        tail = -1;
        for (int k = 0; k < max - min; k++) {
            int r = new_rule(b, NULL, 0);
            ivec *a = r < 0 ? NULL : new_alt(b, r);
            if (!a || iv_push(a, item) || (tail >= 0 && iv_push(a, ref_el(tail))) || !new_alt(b, r))
                return bfail(b, "out of memory");
            tail = r;
        }
    }
    return iv_push(seq, ref_el(tail)) ? bfail(b, "out of memory") : 0;
}

static int parse_sequence(gparse *g, ivec *seq) {
    for (;;) {
        skip_space(g);
        char c = *g->p;
        if (!c || c == '|' || c == ')' || (g->depth == 0 && at_rule_start(g))) return 0;
        int from = seq->n;
        if (c == '"') {
            g->p++;
            while (*g->p != '"') {
                if (!*g->p) return perr(g, "expected '\"' closing the literal");
                uint32_t cp;
                if (read_char(g, &cp) || push_cp(g->b, seq, cp)) return -1;
            }
            g->p++;
        } else if (c == '[') {
            if (parse_class(g, seq)) return -1;
        } else if (c == '.') {
            g->p++;
            cprange all = {0, 0x10FFFF};
            int32_t e = class_el(g->b, &all, 1);
            if (g->b->failed || iv_push(seq, e)) return bfail(g->b, "out of memory");
        } else if (c == '(') {
            g->p++;
            int r = new_rule(g->b, NULL, 0);
            if (r < 0) return -1;
            g->depth++;
            if (parse_alternatives(g, r)) return -1;
            g->depth--;
            if (*g->p != ')') return perr(g, "expected ')'");
            g->p++;
            if (iv_push(seq, ref_el(r))) return bfail(g->b, "out of memory");
        } else if (is_name_char(c)) {
            size_t n = name_len(g->p);
            int r = find_rule(g->b, g->p, n);
            if (r < 0 && (r = new_rule(g->b, g->p, n)) < 0) return -1;
            if (!g->b->rules[r].ref_at) g->b->rules[r].ref_at = 1 + (long)(g->p - g->s);
            g->p += n;
            if (iv_push(seq, ref_el(r))) return bfail(g->b, "out of memory");
        } else {
            return perr(g, "expected a literal, a class, a rule name or '('");
        }
        /* a postfix operator applies to what was just parsed */
        c = *g->p;
        int min = -2, max = -1;
        if (c == '*') min = 0;
        else if (c == '+') min = 1;
        else if (c == '?') min = 0, max = 1;
        if (min >= 0) g->p++;
        else if (c == '{') {
            char msg[64];
            g->p++;
            const char *e = loom_grammar_braces(&g->p, &min, &max, msg, sizeof msg);
            if (e) return perr(g, "%s", e);
        }
        if (min >= 0 && seq->n > from && repeat(g->b, seq, from, min, max)) return -1;
    }
}

static int parse_alternatives(gparse *g, int rule) {
    for (;;) {
        ivec *a = new_alt(g->b, rule);
        if (!a) return -1;
        /* a may move as rules are added: parse into a local vector */
        ivec seq = {0};
        int rc = parse_sequence(g, &seq);
        g->b->rules[rule].alts[g->b->rules[rule].n_alts - 1] = seq;
        if (rc) return -1;
        skip_space(g);
        if (*g->p != '|') return 0;
        g->p++;
    }
}

static int parse_gbnf(builder *b, const char *text) {
    gparse g = {.b = b, .s = text, .p = text};
    skip_space(&g);
    if (!*g.p) return perr(&g, "expected a rule (name ::= ...)");
    while (*g.p) {
        size_t n = name_len(g.p);
        if (!n || !at_rule_start(&g)) return perr(&g, "expected a rule (name ::= ...)");
        int r = find_rule(b, g.p, n);
        if (r < 0 && (r = new_rule(b, g.p, n)) < 0) return -1;
        if (b->rules[r].defined) return perr(&g, "rule '%s' is defined twice", b->rules[r].name);
        b->rules[r].defined = 1;
        g.p = strstr(g.p, "::=") + 3;
        if (parse_alternatives(&g, r)) return -1;
        if (*g.p == ')') return perr(&g, "unbalanced ')'");
        skip_space(&g);
    }
    for (int i = 0; i < b->n_rules; i++)
        if (b->rules[i].name && !b->rules[i].defined)
            return bfail(b, "grammar line %d: rule '%s' is used but not defined",
                         line_of(&g, text + b->rules[i].ref_at - 1), b->rules[i].name);
    if (find_rule(b, "root", 4) < 0) return bfail(b, "grammar: no rule named 'root'");
    return 0;
}

/* ---- compiled grammar ------------------------------------------------------ */

typedef struct hslot {
    uint64_t key;
    int32_t val;
} hslot;

/* Open-addressing map from a 64-bit key to an int32 (keys != UINT64_MAX).
 * It starts at HM_FIRST slots: a grammar's first masks make a few thousand
 * stacks and states, and each doubling is a rehash inside some mask. */
#define HM_FIRST 8192
typedef struct hmap {
    hslot *s;
    size_t cap, n;
} hmap;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static int32_t *hm_find(hmap *m, uint64_t key) {
    if (!m->cap) return NULL;
    size_t i = mix64(key) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        if (m->s[i].key == key) return &m->s[i].val;
        if (m->s[i].key == UINT64_MAX) return NULL;
    }
}

static int hm_put(hmap *m, uint64_t key, int32_t val) {
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : HM_FIRST;
        hslot *ns = malloc(sizeof *ns * cap);
        if (!ns) return -1;
        for (size_t i = 0; i < cap; i++) ns[i].key = UINT64_MAX;
        for (size_t i = 0; i < m->cap; i++) {
            if (m->s[i].key == UINT64_MAX) continue;
            size_t j = mix64(m->s[i].key) & (cap - 1);
            while (ns[j].key != UINT64_MAX) j = (j + 1) & (cap - 1);
            ns[j] = m->s[i];
        }
        free(m->s);
        m->s = ns;
        m->cap = cap;
    }
    size_t i = mix64(key) & (m->cap - 1);
    while (m->s[i].key != UINT64_MAX && m->s[i].key != key) i = (i + 1) & (m->cap - 1);
    if (m->s[i].key == UINT64_MAX) m->n++;
    m->s[i] = (hslot){key, val};
    return 0;
}

typedef struct gnode {
    int32_t pos, parent;
} gnode;

typedef struct gstate {
    uint32_t off;       /* into st_nodes */
    int32_t n;
    int32_t done;
    uint32_t mask_slot; /* 1 + index into masks, 0 = none */
    int32_t uni;        /* design note 6: the state after any text code point,
                           0 dead, -1 not uniform, -2 not yet known */
    bset next;          /* bytes some stack can take */
    int32_t cls_id;     /* design note 7: 1 + the class cls_next is for, 0 none */
    int32_t cls_next;   /* the state after any byte of it, -1 not uniform */
    int32_t best;       /* the index its mask goes through: 1 + its id, -1 none, 0 not yet known */
} gstate;

struct loom_gvocab {
    int n_vocab;
    /* trie in preorder: node i's subtree is [i, end[i]); node 0 is the root */
    uint8_t *byte;      /* [n_nodes] */
    int32_t *end;       /* [n_nodes] */
    int32_t *tok_off;   /* [n_nodes + 1] into toks */
    int32_t *toks;      /* token ids ending at each node */
    int n_nodes;
    char **bytes;       /* [n_vocab] owned copies, NULL for none */
    int *lens;          /* [n_vocab] */
    /* design note 6; both NULL in the vocabulary of the rests */
    uint32_t *text;     /* [TEXT_MAX + 1][words]: text tokens of <= k code points */
    int32_t *text_count;/* [TEXT_MAX + 1] */
    /* every other token as its text prefix's length in code points (one
       byte, at most REST_P) then its bytes after that prefix: after a
       state whose uniform successors are known, a token's fate is that of
       its rest from the successor its prefix leads to */
    struct loom_gvocab *rest;  /* owned */
    int max_len;               /* the longest token's bytes */
    /* design note 7: class indexes, built as grammars need them and kept
       for every grammar over this vocabulary (the lock guards them) */
    pthread_mutex_t lock;
    struct cindex *cls[MAX_CLASSES]; /* owned [n_cls] */
    int n_cls, n_full;
};

struct loom_grammar {
    atomic_int refs;
    const loom_gvocab *vocab;   /* borrowed */
    int32_t *el;                /* [n_el] flat elements */
    int n_el;
    int32_t *alt_off;           /* [n_rules + 1] into alts */
    int32_t *alts;              /* alternative start positions */
    int n_rules, root;
    bset *sets;                 /* [n_sets] */
    int n_sets;
    /* design note 6's shortcut: text_alt[pos] is the text rule whose
       alternative starts at pos (else -1); set_text[k] is 1 when set k
       holds a byte a text code point can begin with */
    int32_t *text_alt;          /* [n_el + 2] */
    uint8_t *set_text;          /* [n_sets] */
    /* stacks and states (design notes 2, 3) */
    gnode *nodes;
    int n_nodes, cap_nodes;
    hmap node_map;              /* (pos, parent) -> node id */
    gstate *states;
    int n_states, cap_states;
    int32_t *st_nodes;          /* node ids of all states */
    uint32_t n_st_nodes, cap_st_nodes;
    hmap state_map;             /* hash of a state's content -> first state id (chained below) */
    int32_t *state_next;        /* [cap_states] next state with the same hash, -1 */
    int32_t **trans;            /* [cap_states] owned rows [n_bcls] of next states by
                                   byte class (-1: not yet known), made at a state's first step */
    int32_t start;              /* the state before any byte */
    /* bytes no byte set tells apart move every state alike: transitions
       are kept per class */
    uint8_t bcls[256];          /* each byte's class */
    int n_bcls;
    /* token masks (design note 5) */
    uint32_t **masks;           /* [n_masks] owned, each [mask_words] */
    int32_t *mask_owner;        /* [n_masks] state holding each */
    int n_masks, max_masks, mask_words, next_victim;
    /* scratch */
    ivec scratch;
    int oom;
};

static void builder_free(builder *b) {
    for (int i = 0; i < b->n_rules; i++) {
        for (int k = 0; k < b->rules[i].n_alts; k++) free(b->rules[i].alts[k].v);
        free(b->rules[i].alts);
        free(b->rules[i].name);
    }
    free(b->rules);
    free(b->sets), free(b->set_ix);
    free(b->names);
}

/* Nullable rules, then a search for a rule reachable from itself through
 * leftmost positions (each step past only nullable elements). */
static int check_left_recursion(builder *b) {
    int n = b->n_rules;
    uint8_t *nullable = calloc((size_t)n, 1), *state = calloc((size_t)n, 1);
    int32_t *stack = malloc(sizeof *stack * (size_t)n * 2);
    if (!nullable || !state || !stack) {
        free(nullable), free(state), free(stack);
        return bfail(b, "out of memory");
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (int a = 0; a < b->rules[r].n_alts && !nullable[r]; a++) {
                const ivec *alt = &b->rules[r].alts[a];
                int all = 1;
                for (int k = 0; k < alt->n && all; k++) all = alt->v[k] < 0 && nullable[-alt->v[k] - 1];
                if (all) nullable[r] = 1, changed = 1;
            }
        }
    }
    /* iterative DFS over "r may begin with rule q"; state 1 = on stack, 2 = done */
    int rc = 0;
    for (int s0 = 0; s0 < n && !rc; s0++) {
        if (state[s0]) continue;
        int sp = 0;
        stack[sp++] = s0, stack[sp++] = 0;
        state[s0] = 1;
        while (sp && !rc) {
            int r = stack[sp - 2], edge = stack[sp - 1]++;
            /* edge enumerates (alt, k) pairs flattened */
            int q = -1, seen = 0;
            for (int a = 0; a < b->rules[r].n_alts && q < 0; a++) {
                const ivec *alt = &b->rules[r].alts[a];
                for (int k = 0; k < alt->n; k++) {
                    if (alt->v[k] >= 0) break;
                    if (seen++ == edge) { q = -alt->v[k] - 1; break; }
                    if (!nullable[-alt->v[k] - 1]) break;
                }
                if (q < 0 && seen > edge) break;
            }
            if (q < 0) {
                state[r] = 2;
                sp -= 2;
            } else if (state[q] == 1) {
                const char *nm = b->rules[q].name;
                rc = bfail(b, "grammar: rule '%s' is left-recursive (it can begin with itself)", nm ? nm : "(a group)");
            } else if (!state[q]) {
                state[q] = 1;
                stack[sp++] = q, stack[sp++] = 0;
            }
        }
    }
    free(nullable), free(state), free(stack);
    return rc;
}

static void grammar_free(loom_grammar *g) {
    if (!g) return;
    free(g->el), free(g->alt_off), free(g->alts), free(g->sets), free(g->text_alt), free(g->set_text);
    free(g->nodes), free(g->node_map.s), free(g->states), free(g->st_nodes);
    free(g->state_map.s), free(g->state_next);
    for (int i = 0; i < g->n_states && g->trans; i++) free(g->trans[i]);
    free(g->trans);
    for (int i = 0; i < g->n_masks; i++) free(g->masks[i]);
    free(g->masks), free(g->mask_owner), free(g->scratch.v);
    free(g);
}

static int32_t intern_node(loom_grammar *g, int32_t pos, int32_t parent) {
    uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    int32_t *v = hm_find(&g->node_map, key);
    if (v) return *v;
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? g->cap_nodes * 2 : 4096;
        gnode *nn = realloc(g->nodes, sizeof *nn * (size_t)cap);
        if (!nn) return g->oom = 1, 0;
        g->nodes = nn;
        g->cap_nodes = cap;
    }
    g->nodes[g->n_nodes] = (gnode){pos, parent};
    if (hm_put(&g->node_map, key, g->n_nodes)) return g->oom = 1, 0;
    return g->n_nodes++;
}

/* Adds to scratch the stacks that pos (with parent below) expands to,
 * each with a byte set on top; *done when the root can end here. */
static void expand(loom_grammar *g, int32_t pos, int32_t parent, int *done) {
    for (;;) {
        int32_t e = g->el[pos];
        if (e == EL_END) {
            if (parent < 0) {
                *done = 1;
                return;
            }
            pos = g->nodes[parent].pos;
            parent = g->nodes[parent].parent;
            continue;
        }
        if (e >= 0) {
            if (iv_push(&g->scratch, intern_node(g, pos, parent))) g->oom = 1;
            return;
        }
        int r = -e - 1;
        int32_t below = g->el[pos + 1] == EL_END ? parent : intern_node(g, pos + 1, parent);
        for (int a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) expand(g, g->alts[a], below, done);
        return;
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Interns the state made of scratch's node ids (sorted here) and done. */
static int32_t intern_state(loom_grammar *g, int done) {
    ivec *sc = &g->scratch;
    if (sc->n > 16) qsort(sc->v, (size_t)sc->n, sizeof *sc->v, cmp_i32);
    else /* most states have a few stacks: no qsort call */
        for (int i = 1; i < sc->n; i++) {
            int32_t x = sc->v[i];
            int j = i;
            for (; j > 0 && sc->v[j - 1] > x; j--) sc->v[j] = sc->v[j - 1];
            sc->v[j] = x;
        }
    int w = 0;
    for (int i = 0; i < sc->n; i++)
        if (!w || sc->v[w - 1] != sc->v[i]) sc->v[w++] = sc->v[i];
    sc->n = w;
    if (!w && !done) return 0;
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)done;
    for (int i = 0; i < w; i++) h = (h ^ (uint32_t)sc->v[i]) * 1099511628211ULL;
    h &= ~(1ULL << 63); /* never UINT64_MAX */
    int32_t *first = hm_find(&g->state_map, h);
    for (int32_t s = first ? *first : -1; s >= 0; s = g->state_next[s]) {
        gstate *st = &g->states[s];
        if (st->n == w && st->done == done && !memcmp(g->st_nodes + st->off, sc->v, sizeof *sc->v * (size_t)w))
            return s;
    }
    if (g->n_states == g->cap_states) {
        int cap = g->cap_states ? g->cap_states * 2 : 256;
        gstate *ns = realloc(g->states, sizeof *ns * (size_t)cap);
        int32_t *nx = ns ? realloc(g->state_next, sizeof *nx * (size_t)cap) : NULL;
        if (ns) g->states = ns;
        if (nx) g->state_next = nx;
        int32_t **nt = nx ? realloc(g->trans, sizeof *nt * (size_t)cap) : NULL;
        if (!nt) return g->oom = 1, 0;
        g->trans = nt;
        memset(nt + g->cap_states, 0, sizeof *nt * (size_t)(cap - g->cap_states));
        g->cap_states = cap;
    }
    if (g->n_st_nodes + (uint32_t)w > g->cap_st_nodes) {
        uint32_t cap = LOOM_MAX(g->cap_st_nodes * 2, g->n_st_nodes + (uint32_t)w + 8192);
        int32_t *nn = realloc(g->st_nodes, sizeof *nn * cap);
        if (!nn) return g->oom = 1, 0;
        g->st_nodes = nn;
        g->cap_st_nodes = cap;
    }
    int32_t id = g->n_states++;
    gstate *st = &g->states[id];
    memset(st, 0, sizeof *st);
    st->off = g->n_st_nodes;
    st->n = w;
    st->done = done;
    st->uni = -2;
    if (w) memcpy(g->st_nodes + st->off, sc->v, sizeof *sc->v * (size_t)w); /* the done-only state has none */
    g->n_st_nodes += (uint32_t)w;
    for (int i = 0; i < w; i++) {
        const uint8_t *set = g->sets[g->el[g->nodes[sc->v[i]].pos]];
        for (int k = 0; k < 32; k++) st->next[k] |= set[k];
    }
    g->state_next[id] = first ? *first : -1;
    if (hm_put(&g->state_map, h, id)) g->oom = 1;
    return id;
}

/* The state after byte c from state s (0: dead), memoised. */
static int32_t step(loom_grammar *g, int32_t s, int c) {
    if (!(g->states[s].next[c >> 3] >> (c & 7) & 1)) return 0;
    if (!g->trans[s]) {
        if (!(g->trans[s] = malloc(sizeof **g->trans * (size_t)g->n_bcls))) return g->oom = 1, 0;
        memset(g->trans[s], -1, sizeof **g->trans * (size_t)g->n_bcls);
    }
    int32_t *row = g->trans[s] + g->bcls[c];
    if (*row >= 0) return *row;
    g->scratch.n = 0;
    int done = 0;
    for (int i = 0; i < g->states[s].n; i++) {
        /* st_nodes may move as states are added: index afresh each time */
        int32_t nd = g->st_nodes[g->states[s].off + (uint32_t)i];
        int32_t pos = g->nodes[nd].pos;
        if (g->sets[g->el[pos]][c >> 3] >> (c & 7) & 1) expand(g, pos + 1, g->nodes[nd].parent, &done);
    }
    int32_t t = intern_state(g, done);
    g->trans[s][g->bcls[c]] = t;
    return t;
}

/* Byte classes: partition refinement of the 256 bytes by every set. */
static void byte_classes(loom_grammar *g) {
    uint8_t cls[256] = {0};
    for (int k = 0, n = 1; k < g->n_sets && n < 256; k++) {
        int16_t id_of[512]; /* (old class, member) -> new class, first seen first */
        memset(id_of, -1, sizeof id_of);
        n = 0;
        for (int c = 0; c < 256; c++) {
            int key = cls[c] * 2 + (g->sets[k][c >> 3] >> (c & 7) & 1);
            if (id_of[key] < 0) id_of[key] = (int16_t)n++;
            cls[c] = (uint8_t)id_of[key];
        }
    }
    g->n_bcls = 0;
    for (int c = 0; c < 256; c++) {
        g->bcls[c] = cls[c];
        g->n_bcls = LOOM_MAX(g->n_bcls, cls[c] + 1);
    }
}

static loom_status finish(builder *b, const loom_gvocab *vocab, loom_grammar **out) {
    *out = NULL;
    if (b->failed || check_left_recursion(b)) return LOOM_ERR_INVALID_ARG;
    loom_grammar *g = calloc(1, sizeof *g);
    if (!g) return bfail(b, "out of memory"), LOOM_ERR_NOMEM;
    atomic_init(&g->refs, 1);
    g->vocab = vocab;
    g->n_rules = b->n_rules;
    g->root = find_rule(b, "root", 4);
    int n_alts = 0, n_el = 0;
    for (int r = 0; r < b->n_rules; r++) {
        n_alts += b->rules[r].n_alts;
        for (int a = 0; a < b->rules[r].n_alts; a++) n_el += b->rules[r].alts[a].n + 1;
    }
    g->el = malloc(sizeof *g->el * (size_t)(n_el + 1));
    g->alt_off = malloc(sizeof *g->alt_off * (size_t)(b->n_rules + 1));
    g->alts = malloc(sizeof *g->alts * (size_t)(n_alts + 1));
    g->sets = malloc(sizeof *g->sets * (size_t)(b->n_sets + 1));
    if (!g->el || !g->alt_off || !g->alts || !g->sets) {
        grammar_free(g);
        return bfail(b, "out of memory"), LOOM_ERR_NOMEM;
    }
    if (b->n_sets) memcpy(g->sets, b->sets, sizeof *g->sets * (size_t)b->n_sets);
    g->n_sets = b->n_sets;
    int ka = 0, ke = 0;
    for (int r = 0; r < b->n_rules; r++) {
        g->alt_off[r] = ka;
        for (int a = 0; a < b->rules[r].n_alts; a++) {
            g->alts[ka++] = ke;
            if (b->rules[r].alts[a].n) memcpy(g->el + ke, b->rules[r].alts[a].v, sizeof *g->el * (size_t)b->rules[r].alts[a].n);
            ke += b->rules[r].alts[a].n;
            g->el[ke++] = EL_END;
        }
    }
    g->alt_off[b->n_rules] = ka;
    g->n_el = ke;
    g->text_alt = malloc(sizeof *g->text_alt * (size_t)(ke + 2));
    g->set_text = calloc((size_t)b->n_sets + 1, 1);
    if (!g->text_alt || !g->set_text) {
        grammar_free(g);
        return bfail(b, "out of memory"), LOOM_ERR_NOMEM;
    }
    memset(g->text_alt, -1, sizeof *g->text_alt * (size_t)(ke + 2));
    for (int r = 0; r < b->n_rules; r++)
        for (int a = g->alt_off[r]; a < g->alt_off[r + 1] && b->rules[r].text; a++) g->text_alt[g->alts[a]] = r;
    for (int k = 0; k < b->n_sets; k++)
        for (int c = 0x20; c <= 0xF4 && !g->set_text[k]; c++)
            g->set_text[k] = (c < 0x80 || c >= 0xC2) && c != '"' && c != '\\' && (b->sets[k][c >> 3] >> (c & 7) & 1);
    byte_classes(g);
    /* the start: the root rule's alternatives over an empty stack */
    g->el[ke] = ref_el(g->root);
    /* room for the states a document's first masks make (growing copies
       them inside some mask) */
    g->cap_states = 1024;
    g->states = calloc((size_t)g->cap_states, sizeof *g->states); /* state 0: dead */
    g->state_next = calloc((size_t)g->cap_states, sizeof *g->state_next);
    g->trans = calloc((size_t)g->cap_states, sizeof *g->trans);
    g->n_states = 1;
    int done = 0;
    int32_t e0 = ke;
    /* expanding a reference at e0 reads el[e0 + 1]: give it an END */
    int32_t *el2 = realloc(g->el, sizeof *g->el * (size_t)(ke + 2));
    if (el2) g->el = el2, g->el[ke + 1] = EL_END;
    if (!g->states || !g->state_next || !g->trans || !el2) g->oom = 1;
    else {
        expand(g, e0, -1, &done);
        g->start = intern_state(g, done);
    }
    if (g->oom) {
        grammar_free(g);
        return bfail(b, "out of memory"), LOOM_ERR_NOMEM;
    }
    if (!g->start) {
        grammar_free(g);
        return bfail(b, "grammar: the root matches nothing"), LOOM_ERR_INVALID_ARG;
    }
    if (vocab) {
        g->mask_words = (vocab->n_vocab + 31) / 32;
        g->max_masks = (int)LOOM_MAX(4, MASK_CACHE_BYTES / (4 * (size_t)g->mask_words));
        g->masks = calloc((size_t)g->max_masks, sizeof *g->masks);
        g->mask_owner = calloc((size_t)g->max_masks, sizeof *g->mask_owner);
        if (!g->masks || !g->mask_owner) {
            grammar_free(g);
            return bfail(b, "out of memory"), LOOM_ERR_NOMEM;
        }
    }
    *out = g;
    return LOOM_OK;
}

static loom_status compile_gbnf(const char *text, const loom_gvocab *vocab, loom_grammar **out, char *err,
                                size_t cap) {
    builder b = {.err = err, .err_cap = cap};
    memset(b.byte_set, -1, sizeof b.byte_set);
    if (err && cap) err[0] = 0;
    *out = NULL;
    loom_status st = LOOM_ERR_INVALID_ARG;
    if (!parse_gbnf(&b, text)) st = finish(&b, vocab, out);
    builder_free(&b);
    return st;
}

loom_status loom_grammar_from_gbnf(const char *text, const loom_gvocab *vocab, loom_grammar **out, char *err,
                                   size_t cap) {
    return compile_gbnf(text, vocab, out, err, cap);
}

loom_status loom_grammar_from_regex(const char *re, const loom_gvocab *vocab, loom_grammar **out, char *err,
                                    size_t cap) {
    *out = NULL;
    char *text = loom_grammar_regex_to_gbnf(re, err, cap);
    if (!text) return LOOM_ERR_INVALID_ARG;
    loom_status st = compile_gbnf(text, vocab, out, err, cap);
    free(text);
    return st;
}

loom_status loom_grammar_from_schema(const char *schema, const loom_gvocab *vocab, loom_grammar **out,
                                     char *err, size_t cap) {
    *out = NULL;
    char *text = loom_grammar_schema_to_gbnf(schema, err, cap);
    if (!text) return LOOM_ERR_INVALID_ARG;
    loom_status st = compile_gbnf(text, vocab, out, err, cap);
    free(text);
    return st;
}

loom_status loom_grammar_from_tools(const char *tools_json, const char *only, const loom_gtool_syntax *syn,
                                    const loom_gvocab *vocab, loom_grammar **out, char *err, size_t cap) {
    *out = NULL;
    char *text = loom_grammar_tools_to_gbnf(tools_json, only, syn, err, cap);
    if (!text) return LOOM_ERR_INVALID_ARG;
    loom_status st = compile_gbnf(text, vocab, out, err, cap);
    free(text);
    return st;
}

loom_status loom_grammar_json_object(const loom_gvocab *vocab, loom_grammar **out, char *err, size_t cap) {
    return loom_grammar_from_schema("{\"type\": \"object\"}", vocab, out, err, cap);
}

loom_grammar *loom_grammar_retain(loom_grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void loom_grammar_release(loom_grammar *g) {
    if (g && atomic_fetch_sub(&g->refs, 1) == 1) grammar_free(g);
}

const loom_gvocab *loom_grammar_vocab(const loom_grammar *g) { return g->vocab; }

int loom_grammar_n_states(const loom_grammar *g) { return g->n_states; }

/* ---- matcher ---------------------------------------------------------------- */

void loom_gmatcher_init(loom_gmatcher *m, loom_grammar *g) {
    m->g = g;
    m->state = g->start;
}

int loom_gmatcher_accept_bytes(loom_gmatcher *m, const char *s, size_t n) {
    int32_t st = m->state;
    for (size_t i = 0; i < n && st; i++) st = step(m->g, st, (uint8_t)s[i]);
    if (!st || m->g->oom) return -1;
    m->state = st;
    return 0;
}

int loom_gmatcher_accept_token(loom_gmatcher *m, int32_t id) {
    const loom_gvocab *v = m->g->vocab;
    if (!v || id < 0 || id >= v->n_vocab || v->lens[id] <= 0) return -1;
    return loom_gmatcher_accept_bytes(m, v->bytes[id], (size_t)v->lens[id]);
}

int loom_gmatcher_done(const loom_gmatcher *m) { return m->state && m->g->states[m->state].done; }

int loom_gmatcher_can_continue(const loom_gmatcher *m) { return m->state && m->g->states[m->state].n > 0; }

int loom_grammar_accepts(loom_grammar *g, const char *s, size_t n) {
    loom_gmatcher m;
    loom_gmatcher_init(&m, g);
    return !loom_gmatcher_accept_bytes(&m, s, n) && loom_gmatcher_done(&m);
}

/* Marks every token in trie node i's subtree whose bytes stay alive from
 * state s (s is the state after node i's own byte). */
static int walk(loom_grammar *g, const loom_gvocab *v, int32_t i, int32_t s, uint32_t *bits) {
    int count = 0;
    for (int32_t k = v->tok_off[i]; k < v->tok_off[i + 1]; k++) {
        int32_t t = v->toks[k];
        bits[t >> 5] |= 1u << (t & 31);
        count++;
    }
    for (int32_t j = i + 1; j < v->end[i]; j = v->end[j]) {
        int c = v->byte[j];
        if (!(g->states[s].next[c >> 3] >> (c & 7) & 1)) continue;
        int32_t t = step(g, s, c);
        if (t) count += walk(g, v, j, t, bits);
    }
    return count;
}

/* Well-formed UTF-8 (Unicode's table of byte ranges), as [lead lo, hi]
 * then the ranges of the bytes that follow. */
static const uint8_t UTF8_SEQS[][4][2] = {
    {{0xC2, 0xDF}, {0x80, 0xBF}},
    {{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
    {{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
    {{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
    {{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
};
static const int UTF8_SEQ_LEN[] = {2, 3, 3, 3, 3, 4, 4, 4};

/* The one state every byte sequence of ranges r[0..n) leads s to, or -1
 * when they do not all lead to one state. Dead stays dead. */
static int32_t uniform_over(loom_grammar *g, int32_t s, const uint8_t (*r)[2], int n) {
    if (!n || !s) return s;
    int32_t to = -1;
    for (int c = r[0][0]; c <= r[0][1]; c++) {
        int32_t t = step(g, s, c);
        if (to >= 0 && t != to) return -1;
        to = t;
    }
    return uniform_over(g, to, r + 1, n - 1);
}

/* The state after any text code point from s, read off s's stacks: when
 * every stack either sits at the start of an alternative of a text rule
 * (all of that rule's alternatives there, over one same parent) or can take
 * no byte a text code point begins with, each text code point is taken by
 * exactly one alternative of each such rule and leads to those parents'
 * continuations, whatever the code point. -2 when s is not of that shape
 * (the byte-by-byte check decides). */
static int32_t uniform_shape(loom_grammar *g, int32_t s) {
    enum { MAXG = 16 };
    int32_t rule[MAXG], parent[MAXG], seen[MAXG];
    int ng = 0;
    const gstate *st = &g->states[s];
    for (int i = 0; i < st->n; i++) {
        const gnode *nd = &g->nodes[g->st_nodes[st->off + (uint32_t)i]];
        int32_t r = g->text_alt[nd->pos];
        if (r < 0) {
            if (g->set_text[g->el[nd->pos]]) return -2;
            continue;
        }
        int k = 0;
        while (k < ng && !(rule[k] == r && parent[k] == nd->parent)) k++;
        if (k == ng) {
            if (ng == MAXG) return -2;
            rule[ng] = r, parent[ng] = nd->parent, seen[ng++] = 0;
        }
        seen[k]++;
    }
    g->scratch.n = 0;
    int done = 0;
    for (int k = 0; k < ng; k++) {
        if (seen[k] != g->alt_off[rule[k] + 1] - g->alt_off[rule[k]]) return -2;
        if (parent[k] < 0) done = 1;
        else expand(g, g->nodes[parent[k]].pos, g->nodes[parent[k]].parent, &done);
    }
    return intern_state(g, done);
}

/* s's state after any text code point (design note 6), memoised. */
static int32_t uniform_next(loom_grammar *g, int32_t s) {
    if (g->states[s].uni != -2) return g->states[s].uni;
    int32_t to = uniform_shape(g, s);
    if (to >= -1) {
        if (g->oom) return -1;
        return g->states[s].uni = to;
    }
    to = -1;
    for (int c = 0x20; c < 0x80 && to != -2; c++) {
        if (c == '"' || c == '\\') continue;
        int32_t t = step(g, s, c);
        to = to == -1 || to == t ? t : -2;
    }
    for (size_t k = 0; k < sizeof UTF8_SEQS / sizeof *UTF8_SEQS && to != -2; k++) {
        const uint8_t (*r)[2] = UTF8_SEQS[k];
        for (int c = r[0][0]; c <= r[0][1] && to != -2; c++) {
            int32_t t = uniform_over(g, step(g, s, c), r + 1, UTF8_SEQ_LEN[k] - 1);
            to = t >= 0 && (to == -1 || to == t) ? t : -2;
        }
    }
    if (g->oom) return -1;
    g->states[s].uni = to < 0 ? -1 : to;
    return g->states[s].uni;
}

/* The mask from s through its chain of uniform successors (design note
 * 6): chain[k] is the state after k text code points. Returns the count,
 * or -1 when some successor needed is not uniform (bits then hold part of
 * a mask). */
static int text_mask(loom_grammar *g, const loom_gvocab *v, int32_t s, uint32_t *bits) {
    int32_t chain[REST_P + 1];
    int n = 1; /* chain[0..n) known; chain[n - 1] == 0 or a loop ends it early */
    chain[0] = s;
    int loop = 0;
    /* the bitsets need TEXT_MAX steps, or fewer when the chain dies */
    while (n <= TEXT_MAX && chain[n - 1] && !loop) {
        int32_t t = uniform_next(g, chain[n - 1]);
        if (t < 0) return -1;
        loop = t == chain[n - 1];
        chain[n++] = t;
    }
    int reach = 0;
    while (reach + 1 < n && chain[reach + 1]) reach++;
    if (loop) reach = TEXT_MAX;
    size_t bytes = sizeof *bits * (size_t)g->mask_words;
    if (reach) memcpy(bits, v->text + (size_t)reach * (size_t)g->mask_words, bytes);
    else memset(bits, 0, bytes);
    int count = v->text_count[reach];
    const loom_gvocab *r = v->rest;
    for (int32_t j = 1; j < r->end[0]; j = r->end[j]) {
        int p = r->byte[j];
        while (p >= n && chain[n - 1] && !loop) {
            int32_t t = uniform_next(g, chain[n - 1]);
            if (t < 0) return -1;
            loop = t == chain[n - 1];
            chain[n++] = t;
        }
        int32_t at = p < n ? chain[p] : loop ? chain[n - 1] : 0;
        if (!at) break; /* p only grows, and a dead chain stays dead */
        count += walk(g, r, j, at, bits);
    }
    return count;
}

/* ---- class indexes (design note 7) ------------------------------------------- */

/* Of one class C of ASCII bytes, the vocabulary's trie cut into segments:
 * a segment starts at the root or at a node whose byte is ASCII and not in
 * C, and holds the nodes below it reached over bytes of C (its spine). It
 * keeps the tokens ending on its spine by their depth there, and its exits
 * (the children of spine nodes over bytes not in C) grouped by (depth,
 * byte): an ASCII exit is a segment of its own, any other a plain subtree.
 * Every token is on exactly one spine. The root's spine tokens of at most
 * TEXT_MAX bytes are bitsets by length instead. */
typedef struct cindex {
    uint64_t c[2];            /* the class: bit b of c[b >> 6] */
    int id, rep;              /* its index in the vocabulary; a byte of it */
    uint32_t *run;            /* [TEXT_MAX + 1][words]: root tokens of <= k bytes of C */
    int32_t run_count[TEXT_MAX + 1];
    int32_t *seg_node;        /* [n_seg] trie node */
    int32_t *seg_tok;         /* [n_seg + 1] into sp_tok, sp_len */
    int32_t *seg_grp;         /* [n_seg + 1] into grp_* */
    int32_t *sp_tok, *sp_len; /* spine tokens and their depth, by depth */
    int32_t *grp_p;           /* [n_grp] the depth a group leaves C at */
    uint8_t *grp_b;           /* [n_grp] its byte */
    int32_t *grp_child;       /* [n_grp + 1] into child */
    int32_t *child;           /* segment ids (ASCII byte) or trie nodes (other) */
    int n_seg, n_grp;
} cindex;

static void cindex_free(cindex *x) {
    if (!x) return;
    free(x->run), free(x->seg_node), free(x->seg_tok), free(x->seg_grp), free(x->sp_tok), free(x->sp_len);
    free(x->grp_p), free(x->grp_b), free(x->grp_child), free(x->child);
    free(x);
}

static int in_class(const uint64_t c[2], int b) { return b < 128 && (c[b >> 6] >> (b & 63) & 1); }

/* Sorts by the high 32 bits (below nkeys; the low ones in any order):
 * a counting sort when large (tmp, cnt scratch), else insertion. */
static void sort_i64(int64_t *a, int n, int64_t *tmp, int32_t *cnt, int nkeys) {
    if (n > 256) {
        memset(cnt, 0, sizeof *cnt * (size_t)(nkeys + 1));
        for (int i = 0; i < n; i++) cnt[(a[i] >> 32) + 1]++;
        for (int k = 0; k < nkeys; k++) cnt[k + 1] += cnt[k];
        for (int i = 0; i < n; i++) tmp[cnt[a[i] >> 32]++] = a[i];
        memcpy(a, tmp, sizeof *a * (size_t)n);
        return;
    }
    for (int i = 1; i < n; i++) { /* most segments are small */
        int64_t x = a[i];
        int j = i;
        for (; j > 0 && a[j - 1] > x; j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

static cindex *cindex_build(const loom_gvocab *v, const uint64_t c[2], int id, int full) {
    size_t words = (size_t)(v->n_vocab + 31) / 32;
    cindex *x = calloc(1, sizeof *x);
    int32_t *stack = malloc(sizeof *stack * (size_t)v->n_nodes * 2);
    int64_t *tk = malloc(sizeof *tk * (size_t)(v->n_vocab + 1)), *ex = malloc(sizeof *ex * (size_t)v->n_nodes);
    int nkeys = (v->max_len + 2) * 256; /* (depth, byte) keys */
    int64_t *tmp = malloc(sizeof *tmp * (size_t)LOOM_MAX(v->n_nodes, v->n_vocab + 1));
    int32_t *cnt = malloc(sizeof *cnt * (size_t)(nkeys + 1));
    ivec seg = {0}, stok = {0}, sgrp = {0}, sptok = {0}, splen = {0}, gp = {0}, gb = {0}, gch = {0}, ch = {0};
    if (!x || !stack || !tk || !ex || !tmp || !cnt) goto fail;
    x->c[0] = c[0], x->c[1] = c[1], x->id = id;
    while (!in_class(c, x->rep)) x->rep++;
    /* first the root's spine alone: a class of few tokens keeps only its
       count (the masks walk plainly), not a cut of the whole trie */
    int sp = 0, few = 0;
    stack[sp++] = 0, stack[sp++] = 0;
    while (sp) {
        int d = stack[--sp], i = stack[--sp];
        if (d && d <= TEXT_MAX) few += v->tok_off[i + 1] - v->tok_off[i];
        for (int32_t j = i + 1; j < v->end[i]; j = v->end[j])
            if (in_class(c, v->byte[j])) stack[sp++] = j, stack[sp++] = d + 1;
    }
    if (few < LOOM_MIN(CLASS_MIN_TOKENS, v->n_vocab / 64) || !full) {
        x->run_count[TEXT_MAX] = few;
        free(stack), free(tk), free(ex), free(tmp), free(cnt);
        return x;
    }
    x->run = calloc((TEXT_MAX + 1) * words, sizeof *x->run);
    if (!x->run || iv_push(&seg, 0)) goto fail;
    for (int k = 0; k < seg.n; k++) {
        int nt = 0, ne = 0;
        sp = 0;
        if (seg.n > MAX_SEGMENTS) { /* keep the count only, marked unusable */
            free(seg.v), free(stok.v), free(sgrp.v), free(sptok.v), free(splen.v), free(gp.v), free(gch.v), free(ch.v);
            free(gb.v), free(stack), free(tk), free(ex), free(tmp), free(cnt), free(x->run);
            x->run = NULL;
            return x;
        }
        stack[sp++] = seg.v[k], stack[sp++] = 0;
        while (sp) {
            int d = stack[--sp], i = stack[--sp];
            for (int32_t q = v->tok_off[i]; q < v->tok_off[i + 1]; q++) {
                int32_t t = v->toks[q];
                if (!k && d <= TEXT_MAX) x->run[(size_t)d * words + (size_t)(t >> 5)] |= 1u << (t & 31), x->run_count[d]++;
                else tk[nt++] = (int64_t)d << 32 | t;
            }
            for (int32_t j = i + 1; j < v->end[i]; j = v->end[j]) {
                if (in_class(c, v->byte[j])) stack[sp++] = j, stack[sp++] = d + 1;
                else ex[ne++] = ((int64_t)d * 256 + v->byte[j]) << 32 | j;
            }
        }
        sort_i64(tk, nt, tmp, cnt, nkeys);
        sort_i64(ex, ne, tmp, cnt, nkeys);
        if (iv_push(&stok, sptok.n) || iv_push(&sgrp, gp.n)) goto fail;
        for (int q = 0; q < nt; q++)
            if (iv_push(&sptok, (int32_t)(tk[q] & 0xffffffff)) || iv_push(&splen, (int32_t)(tk[q] >> 32))) goto fail;
        for (int q = 0; q < ne; q++) {
            int key = (int)(ex[q] >> 32), j = (int)(ex[q] & 0xffffffff);
            if (!q || key != (int)(ex[q - 1] >> 32))
                if (iv_push(&gp, key / 256) || iv_push(&gb, key % 256) || iv_push(&gch, ch.n)) goto fail;
            if (key % 256 < 128) {
                if (iv_push(&ch, seg.n) || iv_push(&seg, j)) goto fail;
            } else if (iv_push(&ch, j)) goto fail;
        }
    }
    if (iv_push(&stok, sptok.n) || iv_push(&sgrp, gp.n) || iv_push(&gch, ch.n)) goto fail;
    for (int k = 1; k <= TEXT_MAX; k++) { /* <= k bytes */
        for (size_t w = 0; w < words; w++) x->run[(size_t)k * words + w] |= x->run[(size_t)(k - 1) * words + w];
        x->run_count[k] += x->run_count[k - 1];
    }
    x->n_seg = seg.n, x->n_grp = gp.n;
    x->seg_node = seg.v, x->seg_tok = stok.v, x->seg_grp = sgrp.v, x->sp_tok = sptok.v, x->sp_len = splen.v;
    x->grp_p = gp.v, x->grp_child = gch.v, x->child = ch.v;
    x->grp_b = malloc((size_t)gb.n + 1);
    if (!x->grp_b) goto fail_owned;
    for (int q = 0; q < gb.n; q++) x->grp_b[q] = (uint8_t)gb.v[q];
    free(gb.v), free(stack), free(tk), free(ex), free(tmp), free(cnt);
    return x;
fail:
    free(seg.v), free(stok.v), free(sgrp.v), free(sptok.v), free(splen.v), free(gp.v), free(gch.v), free(ch.v);
fail_owned:
    free(gb.v), free(stack), free(tk), free(ex), free(tmp), free(cnt);
    cindex_free(x);
    return NULL;
}

/* The vocabulary's index of class c, built on first use; NULL when out of
 * memory or when the vocabulary keeps as many as it may. */
static const cindex *cindex_get(const loom_gvocab *cv, const uint64_t c[2]) {
    loom_gvocab *v = (loom_gvocab *)cv; /* the indexes are a cache behind the lock */
    const cindex *x = NULL;
    pthread_mutex_lock(&v->lock);
    for (int i = 0; i < v->n_cls && !x; i++)
        if (v->cls[i]->c[0] == c[0] && v->cls[i]->c[1] == c[1]) x = v->cls[i];
    if (!x && v->n_cls < MAX_CLASSES && (v->cls[v->n_cls] = cindex_build(v, c, v->n_cls, v->n_full < MAX_FULL))) {
        x = v->cls[v->n_cls++];
        v->n_full += x->seg_node != NULL; /* a full index, not only a count */
    }
    pthread_mutex_unlock(&v->lock);
    return x;
}

/* 1 when every stack top of s takes all of c or none of it: then every
 * byte of c leads s to one same state. */
static int class_uniform(const loom_grammar *g, int32_t s, const uint64_t c[2]) {
    const gstate *st = &g->states[s];
    for (int i = 0; i < st->n; i++) {
        const uint8_t *set = g->sets[g->el[g->nodes[g->st_nodes[st->off + (uint32_t)i]].pos]];
        uint64_t lo, hi;
        memcpy(&lo, set, 8), memcpy(&hi, set + 8, 8);
        lo &= c[0], hi &= c[1];
        if ((lo || hi) && (lo != c[0] || hi != c[1])) return 0;
    }
    return 1;
}

/* The state after any byte of x's class from u (u live), memoised for the
 * last class asked; -1 when u does not take the class uniformly. */
static int32_t cstep(loom_grammar *g, const cindex *x, int32_t u) {
    if (g->states[u].cls_id == x->id + 1) return g->states[u].cls_next;
    int32_t t = class_uniform(g, u, x->c) ? step(g, u, x->rep) : -1;
    g->states[u].cls_id = x->id + 1;
    g->states[u].cls_next = t;
    return t;
}

/* s's largest class of ASCII bytes that every stack top takes all or none
 * of, among the live ones; 0 when none has CLASS_MIN bytes. */
static int pick_class(const loom_grammar *g, int32_t s, uint64_t c[2]) {
    const gstate *st = &g->states[s];
    uint64_t sig[128] = {0};
    if (st->n > 64) return 0;
    for (int i = 0; i < st->n; i++) {
        const uint8_t *set = g->sets[g->el[g->nodes[g->st_nodes[st->off + (uint32_t)i]].pos]];
        for (int b = 0; b < 128; b++)
            if (set[b >> 3] >> (b & 7) & 1) sig[b] |= 1ull << i;
    }
    int best = 0;
    uint8_t done[128] = {0};
    for (int b = 0; b < 128; b++) {
        if (!sig[b] || done[b]) continue;
        uint64_t m[2] = {0, 0};
        int n = 0;
        for (int d = b; d < 128; d++)
            if (sig[d] == sig[b]) m[d >> 6] |= 1ull << (d & 63), done[d] = 1, n++;
        if (n > best) best = n, c[0] = m[0], c[1] = m[1];
    }
    return best >= CLASS_MIN;
}

/* The index s's mask goes through (its class holds enough tokens), or
 * NULL; memoised. */
static const cindex *best_index(loom_grammar *g, const loom_gvocab *v, int32_t s) {
    int32_t b = g->states[s].best;
    if (b > 0) return v->cls[b - 1]; /* set once under the lock, never changed */
    if (b < 0) return NULL;
    uint64_t c[2];
    const cindex *x = pick_class(g, s, c) ? cindex_get(v, c) : NULL;
    if (x && (!x->seg_node || x->run_count[TEXT_MAX] < LOOM_MIN(CLASS_MIN_TOKENS, v->n_vocab / 64)))
        x = NULL; /* only a count was kept: a plain walk is as quick */
    g->states[s].best = x ? x->id + 1 : -1;
    return x;
}

/* Marks the tokens of segment k allowed from u, the state after the
 * segment's first byte (the root: the state itself), and counts them.
 * Returns -1 (nothing marked) when the root meets a state that does not
 * take the class uniformly; any other segment then falls back to a plain
 * walk of its subtree. */
static int seg_walk(loom_grammar *g, const loom_gvocab *v, const cindex *x, int k, int32_t u, uint32_t *bits) {
    int t0 = x->seg_tok[k], t1 = x->seg_tok[k + 1], q0 = x->seg_grp[k], q1 = x->seg_grp[k + 1];
    int deep = LOOM_MAX(t1 > t0 ? x->sp_len[t1 - 1] : 0, q1 > q0 ? x->grp_p[q1 - 1] : 0);
    int d = 0, count = 0;
    int32_t ud = u;
    while (d < deep && ud > 0) ud = cstep(g, x, ud), d++; /* uniform as deep as needed? */
    if (ud < 0) return k ? walk(g, v, x->seg_node[k], u, bits) : -1;
    d = 0, ud = u;
    for (int t = t0; t < t1; t++) {
        while (d < x->sp_len[t] && ud > 0) ud = cstep(g, x, ud), d++;
        if (!ud) break; /* by depth: the rest are deeper */
        bits[x->sp_tok[t] >> 5] |= 1u << (x->sp_tok[t] & 31);
        count++;
    }
    d = 0, ud = u;
    for (int q = q0; q < q1; q++) {
        while (d < x->grp_p[q] && ud > 0) ud = cstep(g, x, ud), d++;
        if (!ud) break;
        int b = x->grp_b[q];
        if (!(g->states[ud].next[b >> 3] >> (b & 7) & 1)) continue;
        int32_t t = step(g, ud, b);
        for (int e = x->grp_child[q]; e < x->grp_child[q + 1] && t; e++)
            count += b < 128 ? seg_walk(g, v, x, x->child[e], t, bits) : walk(g, v, x->child[e], t, bits);
    }
    return count;
}

/* The mask of s through its successors over one class (design note 7), or
 * -1 when the class's successors are not uniform where needed. */
static int class_mask(loom_grammar *g, const loom_gvocab *v, int32_t s, uint32_t *bits) {
    const cindex *x = best_index(g, v, s);
    if (!x) return -1;
    int reach = 0;
    for (int32_t u = s; reach < TEXT_MAX;) {
        u = cstep(g, x, u);
        if (u < 0) return -1;
        if (!u) break;
        reach++;
    }
    memcpy(bits, x->run + (size_t)reach * (size_t)g->mask_words, sizeof *bits * (size_t)g->mask_words);
    int count = seg_walk(g, v, x, 0, s, bits);
    return count < 0 ? -1 : x->run_count[reach] + count;
}

int loom_gmatcher_mask(loom_gmatcher *m, uint32_t *bits) {
    loom_grammar *g = m->g;
    const loom_gvocab *v = g->vocab;
    size_t bytes = sizeof *bits * (size_t)g->mask_words;
    gstate *st = &g->states[m->state];
    if (st->mask_slot) {
        memcpy(bits, g->masks[st->mask_slot - 1] + 1, bytes);
        return (int)g->masks[st->mask_slot - 1][0];
    }
    if (!m->state || !v) return memset(bits, 0, bytes), 0;
    int count = -1;
    if (v->rest) count = text_mask(g, v, m->state, bits);
    if (count < 0 && v->rest) count = class_mask(g, v, m->state, bits);
    if (count < 0) {
        memset(bits, 0, bytes);
        count = walk(g, v, 0, m->state, bits);
    }
    /* cache it: a free slot, else replace one round-robin */
    int slot;
    if (g->n_masks < g->max_masks) {
        g->masks[g->n_masks] = malloc(bytes + sizeof *bits);
        if (!g->masks[g->n_masks]) return count;
        slot = g->n_masks++;
    } else {
        slot = g->next_victim;
        g->next_victim = (g->next_victim + 1) % g->max_masks;
        g->states[g->mask_owner[slot]].mask_slot = 0;
    }
    g->masks[slot][0] = (uint32_t)count;
    memcpy(g->masks[slot] + 1, bits, bytes);
    g->mask_owner[slot] = m->state;
    g->states[m->state].mask_slot = (uint32_t)slot + 1;
    return count;
}

int loom_gmatcher_mask_logits(loom_gmatcher *m, uint32_t *bits, float *logits, int n) {
    int count = loom_gmatcher_mask(m, bits);
    for (int w = 0; w * 32 < n; w++) {
        uint32_t b = bits[w];
        if (b == ~0u) continue;
        int end = LOOM_MIN(32, n - w * 32);
        float *l = logits + w * 32;
        if (!b) { /* most words outside strings: a plain fill the compiler vectorises */
            for (int k = 0; k < end; k++) l[k] = -INFINITY;
            continue;
        }
        for (uint32_t off = ~b & (end == 32 ? ~0u : (1u << end) - 1); off; off &= off - 1)
            l[__builtin_ctz(off)] = -INFINITY;
    }
    return count;
}

/* ---- vocabulary ---------------------------------------------------------------- */

static const loom_gvocab *sort_vocab; /* qsort has no context argument */
static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int lx = sort_vocab->lens[x], ly = sort_vocab->lens[y];
    int c = memcmp(sort_vocab->bytes[x], sort_vocab->bytes[y], (size_t)LOOM_MIN(lx, ly));
    return c ? c : lx != ly ? (lx < ly ? -1 : 1) : (x < y ? -1 : x > y);
}

void loom_gvocab_free(loom_gvocab *v) {
    if (!v) return;
    for (int i = 0; i < v->n_vocab && v->bytes; i++) free(v->bytes[i]);
    free(v->bytes), free(v->lens), free(v->byte), free(v->end), free(v->tok_off), free(v->toks);
    free(v->text), free(v->text_count);
    loom_gvocab_free(v->rest);
    for (int i = 0; i < v->n_cls; i++) cindex_free(v->cls[i]);
    pthread_mutex_destroy(&v->lock);
    free(v);
}

static loom_status loom_gvocab_create_plain(const char *const *bytes, const int *lens, int n_vocab,
                                           loom_gvocab **out);

/* The longest prefix of s made of text code points (design note 6), at
 * most REST_P of them, the last possibly cut by the end of s: *cps code
 * points in the returned number of bytes; *all when they are the whole of
 * s. */
static int text_prefix(const char *s, int n, int *cps, int *all) {
    int i = 0, k = 0;
    *all = 0;
    while (i < n && k < REST_P) {
        uint8_t c = (uint8_t)s[i];
        if (c < 0x80) {
            if (c < 0x20 || c == '"' || c == '\\') break;
            i++, k++;
            continue;
        }
        int q = 0, nq = (int)(sizeof UTF8_SEQS / sizeof *UTF8_SEQS), ok = 1;
        while (q < nq && (c < UTF8_SEQS[q][0][0] || c > UTF8_SEQS[q][0][1])) q++;
        if (q == nq) break;
        int len = LOOM_MIN(UTF8_SEQ_LEN[q], n - i);
        for (int j = 1; j < len && ok; j++) {
            uint8_t d = (uint8_t)s[i + j];
            ok = d >= UTF8_SEQS[q][j][0] && d <= UTF8_SEQS[q][j][1];
        }
        if (!ok) break;
        i += len, k++; /* a code point cut by the token's end counts as one */
    }
    *cps = k;
    *all = i == n;
    return i;
}

/* The text bitsets and the trie of the other tokens' rests. */
static loom_status build_text(loom_gvocab *v) {
    size_t words = (size_t)(v->n_vocab + 31) / 32;
    v->text = calloc((TEXT_MAX + 1) * words, sizeof *v->text);
    v->text_count = calloc(TEXT_MAX + 1, sizeof *v->text_count);
    int *rlens = malloc(sizeof *rlens * (size_t)(v->n_vocab + 1));
    char **rest = calloc((size_t)v->n_vocab + 1, sizeof *rest);
    loom_status st = LOOM_OK;
    if (!v->text || !v->text_count || !rlens || !rest) {
        st = loom_err(LOOM_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (int t = 0; t < v->n_vocab; t++) {
        rlens[t] = -1;
        if (v->lens[t] <= 0) continue;
        int k, all, at = text_prefix(v->bytes[t], v->lens[t], &k, &all);
        if (all && k >= 1 && k <= TEXT_MAX) {
            for (int j = k; j <= TEXT_MAX; j++) {
                v->text[(size_t)j * words + (size_t)(t >> 5)] |= 1u << (t & 31);
                v->text_count[j]++;
            }
            continue;
        }
        rlens[t] = 1 + v->lens[t] - at;
        if (!(rest[t] = malloc((size_t)rlens[t]))) {
            st = loom_err(LOOM_ERR_NOMEM, "out of memory");
            goto out;
        }
        rest[t][0] = (char)k;
        memcpy(rest[t] + 1, v->bytes[t] + at, (size_t)(v->lens[t] - at));
    }
    st = loom_gvocab_create_plain((const char *const *)rest, rlens, v->n_vocab, &v->rest);
out:
    for (int t = 0; t < v->n_vocab && rest; t++) free(rest[t]);
    free(rlens), free(rest);
    return st;
}

int loom_gvocab_size(const loom_gvocab *v) { return v->n_vocab; }

/* Builds the preorder trie from the tokens sorted by their bytes: each
 * token shares its path with the previous one up to their common prefix. */
static loom_status build_trie(loom_gvocab *v) {
    int n = 0;
    size_t total = 1;
    for (int i = 0; i < v->n_vocab; i++)
        if (v->lens[i] > 0) n++, total += (size_t)v->lens[i];
    int32_t *order = malloc(sizeof *order * (size_t)(n + 1));
    int32_t *tnode = malloc(sizeof *tnode * (size_t)(n + 1));
    int32_t *path = malloc(sizeof *path * (total + 1));
    int32_t *cnt = calloc(total + 1, sizeof *cnt);
    v->byte = malloc(total);
    v->end = malloc(sizeof *v->end * total);
    v->tok_off = malloc(sizeof *v->tok_off * (total + 1));
    v->toks = malloc(sizeof *v->toks * (size_t)(n + 1));
    loom_status st = LOOM_OK;
    if (!order || !tnode || !path || !cnt || !v->byte || !v->end || !v->tok_off || !v->toks) {
        st = loom_err(LOOM_ERR_NOMEM, "out of memory for the vocabulary trie");
        goto out;
    }
    n = 0;
    for (int i = 0; i < v->n_vocab; i++)
        if (v->lens[i] > 0) order[n++] = i;
    sort_vocab = v;
    qsort(order, (size_t)n, sizeof *order, cmp_tok);
    int nn = 1, depth = 0, prev_len = 0;
    const char *prev = NULL;
    v->byte[0] = 0;
    path[0] = 0;
    for (int k = 0; k < n; k++) {
        int t = order[k], len = v->lens[t];
        const char *s = v->bytes[t];
        int common = 0;
        while (common < prev_len && common < len && prev[common] == s[common]) common++;
        while (depth > common) v->end[path[depth--]] = nn; /* close finished subtrees */
        for (int d = common; d < len; d++) {
            v->byte[nn] = (uint8_t)s[d];
            path[++depth] = nn++;
        }
        tnode[k] = path[len];
        cnt[path[len]]++;
        prev = s;
        prev_len = len;
    }
    while (depth > 0) v->end[path[depth--]] = nn;
    v->end[0] = nn;
    v->n_nodes = nn;
    v->tok_off[0] = 0;
    for (int i = 0; i < nn; i++) v->tok_off[i + 1] = v->tok_off[i] + cnt[i];
    for (int k = 0; k < n; k++) v->toks[v->tok_off[tnode[k]] + --cnt[tnode[k]]] = order[k];
out:
    free(order), free(tnode), free(path), free(cnt);
    return st;
}

static loom_status gvocab_create(const char *const *bytes, const int *lens, int n_vocab, int text,
                                 loom_gvocab **out) {
    *out = NULL;
    loom_gvocab *v = calloc(1, sizeof *v);
    if (!v) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&v->lock, NULL);
    v->n_vocab = n_vocab;
    v->bytes = calloc((size_t)n_vocab, sizeof *v->bytes);
    v->lens = calloc((size_t)n_vocab, sizeof *v->lens);
    if (!v->bytes || !v->lens) {
        loom_gvocab_free(v);
        return loom_err(LOOM_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n_vocab; i++) {
        v->lens[i] = lens[i] > 0 ? lens[i] : -1;
        if (lens[i] <= 0) continue;
        v->bytes[i] = malloc((size_t)lens[i]);
        if (!v->bytes[i]) {
            loom_gvocab_free(v);
            return loom_err(LOOM_ERR_NOMEM, "out of memory");
        }
        memcpy(v->bytes[i], bytes[i], (size_t)lens[i]);
        v->max_len = LOOM_MAX(v->max_len, lens[i]);
    }
    loom_status st = build_trie(v);
    if (!st && text) st = build_text(v);
    if (st) {
        loom_gvocab_free(v);
        return st;
    }
    *out = v;
    return LOOM_OK;
}

static loom_status loom_gvocab_create_plain(const char *const *bytes, const int *lens, int n_vocab,
                                           loom_gvocab **out) {
    return gvocab_create(bytes, lens, n_vocab, 0, out);
}

loom_status loom_gvocab_create(const char *const *bytes, const int *lens, int n_vocab, loom_gvocab **out) {
    return gvocab_create(bytes, lens, n_vocab, 1, out);
}

