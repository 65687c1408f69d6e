/* ops_q_avx512: matmuls over MLX affine-quantized weights with AVX-512.
 * Compiled with the AVX-512 flags (Makefile); only reached after
 * loom_kernels_get() checked the CPU. Handles 4- and 8-bit rows whose group
 * is 64 << s columns (MLX's usual 64 and 128); everything else goes to the
 * AVX2 kernel.
 *
 * Per 64-column block j of group g the exact entry computes
 *     y += sw_g * sum(q * x) + bw_g * sum(x)
 * (the bias term once per group, as a dot of the row's biases with the
 * group sums of x), so the inner loop is convert + FMA per weight.
 *   - T <= SMALL_T (decode, batched decode): row by row, prefetching
 *     ahead, each row converted once for all T tokens; the f32
 *     sum of a block is scaled once. 4-bit fields: the 16 bytes of 32
 *     nibbles are widened to dwords and VPERMPS maps each low nibble (it
 *     only reads an index's low four bits) straight to its float, a
 *     conversion each high nibble shifted down, with x
 *     reordered per 32 columns into even | odd columns to match.
 *   - T > SMALL_T (prefill): a panel of 16 rows x KC columns is
 *     dequantized once, transposed to [column][row], and every token tile
 *     (12 tokens x 16 rows of accumulators) sweeps over it from L1 with
 *     one weight load and 12 broadcast FMAs per column.
 * The _fast entry rounds each token's activations per 64-column block to
 * int8 (ops_q_fast_ref.c defines it) and sums q * qx exactly with
 * VPDPBUSD (u8 weights x s8 activations, 64 products per instruction):
 *   - decode: one VPDPBUSD per row and block, then convert and one FMA by
 *     sw * sx; 4-bit blocks are unpacked to [low nibbles | high nibbles],
 *     so the activations are stored in that order too.
 *   - prefill: the panel is unpacked to u8 and transposed into
 *     [column / 4][row][4] so that one weight vector feeds 12 tokens'
 *     VPDPBUSDs, each with its four activation bytes broadcast; the
 *     integer sums are scaled once per block. Activations are rounded once
 *     per block of tokens, the panel re-packed once per block of tokens. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "ops/ops.h"
#include "ops/ops_avx512.h"

#define INLINE static inline __attribute__((always_inline))

#define XBLK 64          /* columns per activation block (and per VPDPBUSD) */
#define MAXN 32768       /* longest row kept on the stack (x copies, params) */
#define MAXB (MAXN / XBLK)
#define SMALL_T 8        /* up to this many tokens: each row unpacked once for all */
#define SMALL_T_MAXN 8192 /* ... for rows this long (their x copies live on the stack) */
#define PR 16            /* rows per panel */
#define TT_MAX 12        /* tokens per register tile */
#define KC_EXACT 256     /* panel columns (f32: 16 KiB; 128 reloaded the token tiles' sums twice as often, 3-5% slower) */
#define KC_FAST 256      /* panel columns (u8: 4 KiB) */
#define XQ_BYTES (128 * 1024) /* rounded activations of one token block */
/* Decode: bytes ahead of the read position to prefetch. Rows go one at
 * a time (one sequential stream): that measured twice the cold bandwidth
 * of two or four interleaved rows on Zen 4 (20-26 vs 10-13 GB/s a core),
 * more than the x loads shared by several rows save. 8-bit rows take
 * twice the bytes a column: 4 KiB ahead measured 33 -> 41-43 tok/s for
 * exact 8-bit Qwen3-0.6B on an EPYC (Zen 4) VM, 2 threads, where 1 KiB
 * left the first load of each block waiting on memory; 4-bit there: no
 * clear change (bench/RESULTS.md). */
#ifndef PF_DIST
#define PF_DIST 1024
#endif
#ifndef PF_DIST8
#define PF_DIST8 4096
#endif
#define PF_AHEAD(bits) ((bits) == 8 ? PF_DIST8 : PF_DIST)
/* The --fast 4-bit loop reads fastest: 4 KiB ahead measured 36 -> 42 GB/s
 * on 2 threads (8-bit: no clear change). */
#define PF_FAST4 4096

static int shape_ok(const loom_qmat *w) {
    int m = w->group / XBLK;
    return (w->bits == 4 || w->bits == 8) && w->group % XBLK == 0 && (m & (m - 1)) == 0 &&
           w->n > 0 && w->n % w->group == 0 && w->n <= MAXN;
}

INLINE __mmask16 mask16(int c) { return c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << c) - 1); }

/* c (<= 16) scales or biases as f32, zero past c. */
INLINE __m512 params16(const uint16_t *p, int c, int f16) {
    __m256i h = _mm256_maskz_loadu_epi16(mask16(c), p);
    if (f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Lanes summing to sum_g b[g] * xs[g]. */
INLINE __m512 bias_dot(const uint16_t *b, const float *xs, int ng, int f16) {
    __m512 a = _mm512_setzero_ps();
    for (int g = 0; g < ng; g += 16) {
        int c = LOOM_MIN(16, ng - g);
        a = _mm512_fmadd_ps(params16(b + g, c, f16), _mm512_maskz_loadu_ps(mask16(c), xs + g), a);
    }
    return a;
}

/* 64 nibbles (32 bytes) as 64 bytes in column order. */
INLINE __m512i unpack4_natural(const uint8_t *p) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p), m = _mm256_set1_epi8(15);
    __m256i lo = _mm256_and_si256(v, m), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(a, b, 0x20)),
                              _mm256_permute2x128_si256(a, b, 0x31), 1);
}

/* 64 nibbles as [even columns | odd columns]: cheaper, for decode. */
INLINE __m512i unpack4_split(const uint8_t *p) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    return _mm512_and_si512(z, _mm512_set1_epi8(15));
}

