/* ops_dense_avx512: matmuls over f32/f16/bf16 weights with AVX-512.
 * Compiled with the AVX-512 flags (Makefile); only reached after
 * loom_kernels_get() checked the CPU. Same contract as the AVX2 entries
 * (ops.h): y[t*ldy + r] = x_t . w_r for rows [r0, r1).
 *
 * Two shapes:
 *   - T == 1 (decode): a matvec bound by memory bandwidth. Four rows are
 *     streamed together, 64 bytes of each per step, with software prefetch
 *     into L2 (the hardware prefetchers ramp up too slowly on 2 KiB rows).
 *     (Widening bf16 pairs in place, word << 16 and word & 0xffff0000
 *     against x split into even and odd lanes, ran at 34 GB/s hot against
 *     60 for zero-extend and shift.)
 *   - T > 1 (prefill, decode batches): a packed GEMM. A block of MC rows x
 *     KC columns of w is converted to f32 and transposed once into panels of
 *     32 rows laid out [k][32] (L2), each token block's KC columns of x are
 *     copied beside it (L1), and a 32-row x 12-token register tile (24 of
 *     the 32 zmm accumulators) runs FMAs with x broadcast from memory. Each
 *     weight is converted once per call instead of once per token tile, and
 *     there are no horizontal sums.
 *
 * The --fast variant (bf16 weights only): x is rounded to bf16 (nearest
 * even, VCVTNE2PS2BF16) and VDPBF16PS multiplies pairs of bf16 values into
 * f32 sums, twice the FMA rate. The panels then hold 32-bit pairs of
 * consecutive columns, [k/2][32]. ops_dense_fast_ref.c is its reference.
 *
 * Measured peaks on this machine class (Zen 4, one core): 118 GFLOP/s with
 * zmm FMA, 233 GFLOP/s with VDPBF16PS (/tmp microbenchmark, 12
 * independent chains). */
#include <immintrin.h>
#include <string.h>

#include "base/base.h"
#include "ops/ops.h"

#define INLINE static inline __attribute__((always_inline))

enum { DT_F32, DT_F16, DT_BF16 };

/* ---- decode: T == 1 ------------------------------------------------------- */

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

/* Products of 32 weights from element i of w with x (xe: the first 16,
 * xo: the next 16) into a and b. m masks the elements that exist. */
INLINE void mv_step(__m512 *a, __m512 *b, const void *w, size_t i, __m512 xe, __m512 xo,
                    __mmask32 m, int dt) {
    if (dt == DT_BF16) {
        const uint16_t *p = (const uint16_t *)w + i;
        __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((__mmask16)m, p));
        __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((__mmask16)(m >> 16), p + 16));
        *a = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(lo, 16)), xe, *a);
        *b = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)), xo, *b);
    } else if (dt == DT_F16) {
        const uint16_t *p = (const uint16_t *)w + i;
        __m512 lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)m, p));
        __m512 hi = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)(m >> 16), p + 16));
        *a = _mm512_fmadd_ps(lo, xe, *a);
        *b = _mm512_fmadd_ps(hi, xo, *b);
    } else {
        const float *p = (const float *)w + i;
        *a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps((__mmask16)m, p), xe, *a);
        *b = _mm512_fmadd_ps(_mm512_maskz_loadu_ps((__mmask16)(m >> 16), p + 16), xo, *b);
    }
}

/* x[k .. k+32) as two halves (masked past n). */
INLINE void mv_x(__m512 *xe, __m512 *xo, const float *x, size_t k, __mmask32 m) {
    *xe = _mm512_maskz_loadu_ps((__mmask16)m, x + k);
    *xo = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), x + k + 16);
}

