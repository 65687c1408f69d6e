/* kernels_gemm: y = x W^T. Dense weights go through cuBLAS (f32
 * accumulation), or for a few tokens of 16-bit weights through our own
 * skinny GEMM (loom_cuda_gemv), which can also make its input (RMSNorm,
 * gated activation) and add into the residual; MLX affine-quantized
 * weights through a dequantizing GEMV. References: matmul_f32/f16/bf16 and
 * matmul_q in src/ops/ops_ref.c. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_int.cuh"

/* ---- dense -------------------------------------------------------------- */

__global__ void f32_to_f16_kernel(__half *y, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rn(x[i]);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *y, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

/* y = beta y + x W^T with f32 accumulation. x is f32 (converted to the
 * weight's 16-bit type first where W is 16-bit) or, with x16, already in
 * that type (made so by the kernel before: add_rmsnorm16, act_mul_split16). */
static loom_status gemm_into(loom_cuda *c, float *d_y, const void *d_x, int x16, const void *d_w,
                             loom_cuda_dtype dt, int T, int rows, int cols, float beta,
                             const char *what) {
    if (T <= 0 || rows <= 0) return LOOM_OK;
    if (cols <= 0 || (x16 && dt != LOOM_CUDA_F16 && dt != LOOM_CUDA_BF16))
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda %s: %d columns, type %d (expected columns > 0, "
                        "and f16 or bf16 weights for 16-bit x)", what, cols, (int)dt);
    const float one = 1.0f;
    const void *x = d_x;
    cudaDataType_t ty = dt == LOOM_CUDA_F32 ? CUDA_R_32F : dt == LOOM_CUDA_F16 ? CUDA_R_16F
                                                                                 : CUDA_R_16BF;
    if (!x16 && dt != LOOM_CUDA_F32) {
        size_t n = (size_t)T * cols;
        void *tmp;
        loom_status st = loom_cuda_scratch(c, n * 2, &tmp);
        if (st != LOOM_OK) return st;
        if (dt == LOOM_CUDA_F16)
            f32_to_f16_kernel<<<loom_cuda_blocks(n, 256), 256, 0, c->stream>>>(
                (__half *)tmp, (const float *)d_x, n);
        else
            f32_to_bf16_kernel<<<loom_cuda_blocks(n, 256), 256, 0, c->stream>>>(
                (__nv_bfloat16 *)tmp, (const float *)d_x, n);
        LAUNCH_CHECK();
        x = tmp;
    }
    /* Column-major view: y^T (rows, T) = W (cols, rows)^T * x^T (cols, T). */
    CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, cols, &one, d_w, ty,
                              cols, x, ty, cols, &beta, d_y, CUDA_R_32F, rows,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_gemm(loom_cuda *c, float *d_y, const float *d_x,
                                      const void *d_w, loom_cuda_dtype dt, int T, int rows,
                                      int cols) {
    return gemm_into(c, d_y, d_x, 0, d_w, dt, T, rows, cols, 0.0f, "gemm");
}

extern "C" loom_status loom_cuda_gemm16(loom_cuda *c, float *d_y, const void *d_x16,
                                        const void *d_w, loom_cuda_dtype dt, int T, int rows,
                                        int cols) {
    return gemm_into(c, d_y, d_x16, 1, d_w, dt, T, rows, cols, 0.0f, "gemm16");
}

extern "C" loom_status loom_cuda_gemm16_bf16out(loom_cuda *c, void *d_y16, const void *d_x16,
                                                const void *d_w, int T, int rows, int cols) {
    if (T <= 0 || rows <= 0) return LOOM_OK;
    if (cols <= 0) return loom_err(LOOM_ERR_INVALID_ARG, "cuda gemm16_bf16out: %d columns", cols);
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, cols, &one, d_w,
                              CUDA_R_16BF, cols, d_x16, CUDA_R_16BF, cols, &zero, d_y16,
                              CUDA_R_16BF, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_gemm_acc(loom_cuda *c, float *d_y, const void *d_x, int x16,
                                          const void *d_w, loom_cuda_dtype dt, int T, int rows,
                                          int cols) {
    return gemm_into(c, d_y, d_x, x16, d_w, dt, T, rows, cols, 1.0f, "gemm_acc");
}

/* ---- skinny GEMM for a few tokens (decode) ------------------------------ */

/* At decode a projection is one pass over the weights: cuBLAS with N = 1..8
 * leaves bandwidth unused on the large matrices and costs several
 * microseconds of fixed latency on the small ones. Here each warp owns R
 * consecutive rows at a time and its lanes stride the columns in 16-byte
 * vectors (8 weights), so a weight row is read once for all T tokens.
 * The block first makes the T input rows in the weight's 16-bit type in
 * shared memory (copied, rounded from f32, RMSNormed, or act(gate) * up:
 * the same arithmetic and rounding as add_rmsnorm16 / act_mul_split16
 * followed by gemm16), so those kernels drop out of the decode step. The
 * grid is one wave of resident warps, each taking per_warp row groups, so
 * that input is made once per block, not once per row group. */
#define GV_WARPS 8
#define GV_MAXT 8
#define GV_SMEM_MAX (112 * 1024)        /* x rows per block: 2 blocks an SM at most */

struct gv_args {
    float *y;               /* (T, rows) */
    const void *x;          /* by mode: (T, cols) 16-bit or f32, or (T, 2 cols) f32 */
    const float *norm;      /* [cols] RMSNorm weight or NULL */
    const float *bias;      /* [rows] or NULL */
    const uint4 *w;         /* (rows, cols / 8) */
    int rows, cols, mode, acc, per_warp;
    int ks;                 /* gemv_split_kernel: column slices a row */
    float eps;
    unsigned pf;            /* bytes of its rows each warp prefetches into L2 (split: any) */
    int pre2;               /* gemv_split_kernel: the second item loads before the wait too */
    int np;                 /* gemv_split_kernel, RMSNORM: gs_fill_norm where it applies */
    int32_t *amo;           /* gemv_split_kernel, ks 1: each token's argmax over the rows, or NULL */
    float *amv;             /* (T, blocks) the blocks' best values */
    int *ami;               /* (T, blocks) and their rows */
    int *amc;               /* the blocks done (zero between launches) */
};

/* A weight vector, read once: kept out of L1. */
__device__ __forceinline__ uint4 gv_ld(const uint4 *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ void gv_prefetch(const void *p, unsigned n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#endif
}

template <int F16>
__device__ __forceinline__ void gv_cvt(uint4 v, float *f) {
    unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (F16) {
            float2 h = __half22float2(*(const __half2 *)&u[i]);
            f[2 * i] = h.x;
            f[2 * i + 1] = h.y;
        } else {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
}

template <int F16>
__device__ __forceinline__ unsigned gv_pack(float a, float b) {
    if (F16) {
        __half2 h = __floats2half2_rn(a, b);
        return *(const unsigned *)&h;
    }
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const unsigned *)&h;
}

/* The sum of squares of 8 values, in one order for every RMSNORM fill. */
__device__ __forceinline__ float gv_sumsq8(float4 u, float4 v) {
    return u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w + v.x * v.x + v.y * v.y + v.z * v.z +
           v.w * v.w;
}

/* Each warp's sums of its threads' ss into red[wid * NT + t]. */
template <int NT>
__device__ __forceinline__ void gv_warp_sums(const float (&ss)[NT], float *red, int wid, int lane) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = ss[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[wid * NT + t] = v;
    }
}

/* The T input rows, 16-bit, into xs (T, cols / 8 vectors), rows xst
 * vectors apart. UNR > 1 unrolls the loops over the row so that a thread
 * has several loads in flight (the 14336-wide activation input of
 * Llama-3-8B's down projection is 7 vectors a thread). */
template <int NT, int F16, int UNR = 1, int W = GV_WARPS>
__device__ void gv_fill(uint4 *xs, int xst, const gv_args &a, float *red, float *inv) {
    int nch = a.cols >> 3, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float *xf = (const float *)a.x;
    if (a.mode == LOOM_CUDA_GEMV_X16) {
#pragma unroll UNR
        for (int i = threadIdx.x; i < NT * nch; i += blockDim.x) {
            int t = i / nch;
            xs[i + t * (xst - nch)] = ((const uint4 *)a.x)[i];
        }
        return;
    }
    if (a.mode == LOOM_CUDA_GEMV_RMSNORM) {
        float ss[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) ss[t] = 0;
#pragma unroll UNR
        for (int i = threadIdx.x; i < nch; i += blockDim.x)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                const float4 *p = (const float4 *)(xf + (size_t)t * a.cols) + 2 * i;
                ss[t] += gv_sumsq8(p[0], p[1]);
            }
        gv_warp_sums<NT>(ss, red, wid, lane);
        __syncthreads();
        if (threadIdx.x < NT) {
            float v = 0;
            for (int k = 0; k < W; k++) v += red[k * NT + threadIdx.x];
            inv[threadIdx.x] = 1.0f / sqrtf(v / (float)a.cols + a.eps);
        }
        __syncthreads();
    }
#pragma unroll UNR
    for (int i = threadIdx.x; i < NT * nch; i += blockDim.x) {
        int t = i / nch, k = (i - t * nch) * 8;
        float v[8];
        if (a.mode == LOOM_CUDA_GEMV_SILU || a.mode == LOOM_CUDA_GEMV_GELU) {
            const float *gr = xf + (size_t)t * 2 * a.cols + k, *ur = gr + a.cols;
            float4 g0 = ((const float4 *)gr)[0], g1 = ((const float4 *)gr)[1];
            float4 u0 = ((const float4 *)ur)[0], u1 = ((const float4 *)ur)[1];
            float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
            float u[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
            for (int e = 0; e < 8; e++) {  /* as act_mul_split_kernel */
                float x = g[e];
                if (a.mode == LOOM_CUDA_GEMV_GELU) {
                    float in = 0.7978845608028654f * (x + 0.044715f * x * x * x);
                    v[e] = 0.5f * x * (1.0f + tanhf(in)) * u[e];
                } else {
                    v[e] = x / (1.0f + expf(-x)) * u[e];
                }
            }
        } else {
            const float4 *p = (const float4 *)(xf + (size_t)t * a.cols + k);
            float4 p0 = p[0], p1 = p[1];
            v[0] = p0.x, v[1] = p0.y, v[2] = p0.z, v[3] = p0.w;
            v[4] = p1.x, v[5] = p1.y, v[6] = p1.z, v[7] = p1.w;
            if (a.mode == LOOM_CUDA_GEMV_RMSNORM) {  /* as add_rmsnorm16_kernel */
                float s = inv[t];
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = v[e] * s * (a.norm ? a.norm[k + e] : 1.0f);
            }
        }
        xs[i + t * (xst - nch)] = make_uint4(gv_pack<F16>(v[0], v[1]), gv_pack<F16>(v[2], v[3]),
                           gv_pack<F16>(v[4], v[5]), gv_pack<F16>(v[6], v[7]));
    }
}

/* One batch of U column vectors of the R rows of group g (rows past the
 * end re-read the last; their results are dropped). */
template <int R, int U>
__device__ __forceinline__ void gv_load(uint4 (&wv)[U][R], const gv_args &a, int g, int c,
                                        int nch) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint4 *wr = a.w + (size_t)min(g * R + r, a.rows - 1) * nch;
#pragma unroll
        for (int u = 0; u < U; u++)
            wv[u][r] = c + 32 * u < nch ? gv_ld(wr + c + 32 * u) : make_uint4(0, 0, 0, 0);
    }
}

template <int NT, int R, int U, int F16>
__global__ void __launch_bounds__(GV_WARPS * 32) gemv_kernel(const gv_args a) {
    extern __shared__ uint4 xs[];
    __shared__ float red[GV_WARPS * NT];
    __shared__ float inv[NT];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    int nch = a.cols >> 3, ng = (a.rows + R - 1) / R;
    int g0 = (blockIdx.x * GV_WARPS + wid) * a.per_warp, g1 = min(ng, g0 + a.per_warp);
    /* Weights do not change: the first batch is loaded (and a small matrix
     * pulled into L2) while the kernel before still runs and the inputs
     * are made. */
    uint4 wv[U][R];
    if (g0 < g1) gv_load<R, U>(wv, a, g0, lane, nch);
    if (a.pf && g0 < g1) {
        const char *p = (const char *)(a.w + (size_t)g0 * R * nch);
        size_t n = (size_t)(min(a.rows, g1 * R) - g0 * R) * a.cols * 2;
        n = min(n, (size_t)a.pf);
        for (size_t o = (size_t)lane * 4096; o < n; o += 32 * 4096)
            gv_prefetch(p + o, (unsigned)min((size_t)4096, n - o));
    }
    pdl_trigger();
    pdl_wait();
    gv_fill<NT, F16>(xs, nch, a, red, inv);
    __syncthreads();
    for (int g = g0; g < g1; g++) {
        float acc[NT][R];
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[t][r] = 0;
        for (int c = lane; c < nch; c += 32 * U) {
            if (g != g0 || c != lane) gv_load<R, U>(wv, a, g, c, nch);
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (c + 32 * u >= nch) break;
                float wf[R][8];
#pragma unroll
                for (int r = 0; r < R; r++) gv_cvt<F16>(wv[u][r], wf[r]);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    float xv[8];
                    gv_cvt<F16>(xs[t * nch + c + 32 * u], xv);
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[t][r] = fmaf(wf[r][e], xv[e], acc[t][r]);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                float v = acc[t][r];
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                int row = g * R + r;
                if (lane == ((t * R + r) & 31) && row < a.rows) {  /* one lane per output */
                    if (a.bias) v += a.bias[row];
                    float *yp = a.y + (size_t)t * a.rows + row;
                    *yp = a.acc ? *yp + v : v;
                }
            }
    }
}

/* One or two tokens (decode at batch 1-2), the default: the kernel above
 * leaves the memory idle while a warp reduces a row and waits for its next
 * one, and its whole-row groups leave some warps with one more row than
 * others (Llama-3-8B's 6144-row qkv: a third more than the average). Here
 * block b owns rows [b * rows / grid, (b + 1) * rows / grid); its warps
 * take ks column slices of a row each (ks in 1, 2, 4), so the rows of a
 * block spread over its warps to within one slice. A warp walks its
 * (row, batch of U vectors) items with two buffers: the next batch is in
 * flight while the current one is summed and a finished row reduced. With
 * ks > 1 the slices' sums meet in shared memory and are added in slice
 * order. Same input fill and epilogue as gemv_kernel.
 * H200, 1 token: Llama-3-8B's qkv 14.0 us against 16.4, its head 234
 * against 243; a layer's four GEMVs in one graph 117.5 us against 119.5
 * (U = 8); Qwen3-0.6B's 18.8 against 19.3 (U = 4; 18.0 with 8, but its
 * 1024-column head then loses more). Slices (ks 2, 4) and fewer blocks an
 * SM were no faster; they stay selectable (LOOM_CUDA_GEMV_KS, _BPS). */
#define GS_RPB 256  /* most rows a block owns (its slice sums live in shared memory) */
#define GS_FILL_UNROLL 2

template <int U>
__device__ __forceinline__ void gs_load(uint4 (&wv)[U], const uint4 *wr, int c, int c1) {
#pragma unroll
    for (int u = 0; u < U; u++) wv[u] = c + 32 * u < c1 ? gv_ld(wr + c + 32 * u) : make_uint4(0, 0, 0, 0);
}

template <int NT, int U, int F16>
__device__ __forceinline__ void gs_fma(float (&acc)[NT], const uint4 (&wv)[U], const uint4 *xs,
                                       int nch, int c, int c1) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (c + 32 * u >= c1) break;
        float wf[8];
        gv_cvt<F16>(wv[u], wf);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float xv[8];
            gv_cvt<F16>(xs[t * nch + c + 32 * u], xv);
#pragma unroll
            for (int e = 0; e < 8; e++) acc[t] = fmaf(wf[e], xv[e], acc[t]);
        }
    }
}

