/* ops_avx512: helpers shared by the AVX-512 kernel files; only included
 * by files compiled with the AVX-512 flags. */
#ifndef LOOM_OPS_AVX512_H
#define LOOM_OPS_AVX512_H

#include <immintrin.h>

/* In place 16 x 16 transpose of dwords: r[m] becomes lane m of every r[i]. */
static inline __attribute__((always_inline)) void loom_tr16(__m512i r[16]) {
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
    /* r[4i + e], 128-bit lane L: element 4L + e of rows 4i .. 4i + 3. */
#pragma GCC unroll 4
    for (int e = 0; e < 4; e++) {
        __m512i u0 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44);
        __m512i u1 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xEE);
        __m512i v0 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44);
        __m512i v1 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xEE);
        t[e] = _mm512_shuffle_i32x4(u0, v0, 0x88);
        t[4 + e] = _mm512_shuffle_i32x4(u0, v0, 0xDD);
        t[8 + e] = _mm512_shuffle_i32x4(u1, v1, 0x88);
        t[12 + e] = _mm512_shuffle_i32x4(u1, v1, 0xDD);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

#endif