/* y[r0 .. r0+R) = w rows . x, R in 1..4. */
INLINE void matvec_rows(float *y, const float *x, const void *w, size_t n, int r0, int R,
                        int dt) {
    const size_t sz = dt == DT_F32 ? 4 : 2;
    __m512 a[4], b[4];
    size_t base[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        a[r] = b[r] = _mm512_setzero_ps();
        base[r] = (size_t)(r0 + r) * n;
    }
    size_t k = 0;
    for (; k + 32 <= n; k += 32) {
        __m512 xe, xo;
        mv_x(&xe, &xo, x, k, 0xffffffffu);
        prefetch_rows(w, base, R, n, k, sz);
        if (dt == DT_F32) prefetch_rows(w, base, R, n, k + 16, sz);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) mv_step(&a[r], &b[r], w, base[r] + k, xe, xo, 0xffffffffu, dt);
    }
    if (k < n) {
        __mmask32 m = mask32(n - k);
        __m512 xe, xo;
        mv_x(&xe, &xo, x, k, m);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) mv_step(&a[r], &b[r], w, base[r] + k, xe, xo, m, dt);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) y[r0 + r] = _mm512_reduce_add_ps(_mm512_add_ps(a[r], b[r]));
}

INLINE void matvec(float *y, const float *x, const void *w, size_t n, int r0, int r1, int dt) {
    /* The loop prefetches PF_BYTES ahead; the head of the first rows would
     * otherwise arrive one demand miss at a time (a task of the model's row
     * split is only 256-768 KiB at decode). */
    const size_t sz = dt == DT_F32 ? 4 : 2;
    for (int i = 0; i < 4 && r0 + i < r1; i++)
        for (size_t b = 0; b < LOOM_MIN((size_t)PF_BYTES, n * sz); b += 64)
            _mm_prefetch((const char *)w + (size_t)(r0 + i) * n * sz + b, _MM_HINT_T2);
    int r = r0;
    for (; r + 4 <= r1; r += 4) matvec_rows(y, x, w, n, r, 4, dt);
    switch (r1 - r) {
    case 3: matvec_rows(y, x, w, n, r, 3, dt); break;
    case 2: matvec_rows(y, x, w, n, r, 2, dt); break;
    case 1: matvec_rows(y, x, w, n, r, 1, dt); break;
    default: break;
    }
}

/* ---- prefill: packed GEMM ----------------------------------------------------- */

#define MR 32  /* rows per panel: two zmm */
#define NT 12  /* tokens per register tile: 24 accumulators */
#define KC 256 /* columns per packed block (exact: a panel is 32 KiB of f32) */
/* Rows per packed block: 384 KiB of f32, in L2. x is read again (from L3:
 * 2-6 MiB at T = 512) for every block, so the block covers a whole task of
 * the model's row split where it can (128-384 rows for Qwen3-0.6B on 2
 * threads); at 128 rows the --fast GEMM spent 8% of its time rounding x. */
#define MC 384
/* --fast: the panels hold bf16 pairs, so twice the columns fit. */
#define KCF 512
#define MCF 384

/* In-register transpose of a 16 x 16 block of 32-bit elements. */
INLINE void transpose16(__m512i r[16]) {
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* r[4q + j] holds column j (+4, +8, +12 in the 128-bit lanes) of rows
     * 4q .. 4q+3. */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i a = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);      /* cols j, j+8 */
        __m512i b = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);      /* cols j+4, j+12 */
        __m512i c = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
        __m512i d = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
        t[j] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[j + 8] = _mm512_shuffle_i32x4(a, c, 0xdd);
        t[j + 4] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[j + 12] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* 16 weights of row p from element k as f32 (zero where m is clear). */
INLINE __m512i load16_f32(const void *p, size_t k, __mmask16 m, int dt) {
    if (dt == DT_F32) return _mm512_castps_si512(_mm512_maskz_loadu_ps(m, (const float *)p + k));
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + k);
    if (dt == DT_F16) return _mm512_castps_si512(_mm512_cvtph_ps(h));
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

