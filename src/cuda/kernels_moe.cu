/* kernels_moe: the routed-experts feed-forward (Qwen3-MoE) on the device:
 * routing (softmax, top-k, renormalisation), bucketing of the (token,
 * choice) pairs by expert, a grouped GEMM over every expert's rows in one
 * launch (prefill), an expert GEMV per pair and a GEMV that sums a token's
 * experts (decode), and the weighted combine. Reference: src/model/moe.c.
 *
 * Nothing here reads a count back to the host: every grid is sized by the
 * step's token count alone (the grouped GEMM's by an upper bound on its
 * tiles, the surplus blocks returning at once), so a step stays
 * capturable into a CUDA graph. Inputs are f32 rows; weights f32, f16 or
 * bf16, widened to f32 in the kernels and accumulated in f32, as the CPU's
 * matmuls do (they never round x). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#include "cuda/cuda_int.cuh"

__device__ __forceinline__ float moe_ld(const void *p, size_t i, int dt) {
    if (dt == LOOM_CUDA_F32) return ((const float *)p)[i];
    if (dt == LOOM_CUDA_F16) return __half2float(((const __half *)p)[i]);
    return __uint_as_float((unsigned)((const unsigned short *)p)[i] << 16);
}

__device__ __forceinline__ float moe_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- routing ------------------------------------------------------------ */

#define ROUTE_WARPS 4

/* One warp per token: p = softmax(logits), then k rounds of "the largest
 * p not yet taken" (lower index on ties, as moe.c's strict > scan), the
 * weights divided by their sum (in pick order, as moe.c sums) when renorm.
 * A NaN p ranks below every number, so the k experts are always distinct
 * and in range. */