INLINE const uint8_t *qrow(const loom_qmat *w, int r) {
    return (const uint8_t *)w->w + (size_t)r * ((size_t)w->n * (size_t)w->bits / 8);
}

/* ---- exact, decode ------------------------------------------------------- */

/* xp: x (8-bit) or x reordered per 32 columns as even | odd (4-bit);
 * xsg[g]: sum of x over group g. */
static void ex_prep(float *xp, float *xsg, const float *x, const loom_qmat *w) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    int ng = w->n / w->group;
    for (int g = 0; g < ng; g++) {
        __m512 s = _mm512_setzero_ps();
        for (int k = g * w->group, end = k + w->group; k < end; k += 32) {
            __m512 a = _mm512_loadu_ps(x + k), b = _mm512_loadu_ps(x + k + 16);
            s = _mm512_add_ps(s, _mm512_add_ps(a, b));
            if (w->bits == 4) {
                _mm512_storeu_ps(xp + k, _mm512_permutex2var_ps(a, ev, b));
                _mm512_storeu_ps(xp + k + 16, _mm512_permutex2var_ps(a, od, b));
            }
        }
        xsg[g] = _mm512_reduce_add_ps(s);
    }
}

/* The scales of blocks c0 .. c0 + 15 of a row (block j in lane j - c0):
 * the groups' scales widened to blocks in registers. A copy through
 * memory (masked stores, then loads) cannot be store-forwarded and
 * stalled each row. c0 % 16 == 0 and a group spans at most 16 blocks. */
INLINE __m512 block_scales(const uint16_t *sc_row, int c0, int cnt, int gs, int f16) {
    int g0 = c0 >> gs, gc = ((c0 + cnt - 1) >> gs) - g0 + 1;
    __m512i gi = _mm512_srl_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                    14, 15),
                                  _mm_cvtsi32_si128(gs));
    return _mm512_permutexvar_ps(gi, params16(sc_row + g0, gc, f16));
}

/* Rows [r0, r1) for T (1 .. SMALL_T) tokens (xp[t] as ex_prep leaves it):
 * each row's weights are converted once per block and used for all T
 * tokens, each with two partial sums per block and per-chunk scales in
 * registers, so a token's outputs do not depend on T. Converting once per
 * token instead or dequantizing panels (ex_gemm) made 4 sequences slower
 * than 1. */
INLINE void ex_rows_multi(float *y, size_t ldy, const float *const *xp, const float *xsg,
                          const loom_qmat *w, int r0, int r1, const int T, const int bits) {
    const int n = w->n, ng = n / w->group, nb = n / XBLK, gs = __builtin_ctz(w->group / XBLK);
    const __m512 tbl = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = qrow(w, r);
        const uint16_t *scr = w->scales + (size_t)r * ng;
        __m512 facc[SMALL_T];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            facc[t] = bias_dot(w->biases + (size_t)r * ng, xsg + (size_t)t * MAXB, ng, w->f16);
        for (int c0 = 0; c0 < nb; c0 += 16) {
            int cnt = LOOM_MIN(16, nb - c0);
            /* stored whole and read back a lane at a time (a load that
             * broadcasts, off the shuffle port the 4-bit unpacking keeps busy) */
            float scb[16] __attribute__((aligned(64)));
            _mm512_store_ps(scb, block_scales(scr, c0, cnt, gs, w->f16));
            for (int jj = 0; jj < cnt; jj++) {
                int j = c0 + jj;
                __m512 wv[4];
                _mm_prefetch((const char *)row + (size_t)j * 8 * bits + PF_AHEAD(bits), _MM_HINT_T0);
                if (bits == 8) {
#pragma GCC unroll 4
                    for (int c = 0; c < 4; c++)
                        wv[c] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                            _mm_loadu_si128((const __m128i *)(row + (size_t)j * 64 + 16 * c))));
                } else {
#pragma GCC unroll 2
                    for (int c = 0; c < 2; c++) {
                        __m512i d = _mm512_cvtepu8_epi32(
                            _mm_loadu_si128((const __m128i *)(row + (size_t)j * 32 + 16 * c)));
                        /* the high nibble by conversion: off the shuffle port the
                         * widening and the low nibble's VPERMPS share (the same
                         * floats; 7% faster hot on Zen 4) */
                        wv[2 * c] = _mm512_permutexvar_ps(d, tbl);
                        wv[2 * c + 1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(d, 4));
                    }
                }
                __m512 sj = _mm512_set1_ps(scb[jj]);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const float *xj = xp[t] + (size_t)j * XBLK;
                    __m512 p = _mm512_fmadd_ps(wv[0], _mm512_loadu_ps(xj), _mm512_setzero_ps());
                    __m512 p2 = _mm512_fmadd_ps(wv[1], _mm512_loadu_ps(xj + 16), _mm512_setzero_ps());
                    p = _mm512_fmadd_ps(wv[2], _mm512_loadu_ps(xj + 32), p);
                    p2 = _mm512_fmadd_ps(wv[3], _mm512_loadu_ps(xj + 48), p2);
                    facc[t] = _mm512_fmadd_ps(_mm512_add_ps(p, p2), sj, facc[t]);
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) y[(size_t)t * ldy + r] = _mm512_reduce_add_ps(facc[t]);
    }
}

static void ex_matvec_multi(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T,
                            int r0, int r1) {
    float xs[T][w->bits == 4 ? w->n : 1], xsg[T * MAXB];
    const float *xp[SMALL_T];
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * (size_t)ldx;
        ex_prep(xs[t], xsg + (size_t)t * MAXB, xt, w);
        xp[t] = w->bits == 4 ? xs[t] : xt;
    }
    const size_t ly = (size_t)ldy;
    switch (T * 16 + w->bits) {
#define EX_MULTI(n)                                                              \
    case n * 16 + 8: ex_rows_multi(y, ly, xp, xsg, w, r0, r1, n, 8); break;     \
    case n * 16 + 4: ex_rows_multi(y, ly, xp, xsg, w, r0, r1, n, 4); break;
    EX_MULTI(1) EX_MULTI(2) EX_MULTI(3) EX_MULTI(4) EX_MULTI(5) EX_MULTI(6) EX_MULTI(7) EX_MULTI(8)
#undef EX_MULTI
    default: break;
    }
}

