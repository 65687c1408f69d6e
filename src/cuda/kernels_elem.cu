/* kernels_elem: row and element-wise kernels (RMSNorm, rope, gated
 * activations, embedding gather, softmax, argmax). References:
 * src/ops/ops_ref.c and src/model/forward.c. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_int.cuh"

#define ROW_THREADS 256

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum (or max) over the block of ROW_THREADS; every thread gets it. */
__device__ float block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  /* sh may still be read from a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0f;
    return warp_sum(v);
}

__device__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sh[lane] : -INFINITY;
    return warp_max(v);
}

__device__ __forceinline__ float load_elem(const void *p, size_t i, int dt) {
    if (dt == LOOM_CUDA_F32) return ((const float *)p)[i];
    if (dt == LOOM_CUDA_F16) return __half2float(((const __half *)p)[i]);
    return __uint_as_float((unsigned)((const unsigned short *)p)[i] << 16);
}

/* ---- RMSNorm ------------------------------------------------------------ */

__global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int n, float eps,
                               int one_plus) {
    __shared__ float sh[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, sh);
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float s = w ? (one_plus ? 1.0f + w[i] : w[i]) : 1.0f;
        yr[i] = xr[i] * inv * s;
    }
}

extern "C" loom_status loom_cuda_rmsnorm(loom_cuda *c, float *d_y, const float *d_x,
                                         const float *d_w, int T, int n, float eps,
                                         int one_plus) {
    if (T <= 0 || n <= 0) return LOOM_OK;
    /* Narrow rows (per-head norms) waste most of a 256-thread block; 64 is
     * enough for head_dim 64..256. */
    unsigned th = n <= 256 ? 64 : ROW_THREADS;
    rmsnorm_kernel<<<T, th, 0, c->stream>>>(d_y, d_x, d_w, n, eps, one_plus);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* x += rmsnorm(y) * w, one block a row: a sandwich norm after a block's
 * output projection and the residual add in one pass. */
__global__ void rmsnorm_add_kernel(float *x, const float *y, const float *w, int n, float eps) {
    __shared__ float sh[32];
    const float *yr = y + (size_t)blockIdx.x * n;
    float *xr = x + (size_t)blockIdx.x * n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += yr[i] * yr[i];
    ss = block_sum(ss, sh);
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] += yr[i] * inv * (w ? w[i] : 1.0f);
}

extern "C" loom_status loom_cuda_rmsnorm_add(loom_cuda *c, float *d_x, const float *d_y,
                                             const float *d_w, int T, int n, float eps) {
    if (T <= 0 || n <= 0) return LOOM_OK;
    if (d_x == d_y)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda rmsnorm_add: x and y are the same buffer "
                        "(expected the residual and a separate block output)");
    rmsnorm_add_kernel<<<T, n <= 256 ? 64 : ROW_THREADS, 0, c->stream>>>(d_x, d_y, d_w, n, eps);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- rope --------------------------------------------------------------- */

__global__ void rope_kernel(float *x, int T, int n_heads, int head_dim, int half,
                            const float *cs, const float *sn, int ld) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)T * n_heads * half;
    if (i >= total) return;
    int k = (int)(i % half);
    size_t th = i / half;  /* t * n_heads + h */
    int t = (int)(th / n_heads);
    float *v = x + th * head_dim;
    float c = cs[(size_t)t * ld + k], s = sn[(size_t)t * ld + k];
    float a = v[k], b = v[k + half];
    v[k] = a * c - b * s;
    v[k + half] = b * c + a * s;
}

extern "C" loom_status loom_cuda_rope(loom_cuda *c, float *d_x, int T, int n_heads,
                                      int head_dim, int rot_dim, const float *d_cos,
                                      const float *d_sin, int ld) {
    if (rot_dim > head_dim || rot_dim % 2 || rot_dim / 2 > ld)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda rope: rot_dim %d, head_dim %d, table width %d",
                        rot_dim, head_dim, ld);
    size_t total = (size_t)T * n_heads * (rot_dim / 2);
    if (total == 0) return LOOM_OK;
    rope_kernel<<<loom_cuda_blocks(total, 256), 256, 0, c->stream>>>(
        d_x, T, n_heads, head_dim, rot_dim / 2, d_cos, d_sin, ld);
    LAUNCH_CHECK();
    return LOOM_OK;
}

extern "C" void loom_cuda_rope_table(float *cos_out, float *sin_out, int ld, const int *pos,
                                     int T, const double *inv_freq, int rot_dim, double scale) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < rot_dim / 2; i++) {
            /* Angles in double: positions reach 1e5+ and f32 loses the phase. */
            double a = (double)pos[t] * inv_freq[i];
            cos_out[(size_t)t * ld + i] = (float)(cos(a) * scale);
            sin_out[(size_t)t * ld + i] = (float)(sin(a) * scale);
        }
}

