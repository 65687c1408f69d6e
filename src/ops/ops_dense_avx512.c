/* ops_dense_avx512: matmuls over f32/f16/bf16 weights with AVX-512, and
 * attention's weighted sum of values (attn_pv, at the end).
 * Compiled with the AVX-512 flags (Makefile); only reached after
 * loom_kernels_get() checked the CPU. Same contract as the AVX2 entries
 * (ops.h): y[t*ldy + r] = x_t . w_r for rows [r0, r1).
 *
 * Exact entries: one register tile of 4 rows x up to 6 tokens (24 zmm
 * accumulators), vectorized along the columns: lane l of acc[r][t] sums
 * x[t][k] w[r][k] over k = l (mod 16) in order, then a fixed reduction
 * tree. Every output is that same sum whatever T and whatever tile it
 * falls in, so a prompt computed in one forward, in chunks, or a token
 * among a batch of decodes (or an expert's share of tokens) gets bit for
 * bit the same matmul outputs; the engine's prefix cache relies on it. (A
 * packed broadcast GEMM, 32 rows x 12 tokens, was no faster at T = 512,
 * both at 93-95% of the FMA peak, but sums in another order than any
 * matvec and ran 2-3x slower for 4-token batches; --fast uses one below.)
 *   - The rows a tile reads come from memory once (decode, and the first
 *     token block of a prefill), with software prefetch into L2; the
 *     hardware prefetchers ramp up too slowly on 2 KiB rows.
 *   - Prefill runs token blocks of at most 192 KiB of x (L2), and within
 *     one block every 4-row tile sweeps the block's tokens 6 at a time
 *     with its rows in L1, each weight widened once per 6 tokens.
 *
 * --fast (bf16 weights only): x is rounded to bf16 (nearest even,
 * VCVTNE2PS2BF16) and VDPBF16PS multiplies pairs of bf16 values into f32
 * sums, twice the FMA rate on Zen 4 but half of it on the Intel Xeon
 * measured (family 6, model 207): ops.c takes these entries for --fast
 * only where loom_avx512_bf16_gain finds them faster. For T >= T_SMALL a block of up to 384 rows x
 * 512 columns of w is transposed once into panels of 32 rows of 32-bit
 * column pairs, [k/2][32] (L2), each token block's x is rounded beside it
 * (L1), and a 32-row x 12-token register tile (24 accumulators) runs with
 * x broadcast; smaller T streams rows four at a time. ops_dense_fast_ref.c
 * is its reference; its sums are in another order for T < T_SMALL.
 *
 * Measured peaks on this machine class (Zen 4, one core): 118 GFLOP/s with
 * zmm FMA, 233 GFLOP/s with VDPBF16PS (12 independent chains). */
#include <immintrin.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "ops/ops.h"
#include "ops/ops_avx512.h"

#define INLINE static inline __attribute__((always_inline))

enum { DT_F32, DT_F16, DT_BF16 };

/* Prefetch distance per row into L2; see ops_avx2.c for the measurements
 * behind it (short rows need their next row's start in flight early). */
#define PF_BYTES 2048

INLINE void prefetch_rows(const void *w, const size_t *base, int R, size_t n, size_t k,
                          size_t sz) {
    size_t kp = k + PF_BYTES / sz;
    size_t off = kp < n ? kp : kp - n + (size_t)R * n;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm_prefetch((const char *)w + (base[r] + off) * sz, _MM_HINT_T2);
}

INLINE __mmask32 mask32(size_t rem) { return rem >= 32 ? 0xffffffffu : (1u << rem) - 1; }
INLINE __mmask16 mask16(size_t rem) {
    return rem >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << rem) - 1);
}

/* ---- exact: f32 / f16 / bf16 weights, f32 activations ------------------------------ */

#define TR 4 /* rows per register tile */
#define TT_MAX 6 /* tokens per register tile */