/* Row r's sums of this warp's slice: the output itself (ks == 1) or the
 * slice's part of it. With a.amo, the lane that writes token t's output
 * keeps the best (value, row) of it in (bv, bi)[t]. */
template <int NT>
__device__ __forceinline__ void gs_row_done(float (&acc)[NT], const gv_args &a, float *part,
                                            int r, int rb0, int s, int lane, float (&bv)[NT],
                                            int (&bi)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[t] = 0;
        if (lane != t) continue;
        if (a.ks > 1) {
            part[((r - rb0) * a.ks + s) * NT + t] = v;
        } else {
            if (a.bias) v += a.bias[r];
            float *yp = a.y + (size_t)t * a.rows + r;
            v = a.acc ? *yp + v : v;
            *yp = v;
            if (a.amo && v == v && loom_cuda_before(v, r, bv[t], bi[t])) bv[t] = v, bi[t] = r;
        }
    }
}

/* The argmax over all rows from each lane's best: the block's best per
 * token into (amv, ami), and the last block to finish picks among the
 * blocks' (any order gives the same pick: the order above is total). */
template <int NT, int W>
__device__ void gs_argmax(const gv_args &a, float (&bv)[NT], int (&bi)[NT]) {
    __shared__ float sv[W * NT];
    __shared__ int si[W * NT];
    __shared__ int last;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nb = gridDim.x;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        loom_cuda_warp_best(bv[t], bi[t]);
        if (lane == 0) sv[wid * NT + t] = bv[t], si[wid * NT + t] = bi[t];
    }
    __syncthreads();
    if (threadIdx.x < NT) {
        int t = threadIdx.x;
        float v = -INFINITY;
        int i = -1;
        for (int k = 0; k < W; k++)
            if (loom_cuda_before(sv[k * NT + t], si[k * NT + t], v, i)) v = sv[k * NT + t], i = si[k * NT + t];
        a.amv[(size_t)t * nb + blockIdx.x] = v;
        a.ami[(size_t)t * nb + blockIdx.x] = i;
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(a.amc, 1) == nb - 1;
        if (last) *a.amc = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = -INFINITY;
        int i = -1;
        for (int b = threadIdx.x; b < nb; b += blockDim.x) {
            float ov = __ldcg(a.amv + (size_t)t * nb + b);
            int oi = __ldcg(a.ami + (size_t)t * nb + b);
            if (loom_cuda_before(ov, oi, v, i)) v = ov, i = oi;
        }
        loom_cuda_warp_best(v, i);
        __syncthreads();  /* sv, si are reused */
        if (lane == 0) sv[wid] = v, si[wid] = i;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int k = 1; k < W; k++)
                if (loom_cuda_before(sv[k], si[k], v, i)) v = sv[k], i = si[k];
            a.amo[t] = i < 0 ? 0 : i;
        }
    }
}

