/* kernels_attn: softmax attention over the paged KV pool.
 *
 * Both kernels read K and V rows through block tables in the pool layout of
 * src/model/kv_layout.h (see loom_cuda_kv in cuda.h) and compute what the CPU
 * forward's attn_task computes: s = (q . k) * scale, optional softcap
 * cap * tanh(s / cap), softmax over the positions [lo, pos] (lo from the
 * sliding window), then the weighted sum of V. A q head h reads KV head
 * h / (n_heads / n_kv_heads) (GQA); a block handles one KV head and all the
 * q heads of its group, so each K/V row is read once per group.
 *
 * Decode (one query per sequence): flash-decoding. The KV range of each
 * sequence is cut into splits of `split` positions; block (split, kv head,
 * sequence) writes its partial max m, sum l and unnormalised output; the
 * last split block of each (sequence, kv head) to finish rescales and
 * combines them (a second kernel does it after the scalar kernel). At
 * small batch a thread-block cluster per (sequence, KV head) does the same
 * with its partials in distributed shared memory (attn_decode_cluster_kernel).
 *
 * Prefill (causal, many queries per sequence): a block takes a tile of QT
 * consecutive query tokens of one row (QT * group query rows) and walks
 * the KV range in tiles of KT = 32 positions held in shared memory,
 * keeping a running max, sum and output per query row (online softmax).
 * Masked scores are -inf; a row whose scores are all masked so far keeps
 * m = -inf, l = 0 and contributes nothing. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <cooperative_groups.h>

#include "cuda/cuda_int.cuh"

namespace cg = cooperative_groups;

#define DEC_THREADS 128
#define PRE_THREADS 256
#define KT 32

__device__ __forceinline__ float kv_elem(const void *p, size_t i, int dt) {
    if (dt == LOOM_CUDA_F32) return ((const float *)p)[i];
    if (dt == LOOM_CUDA_F16) return __half2float(((const __half *)p)[i]);
    return __uint_as_float((unsigned)((const unsigned short *)p)[i] << 16);
}

__device__ __forceinline__ float a_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float a_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float cap_score(float s, float softcap) {
    return softcap > 0 ? tanhf(s / softcap) * softcap : s;
}

/* First element of position p's row (its block must be mapped). */
__device__ __forceinline__ size_t kv_row(const int32_t *table, int p, int bs, size_t stride) {
    return ((size_t)table[p / bs] * bs + (size_t)(p % bs)) * stride;
}

/* ---- decode ------------------------------------------------------------- */

__global__ void attn_decode_kernel(float *part_acc, float *part_ml, const float *q,
                                   const void *kb, const void *vb, int dt, size_t stride, int bs,
                                   const int32_t *tables, int tstride, const int32_t *lens,
                                   int nh, int nkv, int hd, float scale, float softcap,
                                   int window, int split, int n_splits) {
    extern __shared__ float smem[];
    int sp = blockIdx.x, kh = blockIdx.y, s = blockIdx.z;
    int group = nh / nkv;
    float *qs = smem;                   /* (group, hd) scaled queries */
    float *sc = qs + group * hd;        /* (group, split) scores, then weights */
    float *ml = sc + group * split;     /* (group, 2) max and sum */
    int len = lens[s], pos = len - 1;
    int lo = window > 0 ? max(0, pos - window + 1) : 0;
    int p0 = lo + sp * split, p1 = min(len, p0 + split), n = p1 - p0;
    size_t pbase = ((size_t)s * nh + (size_t)kh * group) * n_splits + sp;  /* + g * n_splits */
    if (n <= 0) {
        for (int g = threadIdx.x; g < group; g += blockDim.x) {
            part_ml[(pbase + (size_t)g * n_splits) * 2] = -INFINITY;
            part_ml[(pbase + (size_t)g * n_splits) * 2 + 1] = 0;
        }
        return;
    }
    const int32_t *table = tables + (size_t)s * tstride;
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x)
        qs[i] = q[((size_t)s * nh + (size_t)kh * group) * hd + i] * scale;
    __syncthreads();
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = w; j < n; j += nw) {
        size_t r = kv_row(table, p0 + j, bs, stride) + (size_t)kh * hd;
        for (int g = 0; g < group; g++) {
            float d = 0;
            for (int i = lane; i < hd; i += 32) d += qs[g * hd + i] * kv_elem(kb, r + i, dt);
            d = a_warp_sum(d);
            if (lane == 0) sc[g * split + j] = cap_score(d, softcap);
        }
    }
    __syncthreads();
    for (int g = w; g < group; g += nw) {
        float m = -INFINITY;
        for (int j = lane; j < n; j += 32) m = fmaxf(m, sc[g * split + j]);
        m = a_warp_max(m);
        float l = 0;
        for (int j = lane; j < n; j += 32) {
            float e = expf(sc[g * split + j] - m);
            sc[g * split + j] = e;
            l += e;
        }
        l = a_warp_sum(l);
        if (lane == 0) {
            ml[2 * g] = m;
            ml[2 * g + 1] = l;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x) {
        int g = i / hd, d = i % hd;
        float a = 0;
        for (int j = 0; j < n; j++)
            a += sc[g * split + j] * kv_elem(vb, kv_row(table, p0 + j, bs, stride) + (size_t)kh * hd + d, dt);
        part_acc[(pbase + (size_t)g * n_splits) * hd + d] = a;
    }
    for (int g = threadIdx.x; g < group; g += blockDim.x) {
        part_ml[(pbase + (size_t)g * n_splits) * 2] = ml[2 * g];
        part_ml[(pbase + (size_t)g * n_splits) * 2 + 1] = ml[2 * g + 1];
    }
}

/* Decode for head_dim = 32 * EPL (64, 128, 256) and groups of at most
 * DEC_GMAX q heads, the shapes of the common models. The kernel above
 * walks positions one after another in each thread (a dependent table and
 * row load per position): latency-bound. Here a lane owns EPL consecutive
 * dims of the head, so a warp reads one K or V row in one coalesced pass;
 * the 4 warps take interleaved runs of DEC_PB positions, the queries and
 * the running sums stay in registers, and the warps' partial outputs meet
 * in shared memory.
 * Same partials (m, l, unnormalised acc) as attn_decode_kernel. */
#define DEC_GMAX 8
#define DEC_PB 2   /* positions a warp loads at once (4: batch 32 +2%, no more) */

template <int EPL>
__device__ __forceinline__ void kv_load(const void *p, size_t i, int dt, float *o) {
    if (dt == LOOM_CUDA_BF16) {
        const unsigned short *b = (const unsigned short *)p + i;
        if constexpr (EPL == 4) {  /* one 8-byte load */
            uint2 u = *(const uint2 *)b;
            o[0] = __uint_as_float(u.x << 16);
            o[1] = __uint_as_float(u.x & 0xffff0000u);
            o[2] = __uint_as_float(u.y << 16);
            o[3] = __uint_as_float(u.y & 0xffff0000u);
        } else {
#pragma unroll
            for (int e = 0; e < EPL; e++) o[e] = __uint_as_float((unsigned)b[e] << 16);
        }
    } else if (dt == LOOM_CUDA_F16) {
#pragma unroll
        for (int e = 0; e < EPL; e++) o[e] = __half2float(((const __half *)p)[i + e]);
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) o[e] = ((const float *)p)[i + e];
    }
}

/* The V rows of the DEC_PB positions from j0 of a split (the last
 * position repeated past its end). */
template <int EPL>
__device__ __forceinline__ void dec_load_v(float (&v)[DEC_PB][EPL], const void *vb, int dt,
                                           const int32_t *table, int bs, size_t stride,
                                           size_t hoff, int p0, int j0, int n) {
#pragma unroll
    for (int b = 0; b < DEC_PB; b++) {
        int p = p0 + min(j0 + b, n - 1);
        kv_load<EPL>(vb, ((size_t)table[p / bs] * bs + (size_t)(p % bs)) * stride + hoff, dt,
                     v[b]);
    }
}

/* The combine of attn_combine_kernel for the q heads of one (sequence, KV
 * head), done by the last of its split blocks to finish: counter cnt
 * (zero before) tallies them and is left zero again. Partials written by
 * other blocks are read through L2 (__ldcg): L1 is not coherent. All (m,
 * l) pairs are loaded at once into sm (2 * group * n_splits floats of the
 * block's shared memory, free by then) and the weights e^(m - M) made
 * there, so the sums over the splits are plain independent loads: at
 * batch 1 a split-by-split walk of dependent loads cost more than the
 * attention itself. */
