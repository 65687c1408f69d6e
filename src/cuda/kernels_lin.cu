/* kernels_lin: Gated DeltaNet (Qwen3.5, Qwen3-Next) on the device, and
 * the output gate of their full-attention layers; the reference is
 * src/model/linear_attn.c (and forward.c's attention for the gate).
 *
 * A step's tokens lie row after row (d_rtok [n_rows + 1]: row r owns
 * tokens [rtok[r], rtok[r + 1])); each row's recurrent state lives in its
 * sequence's device slot, d_state[r] pointing at the slot's base and an
 * offset (in floats) selecting the layer: the conv state (kernel - 1,
 * conv_dim) oldest first, the delta-rule state (n_v, k_dim, v_dim).
 *
 * The delta rule runs token by token along each row, parallel over rows,
 * value heads and value columns (a column of the state evolves on its own
 * given k, q, beta and g): decode and short rows take that kernel. Long
 * prefill rows take the chunked form (linear_attn.c's, below), whose
 * steps along the row are chunks of LC_C tokens instead of tokens. The
 * arithmetic of both is double, as the CPU's is (outputs are
 * RMS-normalised per head, which magnifies any cancellation in S^T q);
 * the state is stored in f32 between steps. */
#include <math.h>

#include "cuda/cuda_int.cuh"

/* ---- causal depthwise conv1d over the conv state ------------------------ */