/* 16 weights from element i of w as f32; m masks those that exist. */
INLINE __m512 wload16(const void *w, size_t i, __mmask16 m, int full, int dt) {
    if (dt == DT_F32)
        return full ? _mm512_loadu_ps((const float *)w + i) : _mm512_maskz_loadu_ps(m, (const float *)w + i);
    const uint16_t *p = (const uint16_t *)w + i;
    __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    if (dt == DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* {sum(a), sum(b), sum(c), sum(d)}, each over its 16 lanes by the same
 * tree: quarters (q0 + q2) + (q1 + q3), then lanes (l0 + l2) + (l1 + l3).
 * A vector's sum does not depend on its position or its neighbours. */
INLINE __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4e));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xb1));
    return _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, s));
}

/* Register tile: rows [0, R) of w (R <= TR; w at the tile's first row,
 * rows n apart) x TT tokens of x (ldx apart) into y[t*ldy + r]. Missing
 * rows repeat the last one and are not stored. With pf, the rows are
 * prefetched PF_BYTES ahead, running on into the next TR rows. */
INLINE void ktile(float *y, size_t ldy, const float *x, size_t ldx, const void *w, size_t n,
                  int R, int TT, int pf, int dt) {
    const size_t sz = dt == DT_F32 ? 4 : 2;
    __m512 acc[TR][TT_MAX];
    size_t base[TR];
#pragma GCC unroll 4
    for (int r = 0; r < TR; r++) {
        base[r] = (size_t)(r < R ? r : R - 1) * n;
#pragma GCC unroll 6
        for (int t = 0; t < TT; t++) acc[r][t] = _mm512_setzero_ps();
    }
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        if (pf && ((k * sz) & 63) == 0) prefetch_rows(w, base, R, n, k, sz);
        __m512 wv[TR];
#pragma GCC unroll 4
        for (int r = 0; r < TR; r++) wv[r] = wload16(w, base[r] + k, 0xffff, 1, dt);
#pragma GCC unroll 6
        for (int t = 0; t < TT; t++) {
            __m512 xv = _mm512_loadu_ps(x + t * ldx + k);
#pragma GCC unroll 4
            for (int r = 0; r < TR; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
    if (k < n) {
        __mmask16 m = mask16(n - k);
        __m512 wv[TR];
#pragma GCC unroll 4
        for (int r = 0; r < TR; r++) wv[r] = wload16(w, base[r] + k, m, 0, dt);
#pragma GCC unroll 6
        for (int t = 0; t < TT; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + t * ldx + k);
#pragma GCC unroll 4
            for (int r = 0; r < TR; r++) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < TT; t++) {
        __m128 v = reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
        if (R == TR) _mm_storeu_ps(y + t * ldy, v);
        else _mm_mask_storeu_ps(y + t * ldy, (__mmask8)((1u << R) - 1), v);
    }
}

static void ktile_any(float *y, size_t ldy, const float *x, size_t ldx, const void *w, size_t n,
                      int R, int TT, int pf, int dt) {
#define C(tt)                                                                       \
    case tt:                                                                        \
        if (dt == DT_F32) ktile(y, ldy, x, ldx, w, n, R, tt, pf, DT_F32);           \
        else if (dt == DT_F16) ktile(y, ldy, x, ldx, w, n, R, tt, pf, DT_F16);      \
        else ktile(y, ldy, x, ldx, w, n, R, tt, pf, DT_BF16);                       \
        break;
    switch (TT) { C(1) C(2) C(3) C(4) C(5) C(6) default: break; }
#undef C
}

/* Tokens per block: at most 192 KiB of x, so a block stays in L2 while
 * every row tile sweeps it. */
INLINE int kblock(size_t n) {
    size_t tb = ((size_t)48 << 10) / (n ? n : 1) / TT_MAX * TT_MAX;
    return (int)LOOM_MAX((size_t)TT_MAX, LOOM_MIN(tb, (size_t)1 << 20));
}

static void matmul_exact(float *y, int ldy, const float *x, int ldx, const void *w, int n_, int T,
                         int r0, int r1, int dt) {
    const size_t n = (size_t)n_, ly = (size_t)ldy, lx = (size_t)ldx, sz = dt == DT_F32 ? 4 : 2;
    const int TB = kblock(n);
    /* The loop prefetches PF_BYTES ahead; the head of the first rows would
     * otherwise arrive one demand miss at a time (a task of the model's row
     * split is only 256-768 KiB at decode). */
    for (int i = 0; i < TR && r0 + i < r1; i++)
        for (size_t b = 0; b < LOOM_MIN((size_t)PF_BYTES, n * sz); b += 64)
            _mm_prefetch((const char *)w + (size_t)(r0 + i) * n * sz + b, _MM_HINT_T2);
    for (int t0 = 0; t0 < T; t0 += TB) {
        int t1 = LOOM_MIN(T, t0 + TB);
        for (int r = r0; r < r1; r += TR) {
            const char *wr = (const char *)w + (size_t)r * n * sz;
            int R = LOOM_MIN(TR, r1 - r);
            for (int t = t0; t < t1; t += TT_MAX)
                ktile_any(y + (size_t)t * ly + r, ly, x + (size_t)t * lx, lx, wr, n, R,
                          LOOM_MIN(TT_MAX, t1 - t), t0 == 0 && t == t0, dt);
        }
    }
}

/* ---- --fast: bf16 weights, activations rounded to bf16 ----------------------------- */

#define MR 32  /* rows per panel: two zmm */
#define NT 12  /* tokens per register tile: 24 accumulators */
/* Rows per packed block: 384 KiB, in L2. x is read again (from L3: 2-6 MiB
 * at T = 512) for every block, so the block covers a whole task of the
 * model's row split where it can (128-384 rows for Qwen3-0.6B on 2
 * threads); at 128 rows the GEMM spent 8% of its time rounding x. The
 * panels hold bf16 pairs: 512 columns are a 32 KiB panel. */
#define KCF 512
#define MCF 384

/* The same for --fast: bf16 rows packed as 32-bit pairs of columns
 * (2k, 2k + 1) into dst[kp * MR + i], kp < kc/2 rounded up to 16. */
static void pack_panel_pairs(uint32_t *dst, const uint16_t *w, size_t n, int mr, size_t k0, int kc) {
    for (int kb = 0; kb < kc; kb += 32) {
        __mmask32 m = mask32((size_t)(kc - kb));
        for (int h = 0; h < 2; h++) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                int row = h * 16 + i;
                r[i] = row < mr ? _mm512_maskz_loadu_epi16(m, w + (size_t)row * n + k0 + (size_t)kb)
                                : _mm512_setzero_si512();
            }
            loom_tr16(r);
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++)
                _mm512_store_si512((__m512i *)(dst + (size_t)(kb / 2 + j) * MR + h * 16), r[j]);
        }
    }
}