__device__ __noinline__ void attn_combine_last(float *out, const float *part_acc,
                                               const float *part_ml, int *cnt, int nh, int hd,
                                               int group, int kh, int s, int n_splits, float *sm) {
    __shared__ int last;
    __shared__ float sL[DEC_GMAX];
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(cnt, 1) == n_splits - 1;
        if (last) *cnt = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    size_t base = ((size_t)s * nh + (size_t)kh * group) * n_splits;  /* + g * n_splits + sp */
    float *me = sm, *le = sm + group * n_splits;  /* m, then the weight e; l */
    for (int i = threadIdx.x; i < group * n_splits; i += blockDim.x) {
        me[i] = __ldcg(part_ml + (base + i) * 2);
        le[i] = __ldcg(part_ml + (base + i) * 2 + 1);
    }
    __syncthreads();
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int g = w; g < group; g += nw) {
        float M = -INFINITY, L = 0;
        for (int sp = lane; sp < n_splits; sp += 32)
            if (le[g * n_splits + sp] > 0) M = fmaxf(M, me[g * n_splits + sp]);
        M = a_warp_max(M);
        for (int sp = lane; sp < n_splits; sp += 32) {
            float l = le[g * n_splits + sp], e = l > 0 ? expf(me[g * n_splits + sp] - M) : 0.0f;
            me[g * n_splits + sp] = e;
            L += l * e;
        }
        L = a_warp_sum(L);
        if (lane == 0) sL[g] = L;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x) {
        int g = i / hd, d = i % hd;
        const float *pa = part_acc + (base + (size_t)g * n_splits) * hd + d, *e = me + g * n_splits;
        float a = 0;
#pragma unroll 8
        for (int sp = 0; sp < n_splits; sp++) {
            float v = __ldcg(pa + (size_t)sp * hd);  /* an empty split's is never written */
            a += e[sp] > 0 ? v * e[sp] : 0.0f;
        }
        float L = sL[g];
        out[((size_t)s * nh + (size_t)kh * group + g) * hd + d] = L > 0 ? a / L : 0.0f;
    }
}

/* cnt NULL: partials only (attn_combine_kernel follows); else the last
 * split block of each (sequence, KV head) also writes out. */
template <int EPL>
/* 8 blocks an SM (64 registers) up to head_dim 128: a batch of 128
 * sequences x 8 KV heads is then one wave. */
__global__ void __launch_bounds__(DEC_THREADS, EPL >= 8 ? 4 : 8)
attn_decode_vec_kernel(float *part_acc, float *part_ml, float *out, int *cnts, const float *q,
                       const void *kb, const void *vb, int dt, size_t stride, int bs,
                       const int32_t *tables, int tstride, const int32_t *lens, int nh, int nkv,
                       float scale, float softcap, int window, int split, int n_splits) {
    constexpr int HD = 32 * EPL, NW = DEC_THREADS / 32;
    extern __shared__ float smem[];
    pdl_trigger();
    pdl_wait();
    int sp = blockIdx.x, kh = blockIdx.y, s = blockIdx.z;
    int group = nh / nkv;
    float *sc = smem;                       /* (group, split) scores, then weights */
    float *red = sc + group * split;        /* (NW, group, HD) partial outputs */
    float *ml = red + NW * group * HD;      /* (group, 2) */
    int len = lens[s], pos = len - 1;
    int lo = window > 0 ? max(0, pos - window + 1) : 0;
    int p0 = lo + sp * split, p1 = min(len, p0 + split), n = p1 - p0;
    size_t pbase = ((size_t)s * nh + (size_t)kh * group) * n_splits + sp;
    if (n <= 0) {
        if (cnts && n_splits == 1) {  /* nothing to attend to: zeros, as the combine */
            for (int i = threadIdx.x; i < group * HD; i += blockDim.x)
                out[((size_t)s * nh + (size_t)kh * group) * HD + i] = 0.0f;
            return;
        }
        for (int g = threadIdx.x; g < group; g += blockDim.x) {
            part_ml[(pbase + (size_t)g * n_splits) * 2] = -INFINITY;
            part_ml[(pbase + (size_t)g * n_splits) * 2 + 1] = 0;
        }
        if (cnts)
            attn_combine_last(out, part_acc, part_ml, cnts + (size_t)s * nkv + kh, nh, HD, group,
                              kh, s, n_splits, red);
        return;
    }
    const int32_t *table = tables + (size_t)s * tstride;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float qr[DEC_GMAX][EPL];
#pragma unroll
    for (int g = 0; g < DEC_GMAX; g++)
#pragma unroll
        for (int e = 0; e < EPL; e++)
            qr[g][e] = g < group ? q[((size_t)s * nh + (size_t)kh * group + g) * HD + lane * EPL + e] * scale
                                 : 0.0f;
    size_t hoff = (size_t)kh * HD + (size_t)lane * EPL;
    /* A warp takes DEC_PB positions at a time and issues all their table
     * and row loads before using any: one memory latency per run, not per
     * position (decode at small batch waits on these chains). */
    for (int j0 = w * DEC_PB; j0 < n; j0 += NW * DEC_PB) {
        float k[DEC_PB][EPL];
#pragma unroll
        for (int b = 0; b < DEC_PB; b++) {
            int p = p0 + min(j0 + b, n - 1);
            kv_load<EPL>(kb, ((size_t)table[p / bs] * bs + (size_t)(p % bs)) * stride + hoff, dt,
                         k[b]);
        }
#pragma unroll
        for (int b = 0; b < DEC_PB; b++) {
            if (j0 + b >= n) break;
#pragma unroll
            for (int g = 0; g < DEC_GMAX; g++) {
                if (g >= group) break;
                float d = 0;
#pragma unroll
                for (int e = 0; e < EPL; e++) d += qr[g][e] * k[b][e];
                d = a_warp_sum(d);
                if (lane == 0) sc[g * split + j0 + b] = cap_score(d, softcap);
            }
        }
    }
    /* The warp's first V rows do not depend on the softmax: they load
     * across it (one memory latency less at batch 1, where each warp has
     * one or two runs). */
    float v[DEC_PB][EPL];
    if (w * DEC_PB < n) dec_load_v<EPL>(v, vb, dt, table, bs, stride, hoff, p0, w * DEC_PB, n);
    __syncthreads();
    for (int g = w; g < group; g += NW) {
        float m = -INFINITY;
        for (int j = lane; j < n; j += 32) m = fmaxf(m, sc[g * split + j]);
        m = a_warp_max(m);
        float l = 0;
        for (int j = lane; j < n; j += 32) {
            float e = expf(sc[g * split + j] - m);
            sc[g * split + j] = e;
            l += e;
        }
        l = a_warp_sum(l);
        if (lane == 0) {
            ml[2 * g] = m;
            ml[2 * g + 1] = l;
        }
    }
    __syncthreads();
    float acc[DEC_GMAX][EPL];
#pragma unroll
    for (int g = 0; g < DEC_GMAX; g++)
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[g][e] = 0;
    for (int j0 = w * DEC_PB; j0 < n; j0 += NW * DEC_PB) {
        if (j0 != w * DEC_PB) dec_load_v<EPL>(v, vb, dt, table, bs, stride, hoff, p0, j0, n);
#pragma unroll
        for (int b = 0; b < DEC_PB; b++) {
            if (j0 + b >= n) break;
#pragma unroll
            for (int g = 0; g < DEC_GMAX; g++) {
                if (g >= group) break;
                float pw = sc[g * split + j0 + b];
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[g][e] += pw * v[b][e];
            }
        }
    }
#pragma unroll
    for (int g = 0; g < DEC_GMAX; g++) {
        if (g >= group) break;
#pragma unroll
        for (int e = 0; e < EPL; e++) red[((size_t)w * group + g) * HD + lane * EPL + e] = acc[g][e];
    }
    __syncthreads();
    /* one split (large batches): the combine is acc / l, written at once */
    int direct = cnts && n_splits == 1;
    for (int i = threadIdx.x; i < group * HD; i += blockDim.x) {
        int g = i / HD, d = i % HD;
        float a = 0;
#pragma unroll
        for (int ww = 0; ww < NW; ww++) a += red[((size_t)ww * group + g) * HD + d];
        if (direct) {
            float l = ml[2 * g + 1];
            out[((size_t)s * nh + (size_t)kh * group + g) * HD + d] = l > 0 ? a / l : 0.0f;
        } else {
            part_acc[(pbase + (size_t)g * n_splits) * HD + d] = a;
        }
    }
    if (direct) return;
    for (int g = threadIdx.x; g < group; g += blockDim.x) {
        part_ml[(pbase + (size_t)g * n_splits) * 2] = ml[2 * g];
        part_ml[(pbase + (size_t)g * n_splits) * 2 + 1] = ml[2 * g + 1];
    }
    if (cnts)
        attn_combine_last(out, part_acc, part_ml, cnts + (size_t)s * nkv + kh, nh, HD, group, kh,
                          s, n_splits, red);
}

/* out[s, h] = sum_sp acc_sp * e^(m_sp - M) / sum_sp l_sp * e^(m_sp - M). */
__global__ void attn_combine_kernel(float *out, const float *part_acc, const float *part_ml,
                                    int nh, int hd, int n_splits) {
    int h = blockIdx.x, s = blockIdx.y;
    size_t base = ((size_t)s * nh + h) * n_splits;
    float M = -INFINITY;
    for (int sp = 0; sp < n_splits; sp++)
        if (part_ml[(base + sp) * 2 + 1] > 0) M = fmaxf(M, part_ml[(base + sp) * 2]);
    float L = 0;
    for (int sp = 0; sp < n_splits; sp++) {
        float l = part_ml[(base + sp) * 2 + 1];
        if (l > 0) L += l * expf(part_ml[(base + sp) * 2] - M);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0;
        for (int sp = 0; sp < n_splits; sp++) {
            float l = part_ml[(base + sp) * 2 + 1];
            if (l > 0) a += part_acc[(base + sp) * hd + d] * expf(part_ml[(base + sp) * 2] - M);
        }
        out[((size_t)s * nh + h) * hd + d] = L > 0 ? a / L : 0.0f;
    }
}