/* The residual add and the next RMSNorm in one pass, the normed row
 * written in the GEMM's 16-bit input type: x += r (when r), then y16 =
 * round(x / sqrt(mean(x^2) + eps) * w). Same arithmetic and order as
 * fw_add + rmsnorm_kernel + the GEMM's input conversion. */
__global__ void add_rmsnorm16_kernel(void *y16, float *x, const float *r, const float *w, int n,
                                     float eps, int f16) {
    __shared__ float sh[32];
    float *xr = x + (size_t)blockIdx.x * n;
    const float *rr = r ? r + (size_t)blockIdx.x * n : NULL;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (rr) xr[i] = v = v + rr[i];
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
    size_t o = (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i] * inv * (w ? w[i] : 1.0f);
        if (f16) ((__half *)y16)[o + i] = __float2half_rn(v);
        else ((__nv_bfloat16 *)y16)[o + i] = __float2bfloat16_rn(v);
    }
}

/* The same with the row in registers, V float4 a thread, all loads issued
 * before the first use (the loop above waits on one load at a time where
 * x and r may alias: a few rows, as at decode, took 13 us on a 4096 row). */
template <int V>
__global__ void add_rmsnorm16_vec_kernel(void *y16, float *x, const float *r, const float *w,
                                         int n, float eps, int f16) {
    __shared__ float sh[32];
    int n4 = n >> 2;
    float4 *xr = (float4 *)(x + (size_t)blockIdx.x * n);
    const float4 *rr = r ? (const float4 *)(r + (size_t)blockIdx.x * n) : NULL;
    float4 v[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        int i = threadIdx.x + k * blockDim.x;
        v[k] = i < n4 ? xr[i] : make_float4(0, 0, 0, 0);
    }
    if (rr) {
        float4 b[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            int i = threadIdx.x + k * blockDim.x;
            b[k] = i < n4 ? rr[i] : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < V; k++) {
            int i = threadIdx.x + k * blockDim.x;
            v[k].x += b[k].x, v[k].y += b[k].y, v[k].z += b[k].z, v[k].w += b[k].w;
            if (i < n4) xr[i] = v[k];
        }
    }
    float ss = 0;
#pragma unroll
    for (int k = 0; k < V; k++) ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    ss = block_sum(ss, sh);
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
    for (int k = 0; k < V; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i >= n4) continue;
        float4 g = w ? ((const float4 *)w)[i] : make_float4(1, 1, 1, 1);
        float a = v[k].x * inv * g.x, b = v[k].y * inv * g.y, c = v[k].z * inv * g.z,
              d = v[k].w * inv * g.w;
        uint2 o;
        if (f16) {
            __half2 h0 = __floats2half2_rn(a, b), h1 = __floats2half2_rn(c, d);
            o = make_uint2(*(unsigned *)&h0, *(unsigned *)&h1);
        } else {
            __nv_bfloat162 h0 = __floats2bfloat162_rn(a, b), h1 = __floats2bfloat162_rn(c, d);
            o = make_uint2(*(unsigned *)&h0, *(unsigned *)&h1);
        }
        ((uint2 *)y16)[(size_t)blockIdx.x * n4 + i] = o;
    }
}

extern "C" loom_status loom_cuda_add_rmsnorm16(loom_cuda *c, void *d_y16, float *d_x,
                                               const float *d_r, const float *d_w, int T, int n,
                                               float eps, loom_cuda_dtype dt) {
    if (T <= 0 || n <= 0) return LOOM_OK;
    if (dt != LOOM_CUDA_F16 && dt != LOOM_CUDA_BF16)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda add_rmsnorm16: output type %d (expected "
                        "f16 or bf16)", (int)dt);
    int th = n <= 256 ? 64 : ROW_THREADS, f16 = dt == LOOM_CUDA_F16;
    int per = (n / 4 + th - 1) / th;  /* float4 a thread */
    if (n % 4 == 0 && per <= 8) {
#define ARN(V) add_rmsnorm16_vec_kernel<V><<<T, th, 0, c->stream>>>(d_y16, d_x, d_r, d_w, n, eps, f16)
        if (per <= 1) ARN(1);
        else if (per <= 2) ARN(2);
        else if (per <= 4) ARN(4);
        else ARN(8);
#undef ARN
    } else {
        add_rmsnorm16_kernel<<<T, th, 0, c->stream>>>(d_y16, d_x, d_r, d_w, n, eps, f16);
    }
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* The same table on the device from positions there (decode steps replay
 * a captured graph; only the positions change). Double angles, as above.
 * M-RoPE: pair i turns by position stream stream[i] (pos[stream * pos_ld + t]). */
__global__ void rope_table_kernel(float *cs, float *sn, int ld, const int32_t *pos, int pos_ld,
                                  const unsigned char *stream, const double *inv_freq, int half,
                                  double scale) {
    int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < half; i += gridDim.x * blockDim.x) {
        int k = stream ? stream[i] : 0;
        double a = (double)pos[(size_t)k * pos_ld + t] * inv_freq[i];
        cs[(size_t)t * ld + i] = (float)(cos(a) * scale);
        sn[(size_t)t * ld + i] = (float)(sin(a) * scale);
    }
}