/* Packs rows [0, mr) (mr <= MR; the rest of the panel is zero) of w from
 * column k0, kc columns, as f32 into dst[k * MR + i] for k < kc rounded up
 * to 16 (zero past kc). w points at the panel's first row. */
INLINE void pack_panel(float *dst, const void *w, size_t n, int mr, size_t k0, int kc, int dt) {
    const size_t sz = dt == DT_F32 ? 4 : 2;
    for (int kb = 0; kb < kc; kb += 16) {
        __mmask16 m = mask16((size_t)(kc - kb));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512i r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                int row = h * 16 + i;
                r[i] = row < mr ? load16_f32((const char *)w + (size_t)row * n * sz, k0 + (size_t)kb, m, dt)
                                : _mm512_setzero_si512();
            }
            transpose16(r);
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++)
                _mm512_store_si512((__m512i *)(dst + (size_t)(kb + j) * MR + h * 16), r[j]);
        }
    }
}

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
            transpose16(r);
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

/* Register tile, exact: TT tokens of xp ([t][KC] f32) x one panel
 * ([k][MR] f32) over kc columns. */
INLINE void tile_f32(float *y, size_t ldy, const float *xp, const float *wp, int kc, int TT,
                     int mr, int add) {
    __m512 acc[NT][2];
#pragma GCC unroll 12
    for (int t = 0; t < TT; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int k = 0; k < kc; k++) {
        __m512 w0 = _mm512_load_ps(wp + (size_t)k * MR), w1 = _mm512_load_ps(wp + (size_t)k * MR + 16);
#pragma GCC unroll 12
        for (int t = 0; t < TT; t++) {
            __m512 xb = _mm512_set1_ps(xp[t * KC + k]);
            acc[t][0] = _mm512_fmadd_ps(w0, xb, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w1, xb, acc[t][1]);
        }
    }
    store_tile(y, ldy, acc, TT, mr, add);
}

/* Register tile, --fast: xp holds bf16 pairs [t][KCF/2], wp pairs
 * [kp][MR], kp < kcp. */
INLINE void tile_bf16(float *y, size_t ldy, const uint32_t *xp, const uint32_t *wp, int kcp,
                      int TT, int mr, int add) {
    __m512 acc[NT][2];
#pragma GCC unroll 12
    for (int t = 0; t < TT; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int k = 0; k < kcp; k++) {
        __m512bh w0 = (__m512bh)_mm512_load_si512(wp + (size_t)k * MR);
        __m512bh w1 = (__m512bh)_mm512_load_si512(wp + (size_t)k * MR + 16);
#pragma GCC unroll 12
        for (int t = 0; t < TT; t++) {
            __m512bh xb = (__m512bh)_mm512_set1_epi32((int)xp[t * (KCF / 2) + k]);
            acc[t][0] = _mm512_dpbf16_ps(acc[t][0], w0, xb);
            acc[t][1] = _mm512_dpbf16_ps(acc[t][1], w1, xb);
        }
    }
    store_tile(y, ldy, acc, TT, mr, add);
}

/* The tile for TT tokens (1..NT), with TT a compile-time constant in each
 * case so the accumulators stay in registers. */
static void tile_f32_any(float *y, size_t ldy, const float *xp, const float *wp, int kc, int TT,
                         int mr, int add) {
    switch (TT) {
#define C(n) case n: tile_f32(y, ldy, xp, wp, kc, n, mr, add); break;
    C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8) C(9) C(10) C(11) C(12)
#undef C
    default: break;
    }
}