/* Decode at small batch through a thread-block cluster (sm_90): the
 * cluster's CL CTAs share one (sequence, KV head) and the split partials
 * meet in distributed shared memory, not through global scratch and a
 * counter. At batch 1 the split kernel above is a chain of dependent
 * steps (lengths, table, K, V, partials, fence, counter, combine loads),
 * each a memory latency; here it is: lengths and table before the PDL
 * wait (they are copied in before the step's first kernel, so they load
 * while the kernel ahead drains), then q, K and V of a run in one go,
 * then shared memory and the cluster barrier.
 * A warp takes CL_PB consecutive positions a run and keeps a running max,
 * sum and output per q head in registers (online softmax: no scores in
 * shared memory, no barrier inside the walk); the 8 warps of a CTA, then
 * the CTAs of the cluster, are combined as the split partials are. */
#define CL_WARPS 8
#define CL_PB 4      /* positions a warp loads at once, K and V together */
#define CL_MAX 8     /* the portable cluster size */

/* Element offsets of the K/V rows of positions j0 .. j0 + CL_PB - 1 (past
 * n: the last one again; its scores are masked). */
__device__ __forceinline__ void cl_rows(size_t (&r)[CL_PB], const int32_t *table, int bs,
                                        size_t stride, size_t hoff, int lo, int j0, int n) {
#pragma unroll
    for (int b = 0; b < CL_PB; b++) {
        int p = lo + min(j0 + b, n - 1);
        r[b] = ((size_t)table[p / bs] * bs + (size_t)(p % bs)) * stride + hoff;
    }
}

/* What the fused decode (loom_cuda_attn_decode_qkv) needs to make q, K
 * and V of the step's token from the q/k/v GEMV's output itself. */
typedef struct cl_qkv {
    const float *qkv;            /* (n_seqs, (nh + 2 * nkv) * HD), sequence s's token is row s */
    const float *bias, *qn, *kn; /* NULL = none */
    float eps;
    const int32_t *slot;         /* [n_seqs] pool row of the new position */
    int rot;                     /* 0 or HD */
    const float *cs, *sn;        /* rope rows (n_seqs, ld) */
    int ld;
    void *pk, *pv;               /* the pool (kb, vb) for the store */
} cl_qkv;

/* One head of the qkv row (bias added), a lane's EPL elements at lane *
 * EPL: RMSNorm (has_nw), rope when rot (the partner of element i, i +- HD/2,
 * sits 16 lanes away). The arithmetic of qkv_post_warp_kernel. */
template <int EPL>
__device__ __forceinline__ void cl_head(float (&v)[EPL], const float (&wn)[EPL], int has_nw,
                                        float eps, int rot, const float (&c)[EPL],
                                        const float (&sv)[EPL], int lane) {
    constexpr int HD = 32 * EPL;
    if (has_nw) {
        float ss = 0;
#pragma unroll
        for (int e = 0; e < EPL; e++) ss += v[e] * v[e];
        ss = a_warp_sum(ss);
        float inv = 1.0f / sqrtf(ss / (float)HD + eps);
#pragma unroll
        for (int e = 0; e < EPL; e++) v[e] = v[e] * inv * wn[e];
    }
    if (rot) {
        int lowh = lane < 16;
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            float o = __shfl_xor_sync(0xffffffffu, v[e], 16);
            v[e] = lowh ? v[e] * c[e] - o * sv[e] : v[e] * c[e] + o * sv[e];
        }
    }
}

/* o = p[0 .. EPL) (+ b[0 .. EPL) when b) */
template <int EPL>
__device__ __forceinline__ void cl_vec(float (&o)[EPL], const float *p, const float *b) {
    float t[EPL];
    if constexpr (EPL == 4) {
        float4 u = *(const float4 *)p;
        o[0] = u.x, o[1] = u.y, o[2] = u.z, o[3] = u.w;
        u = b ? *(const float4 *)b : make_float4(0, 0, 0, 0);
        t[0] = u.x, t[1] = u.y, t[2] = u.z, t[3] = u.w;
    } else {
#pragma unroll
        for (int e = 0; e < EPL; e++) o[e] = p[e], t[e] = b ? b[e] : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < EPL; e++) o[e] += t[e];
}

/* v rounded to the pool's type in place and stored at element i. */
template <int EPL>
__device__ __forceinline__ void cl_store(void *p, size_t i, int dt, float (&v)[EPL]) {
#pragma unroll
    for (int e = 0; e < EPL; e++) {
        if (dt == LOOM_CUDA_F32) {
            ((float *)p)[i + e] = v[e];
        } else if (dt == LOOM_CUDA_F16) {
            __half h = __float2half_rn(v[e]);
            ((__half *)p)[i + e] = h;
            v[e] = __half2float(h);
        } else {
            __nv_bfloat16 h = __float2bfloat16_rn(v[e]);
            ((__nv_bfloat16 *)p)[i + e] = h;
            v[e] = __bfloat162float(h);
        }
    }
}

/* K and V rows of a run (rr), and the next run's row offsets. */
template <int EPL>
__device__ __forceinline__ void cl_load_run(float (&k)[CL_PB][EPL], float (&v)[CL_PB][EPL],
                                            size_t (&rr)[CL_PB], const void *kb, const void *vb,
                                            int dt, const int32_t *table, int bs, size_t stride,
                                            size_t hoff, int lo, int jn, int n) {
#pragma unroll
    for (int b = 0; b < CL_PB; b++) {
        kv_load<EPL>(kb, rr[b], dt, k[b]);
        kv_load<EPL>(vb, rr[b], dt, v[b]);
    }
    /* the next run's table entries load beside this run's rows */
    if (jn < n) cl_rows(rr, table, bs, stride, hoff, lo, jn, n);
}

/* GM: q heads a KV head at most (group <= GM). Grid (CL, KV heads,
 * sequences), clusters of (CL, 1, 1). 2 CTAs an SM at 128 registers up to
 * 4 x 128 accumulators a lane's worth; 8 q heads of head_dim 128 would
 * spill there.
 * QKV: q, the new K and V come from the q/k/v GEMV's output (x.qkv; what
 * qkv_post does), one kernel less a layer. Every warp makes its group's q
 * heads in registers; warp 0 of rank 0 makes K and V of the new position,
 * stores them into the pool and folds that position in from registers, so
 * no CTA reads the row being written, and the older rows (written by
 * earlier steps) are loaded before the PDL wait. */
template <int EPL, int GM, bool QKV>
__global__ void __launch_bounds__(CL_WARPS * 32, GM * EPL >= 32 ? 1 : 2)
attn_decode_cluster_kernel(float *out, const float *q, const void *kb, const void *vb, int dt,
                           size_t stride, int bs, const int32_t *tables, int tstride,
                           const int32_t *lens, int nh, int nkv, float scale, float softcap,
                           int window, cl_qkv x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int HD = 32 * EPL, NW = CL_WARPS, RUN = NW * CL_PB;
    __shared__ float red[NW * GM * HD];  /* (NW, group, HD) the warps' outputs */
    __shared__ float wml[NW][GM][2];     /* the warps' (m, l) */
    __shared__ float cacc[GM * HD];      /* (group, HD) the CTA's output, read by the cluster */
    __shared__ float cml[GM][2];         /* the CTA's (m, l) */
    cg::cluster_group cl = cg::this_cluster();
    int rank = (int)cl.block_rank(), ncl = (int)cl.num_blocks();
    int kh = blockIdx.y, s = blockIdx.z, group = nh / nkv;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    pdl_trigger();
    int len = lens[s], pos = len - 1;
    int lo = window > 0 ? max(0, pos - window + 1) : 0, n = len - lo;
    /* QKV: the new position (the last) is not read from the pool */
    int nw = QKV ? n - 1 : n;
    int own = QKV && rank == 0 && w == 0;  /* the warp that makes K and V */
    const int32_t *table = tables + (size_t)s * tstride;
    size_t hoff = (size_t)kh * HD + (size_t)lane * EPL;
    int j0 = rank * RUN + w * CL_PB, step = ncl * RUN;
    size_t rr[CL_PB];
    float k[CL_PB][EPL], v[CL_PB][EPL];
    if (j0 < nw) cl_rows(rr, table, bs, stride, hoff, lo, j0, nw);
    /* norm weights and the older rows: before the wait (no kernel of this
     * step writes them) */
    float wq[EPL], wk[EPL];
    int loaded = 0;
    int nall = nh + 2 * nkv;
    if (QKV) {
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            wq[e] = x.qn ? x.qn[lane * EPL + e] : 1.0f;
            wk[e] = x.kn ? x.kn[lane * EPL + e] : 1.0f;
        }
        if (j0 < nw) {
            cl_load_run<EPL>(k, v, rr, kb, vb, dt, table, bs, stride, hoff, lo, j0 + step, nw);
            loaded = 1;
        }
    }
    pdl_wait();
    float qr[GM][EPL], acc[GM][EPL], m[GM], l[GM], kn_[EPL], vn_[EPL];
    if (QKV) {
        const float *row = x.qkv + (size_t)s * nall * HD + lane * EPL;
        const float *bia = x.bias ? x.bias + lane * EPL : NULL;  /* (nall * HD) */
        float c[EPL], sv[EPL];
        int kk = (lane * EPL) & (HD / 2 - 1);
#pragma unroll
        for (int e = 0; e < EPL; e++) {
            c[e] = x.rot ? x.cs[(size_t)s * x.ld + kk + e] : 1.0f;
            sv[e] = x.rot ? x.sn[(size_t)s * x.ld + kk + e] : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g < group)
                cl_vec<EPL>(qr[g], row + ((size_t)kh * group + g) * HD,
                            bia ? bia + ((size_t)kh * group + g) * HD : NULL);
            else
#pragma unroll
                for (int e = 0; e < EPL; e++) qr[g][e] = 0;
        }
        if (own) {
            cl_vec<EPL>(kn_, row + (size_t)(nh + kh) * HD, bia ? bia + (size_t)(nh + kh) * HD : NULL);
            cl_vec<EPL>(vn_, row + (size_t)(nh + nkv + kh) * HD,
                        bia ? bia + (size_t)(nh + nkv + kh) * HD : NULL);
        }