/* The RMSNORM fill where a thread makes at most one vector of a row (the
 * split kernel's rows up to 8 * its threads columns): the thread's norm
 * weights (nw) load before the PDL wait, x stays in registers from the
 * sum of squares to the scaling, and every thread adds the warps' sums
 * itself (one barrier), so that after the wait the fill is one round of
 * loads. The arithmetic of gv_fill's RMSNORM mode, in the same order. */
template <int NT, int F16, int W>
__device__ __forceinline__ void gs_fill_norm(uint4 *xs, const gv_args &a, const float (&nw)[8],
                                             float *red) {
    int nch = a.cols >> 3, lane = threadIdx.x & 31, wid = threadIdx.x >> 5, i = threadIdx.x;
    const float *xf = (const float *)a.x;
    float4 u[NT], v[NT];
    float ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        ss[t] = 0;
        if (i < nch) {
            const float4 *p = (const float4 *)(xf + (size_t)t * a.cols) + 2 * i;
            u[t] = p[0], v[t] = p[1];
            ss[t] += gv_sumsq8(u[t], v[t]);
        }
    }
    gv_warp_sums<NT>(ss, red, wid, lane);
    __syncthreads();
    if (i >= nch) return;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float r = 0;
        for (int k = 0; k < W; k++) r += red[k * NT + t];
        float s = 1.0f / sqrtf(r / (float)a.cols + a.eps);
        float e[8] = {u[t].x, u[t].y, u[t].z, u[t].w, v[t].x, v[t].y, v[t].z, v[t].w};
