/* ops_avx2: AVX2/FMA/F16C kernels. Compiled with -mavx2 -mfma -mf16c and
 * only reached after loom_kernels_get() checked the CPU. Every entry must
 * agree with ops_ref.c up to float reassociation (tests/test_ops.c).
 *
 * matmul layout: w is [rows][n] (row-major, one output per row), x is
 * [T][ldx]. Two shapes matter:
 *   - T == 1 (decode): a matvec bound by memory bandwidth, run by the same
 *     tile as prefill with one token: four weight rows streamed together so
 *     each x load feeds four rows, and each output summed in one order
 *     whatever T is (a token's outputs are the same alone or in a batch).
 *   - T > 1 (prefill): a register tile of 4 rows x 3 tokens (12 accumulators
 *     + 3 x + 1 w = all 16 ymm). Each weight vector is converted to f32 once
 *     and reused for three tokens, so the work is FMA-bound. The row tile
 *     stays in L1 (for rows up to ~2K elements) while the token tiles sweep
 *     over it.
 * Tails (n % 8) go through a zero-padded 8-wide block: x is loaded with a
 * mask and w is copied into a zeroed buffer, so no load leaves its row.
 *
 * matmul_q (affine-quantized rows): for T > 1, four rows at a time are
 * dequantized 1024 columns at a time into a stack buffer (16 KiB) exactly as
 * the reference does, and the f32 tile runs over it. For T == 1 and 4/8-bit
 * rows, each group is summed as scale * x.q + bias * sum(x) straight from the
 * packed words.
 *
 * matmul_f8 (e4m3 rows with block scales) follows matmul_q: T == 1 sums
 * each block straight from the codes and scales the block's sum; T > 1
 * dequantizes into the same buffer (bit for bit the reference's weights)
 * and runs the f32 tile over it.
 *
 * exp (softmax, silu, gelu) is a Cody-Waite reduction plus a degree-6
 * polynomial, within ~1 ulp of the true value over the whole float range. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "ops/ops.h"

#define INLINE static inline __attribute__((always_inline))

enum { DT_F32, DT_F16, DT_BF16 };

/* Lane i of the mask is all-ones for i < rem (rem in 0..8). */
INLINE __m256i tail_mask(int rem) {
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                  0,  0,  0,  0,  0,  0,  0,  0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - rem));
}