/* The row owning token t. */
__device__ __forceinline__ int lin_row_of(const int32_t *rtok, int n_rows, int t) {
    int lo = 0, hi = n_rows - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (rtok[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ double lin_silu(double x) { return x / (1.0 + exp(-x)); }

/* out (T, D) = silu(sum_j w[d][j] x[t - (K-1) + j]), inputs before a row's
 * first token read from its conv state. */
__global__ void lin_conv_kernel(float *out, const float *in, const float *w, int K, int D,
                                int n_rows, const int32_t *rtok, float *const *state,
                                size_t off) {
    int t = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    int r = lin_row_of(rtok, n_rows, t), t0 = rtok[r];
    const float *st = state[r] + off;
    double acc = 0;
    for (int j = 0; j < K; j++) {
        int src = t - (K - 1) + j;
        float x = src >= t0 ? in[(size_t)src * D + d] : st[(size_t)(K - 1 + src - t0) * D + d];
        acc += (double)w[(size_t)d * K + j] * x;
    }
    out[(size_t)t * D + d] = (float)lin_silu(acc);
}

/* The conv state rolled forward over the row's inputs: the last K-1 of
 * (state, inputs), oldest first. After lin_conv_kernel, which reads it. */
__global__ void lin_conv_roll_kernel(const float *in, int K, int D, const int32_t *rtok,
                                     float *const *state, size_t off) {
    int r = blockIdx.y, d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    int t0 = rtok[r], n = rtok[r + 1] - t0;
    float *st = state[r] + off;
    /* ascending j reads index j + n > j: never one already written */
    for (int j = 0; j < K - 1; j++) {
        int src = n - (K - 1) + j;
        st[(size_t)j * D + d] = src >= 0 ? in[(size_t)(t0 + src) * D + d]
                                         : st[(size_t)(j + n) * D + d];
    }
}

extern "C" loom_status loom_cuda_lin_conv(loom_cuda *c, float *d_out, const float *d_in,
                                          const float *d_w, int K, int D, int T, int n_rows,
                                          const int32_t *d_rtok, float *const *d_state,
                                          size_t off) {
    if (K < 1 || D < 1 || T < 1 || n_rows < 1)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda lin_conv: kernel %d, %d channels, %d tokens, "
                        "%d rows", K, D, T, n_rows);
    dim3 grid(loom_cuda_blocks((size_t)D, 256), (unsigned)T);
    lin_conv_kernel<<<grid, 256, 0, c->stream>>>(d_out, d_in, d_w, K, D, n_rows, d_rtok, d_state,
                                                 off);
    LAUNCH_CHECK();
    if (K > 1) {
        dim3 g2(loom_cuda_blocks((size_t)D, 256), (unsigned)n_rows);
        lin_conv_roll_kernel<<<g2, 256, 0, c->stream>>>(d_in, K, D, d_rtok, d_state, off);
        LAUNCH_CHECK();
    }
    return LOOM_OK;
}

/* ---- q/k L2 norms, beta and the decay ------------------------------------ */

__device__ __forceinline__ double lin_warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One block a token: each warp normalises heads of q and k in place
 * (q also scaled by 1/sqrt(dk)), then beta = sigmoid(b) and
 * g = neg_a * softplus(a + dt_bias) per value head. */
__global__ void lin_prep_kernel(float *qkv, float *beta, float *g, const float *b,
                                const float *a, const float *neg_a, const float *dt_bias, int D,
                                int nk, int dk, int nv) {
    int t = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int n_warps = blockDim.x / 32;
    double qscale = 1.0 / sqrt((double)dk);
    for (int h = warp; h < 2 * nk; h += n_warps) {
        float *v = qkv + (size_t)t * D + (size_t)h * dk;
        double ss = 0;
        for (int i = lane; i < dk; i += 32) ss += (double)v[i] * v[i];
        ss = lin_warp_sum(ss);
        double inv = 1.0 / sqrt(ss + 1e-6);
        if (h < nk) inv *= qscale;
        for (int i = lane; i < dk; i += 32) v[i] = (float)(v[i] * inv);
    }
    for (int h = threadIdx.x; h < nv; h += blockDim.x) {
        size_t i = (size_t)t * nv + h;
        double x = (double)a[i] + dt_bias[h];
        beta[i] = (float)(1.0 / (1.0 + exp(-(double)b[i])));
        g[i] = (float)(neg_a[h] * (x > 20.0 ? x : log1p(exp(x))));
    }
}

extern "C" loom_status loom_cuda_lin_prep(loom_cuda *c, float *d_qkv, float *d_beta, float *d_g,
                                          const float *d_b, const float *d_a,
                                          const float *d_neg_a, const float *d_dt_bias, int T,
                                          int D, int nk, int dk, int nv) {
    if (T < 1) return LOOM_OK;
    if (2 * nk * dk > D)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda lin_prep: %d key heads of %d in %d channels",
                        nk, dk, D);
    lin_prep_kernel<<<T, 256, 0, c->stream>>>(d_qkv, d_beta, d_g, d_b, d_a, d_neg_a, d_dt_bias, D,
                                              nk, dk, nv);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- the gated delta rule ------------------------------------------------ */

/* LIN_P consecutive lanes share a value column, each holding every
 * LIN_P-th key entry of it (up to LIN_KPT of them); a block takes LIN_VB
 * columns of one (row, value head). */
#define LIN_P 4
#define LIN_KPT 32
#define LIN_VB 32
#define LIN_KMAX (LIN_P * LIN_KPT)

/* Per token of the row: S = e^g S; u = beta (v - S^T k); S += k u^T;
 * o = S^T q (linear_attn.c's delta_step), S (dk, dv) in the state. The
 * tokens follow one another, so each step's latency is the kernel's: the
 * next token's q, k (one element of each a thread: blockDim is LIN_KMAX),
 * v, beta and decay are loaded while this one computes, into the other
 * half of the double-buffered q/k (one barrier a token), and the sums run
 * in four independent chains. */
static_assert(LIN_VB * LIN_P == LIN_KMAX, "a thread loads one q and one k entry a token");

/* Rows of skip_from tokens or more are left alone (the chunked kernels
 * take them), as are rows of none (their first token would be the next
 * row's, or past the end). */
__global__ void __launch_bounds__(LIN_VB * LIN_P)
lin_delta_kernel(float *o, const float *qkv, const float *beta, const float *gdec,
                 const int32_t *rtok, float *const *state, size_t off, int D, int nk, int nv,
                 int dk, int dv, int skip_from) {
    __shared__ float qs[2][LIN_KMAX], ks[2][LIN_KMAX];
    int r = blockIdx.x / nv, h = blockIdx.x % nv, kh = h / (nv / nk), tid = threadIdx.x;
    int n_r = rtok[r + 1] - rtok[r];
    if (n_r <= 0 || n_r >= skip_from) return;
    int part = tid % LIN_P, b = blockIdx.y * LIN_VB + tid / LIN_P;
    int col = b < dv, own = tid < dk;
    size_t qo = (size_t)kh * dk + tid, ko = (size_t)(nk + kh) * dk + tid;
    size_t vo = (size_t)2 * nk * dk + (size_t)h * dv + b;
    float *S = state[r] + off + (size_t)h * dk * dv;
    double s[LIN_KPT];
#pragma unroll
    for (int i = 0; i < LIN_KPT; i++) {
        int a = part + LIN_P * i;
        s[i] = col && a < dk ? (double)S[(size_t)a * dv + b] : 0.0;
    }
    int t0 = rtok[r], t1 = rtok[r + 1];
    /* token t0 into buffer 0 */
    const float *x = qkv + (size_t)t0 * D;
    qs[0][tid] = own ? x[qo] : 0.0f;
    ks[0][tid] = own ? x[ko] : 0.0f;
    double v = col ? (double)x[vo] : 0.0, bt = beta[(size_t)t0 * nv + h];
    double decay = exp((double)gdec[(size_t)t0 * nv + h]);
    __syncthreads();
    for (int t = t0; t < t1; t++) {
        int cur = (t - t0) & 1;
        /* the next token's inputs, in flight during this one's sums */
        float nq = 0.0f, nkk = 0.0f, nvv = 0.0f, nb = 0.0f, ng = 0.0f;
        if (t + 1 < t1) {
            const float *xn = qkv + (size_t)(t + 1) * D;
            nq = own ? xn[qo] : 0.0f;
            nkk = own ? xn[ko] : 0.0f;
            nvv = col ? xn[vo] : 0.0f;
            nb = beta[(size_t)(t + 1) * nv + h];
            ng = gdec[(size_t)(t + 1) * nv + h];
        }
        const float *q = qs[cur], *k = ks[cur];
        double kS[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < LIN_KPT; i++) {
            s[i] *= decay;
            kS[i % 4] += s[i] * (double)k[part + LIN_P * i];
        }
        double ksum = (kS[0] + kS[1]) + (kS[2] + kS[3]);
        for (int m = 1; m < LIN_P; m <<= 1) ksum += __shfl_xor_sync(0xffffffffu, ksum, m);
        double u = (v - ksum) * bt, oq[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < LIN_KPT; i++) {
            s[i] += (double)k[part + LIN_P * i] * u;
            oq[i % 4] += s[i] * (double)q[part + LIN_P * i];
        }
        double osum = (oq[0] + oq[1]) + (oq[2] + oq[3]);
        for (int m = 1; m < LIN_P; m <<= 1) osum += __shfl_xor_sync(0xffffffffu, osum, m);
        if (col && part == 0) o[((size_t)t * nv + h) * dv + b] = (float)osum;
        /* buffer cur ^ 1 was last read before the previous barrier */
        qs[cur ^ 1][tid] = nq;
        ks[cur ^ 1][tid] = nkk;
        v = nvv;
        bt = nb;
        decay = exp((double)ng);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < LIN_KPT; i++) {
        int a = part + LIN_P * i;
        if (col && a < dk) S[(size_t)a * dv + b] = (float)s[i];
    }
}

extern "C" int loom_cuda_lin_delta_max_k(void) { return LIN_KMAX; }

static loom_status lin_delta_check(const char *what, int nk, int nv, int dk, int dv, int D) {
    if (dk < 1 || dk > LIN_KMAX || dv < 1 || nk < 1 || nv % nk || 2 * nk * dk + nv * dv > D)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda %s: %d key heads of %d, %d value heads "
                        "of %d in %d channels (expected key dims up to %d and value heads a "
                        "multiple of the key heads)", what, nk, dk, nv, dv, D, LIN_KMAX);
    return LOOM_OK;
}

static loom_status lin_delta_seq(loom_cuda *c, float *d_o, const float *d_qkv,
                                 const float *d_beta, const float *d_g, int n_rows,
                                 const int32_t *d_rtok, float *const *d_state, size_t off, int D,
                                 int nk, int nv, int dk, int dv, int skip_from) {
    dim3 grid((unsigned)(n_rows * nv), loom_cuda_blocks((size_t)dv, LIN_VB));
    lin_delta_kernel<<<grid, LIN_VB * LIN_P, 0, c->stream>>>(d_o, d_qkv, d_beta, d_g, d_rtok,
                                                             d_state, off, D, nk, nv, dk, dv,
                                                             skip_from);
    LAUNCH_CHECK();
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_lin_delta(loom_cuda *c, float *d_o, const float *d_qkv,
                                           const float *d_beta, const float *d_g, int n_rows,
                                           const int32_t *d_rtok, float *const *d_state,
                                           size_t off, int D, int nk, int nv, int dk, int dv) {
    if (n_rows < 1) return LOOM_OK;
    loom_status st = lin_delta_check("lin_delta", nk, nv, dk, dv, D);
    if (st != LOOM_OK) return st;
    return lin_delta_seq(c, d_o, d_qkv, d_beta, d_g, n_rows, d_rtok, d_state, off, D, nk, nv, dk,
                         dv, 0x7fffffff);
}

/* ---- the chunked gated delta rule ------------------------------------------ */

/* Within a chunk of C tokens from state S0, with G = cumsum(g) and
 * A (C, C) strictly lower, A_ij = beta_i e^{G_i - G_j} (k_i . k_j), the
 * recurrence's u_i (linear_attn.c's chunked form) solve (I + A) u =
 * beta v - beta e^G K S0, so u = U - W S0 with
 *   U = (I + A)^-1 (beta V) (C, dv),  W = (I + A)^-1 (beta e^G K) (C, dk),
 * neither of which depends on S0. Then
 *   o_i = e^{G_i} q_i^T S0 + sum_{j<=i} P_ij u_j,  P_ij = e^{G_i - G_j} (q_i . k_j),
 *   S   = e^{G_C} S0 + sum_j e^{G_C - G_j} k_j u_j^T.
 * lin_chunk_wu_kernel makes U, W, P and G for every chunk of every long
 * row at once (one block a chunk and value head); lin_chunk_state_kernel
 * then walks each row's chunks in order (one block a row, value head and
 * LC_VT state columns), the only sequential part. Both in double. */
#define LC_C 64        /* tokens a chunk */
#define LC_THREADS 256 /* 8 warps: lin_chunk_state_kernel's rows warp + 8 m */
#define LC_VT 32       /* state columns a block of lin_chunk_state_kernel */
static_assert(LC_THREADS == 32 * 8 && LC_C % 8 == 0, "8 warps, each C / 8 rows of a chunk");

/* The scratch the chunked kernels share, per (token, value head): W (dk),
 * U (dv), P's row (LC_C), G (1), all double. */
struct lin_chunk_bufs {
    double *W, *U, *P, *G;
};

static size_t lin_chunk_wu_smem(int dk) {
    return sizeof(double) * (LC_C * LC_C + 3 * LC_C) + sizeof(float) * 2 * LC_C * (dk | 1);
}

static size_t lin_chunk_state_smem(int dk) {
    size_t stage = LC_C * dk + LC_C * LC_C + (LC_C * dk + 1) / 2;  /* W | P | Q (f32) */
    return sizeof(double) * ((size_t)dk * LC_VT + LC_C * LC_VT + 2 * LC_C + stage);
}

/* Block (row r, chunk ch of it; value head h): U, W, P, G of the chunk's
 * tokens, rows of fewer than min_n tokens skipped. q and k rows sit in
 * shared memory at an odd stride, so that a warp reading the rows j of one
 * column hits distinct banks. */
__global__ void __launch_bounds__(LC_THREADS)
lin_chunk_wu_kernel(lin_chunk_bufs B, const float *qkv, const float *beta, const float *gdec,
                    const int32_t *rtok, int nch, int min_n, int D, int nk, int nv, int dk,
                    int dv) {
    extern __shared__ double lc_sh[];
    int r = blockIdx.x / nch, ch = blockIdx.x % nch, h = blockIdx.y, kh = h / (nv / nk);
    int tid = threadIdx.x, t0 = rtok[r], n = rtok[r + 1] - t0;
    if (n < min_n || ch * LC_C >= n) return;
    int tb = t0 + ch * LC_C, cn = min(LC_C, n - ch * LC_C), ldk = dk | 1;
    double *A = lc_sh;              /* (C, C) */
    double *G = A + LC_C * LC_C;    /* (C) cumulative log-decay */
    double *eG = G + LC_C;          /* (C) e^G */
    double *bt = eG + LC_C;         /* (C) beta, 0 past the chunk */
    float *Qs = (float *)(bt + LC_C), *Ks = Qs + LC_C * ldk;  /* (C, ldk) */
    for (int e = tid; e < LC_C * dk; e += LC_THREADS) {
        int i = e / dk, a = e % dk;
        float q = 0.0f, k = 0.0f;
        if (i < cn) {
            const float *x = qkv + (size_t)(tb + i) * D;
            q = x[(size_t)kh * dk + a];
            k = x[(size_t)(nk + kh) * dk + a];
        }
        Qs[i * ldk + a] = q;
        Ks[i * ldk + a] = k;
    }
    if (tid < LC_C) bt[tid] = tid < cn ? (double)beta[(size_t)(tb + tid) * nv + h] : 0.0;
    if (tid == 0) {
        /* in token order, as the CPU sums it */
        double acc = 0;
        for (int i = 0; i < LC_C; i++) {
            if (i < cn) acc += (double)gdec[(size_t)(tb + i) * nv + h];
            G[i] = acc;
            eG[i] = exp(acc);
        }
    }
    __syncthreads();
    /* A and P; a warp shares i (32 consecutive e of one row) */
    for (int e = tid; e < LC_C * LC_C; e += LC_THREADS) {
        int i = e / LC_C, j = e % LC_C;
        double a = 0.0, p = 0.0;
        if (i < cn && j <= i) {
            const float *ki = Ks + i * ldk, *kj = Ks + j * ldk, *qi = Qs + i * ldk;
            double kk0 = 0, kk1 = 0, qk0 = 0, qk1 = 0;  /* two chains each */
            int x = 0;
            for (; x + 1 < dk; x += 2) {
                double kj0 = kj[x], kj1 = kj[x + 1];
                kk0 += (double)ki[x] * kj0;
                kk1 += (double)ki[x + 1] * kj1;
                qk0 += (double)qi[x] * kj0;
                qk1 += (double)qi[x + 1] * kj1;
            }
            if (x < dk) {
                kk0 += (double)ki[x] * kj[x];
                qk0 += (double)qi[x] * kj[x];
            }
            double w = exp(G[i] - G[j]);
            if (j < i) a = bt[i] * w * (kk0 + kk1);
            p = w * (qk0 + qk1);
        }
        A[e] = a;
        if (i < cn) B.P[((size_t)(tb + i) * nv + h) * LC_C + j] = p;
    }
    if (tid < cn) B.G[(size_t)(tb + tid) * nv + h] = G[tid];
    __syncthreads();
    /* Forward substitution down one column of [beta e^G K | beta V] a
     * thread: x_i = rhs_i - sum_{j<i} A_ij x_j, unrolled so that x stays in
     * registers (rows past the chunk have rhs 0 and A 0: x 0). */
    const float *vb = qkv + (size_t)2 * nk * dk + (size_t)h * dv;
    for (int col = tid; col < dk + dv; col += LC_THREADS) {
        double x[LC_C];
#pragma unroll
        for (int i = 0; i < LC_C; i++) {
            double rhs = 0.0;
            if (i < cn)
                rhs = col < dk ? bt[i] * eG[i] * (double)Ks[i * ldk + col]
                               : bt[i] * (double)vb[(size_t)(tb + i) * D + col - dk];
#pragma unroll
            for (int j = 0; j < i; j++) rhs -= A[i * LC_C + j] * x[j];
            x[i] = rhs;
        }
        double *dst = col < dk ? B.W + col : B.U + col - dk;
        size_t ld = col < dk ? (size_t)dk : (size_t)dv;
#pragma unroll
        for (int i = 0; i < LC_C; i++)
            if (i < cn) dst[((size_t)(tb + i) * nv + h) * ld] = x[i];
    }
}

/* Block (row r, value head h; state columns blockIdx.y * LC_VT + lane):
 * the row's chunks in order, the state tile S (dk, LC_VT) in shared
 * memory. Warp w takes the chunk rows w + 8 m for u and o (one sweep over
 * S for W S and Q S), the state rows w + 8 m for the update; a warp's
 * reads of W, Q, P and K are broadcasts, of S and u consecutive doubles.
 * The stage holds W, P and Q, then K. */
__global__ void __launch_bounds__(LC_THREADS)
lin_chunk_state_kernel(float *o, lin_chunk_bufs B, const float *qkv, const int32_t *rtok,
                       float *const *state, size_t off, int min_n, int D, int nk, int nv, int dk,
                       int dv) {
    extern __shared__ double lc_sh[];
    int r = blockIdx.x / nv, h = blockIdx.x % nv, kh = h / (nv / nk), tid = threadIdx.x;
    int lane = tid % 32, warp = tid / 32, b = blockIdx.y * LC_VT + lane, col = b < dv;
    int t0 = rtok[r], n = rtok[r + 1] - t0;
    if (n < min_n) return;
    double *S = lc_sh;                 /* (dk, VT) */
    double *Vn = S + dk * LC_VT;       /* (C, VT) the chunk's u */
    double *G = Vn + LC_C * LC_VT;     /* (C) */
    double *Dj = G + LC_C;             /* (C) e^{G_C - G_j} */
    double *Ws = Dj + LC_C;            /* the stage: (C, dk) W */
    double *Ps = Ws + LC_C * dk;       /* (C, C) */
    float *Qf = (float *)(Ps + LC_C * LC_C), *Kf = (float *)Ws;  /* (C, dk) */
    float *Sg = state[r] + off + (size_t)h * dk * dv;
    for (int a = warp; a < dk; a += 8) S[a * LC_VT + lane] = col ? (double)Sg[(size_t)a * dv + b] : 0.0;
    for (int c0 = 0; c0 < n; c0 += LC_C) {
        int tb = t0 + c0, cn = min(LC_C, n - c0);
        __syncthreads();  /* the last chunk's update is done with the stage, u and G */
        for (int e = tid; e < LC_C * dk; e += LC_THREADS) {
            int i = e / dk, a = e % dk;
            size_t ti = (size_t)(tb + i);
            Ws[e] = i < cn ? B.W[(ti * nv + h) * dk + a] : 0.0;
            Qf[e] = i < cn ? qkv[ti * D + (size_t)kh * dk + a] : 0.0f;
        }
        for (int e = tid; e < LC_C * LC_C; e += LC_THREADS) {
            int i = e / LC_C;
            Ps[e] = i < cn ? B.P[((size_t)(tb + i) * nv + h) * LC_C + e % LC_C] : 0.0;
        }
        if (tid < LC_C) G[tid] = tid < cn ? B.G[(size_t)(tb + tid) * nv + h] : 0.0;
        __syncthreads();
        /* W S0 and Q S0; then u = U - W S0 */
        double wa[LC_C / 8], qa[LC_C / 8];
#pragma unroll
        for (int m = 0; m < LC_C / 8; m++) wa[m] = qa[m] = 0.0;
        for (int a = 0; a < dk; a++) {
            double s = S[a * LC_VT + lane];
#pragma unroll
            for (int m = 0; m < LC_C / 8; m++) {
                wa[m] += Ws[(warp + 8 * m) * dk + a] * s;
                qa[m] += (double)Qf[(warp + 8 * m) * dk + a] * s;
            }
        }
#pragma unroll
        for (int m = 0; m < LC_C / 8; m++) {
            int i = warp + 8 * m;
            Vn[i * LC_VT + lane] =
                i < cn && col ? B.U[((size_t)(tb + i) * nv + h) * dv + b] - wa[m] : 0.0;
        }
        __syncthreads();
        /* o_i = e^{G_i} q_i^T S0 + sum_{j<=i} P_ij u_j */
#pragma unroll
        for (int m = 0; m < LC_C / 8; m++) {
            int i = warp + 8 * m;
            if (i >= cn) continue;
            double y = exp(G[i]) * qa[m];
            for (int j = 0; j <= i; j++) y += Ps[i * LC_C + j] * Vn[j * LC_VT + lane];
            if (col) o[((size_t)(tb + i) * nv + h) * dv + b] = (float)y;
        }
        __syncthreads();
        for (int e = tid; e < LC_C * dk; e += LC_THREADS) {
            int i = e / dk;
            Kf[e] = i < cn ? qkv[(size_t)(tb + i) * D + (size_t)(nk + kh) * dk + e % dk] : 0.0f;
        }
        if (tid < LC_C) Dj[tid] = tid < cn ? exp(G[cn - 1] - G[tid]) : 0.0;
        __syncthreads();
        /* S = e^{G_C} S0 + sum_j e^{G_C - G_j} k_j u_j^T; a thread updates
         * only the entries it owns (and stores at the end) */
        double eg = exp(G[cn - 1]);
        for (int a = warp; a < dk; a += 8) {
            double s = eg * S[a * LC_VT + lane];
            for (int j = 0; j < cn; j++) s += (Dj[j] * (double)Kf[j * dk + a]) * Vn[j * LC_VT + lane];
            S[a * LC_VT + lane] = s;
        }
    }
    for (int a = warp; a < dk; a += 8)
        if (col) Sg[(size_t)a * dv + b] = (float)S[a * LC_VT + lane];
}

extern "C" int loom_cuda_lin_delta_chunk_len(void) { return LC_C; }

extern "C" loom_status loom_cuda_lin_delta_chunked(loom_cuda *c, float *d_o, const float *d_qkv,
                                                   const float *d_beta, const float *d_g, int T,
                                                   int n_rows, int max_n, const int32_t *d_rtok,
                                                   float *const *d_state, size_t off, int D,
                                                   int nk, int nv, int dk, int dv,
                                                   int chunk_min) {
    if (n_rows < 1 || T < 1) return LOOM_OK;
    loom_status st = lin_delta_check("lin_delta_chunked", nk, nv, dk, dv, D);
    if (st != LOOM_OK) return st;
    if (max_n < 1 || max_n > T || n_rows > T)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda lin_delta_chunked: %d rows of up to %d "
                        "tokens in %d tokens", n_rows, max_n, T);
    if (chunk_min < 1) chunk_min = 1;
    size_t smem_wu = lin_chunk_wu_smem(dk), smem_st = lin_chunk_state_smem(dk);
    size_t need = smem_wu > smem_st ? smem_wu : smem_st;
    if (max_n >= chunk_min && need > c->smem_optin)  /* before anything runs: callers fall back */
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda lin_delta_chunked: %zu bytes of shared "
                        "memory a block, the device allows %zu", need, c->smem_optin);
    /* rows shorter than chunk_min (all of them, or some unless one row) */
    if (max_n < chunk_min || n_rows > 1)
        if ((st = lin_delta_seq(c, d_o, d_qkv, d_beta, d_g, n_rows, d_rtok, d_state, off, D, nk,
                                nv, dk, dv, chunk_min)) != LOOM_OK)
            return st;
    if (max_n < chunk_min) return LOOM_OK;
    size_t per = (size_t)T * nv;
    void *scr = NULL;
    st = loom_cuda_scratch(c, sizeof(double) * per * ((size_t)dk + dv + LC_C + 1), &scr);
    if (st != LOOM_OK) return st;
    lin_chunk_bufs B;
    B.W = (double *)scr;
    B.U = B.W + per * dk;
    B.P = B.U + per * dv;
    B.G = B.P + per * LC_C;
    CUDA_CHECK(cudaFuncSetAttribute(lin_chunk_wu_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_wu));
    CUDA_CHECK(cudaFuncSetAttribute(lin_chunk_state_kernel,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_st));
    int nch = (max_n + LC_C - 1) / LC_C;
    dim3 g1((unsigned)(n_rows * nch), (unsigned)nv);
    lin_chunk_wu_kernel<<<g1, LC_THREADS, smem_wu, c->stream>>>(B, d_qkv, d_beta, d_g, d_rtok,
                                                                nch, chunk_min, D, nk, nv, dk, dv);
    LAUNCH_CHECK();
    dim3 g2((unsigned)(n_rows * nv), loom_cuda_blocks((size_t)dv, LC_VT));
    lin_chunk_state_kernel<<<g2, LC_THREADS, smem_st, c->stream>>>(d_o, B, d_qkv, d_rtok,
                                                                   d_state, off, chunk_min, D, nk,
                                                                   nv, dk, dv);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- gated RMSNorm -------------------------------------------------------- */

/* Sum over the block (blockDim a multiple of 32, at most 1024), in every
 * thread. */
__device__ double lin_block_sum(double v, double *sh) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n = blockDim.x / 32;
    v = lin_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < n; i++) s += sh[i];
    return s;
}