#pragma unroll
        for (int k = 0; k < 8; k++) e[k] = e[k] * s * nw[k];
        xs[t * nch + i] = make_uint4(gv_pack<F16>(e[0], e[1]), gv_pack<F16>(e[2], e[3]),
                                     gv_pack<F16>(e[4], e[5]), gv_pack<F16>(e[6], e[7]));
    }
}

template <int NT, int U, int F16, int W>
__global__ void __launch_bounds__(W * 32, (U == 4 ? 32 : 16) / W)
    gemv_split_kernel(const gv_args a) {
    extern __shared__ uint4 xs[];  /* (NT, nch) inputs, then (rows of the block, ks, NT) sums */
    __shared__ float red[W * NT];
    __shared__ float inv[NT];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, ks = a.ks, rw = W / ks;
    int s = wid % ks, q = wid / ks, nch = a.cols >> 3;
    int rb0 = (int)((long long)blockIdx.x * a.rows / gridDim.x);
    int rb1 = (int)((long long)(blockIdx.x + 1) * a.rows / gridDim.x);
    int c0 = s * nch / ks, c1 = (s + 1) * nch / ks;  /* this warp's slice of vectors */
    int nb = (c1 - c0 + 32 * U - 1) / (32 * U);      /* batches a row; 0: empty slice */
    int nr = rb0 + q < rb1 ? (rb1 - rb0 - q + rw - 1) / rw : 0;
    int n = nr * nb;
    float *part = (float *)(xs + NT * nch);
    /* Weights do not change: the first batch is loaded (and a small matrix
     * pulled into L2) while the kernel before still runs. */
    uint4 wa[U], wb[U];
    int r = rb0 + q, b = 0;  /* the next item to load */
    if (n > 0) gs_load<U>(wa, a.w + (size_t)r * nch, c0 + lane, c1);
    int pre2 = a.pre2 && n > 1;  /* and the second, in the other buffer */
    if (pre2) {
        int r1 = b + 1 == nb ? r + rw : r, b1 = b + 1 == nb ? 0 : b + 1;
        gs_load<U>(wb, a.w + (size_t)r1 * nch, c0 + b1 * 32 * U + lane, c1);
    }
    if (a.pf) {
        const char *p = (const char *)(a.w + (size_t)rb0 * nch);
        size_t bytes = (size_t)(rb1 - rb0) * a.cols * 2;
        for (size_t o = (size_t)threadIdx.x * 4096; o < bytes; o += W * 32 * 4096)
            gv_prefetch(p + o, (unsigned)min((size_t)4096, bytes - o));
    }
    /* RMSNORM, a vector a thread at most: the norm weights before the wait */
    int np = a.np && a.mode == LOOM_CUDA_GEMV_RMSNORM && nch <= W * 32;
    float nw[8];
    if (np) {
        int i = threadIdx.x < nch ? threadIdx.x : 0;
#pragma unroll
        for (int k = 0; k < 8; k++) nw[k] = a.norm ? a.norm[8 * i + k] : 1.0f;
    }
    pdl_trigger();
    pdl_wait();
    if (np) gs_fill_norm<NT, F16, W>(xs, a, nw, red);
    else gv_fill<NT, F16, GS_FILL_UNROLL, W>(xs, nch, a, red, inv);
    __syncthreads();
    float acc[NT], bv[NT];
    int bi[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0, bv[t] = -INFINITY, bi[t] = -1;
    for (int i = 0; i < n; i += 2) {
        int ra = r, ca = c0 + b * 32 * U + lane, enda = b == nb - 1;
        if (++b == nb) b = 0, r += rw;
        if (i + 1 < n && (i > 0 || !pre2))
            gs_load<U>(wb, a.w + (size_t)r * nch, c0 + b * 32 * U + lane, c1);
        gs_fma<NT, U, F16>(acc, wa, xs, nch, ca, c1);
        if (enda) gs_row_done<NT>(acc, a, part, ra, rb0, s, lane, bv, bi);
        if (i + 1 >= n) break;
        int rbb = r, cb = c0 + b * 32 * U + lane, endb = b == nb - 1;
        if (++b == nb) b = 0, r += rw;
        if (i + 2 < n) gs_load<U>(wa, a.w + (size_t)r * nch, c0 + b * 32 * U + lane, c1);
        gs_fma<NT, U, F16>(acc, wb, xs, nch, cb, c1);
        if (endb) gs_row_done<NT>(acc, a, part, rbb, rb0, s, lane, bv, bi);
    }
    if (a.amo) gs_argmax<NT, W>(a, bv, bi);  /* ks == 1 */
    if (ks == 1) return;
    __syncthreads();
    for (int i = threadIdx.x; i < (rb1 - rb0) * NT; i += blockDim.x) {
        int lr = i / NT, t = i - lr * NT, row = rb0 + lr;
        float v = 0;
        for (int k = 0; k < ks; k++)  /* an empty slice (fewer vectors than slices) wrote nothing */
            if ((k + 1) * nch / ks > k * nch / ks) v += part[(lr * ks + k) * NT + t];
        if (a.bias) v += a.bias[row];
        float *yp = a.y + (size_t)t * a.rows + row;
        *yp = a.acc ? *yp + v : v;
    }
}

/* Tensor-core variant for 3..8 tokens, where the f32 FMAs of the kernel
 * above (8 per weight at 8 tokens) cost as much as the weight reads. A
 * block takes 16 rows at a time and its 8 warps split the columns; a warp
 * feeds mma.m16n8k16 (tokens padded to n = 8) straight from 16-byte
 * weight loads: lane (g, c) = (lane / 4, lane % 4) loads columns [8c, 8c +
 * 8) of each 32-column block for rows g and g + 8 and reads the same
 * columns of token g's input. Those 8 columns stand for the k positions
 * {2c, 2c+1, 2c+8, 2c+9} of two k16 steps, the fragment layout of the
 * instruction; A and B use the same mapping, so the dot products are
 * unchanged (f32 accumulation). The warps' partial tiles meet in shared
 * memory. Input rows are GM_PAD vectors apart so the 8 tokens' reads fall
 * in different banks. */
#define GM_U 4
#define GM_PAD 4

template <int F16>
__device__ __forceinline__ void gm_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                       unsigned a3, unsigned b0, unsigned b1) {
    if (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* GM_U 32-column blocks j0, j0 + 8, ... of rows g and g + 8 of a tile. */
__device__ __forceinline__ void gm_load(uint4 (&wv)[GM_U][2], const gv_args &a, int tile, int j0,
                                        int nkb, int nch, int lane) {
    int g = lane >> 2, c = lane & 3;
    const uint4 *r0 = a.w + (size_t)min(tile * 16 + g, a.rows - 1) * nch;
    const uint4 *r1 = a.w + (size_t)min(tile * 16 + g + 8, a.rows - 1) * nch;
#pragma unroll
    for (int u = 0; u < GM_U; u++) {
        int j = j0 + GV_WARPS * u, ch = j * 4 + c;
        bool ok = j < nkb && ch < nch;
        wv[u][0] = ok ? gv_ld(r0 + ch) : make_uint4(0, 0, 0, 0);
        wv[u][1] = ok ? gv_ld(r1 + ch) : make_uint4(0, 0, 0, 0);
    }
}

template <int NT, int F16>
__global__ void __launch_bounds__(GV_WARPS * 32) gemv_mma_kernel(const gv_args a) {
    extern __shared__ uint4 xs[];
    __shared__ float4 part[GV_WARPS * 32];
    __shared__ float red[GV_WARPS * NT];
    __shared__ float inv[NT];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int nch = a.cols >> 3, xst = nch + GM_PAD, nkb = (nch + 3) / 4, ntiles = (a.rows + 15) / 16;
    int tile0 = blockIdx.x;
    uint4 wv[GM_U][2];
    if (tile0 < ntiles) gm_load(wv, a, tile0, wid, nkb, nch, lane);
    pdl_trigger();
    pdl_wait();
    gv_fill<NT, F16>(xs, xst, a, red, inv);
    __syncthreads();
    for (int tile = tile0; tile < ntiles; tile += gridDim.x) {
        float d[4] = {0, 0, 0, 0};
        for (int j0 = wid; j0 < nkb; j0 += GV_WARPS * GM_U) {
            if (tile != tile0 || j0 != wid) gm_load(wv, a, tile, j0, nkb, nch, lane);
#pragma unroll
            for (int u = 0; u < GM_U; u++) {
                int ch = (j0 + GV_WARPS * u) * 4 + c;
                if (j0 + GV_WARPS * u >= nkb) break;
                uint4 xv = g < NT && ch < nch ? xs[g * xst + ch] : make_uint4(0, 0, 0, 0);
                gm_mma<F16>(d, wv[u][0].x, wv[u][1].x, wv[u][0].y, wv[u][1].y, xv.x, xv.y);
                gm_mma<F16>(d, wv[u][0].z, wv[u][1].z, wv[u][0].w, wv[u][1].w, xv.z, xv.w);
            }
        }
        part[wid * 32 + lane] = make_float4(d[0], d[1], d[2], d[3]);
        __syncthreads();
        if (threadIdx.x < 128) {  /* output (row, token) of fragment slot q of lane l */
            int l = threadIdx.x >> 2, q = threadIdx.x & 3;
            float v = 0;
#pragma unroll
            for (int w = 0; w < GV_WARPS; w++) v += ((const float *)&part[w * 32 + l])[q];
            int row = tile * 16 + (l >> 2) + (q >= 2 ? 8 : 0), t = 2 * (l & 3) + (q & 1);
            if (t < NT && row < a.rows) {
                if (a.bias) v += a.bias[row];
                float *yp = a.y + (size_t)t * a.rows + row;
                *yp = a.acc ? *yp + v : v;
            }
        }
        __syncthreads();  /* part is rewritten by the next tile */
    }
}

typedef void (*gv_fn)(gv_args);

/* The row-group kernel for T tokens and its rows per warp. One or two
 * tokens (LOOM_CUDA_GEMV_KS=0): a row per warp and 8 vectors in flight per
 * lane (H200: more warps and bytes in flight on the matrices of few rows;
 * 2 rows x 4 vectors reached 0.9-1.3 TB/s on the Qwen3-0.6B o and down
 * shapes). Beyond, 4 rows, so that the shared-memory reads of x stay under
 * the weight bytes. */
template <int F16>
static gv_fn gv_pick(int T, int *R) {
    *R = T <= 2 ? 1 : 4;
    switch (T) {
    case 1: return gemv_kernel<1, 1, 8, F16>;
    case 2: return gemv_kernel<2, 1, 8, F16>;
    case 3: return gemv_kernel<3, 4, 2, F16>;
    case 4: return gemv_kernel<4, 4, 2, F16>;
    case 5: return gemv_kernel<5, 4, 2, F16>;
    case 6: return gemv_kernel<6, 4, 2, F16>;
    case 7: return gemv_kernel<7, 4, 2, F16>;
    default: return gemv_kernel<8, 4, 2, F16>;
    }
}

template <int F16, int W>
static gv_fn gs_pick(int T, int U) {
    if (U == 8) return T == 1 ? gemv_split_kernel<1, 8, F16, W> : gemv_split_kernel<2, 8, F16, W>;
    return T == 1 ? gemv_split_kernel<1, 4, F16, W> : gemv_split_kernel<2, 4, F16, W>;
}

template <int F16>
static gv_fn gm_pick(int T) {
    switch (T) {
    case 1: return gemv_mma_kernel<1, F16>;
    case 2: return gemv_mma_kernel<2, F16>;
    case 3: return gemv_mma_kernel<3, F16>;
    case 4: return gemv_mma_kernel<4, F16>;
    case 5: return gemv_mma_kernel<5, F16>;
    case 6: return gemv_mma_kernel<6, F16>;
    case 7: return gemv_mma_kernel<7, F16>;
    default: return gemv_mma_kernel<8, F16>;
    }
}

extern "C" int loom_cuda_gemv_max_tokens(const loom_cuda *c, loom_cuda_dtype dt, int cols) {
    if ((dt != LOOM_CUDA_F16 && dt != LOOM_CUDA_BF16) || cols < 8 || cols % 8) return 0;
    size_t cap = LOOM_MIN_U((unsigned)GV_SMEM_MAX, (unsigned)c->smem_optin);
    size_t t = cap / (((size_t)cols / 8 + GM_PAD) * 16);  /* either kernel's rows */
    return t > GV_MAXT ? GV_MAXT : (int)t;
}

extern "C" loom_status loom_cuda_gemv(loom_cuda *c, float *d_y, const loom_cuda_gemv_in *in,
                                      const void *d_w, loom_cuda_dtype dt, int T, int rows,
                                      int cols, const float *d_bias, int accumulate) {
    return loom_cuda_gemv_argmax(c, d_y, in, d_w, dt, T, rows, cols, d_bias, accumulate, NULL);
}

extern "C" loom_status loom_cuda_gemv_argmax(loom_cuda *c, float *d_y,
                                             const loom_cuda_gemv_in *in, const void *d_w,
                                             loom_cuda_dtype dt, int T, int rows, int cols,
                                             const float *d_bias, int accumulate,
                                             int32_t *d_argmax) {
    if (T <= 0 || rows <= 0) return LOOM_OK;
    int maxt = loom_cuda_gemv_max_tokens(c, dt, cols);
    if (T > maxt || ((uintptr_t)d_w & 15) || ((uintptr_t)in->d_x & 15) ||
        (int)in->mode < 0 || (int)in->mode > LOOM_CUDA_GEMV_GELU)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda gemv: %d tokens of %d columns, type %d, "
                        "mode %d (expected f16/bf16, columns a multiple of 8, at most %d tokens "
                        "here, 16-byte aligned data)", T, cols, (int)dt, (int)in->mode, maxt);
    int R = 1, mma = T >= c->gemv_mma, split = !mma && T <= 2 && c->gemv_ks > 0;
    /* 8 vectors a batch (96 registers, 2 blocks an SM) pay only when a row
     * fills its batches: a 1024-column row (128 vectors) leaves half of
     * each 256-vector batch empty and halves the bytes in flight (H200,
     * Qwen3-0.6B's head: 85 us against 73 with 4). */
    int U = c->gemv_u ? c->gemv_u : cols >= 4096 ? 8 : 4, ks = split ? c->gemv_ks : 1;
    while (ks > 1 && cols / 8 / ks < 32 * U) ks /= 2;  /* a slice holds a batch at least */
    /* The split kernel's warps a block: 16 with 8 vectors a batch (H200,
     * Llama-3-8B batch 1: 237 against 233 tok/s with 8; Qwen3-0.6B, whose
     * matrices take 4 vectors, 1,325 against 1,330 with 16 everywhere) */
    int W = !split ? GV_WARPS : c->gemv_w ? c->gemv_w : U == 8 ? 16 : 8;
    int f16 = dt == LOOM_CUDA_F16;
    gv_fn gs = W == 16 ? (f16 ? gs_pick<1, 16>(T, U) : gs_pick<0, 16>(T, U))
                       : (f16 ? gs_pick<1, 8>(T, U) : gs_pick<0, 8>(T, U));
    gv_fn k = mma     ? (f16 ? gm_pick<1>(T) : gm_pick<0>(T))
              : split ? gs
                      : (f16 ? gv_pick<1>(T, &R) : gv_pick<0>(T, &R));
    size_t smem = mma ? (size_t)T * (cols / 8 + GM_PAD) * 16 : (size_t)T * cols * 2;
    size_t part = split && ks > 1 ? (size_t)GS_RPB * ks * T * 4 : 0;  /* the most it needs */
    if (smem + part + 8192 > 48 * 1024)  /* the default limit counts the static arrays too */
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)(smem + part)));
    int bps = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k, W * 32, smem));
    long ng = (rows + R - 1) / R, maxw = (long)c->n_sm * LOOM_MAX_I(bps, 1) * GV_WARPS;
    long per = (ng + maxw - 1) / maxw;
    unsigned blocks = (unsigned)((ng + per * GV_WARPS - 1) / (per * GV_WARPS));
    if (mma)  /* 16-row tiles, one wave of blocks */
        blocks = (unsigned)LOOM_MIN_U((unsigned)((rows + 15) / 16),
                                      (unsigned)(c->n_sm * LOOM_MAX_I(bps, 1)));
    if (split) {
        /* One wave (or the blocks an SM asked for), no more blocks than
         * give each warp a slice and, with slices, none owning more than
         * GS_RPB rows (a second wave for those few blocks would double the
         * time). The room for the slice sums depends on the rows a block
         * owns, and the blocks that fit on that room: settle both. */
        size_t sm = smem;
        for (int it = 0; it < 3; it++) {
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k, W * 32, sm));
            int use = LOOM_MAX_I(c->gemv_bps > 0 && c->gemv_bps < bps ? c->gemv_bps : bps, 1);
            long b = (long)c->n_sm * use, most = ((long)rows * ks + W - 1) / W;
            long least = ks > 1 ? (rows + GS_RPB - 1) / GS_RPB : 1;
            b = b < most ? b : most;
            blocks = (unsigned)(b > least ? b : least);
            long rpb = (rows + (long)blocks - 1) / blocks;
            size_t need = smem + (ks > 1 ? (size_t)rpb * ks * T * 4 : 0);
            if (need == sm) break;
            sm = need;
        }
        smem = sm;
    }
    gv_args a;
    a.y = d_y;
    a.x = in->d_x;
    a.norm = in->d_norm;
    a.bias = d_bias;
    a.w = (const uint4 *)d_w;
    a.rows = rows;
    a.cols = cols;
    a.mode = (int)in->mode;
    a.acc = accumulate;
    a.per_warp = (int)per;
    a.ks = ks;
    a.eps = in->eps;
    /* Matrices up to c->gemv_pf bytes are pulled into L2 before the wait
     * for the kernel ahead. Larger ones lose: Llama-3-8B's o projection
     * (32 MiB, loaded while the attention runs) at 40 MiB cost 1% of a
     * batch-1 step, its qkv too (48 MiB) at 64 MiB 4% (H200). */
    a.pf = !mma && c->pdl && (size_t)rows * cols * 2 <= c->gemv_pf
               ? (unsigned)(per * R * cols * 2) : 0;
    a.pre2 = c->gemv_pre2;
    a.np = c->gemv_np;
    a.amo = NULL;
    a.amv = NULL;
    a.ami = NULL;
    a.amc = NULL;
    /* the argmax inside the split kernel (a warp owns whole rows): one
     * kernel less; else loom_cuda_argmax after it */
    int am_in = d_argmax && split && ks == 1 && T <= LOOM_CUDA_COUNTERS / 2;
    if (am_in) {
        void *scr;
        loom_status st = loom_cuda_scratch(c, (size_t)T * blocks * 8, &scr);
        if (st != LOOM_OK) return st;
        a.amo = d_argmax;
        a.amv = (float *)scr;
        a.ami = (int *)(a.amv + (size_t)T * blocks);
        a.amc = c->counters + LOOM_CUDA_COUNTERS / 2;
    }
    CUDA_CHECK(loom_cuda_launch(c, k, dim3(blocks), dim3(W * 32), smem, a));
    if (d_argmax && !am_in) return loom_cuda_argmax(c, d_argmax, d_y, T, rows);
    return LOOM_OK;
}