#pragma unroll
        for (int g = 0; g < GM; g++) {
            if (g < group) cl_head<EPL>(qr[g], wq, x.qn != NULL, x.eps, x.rot, c, sv, lane);
#pragma unroll
            for (int e = 0; e < EPL; e++) qr[g][e] *= scale;
        }
        if (own) {
            cl_head<EPL>(kn_, wk, x.kn != NULL, x.eps, x.rot, c, sv, lane);
            size_t e0 = (size_t)x.slot[s] * stride + hoff;
            cl_store<EPL>(x.pk, e0, dt, kn_);
            cl_store<EPL>(x.pv, e0, dt, vn_);
        }
    } else {
#pragma unroll
        for (int g = 0; g < GM; g++)
#pragma unroll
            for (int e = 0; e < EPL; e++)
                qr[g][e] = g < group
                               ? q[((size_t)s * nh + (size_t)kh * group + g) * HD + lane * EPL + e] * scale
                               : 0.0f;
    }
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -INFINITY;
        l[g] = 0;
#pragma unroll
        for (int e = 0; e < EPL; e++) acc[g][e] = 0;
    }
    for (; j0 < nw; j0 += step) {
        if (!loaded)
            cl_load_run<EPL>(k, v, rr, kb, vb, dt, table, bs, stride, hoff, lo, j0 + step, nw);
        loaded = 0;
        float sc[CL_PB][GM];
#pragma unroll
        for (int b = 0; b < CL_PB; b++)
#pragma unroll
            for (int g = 0; g < GM; g++) {
                float d = 0;
#pragma unroll
                for (int e = 0; e < EPL; e++) d += qr[g][e] * k[b][e];
                d = a_warp_sum(d);
                sc[b][g] = j0 + b < nw ? cap_score(d, softcap) : -INFINITY;
            }
        /* position j0 is in range: mx is finite, and a masked score weighs 0 */
#pragma unroll
        for (int g = 0; g < GM; g++) {
            float mx = m[g];
#pragma unroll
            for (int b = 0; b < CL_PB; b++) mx = fmaxf(mx, sc[b][g]);
            float al = expf(m[g] - mx);
            l[g] *= al;
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[g][e] *= al;
#pragma unroll
            for (int b = 0; b < CL_PB; b++) {
                float pw = expf(sc[b][g] - mx);
                l[g] += pw;
#pragma unroll
                for (int e = 0; e < EPL; e++) acc[g][e] += pw * v[b][e];
            }
            m[g] = mx;
        }
    }
    if (own) {  /* the new position, from registers (m may still be -inf: al = 0) */
#pragma unroll
        for (int g = 0; g < GM; g++) {
            float d = 0;
#pragma unroll
            for (int e = 0; e < EPL; e++) d += qr[g][e] * kn_[e];
            d = cap_score(a_warp_sum(d), softcap);
            float mx = fmaxf(m[g], d), al = expf(m[g] - mx), pw = expf(d - mx);
            l[g] = l[g] * al + pw;
#pragma unroll
            for (int e = 0; e < EPL; e++) acc[g][e] = acc[g][e] * al + pw * vn_[e];
            m[g] = mx;
        }
    }
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (g >= group) break;
#pragma unroll
        for (int e = 0; e < EPL; e++) red[(w * group + g) * HD + lane * EPL + e] = acc[g][e];
        if (lane == 0) {
            wml[w][g][0] = m[g];
            wml[w][g][1] = l[g];
        }
    }
    __syncthreads();
    /* the CTA's partial; a warp (or CTA) without positions has l = 0 */
    for (int i = threadIdx.x; i < group * HD; i += NW * 32) {
        int g = i / HD, d = i % HD;
        float M = -INFINITY, L = 0, a = 0;
#pragma unroll
        for (int ww = 0; ww < NW; ww++)
            if (wml[ww][g][1] > 0) M = fmaxf(M, wml[ww][g][0]);
#pragma unroll
        for (int ww = 0; ww < NW; ww++) {
            float lw = wml[ww][g][1];
            if (lw > 0) {
                float e = expf(wml[ww][g][0] - M);
                L += lw * e;
                a += red[(ww * group + g) * HD + d] * e;
            }
        }
        cacc[i] = a;
        if (d == 0) {
            cml[g][0] = M;
            cml[g][1] = L;
        }
    }
    cl.sync();
    /* each CTA writes its share of the outputs from all CTAs' partials */
    for (int i = rank * NW * 32 + (int)threadIdx.x; i < group * HD; i += ncl * NW * 32) {
        int g = i / HD;
        float mr[CL_MAX], lr[CL_MAX], ar[CL_MAX];
#pragma unroll
        for (int r = 0; r < CL_MAX; r++) {
            mr[r] = -INFINITY, lr[r] = 0, ar[r] = 0;
            if (r < ncl) {
                const float *pm = cl.map_shared_rank(&cml[g][0], (unsigned)r);
                mr[r] = pm[0];
                lr[r] = pm[1];
                ar[r] = cl.map_shared_rank(cacc, (unsigned)r)[i];
            }
        }
        float M = -INFINITY, L = 0, a = 0;
#pragma unroll
        for (int r = 0; r < CL_MAX; r++)
            if (lr[r] > 0) M = fmaxf(M, mr[r]);
#pragma unroll
        for (int r = 0; r < CL_MAX; r++)
            if (lr[r] > 0) {
                float e = expf(mr[r] - M);
                L += lr[r] * e;
                a += ar[r] * e;
            }
        out[((size_t)s * nh + (size_t)kh * group) * HD + i] = L > 0 ? a / L : 0.0f;
    }
    cl.sync();  /* no CTA leaves while another reads its shared memory */
#else
    __trap();
#endif
}

template <int EPL, int GM, bool QKV>
static cudaError_t attn_cluster_launch(const loom_cuda *c, int ncl, float *out, const float *q,
                                       const loom_cuda_kv *kv, const loom_cuda_attn *a,
                                       const int32_t *tables, int tstride, const int32_t *lens,
                                       int n_seqs, const cl_qkv *x) {
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)ncl;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)ncl, (unsigned)a->n_kv_heads, (unsigned)n_seqs);
    cfg.blockDim = dim3(CL_WARPS * 32);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = c->stream;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 2 : 1;
    return cudaLaunchKernelEx(&cfg, attn_decode_cluster_kernel<EPL, GM, QKV>, out, q, kv->d_k,
                              kv->d_v, (int)kv->dt, kv->row_stride, kv->block_size, tables,
                              tstride, lens, a->n_heads, a->n_kv_heads, a->scale, a->softcap,
                              a->window, *x);
}

/* The cluster size the small-batch decode takes (0: the split kernel):
 * one thread-block cluster per (sequence, KV head), as many CTAs as keep
 * the grid within 2 an SM (c->attn_cluster at most) and no more than one
 * run of positions each needs. */
/* The decode step's shape: the positions a query attends to (span, the
 * window caps it), elements per lane of a head (epl, 0 when head_dim is
 * not a multiple of 32), and whether the vectorised kernels take it. */
struct dec_shape {
    int span, epl, vec;
};

static dec_shape dec_shape_of(const loom_cuda_kv *kv, const loom_cuda_attn *a, int max_len) {
    dec_shape d;
    int group = a->n_heads / a->n_kv_heads, hd = a->head_dim;
    d.span = a->window > 0 ? LOOM_MIN_U((unsigned)a->window, (unsigned)LOOM_MAX_I(max_len, 1))
                           : LOOM_MAX_I(max_len, 1);
    d.epl = hd % 32 == 0 ? hd / 32 : 0;
    d.vec = (d.epl == 2 || d.epl == 4 || d.epl == 8) && group <= DEC_GMAX &&
            (kv->row_stride % 4 == 0 || kv->dt != LOOM_CUDA_BF16);
    return d;
}