/* ---- exact, prefill ------------------------------------------------------ */

/* The scales and biases of rows p0 .. p0 + R - 1 for group g, one row a
 * lane (zero past R). */
INLINE void ex_params(__m512 *sc, __m512 *bi, const loom_qmat *w, int p0, int R, int g) {
    const int ng = w->n / w->group;
    uint16_t s[16], b[16];
    for (int i = 0; i < R; i++) {
        s[i] = w->scales[(size_t)(p0 + i) * ng + g];
        b[i] = w->biases[(size_t)(p0 + i) * ng + g];
    }
    *sc = params16(s, R, w->f16);
    *bi = params16(b, R, w->f16);
}

/* pan[k][i] = row p0 + i, column k0 + k dequantized (sc * q + bi, rounded
 * twice like the reference), zero for rows past R; len % 64 == 0. The
 * rows' packed dwords are transposed first (16 x 16: lane i of vector m is
 * row i's dword m, 4 bytes or 8 nibbles), so each column's 16 fields come
 * out of one vector with a shift, the rows' scales and biases stay in
 * lanes, and nothing is transposed after conversion: about half the work
 * of converting row by row, which a few dozen tokens do not amortize. */
INLINE void ex_panel_bits(float *pan, const loom_qmat *w, int p0, int R, int k0, int len,
                          const int bits) {
    const int per = 32 / bits, span = 16 * per; /* fields a dword, columns a transpose */
    const __m512 tbl = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i ff = _mm512_set1_epi32(255);
    for (int c = 0; c < len; c += span) {
        const int k = k0 + c, cols = LOOM_MIN(span, len - c);
        __m512i r[16];
        for (int i = 0; i < PR; i++)
            r[i] = i < R ? _mm512_maskz_loadu_epi32(mask16(cols / per), qrow(w, p0 + i) + (size_t)k * bits / 8)
                         : _mm512_setzero_si512();
        loom_tr16(r);
        __m512 sc = _mm512_setzero_ps(), bi = sc;
        for (int m = 0, g = -1; m < cols / per; m++) {
            if ((k + m * per) / w->group != g) {
                g = (k + m * per) / w->group;
                ex_params(&sc, &bi, w, p0, R, g);
            }
#pragma GCC unroll 8
            for (int b = 0; b < per; b++) {
                __m512i f = b ? _mm512_srli_epi32(r[m], bits * b) : r[m];
                __m512 q = bits == 4 ? _mm512_permutexvar_ps(f, tbl) /* reads the low 4 bits */
                                     : _mm512_cvtepi32_ps(b < 3 ? _mm512_and_si512(f, ff) : f);
                _mm512_store_ps(pan + (size_t)(c + m * per + b) * PR,
                                _mm512_add_ps(_mm512_mul_ps(sc, q), bi));
            }
        }
    }
}

static void ex_panel(float *pan, const loom_qmat *w, int p0, int R, int k0, int len) {
    if (w->bits == 8) ex_panel_bits(pan, w, p0, R, k0, len, 8);
    else ex_panel_bits(pan, w, p0, R, k0, len, 4);
}

/* y[t][p0 + i] (+)= sum_k xp[k][t] * pan[k][i] for TT tokens; xp is the
 * tile's activations packed [column][TT_MAX], so every broadcast comes
 * from one pointer. */
INLINE void ex_tile(float *y, size_t ldy, const float *xp, const float *pan, int len, int first,
                    __mmask16 rm, const int TT) {
    __m512 acc[TT_MAX];
#pragma GCC unroll 12
    for (int t = 0; t < TT; t++)
        acc[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rm, y + t * ldy);
    for (int k = 0; k < len; k++) {
        __m512 wv = _mm512_load_ps(pan + (size_t)k * PR);
        const float *xk = xp + (size_t)k * TT_MAX;
#pragma GCC unroll 12
        for (int t = 0; t < TT; t++) acc[t] = _mm512_fmadd_ps(wv, _mm512_set1_ps(xk[t]), acc[t]);
    }
#pragma GCC unroll 12
    for (int t = 0; t < TT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, acc[t]);
}

/* Loop order: token blocks of EX_TB (their activations, packed per
 * KC_EXACT columns, stay in L2), then column panels, then 16-row panels
 * dequantized once per token block and swept by every tile from L1. */
#define EX_TB 240

/* The weight lines (and the rows' scales and biases) of the panel after
 * this one. A panel's rows are a row length apart, a pattern the hardware
 * prefetchers do not follow; a prompt's many tiles hide the misses, but a
 * batch of a few dozen decoded tokens waited on them (a fifth of the step
 * at 32 sequences). */