INLINE __m256 bf16x8(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Eight weights starting at element i of w, as f32. */
INLINE __m256 load_w(const void *w, size_t i, int dt) {
    if (dt == DT_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    return dt == DT_F16 ? _mm256_cvtph_ps(h) : bf16x8(h);
}

/* The last rem (< 8) weights from element i, zero-padded to eight. */
INLINE __m256 load_w_tail(const void *w, size_t i, int rem, int dt) {
    if (dt == DT_F32) return _mm256_maskload_ps((const float *)w + i, tail_mask(rem));
    uint16_t buf[8] = {0};
    memcpy(buf, (const uint16_t *)w + i, (size_t)rem * sizeof(uint16_t));
    __m128i h = _mm_loadu_si128((const __m128i *)buf);
    return dt == DT_F16 ? _mm256_cvtph_ps(h) : bf16x8(h);
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* {hsum(a), hsum(b), hsum(c), hsum(d)}, each lane summed in hsum's order:
 * a row's sum must not depend on whether it falls in a group of four
 * (attention scores over a key range that ends elsewhere, a row tile's
 * remainder). */
INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m128 sa = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 sb = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 sc = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    __m128 sd = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
    _MM_TRANSPOSE4_PS(sa, sb, sc, sd);
    return _mm_add_ps(_mm_add_ps(sa, sc), _mm_add_ps(sb, sd));
}

/* Matvec prefetch distance per row, into L2 (T2 reaches L2 on x86 parts
 * with a shared L3). Measured single-thread on [3072 x 1024] f16 rows
 * cycled through 192 MiB: none 11 GB/s, 512 B 13, 1-4 KiB 23-26 (T1/T2);
 * into L1 (T0 or NTA) it stays near 12, the lines arrive too early. */
#define PF_BYTES 2048
#define PF_HINT _MM_HINT_T2

/* Software prefetch of the R rows at base[] (element offsets), PF_BYTES
 * ahead of element k; past the row end it moves on to the same row of the
 * next group (R rows further), so the start of every row is already in
 * flight when it is reached. The hardware stream prefetchers ramp up slowly
 * on short rows (2 KiB for an f16 row of 1024), which costs up to half the
 * bandwidth. Call once per 64 bytes of row. */
INLINE void prefetch_rows(const void *w, const size_t *base, int R, size_t n, size_t k,
                          int dt) {
    const size_t sz = dt == DT_F32 ? 4 : 2;
    size_t kp = k + PF_BYTES / sz;
    size_t off = kp < n ? kp : kp - n + (size_t)R * n;
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) _mm_prefetch((const char *)w + (base[r] + off) * sz, PF_HINT);
}

/* Bytes [b0, b1) from p into L2, a prefetch a line (the quantized rows,
 * whose bytes per column vary with the width). */
INLINE void prefetch_span(const void *p, size_t b0, size_t b1) {
    for (size_t b = (b0 + 63) & ~(size_t)63; b < b1; b += 64) _mm_prefetch((const char *)p + b, PF_HINT);
}

/* Prefill register tile: TILE_R rows x TILE_T tokens of accumulators.
 * 4 x 3 uses all 16 ymm registers (12 + 3 x + 1 w). Measured against 2 x 6
 * and 3 x 4 at T = 64 on [3072 x 1024] and [1024 x 3072]: 4 x 3 was best
 * for all three weight types (2 x 6 reads twice the x bytes per FMA from L2
 * and ran at ~60%). */
#define TILE_R 4
#define TILE_T 3
_Static_assert(TILE_R == 4, "row remainders below assume TILE_R == 4");

/* One tile of R rows (<= TILE_R) x TT tokens (<= TILE_T) over n columns:
 * y[t*ldy + r] (+)= x[t*ldx + .] . w[r*ldw + .]. y and x point at the first
 * token, y and w at the first row of the tile. With add, the sums are added
 * to y instead of stored. Whichever side is shorter is held in registers
 * for the whole k step and the other is streamed, so the tile needs
 * R*TT + min(R, TT) + 1 vector registers. */
INLINE void tile(float *y, size_t ldy, const float *x, size_t ldx, const void *w,
                 size_t ldw, size_t n, int R, int TT, int pf, int add, int dt) {
    __m256 acc[TILE_R][TILE_T];
    size_t base[TILE_R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        base[r] = (size_t)r * ldw;
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) acc[r][t] = _mm256_setzero_ps();
    }
    size_t k = 0;
    for (; k + 8 <= n; k += 8) {
        if (pf && ((k * (dt == DT_F32 ? 4 : 2)) & 63) == 0) prefetch_rows(w, base, R, ldw, k, dt);
        if (R <= TT) {
            __m256 wv[TILE_R];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) wv[r] = load_w(w, base[r] + k, dt);
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) {
                __m256 xv = _mm256_loadu_ps(x + t * ldx + k);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        } else {
            __m256 xv[TILE_T];
#pragma GCC unroll 8
            for (int t = 0; t < TT; t++) xv[t] = _mm256_loadu_ps(x + t * ldx + k);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m256 wv = load_w(w, base[r] + k, dt);
#pragma GCC unroll 8
                for (int t = 0; t < TT; t++) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
    if (k < n) {
        int rem = (int)(n - k);
        __m256i m = tail_mask(rem);
        __m256 wv[TILE_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) wv[r] = load_w_tail(w, base[r] + k, rem, dt);
#pragma GCC unroll 8
        for (int t = 0; t < TT; t++) {
            __m256 xv = _mm256_maskload_ps(x + t * ldx + k, m);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) {
        float *yt = y + t * ldy;
        if (R == 4) {
            __m128 v = hsum4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
            _mm_storeu_ps(yt, add ? _mm_add_ps(_mm_loadu_ps(yt), v) : v);
        } else {
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) yt[r] = add ? yt[r] + hsum(acc[r][t]) : hsum(acc[r][t]);
        }
    }
}

/* Tokens of one row tile: tiles of three, ending in 2 or 2 + 2 tokens
 * rather than a lone token: a one-token tile has only four FMA chains and
 * runs at half speed on FMA latency. Only the first token tile brings the
 * rows in from memory, so only it prefetches (this matters for small decode
 * batches, T = 2..8, which stream the weights like a matvec). */
_Static_assert(TILE_T == 3, "tile_tokens splits tokens for TILE_T == 3");
INLINE void tile_tokens(float *y, size_t ldy, const float *x, size_t ldx, const void *w,
                        size_t ldw, size_t n, int T, int R, int pf, int add, int dt) {
    int full = T / 3, rest = T % 3;
    if (rest == 1 && full > 0) {
        full--;
        rest = 4;
    }
    int t = 0;
    for (; t < 3 * full; t += 3)
        tile(y + t * ldy, ldy, x + t * ldx, ldx, w, ldw, n, R, 3, pf && t == 0, add, dt);
    for (; rest >= 2; rest -= 2, t += 2)
        tile(y + t * ldy, ldy, x + t * ldx, ldx, w, ldw, n, R, 2, pf && t == 0, add, dt);
    if (rest == 1)
        tile(y + t * ldy, ldy, x + t * ldx, ldx, w, ldw, n, R, 1, pf && t == 0, add, dt);
}

INLINE void matmul(float *y, int ldy, const float *x, int ldx, const void *w,
                   int n_, int T, int r0, int r1, int dt) {
    size_t n = (size_t)n_;
    int r = r0;
    size_t lx = (size_t)ldx, ly = (size_t)ldy, sz = dt == DT_F32 ? 4 : 2;
#define ROWS(R) tile_tokens(y + r, ly, x, lx, (const char *)w + (size_t)r * n * sz, n, n, T, \
                            R, 1, 0, dt)
    for (; r + TILE_R <= r1; r += TILE_R) ROWS(TILE_R);
    switch (r1 - r) {
    case 3: ROWS(3); break;
    case 2: ROWS(2); break;
    case 1: ROWS(1); break;
    default: break;
    }
#undef ROWS
}