/* ---- MLX affine-quantized GEMV ----------------------------------------- */

#define Q_TOK 4    /* tokens one warp carries at once */
#define Q_WARPS 8  /* rows per block */

__device__ __forceinline__ float q_half(unsigned short h, int f16) {
    return f16 ? __half2float(__ushort_as_half(h)) : __uint_as_float((unsigned)h << 16);
}

/* One warp per output row, up to Q_TOK tokens. Fast layout (32 % bits ==
 * 0): lane takes whole words; a word's per = 32 / bits fields lie in one
 * group since the group is a multiple of per. Otherwise fields are read
 * from the little-endian bit stream one at a time. */
__global__ void matmul_q_kernel(float *y, const float *x, const uint32_t *w,
                                const unsigned short *scales, const unsigned short *biases,
                                int rows, int cols, int bits, int group, int f16, int T) {
    int row = blockIdx.x * Q_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int t0 = blockIdx.y * Q_TOK, nt = min(Q_TOK, T - t0);
    if (row >= rows) return;
    size_t words = (size_t)cols * bits / 32;
    int ng = cols / group;
    const uint32_t *wr = w + (size_t)row * words;
    const unsigned short *sr = scales + (size_t)row * ng, *br = biases + (size_t)row * ng;
    const float *xt = x + (size_t)t0 * cols;
    float acc[Q_TOK];
#pragma unroll
    for (int j = 0; j < Q_TOK; j++) acc[j] = 0;
    unsigned mask = (1u << bits) - 1;
    if (32 % bits == 0) {
        int per = 32 / bits;
        for (size_t wi = lane; wi < words; wi += 32) {
            uint32_t word = wr[wi];
            int k0 = (int)wi * per, g = k0 / group;
            float sc = q_half(sr[g], f16), bi = q_half(br[g], f16);
            for (int e = 0; e < per; e++) {
                float v = sc * (float)((word >> (e * bits)) & mask) + bi;
#pragma unroll
                for (int j = 0; j < Q_TOK; j++)
                    if (j < nt) acc[j] += v * xt[(size_t)j * cols + k0 + e];
            }
        }
    } else {
        for (int k = lane; k < cols; k += 32) {
            size_t bit = (size_t)k * bits;
            size_t wi = bit / 32;
            unsigned sh = (unsigned)(bit % 32);
            unsigned long long v64 = wr[wi] >> sh;
            if (sh + (unsigned)bits > 32) v64 |= (unsigned long long)wr[wi + 1] << (32 - sh);
            int g = k / group;
            float v = q_half(sr[g], f16) * (float)((unsigned)v64 & mask) + q_half(br[g], f16);
#pragma unroll
            for (int j = 0; j < Q_TOK; j++)
                if (j < nt) acc[j] += v * xt[(size_t)j * cols + k];
        }
    }
#pragma unroll
    for (int j = 0; j < Q_TOK; j++) {
        float s = acc[j];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0 && j < nt) y[(size_t)(t0 + j) * rows + row] = s;
    }
}