static void ex_prefetch(const loom_qmat *w, int p0, int R, int k0, int len) {
    const size_t off = (size_t)k0 * w->bits / 8, bytes = (size_t)len * w->bits / 8;
    const int ng = w->n / w->group, g = k0 / w->group;
    for (int i = 0; i < R; i++) {
        const char *row = (const char *)qrow(w, p0 + i) + off;
        for (size_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
        _mm_prefetch((const char *)(w->scales + (size_t)(p0 + i) * ng + g), _MM_HINT_T0);
        _mm_prefetch((const char *)(w->biases + (size_t)(p0 + i) * ng + g), _MM_HINT_T0);
    }
}

/* xp[tile][k][t % TT_MAX] = x[t][k0 + k] for tn tokens and len (% 16 == 0)
 * columns: 16 x 16 transposes of 12 tokens' rows (a scalar copy was a
 * tenth of a 32-token step). */
static void ex_pack(float *xp, const float *x, size_t lx, int tn, int k0, int len) {
    for (int t0 = 0; t0 < tn; t0 += TT_MAX) {
        int tt = LOOM_MIN(TT_MAX, tn - t0);
        float *d = xp + (size_t)(t0 / TT_MAX) * TT_MAX * KC_EXACT;
        for (int c = 0; c < len; c += 16) {
            __m512i r[16];
            for (int t = 0; t < 16; t++)
                r[t] = t < tt ? _mm512_loadu_si512(x + (size_t)(t0 + t) * lx + k0 + c)
                              : _mm512_setzero_si512();
            loom_tr16(r);
            for (int m = 0; m < 16; m++)
                _mm512_mask_storeu_epi32(d + (size_t)(c + m) * TT_MAX, 0x0FFF, r[m]);
        }
    }
}

static void ex_gemm(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T, int r0,
                    int r1) {
    float pan[KC_EXACT * PR] __attribute__((aligned(64)));
    float xp[EX_TB * KC_EXACT] __attribute__((aligned(64)));
    const size_t ly = (size_t)ldy, lx = (size_t)ldx;
    for (int t0 = 0; t0 < T; t0 += EX_TB) {
        int tn = LOOM_MIN(EX_TB, T - t0);
        for (int k0 = 0; k0 < w->n; k0 += KC_EXACT) {
            int len = LOOM_MIN(KC_EXACT, w->n - k0), first = k0 == 0;
            ex_pack(xp, x + (size_t)t0 * lx, lx, tn, k0, len);
            for (int p0 = r0; p0 < r1; p0 += PR) {
                int R = LOOM_MIN(PR, r1 - p0);
                __mmask16 rm = mask16(R);
                if (p0 + PR < r1) ex_prefetch(w, p0 + PR, LOOM_MIN(PR, r1 - p0 - PR), k0, len);
                else if (k0 + KC_EXACT < w->n)
                    ex_prefetch(w, r0, LOOM_MIN(PR, r1 - r0), k0 + KC_EXACT,
                                LOOM_MIN(KC_EXACT, w->n - k0 - KC_EXACT));
                ex_panel(pan, w, p0, R, k0, len);
                for (int t = 0; t < tn; t += TT_MAX) {
                    float *yt = y + (size_t)(t0 + t) * ly + p0;
                    const float *xt = xp + (size_t)t * KC_EXACT;
                    switch (LOOM_MIN(TT_MAX, tn - t)) {
#define EX_CASE(n) case n: ex_tile(yt, ly, xt, pan, len, first, rm, n); break;
                    EX_CASE(12) EX_CASE(11) EX_CASE(10) EX_CASE(9) EX_CASE(8) EX_CASE(7)
                    EX_CASE(6) EX_CASE(5) EX_CASE(4) EX_CASE(3) EX_CASE(2) EX_CASE(1)
#undef EX_CASE
                    default: break;
                    }
                }
            }
        }
    }
}

/* The kernels of one arithmetic (exact or --fast) by token count. */
typedef void q_many_fn(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T, int r0,
                       int r1);
typedef struct q_path {
    q_many_fn *gemm;   /* more than SMALL_T tokens: panels */
    q_many_fn *multi;  /* 1 .. SMALL_T tokens: each row once for all */
} q_path;

static void q_dispatch(const q_path *p, float *y, int ldy, const float *x, int ldx,
                       const loom_qmat *w, int T, int r0, int r1) {
    if (!shape_ok(w)) loom_kernels_avx2.matmul_q(y, ldy, x, ldx, w, T, r0, r1);
    else if (T > SMALL_T) p->gemm(y, ldy, x, ldx, w, T, r0, r1);
    else if (w->n <= SMALL_T_MAXN) p->multi(y, ldy, x, ldx, w, T, r0, r1);
    else /* long rows: the copies of x for T tokens would not fit the stack */
        for (int t = 0; t < T; t++)
            p->multi(y + (size_t)t * ldy, ldy, x + (size_t)t * ldx, ldx, w, 1, r0, r1);
}

static void matmul_q(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T, int r0,
                     int r1) {
    static const q_path exact = {ex_gemm, ex_matvec_multi};
    q_dispatch(&exact, y, ldy, x, ldx, w, T, r0, r1);
}

/* ---- fast: activations rounded to int8 ----------------------------------- */

/* One token: block j's 64 bytes at xq + j * st * 64, sx[j * st] per
 * 64-block, xsg[g * st] = sum over the group's blocks of sx * sum(qx)
 * (st = 1 for one token, TT_MAX to write straight into a tile). split:
 * 4-bit decode order (each block as even | odd columns) instead of column
 * order. */
static void fq_prep(int8_t *xq, float *sx, float *xsg, size_t st, const float *x,
                    const loom_qmat *w, int split) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const int nb = w->n / XBLK, per = w->group / XBLK;
    for (int j = 0; j < nb; j++) {
        const float *xj = x + (size_t)j * XBLK;
        __m512 v[4];
        __m512 m = _mm512_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm512_loadu_ps(xj + 16 * i);
            m = _mm512_max_ps(m, _mm512_abs_ps(v[i]));
        }
        float amax = _mm512_reduce_max_ps(m);
        float inv = amax > 0 ? 127.0f / amax : 0.0f;
        float sxj = amax / 127.0f;
        sx[j * st] = sxj;
        __m512 iv = _mm512_set1_ps(inv);
        __m512i q[4], s = _mm512_setzero_si512();
        for (int i = 0; i < 4; i++) {
            q[i] = _mm512_cvtps_epi32(_mm512_mul_ps(v[i], iv)); /* nearest even */
            s = _mm512_add_epi32(s, q[i]);
        }
        if (split) {
            __m512i e0 = _mm512_permutex2var_epi32(q[0], ev, q[1]);
            __m512i e1 = _mm512_permutex2var_epi32(q[2], ev, q[3]);
            __m512i o0 = _mm512_permutex2var_epi32(q[0], od, q[1]);
            __m512i o1 = _mm512_permutex2var_epi32(q[2], od, q[3]);
            q[0] = e0, q[1] = e1, q[2] = o0, q[3] = o1;
        }
        if (split) {
            /* Pairs of blocks as [evens of j, evens of j + 1, odds of j,
             * odds of j + 1] (a last unpaired block: [evens, odds]) to
             * match two blocks of nibbles split low | high. */
            int h = j % 2, lone = j == nb - 1 && !h;
            int8_t *ev8 = xq + (size_t)(j - h) * XBLK + 32 * h;
            int8_t *od8 = lone ? ev8 + 32 : ev8 + 64;
            _mm_storeu_si128((__m128i *)ev8, _mm512_cvtepi32_epi8(q[0]));
            _mm_storeu_si128((__m128i *)(ev8 + 16), _mm512_cvtepi32_epi8(q[1]));
            _mm_storeu_si128((__m128i *)od8, _mm512_cvtepi32_epi8(q[2]));
            _mm_storeu_si128((__m128i *)(od8 + 16), _mm512_cvtepi32_epi8(q[3]));
        } else {
            for (int i = 0; i < 4; i++)
                _mm_storeu_si128((__m128i *)(xq + (size_t)j * st * XBLK + 16 * i),
                                 _mm512_cvtepi32_epi8(q[i]));
        }
        float bs = sxj * (float)_mm512_reduce_add_epi32(s);
        if ((j & (per - 1)) == 0) xsg[j / per * st] = bs; /* per is a power of two */
        else xsg[j / per * st] += bs;
    }
}