static int cl_size(const loom_cuda *c, const loom_cuda_kv *kv, const loom_cuda_attn *a,
                   int n_seqs, int max_len) {
    dec_shape d = dec_shape_of(kv, a, max_len);
    int span = d.span, epl = d.epl;
    if (!d.vec || epl > 4 || c->attn_cluster < 2 || c->cc < 90) return 0;
    int ncl = c->attn_cluster;
    while (ncl >= 2 && (size_t)n_seqs * a->n_kv_heads * ncl > 2 * (size_t)c->n_sm) ncl /= 2;
    while (ncl > 2 && (ncl / 2) * CL_WARPS * CL_PB >= span) ncl /= 2;
    return ncl >= 2 ? ncl : 0;
}

/* One launch of the cluster kernel for a cluster size and the shape. */
template <bool QKV>
static cudaError_t cl_launch(const loom_cuda *c, int ncl, float *out, const float *q,
                             const loom_cuda_kv *kv, const loom_cuda_attn *a,
                             const int32_t *tables, int tstride, const int32_t *lens, int n_seqs,
                             const cl_qkv *x) {
    int group = a->n_heads / a->n_kv_heads, epl = a->head_dim / 32;
    int gm = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
#define CL_LAUNCH(E, G) \
    attn_cluster_launch<E, G, QKV>(c, ncl, out, q, kv, a, tables, tstride, lens, n_seqs, x)
    if (epl == 2)
        return gm == 1 ? CL_LAUNCH(2, 1) : gm == 2 ? CL_LAUNCH(2, 2) : gm == 4 ? CL_LAUNCH(2, 4)
                                                                          : CL_LAUNCH(2, 8);
    return gm == 1 ? CL_LAUNCH(4, 1) : gm == 2 ? CL_LAUNCH(4, 2) : gm == 4 ? CL_LAUNCH(4, 4)
                                                                      : CL_LAUNCH(4, 8);
#undef CL_LAUNCH
}

