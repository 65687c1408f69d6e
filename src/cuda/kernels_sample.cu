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
 * A row is cut into slices of SP_SLICE logits, a block each, so that the
 * work spreads over the SMs (one block a row made top_k passes over the
 * whole vocabulary: about 3 ms a pick at 151,936 entries and top-k 40).
 * A block keeps its logits in registers and writes its max, its sum of
 * e^((l - its max) / T) in double, and its top_k logits in (logit desc,
 * index asc) order; the last block of a row to finish merges: the row's
 * max and sum (each block's rescaled by e^((its max - max) / T)), then
 * p for every candidate by the CPU's formula and top_k rounds in (p desc,
 * index asc) order. Ordering the slices by logit picks the same set as
 * ordering by p, since p does not decrease with the logit (two logits whose
 * p round to one float may trade places at the cut). The rescaled sum can
 * differ from the CPU's in its last bit, which, like expf, only moves a
 * draw that lands on a boundary. NaN: a NaN beside finite logits in a
 * slice makes the sum NaN and the row gives token 0, as before; a slice of
 * nothing but NaN (and -inf) adds nothing and the rest is sampled. Rows
 * are launched 32,768 at a time (the counters); vocabularies up to
 * loom_cuda_sample_fits. */
#include <math.h>

#include "cuda/cuda_int.cuh"

#define SAMPLE_THREADS 256
#define SP_PER 16                              /* logits a thread holds */
#define SP_SLICE (SAMPLE_THREADS * SP_PER)     /* a block's share of a row */
/* candidates the merge holds in shared memory: 48 KB less the static part */
#define SP_MERGE_MAX ((48 * 1024 - 1024) / 8)

/* The block's first (v, i) in loom_cuda_before's order, in every thread. */
__device__ __forceinline__ void sm_block_best(float &v, int &i, float *sv, int *si) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    loom_cuda_warp_best(v, i);
    __syncthreads();  /* sv/si of the previous call are read */
    if (lane == 0) sv[w] = v, si[w] = i;
    __syncthreads();
    v = sv[0], i = si[0];
    for (int k = 1; k < SAMPLE_THREADS / 32; k++)
        if (loom_cuda_before(sv[k], si[k], v, i)) v = sv[k], i = si[k];
}

struct sp_blk {
    double sum;   /* of e^((l - mx) / T) over the slice */
    float mx;
    int n;        /* candidates written */
};

__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_kernel(int32_t *out, const float *logits, int V, const loom_sample_pick *params,
              sp_blk *blk, float *cl, int *ci, int *cnt) {
    __shared__ float sv[SAMPLE_THREADS / 32];
    __shared__ int si[SAMPLE_THREADS / 32];
    __shared__ double sd[SAMPLE_THREADS / 32];
    __shared__ float cand_p[LOOM_CUDA_TOPK_MAX];
    __shared__ int cand_i[LOOM_CUDA_TOPK_MAX];
    __shared__ int last;
    extern __shared__ float mp[];  /* the merge: (nb * K) p, then their ids */
    int row = blockIdx.y, b = blockIdx.x, nb = gridDim.x;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    loom_sample_pick P = params[row];
    int K = min(P.top_k, min(V, LOOM_CUDA_TOPK_MAX));
    int s0 = (int)((long long)b * V / nb), s1 = (int)((long long)(b + 1) * V / nb);
    const float *lr = logits + (size_t)row * V;
    /* the slice into registers; its max */
    float v[SP_PER], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < SP_PER; j++) {
        int i = s0 + threadIdx.x + j * SAMPLE_THREADS;
        v[j] = i < s1 ? lr[i] : NAN;
        mx = fmaxf(mx, v[j]);  /* NaN never wins */
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) sv[w] = mx;
    __syncthreads();
    mx = sv[0];
    for (int k = 1; k < SAMPLE_THREADS / 32; k++) mx = fmaxf(mx, sv[k]);
    /* its sum, in double (a slice all -inf adds nothing) */
    double sum = 0;
    if (mx > -INFINITY)