static void tile_bf16_any(float *y, size_t ldy, const uint32_t *xp, const uint32_t *wp, int kcp,
                          int TT, int mr, int add) {
    switch (TT) {
#define C(n) case n: tile_bf16(y, ldy, xp, wp, kcp, n, mr, add); break;
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

/* Exact GEMM, T > 1. */
INLINE void gemm(float *y, int ldy, const float *x, int ldx, const void *w, int n_, int T,
                 int r0, int r1, int dt) {
    float wp[MC * KC] __attribute__((aligned(64)));
    float xp[NT * KC] __attribute__((aligned(64)));
    const size_t n = (size_t)n_, ly = (size_t)ldy, sz = dt == DT_F32 ? 4 : 2;
    if (n == 0) {
        zero_rows(y, ly, T, r0, r1);
        return;
    }
    for (int rb = r0; rb < r1; rb += MC) {
        int mc = LOOM_MIN(MC, r1 - rb);
        for (size_t k0 = 0; k0 < n; k0 += KC) {
            int kc = (int)LOOM_MIN((size_t)KC, n - k0);
            for (int p = 0; p * MR < mc; p++)
                pack_panel(wp + (size_t)p * MR * KC, (const char *)w + (size_t)(rb + p * MR) * n * sz,
                           n, LOOM_MIN(MR, mc - p * MR), k0, kc, dt);
            for (int t0 = 0; t0 < T;) {
                int tt = token_block(T, t0);
                for (int t = 0; t < tt; t++)
                    memcpy(xp + t * KC, x + (size_t)(t0 + t) * ldx + k0, sizeof(float) * (size_t)kc);
                for (int p = 0; p * MR < mc; p++)
                    tile_f32_any(y + (size_t)t0 * ly + rb + p * MR, ly, xp, wp + (size_t)p * MR * KC,
                                 kc, tt, LOOM_MIN(MR, mc - p * MR), k0 > 0);
                t0 += tt;
            }
        }
    }
}

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

/* --fast matvec: y[r0 .. r0+R) from bf16 pairs of x (xp, kcp words) and
 * the rows' columns [k0, k0 + 2 kcp) (kc of them exist). */
INLINE void matvec_bf16_rows(float *y, const uint32_t *xp, const uint16_t *w, size_t n,
                             size_t k0, int kc, int r0, int R, int add, int pf) {
    __m512 a[4];
    size_t base[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        a[r] = _mm512_setzero_ps();
        base[r] = (size_t)(r0 + r) * n;
    }
    size_t k = 0;
    for (; k + 32 <= (size_t)kc; k += 32) {
        __m512bh xv = (__m512bh)_mm512_loadu_si512(xp + k / 2);
        if (pf) prefetch_rows(w, base, R, n, k0 + k, 2);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)_mm512_loadu_si512(w + base[r] + k0 + k), xv);
    }
    if (k < (size_t)kc) {
        __mmask32 m = mask32((size_t)kc - k);
        __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, (const uint16_t *)(xp + k / 2));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)_mm512_maskz_loadu_epi16(m, w + base[r] + k0 + k), xv);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float s = _mm512_reduce_add_ps(a[r]);
        y[r0 + r] = add ? y[r0 + r] + s : s;
    }
}

/* Below this many tokens the GEMM's packing costs more than it saves:
 * the weights are streamed from memory (measured T = 4 on [3072 x 1024]:
 * 6.6 GB/s packed against ~18 for the row-streaming kernels). */
#define T_SMALL 16
/* Columns of x rounded per pass of the --fast matvec: T_SMALL tokens of
 * bf16 pairs are 64 KiB. */
#define XCH 2048

/* --fast for T < T_SMALL: four rows at a time stay in L1 while every
 * token runs over them; only the first token prefetches. */