static loom_status check_attn(const loom_cuda_kv *kv, const loom_cuda_attn *a, const char *what) {
    if (a->n_kv_heads <= 0 || a->n_heads <= 0 || a->n_heads % a->n_kv_heads || a->head_dim <= 0 ||
        kv->block_size <= 0 || (int)kv->dt < 0 || (int)kv->dt > 2 ||
        kv->row_stride < (size_t)a->n_kv_heads * a->head_dim)
        return loom_err(LOOM_ERR_INVALID_ARG,
                        "cuda %s: %d heads over %d KV heads of %d, block size %d, KV type %d, "
                        "row stride %zu",
                        what, a->n_heads, a->n_kv_heads, a->head_dim, kv->block_size, (int)kv->dt,
                        kv->row_stride);
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_attn_decode(loom_cuda *c, float *d_out, const float *d_q,
                                             const loom_cuda_kv *kv, const loom_cuda_attn *a,
                                             const int32_t *d_tables, int table_stride,
                                             const int32_t *d_lens, int n_seqs, int max_len) {
    loom_status st = check_attn(kv, a, "attn_decode");
    if (st != LOOM_OK) return st;
    if (n_seqs <= 0) return LOOM_OK;
    if (n_seqs > 65535 || a->n_kv_heads > 65535)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda attn_decode: %d sequences, at most 65535", n_seqs);
    int group = a->n_heads / a->n_kv_heads, hd = a->head_dim;
    dec_shape d = dec_shape_of(kv, a, max_len);
    int span = d.span, epl = d.epl, vec = d.vec;
    /* Small batches: one thread-block cluster per (sequence, KV head) */
    int ncl = cl_size(c, kv, a, n_seqs, max_len);
    if (ncl >= 2) {
        cl_qkv none = {};
        cudaError_t e = cl_launch<false>(c, ncl, d_out, d_q, kv, a, d_tables, table_stride, d_lens,
                                         n_seqs, &none);
        if (e == cudaSuccess) return LOOM_OK;
        /* a launch refused up front (no kernel ran): the split kernel does it */
        (void)cudaGetLastError();
        loom_log(LOOM_CUDA_LOG_WARN, "cuda attn_decode: cluster of %d not launched (%s); the "
                 "split kernel from here on", ncl, cudaGetErrorString(e));
        c->attn_cluster = 0;
    }
    /* Scores of one split stay in shared memory: at most 8192 per block.
     * The vectorised kernel splits finer while the grid would leave SMs
     * idle: a split is one block's serial walk. Down to 8 positions (one
     * run of DEC_PB for each of the 4 warps; c->attn_split_min): Qwen3-0.6B
     * batch 1 on an H200 1,076 tok/s against 1,034 at 16, Llama-3-8B
     * unchanged. Until 4 blocks an SM (c->attn_blocks): a warp has only
     * DEC_PB rows in flight, so the blocks make the memory parallelism;
     * Qwen3-0.6B batch 32 16,057 tok/s against 13,998 at 2 (4 splits of
     * 64 positions instead of 2 of 128), 16,077 at 8 but batch 128 then
     * 33,853 against 41,318. */
    int split = 256;
    while (split > 32 && group * split > 8192) split /= 2;
    while (vec && split > c->attn_split_min &&
           (size_t)n_seqs * a->n_kv_heads * ((span + split - 1) / split) <
               (size_t)c->attn_blocks * c->n_sm)
        split /= 2;
    int n_splits = (span + split - 1) / split;
    size_t smem = vec ? ((size_t)group * split + (size_t)(DEC_THREADS / 32) * group * hd +
                         2 * (size_t)group) * sizeof(float)
                      : ((size_t)group * hd + (size_t)group * split + 2 * (size_t)group) *
                            sizeof(float);
    if (smem > c->smem_optin)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda attn_decode: %zu bytes of shared memory "
                        "needed (group %d, head_dim %d), device allows %zu", smem, group, hd,
                        c->smem_optin);
    size_t parts = (size_t)n_seqs * a->n_heads * n_splits;
    void *scr;
    st = loom_cuda_scratch(c, parts * ((size_t)hd + 2) * sizeof(float), &scr);
    if (st != LOOM_OK) return st;
    float *part_acc = (float *)scr, *part_ml = part_acc + parts * hd;
    dim3 grid((unsigned)n_splits, (unsigned)a->n_kv_heads, (unsigned)n_seqs);
    /* the vectorised kernel combines in its last split block where the
     * counters reach: one launch instead of two */
    int *cnts = (size_t)n_seqs * a->n_kv_heads <= LOOM_CUDA_COUNTERS / 2 &&
                        2 * n_splits <= (DEC_THREADS / 32) * hd  /* the (m, l) pairs fit */
                    ? c->counters : NULL;
#define DEC_VEC(E)                                                                              \
    do {                                                                                        \
        if (smem > 48 * 1024)                                                                   \
            CUDA_CHECK(cudaFuncSetAttribute(attn_decode_vec_kernel<E>,                          \
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,        \
                                            (int)smem));                                        \
        CUDA_CHECK(loom_cuda_launch(c, attn_decode_vec_kernel<E>, grid, dim3(DEC_THREADS), smem, \
            part_acc, part_ml, d_out, cnts, d_q, kv->d_k, kv->d_v, (int)kv->dt, kv->row_stride, \
            kv->block_size, d_tables, table_stride, d_lens, a->n_heads, a->n_kv_heads,          \
            a->scale, a->softcap, a->window, split, n_splits));                                 \
    } while (0)
    if (vec && epl == 2) DEC_VEC(2);
    else if (vec && epl == 4) DEC_VEC(4);
    else if (vec) DEC_VEC(8);
#undef DEC_VEC
    if (vec && cnts) return LOOM_OK;
    if (!vec) {
        if (smem > 48 * 1024)
            CUDA_CHECK(cudaFuncSetAttribute(attn_decode_kernel,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attn_decode_kernel<<<grid, DEC_THREADS, smem, c->stream>>>(
            part_acc, part_ml, d_q, kv->d_k, kv->d_v, (int)kv->dt, kv->row_stride, kv->block_size,
            d_tables, table_stride, d_lens, a->n_heads, a->n_kv_heads, hd, a->scale, a->softcap,
            a->window, split, n_splits);
    }
    LAUNCH_CHECK();
    dim3 g2((unsigned)a->n_heads, (unsigned)n_seqs);
    attn_combine_kernel<<<g2, 128, 0, c->stream>>>(d_out, part_acc, part_ml, a->n_heads, hd,
                                                   n_splits);
    LAUNCH_CHECK();
    return LOOM_OK;
}

extern "C" int loom_cuda_attn_decode_qkv_ok(const loom_cuda *c, const loom_cuda_kv *kv,
                                            const loom_cuda_attn *a, int rot_dim, int n_seqs,
                                            int max_len) {
    if (n_seqs <= 0 || n_seqs > 65535 || a->n_kv_heads <= 0 || a->n_heads <= 0 ||
        a->n_heads % a->n_kv_heads || (a->head_dim != 64 && a->head_dim != 128) ||
        (rot_dim != 0 && rot_dim != a->head_dim) || kv->block_size <= 0 || (int)kv->dt < 0 ||
        (int)kv->dt > 2 || kv->row_stride < (size_t)a->n_kv_heads * a->head_dim)
        return 0;
    return cl_size(c, kv, a, n_seqs, max_len) >= 2;
}

extern "C" loom_status loom_cuda_attn_decode_qkv(
    loom_cuda *c, float *d_out, float *d_q, const loom_cuda_kv *kv, const loom_cuda_attn *a,
    const float *d_qkv, const float *d_bias, const float *d_qnorm, const float *d_knorm,
    float eps, const int32_t *d_slot, int rot_dim, const float *d_cos, const float *d_sin, int ld,
    const int32_t *d_tables, int table_stride, const int32_t *d_lens, int n_seqs, int max_len) {
    if (n_seqs <= 0) return LOOM_OK;
    int ncl = loom_cuda_attn_decode_qkv_ok(c, kv, a, rot_dim, n_seqs, max_len)
                  ? cl_size(c, kv, a, n_seqs, max_len) : 0;
    if (ncl >= 2) {
        cl_qkv x = {d_qkv, d_bias, d_qnorm, d_knorm, eps, d_slot, rot_dim, d_cos, d_sin, ld,
                    (void *)kv->d_k, (void *)kv->d_v};
        cudaError_t e = cl_launch<true>(c, ncl, d_out, NULL, kv, a, d_tables, table_stride,
                                        d_lens, n_seqs, &x);
        if (e == cudaSuccess) return LOOM_OK;
        /* refused up front (no kernel ran): the two kernels below */
        (void)cudaGetLastError();
        loom_log(LOOM_CUDA_LOG_WARN, "cuda attn_decode_qkv: cluster of %d not launched (%s); "
                 "the split kernel from here on", ncl, cudaGetErrorString(e));
        c->attn_cluster = 0;
    }
    loom_status st = loom_cuda_qkv_post(c, d_q, kv, d_qkv, d_bias, d_qnorm, d_knorm, eps, d_slot,
                                        n_seqs, a->n_heads, a->n_kv_heads, a->head_dim, rot_dim,
                                        d_cos, d_sin, ld);
    if (st != LOOM_OK) return st;
    return loom_cuda_attn_decode(c, d_out, d_q, kv, a, d_tables, table_stride, d_lens, n_seqs,
                                 max_len);
}

/* ---- prefill ------------------------------------------------------------ */

/* Bidirectional spans (loom_cuda_attn's span_lo / span_hi): the key range
 * [*lo, *hi] of a query tile widened to every token's span. */
__device__ __forceinline__ void span_bounds(const int32_t *slo, const int32_t *shi, int t0, int nq,
                                            int *lo, int *hi) {
    for (int i = 0; shi && i < nq; i++) {
        *lo = min(*lo, slo[t0 + i]);
        *hi = max(*hi, shi[t0 + i]);
    }
}

__global__ void attn_prefill_kernel(float *out, const float *q, const void *kb, const void *vb,
                                    int dt, size_t stride, int bs, const int32_t *tables,
                                    int tstride, const int32_t *row_tok, const int32_t *row_pos,
                                    int nh, int nkv, int hd, float scale, float softcap,
                                    int window, int QT, const int32_t *slo, const int32_t *shi) {
    extern __shared__ float smem[];
    int tile = blockIdx.x, kh = blockIdx.y, r = blockIdx.z;
    int group = nh / nkv, QR = QT * group;
    int tok0 = row_tok[r], ntok = row_tok[r + 1] - tok0, pos0 = row_pos[r];
    int qa = tile * QT;
    if (qa >= ntok) return;
    int nq = min(ntok - qa, QT);
    float *Qs = smem;                    /* (QR, hd) */
    float *Acc = Qs + QR * hd;           /* (QR, hd) */
    float *Ks = Acc + QR * hd;           /* (KT, hd + 1): padded against bank conflicts */
    float *Vs = Ks + KT * (hd + 1);      /* (KT, hd) */
    float *S = Vs + KT * hd;             /* (QR, KT) */
    float *Mx = S + QR * KT, *Ls = Mx + QR, *Al = Ls + QR;  /* (QR) each */
    const int32_t *table = tables + (size_t)r * tstride;
    /* query row rr = token qt * group + g: q head kh * group + g */
    for (int i = threadIdx.x; i < QR * hd; i += blockDim.x) {
        int rr = i / hd, d = i % hd, qt = rr / group, g = rr % group;
        Qs[i] = qt < nq ? q[((size_t)(tok0 + qa + qt) * nh + (size_t)kh * group + g) * hd + d] * scale
                        : 0.0f;
        Acc[i] = 0;
    }
    for (int i = threadIdx.x; i < QR; i += blockDim.x) {
        Mx[i] = -INFINITY;
        Ls[i] = 0;
    }
    int posA = pos0 + qa, posB = pos0 + qa + nq - 1;
    int lo = window > 0 ? max(0, posA - window + 1) : 0;
    span_bounds(slo, shi, tok0 + qa, nq, &lo, &posB);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int k0 = lo; k0 <= posB; k0 += KT) {
        __syncthreads();  /* the previous tile's K/V/S are no longer read */
        for (int i = threadIdx.x; i < KT * hd; i += blockDim.x) {
            int j = i / hd, d = i % hd, p = k0 + j;
            float kv_k = 0, kv_v = 0;
            if (p <= posB) {
                size_t e = kv_row(table, p, bs, stride) + (size_t)kh * hd + d;
                kv_k = kv_elem(kb, e, dt);
                kv_v = kv_elem(vb, e, dt);
            }
            Ks[j * (hd + 1) + d] = kv_k;
            Vs[j * hd + d] = kv_v;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < QR * KT; i += blockDim.x) {
            int rr = i / KT, j = i % KT, qt = rr / group, p = k0 + j;
            int qpos = pos0 + qa + qt, t = tok0 + qa + qt;
            float s = -INFINITY;
            if (qt < nq && p <= (shi ? max(qpos, shi[t]) : qpos) &&
                (window <= 0 || p > qpos - window || (slo && p >= slo[t]))) {
                float d = 0;
                const float *qr = Qs + rr * hd, *kr = Ks + j * (hd + 1);
                for (int e = 0; e < hd; e++) d += qr[e] * kr[e];
                s = cap_score(d, softcap);
            }
            S[i] = s;
        }
        __syncthreads();
        for (int rr = w; rr < QR; rr += nw) {  /* KT == 32: one key per lane */
            float s = S[rr * KT + lane];
            float mo = Mx[rr], mn = fmaxf(mo, a_warp_max(s));
            float pexp = 0, alpha = 1;
            if (mn != -INFINITY) {
                pexp = expf(s - mn);
                alpha = expf(mo - mn);
            }
            float sum = a_warp_sum(pexp);
            S[rr * KT + lane] = pexp;
            if (lane == 0) {
                Mx[rr] = mn;
                Ls[rr] = Ls[rr] * alpha + sum;
                Al[rr] = alpha;
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < QR * hd; i += blockDim.x) {
            int rr = i / hd, d = i % hd;
            float acc = Acc[i] * Al[rr];
            const float *pr = S + rr * KT;
            for (int j = 0; j < KT; j++) acc += pr[j] * Vs[j * hd + d];
            Acc[i] = acc;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nq * group * hd; i += blockDim.x) {
        int rr = i / hd, d = i % hd, qt = rr / group, g = rr % group;
        float l = Ls[rr];
        out[((size_t)(tok0 + qa + qt) * nh + (size_t)kh * group + g) * hd + d] =
            l > 0 ? Acc[i] / l : 0.0f;
    }
}

/* Prefill on the tensor cores (bf16 KV, head_dim 64, 80, 96, 128 or 256; asked
 * for with loom_cuda_attn.tc). Flash attention in the FlashAttention-2
 * arrangement: a block takes FA_ROWS * MT query rows (whole tokens of one
 * row times the q heads of one KV head, so GQA reads each K/V tile once for
 * the group), 4 warps of MT m-tiles of 16 rows (MT = 2 uses each K/V
 * fragment loaded from shared memory twice: ldmatrix traffic, not the
 * tensor cores, bounds MT = 1). Keys come in tiles of FA_KT = 64
 * positions copied from the paged pool with cp.async into a second
 * shared-memory stage while the tile before is computed. Per tile a warp
 * computes S = Q K^T with mma.m16n8k16 (bf16 operands from ldmatrix, f32
 * accumulation), updates its rows' running max and sum in registers (the 4
 * lanes of a quad share a row), and feeds P, rounded to bf16, straight
 * from the S accumulators into P V as the A operand (the accumulator
 * layout of two n-tiles is the A layout of one k-step). Only tiles that
 * cross the diagonal or the window's edge are masked; blocks are launched
 * longest first (the last query tiles) so that the causal tail is short.
 * Queries enter scaled and rounded to bf16, like K and V already are:
 * errors of bf16 operands (1e-3 relative). The output is f32 or, for the
 * next GEMM's input, bf16 / f16 (the rounding that GEMM's conversion would
 * do). At head_dim 256 (Gemma) a lane's O accumulators alone take 128
 * registers, so the queries stay in shared memory (QREG 0), read again
 * each tile as with two m-tiles, and one m-tile is the only choice. */
#define FA_ROWS 64
#define FA_KT 64
#define FA_WARPS 4

__device__ __forceinline__ void fa_cp16(void *dst, const void *src, int n) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n)
                 : "memory");
}