/* Rows [r0, r1) for T (1 .. SMALL_T) tokens' rounded activations (fq_prep,
 * split for 4-bit): each row's bytes are loaded and unpacked once per
 * block and fed to every token's VPDPBUSD; scales sw * sx per chunk of 16
 * blocks in registers and two float chains per token. A token's outputs
 * do not depend on T: int8 rounding makes --fast chaotic, and a batched
 * sequence should not drift from the same request alone. */
INLINE void fq_rows_multi(float *y, size_t ldy, const int8_t *xq, const float *sx, const float *xsg,
                          const loom_qmat *w, int r0, int r1, const int T, const int bits) {
    const int n = w->n, ng = n / w->group, nb = n / XBLK, gs = __builtin_ctz(w->group / XBLK);
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i pick = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = qrow(w, r);
        const uint16_t *scr = w->scales + (size_t)r * ng;
        __m512 facc[SMALL_T], facc2[SMALL_T], csv[SMALL_T];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            facc[t] = bias_dot(w->biases + (size_t)r * ng, xsg + (size_t)t * MAXB, ng, w->f16);
            facc2[t] = _mm512_setzero_ps();
        }
        for (int c0 = 0; c0 < nb; c0 += 16) {
            int cnt = LOOM_MIN(16, nb - c0);
            __m512 scv = block_scales(scr, c0, cnt, gs, w->f16);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                csv[t] = _mm512_mul_ps(scv, _mm512_maskz_loadu_ps(mask16(cnt), sx + (size_t)t * MAXB + c0));
            int jj = 0;
            if (bits == 4) {
                for (; jj + 2 <= cnt; jj += 2) {
                    int j = c0 + jj;
                    _mm_prefetch((const char *)row + (size_t)j * 32 + PF_FAST4, _MM_HINT_T0);
                    __m512i v = _mm512_loadu_si512(row + (size_t)j * 32);
                    __m512i lo = _mm512_and_si512(v, m4);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    __m512i sel = _mm512_add_epi32(pick, _mm512_set1_epi32(jj));
#pragma GCC unroll 8
                    for (int t = 0; t < T; t++) {
                        const int8_t *xt = xq + (size_t)t * n + (size_t)j * XBLK;
                        __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xt));
                        acc = _mm512_dpbusd_epi32(acc, hi, _mm512_loadu_si512(xt + 64));
                        __m512 sc2 = _mm512_permutexvar_ps(sel, csv[t]);
                        if (jj % 4) facc2[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sc2, facc2[t]);
                        else facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), sc2, facc[t]);
                    }
                }
            }
            for (; jj < cnt; jj++) {
                int j = c0 + jj;
                _mm_prefetch((const char *)row + (size_t)j * 8 * bits + PF_AHEAD(bits), _MM_HINT_T0);
                __m512i wv = bits == 8 ? _mm512_loadu_si512(row + (size_t)j * 64)
                                       : unpack4_split(row + (size_t)j * 32);
                __m512i sel = _mm512_set1_epi32(jj);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    __m512i acc = _mm512_dpbusd_epi32(
                        _mm512_setzero_si512(), wv, _mm512_loadu_si512(xq + (size_t)t * n + (size_t)j * XBLK));
                    __m512 v = _mm512_cvtepi32_ps(acc), sj = _mm512_permutexvar_ps(sel, csv[t]);
                    if (jj % 2) facc2[t] = _mm512_fmadd_ps(v, sj, facc2[t]);
                    else facc[t] = _mm512_fmadd_ps(v, sj, facc[t]);
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            y[(size_t)t * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(facc[t], facc2[t]));
    }
}