static void matmul_f32(float *y, int ldy, const float *x, int ldx,
                       const float *w, int n, int T, int r0, int r1) {
    matmul(y, ldy, x, ldx, w, n, T, r0, r1, DT_F32);
}

static void matmul_f16(float *y, int ldy, const float *x, int ldx,
                       const uint16_t *w, int n, int T, int r0, int r1) {
    matmul(y, ldy, x, ldx, w, n, T, r0, r1, DT_F16);
}

static void matmul_bf16(float *y, int ldy, const float *x, int ldx,
                        const uint16_t *w, int n, int T, int r0, int r1) {
    matmul(y, ldy, x, ldx, w, n, T, r0, r1, DT_BF16);
}

/* ---- affine-quantized rows ---------------------------------------------- */

/* Columns dequantized per pass: TILE_R rows of this many f32 (16 KiB) stay
 * in L1 while every token runs over them. */
#define QCHUNK 1024

/* Eight fields of `bits` bits starting at field k (k % 8 == 0) of a packed
 * row of row_bytes bytes, as int32 lanes. Eight fields are exactly `bits`
 * bytes, starting on a byte boundary. */
INLINE __m256i q_fields8(const uint8_t *row, size_t row_bytes, size_t k, int bits) {
    const uint8_t *p = row + k / 8 * (size_t)bits;
    if (bits == 8) return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    if (bits == 4) {
        uint32_t u;
        memcpy(&u, p, 4);
        return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u),
                                                  _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                _mm256_set1_epi32(15));
    }
    /* Any width up to 8: the 8 * bits bits as one 64-bit word (loaded
     * whole unless it would run past the end of the row). */
    uint64_t u = 0;
    if ((size_t)(p - row) + 8 <= row_bytes) memcpy(&u, p, 8);
    else memcpy(&u, p, (size_t)bits);
    __m256i v = _mm256_set1_epi64x((long long)u);
    __m256i m = _mm256_set1_epi64x((1 << bits) - 1);
    __m256i lo = _mm256_and_si256(
        _mm256_srlv_epi64(v, _mm256_setr_epi64x(0, bits, 2 * bits, 3 * bits)), m); /* fields 0..3 */
    __m256i hi = _mm256_and_si256(
        _mm256_srlv_epi64(v, _mm256_setr_epi64x(4 * bits, 5 * bits, 6 * bits, 7 * bits)),
        m);                                                                          /* fields 4..7 */
    /* 32-bit lanes: lo = f0 . f1 . | f2 . f3 ., hi = f4 . f5 . | f6 . f7 . */
    __m256i both = _mm256_or_si256(lo, _mm256_slli_epi64(hi, 32)); /* f0 f4 f1 f5 | f2 f6 f3 f7 */
    return _mm256_permutevar8x32_epi32(both, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
}

