/* kernels_fp8: y = x W^T for FP8 (e4m3) weights with block scales, the
 * layout of ops.h's loom_f8mat. Reference: matmul_f8 in src/ops/ops_ref.c.
 *
 * - Decode (a few tokens): loom_cuda_f8_gemv, one warp per output row;
 *   each lane loads 16 codes (16 bytes) at a time, widens them in
 *   registers (the hardware e4m3 -> f16 conversion, exact), sums them
 *   against x in f32 and scales the partial sum by its block's scale (the
 *   16 codes lie in one block). Bound by the weight bytes: one byte a
 *   weight, half of bf16's.
 * - Prefill: loom_cuda_f8_gemm dequantizes the weight, a slice of rows at a
 *   time, to bf16 (code * scale rounded once) in scratch and runs cuBLAS's
 *   bf16 tensor-core GEMM over it with x rounded to bf16, f32 accumulation:
 *   the bf16 GEMM's precision (each product within about 2^-8 relative,
 *   as loom_cuda_gemm on bf16 weights), not the f32 one's. With f32 the
 *   slices are f32 (the reference's weights exactly) and the GEMM SGEMM:
 *   the CPU's result, at a fraction of the speed. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/cuda_int.cuh"

#define F8_WARPS 8   /* rows a block */
#define F8_TOK 8     /* tokens a block */

__device__ __forceinline__ float f8_dec(unsigned char b) {
    __nv_fp8_e4m3 v;
    v.__x = b;
    return float(v);
}

/* Two codes (low byte first) as floats. */
__device__ __forceinline__ float2 f8_dec2(unsigned short p) {
    __half2 h(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)p, __NV_E4M3));
    return __half22float2(h);
}

/* VEC: columns a multiple of 16 and blocks too (or one block a row), so a
 * lane's 16 codes are one aligned vector in one block. */
template <bool VEC>
__global__ void f8_gemv_kernel(float *y, const float *x, const unsigned char *w,
                               const float *scales, int rows, int cols, int br, int bc, int T) {
    int row = blockIdx.x * F8_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    int t0 = blockIdx.y * F8_TOK, nt = min(F8_TOK, T - t0);
    if (row >= rows) return;
    int sc = (cols + bc - 1) / bc;
    const unsigned char *wr = w + (size_t)row * cols;
    const float *sr = scales + (size_t)(row / br) * sc;
    const float *xt = x + (size_t)t0 * cols;
    float acc[F8_TOK];
#pragma unroll
    for (int j = 0; j < F8_TOK; j++) acc[j] = 0;
    if (VEC) {
        for (int k0 = lane * 16; k0 < cols; k0 += 32 * 16) {
            uint4 q = __ldg(reinterpret_cast<const uint4 *>(wr + k0));
            unsigned u[4] = {q.x, q.y, q.z, q.w};
            float wv[16];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float2 a = f8_dec2((unsigned short)(u[i] & 0xffffu));
                float2 b = f8_dec2((unsigned short)(u[i] >> 16));
                wv[4 * i] = a.x, wv[4 * i + 1] = a.y, wv[4 * i + 2] = b.x, wv[4 * i + 3] = b.y;
            }
            float s = sr[k0 / bc];
#pragma unroll
            for (int j = 0; j < F8_TOK; j++) {
                if (j >= nt) break;
                const float4 *xp = reinterpret_cast<const float4 *>(xt + (size_t)j * cols + k0);
                float p = 0;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float4 xv = __ldg(xp + i);
                    p += wv[4 * i] * xv.x + wv[4 * i + 1] * xv.y + wv[4 * i + 2] * xv.z +
                         wv[4 * i + 3] * xv.w;
                }
                acc[j] += s * p;
            }
        }
    } else {
        for (int k = lane; k < cols; k += 32) {
            float v = f8_dec(wr[k]) * sr[k / bc];
#pragma unroll
            for (int j = 0; j < F8_TOK; j++)
                if (j < nt) acc[j] += v * xt[(size_t)j * cols + k];
        }
    }
#pragma unroll
    for (int j = 0; j < F8_TOK; j++) {
        float s = acc[j];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0 && j < nt) y[(size_t)(t0 + j) * rows + row] = s;
    }
}

static loom_status f8_check(const loom_cuda_f8mat *w, const char *what) {
    if (w->cols <= 0 || w->br <= 0 || w->bc <= 0 || !w->d_w || !w->d_scales)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda %s: %d columns, blocks %d x %d (expected "
                        "positive sizes and device pointers)", what, w->cols, w->br, w->bc);
    return LOOM_OK;
}

static int f8_vec(const loom_cuda_f8mat *w, const float *d_x) {
    return w->cols % 16 == 0 && (w->bc % 16 == 0 || w->bc >= w->cols) &&
           (uintptr_t)w->d_w % 16 == 0 && (uintptr_t)d_x % 16 == 0;
}