extern "C" loom_status loom_cuda_rope_table_dev(loom_cuda *c, float *d_cos, float *d_sin, int ld,
                                                const int32_t *d_pos, int T,
                                                const double *d_inv_freq, int rot_dim,
                                                double scale, const unsigned char *d_stream,
                                                int pos_ld) {
    int half = rot_dim / 2;
    if (T <= 0 || half <= 0) return LOOM_OK;
    if (T > 65535 || ld < half || (d_stream && pos_ld < T))
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda rope_table: %d tokens (at most 65535), ld %d "
                        "(at least %d), position stride %d (at least the tokens)", T, ld, half,
                        pos_ld);
    dim3 grid(loom_cuda_blocks((size_t)half, 128), (unsigned)T);
    rope_table_kernel<<<grid, 128, 0, c->stream>>>(d_cos, d_sin, ld, d_pos, d_stream ? pos_ld : 0,
                                                   d_stream, d_inv_freq, half, scale);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- after a fused q/k/v GEMM ------------------------------------------- */

/* The q/k/v GEMM's output as f32 or (gemm16_bf16out) bf16. */
__device__ __forceinline__ float qkv_in(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float qkv_in(const __nv_bfloat16 *p, size_t i) {
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ float4 qkv_in4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 qkv_in4(const __nv_bfloat16 *p) {
    uint2 u = *(const uint2 *)p;
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

/* One block per (token, head) of qkv (T, (nh + 2 * nkv) * hd): q heads,
 * then k heads, then v heads. Adds the bias, applies the per-head RMSNorm
 * of q and k (weights qn, kn; NULL = none), rotates q and k by the token's
 * rope row, then writes q to q_out (T, nh, hd) and k, v to row slot[t] of
 * the pool (kv_dt). Same arithmetic as fw_add_bias, rmsnorm_kernel,
 * rope_kernel and fw_kv_store one after the other. */
template <typename TI>
__global__ void qkv_post_kernel(float *q_out, void *pk, void *pv, int kv_dt, size_t stride,
                                const TI *qkv, const float *bias, const float *qn,
                                const float *kn, float eps, const int32_t *slot, int nh, int nkv,
                                int hd, int half, const float *cs, const float *sn, int ld) {
    __shared__ float sh[32];
    extern __shared__ float row[];   /* (hd) */
    pdl_trigger();
    int t = blockIdx.x, h = blockIdx.y, nall = nh + 2 * nkv;
    int kind = h < nh ? 0 : h < nh + nkv ? 1 : 2;   /* q, k, v */
    size_t off = (size_t)h * hd;
    const TI *src = qkv + (size_t)t * nall * hd + off;
    const float *nw = kind == 0 ? qn : kind == 1 ? kn : NULL;
    size_t e0 = kind ? (size_t)(h - (kind == 1 ? nh : nh + nkv)) * hd : 0;
    if (hd <= (int)blockDim.x) {
        /* One element a thread (the usual head sizes): its bias, norm
         * weight and rope entries load together with it, not each after
         * the step before (decode at batch 1 waits on such chains). */
        int i = threadIdx.x, k = i < half ? i : i - half, rot = kind < 2 && i < 2 * half;
        float wn = nw && i < hd ? nw[i] : 1.0f, bi = bias && i < hd ? bias[off + i] : 0.0f;
        pdl_wait();
        float v = 0, c = 1, sv = 0;
        if (i < hd) {
            v = qkv_in(src, (size_t)i);
            if (bias) v += bi;
        }
        if (rot) c = cs[(size_t)t * ld + k], sv = sn[(size_t)t * ld + k];
        if (nw) {  /* uniform per block */
            float ss = block_sum(v * v, sh);
            float inv = 1.0f / sqrtf(ss / (float)hd + eps);
            v = v * inv * wn;
        }
        if (kind < 2) {
            if (i < hd) row[i] = v;
            __syncthreads();
            if (rot) v = i < half ? v * c - row[i + half] * sv : v * c + row[k] * sv;
        }
        if (i >= hd) return;
        if (kind == 0) {
            q_out[((size_t)t * nh + h) * hd + i] = v;
            return;
        }
        size_t e = (size_t)slot[t] * stride + e0 + i;
        void *dst = kind == 1 ? pk : pv;
        if (kv_dt == LOOM_CUDA_F32) ((float *)dst)[e] = v;
        else if (kv_dt == LOOM_CUDA_F16) ((__half *)dst)[e] = __float2half_rn(v);
        else ((__nv_bfloat16 *)dst)[e] = __float2bfloat16_rn(v);
        return;
    }
    pdl_wait();
    float ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float v = qkv_in(src, (size_t)i);
        if (bias) v += bias[off + i];
        row[i] = v;
        ss += v * v;
    }
    if (nw) {  /* uniform per block: every thread takes the same branch */
        ss = block_sum(ss, sh);
        float inv = 1.0f / sqrtf(ss / (float)hd + eps);
        for (int i = threadIdx.x; i < hd; i += blockDim.x) row[i] = row[i] * inv * nw[i];
    }
    __syncthreads();
    if (kind < 2) {
        for (int k = threadIdx.x; k < half; k += blockDim.x) {
            float c = cs[(size_t)t * ld + k], s = sn[(size_t)t * ld + k];
            float a = row[k], b = row[k + half];
            row[k] = a * c - b * s;
            row[k + half] = b * c + a * s;
        }
        __syncthreads();
    }
    if (kind == 0) {
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            q_out[((size_t)t * nh + h) * hd + i] = row[i];
        return;
    }
    size_t e = (size_t)slot[t] * stride + e0;
    void *dst = kind == 1 ? pk : pv;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        if (kv_dt == LOOM_CUDA_F32) ((float *)dst)[e + i] = row[i];
        else if (kv_dt == LOOM_CUDA_F16) ((__half *)dst)[e + i] = __float2half_rn(row[i]);
        else ((__nv_bfloat16 *)dst)[e + i] = __float2bfloat16_rn(row[i]);
    }
}

/* The same for head_dim 128 rotated whole (or not at all), a warp a head,
 * 4 elements a lane, 4 heads a block: no shared memory or block barriers
 * (the block-per-head kernel spent most of a 4096-token prefill on them:
 * 238 us a Llama-3-8B layer for 180 MB). Element i's rope partner i +- 64
 * sits 16 lanes away. */
template <typename TI>
__global__ void qkv_post_warp_kernel(float *q_out, void *pk, void *pv, int kv_dt, size_t stride,
                                     const TI *qkv, const float *bias, const float *qn,
                                     const float *kn, float eps, const int32_t *slot, int nh,
                                     int nkv, int rot, const float *cs, const float *sn, int ld) {
    pdl_trigger();
    int t = blockIdx.x, lane = threadIdx.x & 31, nall = nh + 2 * nkv;
    int h = blockIdx.y * 4 + (threadIdx.x >> 5);
    int kind = h < nh ? 0 : h < nh + nkv ? 1 : 2;   /* q, k, v */
    int i0 = lane * 4;
    const float *nw = kind == 0 ? qn : kind == 1 ? kn : NULL;
    float4 wn = make_float4(1, 1, 1, 1), bi = make_float4(0, 0, 0, 0);
    if (h < nall) {  /* weights: before the wait */
        if (nw) wn = *(const float4 *)(nw + i0);
        if (bias) bi = *(const float4 *)(bias + (size_t)h * 128 + i0);
    }
    pdl_wait();
    if (h >= nall) return;
    float4 v4 = qkv_in4(qkv + ((size_t)t * nall + h) * 128 + i0);
    float v[4] = {v4.x + bi.x, v4.y + bi.y, v4.z + bi.z, v4.w + bi.w};
    if (nw) {  /* uniform per warp */
        float ss = v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
        ss = warp_sum(ss);
        float inv = 1.0f / sqrtf(ss / 128.0f + eps);
        v[0] = v[0] * inv * wn.x, v[1] = v[1] * inv * wn.y;
        v[2] = v[2] * inv * wn.z, v[3] = v[3] * inv * wn.w;
    }
    if (kind < 2 && rot) {
        int k = i0 & 63, lowh = i0 < 64;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float o = __shfl_xor_sync(0xffffffffu, v[e], 16);
            float c = cs[(size_t)t * ld + k + e], sv = sn[(size_t)t * ld + k + e];
            v[e] = lowh ? v[e] * c - o * sv : v[e] * c + o * sv;
        }
    }
    if (kind == 0) {
        *(float4 *)(q_out + ((size_t)t * nh + h) * 128 + i0) = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
    size_t e = (size_t)slot[t] * stride + (size_t)(h - (kind == 1 ? nh : nh + nkv)) * 128 + i0;
    void *dst = kind == 1 ? pk : pv;
    if (kv_dt == LOOM_CUDA_F32) {
        *(float4 *)((float *)dst + e) = make_float4(v[0], v[1], v[2], v[3]);
    } else if (kv_dt == LOOM_CUDA_F16) {
        __half2 a = __floats2half2_rn(v[0], v[1]), b = __floats2half2_rn(v[2], v[3]);
        *(uint2 *)((__half *)dst + e) = make_uint2(*(unsigned *)&a, *(unsigned *)&b);
    } else {
        __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
        *(uint2 *)((__nv_bfloat16 *)dst + e) = make_uint2(*(unsigned *)&a, *(unsigned *)&b);
    }
}

template <typename TI>
static loom_status qkv_post_run(loom_cuda *c, float *d_q, const loom_cuda_kv *kv, const TI *d_qkv,
                                const float *d_bias, const float *d_qnorm, const float *d_knorm,
                                float eps, const int32_t *d_slot, int T, int nh, int nkv, int hd,
                                int rot_dim, const float *d_cos, const float *d_sin, int ld) {
    if (T <= 0) return LOOM_OK;
    if (T > 2147483647 / 2 || nh + 2 * nkv > 65535 || hd <= 0 || rot_dim > hd || rot_dim % 2 ||
        (int)kv->dt < 0 || (int)kv->dt > 2 || kv->row_stride < (size_t)nkv * hd)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda qkv_post: %d heads + 2 x %d, head_dim %d, "
                        "rot_dim %d, KV type %d, row stride %zu", nh, nkv, hd, rot_dim,
                        (int)kv->dt, kv->row_stride);
    if (c->qkv_warp && hd == 128 && (rot_dim == 0 || rot_dim == 128) && kv->row_stride % 4 == 0) {
        dim3 grid((unsigned)T, (unsigned)(nh + 2 * nkv + 3) / 4);
        CUDA_CHECK(loom_cuda_launch(c, qkv_post_warp_kernel<TI>, grid, dim3(128), 0, d_q,
                                    (void *)kv->d_k, (void *)kv->d_v, (int)kv->dt, kv->row_stride,
                                    d_qkv, d_bias, d_qnorm, d_knorm, eps, d_slot, nh, nkv,
                                    rot_dim, d_cos, d_sin, ld));
        return LOOM_OK;
    }
    unsigned th = hd >= 128 ? 128 : hd >= 64 ? 64 : 32;
    dim3 grid((unsigned)T, (unsigned)(nh + 2 * nkv));
    CUDA_CHECK(loom_cuda_launch(c, qkv_post_kernel<TI>, grid, dim3(th),
                                (size_t)hd * sizeof(float), d_q, (void *)kv->d_k,
                                (void *)kv->d_v, (int)kv->dt, kv->row_stride, d_qkv, d_bias,
                                d_qnorm, d_knorm, eps, d_slot, nh, nkv, hd, rot_dim / 2, d_cos,
                                d_sin, ld));
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_qkv_post(loom_cuda *c, float *d_q, const loom_cuda_kv *kv,
                                          const float *d_qkv, const float *d_bias,
                                          const float *d_qnorm, const float *d_knorm, float eps,
                                          const int32_t *d_slot, int T, int nh, int nkv, int hd,
                                          int rot_dim, const float *d_cos, const float *d_sin,
                                          int ld) {
    return qkv_post_run(c, d_q, kv, d_qkv, d_bias, d_qnorm, d_knorm, eps, d_slot, T, nh, nkv, hd,
                        rot_dim, d_cos, d_sin, ld);
}

extern "C" loom_status loom_cuda_qkv_post_bf16(loom_cuda *c, float *d_q, const loom_cuda_kv *kv,
                                               const void *d_qkv16, const float *d_bias,
                                               const float *d_qnorm, const float *d_knorm,
                                               float eps, const int32_t *d_slot, int T, int nh,
                                               int nkv, int hd, int rot_dim, const float *d_cos,
                                               const float *d_sin, int ld) {
    return qkv_post_run(c, d_q, kv, (const __nv_bfloat16 *)d_qkv16, d_bias, d_qnorm, d_knorm, eps,
                        d_slot, T, nh, nkv, hd, rot_dim, d_cos, d_sin, ld);
}

/* ---- gated activations -------------------------------------------------- */

__global__ void silu_mul_kernel(float *g, const float *u, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = g[i];
        g[i] = x / (1.0f + expf(-x)) * u[i];
    }
}