/* Stores (or adds, when add) a tile's accumulators: token t, rows
 * [0, mr) of the panel. */
INLINE void store_tile(float *y, size_t ldy, __m512 acc[][2], int TT, int mr, int add) {
    __mmask16 m0 = mask16((size_t)mr), m1 = mr > 16 ? mask16((size_t)(mr - 16)) : 0;
#pragma GCC unroll 12
    for (int t = 0; t < TT; t++) {
        float *yt = y + (size_t)t * ldy;
        __m512 a = acc[t][0], b = acc[t][1];
        if (add) {
            a = _mm512_add_ps(a, _mm512_maskz_loadu_ps(m0, yt));
            b = _mm512_add_ps(b, _mm512_maskz_loadu_ps(m1, yt + 16));
        }
        _mm512_mask_storeu_ps(yt, m0, a);
        _mm512_mask_storeu_ps(yt + 16, m1, b);
    }
}

/* Register tile, --fast: xp holds bf16 pairs [t][ldp], wp pairs
 * [kp][MR], kp < kcp. */
INLINE void tile_bf16(float *y, size_t ldy, const uint32_t *xp, size_t ldp, const uint32_t *wp,
                      int kcp, int TT, int mr, int add) {
    __m512 acc[NT][2];
#pragma GCC unroll 12
    for (int t = 0; t < TT; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int k = 0; k < kcp; k++) {
        __m512bh w0 = (__m512bh)_mm512_load_si512(wp + (size_t)k * MR);
        __m512bh w1 = (__m512bh)_mm512_load_si512(wp + (size_t)k * MR + 16);
#pragma GCC unroll 12
        for (int t = 0; t < TT; t++) {
            __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xp[t * ldp + k]);
            acc[t][0] = _mm512_dpbf16_ps(acc[t][0], w0, xb);
            acc[t][1] = _mm512_dpbf16_ps(acc[t][1], w1, xb);
        }
    }
    store_tile(y, ldy, acc, TT, mr, add);
}