INLINE float q_param(const loom_qmat *w, const uint16_t *p, size_t i) {
    return w->f16 ? _cvtsh_ss(p[i]) : loom_bf16_to_f32(p[i]);
}

/* buf[j] = scale * (float)q[k + j] + bias for the columns [k, end) of one
 * group, rounded twice (no FMA) exactly as the reference does, so only the
 * order of the sums can differ. */
INLINE void q_dequant_group(float *buf, const uint8_t *row, size_t row_bytes, size_t k,
                            size_t end, __m256 sc, __m256 bi, int bits) {
    for (; k < end; k += 8, buf += 8) {
        __m256 q = _mm256_cvtepi32_ps(q_fields8(row, row_bytes, k, bits));
        _mm256_storeu_ps(buf, _mm256_add_ps(_mm256_mul_ps(sc, q), bi));
    }
}

/* buf[0 .. len) = row r, columns [k0, k0 + len), dequantized. k0, len and
 * the group are multiples of 8. */
static void q_dequant(float *buf, const loom_qmat *w, size_t r, size_t k0, size_t len) {
    const size_t row_bytes = (size_t)w->n * (size_t)w->bits / 8;
    const uint8_t *row = (const uint8_t *)w->w + r * row_bytes;
    const size_t group = (size_t)w->group, ng = (size_t)w->n / group;
    /* the same columns TILE_R rows on into L2: a batched decode (a few
     * tokens) streams the rows as the matvec does */
    prefetch_span(row + TILE_R * row_bytes, k0 * (size_t)w->bits / 8, (k0 + len) * (size_t)w->bits / 8);
    for (size_t k = k0, end = k0 + len; k < end;) {
        size_t g = k / group, gend = LOOM_MIN(end, (g + 1) * group);
        __m256 sc = _mm256_set1_ps(q_param(w, w->scales, r * ng + g));
        __m256 bi = _mm256_set1_ps(q_param(w, w->biases, r * ng + g));
        float *b = buf + (k - k0);
        /* Constant widths get their own specialized loops. */
        if (w->bits == 4) q_dequant_group(b, row, row_bytes, k, gend, sc, bi, 4);
        else if (w->bits == 8) q_dequant_group(b, row, row_bytes, k, gend, sc, bi, 8);
        else q_dequant_group(b, row, row_bytes, k, gend, sc, bi, w->bits);
        k = gend;
    }
}

/* Decode (T == 1) for 4- and 8-bit rows, R (1..4) rows at a time, without
 * a dequantized copy: per group, y += scale * sum(x q) + bias * sum(x). The
 * weights are read once and x once per four rows; this is compute-bound
 * (unpacking), so the fewer instructions per weight the better. The next
 * R rows are prefetched a tile ahead: Zen 3, two threads, rows cycling
 * through 192 MiB, q8 15-18 -> 23-24 GB/s, q4 8 -> 10. */
INLINE void q_matvec_rows(float *y, const float *x, const loom_qmat *w, int r0, int R, int bits) {
    const size_t n = (size_t)w->n, group = (size_t)w->group, ng = n / group;
    const size_t row_bytes = n * (size_t)bits / 8, gbytes = group * (size_t)bits / 8;
    const uint8_t *row[4];
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        row[r] = (const uint8_t *)w->w + (size_t)(r0 + r) * row_bytes;
        acc[r] = _mm256_setzero_ps();
    }
    for (size_t g = 0; g < ng; g++) {
        __m256 p[4], xs = _mm256_setzero_ps();
        /* the group's bytes of the next R rows into L2 */
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            prefetch_span(row[r] + (size_t)R * row_bytes, g * gbytes, (g + 1) * gbytes);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) p[r] = _mm256_setzero_ps();
        for (size_t k = g * group, end = k + group; k < end; k += 8) {
            __m256 xv = _mm256_loadu_ps(x + k);
            xs = _mm256_add_ps(xs, xv);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                p[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q_fields8(row[r], row_bytes, k, bits)), xv,
                                       p[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            size_t i = (size_t)(r0 + r) * ng + g;
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(q_param(w, w->scales, i)), p[r], acc[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(q_param(w, w->biases, i)), xs, acc[r]);
        }
    }
    if (R == 4) {
        _mm_storeu_ps(y + r0, hsum4(acc[0], acc[1], acc[2], acc[3]));
    } else {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) y[r0 + r] = hsum(acc[r]);
    }
}

