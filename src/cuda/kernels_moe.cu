/* kernels_moe: the routed-experts feed-forward (Qwen3-MoE) on the device:
 * routing (softmax, top-k, renormalisation), bucketing of the (token,
 * choice) pairs by expert, a grouped GEMM over every expert's rows in one
 * launch (prefill, and decode batches: on the tensor cores for 16-bit
 * weights), an expert GEMV per pair and a GEMV that sums a token's experts
 * (decode of a few tokens), and the weighted combine. Reference:
 * src/model/moe.c.
 *
 * Nothing here reads a count back to the host: every grid is sized by the
 * step's token count alone (the grouped GEMM's by an upper bound on its
 * tiles, the surplus blocks returning at once), so a step stays
 * capturable into a CUDA graph. Inputs are f32 rows; weights f32, f16 or
 * bf16, widened to f32 in the kernels and accumulated in f32, as the CPU's
 * matmuls do (they never round x), except in the tensor-core grouped GEMM,
 * which rounds x to the weight's type as the dense prefill GEMMs do. */
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
__global__ void moe_sort_kernel(int32_t *plan, const int32_t *sel, int N, int E, int k,
                                int tile) {
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
            g += (n + tile - 1) / tile;
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

static int moe_tile_ok(int tile) { return tile == LOOM_CUDA_MOE_TILE || tile == LOOM_CUDA_MOE_TILE_S; }

extern "C" int loom_cuda_moe_tile(int T, int k, int E) {
    /* fewer than 32 pairs an expert on average (decode batches): 64-row
     * tiles would be mostly empty rows, computed all the same */
    return (long)T * k >= 32L * E ? LOOM_CUDA_MOE_TILE : LOOM_CUDA_MOE_TILE_S;
}

extern "C" loom_status loom_cuda_moe_sort(loom_cuda *c, int32_t *d_plan, const int32_t *d_sel,
                                          int T, int k, int E, int tile) {
    int N = T * k;
    if (!moe_tile_ok(tile))
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda moe_sort: tile of %d rows (expected %d or %d)",
                        tile, LOOM_CUDA_MOE_TILE_S, LOOM_CUDA_MOE_TILE);
    if (N <= 0) return LOOM_OK;
    size_t smem = (size_t)E * sizeof(int);
    if (smem > 48 * 1024)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda moe_sort: %d experts (expected <= %d)", E,
                        48 * 1024 / (int)sizeof(int));
    moe_sort_kernel<<<1, 1024, smem, c->stream>>>(d_plan, d_sel, N, E, k, tile);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- grouped GEMM (prefill) --------------------------------------------- */

#define GG_BM LOOM_CUDA_MOE_TILE /* grouped rows a block */
#define GG_BN 64                 /* output columns (weight rows) a block */
#define GG_BK 16

/* Row tile g of the plan (tiles of `tile` rows) belongs to the expert e
 * with tiles[e] <= g < tiles[e + 1] and covers its rows [r0, r1): from
 * off[e] + (g - tiles[e]) * tile, at most tile of them, up to off[e + 1].
 * 0: past the last tile. */