static void fq_matvec_multi(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T,
                            int r0, int r1) {
    int8_t xq[T * w->n] __attribute__((aligned(64)));
    float sx[T * MAXB], xsg[T * MAXB];
    for (int t = 0; t < T; t++)
        fq_prep(xq + (size_t)t * w->n, sx + (size_t)t * MAXB, xsg + (size_t)t * MAXB, 1,
                x + (size_t)t * (size_t)ldx, w, w->bits == 4);
    const size_t ly = (size_t)ldy;
    switch (T * 16 + w->bits) {
#define FQ_MULTI(n)                                                                 \
    case n * 16 + 8: fq_rows_multi(y, ly, xq, sx, xsg, w, r0, r1, n, 8); break;     \
    case n * 16 + 4: fq_rows_multi(y, ly, xq, sx, xsg, w, r0, r1, n, 4); break;
    FQ_MULTI(1) FQ_MULTI(2) FQ_MULTI(3) FQ_MULTI(4) FQ_MULTI(5) FQ_MULTI(6) FQ_MULTI(7) FQ_MULTI(8)
#undef FQ_MULTI
    default: break;
    }
}

/* pan[(k / 4) * 64 + i * 4 + k % 4] = u8 field of row p0 + i, column k0 + k
 * (zero past R); swv/bwv[b][i]: that row's scale / bias for block b. */
static void fq_panel(uint8_t *pan, float *swv, float *bwv, const loom_qmat *w, int p0, int R,
                     int k0, int len) {
    const int ng = w->n / w->group;
    for (int c = 0, b = 0; c < len; c += XBLK, b++) {
        int k = k0 + c, g = k / w->group;
        __m512i rows[16];
        for (int i = 0; i < PR; i++) {
            if (i >= R) {
                rows[i] = _mm512_setzero_si512();
                swv[b * PR + i] = bwv[b * PR + i] = 0;
                continue;
            }
            size_t si = (size_t)(p0 + i) * ng + g;
            swv[b * PR + i] = w->f16 ? _cvtsh_ss(w->scales[si]) : loom_bf16_to_f32(w->scales[si]);
            bwv[b * PR + i] = w->f16 ? _cvtsh_ss(w->biases[si]) : loom_bf16_to_f32(w->biases[si]);
            const uint8_t *row = qrow(w, p0 + i);
            rows[i] = w->bits == 8 ? _mm512_loadu_si512(row + k) : unpack4_natural(row + k / 2);
        }
        loom_tr16(rows);
        for (int m = 0; m < 16; m++)
            _mm512_store_si512((__m512i *)(pan + (size_t)(c / 4 + m) * 64), rows[m]);
    }
}

/* *acc += wv (u8) . {*x x 16} (s8), the broadcast folded into the
 * instruction (GCC otherwise emits a separate broadcast and register
 * copies around each VPDPBUSD). */
INLINE void dpbusd_bcast(__m512i *acc, __m512i wv, const int32_t *x) {
    __asm__("vpdpbusd %[x]%{1to16%}, %[w], %[a]" : [a] "+v"(*acc) : [w] "v"(wv), [x] "m"(*x));
}

/* y[t][p0 + i] (+)= the panel's blocks over TT tokens' rounded
 * activations. The tile's activations are packed [block][TT_MAX][64
 * bytes], its sx [block][TT_MAX] and xsg [group][TT_MAX], so each
 * broadcast comes from one pointer. */
INLINE void fq_tile(float *y, size_t ldy, const int32_t *xq, const float *sx, const float *xsg,
                    const uint8_t *pan, const float *swv, const float *bwv, int j0, int nblk, int per,
                    int first, __mmask16 rm, const int TT) {
    __m512 facc[TT_MAX];
    __m512i acc[TT_MAX];
#pragma GCC unroll 12
    for (int t = 0; t < TT; t++)
        facc[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(rm, y + t * ldy);
    for (int b = 0; b < nblk; b++) {
        int j = j0 + b;
#pragma GCC unroll 12
        for (int t = 0; t < TT; t++) acc[t] = _mm512_setzero_si512();
        const int32_t *xb = xq + (size_t)b * TT_MAX * (XBLK / 4);
        for (int s = 0; s < XBLK / 4; s++) {
            __m512i wv = _mm512_load_si512((const __m512i *)(pan + (size_t)(b * 16 + s) * 64));
#pragma GCC unroll 12
            for (int t = 0; t < TT; t++) dpbusd_bcast(&acc[t], wv, &xb[t * (XBLK / 4) + s]);
        }
        __m512 sw = _mm512_load_ps(swv + b * PR);
#pragma GCC unroll 12
        for (int t = 0; t < TT; t++)
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[t]),
                                      _mm512_mul_ps(sw, _mm512_set1_ps(sx[j * TT_MAX + t])), facc[t]);
        if ((j & (per - 1)) == 0) { /* per is a power of two */
            __m512 bw = _mm512_load_ps(bwv + b * PR);
            const float *xg = xsg + (size_t)(j / per) * TT_MAX;
#pragma GCC unroll 12
            for (int t = 0; t < TT; t++)
                facc[t] = _mm512_fmadd_ps(bw, _mm512_set1_ps(xg[t]), facc[t]);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < TT; t++) _mm512_mask_storeu_ps(y + t * ldy, rm, facc[t]);
}

/* Loop order: token blocks (rounded and packed once, at most XQ_BYTES or
 * one tile), then 16-row panels, then column panels re-packed once per
 * token block and swept by every tile. */