INLINE void q_matvec(float *y, const float *x, const loom_qmat *w, int r0, int r1, int bits) {
    int r = r0;
    for (; r + 4 <= r1; r += 4) q_matvec_rows(y, x, w, r, 4, bits);
    switch (r1 - r) {
    case 3: q_matvec_rows(y, x, w, r, 3, bits); break;
    case 2: q_matvec_rows(y, x, w, r, 2, bits); break;
    case 1: q_matvec_rows(y, x, w, r, 1, bits); break;
    default: break;
    }
}

static void matmul_q(float *y, int ldy, const float *x, int ldx, const loom_qmat *w, int T,
                     int r0, int r1) {
    if (w->n % 8 || w->group % 8 || w->bits < 1 || w->bits > 8) {
        /* Groups that split an 8-wide block: rare enough for the reference. */
        loom_kernels_ref.matmul_q(y, ldy, x, ldx, w, T, r0, r1);
        return;
    }
    if (T == 1 && (w->bits == 4 || w->bits == 8)) {
        if (w->bits == 4) q_matvec(y, x, w, r0, r1, 4);
        else q_matvec(y, x, w, r0, r1, 8);
        return;
    }
    float buf[TILE_R * QCHUNK] __attribute__((aligned(32)));
    const size_t n = (size_t)w->n, lx = (size_t)ldx, ly = (size_t)ldy;
    for (int r = r0; r < r1; r += TILE_R) {
        int R = LOOM_MIN(TILE_R, r1 - r);
        size_t k0 = 0;
        do { /* at least once, so that n == 0 still stores zeros */
            size_t len = LOOM_MIN((size_t)QCHUNK, n - k0);
            for (int i = 0; i < R; i++) q_dequant(buf + (size_t)i * QCHUNK, w, (size_t)(r + i), k0, len);
            int add = k0 > 0;
            switch (R) {
            case 4: tile_tokens(y + r, ly, x + k0, lx, buf, QCHUNK, len, T, 4, 0, add, DT_F32); break;
            case 3: tile_tokens(y + r, ly, x + k0, lx, buf, QCHUNK, len, T, 3, 0, add, DT_F32); break;
            case 2: tile_tokens(y + r, ly, x + k0, lx, buf, QCHUNK, len, T, 2, 0, add, DT_F32); break;
            default: tile_tokens(y + r, ly, x + k0, lx, buf, QCHUNK, len, T, 1, 0, add, DT_F32); break;
            }
            k0 += len;
        } while (k0 < n);
    }
}

/* ---- FP8 (e4m3) rows ------------------------------------------------------ */

/* Eight e4m3 codes as f32, each 2^-8 times its value: the code's bits
 * placed as an f16 (sign, then exponent and mantissa one bit lower; e4m3's
 * subnormals land on f16 subnormals, which F16C widens exactly), NaN codes
 * as an f16 NaN. Callers fold the 2^8 into the block scale. */
INLINE __m256 f8x8(const uint8_t *p) {
    __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    __m128i mag = _mm_and_si128(v, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(_mm_and_si128(_mm_slli_epi16(v, 8), _mm_set1_epi16((short)0x8000)),
                             _mm_slli_epi16(mag, 7));
    h = _mm_or_si128(h, _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)));
    return _mm256_cvtph_ps(h);
}

/* A row's next lines into L2, PF_BYTES ahead (one byte a weight). */
INLINE void f8_prefetch(const uint8_t *const *row, int R, size_t k) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) _mm_prefetch((const char *)row[r] + k + PF_BYTES, PF_HINT);
}

/* Decode (T == 1), R (1..4) rows: per column block, y += scale * sum(x q),
 * straight from the codes. The block width is a multiple of 8. */