__device__ __forceinline__ int moe_tile_rows(const int32_t *plan, int E, int g, int tile, int *e,
                                             int *r0, int *r1) {
    const int32_t *off = plan, *tiles = plan + E + 1;
    if (g >= tiles[E]) return 0;
    int lo = 0, hi = E - 1;  /* the last e with tiles[e] <= g */
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (tiles[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    *e = lo;
    *r0 = off[lo] + (g - tiles[lo]) * tile;
    *r1 = min(off[lo + 1], *r0 + tile);
    return 1;
}

/* Block (column tile, row tile g) of the plan, or rows g * BM on without
 * one. 256 threads, 4 x 4 outputs each (rows ty + 16 i, columns tx + 16
 * j), f32 FMAs over k in order. */
template <int DT>
__global__ void __launch_bounds__(256)
moe_gemm_kernel(float *y, const float *x, const void *w, int rows, int cols, const int32_t *plan,
                int E, int N, int gather, int tile) {
    __shared__ float As[GG_BK][GG_BM + 1];
    __shared__ float Bs[GG_BK][GG_BN + 1];
    int g = blockIdx.y, e = 0, r0, r1;
    const int32_t *src = NULL;
    if (plan) {
        if (!moe_tile_rows(plan, E, g, tile, &e, &r0, &r1)) return;
        if (gather) src = plan + 2 * (E + 1) + N;
    } else {
        r0 = g * GG_BM;
        r1 = min(N, r0 + GG_BM);
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

/* The same on the tensor cores, for 16-bit weights (cols % 8 == 0): x
 * rounded to the weight's type as it is staged (as the dense prefill GEMMs
 * take their input), mma.m16n8k16 with f32 accumulation. A block is BM
 * grouped rows (one plan tile: BM = tile) by TC_BN weight rows, 4 warps
 * (2 x 2 of 32 x 64 at BM 64, 1 x 4 of 16 x 32 at BM 16), k in steps of
 * TC_BK through two shared-memory stages: weights by cp.async, x by
 * registers (loaded before the stage in use is computed, stored after). */
#define TC_BN 128
#define TC_BK 32
#define TC_LD (TC_BK + 8) /* 80-byte rows: ldmatrix's 8 row addresses in distinct banks */

__device__ __forceinline__ void tc_cp16(void *dst, const void *src, int n) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n)
                 : "memory");
}

__device__ __forceinline__ void tc_ldsm(unsigned *r, const void *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

template <int DT>
__device__ __forceinline__ void tc_mma(float *d, const unsigned *a, unsigned b0, unsigned b1) {
    if (DT == LOOM_CUDA_F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int DT>
__device__ __forceinline__ uint2 tc_pack4(float4 v) {
    unsigned lo, hi;
    if (DT == LOOM_CUDA_F16) {
        __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
        memcpy(&lo, &a, 4);
        memcpy(&hi, &b, 4);
    } else {
        __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        memcpy(&lo, &a, 4);
        memcpy(&hi, &b, 4);
    }
    return make_uint2(lo, hi);
}

template <int DT, int BM>
__global__ void __launch_bounds__(128)
moe_gemm_tc_kernel(float *y, const float *x, const unsigned short *w, int rows, int cols,
                   const int32_t *plan, int E, int N, int gather) {
    constexpr int WARPS_M = BM == 64 ? 2 : 1, WARPS_N = 4 / WARPS_M;
    constexpr int WM = BM / WARPS_M, WN = TC_BN / WARPS_N, MT = WM / 16, NT = WN / 8;
    constexpr int AV = BM * TC_BK / 4 / 128;  /* x float4s a thread a stage */
    __shared__ __align__(16) unsigned short As[2][BM][TC_LD];
    __shared__ __align__(16) unsigned short Bs[2][TC_BN][TC_LD];
    int e, r0, r1;
    if (!moe_tile_rows(plan, E, blockIdx.y, BM, &e, &r0, &r1)) return;
    const int32_t *src = gather ? plan + 2 * (E + 1) + N : NULL;
    int n0 = blockIdx.x * TC_BN, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    int wm = wid / WARPS_N, wn = wid % WARPS_N;
    const unsigned short *we = w + (size_t)e * rows * cols;
    /* this thread's x rows, fixed over k */
    const float *xr[AV];
#pragma unroll
    for (int j = 0; j < AV; j++) {
        int gr = r0 + (tid + j * 128) / (TC_BK / 4);
        xr[j] = gr < r1 ? x + (size_t)(src ? src[gr] : gr) * cols : NULL;
    }
    auto load_b = [&](int k0, int s) {
#pragma unroll
        for (int j = 0; j < TC_BN * TC_BK / 8 / 128; j++) {
            int i = tid + j * 128, n = i / (TC_BK / 8), c8 = (i % (TC_BK / 8)) * 8;
            int gn = n0 + n, kc = k0 + c8, ok = gn < rows && kc < cols;
            tc_cp16(&Bs[s][n][c8], ok ? we + (size_t)gn * cols + kc : we, ok ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    auto load_a = [&](int k0, float4 *v) {
#pragma unroll
        for (int j = 0; j < AV; j++) {
            int kc = k0 + ((tid + j * 128) % (TC_BK / 4)) * 4;
            v[j] = xr[j] && kc < cols ? *(const float4 *)(xr[j] + kc) : make_float4(0, 0, 0, 0);
        }
    };
    auto store_a = [&](int s, const float4 *v) {
#pragma unroll
        for (int j = 0; j < AV; j++) {
            int i = tid + j * 128;
            *(uint2 *)&As[s][i / (TC_BK / 4)][(i % (TC_BK / 4)) * 4] = tc_pack4<DT>(v[j]);
        }
    };
    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < NT; n++) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0;
    float4 av[AV];
    int nk = (cols + TC_BK - 1) / TC_BK;
    load_b(0, 0);
    load_a(0, av);
    store_a(0, av);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    for (int kt = 0; kt < nk; kt++) {
        int cur = kt & 1, more = kt + 1 < nk;
        if (more) {
            load_b((kt + 1) * TC_BK, cur ^ 1);
            load_a((kt + 1) * TC_BK, av);
        }
#pragma unroll
        for (int ks = 0; ks < TC_BK / 16; ks++) {
            unsigned a[MT][4];
#pragma unroll
            for (int m = 0; m < MT; m++)
                tc_ldsm(a[m], &As[cur][wm * WM + m * 16 + (lane & 7) + ((lane >> 3) & 1) * 8]
                                 [ks * 16 + (lane >> 4) * 8]);
#pragma unroll
            for (int n = 0; n < NT / 2; n++) {
                unsigned b[4];
                tc_ldsm(b, &Bs[cur][wn * WN + n * 16 + (lane & 7) + (lane >> 4) * 8]
                              [ks * 16 + ((lane >> 3) & 1) * 8]);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    tc_mma<DT>(acc[m][2 * n], a[m], b[0], b[1]);
                    tc_mma<DT>(acc[m][2 * n + 1], a[m], b[2], b[3]);
                }
            }
        }
        if (more) {
            store_a(cur ^ 1, av);
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        }
        __syncthreads();
    }
    /* element h of n-tile n: row lane / 4 (+ 8 for h >= 2), column 2 (lane % 4) + h % 2 */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int gr = r0 + wm * WM + m * 16 + (lane >> 2) + 8 * h;
            if (gr >= r1) continue;
            float *yr = y + (size_t)gr * rows;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                int gn = n0 + wn * WN + n * 8 + (lane & 3) * 2;
                if (gn < rows) yr[gn] = acc[m][n][2 * h];
                if (gn + 1 < rows) yr[gn + 1] = acc[m][n][2 * h + 1];
            }
        }
}

extern "C" int loom_cuda_moe_plan_ints(int T, int k, int E) { return 2 * (E + 1) + 2 * T * k; }

extern "C" int loom_cuda_moe_gemm_tc(loom_cuda_dtype dt, int cols, int grouped) {
    return grouped && dt != LOOM_CUDA_F32 && cols % 8 == 0;
}

extern "C" loom_status loom_cuda_moe_gemm(loom_cuda *c, float *d_y, const float *d_x, int gather,
                                          const void *d_w, loom_cuda_dtype dt, int rows, int cols,
                                          const int32_t *d_plan, int E, int N, int tile) {
    if (N <= 0 || rows <= 0) return LOOM_OK;
    if (d_plan && !moe_tile_ok(tile))
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda moe_gemm: tile of %d rows (expected %d or %d)",
                        tile, LOOM_CUDA_MOE_TILE_S, LOOM_CUDA_MOE_TILE);
    if (!d_plan) tile = GG_BM;
    /* tiles over all experts: sum ceil(n_e / tile) <= N / tile + E */
    size_t gy = (size_t)(N + tile - 1) / tile + (d_plan ? (size_t)E : 0);
    if (gy > 65535)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda moe_gemm: %d rows over %d experts (expected "
                        "at most %d row tiles)", N, E, 65535);
    if (loom_cuda_moe_gemm_tc(dt, cols, d_plan != NULL) && (uintptr_t)d_x % 16 == 0 &&
        (uintptr_t)d_w % 16 == 0) {
        dim3 grid((unsigned)((rows + TC_BN - 1) / TC_BN), (unsigned)gy);
        const unsigned short *w = (const unsigned short *)d_w;
#define TC_LAUNCH(DT, BM)                                                                     \
    moe_gemm_tc_kernel<DT, BM><<<grid, 128, 0, c->stream>>>(d_y, d_x, w, rows, cols, d_plan, E, \
                                                            N, gather)
        if (dt == LOOM_CUDA_F16 && tile == LOOM_CUDA_MOE_TILE) TC_LAUNCH(LOOM_CUDA_F16, 64);
        else if (dt == LOOM_CUDA_F16) TC_LAUNCH(LOOM_CUDA_F16, 16);
        else if (tile == LOOM_CUDA_MOE_TILE) TC_LAUNCH(LOOM_CUDA_BF16, 64);
        else TC_LAUNCH(LOOM_CUDA_BF16, 16);
#undef TC_LAUNCH
        LAUNCH_CHECK();
        return LOOM_OK;
    }
    dim3 grid((unsigned)((rows + GG_BN - 1) / GG_BN), (unsigned)gy);
    if (!d_plan) gather = 0, E = 1;
    if (dt == LOOM_CUDA_F32)
        moe_gemm_kernel<LOOM_CUDA_F32><<<grid, 256, 0, c->stream>>>(d_y, d_x, d_w, rows, cols,
                                                                    d_plan, E, N, gather, tile);
    else if (dt == LOOM_CUDA_F16)
        moe_gemm_kernel<LOOM_CUDA_F16><<<grid, 256, 0, c->stream>>>(d_y, d_x, d_w, rows, cols,
                                                                    d_plan, E, N, gather, tile);
    else
        moe_gemm_kernel<LOOM_CUDA_BF16><<<grid, 256, 0, c->stream>>>(d_y, d_x, d_w, rows, cols,
                                                                     d_plan, E, N, gather, tile);
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