static void tile_bf16_any(float *y, size_t ldy, const uint32_t *xp, size_t ldp,
                          const uint32_t *wp, int kcp, int TT, int mr, int add) {
    switch (TT) {
#define C(n) case n: tile_bf16(y, ldy, xp, ldp, wp, kcp, n, mr, add); break;
    C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8) C(9) C(10) C(11) C(12)
#undef C
    default: break;
    }
}

/* Token blocks of at most NT, as even as possible, so that the last one
 * is not a lone token (two accumulator chains run at half speed). */
INLINE int token_block(int T, int t0) {
    int left = T - t0, blocks = (left + NT - 1) / NT;
    return (left + blocks - 1) / blocks;
}

static void zero_rows(float *y, size_t ldy, int T, int r0, int r1) {
    for (int t = 0; t < T; t++) memset(y + (size_t)t * ldy + r0, 0, sizeof(float) * (size_t)(r1 - r0));
}

/* Below this many tokens the packing costs more than it saves: --fast
 * streams rows instead. */
#define T_SMALL 16

/* x[0 .. kc) rounded to bf16 pairs, zero-padded to an even count. */
static void round_x_pairs(uint32_t *dst, const float *x, int kc) {
    int k = 0;
    for (; k + 32 <= kc; k += 32)
        _mm512_storeu_si512(dst + k / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16),
                                                                       _mm512_loadu_ps(x + k)));
    if (k < kc) {
        __mmask32 m = mask32((size_t)(kc - k));
        __m512 lo = _mm512_maskz_loadu_ps((__mmask16)m, x + k);
        __m512 hi = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), x + k + 16);
        int words = (kc - k + 1) / 2;
        _mm512_mask_storeu_epi32(dst + k / 2, mask16((size_t)words),
                                 (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* --fast matvec: y[r] from bf16 pairs of x (xp) and the row's columns
 * [k0, k0 + kc). */
INLINE void matvec_bf16_row(float *y, const uint32_t *xp, const uint16_t *w, size_t n,
                            size_t k0, int kc, int r, int add, int pf) {
    __m512 a = _mm512_setzero_ps();
    size_t base = (size_t)r * n, k = 0;
    for (; k + 32 <= (size_t)kc; k += 32) {
        if (pf) prefetch_rows(w, &base, 1, n, k0 + k, 2);
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(w + base + k0 + k),
                             (__m512bh)_mm512_loadu_si512(xp + k / 2));
    }
    if (k < (size_t)kc) {
        __mmask32 m = mask32((size_t)kc - k);
        a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_maskz_loadu_epi16(m, w + base + k0 + k),
                             (__m512bh)_mm512_maskz_loadu_epi16(m, (const uint16_t *)(xp + k / 2)));
    }
    float s = _mm512_reduce_add_ps(a);
    y[r] = add ? y[r] + s : s;
}

/* Columns of x rounded per pass of the --fast matvec: T_SMALL tokens of
 * bf16 pairs are 64 KiB. */
#define XCH 2048

/* --fast for T < T_SMALL: a row at a time, one stream in order (on Zen
 * 4 four rows read side by side streamed 10-35% slower at decode: bf16
 * Qwen3-0.6B shapes, 2 threads), in L1 while every token runs over it;
 * only the first token prefetches. When every token's pairs of the whole
 * row fit the buffer, a pass covers the whole row; else passes of XCH
 * columns, which read each row in pieces. Sums go by blocks of XCH
 * columns either way: the same bits. */