INLINE void f8_matvec_rows(float *y, const float *x, const loom_f8mat *w, int r0, int R) {
    const size_t n = (size_t)w->n, bc = LOOM_MIN((size_t)w->bc, n);
    const int sc = loom_f8_scale_cols(w);
    const uint8_t *row[4];
    const float *srow[4];
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        row[r] = w->w + (size_t)(r0 + r) * n;
        srow[r] = w->scales + (size_t)((r0 + r) / w->br) * sc;
        acc[r] = _mm256_setzero_ps();
    }
    for (size_t k0 = 0, b = 0; k0 < n; k0 += bc, b++) {
        size_t k1 = LOOM_MIN(k0 + bc, n), k = k0;
        __m256 p0[4], p1[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) p0[r] = p1[r] = _mm256_setzero_ps();
        for (; k + 16 <= k1; k += 16) {
            __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
            if ((k & 63) == 0) f8_prefetch(row, R, k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                p0[r] = _mm256_fmadd_ps(f8x8(row[r] + k), x0, p0[r]);
                p1[r] = _mm256_fmadd_ps(f8x8(row[r] + k + 8), x1, p1[r]);
            }
        }
        if (k < k1) {
            __m256 x0 = _mm256_loadu_ps(x + k);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) p0[r] = _mm256_fmadd_ps(f8x8(row[r] + k), x0, p0[r]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(srow[r][b] * 256.0f),
                                     _mm256_add_ps(p0[r], p1[r]), acc[r]);
    }
    if (R == 4) {
        _mm_storeu_ps(y + r0, hsum4(acc[0], acc[1], acc[2], acc[3]));
    } else {
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) y[r0 + r] = hsum(acc[r]);
    }
}

/* buf[0 .. len) = row r, columns [k0, k0 + len), dequantized exactly as
 * the reference rounds them (code * 2^-8 times scale * 2^8 is the same
 * product). k0 and len are multiples of 8. */
static void f8_dequant(float *buf, const loom_f8mat *w, size_t r, size_t k0, size_t len) {
    const size_t n = (size_t)w->n, bc = (size_t)w->bc;
    const uint8_t *row = w->w + r * n;
    const float *srow = w->scales + (r / (size_t)w->br) * (size_t)loom_f8_scale_cols(w);
    for (size_t k = k0, end = k0 + len; k < end;) {
        size_t b = k / bc, bend = LOOM_MIN(end, (b + 1) * bc);
        __m256 s = _mm256_set1_ps(srow[b] * 256.0f);
        for (; k < bend; k += 8) _mm256_storeu_ps(buf + (k - k0), _mm256_mul_ps(f8x8(row + k), s));
    }
}

static void matmul_f8(float *y, int ldy, const float *x, int ldx, const loom_f8mat *w, int T,
                      int r0, int r1) {
    if (w->n % 8 || (w->bc % 8 && w->bc < w->n)) {
        /* blocks that split an 8-wide vector: not a layout checkpoints use */
        loom_kernels_ref.matmul_f8(y, ldy, x, ldx, w, T, r0, r1);
        return;
    }
    if (T == 1) {
        int r = r0;
        for (; r + 4 <= r1; r += 4) f8_matvec_rows(y, x, w, r, 4);
        switch (r1 - r) {
        case 3: f8_matvec_rows(y, x, w, r, 3); break;
        case 2: f8_matvec_rows(y, x, w, r, 2); break;
        case 1: f8_matvec_rows(y, x, w, r, 1); break;
        default: break;
        }
        return;
    }
    float buf[TILE_R * QCHUNK] __attribute__((aligned(32)));
    const size_t n = (size_t)w->n, lx = (size_t)ldx, ly = (size_t)ldy;
    for (int r = r0; r < r1; r += TILE_R) {
        int R = LOOM_MIN(TILE_R, r1 - r);
        size_t k0 = 0;
        do { /* at least once, so that n == 0 still stores zeros */
            size_t len = LOOM_MIN((size_t)QCHUNK, n - k0);
            for (int i = 0; i < R; i++) f8_dequant(buf + (size_t)i * QCHUNK, w, (size_t)(r + i), k0, len);
            int add = k0 > 0;
            switch (R) {
            case 4: tile_tokens(y + r, ly, x + k0, lx, buf, QCHUNK, len, T, 4, 0, add, DT_F32); break;
            case 3: tile_tokens(y + r, ly, x + k0, lx, buf, QCHUNK, len, T, 3, 0, add, DT_F32); break;
            case 2: tile_tokens(y + r, ly, x + k0, lx, buf, QCHUNK, len, T, 2, 0, add, DT_F32); break;
            default: tile_tokens(y + r, ly, x + k0, lx, buf, QCHUNK, len, T, 1, 0, add, DT_F32); break;
            }
            k0 += len;
        } while (k0 < n);
    }
}

/* ---- vector kernels ------------------------------------------------------ */