/* One block a (token, value head): y = o / rms(o) * w * silu(z). */
__global__ void lin_gated_norm_kernel(float *y, const float *o, const float *z, const float *w,
                                      int dv, float eps) {
    __shared__ double sh[32];
    size_t row = (size_t)blockIdx.x * dv;
    double ss = 0;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss += (double)o[row + i] * o[row + i];
    ss = lin_block_sum(ss, sh);
    double inv = 1.0 / sqrt(ss / dv + (double)eps);
    for (int i = threadIdx.x; i < dv; i += blockDim.x)
        y[row + i] = (float)(o[row + i] * inv * w[i] * lin_silu((double)z[row + i]));
}

extern "C" loom_status loom_cuda_lin_gated_norm(loom_cuda *c, float *d_y, const float *d_o,
                                                const float *d_z, const float *d_w, int T, int nv,
                                                int dv, float eps) {
    if (T < 1 || nv < 1) return LOOM_OK;
    unsigned threads = dv >= 128 ? 128 : dv > 32 ? 64 : 32;
    lin_gated_norm_kernel<<<(unsigned)(T * nv), threads, 0, c->stream>>>(d_y, d_o, d_z, d_w, dv,
                                                                         eps);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- Qwen3-Next's grouped projections ------------------------------------ */

/* raw (T, nk * (2 dk + 2 rep dv)), per key head [q | k | v (rep dv) | z (rep dv)],
 * into qkv (T, D) = [q | k | v] and z (T, nk rep dv). */
__global__ void lin_split_qkvz_kernel(float *qkv, float *z, const float *raw, int nk, int dk,
                                      int rep, int dv, int D) {
    int t = blockIdx.y, gw = 2 * dk + 2 * rep * dv, W = nk * gw, nvd = nk * rep * dv;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < W; i += gridDim.x * blockDim.x) {
        int g = i / gw, k = i % gw;
        float x = raw[(size_t)t * W + i];
        float *q = qkv + (size_t)t * D;
        if (k < dk) q[(size_t)g * dk + k] = x;
        else if (k < 2 * dk) q[(size_t)(nk + g) * dk + k - dk] = x;
        else if (k < 2 * dk + rep * dv) q[(size_t)2 * nk * dk + (size_t)g * rep * dv + k - 2 * dk] = x;
        else z[(size_t)t * nvd + (size_t)g * rep * dv + k - 2 * dk - rep * dv] = x;
    }
}

