/* ops_q_fast_avx2: the --fast matmul over 4- and 8-bit affine-quantized
 * weights on AVX2 (no VNNI): the rounding of ops_q_fast_ref.c (each
 * token's activations per 64 columns to int8, exact integer block sums),
 * summed in another float order.
 *
 * VPMADDUBSW multiplies unsigned by signed bytes and adds pairs into
 * saturating 16-bit lanes. 4-bit codes (0..15) times int8 stay far inside
 * that. 8-bit codes q (0..255) would not (2 * 255 * 127 > 32767): they go
 * in as q - 128, whose magnitude is the unsigned operand and whose sign
 * moves onto the activation (VPSIGNB; activations lie in -127..127, so the
 * sign flip never overflows), at most 2 * 128 * 127 a pair. The 128 * sum(x)
 * left over joins the bias: per group, bias + 128 * scale.
 *
 * Tokens go in tiles of up to FT, each tile's activations rounded once and
 * every row's bytes loaded once per 64 columns for all of the tile. A
 * token's outputs do not depend on how many come with it, up to
 * FAST8_MAX_T. Past it, 8-bit rows are multiplied by the exact kernel over
 * the rounded activations as floats (sx * q): the same rounding, the sums
 * in f32 (within float reassociation of the integer ones), faster there
 * (two multiplies a byte pair here against one FMA per 8 weights
 * converted once for all tokens: 30 against 38 G multiply-adds a second on
 * Zen 3 at 32 tokens). */
#include <immintrin.h>
#include <math.h>

#include "base/base.h"
#include "ops/ops.h"

#define INLINE static inline __attribute__((always_inline))
#define XBLK 64
#define FT 6                  /* tokens a register tile */
#define MAXG (32768 / XBLK)   /* blocks (and groups) a row at most */
#define FAST8_MAX_T 8
#define PF_ROWS 4             /* rows an 8-bit row prefetches ahead */

/* One block of 64 activations rounded to int8 into q; returns sum(q),
 * *sx the block's scale. */
static int round_block(const float *xj, int32_t *q, float *sx) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < XBLK; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xj + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    float inv = amax > 0 ? 127.0f / amax : 0.0f;
    *sx = amax / 127.0f;
    __m256 iv = _mm256_set1_ps(inv);
    __m256i s = _mm256_setzero_si256();
    for (int i = 0; i < XBLK; i += 8) {
        __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xj + i), iv)); /* nearest even */
        s = _mm256_add_epi32(s, v);
        _mm256_storeu_si256((__m256i *)(q + i), v);
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
}

/* One token x rounded: xq [n] int8 (8-bit: column order; 4-bit: each block
 * as its 32 even columns then its 32 odd ones, as the nibbles unpack),
 * sx [nb] the blocks' scales, xsg [ng] per group sum of sx * sum(qx). */
static void prep(int8_t *xq, float *sx, float *xsg, const float *x, const loom_qmat *w) {
    int nb = w->n / XBLK, per = w->group / XBLK;
    int32_t q[XBLK];
    for (int j = 0; j < nb; j++) {
        int isum = round_block(x + (size_t)j * XBLK, q, &sx[j]);
        int8_t *o = xq + (size_t)j * XBLK;
        if (w->bits == 8)
            for (int k = 0; k < XBLK; k++) o[k] = (int8_t)q[k];
        else
            for (int k = 0; k < XBLK / 2; k++) o[k] = (int8_t)q[2 * k], o[k + XBLK / 2] = (int8_t)q[2 * k + 1];
        float bs = sx[j] * (float)isum;
        if (j % per == 0) xsg[j / per] = bs;
        else xsg[j / per] += bs;
    }
}

/* T tokens of x rounded as prep rounds them, back as floats sx * q. */
static void round_f32(float *xr, const float *x, int ldx, int n, int T) {
    int32_t q[XBLK];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < n; j += XBLK) {
            float sx, *o = xr + (size_t)t * n + j;
            round_block(x + (size_t)t * ldx + j, q, &sx);
            __m256 sv = _mm256_set1_ps(sx);
            for (int i = 0; i < XBLK; i += 8)
                _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(q + i))), sv));
        }
}