extern "C" loom_status loom_cuda_matmul_q(loom_cuda *c, float *d_y, const float *d_x,
                                          const loom_cuda_qmat *w, int T) {
    if (T <= 0 || w->rows <= 0) return LOOM_OK;
    int b = w->bits;
    if (!(b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8) || w->group <= 0 ||
        w->cols % w->group || (size_t)w->cols * b % 32 || (32 % b == 0 && w->group % (32 / b)))
        return loom_err(LOOM_ERR_UNSUPPORTED,
                        "cuda matmul_q: bits %d, group %d, %d columns (expected bits 2-6 or 8, "
                        "columns a multiple of the group and of 32 / bits words)",
                        b, w->group, w->cols);
    if ((T + Q_TOK - 1) / Q_TOK > 65535)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda matmul_q: %d tokens is too many", T);
    dim3 grid(loom_cuda_blocks((size_t)w->rows, Q_WARPS), (unsigned)((T + Q_TOK - 1) / Q_TOK));
    matmul_q_kernel<<<grid, Q_WARPS * 32, 0, c->stream>>>(
        d_y, d_x, w->d_w, (const unsigned short *)w->d_scales, (const unsigned short *)w->d_biases,
        w->rows, w->cols, b, w->group, w->f16, T);
    LAUNCH_CHECK();
    return LOOM_OK;
}