static void fq_gemm(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T, int r0,
                    int r1) {
    const int n = w->n, nb = n / XBLK, ng = n / w->group, per = w->group / XBLK;
    const int TB = LOOM_MIN(T, LOOM_MAX(TT_MAX, XQ_BYTES / n / TT_MAX * TT_MAX));
    int32_t xq[TT_MAX * MAXN / 4] __attribute__((aligned(64)));
    float sx[TT_MAX * MAXB], xsg[TT_MAX * MAXB];
    uint8_t pan[KC_FAST * PR] __attribute__((aligned(64)));
    float swv[KC_FAST / XBLK * PR] __attribute__((aligned(64)));
    float bwv[KC_FAST / XBLK * PR] __attribute__((aligned(64)));
    const size_t ly = (size_t)ldy, tile_q = (size_t)n / 4 * TT_MAX;
    for (int t0 = 0; t0 < T; t0 += TB) {
        int tn = LOOM_MIN(TB, T - t0);
        for (int t = 0; t < tn; t++) {
            size_t tile = (size_t)(t / TT_MAX), lane = (size_t)(t % TT_MAX);
            fq_prep((int8_t *)(xq + tile * tile_q + lane * (XBLK / 4)),
                    sx + tile * nb * TT_MAX + lane, xsg + tile * ng * TT_MAX + lane, TT_MAX,
                    x + (size_t)(t0 + t) * ldx, w, 0);
        }
        for (int p0 = r0; p0 < r1; p0 += PR) {
            int R = LOOM_MIN(PR, r1 - p0);
            __mmask16 rm = mask16(R);
            for (int k0 = 0; k0 < n; k0 += KC_FAST) {
                int len = LOOM_MIN(KC_FAST, n - k0), first = k0 == 0;
                fq_panel(pan, swv, bwv, w, p0, R, k0, len);
                for (int t = 0; t < tn; t += TT_MAX) {
                    float *yt = y + (size_t)(t0 + t) * ly + p0;
                    size_t tile = (size_t)(t / TT_MAX);
                    const int32_t *q = xq + tile * tile_q + (size_t)k0 / 4 * TT_MAX;
                    const float *s = sx + tile * nb * TT_MAX, *g = xsg + tile * ng * TT_MAX;
                    switch (LOOM_MIN(TT_MAX, tn - t)) {
#define FQ_CASE(c) case c: fq_tile(yt, ly, q, s, g, pan, swv, bwv, k0 / XBLK, len / XBLK, per, \
                                   first, rm, c); break;
                    FQ_CASE(12) FQ_CASE(11) FQ_CASE(10) FQ_CASE(9) FQ_CASE(8) FQ_CASE(7)
                    FQ_CASE(6) FQ_CASE(5) FQ_CASE(4) FQ_CASE(3) FQ_CASE(2) FQ_CASE(1)
#undef FQ_CASE
                    default: break;
                    }
                }
            }
        }
    }
}

/* ---- fast, 16-row interleaved matrices (loom_q_interleave) ------------- */

/* In this layout each VPDPBUSD multiplies 16 rows by one broadcast run of
 * 4 activations, so lane i sums row i: the block's integer sums are scaled
 * once per 16 rows instead of once per row (MLX's row-major layout needs a
 * cvt, a permute and an FMA per row and block), and no lanes are reduced.
 * Decode becomes a read of one sequential stream at memory speed. The
 * integer sums are exact in any order, and each token's float steps do not
 * depend on the others', so a token gets the same bits alone or batched. */
#define IL_T 8          /* tokens per pass over a row block */
#define IL_RB 4         /* row blocks per chunk when several token passes reuse them */
/* 4-bit: bytes ahead of the stream to prefetch (+13% decode; 8-bit saw no
 * clear change) */
#define IL_PF 4096

/* Rows 16 rb + [l0, l1) for T tokens: xq (T rows of n int8, column order),
 * sx[t * nb + j] and xsg[t * ng + g] as fq_prep leaves them. Below 4
 * tokens two integer chains per token hide VPDPBUSD's latency. */
INLINE void il_block(float *y, size_t ldy, const int8_t *xq, const float *sx, const float *xsg,
                     const loom_qmat *w, int rb, int l0, int l1, const int T, const int bits) {
    const int n = w->n, ng = n / w->group, per = w->group / XBLK, nb = n / XBLK, two = T < 4;
    const size_t vbytes = (size_t)16 * XBLK * bits / 8; /* one block of 16 rows */
    const size_t gbytes = (size_t)per * vbytes + 64;   /* + 16 scales and 16 biases */
    const uint8_t *blk = (const uint8_t *)w->w + (size_t)rb * ng * gbytes;
    const __m512i m4 = _mm512_set1_epi8(15);
    __m512 acc[IL_T];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        const uint8_t *gp = blk + (size_t)g * gbytes;
        const uint16_t *par = (const uint16_t *)gp;
        __m512 sc = params16(par, 16, w->f16), bi = params16(par + 16, 16, w->f16);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            acc[t] = _mm512_fmadd_ps(bi, _mm512_set1_ps(xsg[t * ng + g]), acc[t]);
        for (int j = g * per; j < (g + 1) * per; j++) {
            const uint8_t *v = gp + 64 + (size_t)(j - g * per) * vbytes;
            __m512i ia[IL_T], ib[IL_T];
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) ia[t] = ib[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                __m512i wa, wb;
                if (IL_PF && bits == 4)
                    _mm_prefetch((const char *)v + (size_t)c * 64 + IL_PF, _MM_HINT_T0);
                if (bits == 8) {
                    wa = _mm512_loadu_si512(v + 128 * c);
                    wb = _mm512_loadu_si512(v + 128 * c + 64);
                } else {
                    __m512i wv = _mm512_loadu_si512(v + 64 * c);
                    wa = _mm512_and_si512(wv, m4);
                    wb = _mm512_and_si512(_mm512_srli_epi16(wv, 4), m4);
                }
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const int8_t *xt = xq + (size_t)t * n + (size_t)j * XBLK + 8 * c;
                    int32_t xa, xb;
                    memcpy(&xa, xt, 4);
                    memcpy(&xb, xt + 4, 4);
                    ia[t] = _mm512_dpbusd_epi32(ia[t], wa, _mm512_set1_epi32(xa));
                    if (two) ib[t] = _mm512_dpbusd_epi32(ib[t], wb, _mm512_set1_epi32(xb));
                    else ia[t] = _mm512_dpbusd_epi32(ia[t], wb, _mm512_set1_epi32(xb));
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512i is = two ? _mm512_add_epi32(ia[t], ib[t]) : ia[t];
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),
                                         _mm512_mul_ps(sc, _mm512_set1_ps(sx[t * nb + j])), acc[t]);
            }
        }
    }
    __mmask16 m = (__mmask16)(mask16(l1) & ~mask16(l0));
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) _mm512_mask_storeu_ps(y + t * ldy + (size_t)rb * 16, m, acc[t]);
}