__device__ __forceinline__ void fa_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void fa_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void fa_ldsm(unsigned *r, const void *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void fa_ldsm_t(unsigned *r, const void *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void fa_mma(float *d, const unsigned *a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned fa_pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const unsigned *)&h;
}

__device__ __forceinline__ void fa_store2(float *p, float a, float b) {
    *(float2 *)p = make_float2(a, b);
}

__device__ __forceinline__ void fa_store2(__nv_bfloat16 *p, float a, float b) {
    *(__nv_bfloat162 *)p = __floats2bfloat162_rn(a, b);
}

__device__ __forceinline__ void fa_store2(__half *p, float a, float b) {
    *(__half2 *)p = __floats2half2_rn(a, b);
}

/* Shared memory: two stages of (K tile, V tile), FA_KT rows of HD + 8
 * bf16 each (16 bytes of padding: ldmatrix's 8 row addresses fall in
 * distinct banks). The queries pass through stage 1's K tile first. */
template <int HD, typename OT, int MT>
__global__ void __launch_bounds__(FA_WARPS * 32, 2)
attn_prefill_fa_kernel(OT *out, const float *q, const __nv_bfloat16 *kb,
                       const __nv_bfloat16 *vb, size_t stride, int bs, const int32_t *tables,
                       int tstride, const int32_t *row_tok, const int32_t *row_pos, int nh,
                       int nkv, float scale, float softcap, int window, int QT,
                       const int32_t *slo, const int32_t *shi) {
    constexpr int LD = HD + 8, CH = HD / 8, NT = FA_WARPS * 32, ROWS = FA_WARPS * 16 * MT;
    constexpr int QREG = MT == 1 && HD <= 128;  /* queries in registers for the walk */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __nv_bfloat16 *sm = (__nv_bfloat16 *)smem_raw;
    int kh = blockIdx.x, tile = gridDim.y - 1 - blockIdx.y, r = blockIdx.z;
    int group = nh / nkv;
    int tok0 = row_tok[r], ntok = row_tok[r + 1] - tok0, pos0 = row_pos[r];
    int qa = tile * QT;
    if (qa >= ntok) return;
    int nq = min(ntok - qa, QT), nrows = nq * group;
    int posA = pos0 + qa, posB = pos0 + qa + nq - 1;
    int lo = window > 0 ? max(0, posA - window + 1) : 0;
    span_bounds(slo, shi, tok0 + qa, nq, &lo, &posB);
    int k_lo = lo / FA_KT * FA_KT, n_tiles = (posB - k_lo) / FA_KT + 1;
    const int32_t *table = tables + (size_t)r * tstride;
    int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;

    /* K and V rows [k0, k0 + FA_KT) into stage s; positions outside
     * [lo, posB] are zero-filled (their blocks may be unmapped) and masked */
    auto load_tile = [&](int k0, int s) {
        __nv_bfloat16 *Ks = sm + (size_t)s * 2 * FA_KT * LD, *Vs = Ks + FA_KT * LD;
#pragma unroll
        for (int i = tid; i < FA_KT * CH; i += NT) {
            int j = i / CH, c8 = (i % CH) * 8, p = k0 + j;
            int ok = p <= posB && p >= lo;
            size_t e = ok ? kv_row(table, p, bs, stride) + (size_t)kh * HD + c8 : 0;
            fa_cp16(Ks + j * LD + c8, kb + e, ok ? 16 : 0);
            fa_cp16(Vs + j * LD + c8, vb + e, ok ? 16 : 0);
        }
    };
    load_tile(k_lo, 0);
    fa_commit();

    /* queries, scaled and rounded: with one m-tile a warp through stage 1's
     * K area into registers for the whole walk; with two, a region of their
     * own read again each tile (registers hold the second tile's S and O) */
    __nv_bfloat16 *Qs = sm + (QREG ? 2 : 4) * FA_KT * LD;
    for (int i = tid; i < ROWS * (HD / 4); i += NT) {
        int rr = i / (HD / 4), d = (i % (HD / 4)) * 4;
        float4 v = make_float4(0, 0, 0, 0);
        if (rr < nrows) {
            int qt = rr / group, g = rr - qt * group;
            v = *(const float4 *)(q + ((size_t)(tok0 + qa + qt) * nh + (size_t)kh * group + g) * HD + d);
        }
        __nv_bfloat162 *dst = (__nv_bfloat162 *)(Qs + rr * LD + d);
        dst[0] = __floats2bfloat162_rn(v.x * scale, v.y * scale);
        dst[1] = __floats2bfloat162_rn(v.z * scale, v.w * scale);
    }
    __syncthreads();
    /* A-fragment row address of this lane for m-tile m, k-step k */
    auto q_at = [&](int m, int k) {
        return Qs + (w * 16 * MT + m * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + k * 16 +
               (lane >> 4) * 8;
    };
    unsigned qf[QREG ? HD / 16 : 1][4];
    if (QREG) {
#pragma unroll
        for (int k = 0; k < HD / 16; k++) fa_ldsm(qf[QREG ? k : 0], q_at(0, k));
        __syncthreads();  /* stage 1 is free for the next tile */
    }

    /* this lane's rows: w * 16 * MT + 16 m + lane / 4 (+ 8); keys up to
     * qhi, and below the window from qlo (spans) */
    int qpos[MT][2], qhi[MT][2], qlo[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int rr = w * 16 * MT + m * 16 + (lane >> 2) + 8 * h, t = tok0 + qa + rr / group;
            qpos[m][h] = rr < nrows ? pos0 + qa + rr / group : -1;  /* -1: every key masked */
            qhi[m][h] = rr < nrows && shi ? max(qpos[m][h], shi[t]) : qpos[m][h];
            qlo[m][h] = rr < nrows && slo ? slo[t] : INT_MAX;
        }
    float o[MT][HD / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < HD / 8; n++) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0;
    float mr[MT][2], lr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++) mr[m][0] = mr[m][1] = -INFINITY, lr[m][0] = lr[m][1] = 0;
    const float L2E = 1.4426950408889634f;
    for (int it = 0; it < n_tiles; it++) {
        int k0 = k_lo + it * FA_KT;
        if (it + 1 < n_tiles) {
            load_tile(k0 + FA_KT, (it + 1) & 1);
            fa_commit();
            fa_wait<1>();
        } else {
            fa_wait<0>();
        }
        __syncthreads();
        const __nv_bfloat16 *Ks = sm + (size_t)(it & 1) * 2 * FA_KT * LD, *Vs = Ks + FA_KT * LD;
        float s[MT][FA_KT / 8][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int n = 0; n < FA_KT / 8; n++) s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0;
#pragma unroll
        for (int k = 0; k < HD / 16; k++) {
            unsigned a[MT][4];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (QREG) {
#pragma unroll
                    for (int x = 0; x < 4; x++) a[m][x] = qf[QREG ? k : 0][x];
                } else {
                    fa_ldsm(a[m], q_at(m, k));
                }
            }
#pragma unroll
            for (int n = 0; n < FA_KT / 16; n++) {
                unsigned b[4];
                fa_ldsm(b, Ks + (n * 16 + (lane & 7) + (lane >> 4) * 8) * LD + k * 16 +
                               ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    fa_mma(s[m][2 * n], a[m], b[0], b[1]);
                    fa_mma(s[m][2 * n + 1], a[m], b[2], b[3]);
                }
            }
        }
        /* element e of n-tile n: row h = e / 2, key k0 + 8 n + 2 (lane % 4) + e % 2;
         * rows past nrows hold zero queries: finite, never stored, unmasked */
        int mask = shi || k0 + FA_KT - 1 > posA || (window > 0 && k0 <= posB - window);
        /* P of m-tile m as A fragments (k-step j of P is n-tiles 2j and 2j + 1
         * of S), packed as soon as its softmax is done: S's registers free */
        unsigned pa[MT][FA_KT / 16][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = s[m][n][e];
                    if (softcap > 0) v = tanhf(v / softcap) * softcap;
                    if (mask) {
                        int p = k0 + n * 8 + (lane & 3) * 2 + (e & 1), qp = qpos[m][e >> 1];
                        if (p > qhi[m][e >> 1] ||
                            (window > 0 && p <= qp - window && p < qlo[m][e >> 1]))
                            v = -INFINITY;
                    }
                    s[m][n][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            float base[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                float mn = fmaxf(mr[m][h], mx[h]);
                base[h] = mn == -INFINITY ? 0.0f : mn * L2E;  /* rows masked so far stay 0 */
                float alpha = exp2f(fmaf(mr[m][h], L2E, -base[h]));
                mr[m][h] = mn;
                lr[m][h] *= alpha;
#pragma unroll
                for (int n = 0; n < HD / 8; n++) {
                    o[m][n][2 * h] *= alpha;
                    o[m][n][2 * h + 1] *= alpha;
                }
            }
#pragma unroll
            for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    float p0 = exp2f(fmaf(s[m][n][e], L2E, -base[e >> 1]));
                    float p1 = exp2f(fmaf(s[m][n][e + 1], L2E, -base[e >> 1]));
                    lr[m][e >> 1] += p0 + p1;
                    pa[m][n >> 1][(n & 1) * 2 + (e >> 1)] = fa_pack(p0, p1);
                }
        }
        /* O += P V */
#pragma unroll
        for (int j = 0; j < FA_KT / 16; j++) {
#pragma unroll
            for (int n = 0; n < HD / 16; n++) {
                unsigned b[4];
                fa_ldsm_t(b, Vs + (j * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n * 16 +
                                 (lane >> 4) * 8);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    fa_mma(o[m][2 * n], pa[m][j], b[0], b[1]);
                    fa_mma(o[m][2 * n + 1], pa[m][j], b[2], b[3]);
                }
            }
        }
        __syncthreads();  /* this stage is refilled two tiles on */
    }
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float l = lr[m][h];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            int rr = w * 16 * MT + m * 16 + (lane >> 2) + 8 * h;
            if (rr >= nrows) continue;
            float inv = l > 0 ? 1.0f / l : 0.0f;
            int qt = rr / group, g = rr - qt * group;
            OT *dst = out + ((size_t)(tok0 + qa + qt) * nh + (size_t)kh * group + g) * HD +
                      (lane & 3) * 2;
#pragma unroll
            for (int n = 0; n < HD / 8; n++)
                fa_store2(dst + n * 8, o[m][n][2 * h] * inv, o[m][n][2 * h + 1] * inv);
        }
}