/* raw (T, nk * 2 rep), per key head [b (rep) | a (rep)], into b, a (T, nk rep). */
__global__ void lin_split_ba_kernel(float *b, float *a, const float *raw, int nk, int rep, int T) {
    int nv = nk * rep;
    size_t n = (size_t)T * 2 * nv;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (2 * nv);
        int j = (int)(i % (2 * nv)), g = j / (2 * rep), k = j % (2 * rep);
        if (k < rep) b[t * nv + g * rep + k] = raw[i];
        else a[t * nv + g * rep + k - rep] = raw[i];
    }
}

extern "C" loom_status loom_cuda_lin_split(loom_cuda *c, float *d_qkv, float *d_z, float *d_b,
                                           float *d_a, const float *d_raw_qkvz,
                                           const float *d_raw_ba, int T, int nk, int dk, int rep,
                                           int dv, int D) {
    if (T < 1) return LOOM_OK;
    int W = nk * (2 * dk + 2 * rep * dv);
    dim3 grid(LOOM_MIN_U(loom_cuda_blocks((size_t)W, 256), 64u), (unsigned)T);
    lin_split_qkvz_kernel<<<grid, 256, 0, c->stream>>>(d_qkv, d_z, d_raw_qkvz, nk, dk, rep, dv, D);
    LAUNCH_CHECK();
    size_t n = (size_t)T * 2 * nk * rep;
    lin_split_ba_kernel<<<LOOM_MIN_U(loom_cuda_blocks(n, 256), 1024u), 256, 0, c->stream>>>(
        d_b, d_a, d_raw_ba, nk, rep, T);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* ---- gated attention (sigmoid output gate) ------------------------------ */

/* raw (T, nh, 2 hd): per head [query | gate], into q and gate (T, nh, hd). */
__global__ void attn_gate_split_kernel(float *q, float *gate, const float *raw, int nh, int hd,
                                       size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t th = i / hd;  /* t * nh + h */
        int k = (int)(i % hd);
        q[i] = raw[th * 2 * hd + k];
        gate[i] = raw[th * 2 * hd + hd + k];
    }
}

extern "C" loom_status loom_cuda_attn_gate_split(loom_cuda *c, float *d_q, float *d_gate,
                                                 const float *d_raw, int T, int nh, int hd) {
    size_t n = (size_t)T * nh * hd;
    if (n == 0) return LOOM_OK;
    attn_gate_split_kernel<<<LOOM_MIN_U(loom_cuda_blocks(n, 256), 4096u), 256, 0, c->stream>>>(
        d_q, d_gate, d_raw, nh, hd, n);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* x *= sigmoid(gate), as forward.c's gated attention (in f32). */
__global__ void attn_gate_mul_kernel(float *x, const float *gate, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

extern "C" loom_status loom_cuda_attn_gate_mul(loom_cuda *c, float *d_x, const float *d_gate,
                                               size_t n) {
    if (n == 0) return LOOM_OK;
    attn_gate_mul_kernel<<<LOOM_MIN_U(loom_cuda_blocks(n, 256), 4096u), 256, 0, c->stream>>>(
        d_x, d_gate, n);
    LAUNCH_CHECK();
    return LOOM_OK;
}