static float dot(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    if (i < n) {
        __m256i m = tail_mask(n - i);
        s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

static void axpy(float *y, float a, const float *x, int n) {
    __m256 av = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i),
                                                _mm256_loadu_ps(y + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 v = _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m),
                                   _mm256_maskload_ps(y + i, m));
        _mm256_maskstore_ps(y + i, m, v);
    }
}

/* attn_pv on NS (<= 2) slots x NV (<= 4) vectors of 8 from column 0 of
 * out: the block sits in registers while the keys run, and each V vector
 * loaded feeds every slot. Each accumulator starts from out and takes one
 * FMA per key in order, as axpy does, so neither the grouping of slots nor
 * the split of keys over calls changes a bit. The last vector holds rem
 * (1..8) columns. */
INLINE void pv_block(float *out, size_t ldo, const float *p, size_t ldp, const int *keys,
                     const float *v, size_t ldv, int NS, int NV, int rem) {
    __m256i tm = tail_mask(rem);
    __m256 acc[2][4];
    int lo = keys[0], hi = keys[1], same = 1;
#pragma GCC unroll 2
    for (int s = 0; s < NS; s++) {
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            acc[s][j] = j == NV - 1 && rem < 8 ? _mm256_maskload_ps(out + s * ldo + 8 * j, tm)
                                               : _mm256_loadu_ps(out + s * ldo + 8 * j);
        lo = LOOM_MIN(lo, keys[2 * s]);
        hi = LOOM_MAX(hi, keys[2 * s + 1]);
        same &= keys[2 * s] == keys[0] && keys[2 * s + 1] == keys[1];
    }
    for (int i = lo; i < hi; i++) {
        const float *vr = v + (size_t)i * ldv;
        __m256 vv[4];
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++)
            vv[j] = j == NV - 1 && rem < 8 ? _mm256_maskload_ps(vr + 8 * j, tm) : _mm256_loadu_ps(vr + 8 * j);
#pragma GCC unroll 2
        for (int s = 0; s < NS; s++) {
            /* slots of one query token share their keys: no test then */
            if (!same && (i < keys[2 * s] || i >= keys[2 * s + 1])) continue;
            __m256 pb = _mm256_broadcast_ss(p + s * ldp + i);
#pragma GCC unroll 4
            for (int j = 0; j < NV; j++) acc[s][j] = _mm256_fmadd_ps(pb, vv[j], acc[s][j]);
        }
    }
#pragma GCC unroll 2
    for (int s = 0; s < NS; s++)
#pragma GCC unroll 4
        for (int j = 0; j < NV; j++) {
            if (j == NV - 1 && rem < 8) _mm256_maskstore_ps(out + s * ldo + 8 * j, tm, acc[s][j]);
            else _mm256_storeu_ps(out + s * ldo + 8 * j, acc[s][j]);
        }
}

static void pv_any(float *out, size_t ldo, const float *p, size_t ldp, const int *keys,
                   const float *v, size_t ldv, int NS, int NV, int rem) {
#define C(nv)                                                                       \
    case nv:                                                                        \
        if (NS == 2) pv_block(out, ldo, p, ldp, keys, v, ldv, 2, nv, rem);          \
        else pv_block(out, ldo, p, ldp, keys, v, ldv, 1, nv, rem);                  \
        break;
    switch (NV) { C(1) C(2) C(3) C(4) default: break; }
#undef C
}

static void attn_pv(float *out, int ldo, const float *p, int ldp, const int *keys, int slots,
                    const float *v, int ldv, int n_keys, int hd) {
    (void)n_keys;
    for (int s = 0; s < slots; s += 2)
        for (int d = 0; d < hd; d += 32) {
            int w = LOOM_MIN(32, hd - d), nv = (w + 7) / 8;
            pv_any(out + (size_t)s * ldo + d, (size_t)ldo, p + (size_t)s * ldp, (size_t)ldp,
                   keys + 2 * s, v + d, (size_t)ldv, LOOM_MIN(2, slots - s), nv, w - 8 * (nv - 1));
        }
}