static void matvec_bf16_fast(float *y, size_t ldy, const float *x, size_t ldx, const uint16_t *w,
                             size_t n, int T, int r0, int r1) {
    uint32_t xp[T_SMALL * XCH / 2] __attribute__((aligned(64)));
    if (n == 0) {
        zero_rows(y, ldy, T, r0, r1);
        return;
    }
    size_t pass = (size_t)T * ((n + 1) / 2) <= LOOM_ARRAY_LEN(xp) ? n : XCH;
    for (size_t p0 = 0; p0 < n; p0 += pass) {
        size_t pc = LOOM_MIN(pass, n - p0), words = (pc + 1) / 2;
        for (int t = 0; t < T; t++) round_x_pairs(xp + t * words, x + t * ldx + p0, (int)pc);
        for (int r = r0; r < r1; r++)
            for (size_t k0 = p0; k0 < p0 + pc; k0 += XCH) {
                int kc = (int)LOOM_MIN((size_t)XCH, p0 + pc - k0), add = k0 > 0;
                for (int t = 0; t < T; t++)
                    matvec_bf16_row(y + t * ldy, xp + t * words + (k0 - p0) / 2, w, n, k0, kc, r,
                                    add, t == 0);
            }
    }
}

/* Words a token's bf16 pairs take in a bf16_prep buffer: whole 64-byte
 * lines, so every token's row starts on one. */
INLINE size_t prep_words(size_t n) { return ((n + 1) / 2 + 15) & ~(size_t)15; }

/* --fast GEMM over rows [r0, r1). x's bf16 pairs come from xr (ldr words
 * a token apart: x rounded once for every slice) or, without it, are
 * rounded here per block of rows and columns. */
static void gemm_bf16_blocks(float *y, size_t ly, const float *x, size_t lx, const uint32_t *xr,
                             size_t ldr, const uint16_t *w, size_t n, int T, int r0, int r1) {
    uint32_t wp[MCF * KCF / 2] __attribute__((aligned(64)));
    uint32_t xp[NT * KCF / 2] __attribute__((aligned(64)));
    if (n == 0) {
        zero_rows(y, ly, T, r0, r1);
        return;
    }
    for (int rb = r0; rb < r1; rb += MCF) {
        int mc = LOOM_MIN(MCF, r1 - rb);
        for (size_t k0 = 0; k0 < n; k0 += KCF) {
            int kc = (int)LOOM_MIN((size_t)KCF, n - k0), kcp = (kc + 1) / 2;
            for (int p = 0; p * MR < mc; p++)
                pack_panel_pairs(wp + (size_t)p * MR * (KCF / 2), w + (size_t)(rb + p * MR) * n, n,
                                 LOOM_MIN(MR, mc - p * MR), k0, kc);
            for (int t0 = 0; t0 < T;) {
                int tt = token_block(T, t0);
                const uint32_t *xt = xp;
                size_t ldp = KCF / 2;
                if (xr) {
                    xt = xr + (size_t)t0 * ldr + k0 / 2;
                    ldp = ldr;
                } else {
                    for (int t = 0; t < tt; t++)
                        round_x_pairs(xp + t * (KCF / 2), x + (size_t)(t0 + t) * lx + k0, kc);
                }
                for (int p = 0; p * MR < mc; p++)
                    tile_bf16_any(y + (size_t)t0 * ly + rb + p * MR, ly, xt, ldp,
                                  wp + (size_t)p * MR * (KCF / 2), kcp, tt,
                                  LOOM_MIN(MR, mc - p * MR), k0 > 0);
                t0 += tt;
            }
        }
    }
}