__global__ void fa_round_kernel(void *y, const float *x, size_t n, int f16) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (f16) ((__half *)y)[i] = __float2half_rn(x[i]);
    else ((__nv_bfloat16 *)y)[i] = __float2bfloat16_rn(x[i]);
}

static loom_status attn_prefill_f32(loom_cuda *c, float *d_out, const float *d_q,
                                    const loom_cuda_kv *kv, const loom_cuda_attn *a,
                                    const int32_t *d_tables, int table_stride,
                                    const int32_t *d_row_tok, const int32_t *d_row_pos,
                                    int n_rows, int max_row_tokens);

extern "C" loom_status loom_cuda_attn_prefill_to(loom_cuda *c, void *d_out, loom_cuda_dtype out_dt,
                                                 const float *d_q, const loom_cuda_kv *kv,
                                                 const loom_cuda_attn *a, const int32_t *d_tables,
                                                 int table_stride, const int32_t *d_row_tok,
                                                 const int32_t *d_row_pos, int n_rows,
                                                 int max_row_tokens, int n_tokens) {
    loom_status st = check_attn(kv, a, "attn_prefill");
    if (st != LOOM_OK) return st;
    if (n_rows <= 0 || max_row_tokens <= 0) return LOOM_OK;
    if (n_rows > 65535 || a->n_kv_heads > 65535)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda attn_prefill: %d rows, at most 65535", n_rows);
    if ((int)out_dt < 0 || (int)out_dt > 2)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda attn_prefill: output type %d", (int)out_dt);
    int group = a->n_heads / a->n_kv_heads, hd = a->head_dim;
    if (a->tc && kv->dt == LOOM_CUDA_BF16 &&
        (hd == 64 || hd == 80 || hd == 96 || hd == 128 || hd == 256) && group <= FA_ROWS &&
        kv->row_stride % 8 == 0) {
        int mt = c->fa_mt == 1 || hd > 128 ? 1 : 2, QT = FA_ROWS * mt / group;
        /* two K/V stages, and the queries' own region unless they sit in
         * registers (one m-tile, head_dim <= 128) */
        int qreg = mt == 1 && hd <= 128;
        size_t smem = (size_t)(2 * 2 * FA_KT + (qreg ? 0 : FA_ROWS * mt)) * (hd + 8) * 2;
        unsigned tiles = (unsigned)((max_row_tokens + QT - 1) / QT);
        if (smem <= c->smem_optin && tiles <= 65535) {
            dim3 grid((unsigned)a->n_kv_heads, tiles, (unsigned)n_rows);
#define FA_LAUNCH(D, OT)                                                                        \
    do {                                                                                        \
        if (mt == 2) FA_LAUNCH1(D, OT, 2);                                                      \
        else FA_LAUNCH1(D, OT, 1);                                                              \
    } while (0)
#define FA_LAUNCH1(D, OT, M)                                                                    \
    do {                                                                                        \
        if (smem > 48 * 1024)                                                                   \
            CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_fa_kernel<D, OT, M>,                   \
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,        \
                                            (int)smem));                                        \
        attn_prefill_fa_kernel<D, OT, M><<<grid, FA_WARPS * 32, smem, c->stream>>>(             \
            (OT *)d_out, d_q, (const __nv_bfloat16 *)kv->d_k, (const __nv_bfloat16 *)kv->d_v,   \
            kv->row_stride, kv->block_size, d_tables, table_stride, d_row_tok, d_row_pos,       \
            a->n_heads, a->n_kv_heads, a->scale, a->softcap, a->window, QT, a->span_lo,         \
            a->span_hi);                                                                        \
    } while (0)
#define FA_HD(OT)                          \
    do {                                   \
        if (hd == 64) FA_LAUNCH(64, OT);   \
        else if (hd == 80) FA_LAUNCH(80, OT); \
        else if (hd == 96) FA_LAUNCH(96, OT); \
        else if (hd == 128) FA_LAUNCH(128, OT); \
        else FA_LAUNCH1(256, OT, 1);       \
    } while (0)
            if (out_dt == LOOM_CUDA_F32) FA_HD(float);
            else if (out_dt == LOOM_CUDA_BF16) FA_HD(__nv_bfloat16);
            else FA_HD(__half);
#undef FA_HD
#undef FA_LAUNCH
#undef FA_LAUNCH1
            LAUNCH_CHECK();
            return LOOM_OK;
        }
    }
    if (out_dt == LOOM_CUDA_F32)
        return attn_prefill_f32(c, (float *)d_out, d_q, kv, a, d_tables, table_stride, d_row_tok,
                                d_row_pos, n_rows, max_row_tokens);
    /* the scalar kernel writes f32: through scratch, then rounded */
    size_t n = (size_t)n_tokens * a->n_heads * hd;
    void *tmp;
    st = loom_cuda_scratch(c, n * 4, &tmp);
    if (st == LOOM_OK)
        st = attn_prefill_f32(c, (float *)tmp, d_q, kv, a, d_tables, table_stride, d_row_tok,
                              d_row_pos, n_rows, max_row_tokens);
    if (st != LOOM_OK || !n) return st;
    fa_round_kernel<<<loom_cuda_blocks(n, 256), 256, 0, c->stream>>>(d_out, (const float *)tmp, n,
                                                                     out_dt == LOOM_CUDA_F16);
    LAUNCH_CHECK();
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_attn_prefill(loom_cuda *c, float *d_out, const float *d_q,
                                              const loom_cuda_kv *kv, const loom_cuda_attn *a,
                                              const int32_t *d_tables, int table_stride,
                                              const int32_t *d_row_tok, const int32_t *d_row_pos,
                                              int n_rows, int max_row_tokens) {
    return loom_cuda_attn_prefill_to(c, d_out, LOOM_CUDA_F32, d_q, kv, a, d_tables, table_stride,
                                     d_row_tok, d_row_pos, n_rows, max_row_tokens, 0);
}

/* The scalar kernel (any KV type and head size), f32 out. */
static loom_status attn_prefill_f32(loom_cuda *c, float *d_out, const float *d_q,
                                    const loom_cuda_kv *kv, const loom_cuda_attn *a,
                                    const int32_t *d_tables, int table_stride,
                                    const int32_t *d_row_tok, const int32_t *d_row_pos,
                                    int n_rows, int max_row_tokens) {
    int group = a->n_heads / a->n_kv_heads, hd = a->head_dim;
    /* Query rows per block: about 8192 / head_dim (64 rows at head_dim 128),
     * whole tokens, at least one token. */
    int QT = LOOM_MAX_I(1, (8192 / hd) / group);
    QT = LOOM_MIN_U((unsigned)QT, (unsigned)max_row_tokens);
    size_t QR = (size_t)QT * group;
    size_t smem = (2 * QR * hd + (size_t)KT * (hd + 1) + (size_t)KT * hd + QR * KT + 3 * QR) *
                  sizeof(float);
    if (smem > c->smem_optin)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda attn_prefill: %zu bytes of shared memory "
                        "needed (group %d, head_dim %d), device allows %zu", smem, group, hd,
                        c->smem_optin);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)((max_row_tokens + QT - 1) / QT), (unsigned)a->n_kv_heads, (unsigned)n_rows);
    attn_prefill_kernel<<<grid, PRE_THREADS, smem, c->stream>>>(
        d_out, d_q, kv->d_k, kv->d_v, (int)kv->dt, kv->row_stride, kv->block_size, d_tables,
        table_stride, d_row_tok, d_row_pos, a->n_heads, a->n_kv_heads, hd, a->scale, a->softcap,
        a->window, QT, a->span_lo, a->span_hi);
    LAUNCH_CHECK();
    return LOOM_OK;
}