__global__ void gelu_tanh_mul_kernel(float *g, const float *u, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = g[i];
        float in = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        g[i] = 0.5f * x * (1.0f + tanhf(in)) * u[i];
    }
}

extern "C" loom_status loom_cuda_silu_mul(loom_cuda *c, float *d_g, const float *d_u, size_t n) {
    if (!n) return LOOM_OK;
    silu_mul_kernel<<<loom_cuda_blocks(n, 256), 256, 0, c->stream>>>(d_g, d_u, n);
    LAUNCH_CHECK();
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_gelu_tanh_mul(loom_cuda *c, float *d_g, const float *d_u,
                                               size_t n) {
    if (!n) return LOOM_OK;
    gelu_tanh_mul_kernel<<<loom_cuda_blocks(n, 256), 256, 0, c->stream>>>(d_g, d_u, n);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* g (T, n) = act(g) * u with row t of u at u + t * ld: Gemma 4's gate
 * over one layer's slice of the per-layer inputs (T, n_layers * n). */
__global__ void act_mul_ld_kernel(float *g, const float *u, int n, int ld, size_t total,
                                  int gelu) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t t = i / (size_t)n, k = i % (size_t)n;
    float x = g[i], v = u[t * (size_t)ld + k];
    if (gelu) {
        float in = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        g[i] = 0.5f * x * (1.0f + tanhf(in)) * v;
    } else {
        g[i] = x / (1.0f + expf(-x)) * v;
    }
}

extern "C" loom_status loom_cuda_act_mul_ld(loom_cuda *c, float *d_g, const float *d_u, int T,
                                            int n, int ld, int gelu) {
    size_t total = (size_t)T * n;
    if (!total) return LOOM_OK;
    if (ld < n)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda act_mul_ld: rows of u %d apart, narrower "
                        "than their %d values", ld, n);
    act_mul_ld_kernel<<<loom_cuda_blocks(total, 256), 256, 0, c->stream>>>(d_g, d_u, n, ld, total,
                                                                          gelu);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* The gate and up projections of one fused GEMM: gu (T, 2n), gate in
 * columns [0, n), up in [n, 2n). out (T, n) = act(gate) * up, each value
 * computed as silu_mul_kernel / gelu_tanh_mul_kernel compute it. */
/* out_ty: 0 f32, 1 f16, 2 bf16 (loom_cuda_dtype) */
__global__ void act_mul_split_kernel(void *out, const float *gu, int n, size_t total, int gelu,
                                     int out_ty) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    size_t t = i / (size_t)n, k = i % (size_t)n;
    float x = gu[t * 2 * n + k], u = gu[t * 2 * n + n + k], v;
    if (gelu) {
        float in = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        v = 0.5f * x * (1.0f + tanhf(in)) * u;
    } else {
        v = x / (1.0f + expf(-x)) * u;
    }
    if (out_ty == LOOM_CUDA_F16) ((__half *)out)[i] = __float2half_rn(v);
    else if (out_ty == LOOM_CUDA_BF16) ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(v);
    else ((float *)out)[i] = v;
}

