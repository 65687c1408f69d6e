/* kernels_sample: temperature / top-k / top-p / min-p sampling on the
 * device, so a sampled row needs no vocabulary-sized copy back to the host.
 *
 * Computes what loom_sampler_pick (src/sample/sample.c) computes for a
 * request with temperature > 0, 1 <= top_k <= LOOM_CUDA_TOPK_MAX, no XTC,
 * no bias or penalties: probabilities p_i = expf((l_i - max) / T) * (float)
 * (1 / sum) (the sum in double), the top_k most probable in descending
 * order (ties: lower index first), cut after the first candidate where the
 * running mass (double) reaches top_p, then min-p against the top
 * probability, then the draw u * (kept mass) walked in order. The uniform u
 * comes from the request's own generator on the host, so a seed gives the
 * same draws as on the CPU path; the device's expf may differ from the
 * host's in the last bit, which can move a draw that lands on a boundary.
 *
 * One block per row: a block-wide max, a block-wide double sum, then top_k
 * rounds of a block-wide arg-max over the probabilities below the previous
 * pick in (p desc, index asc) order. */
#include <math.h>

#include "cuda/cuda_int.cuh"

#define SAMPLE_THREADS 1024

/* (p, i) comes before (q, j): more probable, or as probable and lower. */
__device__ __forceinline__ bool sm_before(float p, int i, float q, int j) {
    if (i < 0) return false;
    if (j < 0) return true;
    return p > q || (p == q && i < j);
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_kernel(int32_t *out, const float *logits, int V, const loom_cuda_sampling *params) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ double sd[32];
    __shared__ float cand_p[LOOM_CUDA_TOPK_MAX];
    __shared__ int cand_i[LOOM_CUDA_TOPK_MAX];
    const float *row = logits + (size_t)blockIdx.x * V;
    loom_cuda_sampling P = params[blockIdx.x];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    /* max */
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, row[i]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) sv[w] = mx;
    __syncthreads();
    mx = sv[0];
    for (int k = 1; k < nw; k++) mx = fmaxf(mx, sv[k]);
    /* sum of exp in double */
    double sum = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf((row[i] - mx) / P.temperature);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) sd[w] = sum;
    __syncthreads();
    sum = 0;
    for (int k = 0; k < nw; k++) sum += sd[k];
    float inv = (float)(1.0 / sum);
    /* top_k rounds, each the best below the previous pick */
    float lastp = INFINITY;
    int lasti = -1;
    int K = min(P.top_k, min(V, LOOM_CUDA_TOPK_MAX));
    for (int k = 0; k < K; k++) {
        float bp = 0;
        int bi = -1;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            float p = expf((row[i] - mx) / P.temperature) * inv;
            bool after = lasti < 0 || sm_before(lastp, lasti, p, i);
            if (p == p && after && sm_before(p, i, bp, bi)) {
                bp = p;
                bi = i;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float q = __shfl_xor_sync(0xffffffffu, bp, o);
            int j = __shfl_xor_sync(0xffffffffu, bi, o);
            if (sm_before(q, j, bp, bi)) {
                bp = q;
                bi = j;
            }
        }
        __syncthreads();  /* sv/si of the previous round are read */
        if (lane == 0) {
            sv[w] = bp;
            si[w] = bi;
        }
        __syncthreads();
        bp = sv[0];
        bi = si[0];
        for (int q = 1; q < nw; q++)
            if (sm_before(sv[q], si[q], bp, bi)) {
                bp = sv[q];
                bi = si[q];
            }
        if (bi < 0) {  /* fewer candidates than top_k (NaN rows) */
            K = k;
            break;
        }
        if (threadIdx.x == 0) {
            cand_p[k] = bp;
            cand_i[k] = bi;
        }
        lastp = bp;
        lasti = bi;
    }
    if (threadIdx.x != 0) return;
    int m = 0;
    double mass = 0;
    while (m < K) {
        mass += cand_p[m++];
        if (P.top_p < 1 && mass >= P.top_p) break;
    }
    if (P.min_p > 0) {
        float top = cand_p[0];
        int k = 0;
        for (int i = 0; i < m; i++)
            if (cand_p[i] >= P.min_p * top) {
                cand_p[k] = cand_p[i];
                cand_i[k++] = cand_i[i];
            }
        m = k;
    }
    double tot = 0;
    for (int i = 0; i < m; i++) tot += cand_p[i];
    double u = P.u * tot, acc = 0;
    int id = m > 0 ? cand_i[m - 1] : 0;
    for (int i = 0; i < m; i++) {
        acc += cand_p[i];
        if (u < acc) {
            id = cand_i[i];
            break;
        }
    }
    out[blockIdx.x] = id;
}

extern "C" loom_status loom_cuda_sample(loom_cuda *c, int32_t *d_out, const float *d_logits,
                                        int T, int V, const loom_cuda_sampling *d_params) {
    if (T <= 0) return LOOM_OK;
    if (V <= 0 || T > 2147483647)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda sample: %d rows of %d", T, V);
    sample_kernel<<<T, SAMPLE_THREADS, 0, c->stream>>>(d_out, d_logits, V, d_params);
    LAUNCH_CHECK();
    return LOOM_OK;
}