static void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        s0 = _mm256_fmadd_ps(a, a, s0);
        s1 = _mm256_fmadd_ps(b, b, s1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        s0 = _mm256_fmadd_ps(a, a, s0);
    }
    if (i < n) {
        __m256 a = _mm256_maskload_ps(x + i, tail_mask(n - i));
        s1 = _mm256_fmadd_ps(a, a, s1);
    }
    float ss = hsum(_mm256_add_ps(s0, s1));
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    __m256 iv = _mm256_set1_ps(inv);
    /* Same rounding order as the reference: (x * inv) * w. */
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), iv),
                                              _mm256_loadu_ps(w + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + i, m), iv),
                                 _mm256_maskload_ps(w + i, m));
        _mm256_maskstore_ps(y + i, m, v);
    }
}

/* expf for eight lanes, within ~2 ulp of libm over the whole range,
 * including overflow to inf, gradual underflow to 0 and NaN passthrough.
 * x = n*ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact r), then a
 * degree-6 polynomial for e^r and 2^n applied as two factors so that n in
 * [-150, 128] never leaves the exponent range of either factor. */
INLINE __m256 exp8(__m256 x) {
    /* max/min return the second operand when one is NaN: keep x second. */
    x = _mm256_max_ps(_mm256_set1_ps(-104.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}

static void softmax(float *x, int n) {
    if (n <= 0) return;
    /* The maximum ignores NaN like the reference's `x > m ? x : m`. */
    float m = -INFINITY;
    int i = 0;
    if (n >= 8) {
        __m256 mv = _mm256_set1_ps(-INFINITY);
        for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(_mm256_loadu_ps(x + i), mv);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        m = _mm_cvtss_f32(h);
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    __m256 mv = _mm256_set1_ps(m), s = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    if (i < n) {
        __m256i mk = tail_mask(n - i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, mk), mv));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(mk));
        _mm256_maskstore_ps(x + i, mk, e);
        s = _mm256_add_ps(s, e);
    }
    __m256 inv = _mm256_set1_ps(1.0f / hsum(s));
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    if (i < n) {
        __m256i mk = tail_mask(n - i);
        _mm256_maskstore_ps(x + i, mk, _mm256_mul_ps(_mm256_maskload_ps(x + i, mk), inv));
    }
}

INLINE __m256 silu_mul8(__m256 g, __m256 u) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

static void silu_mul(float *g, const float *u, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(g + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(g + i, m, silu_mul8(_mm256_maskload_ps(g + i, m),
                                                _mm256_maskload_ps(u + i, m)));
    }
}

/* gelu_tanh(x) = 0.5 x (1 + tanh(z)), z = 0.79788456 (x + 0.044715 x^3),
 * with 1 + tanh(z) = 2 / (1 + e^(-2z)), which has no cancellation when z is
 * very negative (the reference's 1 + tanhf(z) has an absolute error of
 * about one ulp of 1 there; the test allows for that). z is computed in the
 * reference's order. */
INLINE __m256 gelu_tanh_mul8(__m256 x, __m256 u) {
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x), x), x);
    __m256 z = _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), _mm256_add_ps(x, x3));
    __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), z));
    __m256 s = _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), s), u);
}

static void gelu_tanh_mul(float *g, const float *u, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(g + i, gelu_tanh_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        _mm256_maskstore_ps(g + i, m, gelu_tanh_mul8(_mm256_maskload_ps(g + i, m),
                                                     _mm256_maskload_ps(u + i, m)));
    }
}

static void f16_to_f32(float *y, const uint16_t *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_w(x, (size_t)i, DT_F16));
    if (i < n)
        _mm256_maskstore_ps(y + i, tail_mask(n - i), load_w_tail(x, (size_t)i, n - i, DT_F16));
}

static void bf16_to_f32(float *y, const uint16_t *x, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load_w(x, (size_t)i, DT_BF16));
    if (i < n)
        _mm256_maskstore_ps(y + i, tail_mask(n - i), load_w_tail(x, (size_t)i, n - i, DT_BF16));
}

const loom_kernels loom_kernels_avx2 = {
    .name = "avx2",
    .matmul_f32 = matmul_f32,
    .matmul_f16 = matmul_f16,
    .matmul_bf16 = matmul_bf16,
    .matmul_q = matmul_q,
    .matmul_f8 = matmul_f8,
    .dot = dot,
    .axpy = axpy,
    .attn_pv = attn_pv,
    .rmsnorm = rmsnorm,
    .softmax = softmax,
    .silu_mul = silu_mul,
    .gelu_tanh_mul = gelu_tanh_mul,
    .f16_to_f32 = f16_to_f32,
    .bf16_to_f32 = bf16_to_f32,
};