extern "C" loom_status loom_cuda_act_mul_split(loom_cuda *c, float *d_out, const float *d_gu,
                                               int T, int n, int gelu) {
    size_t total = (size_t)T * n;
    if (!total) return LOOM_OK;
    act_mul_split_kernel<<<loom_cuda_blocks(total, 256), 256, 0, c->stream>>>(d_out, d_gu, n,
                                                                             total, gelu, 0);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* The same, 16-bit out, 4 values a thread (16-byte loads, 8-byte stores):
 * the scalar kernel moved a prefill's 0.6 GB a Llama-3-8B layer at 2.5
 * TB/s. n % 4 == 0. */
__global__ void act_mul_split16_vec_kernel(void *out, const float *gu, int n, size_t total4,
                                           int gelu, int f16) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total4) return;
    size_t n4 = (size_t)n / 4, t = i / n4, k = (i - t * n4) * 4;
    float4 g4 = *(const float4 *)(gu + t * 2 * n + k), u4 = *(const float4 *)(gu + t * 2 * n + n + k);
    float g[4] = {g4.x, g4.y, g4.z, g4.w}, u[4] = {u4.x, u4.y, u4.z, u4.w}, v[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float x = g[e];
        if (gelu) {
            float in = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            v[e] = 0.5f * x * (1.0f + tanhf(in)) * u[e];
        } else {
            v[e] = x / (1.0f + expf(-x)) * u[e];
        }
    }
    uint2 o;
    if (f16) {
        __half2 a = __floats2half2_rn(v[0], v[1]), b = __floats2half2_rn(v[2], v[3]);
        o = make_uint2(*(unsigned *)&a, *(unsigned *)&b);
    } else {
        __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
        o = make_uint2(*(unsigned *)&a, *(unsigned *)&b);
    }
    ((uint2 *)out)[i] = o;
}