static void matvec_bf16_fast(float *y, size_t ldy, const float *x, size_t ldx, const uint16_t *w,
                             size_t n, int T, int r0, int r1) {
    uint32_t xp[T_SMALL * XCH / 2] __attribute__((aligned(64)));
    if (n == 0) {
        zero_rows(y, ldy, T, r0, r1);
        return;
    }
    for (size_t k0 = 0; k0 < n; k0 += XCH) {
        int kc = (int)LOOM_MIN((size_t)XCH, n - k0), add = k0 > 0;
        for (int t = 0; t < T; t++) round_x_pairs(xp + t * (XCH / 2), x + t * ldx + k0, kc);
        for (int r = r0; r < r1; r += 4) {
            int R = LOOM_MIN(4, r1 - r);
            for (int t = 0; t < T; t++) {
                float *yt = y + t * ldy;
                const uint32_t *xt = xp + t * (XCH / 2);
                switch (R) {
                case 4: matvec_bf16_rows(yt, xt, w, n, k0, kc, r, 4, add, t == 0); break;
                case 3: matvec_bf16_rows(yt, xt, w, n, k0, kc, r, 3, add, t == 0); break;
                case 2: matvec_bf16_rows(yt, xt, w, n, k0, kc, r, 2, add, t == 0); break;
                default: matvec_bf16_rows(yt, xt, w, n, k0, kc, r, 1, add, t == 0); break;
                }
            }
        }
    }
}

/* --fast GEMM; small T goes to the matvec above. */
static void gemm_bf16_fast(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int n_,
                           int T, int r0, int r1) {
    uint32_t wp[MCF * KCF / 2] __attribute__((aligned(64)));
    uint32_t xp[NT * KCF / 2] __attribute__((aligned(64)));
    const size_t n = (size_t)n_, ly = (size_t)ldy;
    if (T < T_SMALL) {
        matvec_bf16_fast(y, ly, x, (size_t)ldx, w, n, T, r0, r1);
        return;
    }
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
                for (int t = 0; t < tt; t++)
                    round_x_pairs(xp + t * (KCF / 2), x + (size_t)(t0 + t) * ldx + k0, kc);
                for (int p = 0; p * MR < mc; p++)
                    tile_bf16_any(y + (size_t)t0 * ly + rb + p * MR, ly, xp,
                                  wp + (size_t)p * MR * (KCF / 2), kcp, tt,
                                  LOOM_MIN(MR, mc - p * MR), k0 > 0);
                t0 += tt;
            }
        }
    }
}

/* ---- entries -------------------------------------------------------------------- */

INLINE void matmul(float *y, int ldy, const float *x, int ldx, const void *w, int n, int T,
                   int r0, int r1, int dt) {
    if (T == 1) {
        matvec(y, x, w, (size_t)n, r0, r1, dt);
    } else if (T < T_SMALL) {
        /* The AVX2 tiles convert each weight once per 3 tokens but stream
         * the rows with prefetch. */
        if (dt == DT_F32) loom_kernels_avx2.matmul_f32(y, ldy, x, ldx, w, n, T, r0, r1);
        else if (dt == DT_F16) loom_kernels_avx2.matmul_f16(y, ldy, x, ldx, w, n, T, r0, r1);
        else loom_kernels_avx2.matmul_bf16(y, ldy, x, ldx, w, n, T, r0, r1);
    } else {
        gemm(y, ldy, x, ldx, w, n, T, r0, r1, dt);
    }
}

static void matmul_f32(float *y, int ldy, const float *x, int ldx, const float *w, int n, int T,
                       int r0, int r1) {
    matmul(y, ldy, x, ldx, w, n, T, r0, r1, DT_F32);
}

static void matmul_f16(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int n,
                       int T, int r0, int r1) {
    matmul(y, ldy, x, ldx, w, n, T, r0, r1, DT_F16);
}

static void matmul_bf16(float *y, int ldy, const float *x, int ldx, const uint16_t *w, int n,
                        int T, int r0, int r1) {
    matmul(y, ldy, x, ldx, w, n, T, r0, r1, DT_BF16);
}

const loom_kernels loom_kernels_avx512_dense = {
    .name = "avx512-dense",
    .matmul_f32 = matmul_f32,
    .matmul_f16 = matmul_f16,
    .matmul_bf16 = matmul_bf16,
};

const loom_kernels loom_kernels_avx512_dense_fast = {
    .name = "avx512-dense-fast",
    .matmul_bf16 = gemm_bf16_fast,
};