INLINE float hsum(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* Rows [r0, r1) for T (1 .. FT) rounded tokens (xq rows n apart, sx nb
 * apart, xsg ng apart). */
INLINE void rows_tile(float *y, size_t ldy, const int8_t *xq, const float *sx, const float *xsg,
                      const loom_qmat *w, int r0, int r1, const int T, const int bits) {
    const int n = w->n, ng = n / w->group, nb = n / XBLK, gs = __builtin_ctz(w->group / XBLK);
    const size_t words = (size_t)n * (size_t)bits / 32;
    const __m256i m4 = _mm256_set1_epi8(15), off = _mm256_set1_epi8((char)0x80);
    const __m256i ones = _mm256_set1_epi16(1);
    float sw[MAXG], bw[MAXG];
    for (int r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)(w->w + (size_t)r * words);
        for (int g = 0; g < ng; g++) {
            size_t i = (size_t)r * ng + (size_t)g;
            sw[g] = w->f16 ? loom_f16_to_f32(w->scales[i]) : loom_bf16_to_f32(w->scales[i]);
            bw[g] = w->f16 ? loom_f16_to_f32(w->biases[i]) : loom_bf16_to_f32(w->biases[i]);
            if (bits == 8) bw[g] += 128.0f * sw[g];
        }
        __m256 acc[FT];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
        for (int j = 0; j < nb; j++) {
            float s = sw[j >> gs];
            if (bits == 8) {
                /* the row PF_ROWS ahead into L2, a line a block (4-bit rows
                 * measured no faster for it) */
                _mm_prefetch((const char *)row + PF_ROWS * words * 4 + (size_t)j * 64, _MM_HINT_T2);
                __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + (size_t)j * 64)), off);
                __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + (size_t)j * 64 + 32)), off);
                __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const int8_t *xt = xq + (size_t)t * n + (size_t)j * XBLK;
                    __m256i p0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)xt), w0));
                    __m256i p1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xt + 32)), w1));
                    __m256i d = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(s * sx[(size_t)t * nb + j]), acc[t]);
                }
            } else {
                __m256i v = _mm256_loadu_si256((const __m256i *)(row + (size_t)j * 32));
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    const int8_t *xt = xq + (size_t)t * n + (size_t)j * XBLK;
                    /* each pair at most 2 * 15 * 127, the two sums 4 * 15 * 127 */
                    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xt)),
                                                 _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xt + 32))));
                    __m256i d = _mm256_madd_epi16(p, ones);
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(s * sx[(size_t)t * nb + j]), acc[t]);
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const float *xg = xsg + (size_t)t * ng;
            float b = 0;
            for (int g = 0; g < ng; g++) b += bw[g] * xg[g];
            y[(size_t)t * ldy + r] = hsum(acc[t]) + b;
        }
    }
}

static void tile(float *y, size_t ldy, const int8_t *xq, const float *sx, const float *xsg,
                 const loom_qmat *w, int r0, int r1, int T) {
    switch (T * 16 + w->bits) {
#define FT_CASE(c)                                                                   \
    case c * 16 + 8: rows_tile(y, ldy, xq, sx, xsg, w, r0, r1, c, 8); break;         \
    case c * 16 + 4: rows_tile(y, ldy, xq, sx, xsg, w, r0, r1, c, 4); break;
    FT_CASE(1) FT_CASE(2) FT_CASE(3) FT_CASE(4) FT_CASE(5) FT_CASE(6)
#undef FT_CASE
    default: break;
    }
}

static void matmul_q_fast(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T,
                          int r0, int r1) {
    if (!loom_q_fast_ok(w) || w->il16) {
        loom_kernels_avx2.matmul_q(y, ldy, x, ldx, w, T, r0, r1);
        return;
    }
    const int n = w->n, nb = n / XBLK, ng = n / w->group;
    if (w->bits == 8 && T > FAST8_MAX_T) {
        /* in chunks that fit a 256 KiB buffer on the stack */
        float xr[65536];
        int ch = LOOM_MAX(1, 65536 / n);
        for (int t0 = 0; t0 < T; t0 += ch) {
            int tn = LOOM_MIN(ch, T - t0);
            round_f32(xr, x + (size_t)t0 * ldx, ldx, n, tn);
            loom_kernels_avx2.matmul_q(y + (size_t)t0 * ldy, ldy, xr, n, w, tn, r0, r1);
        }
        return;
    }
    int8_t xq[FT * n];
    float sx[FT * nb], xsg[FT * ng];
    for (int t0 = 0; t0 < T; t0 += FT) {
        int tn = LOOM_MIN(FT, T - t0);
        for (int t = 0; t < tn; t++)
            prep(xq + (size_t)t * n, sx + (size_t)t * nb, xsg + (size_t)t * ng, x + (size_t)(t0 + t) * ldx, w);
        tile(y + (size_t)t0 * ldy, (size_t)ldy, xq, sx, xsg, w, r0, r1, tn);
    }
}

const loom_kernels loom_kernels_avx2_q_fast = {.name = "avx2-q-fast", .matmul_q = matmul_q_fast};