__global__ void moe_route_kernel(int32_t *sel, float *wt, const float *logits, int T, int E,
                                 int k, int renorm) {
    extern __shared__ float sh_p[];  /* (ROUTE_WARPS, E) */
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int t = blockIdx.x * ROUTE_WARPS + w;
    if (t >= T) return;
    float *p = sh_p + (size_t)w * E;
    const float *x = logits + (size_t)t * E;
    float m = -INFINITY;
    for (int e = lane; e < E; e += 32) {
        p[e] = x[e];
        m = fmaxf(m, x[e]);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0;
    for (int e = lane; e < E; e += 32) {
        p[e] = expf(p[e] - m);
        s += p[e];
    }
    s = moe_warp_sum(s);
    float inv = 1.0f / s;
    for (int e = lane; e < E; e += 32) p[e] *= inv;
    __syncwarp();
    float sum = 0, got[32];
    int idx[32];
    for (int j = 0; j < k; j++) {
        float bv = 0;
        int bi = -1;
        for (int e = lane; e < E; e += 32) {
            float v = p[e];
            if (v == -2.0f) continue;            /* taken */
            if (v != v) v = -1.0f;               /* NaN: below every probability */
            if (loom_cuda_before(v, e, bv, bi)) bv = v, bi = e;
        }
        loom_cuda_warp_best(bv, bi);
        /* bi >= 0: k <= E, and only taken entries are skipped */
        got[j] = p[bi];
        idx[j] = bi;
        sum += p[bi];
        __syncwarp();
        if (lane == 0) p[bi] = -2.0f;
        __syncwarp();
    }
    if (lane == 0)
        for (int j = 0; j < k; j++) {
            sel[(size_t)t * k + j] = idx[j];
            wt[(size_t)t * k + j] = renorm ? got[j] / sum : got[j];
        }
}

extern "C" loom_status loom_cuda_moe_route(loom_cuda *c, int32_t *d_sel, float *d_w,
                                           const float *d_logits, int T, int E, int k,
                                           int renorm) {
    if (T <= 0) return LOOM_OK;
    size_t smem = (size_t)ROUTE_WARPS * E * sizeof(float);
    if (k < 1 || k > LOOM_CUDA_MOE_KMAX || k > E || smem > c->smem_optin)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda moe_route: top %d of %d experts (expected "
                        "1 <= k <= min(experts, %d), experts <= %zu)", k, E, LOOM_CUDA_MOE_KMAX,
                        c->smem_optin / (ROUTE_WARPS * sizeof(float)));
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(moe_route_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    unsigned blocks = (unsigned)((T + ROUTE_WARPS - 1) / ROUTE_WARPS);
    moe_route_kernel<<<blocks, 32 * ROUTE_WARPS, smem, c->stream>>>(d_sel, d_w, d_logits, T, E,
                                                                   k, renorm);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- bucketing ---------------------------------------------------------- */

/* One block: counts of pairs per expert (the atomics' return values rank a
 * pair within its expert, in no fixed order: every grouped row is computed
 * on its own, so where a row lands never changes a value), the offsets and
 * the tile counts, then each pair's grouped row and each row's token. */
__global__ void moe_sort_kernel(int32_t *plan, const int32_t *sel, int N, int E, int k) {
    extern __shared__ int sh_cnt[];  /* [E] */
    int32_t *off = plan, *tiles = plan + E + 1, *row = plan + 2 * (E + 1), *src = row + N;
    for (int e = threadIdx.x; e < E; e += blockDim.x) sh_cnt[e] = 0;
    __syncthreads();
    for (int a = threadIdx.x; a < N; a += blockDim.x) row[a] = atomicAdd(&sh_cnt[sel[a]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int o = 0, g = 0;
        for (int e = 0; e < E; e++) {
            off[e] = o;
            tiles[e] = g;
            int n = sh_cnt[e];
            sh_cnt[e] = o;
            o += n;
            g += (n + LOOM_CUDA_MOE_TILE - 1) / LOOM_CUDA_MOE_TILE;
        }
        off[E] = o;
        tiles[E] = g;
    }
    __syncthreads();
    for (int a = threadIdx.x; a < N; a += blockDim.x) {
        int r = sh_cnt[sel[a]] + row[a];
        row[a] = r;
        src[r] = a / k;
    }
}

extern "C" loom_status loom_cuda_moe_sort(loom_cuda *c, int32_t *d_plan, const int32_t *d_sel,
                                          int T, int k, int E) {
    int N = T * k;
    if (N <= 0) return LOOM_OK;
    size_t smem = (size_t)E * sizeof(int);
    if (smem > 48 * 1024)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda moe_sort: %d experts (expected <= %d)", E,
                        48 * 1024 / (int)sizeof(int));
    moe_sort_kernel<<<1, 1024, smem, c->stream>>>(d_plan, d_sel, N, E, k);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- grouped GEMM (prefill) --------------------------------------------- */

#define GG_BM LOOM_CUDA_MOE_TILE /* grouped rows a block */
#define GG_BN 64                 /* output columns (weight rows) a block */
#define GG_BK 16

/* Block (column tile, row tile g): row tile g belongs to the expert e with
 * tiles[e] <= g < tiles[e + 1] and covers its rows off[e] + (g -
 * tiles[e]) * BM, up to off[e + 1]. 256 threads, 4 x 4 outputs each (rows
 * ty + 16 i, columns tx + 16 j), f32 FMAs over k in order. */
template <int DT>
__global__ void __launch_bounds__(256)
moe_gemm_kernel(float *y, const float *x, const void *w, int rows, int cols, const int32_t *plan,
                int E, int N, int gather) {
    __shared__ float As[GG_BK][GG_BM + 1];
    __shared__ float Bs[GG_BK][GG_BN + 1];
    int g = blockIdx.y, e = 0, r0, r1;
    const int32_t *src = NULL;
    if (plan) {
        const int32_t *off = plan, *tiles = plan + E + 1;
        if (g >= tiles[E]) return;
        int lo = 0, hi = E - 1;  /* the last e with tiles[e] <= g */
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (tiles[mid] <= g) lo = mid;
            else hi = mid - 1;
        }
        e = lo;
        r0 = off[e] + (g - tiles[e]) * GG_BM;
        r1 = off[e + 1];
        if (gather) src = plan + 2 * (E + 1) + N;
    } else {
        r0 = g * GG_BM;
        r1 = N;
    }
    int n0 = blockIdx.x * GG_BN;
    int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    size_t wbase = (size_t)e * rows * cols;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < cols; k0 += GG_BK) {
        for (int i = tid; i < GG_BM * GG_BK; i += 256) {
            int r = i / GG_BK, kk = i % GG_BK, gr = r0 + r, kc = k0 + kk;
            float v = 0;
            if (gr < r1 && kc < cols) {
                size_t xr = src ? (size_t)src[gr] : (size_t)gr;
                v = x[xr * cols + kc];
            }
            As[kk][r] = v;
        }
        for (int i = tid; i < GG_BN * GG_BK; i += 256) {
            int n = i / GG_BK, kk = i % GG_BK, gn = n0 + n, kc = k0 + kk;
            Bs[kk][n] = gn < rows && kc < cols ? moe_ld(w, wbase + (size_t)gn * cols + kc, DT)
                                               : 0.0f;
        }
        __syncthreads();
        int kn = cols - k0 < GG_BK ? cols - k0 : GG_BK;
        for (int kk = 0; kk < kn; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
            for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        int gr = r0 + ty + 16 * i;
        if (gr >= r1) continue;
        for (int j = 0; j < 4; j++) {
            int gn = n0 + tx + 16 * j;
            if (gn < rows) y[(size_t)gr * rows + gn] = acc[i][j];
        }
    }
}

extern "C" int loom_cuda_moe_plan_ints(int T, int k, int E) { return 2 * (E + 1) + 2 * T * k; }

extern "C" loom_status loom_cuda_moe_gemm(loom_cuda *c, float *d_y, const float *d_x, int gather,
                                          const void *d_w, loom_cuda_dtype dt, int rows, int cols,
                                          const int32_t *d_plan, int E, int N) {
    if (N <= 0 || rows <= 0) return LOOM_OK;
    /* tiles over all experts: sum ceil(n_e / BM) <= N / BM + E */
    size_t gy = d_plan ? (size_t)(N + GG_BM - 1) / GG_BM + (size_t)E
                       : (size_t)(N + GG_BM - 1) / GG_BM;
    if (gy > 65535)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda moe_gemm: %d rows over %d experts (expected "
                        "at most %d row tiles)", N, E, 65535);
    dim3 grid((unsigned)((rows + GG_BN - 1) / GG_BN), (unsigned)gy);
    if (!d_plan) gather = 0, E = 1;
    if (dt == LOOM_CUDA_F32)
        moe_gemm_kernel<LOOM_CUDA_F32><<<grid, 256, 0, c->stream>>>(d_y, d_x, d_w, rows, cols,
                                                                    d_plan, E, N, gather);
    else if (dt == LOOM_CUDA_F16)
        moe_gemm_kernel<LOOM_CUDA_F16><<<grid, 256, 0, c->stream>>>(d_y, d_x, d_w, rows, cols,
                                                                    d_plan, E, N, gather);
    else
        moe_gemm_kernel<LOOM_CUDA_BF16><<<grid, 256, 0, c->stream>>>(d_y, d_x, d_w, rows, cols,
                                                                     d_plan, E, N, gather);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- expert GEMVs (decode) ---------------------------------------------- */

#define GV_WARPS 8

/* dot(w row, x row) over cols by one warp, f32: 16-byte loads where vec
 * (16-bit rows: cols % 8 == 0; f32: cols % 4 == 0; rows then start on 16
 * bytes), else one element a lane. The same value in every lane. */
template <int DT>
__device__ __forceinline__ float moe_dot(const void *w, size_t woff, const float *x, int cols,
                                         int vec) {
    int lane = threadIdx.x & 31;
    float s = 0;
    if (vec && DT != LOOM_CUDA_F32) {
        const uint4 *wr = (const uint4 *)((const unsigned short *)w + woff);
        const float4 *xr = (const float4 *)x;
        for (int i = lane; i < cols / 8; i += 32) {
            uint4 q = wr[i];
            float4 xa = xr[2 * i], xb = xr[2 * i + 1];
            unsigned u[4] = {q.x, q.y, q.z, q.w};
            float xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            for (int h = 0; h < 4; h++) {
                float lo, hi;
                if (DT == LOOM_CUDA_F16) {
                    __half2 hv;
                    memcpy(&hv, &u[h], sizeof hv);
                    lo = __low2float(hv);
                    hi = __high2float(hv);
                } else {
                    lo = __uint_as_float(u[h] << 16);
                    hi = __uint_as_float(u[h] & 0xffff0000u);
                }
                s = fmaf(lo, xv[2 * h], s);
                s = fmaf(hi, xv[2 * h + 1], s);
            }
        }
    } else if (vec) {
        const float4 *wr = (const float4 *)((const float *)w + woff);
        const float4 *xr = (const float4 *)x;
        for (int i = lane; i < cols / 4; i += 32) {
            float4 a = wr[i], b = xr[i];
            s = fmaf(a.x, b.x, s);
            s = fmaf(a.y, b.y, s);
            s = fmaf(a.z, b.z, s);
            s = fmaf(a.w, b.w, s);
        }
    } else {
        for (int i = lane; i < cols; i += 32) s = fmaf(moe_ld(w, woff + i, DT), x[i], s);
    }
    return moe_warp_sum(s);
}

/* Pair a (blockIdx.y): y row a = x row a / kdiv @ W_e^T, e = sel[a] (sel
 * NULL: expert 0, the router). A warp an output row. */
template <int DT>
__global__ void moe_gemv_kernel(float *y, const float *x, int kdiv, const int32_t *sel,
                                const void *w, int rows, int cols, int vec) {
    int a = blockIdx.y, r = blockIdx.x * GV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    int e = sel ? sel[a] : 0;
    size_t woff = ((size_t)e * rows + r) * cols;
    float s = moe_dot<DT>(w, woff, x + (size_t)(a / kdiv) * cols, cols, vec);
    if ((threadIdx.x & 31) == 0) y[(size_t)a * rows + r] = s;
}

/* Token t (blockIdx.y): out row t (+)= sum over its k pairs j (in order) of
 * wt[j] * (x row t * k + j @ W_sel[j]^T). A warp an output row. */
template <int DT>
__global__ void moe_gemv_sum_kernel(float *out, int acc, const float *x, const int32_t *sel,
                                    const float *wt, const void *w, int k, int rows, int cols,
                                    int vec) {
    int t = blockIdx.y, r = blockIdx.x * GV_WARPS + (threadIdx.x >> 5);
    if (r >= rows) return;
    float sum = 0;
    for (int j = 0; j < k; j++) {
        size_t a = (size_t)t * k + j;
        size_t woff = ((size_t)sel[a] * rows + r) * cols;
        sum += wt[a] * moe_dot<DT>(w, woff, x + a * cols, cols, vec);
    }
    if ((threadIdx.x & 31) == 0) {
        float *o = out + (size_t)t * rows + r;
        *o = acc ? *o + sum : sum;
    }
}

static int gv_vec(loom_cuda_dtype dt, int cols, const void *w, const float *x) {
    int ok = dt == LOOM_CUDA_F32 ? cols % 4 == 0 : cols % 8 == 0;
    return ok && ((uintptr_t)w % 16) == 0 && ((uintptr_t)x % 16) == 0;
}

extern "C" loom_status loom_cuda_moe_gemv(loom_cuda *c, float *d_y, const float *d_x, int kdiv,
                                          const int32_t *d_sel, const void *d_w,
                                          loom_cuda_dtype dt, int rows, int cols, int N) {
    if (N <= 0 || rows <= 0) return LOOM_OK;
    if (N > 65535 || kdiv < 1)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda moe_gemv: %d rows (expected 1..65535), "
                        "%d a token", N, kdiv);
    dim3 grid((unsigned)((rows + GV_WARPS - 1) / GV_WARPS), (unsigned)N);
    int vec = gv_vec(dt, cols, d_w, d_x);
    if (dt == LOOM_CUDA_F32)
        moe_gemv_kernel<LOOM_CUDA_F32><<<grid, 32 * GV_WARPS, 0, c->stream>>>(
            d_y, d_x, kdiv, d_sel, d_w, rows, cols, vec);
    else if (dt == LOOM_CUDA_F16)
        moe_gemv_kernel<LOOM_CUDA_F16><<<grid, 32 * GV_WARPS, 0, c->stream>>>(
            d_y, d_x, kdiv, d_sel, d_w, rows, cols, vec);
    else
        moe_gemv_kernel<LOOM_CUDA_BF16><<<grid, 32 * GV_WARPS, 0, c->stream>>>(
            d_y, d_x, kdiv, d_sel, d_w, rows, cols, vec);
    LAUNCH_CHECK();
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_moe_gemv_sum(loom_cuda *c, float *d_out, int acc,
                                              const float *d_x, const int32_t *d_sel,
                                              const float *d_wt, const void *d_w,
                                              loom_cuda_dtype dt, int T, int k, int rows,
                                              int cols) {
    if (T <= 0 || rows <= 0) return LOOM_OK;
    if (T > 65535)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda moe_gemv_sum: %d tokens (expected <= 65535)",
                        T);
    dim3 grid((unsigned)((rows + GV_WARPS - 1) / GV_WARPS), (unsigned)T);
    int vec = gv_vec(dt, cols, d_w, d_x);
    if (dt == LOOM_CUDA_F32)
        moe_gemv_sum_kernel<LOOM_CUDA_F32><<<grid, 32 * GV_WARPS, 0, c->stream>>>(
            d_out, acc, d_x, d_sel, d_wt, d_w, k, rows, cols, vec);
    else if (dt == LOOM_CUDA_F16)
        moe_gemv_sum_kernel<LOOM_CUDA_F16><<<grid, 32 * GV_WARPS, 0, c->stream>>>(
            d_out, acc, d_x, d_sel, d_wt, d_w, k, rows, cols, vec);
    else
        moe_gemv_sum_kernel<LOOM_CUDA_BF16><<<grid, 32 * GV_WARPS, 0, c->stream>>>(
            d_out, acc, d_x, d_sel, d_wt, d_w, k, rows, cols, vec);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- combine ------------------------------------------------------------ */

/* out row t (+)= sum over j (in order) of wt[t k + j] * y row row[t k + j]. */
__global__ void moe_combine_kernel(float *out, int acc, const float *y, const int32_t *row,
                                   const float *wt, int k, int n) {
    int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = 0;
        for (int j = 0; j < k; j++) {
            size_t a = (size_t)t * k + j;
            s += wt[a] * y[(size_t)row[a] * n + i];
        }
        float *o = out + (size_t)t * n + i;
        *o = acc ? *o + s : s;
    }
}

extern "C" loom_status loom_cuda_moe_combine(loom_cuda *c, float *d_out, int acc,
                                             const float *d_y, const int32_t *d_plan,
                                             const float *d_wt, int T, int k, int n, int E) {
    if (T <= 0 || n <= 0) return LOOM_OK;
    if (T > 65535)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda moe_combine: %d tokens (expected <= 65535)",
                        T);
    dim3 grid(LOOM_MIN_U(loom_cuda_blocks((size_t)n, 256), 16u), (unsigned)T);
    moe_combine_kernel<<<grid, 256, 0, c->stream>>>(d_out, acc, d_y, d_plan + 2 * (E + 1), d_wt,
                                                    k, n);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- gated shared expert ------------------------------------------------ */

/* out row t += sigmoid(g[t]) * y row t (moe.c's shared expert). */
__global__ void moe_gate_add_kernel(float *out, const float *y, const float *g, int n) {
    int t = blockIdx.y;
    float s = 1.0f / (1.0f + expf(-g[t]));
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        size_t o = (size_t)t * n + i;
        out[o] += s * y[o];
    }
}

extern "C" loom_status loom_cuda_moe_gate_add(loom_cuda *c, float *d_out, const float *d_y,
                                              const float *d_g, int T, int n) {
    if (T <= 0 || n <= 0) return LOOM_OK;
    if (T > 65535)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda moe_gate_add: %d tokens (expected <= 65535)",
                        T);
    dim3 grid(LOOM_MIN_U(loom_cuda_blocks((size_t)n, 256), 16u), (unsigned)T);
    moe_gate_add_kernel<<<grid, 256, 0, c->stream>>>(d_out, d_y, d_g, n);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* Gemma 4's per-expert scales on the routing weights (after the top-k
 * renormalisation, as moe.c applies them): wt[a] *= scale[sel[a]]. */
__global__ void moe_scale_weights_kernel(float *wt, const int32_t *sel, const float *scale,
                                         int N) {
    int a = blockIdx.x * blockDim.x + threadIdx.x;
    if (a < N) wt[a] *= scale[sel[a]];
}

extern "C" loom_status loom_cuda_moe_scale_weights(loom_cuda *c, float *d_wt,
                                                   const int32_t *d_sel, const float *d_scale,
                                                   int T, int k) {
    int N = T * k;
    if (N <= 0) return LOOM_OK;
    moe_scale_weights_kernel<<<loom_cuda_blocks((size_t)N, 256), 256, 0, c->stream>>>(
        d_wt, d_sel, d_scale, N);
    LAUNCH_CHECK();
    return LOOM_OK;
}
