/* kernels_gemm: y = x W^T. Dense weights go through cuBLAS (f32
 * accumulation); MLX affine-quantized weights through a dequantizing GEMV.
 * References: matmul_f32/f16/bf16 and matmul_q in src/ops/ops_ref.c. */
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

extern "C" loom_status loom_cuda_gemm(loom_cuda *c, float *d_y, const float *d_x,
                                      const void *d_w, loom_cuda_dtype dt, int T, int rows,
                                      int cols) {
    if (T <= 0 || rows <= 0) return LOOM_OK;
    if (cols <= 0) return loom_err(LOOM_ERR_INVALID_ARG, "cuda gemm: %d columns", cols);
    const float one = 1.0f, zero = 0.0f;
    const void *x = d_x;
    cudaDataType_t ty = CUDA_R_32F;
    if (dt != LOOM_CUDA_F32) {
        size_t n = (size_t)T * cols;
        void *tmp;
        loom_status st = loom_cuda_scratch(c, n * 2, &tmp);
        if (st != LOOM_OK) return st;
        if (dt == LOOM_CUDA_F16) {
            f32_to_f16_kernel<<<loom_cuda_blocks(n, 256), 256, 0, c->stream>>>((__half *)tmp, d_x, n);
            ty = CUDA_R_16F;
        } else {
            f32_to_bf16_kernel<<<loom_cuda_blocks(n, 256), 256, 0, c->stream>>>(
                (__nv_bfloat16 *)tmp, d_x, n);
            ty = CUDA_R_16BF;
        }
        LAUNCH_CHECK();
        x = tmp;
    }
    /* Column-major view: y^T (rows, T) = W (cols, rows)^T * x^T (cols, T). */
    CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, cols, &one, d_w, ty,
                              cols, x, ty, cols, &zero, d_y, CUDA_R_32F, rows,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return LOOM_OK;
}

/* The same with x already in the weight's 16-bit type (made so by the
 * kernel before: add_rmsnorm16, act_mul_split16): no conversion pass. */
extern "C" loom_status loom_cuda_gemm16(loom_cuda *c, float *d_y, const void *d_x16,
                                        const void *d_w, loom_cuda_dtype dt, int T, int rows,
                                        int cols) {
    if (T <= 0 || rows <= 0) return LOOM_OK;
    if (cols <= 0 || (dt != LOOM_CUDA_F16 && dt != LOOM_CUDA_BF16))
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda gemm16: %d columns, type %d (expected f16 "
                        "or bf16)", cols, (int)dt);
    const float one = 1.0f, zero = 0.0f;
    cudaDataType_t ty = dt == LOOM_CUDA_F16 ? CUDA_R_16F : CUDA_R_16BF;
    CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, T, cols, &one, d_w, ty,
                              cols, d_x16, ty, cols, &zero, d_y, CUDA_R_32F, rows,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
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