/* --fast GEMM; small T goes to the matvec above. */
static void gemm_bf16_fast(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int n,
                           int T, int r0, int r1) {
    if (T < T_SMALL) matvec_bf16_fast(y, (size_t)ldy, x, (size_t)ldx, w, (size_t)n, T, r0, r1);
    else gemm_bf16_blocks(y, (size_t)ldy, x, (size_t)ldx, NULL, 0, w, (size_t)n, T, r0, r1);
}

/* A prompt's x rounded once for all of a dispatch's slices (below T_SMALL
 * the matvec rounds its own, and nothing is prepared). */
static size_t bf16_prep_bytes(int n, int T) {
    return T < T_SMALL ? 0 : (size_t)T * prep_words((size_t)n) * sizeof(uint32_t);
}

static void bf16_prep(void *buf, const float *x, int ldx, int n, int T) {
    size_t ld = prep_words((size_t)n);
    for (int t = 0; t < T; t++)
        round_x_pairs((uint32_t *)buf + (size_t)t * ld, x + (size_t)t * ldx, n);
}

static void gemm_bf16_prep(float *y, int ldy, const void *buf, const uint16_t *w, int n, int T,
                           int r0, int r1) {
    gemm_bf16_blocks(y, (size_t)ldy, NULL, 0, buf, prep_words((size_t)n), w, (size_t)n, T, r0, r1);
}

/* ---- attention: weighted sum of values ------------------------------------------ */

/* attn_pv on NS (<= 2) slots x NV (<= 8) vectors of 16 from column 0 of
 * out: 16 accumulators stay in registers while the keys run, and each V
 * vector loaded feeds every slot (a decode step of a 2-query group reads
 * a 128-wide row once). Each accumulator starts from out and takes one FMA
 * per key in order, as axpy does, so neither the grouping of slots nor the
 * split of keys over calls changes a bit. tail masks the last vector. */
INLINE void pv_block(float *out, size_t ldo, const float *p, size_t ldp, const int *keys,
                     const float *v, size_t ldv, int NS, int NV, __mmask16 tail) {
    __m512 acc[2][8];
    int lo = keys[0], hi = keys[1], same = 1;
#pragma GCC unroll 2
    for (int s = 0; s < NS; s++) {
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++)
            acc[s][j] = _mm512_maskz_loadu_ps(j == NV - 1 ? tail : 0xffff, out + s * ldo + 16 * j);
        lo = LOOM_MIN(lo, keys[2 * s]);
        hi = LOOM_MAX(hi, keys[2 * s + 1]);
        same &= keys[2 * s] == keys[0] && keys[2 * s + 1] == keys[1];
    }
    for (int i = lo; i < hi; i++) {
        const float *vr = v + (size_t)i * ldv;
        __m512 vv[8];
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++) vv[j] = _mm512_maskz_loadu_ps(j == NV - 1 ? tail : 0xffff, vr + 16 * j);
#pragma GCC unroll 2
        for (int s = 0; s < NS; s++) {
            /* slots of one query token share their keys: no test then */
            if (!same && (i < keys[2 * s] || i >= keys[2 * s + 1])) continue;
            __m512 pb = _mm512_set1_ps(p[s * ldp + i]);
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++) acc[s][j] = _mm512_fmadd_ps(pb, vv[j], acc[s][j]);
        }
    }
#pragma GCC unroll 2
    for (int s = 0; s < NS; s++)
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++)
            _mm512_mask_storeu_ps(out + s * ldo + 16 * j, j == NV - 1 ? tail : 0xffff, acc[s][j]);
}

static void pv_any(float *out, size_t ldo, const float *p, size_t ldp, const int *keys,
                   const float *v, size_t ldv, int NS, int NV, __mmask16 tail) {
#define C(nv)                                                                       \
    case nv:                                                                        \
        if (NS == 2) pv_block(out, ldo, p, ldp, keys, v, ldv, 2, nv, tail);         \
        else pv_block(out, ldo, p, ldp, keys, v, ldv, 1, nv, tail);                 \
        break;
    switch (NV) { C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8) default: break; }
#undef C
}