static void il_block_any(float *y, size_t ldy, const int8_t *xq, const float *sx,
                         const float *xsg, const loom_qmat *w, int rb, int l0, int l1, int T) {
    switch (T * 16 + w->bits) {
#define IL_CASE(t)                                                                         \
    case t * 16 + 8: il_block(y, ldy, xq, sx, xsg, w, rb, l0, l1, t, 8); break;          \
    case t * 16 + 4: il_block(y, ldy, xq, sx, xsg, w, rb, l0, l1, t, 4); break;
    IL_CASE(1) IL_CASE(2) IL_CASE(3) IL_CASE(4) IL_CASE(5) IL_CASE(6) IL_CASE(7) IL_CASE(8)
#undef IL_CASE
    default: break;
    }
}

/* T tokens (rounded: xq, sx, xsg as il_block reads them) x rows [r0, r1):
 * chunks of IL_RB row blocks (L1) swept by every IL_T-token pass. */
static void il_rows(float *y, size_t ldy, const int8_t *xq, const float *sx, const float *xsg,
                    const loom_qmat *w, int T, int r0, int r1) {
    const int n = w->n, nb = n / XBLK, ng = n / w->group;
    for (int c0 = r0 / 16; c0 * 16 < r1; c0 += IL_RB)
        for (int t0 = 0; t0 < T; t0 += IL_T)
            for (int rb = c0; rb < c0 + IL_RB && rb * 16 < r1; rb++)
                il_block_any(y + (size_t)t0 * ldy, ldy, xq + (size_t)t0 * n,
                             sx + (size_t)t0 * nb, xsg + (size_t)t0 * ng, w, rb,
                             LOOM_MAX(r0 - rb * 16, 0), LOOM_MIN(r1 - rb * 16, 16),
                             LOOM_MIN(IL_T, T - t0));
}

static void il_prep(int8_t *xq, float *sx, float *xsg, const float *x, size_t ldx,
                    const loom_qmat *w, int T) {
    const int n = w->n, nb = n / XBLK, ng = n / w->group;
    for (int t = 0; t < T; t++)
        fq_prep(xq + (size_t)t * n, sx + (size_t)t * nb, xsg + (size_t)t * ng, 1,
                x + (size_t)t * ldx, w, 0);
}

/* T tokens of x rounded for an interleaved matrix once, for all its row
 * slices: sx (T x nb), xsg (T x ng), then xq (T x n int8). */
static size_t il_prep_bytes(const loom_qmat *w, int T) {
    return (size_t)T * w->n + (size_t)T * (w->n / XBLK + w->n / w->group) * sizeof(float);
}

static void il_prep_buf(void *buf, const float *x, int ldx, const loom_qmat *w, int T) {
    float *sx = buf, *xsg = sx + (size_t)T * (w->n / XBLK);
    il_prep((int8_t *)(xsg + (size_t)T * (w->n / w->group)), sx, xsg, x, (size_t)ldx, w, T);
}

static void il_matmul_prep(float *y, int ldy, const void *buf, const loom_qmat *w, int T, int r0,
                           int r1) {
    const float *sx = buf, *xsg = sx + (size_t)T * (w->n / XBLK);
    il_rows(y, (size_t)ldy, (const int8_t *)(xsg + (size_t)T * (w->n / w->group)), sx, xsg, w, T,
            r0, r1);
}

/* Rows [r0, r1) of an interleaved matrix. A prompt rounds all its tokens
 * once (heap) so each row chunk serves them all from L1; without the
 * memory for that, and for decode, IL_T tokens at a time on the stack. */
static void il_matmul(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T,
                      int r0, int r1) {
    const size_t ly = (size_t)ldy, lx = (size_t)ldx;
    if (T > IL_T) {
        void *buf = malloc(il_prep_bytes(w, T)); /* every byte is written */
        if (buf) {
            il_prep_buf(buf, x, ldx, w, T);
            il_matmul_prep(y, ldy, buf, w, T, r0, r1);
            free(buf);
            return;
        }
    }
    int8_t xq[IL_T * LOOM_Q_IL_MAXN] __attribute__((aligned(64)));
    float sx[IL_T * (LOOM_Q_IL_MAXN / XBLK)], xsg[IL_T * (LOOM_Q_IL_MAXN / XBLK)];
    for (int t0 = 0; t0 < T; t0 += IL_T) {
        int tt = LOOM_MIN(IL_T, T - t0);
        il_prep(xq, sx, xsg, x + (size_t)t0 * lx, lx, w, tt);
        il_rows(y + (size_t)t0 * ly, ly, xq, sx, xsg, w, tt, r0, r1);
    }
}

static void matmul_q_fast(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T,
                          int r0, int r1) {
    static const q_path fast = {fq_gemm, fq_matvec_multi};
    if (w->il16) il_matmul(y, ldy, x, ldx, w, T, r0, r1);
    else q_dispatch(&fast, y, ldy, x, ldx, w, T, r0, r1);
}

const loom_kernels loom_kernels_avx512_q = {.name = "avx512-q", .matmul_q = matmul_q};
const loom_kernels loom_kernels_avx512_q_fast = {.name = "avx512-q-fast", .matmul_q = matmul_q_fast,
                                                 .q_il16 = 1, .q8_prompt_fast = 1, .q_prep_bytes = il_prep_bytes,
                                                 .q_prep = il_prep_buf,
                                                 .matmul_q_prep = il_matmul_prep};