extern "C" loom_status loom_cuda_f8_gemv(loom_cuda *c, float *d_y, const float *d_x,
                                         const loom_cuda_f8mat *w, int T) {
    if (T <= 0 || w->rows <= 0) return LOOM_OK;
    loom_status st = f8_check(w, "f8_gemv");
    if (st != LOOM_OK) return st;
    if ((T + F8_TOK - 1) / F8_TOK > 65535)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda f8_gemv: %d tokens is too many", T);
    dim3 grid(loom_cuda_blocks((size_t)w->rows, F8_WARPS), (unsigned)((T + F8_TOK - 1) / F8_TOK));
    if (f8_vec(w, d_x))
        f8_gemv_kernel<true><<<grid, F8_WARPS * 32, 0, c->stream>>>(
            d_y, d_x, w->d_w, w->d_scales, w->rows, w->cols, w->br, w->bc, T);
    else
        f8_gemv_kernel<false><<<grid, F8_WARPS * 32, 0, c->stream>>>(
            d_y, d_x, w->d_w, w->d_scales, w->rows, w->cols, w->br, w->bc, T);
    LAUNCH_CHECK();
    return LOOM_OK;
}

__device__ __forceinline__ void f8_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void f8_store(float *p, float v) { *p = v; }

/* out (n_rows, cols) = rows [r0, r0 + n_rows) dequantized (code * scale in
 * f32, then rounded to OUT). */
template <typename OUT>
__global__ void f8_dequant_kernel(OUT *out, const unsigned char *w, const float *scales, int r0,
                                  int n_rows, int cols, int br, int bc) {
    size_t n = (size_t)n_rows * cols, sc = (size_t)(cols + bc - 1) / bc;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = (size_t)r0 + i / cols, k = i % cols;
        float s = scales[(r / br) * sc + k / bc];
        f8_store(out + i, f8_dec(w[r * cols + k]) * s);
    }
}

__global__ void f8_x_bf16_kernel(__nv_bfloat16 *y, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

/* Weight bytes dequantized per GEMM call: big enough for the tensor cores
 * to run at full rate, small enough that scratch stays modest. */
#define F8_SLICE_BYTES ((size_t)64 << 20)

extern "C" loom_status loom_cuda_f8_gemm(loom_cuda *c, float *d_y, const float *d_x,
                                         const loom_cuda_f8mat *w, int T, int f32) {
    if (T <= 0 || w->rows <= 0) return LOOM_OK;
    loom_status st = f8_check(w, "f8_gemm");
    if (st != LOOM_OK) return st;
    size_t es = f32 ? 4 : 2, cols = (size_t)w->cols;
    size_t xb = f32 ? 0 : ((size_t)T * cols * 2 + 255) & ~(size_t)255;
    int slice = (int)LOOM_MIN_U((unsigned)w->rows,
                                (unsigned)LOOM_MAX_I(8, (int)(F8_SLICE_BYTES / (cols * es)) & ~7));
    void *scr;
    if ((st = loom_cuda_scratch(c, xb + (size_t)slice * cols * es, &scr)) != LOOM_OK) return st;
    const void *x = d_x;
    void *ws = (char *)scr + xb;
    if (!f32) {
        size_t nx = (size_t)T * cols;
        f8_x_bf16_kernel<<<loom_cuda_blocks(nx, 256), 256, 0, c->stream>>>(
            (__nv_bfloat16 *)scr, d_x, nx);
        LAUNCH_CHECK();
        x = scr;
    }
    cudaDataType_t ty = f32 ? CUDA_R_32F : CUDA_R_16BF;
    const float one = 1.0f, zero = 0.0f;
    for (int r0 = 0; r0 < w->rows; r0 += slice) {
        int n = (int)LOOM_MIN_U((unsigned)slice, (unsigned)(w->rows - r0));
        size_t ne = (size_t)n * cols;
        unsigned blocks = LOOM_MIN_U(loom_cuda_blocks(ne, 256), (unsigned)c->n_sm * 16);
        if (f32)
            f8_dequant_kernel<float><<<blocks, 256, 0, c->stream>>>(
                (float *)ws, w->d_w, w->d_scales, r0, n, w->cols, w->br, w->bc);
        else
            f8_dequant_kernel<__nv_bfloat16><<<blocks, 256, 0, c->stream>>>(
                (__nv_bfloat16 *)ws, w->d_w, w->d_scales, r0, n, w->cols, w->br, w->bc);
        LAUNCH_CHECK();
        /* Column-major view, as gemm_into: y^T rows [r0, r0 + n) of (rows, T). */
        CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, T, w->cols, &one, ws, ty,
                                  w->cols, x, ty, w->cols, &zero, d_y + r0, CUDA_R_32F, w->rows,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_matmul_f8(loom_cuda *c, float *d_y, const float *d_x,
                                           const loom_cuda_f8mat *w, int T, int f32) {
    if (T <= LOOM_CUDA_F8_GEMV_T) return loom_cuda_f8_gemv(c, d_y, d_x, w, T);
    return loom_cuda_f8_gemm(c, d_y, d_x, w, T, f32);
}