static void attn_pv(float *out, int ldo, const float *p, int ldp, const int *keys, int slots,
                    const float *v, int ldv, int n_keys, int hd) {
    (void)n_keys;
    for (int s = 0; s < slots; s += 2)
        for (int d = 0; d < hd; d += 128) {
            int w = LOOM_MIN(128, hd - d), nv = (w + 15) / 16;
            pv_any(out + (size_t)s * ldo + d, (size_t)ldo, p + (size_t)s * ldp, (size_t)ldp,
                   keys + 2 * s, v + d, (size_t)ldv, LOOM_MIN(2, slots - s), nv,
                   mask16((size_t)(w - 16 * (nv - 1))));
        }
}

/* ---- entries -------------------------------------------------------------------- */

static void matmul_f32(float *y, int ldy, const float *x, int ldx, const float *w, int n, int T,
                       int r0, int r1) {
    matmul_exact(y, ldy, x, ldx, w, n, T, r0, r1, DT_F32);
}

static void matmul_f16(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int n,
                       int T, int r0, int r1) {
    matmul_exact(y, ldy, x, ldx, w, n, T, r0, r1, DT_F16);
}

static void matmul_bf16(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int n,
                        int T, int r0, int r1) {
    matmul_exact(y, ldy, x, ldx, w, n, T, r0, r1, DT_BF16);
}

const loom_kernels loom_kernels_avx512_dense = {
    .name = "avx512-dense",
    .matmul_f32 = matmul_f32,
    .matmul_f16 = matmul_f16,
    .matmul_bf16 = matmul_bf16,
    .attn_pv = attn_pv,
};

const loom_kernels loom_kernels_avx512_dense_fast = {
    .name = "avx512-dense-fast",
    .matmul_bf16 = gemm_bf16_fast,
    .bf16_prep_bytes = bf16_prep_bytes,
    .bf16_prep = bf16_prep,
    .matmul_bf16_prep = gemm_bf16_prep,
};

/* ---- whether VDPBF16PS pays on this CPU -------------------------------- */

#define PROBE_CHAINS 16 /* independent sums: more than either latency x ports */

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Seconds (this thread's CPU time) for iters rounds of PROBE_CHAINS
 * VDPBF16PS (bf16 != 0) or f32 FMAs; sink keeps the sums alive. */
static double probe_run(long iters, int bf16, float *sink) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
    __m512 x[PROBE_CHAINS];
    for (int i = 0; i < PROBE_CHAINS; i++) x[i] = _mm512_set1_ps(1.0f + 0.01f * (float)i);
    double t = cpu_seconds();
    if (bf16)
        for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
            for (int j = 0; j < PROBE_CHAINS; j++) x[j] = _mm512_dpbf16_ps(x[j], a, b);
        }
    else
        for (long i = 0; i < iters; i++) {
#pragma GCC unroll 16
            for (int j = 0; j < PROBE_CHAINS; j++) x[j] = _mm512_fmadd_ps(x[j], m, c);
        }
    t = cpu_seconds() - t;
    __m512 s = x[0];
    for (int i = 1; i < PROBE_CHAINS; i++) s = _mm512_add_ps(s, x[i]);
    *sink += _mm512_reduce_add_ps(s);
    return t;
}

/* Multiply-adds a second of VDPBF16PS (32 per instruction) over those of
 * f32 FMAs (16), each the fastest of 3 alternating runs of a few ms in
 * thread CPU time (another process holding the core does not count).
 * About 2 on Zen 4, where VDPBF16PS issues at the FMA rate; 0.5 on the
 * Intel Xeon (family 6, model 207) the --fast bf16 prefill did not gain
 * on. */
double loom_avx512_bf16_gain(void) {
    const long iters = 200000;
    double tb = 1e30, tf = 1e30;
    float sink = 0;
    for (int r = 0; r < 3; r++) {
        tb = LOOM_MIN(tb, probe_run(iters, 1, &sink));
        tf = LOOM_MIN(tf, probe_run(iters, 0, &sink));
    }
    volatile float keep = sink;
    (void)keep;
    return tb > 0 ? 2.0 * tf / tb : 0.0;
}