/* The same from bf16 gate/up (4 values a thread: 8-byte loads). */
__global__ void act_mul_split_bf16_kernel(void *out, const __nv_bfloat16 *gu, int n,
                                          size_t total4, int gelu) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total4) return;
    size_t n4 = (size_t)n / 4, t = i / n4, k = (i - t * n4) * 4;
    uint2 g2 = *(const uint2 *)(gu + t * 2 * n + k), u2 = *(const uint2 *)(gu + t * 2 * n + n + k);
    unsigned gw[2] = {g2.x, g2.y}, uw[2] = {u2.x, u2.y};
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        unsigned gb = e & 1 ? gw[e >> 1] & 0xffff0000u : gw[e >> 1] << 16;
        unsigned ub = e & 1 ? uw[e >> 1] & 0xffff0000u : uw[e >> 1] << 16;
        float x = __uint_as_float(gb), u = __uint_as_float(ub);
        if (gelu) {
            float in = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            v[e] = 0.5f * x * (1.0f + tanhf(in)) * u;
        } else {
            v[e] = x / (1.0f + expf(-x)) * u;
        }
    }
    __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
    ((uint2 *)out)[i] = make_uint2(*(unsigned *)&a, *(unsigned *)&b);
}

extern "C" loom_status loom_cuda_act_mul_split_bf16(loom_cuda *c, void *d_out16,
                                                    const void *d_gu16, int T, int n, int gelu) {
    size_t total = (size_t)T * n;
    if (!total) return LOOM_OK;
    if (n % 4)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda act_mul_split_bf16: %d columns (a multiple "
                        "of 4 expected)", n);
    act_mul_split_bf16_kernel<<<loom_cuda_blocks(total / 4, 256), 256, 0, c->stream>>>(
        d_out16, (const __nv_bfloat16 *)d_gu16, n, total / 4, gelu);
    LAUNCH_CHECK();
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_act_mul_split16(loom_cuda *c, void *d_out16, const float *d_gu,
                                                 int T, int n, int gelu, loom_cuda_dtype dt) {
    size_t total = (size_t)T * n;
    if (!total) return LOOM_OK;
    if (dt != LOOM_CUDA_F16 && dt != LOOM_CUDA_BF16)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda act_mul_split16: output type %d", (int)dt);
    if (n % 4 == 0) {
        act_mul_split16_vec_kernel<<<loom_cuda_blocks(total / 4, 256), 256, 0, c->stream>>>(
            d_out16, d_gu, n, total / 4, gelu, dt == LOOM_CUDA_F16);
        LAUNCH_CHECK();
        return LOOM_OK;
    }
    act_mul_split_kernel<<<loom_cuda_blocks(total, 256), 256, 0, c->stream>>>(
        d_out16, d_gu, n, total, gelu, (int)dt);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- scaling ------------------------------------------------------------ */

__global__ void scale_kernel(float *x, const float *y, size_t n, float s) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = y ? (x[i] + y[i]) * s : x[i] * s;
}

extern "C" loom_status loom_cuda_scale(loom_cuda *c, float *d_x, size_t n, float s) {
    if (!n) return LOOM_OK;
    scale_kernel<<<loom_cuda_blocks(n, 256), 256, 0, c->stream>>>(d_x, NULL, n, s);
    LAUNCH_CHECK();
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_add_scale(loom_cuda *c, float *d_x, const float *d_y, size_t n,
                                           float s) {
    if (!n) return LOOM_OK;
    scale_kernel<<<loom_cuda_blocks(n, 256), 256, 0, c->stream>>>(d_x, d_y, n, s);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- embedding gather --------------------------------------------------- */

__global__ void embed_kernel(float *out, const void *table, int dt, int cols, const int32_t *ids,
                             float scale) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.y;
    size_t base = (size_t)ids[t] * cols;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < cols; i += gridDim.x * blockDim.x)
        out[(size_t)t * cols + i] = load_elem(table, base + i, dt) * scale;
}

extern "C" loom_status loom_cuda_embed(loom_cuda *c, float *d_out, const void *d_table,
                                       loom_cuda_dtype dt, int cols, const int32_t *d_ids, int T,
                                       float scale) {
    if (T <= 0 || cols <= 0) return LOOM_OK;
    if (T > 65535) return loom_err(LOOM_ERR_INVALID_ARG, "cuda embed: %d tokens, at most 65535", T);
    dim3 grid(LOOM_MIN_U(loom_cuda_blocks((size_t)cols, 256), 64u), (unsigned)T);
    CUDA_CHECK(loom_cuda_launch(c, embed_kernel, grid, dim3(256), 0, d_out, d_table, (int)dt, cols,
                                d_ids, scale));
    return LOOM_OK;
}

/* ---- softmax ------------------------------------------------------------ */

__global__ void softmax_kernel(float *x, int n) {
    __shared__ float sh[32];
    float *r = x + (size_t)blockIdx.x * n;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, r[i]);
    m = block_max(m, sh);
    float s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float e = expf(r[i] - m);
        r[i] = e;
        s += e;
    }
    s = block_sum(s, sh);
    float inv = 1.0f / s;
    for (int i = threadIdx.x; i < n; i += blockDim.x) r[i] *= inv;
}