#pragma unroll
        for (int j = 0; j < SP_PER; j++)
            if (s0 + (int)threadIdx.x + j * SAMPLE_THREADS < s1)
                sum += expf((v[j] - mx) / P.temperature);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) sd[w] = sum;
    /* its top K by logit */
    size_t cb = ((size_t)row * nb + b) * LOOM_CUDA_TOPK_MAX;
    unsigned taken = 0;
    int nk = 0;
    for (int k = 0; k < K; k++) {
        float bv = 0;
        int bi = -1, bj = -1;
#pragma unroll
        for (int j = 0; j < SP_PER; j++) {
            int i = s0 + threadIdx.x + j * SAMPLE_THREADS;
            if (!(taken >> j & 1) && v[j] == v[j] && loom_cuda_before(v[j], i, bv, bi))
                bv = v[j], bi = i, bj = j;
        }
        int mine = bi;
        sm_block_best(bv, bi, sv, si);
        if (bi < 0) break;  /* the slice has no more (NaN or short) */
        if (mine == bi) taken |= 1u << bj;
        if (threadIdx.x == 0) cl[cb + k] = bv, ci[cb + k] = bi;
        nk = k + 1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int k = 0; k < SAMPLE_THREADS / 32; k++) t += sd[k];
        blk[(size_t)row * nb + b] = sp_blk{t, mx, nk};
        __threadfence();
        last = atomicAdd(cnt + row, 1) == nb - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the merge: the row's max and sum */
    const sp_blk *rb = blk + (size_t)row * nb;
    float M = -INFINITY;
    for (int k = threadIdx.x; k < nb; k += SAMPLE_THREADS) M = fmaxf(M, __ldcg(&rb[k].mx));
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    __syncthreads();
    if (lane == 0) sv[w] = M;
    __syncthreads();
    M = sv[0];
    for (int k = 1; k < SAMPLE_THREADS / 32; k++) M = fmaxf(M, sv[k]);
    double S = 0;
    for (int k = threadIdx.x; k < nb; k += SAMPLE_THREADS) {
        float bm = __ldcg(&rb[k].mx);
        if (bm > -INFINITY) S += __ldcg(&rb[k].sum) * exp((double)(bm - M) / P.temperature);
    }
    for (int o = 16; o > 0; o >>= 1) S += __shfl_xor_sync(0xffffffffu, S, o);
    __syncthreads();
    if (lane == 0) sd[w] = S;
    __syncthreads();
    S = 0;
    for (int k = 0; k < SAMPLE_THREADS / 32; k++) S += sd[k];
    float inv = (float)(1.0 / S);
    /* every block's candidates with the CPU's p, then K rounds */
    int nc = nb * K, *mi = (int *)(mp + nc);
    for (int e = threadIdx.x; e < nc; e += SAMPLE_THREADS) {
        int bb = e / K, k = e - bb * K;
        size_t o = ((size_t)row * nb + bb) * LOOM_CUDA_TOPK_MAX + k;
        int ok = k < __ldcg(&rb[bb].n);
        mp[e] = ok ? expf((__ldcg(cl + o) - M) / P.temperature) * inv : 0.0f;
        mi[e] = ok ? __ldcg(ci + o) : -1;
    }
    __syncthreads();
    int m = 0;
    for (int k = 0; k < K; k++) {
        float bp = 0;
        int bi = -1, be = -1;
        for (int e = threadIdx.x; e < nc; e += SAMPLE_THREADS)
            if (mi[e] >= 0 && mp[e] == mp[e] && loom_cuda_before(mp[e], mi[e], bp, bi))
                bp = mp[e], bi = mi[e], be = e;
        int mine = bi;
        sm_block_best(bp, bi, sv, si);
        if (bi < 0) break;  /* fewer candidates than top_k (NaN rows) */
        if (mine == bi) mi[be] = -1;
        if (threadIdx.x == 0) cand_p[k] = bp, cand_i[k] = bi;
        m = k + 1;
        __syncthreads();  /* mi marked before the next round reads it */
    }
    if (threadIdx.x != 0) return;
    cnt[row] = 0;
    K = m;
    m = 0;
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
    out[row] = id;
}

extern "C" int loom_cuda_sample_fits(int V) {
    return V > 0 && ((size_t)V + SP_SLICE - 1) / SP_SLICE * LOOM_CUDA_TOPK_MAX <= SP_MERGE_MAX;
}

/* Counters: the argmax rows' half (LOOM_CUDA_COUNTERS / 2 on), free
 * between kernels like every tally; rows go 32,768 a launch. */
extern "C" loom_status loom_cuda_sample(loom_cuda *c, int32_t *d_out, const float *d_logits,
                                        int T, int V, const loom_sample_pick *d_params) {
    if (T <= 0) return LOOM_OK;
    if (!loom_cuda_sample_fits(V))
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda sample: a vocabulary of %d (at most %d)", V,
                        SP_MERGE_MAX / LOOM_CUDA_TOPK_MAX * SP_SLICE);
    int nb = (int)(((size_t)V + SP_SLICE - 1) / SP_SLICE);
    int rows = T < LOOM_CUDA_COUNTERS / 2 ? T : LOOM_CUDA_COUNTERS / 2;
    size_t parts = (size_t)rows * nb;
    void *scr;
    loom_status st = loom_cuda_scratch(
        c, parts * (sizeof(sp_blk) + (size_t)LOOM_CUDA_TOPK_MAX * 8), &scr);
    if (st != LOOM_OK) return st;
    sp_blk *blk = (sp_blk *)scr;
    float *cl = (float *)(blk + parts);
    int *ci = (int *)(cl + parts * LOOM_CUDA_TOPK_MAX);
    /* the merge's shared memory, sized for the largest top_k */
    size_t smem = (size_t)nb * LOOM_CUDA_TOPK_MAX * 8;
    for (int t0 = 0; t0 < T; t0 += rows) {
        int n = T - t0 < rows ? T - t0 : rows;
        sample_kernel<<<dim3((unsigned)nb, (unsigned)n), SAMPLE_THREADS, smem, c->stream>>>(
            d_out + t0, d_logits + (size_t)t0 * V, V, d_params + t0, blk, cl, ci,
            c->counters + LOOM_CUDA_COUNTERS / 2);
        LAUNCH_CHECK();
    }
    return LOOM_OK;
}