extern "C" loom_status loom_cuda_softmax(loom_cuda *c, float *d_x, int T, int n) {
    if (T <= 0 || n <= 0) return LOOM_OK;
    softmax_kernel<<<T, ROW_THREADS, 0, c->stream>>>(d_x, n);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- argmax ------------------------------------------------------------- */

/* Warp, then block (ROW_THREADS) arg-max in loom_cuda_before's order;
 * thread 0 gets the result. */
__device__ void am_block(float *bv, int *bi, float *sv, int *si) {
    loom_cuda_warp_best(*bv, *bi);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (lane == 0) {
        sv[w] = *bv;
        si[w] = *bi;
    }
    __syncthreads();
    if (w == 0) {
        *bv = lane < (int)(blockDim.x >> 5) ? sv[lane] : -INFINITY;
        *bi = lane < (int)(blockDim.x >> 5) ? si[lane] : -1;
        loom_cuda_warp_best(*bv, *bi);
    }
}

/* Row t is cut into nb slices of per values (per a multiple of 4), block
 * (b, t) takes slice b. With nb > 1 the slices' winners go to pv/pi
 * (T, nb) and the last block of the row to finish (counter cnts[t], left
 * zero) picks among them: one launch, and a vocabulary row is read by
 * many SMs instead of one. */
__global__ void argmax_kernel(int32_t *out, const float *x, int n, int per, int nb, float *pv,
                              int *pi, int *cnts, int vec) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ int last;
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.y, lo = blockIdx.x * per, hi = min(n, lo + per);
    const float *r = x + (size_t)t * n;
    float bv = -INFINITY;
    int bi = -1;
    if (vec) {  /* rows and slices 16-byte aligned */
        for (int i = lo + 4 * threadIdx.x; i < hi; i += 4 * blockDim.x) {
            float4 q = *(const float4 *)(r + i);
            float v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (v[e] == v[e] && loom_cuda_before(v[e], i + e, bv, bi)) {  /* NaN never wins */
                    bv = v[e];
                    bi = i + e;
                }
        }
    } else {
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float v = r[i];
            if (v == v && loom_cuda_before(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
    }
    am_block(&bv, &bi, sv, si);
    if (nb == 1) {
        if (threadIdx.x == 0) out[t] = bi < 0 ? 0 : bi;
        return;
    }
    if (threadIdx.x == 0) {
        pv[(size_t)t * nb + blockIdx.x] = bv;
        pi[(size_t)t * nb + blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(cnts + t, 1) == nb - 1;
        if (last) cnts[t] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    bv = -INFINITY;
    bi = -1;
    for (int b = threadIdx.x; b < nb; b += blockDim.x) {
        float v = __ldcg(pv + (size_t)t * nb + b);
        int i = __ldcg(pi + (size_t)t * nb + b);
        if (loom_cuda_before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    __syncthreads();  /* sv, si are reused */
    am_block(&bv, &bi, sv, si);
    if (threadIdx.x == 0) out[t] = bi < 0 ? 0 : bi;
}

extern "C" loom_status loom_cuda_argmax(loom_cuda *c, int32_t *d_out, const float *d_x, int T,
                                        int n) {
    if (T <= 0 || n <= 0) return LOOM_OK;
    if (T > 65535) return loom_err(LOOM_ERR_INVALID_ARG, "cuda argmax: %d rows, at most 65535", T);
    int nb = T <= LOOM_CUDA_COUNTERS / 2 ? LOOM_MIN_U((unsigned)((n + 4095) / 4096), 256u) : 1;
    int per = n, vec = n % 4 == 0 && ((uintptr_t)d_x & 15) == 0;
    float *pv = NULL;
    int *pi = NULL;
    if (nb > 1) {
        void *scr;
        loom_status st = loom_cuda_scratch(c, (size_t)T * nb * 8, &scr);
        if (st != LOOM_OK) return st;
        per = ((n + nb - 1) / nb + 3) / 4 * 4;
        nb = (n + per - 1) / per;
        pv = (float *)scr;
        pi = (int *)(pv + (size_t)T * nb);
    }
    CUDA_CHECK(loom_cuda_launch(c, argmax_kernel, dim3((unsigned)nb, (unsigned)T),
                                dim3(ROW_THREADS), 0, d_out, d_x, n, per, nb, pv, pi,
                                c->counters + LOOM_CUDA_COUNTERS / 2, vec));
    return LOOM_OK;
}
