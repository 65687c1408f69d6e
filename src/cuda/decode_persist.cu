/* decode_persist: every layer of a one-token decode step in one kernel.
 *
 * At batch 1 a layer is six short kernels, each bound by its own start and
 * by the wait for the one before, not by its bytes (Qwen3-0.6B on an H200:
 * about 23 us a layer for 31 MB, 7.4 us at the copy rate). Here one block
 * an SM stays resident for the whole step:
 *
 * - warp 0 (the producer) streams this block's share of every weight
 *   matrix, layer after layer, into a ring of shared-memory slots with bulk
 *   copies (cp.async.bulk, one mbarrier a slot). It never waits for the
 *   activations, so the weight reads run ahead through attention and every
 *   phase change, as far as the ring reaches;
 * - the other warps (the consumers) run the phases of each layer in order:
 *   qkv rows -> q/k norms, rope, the K/V store and attention -> o rows (+=
 *   x) -> gate/up rows -> down rows (+= x). Block b owns rows [b R / nb,
 *   (b + 1) R / nb) of each matrix. A phase that needs the whole output of
 *   the one before waits on a counter in global memory that each block
 *   bumps when its rows are written (release/acquire through fences).
 *
 * Attention is split over (KV head, span of positions) items; the last item
 * of a KV head to finish combines the partials (flash-decoding). Same
 * arithmetic as the kernels it replaces, except the order of the sums in a
 * row (f32, inputs rounded to bf16 as the GEMV rounds them).
 *
 * Deadlock freedom needs every block resident at once: the grid is one
 * block an SM and the shared memory keeps it at one.
 *
 * Off by default (LOOM_CUDA_PERSIST=1 turns it on): slower than the
 * per-layer kernels on an H200, Qwen3-0.6B batch 1 880-1,050 tok/s
 * against 1,375. A phase timer in block 0 put a layer at ~30 us: each
 * hand-off between phases (the count, its poll, the L2 read of the whole
 * vector after it) costs 1.5-3 us, attention with its combine 10 us, and
 * even a chunk's few shared-memory loads and sums 0.5-0.8 us, which the
 * weight stream running ahead does not buy back (bench/RESULTS.md). */
#include <cuda_bf16.h>
#include <math.h>

#include "cuda/cuda_int.cuh"

#define PL_NC 12                       /* consumer warps */
#define PL_THREADS ((PL_NC + 1) * 32)
#define PL_SB (PL_NC * 32 * 4 * 16)    /* ring slot bytes: 4 vectors a consumer lane (24 KB) */
#define PL_VW 128                      /* vectors a consumer warp takes of a slot */
#define PL_GMAX 4                      /* q heads a KV head at most (8 would spill) */
#define PL_MAXP 4                      /* positions a warp loads at once */
#define PL_PHASES 5                    /* counters a layer: qkv, attention, o, gate/up, down */
#define PL_WPS 132                     /* a warp's partial in shared memory: acc[128], m, l, pad */
#define PL_YBR 256                     /* rows of a matrix a block owns at most */

struct pl_args {
    const loom_cuda_pl_layer *layers;
    int L, H, nh, nkv, I, qd, kvd, rot, gelu, bs, ns;
    float eps;
    size_t kv_stride;                  /* pool row elements */
    float *x, *qkv, *att, *hb, *part;
    int *cnt;
    const int32_t *slot, *tab, *lens;
};

/* ---- barriers and bulk copies ------------------------------------------ */

__device__ __forceinline__ unsigned pl_sa(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void pl_mbar_init(unsigned long long *b, unsigned n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(pl_sa(b)), "r"(n) : "memory");
}

/* Spins with test_wait: try_wait may suspend the warp, and a consumer
 * woken late holds up the block's barrier. */
__device__ __forceinline__ void pl_mbar_wait(unsigned long long *b, unsigned parity) {
    asm volatile(
        "{\n\t.reg .pred p;\n"
        "W_%=:\n\t"
        "mbarrier.test_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
        "@!p bra W_%=;\n}" ::"r"(pl_sa(b)),
        "r"(parity)
        : "memory");
}

__device__ __forceinline__ void pl_mbar_arrive(unsigned long long *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(pl_sa(b)) : "memory");
}

/* Copies n bytes (16-byte multiple) into shared memory; full[] completes
 * when they land. */
__device__ __forceinline__ void pl_copy(void *dst, const void *src, unsigned n,
                                        unsigned long long *full) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(pl_sa(full)),
                 "r"(n)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            pl_sa(dst)),
        "l"(src), "r"(n), "r"(pl_sa(full))
        : "memory");
#endif
}

/* The consumer warps only (named barrier 1; warp 0 streams). */
__device__ __forceinline__ void pl_sync(void) {
    asm volatile("bar.sync 1, %0;" ::"n"(PL_NC * 32) : "memory");
}

/* This block's outputs of a phase are written: count it (release: the
 * block's writes, ordered before by the barrier, become visible first). */
__device__ __forceinline__ void pl_signal(int *c, int ct) {
    pl_sync();
    if (ct == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(c) : "memory");
}

/* Until *c reaches n (acquire: what the counted blocks wrote is visible). */
__device__ __forceinline__ void pl_await(const int *c, int n, int ct) {
    if (ct == 0) {
        int v;
        do asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
        while (v < n);
    }
    pl_sync();
}

/* ---- the phases --------------------------------------------------------- */

struct pl_ring {
    const uint4 *slots;                 /* ns slots of PL_SB bytes */
    unsigned long long *full, *empty;   /* [ns] each */
    int ns;
    int s;                              /* the next chunk's slot */
    unsigned ph;                        /* and the parity of its use of that slot */
    int k;                              /* the next chunk's index in the stream */
};

__device__ __forceinline__ void pl_next(pl_ring &g) {
    g.k++;
    if (++g.s == g.ns) g.s = 0, g.ph ^= 1;
}

/* Rows [r0, r1) of the block's share of an R-row matrix (R * grid < 2^31). */
__device__ __forceinline__ void pl_rows(int R, int &r0, int &r1) {
    r0 = (int)(blockIdx.x * (unsigned)R / gridDim.x);
    r1 = (int)((blockIdx.x + 1) * (unsigned)R / gridDim.x);
}

/* The producer: every chunk of every matrix in the consumers' order. */
__device__ __noinline__ void pl_produce(const pl_args &a, pl_ring &g) {
    for (int l = 0; l < a.L; l++) {
        const loom_cuda_pl_layer *Ly = &a.layers[l];
        for (int m = 0; m < 4; m++) {  /* the consumers' order: qkv, o, gate/up, down */
            int R = m == 0 ? a.qd + 2 * a.kvd : m == 2 ? 2 * a.I : a.H;
            int C = m == 1 ? a.qd : m == 3 ? a.I : a.H;
            const char *w = (const char *)(m == 0 ? Ly->wqkv : m == 1 ? Ly->wo : m == 2 ? Ly->wgu
                                                                                   : Ly->wdown);
            int r0, r1, rb = C * 2, cr = PL_SB / rb;
            pl_rows(R, r0, r1);
            for (int r = r0; r < r1; r += cr, pl_next(g)) {
                if (g.k >= g.ns) pl_mbar_wait(&g.empty[g.s], g.ph ^ 1);
                unsigned n = (unsigned)(min(cr, r1 - r) * rb);
                pl_copy((void *)(g.slots + (size_t)g.s * (PL_SB / 16)), w + (size_t)r * rb, n,
                        &g.full[g.s]);
            }
        }
    }
}

__device__ __forceinline__ float pl_dot8(uint4 w, uint4 x) {
    unsigned wu[4] = {w.x, w.y, w.z, w.w}, xu[4] = {x.x, x.y, x.z, x.w};
    float s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        s = fmaf(__uint_as_float(wu[i] << 16), __uint_as_float(xu[i] << 16), s);
        s = fmaf(__uint_as_float(wu[i] & 0xffff0000u), __uint_as_float(xu[i] & 0xffff0000u), s);
    }
    return s;
}

__device__ __forceinline__ unsigned pl_pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const unsigned *)&h;
}

__device__ __forceinline__ uint4 pl_pack8(const float *v) {
    return make_uint4(pl_pack(v[0], v[1]), pl_pack(v[2], v[3]), pl_pack(v[4], v[5]),
                      pl_pack(v[6], v[7]));
}

/* xs = RMSNorm(x) * w in bf16 (n <= 2 * 8 * consumer threads). */
__device__ __forceinline__ void pl_fill_norm(uint4 *xs, const float *x, const float *w, int n, float eps,
                             float *red, int ct) {
    int nv = n >> 3, lane = ct & 31, wid = ct >> 5;
    float4 u[2][2];
    float ss = 0;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int i = ct + j * PL_NC * 32;
        if (i < nv) {
            u[j][0] = __ldcg((const float4 *)x + 2 * i);
            u[j][1] = __ldcg((const float4 *)x + 2 * i + 1);
            float4 p = u[j][0], q = u[j][1];
            ss += p.x * p.x + p.y * p.y + p.z * p.z + p.w * p.w + q.x * q.x + q.y * q.y +
                  q.z * q.z + q.w * q.w;
        }
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) red[wid] = ss;
    pl_sync();
    float t = 0;
    for (int k = 0; k < PL_NC; k++) t += red[k];
    float s = 1.0f / sqrtf(t / (float)n + eps);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int i = ct + j * PL_NC * 32;
        if (i >= nv) continue;
        float4 p = u[j][0], q = u[j][1];
        float e[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 8; k++) e[k] = e[k] * s * (w ? w[8 * i + k] : 1.0f);
        xs[i] = pl_pack8(e);
    }
    pl_sync();  /* xs complete; red free again */
}

/* xs = act(gate) * up from hb (gate in [0, I), up in [I, 2 I)), or
 * (act < 0) a plain f32 row of n, in bf16. */
__device__ __forceinline__ void pl_fill(uint4 *xs, const float *src, int n, int act, int ct) {
    for (int i = ct; i < (n >> 3); i += PL_NC * 32) {
        float4 p0 = __ldcg((const float4 *)src + 2 * i), p1 = __ldcg((const float4 *)src + 2 * i + 1);
        float e[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
        if (act >= 0) {
            float4 u0 = __ldcg((const float4 *)(src + n) + 2 * i);
            float4 u1 = __ldcg((const float4 *)(src + n) + 2 * i + 1);
            float u[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
            for (int k = 0; k < 8; k++) {  /* as act_mul_split_kernel */
                float g = e[k];
                if (act == 1) {
                    float in = 0.7978845608028654f * (g + 0.044715f * g * g * g);
                    e[k] = 0.5f * g * (1.0f + tanhf(in)) * u[k];
                } else {
                    e[k] = g / (1.0f + expf(-g)) * u[k];
                }
            }
        }
        xs[i] = pl_pack8(e);
    }
    pl_sync();
}

/* The block's rows of y = W xs (R rows of C columns, W streamed through the
 * ring): y[r] = dot + bias[r], or with xo (the block's own rows of the
 * residual, kept in shared memory) y[r] = xo = xo + (dot + bias[r]). */
__device__ __forceinline__ void pl_gemv(pl_ring &g, int R, int C, const uint4 *xs, float *y,
                                     const float *bias, float *xo, float *psum, int ct) {
    int r0, r1, vpr = C >> 3, rb = C * 2, cr = PL_SB / rb, wps = vpr / PL_VW;
    int lane = ct & 31, wid = ct >> 5;
    pl_rows(R, r0, r1);
    float bv = 0;  /* thread ct's bias, for the chunk rows it sums */
    for (int r = r0; r < r1; r += cr, pl_next(g)) {
        int nr = min(cr, r1 - r);
        float *ps = psum + (g.k & 1) * PL_NC;  /* two sets: a lagging reader keeps its own */
        if (bias && ct < nr) bv = bias[r + ct];
        pl_mbar_wait(&g.full[g.s], g.ph);
        int v0 = wid * PL_VW;
        float d = 0;
        if (v0 < nr * vpr) {
            const uint4 *ws = g.slots + (size_t)g.s * (PL_SB / 16) + v0;
            const uint4 *xv = xs + (v0 % vpr);
            uint4 w4[4], x4[4];
#pragma unroll
            for (int u = 0; u < 4; u++) w4[u] = ws[u * 32 + lane], x4[u] = xv[u * 32 + lane];
            float d2[4];
#pragma unroll
            for (int u = 0; u < 4; u++) d2[u] = pl_dot8(w4[u], x4[u]);
            d = (d2[0] + d2[1]) + (d2[2] + d2[3]);
            for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        }
        if (lane == 0) ps[wid] = d;
        pl_sync();
        if (ct == 0) pl_mbar_arrive(&g.empty[g.s]);  /* every consumer is past the slot */
        if (ct < nr) {
            float v = 0;
            for (int j = 0; j < wps; j++) v += ps[ct * wps + j];
            v += bv;
            if (xo) v = xo[r - r0 + ct] += v;
            y[r + ct] = v;
        }
    }
}

/* q/k norms and rope of one head (128 dims, 4 a lane), as
 * qkv_post_warp_kernel: v holds the head's qkv values plus bias, wn its
 * norm weights (has_nw), c and sn its rope entries (rot). */
__device__ __forceinline__ void pl_head(float (&v)[4], float4 wn, int has_nw, float eps, int rot,
                                        const float (&c)[4], const float (&sn)[4], int lane) {
    if (has_nw) {
        float ss = v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3];
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        float inv = 1.0f / sqrtf(ss / 128.0f + eps);
        v[0] = v[0] * inv * wn.x, v[1] = v[1] * inv * wn.y;
        v[2] = v[2] * inv * wn.z, v[3] = v[3] * inv * wn.w;
    }
    if (rot) {
        int lowh = lane < 16;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float o = __shfl_xor_sync(0xffffffffu, v[e], 16);
            v[e] = lowh ? v[e] * c[e] - o * sn[e] : v[e] * c[e] + o * sn[e];
        }
    }
}

__device__ __forceinline__ float pl_bf(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ void pl_unpack4(uint2 u, float *f) {
    f[0] = __uint_as_float(u.x << 16), f[1] = __uint_as_float(u.x & 0xffff0000u);
    f[2] = __uint_as_float(u.y << 16), f[3] = __uint_as_float(u.y & 0xffff0000u);
}

/* Attention of layer l (its table entry Ly, in shared memory), the block's
 * item (KV head, split of the positions; at most one item a block). What
 * does not depend on this layer's q/k/v (the older K/V rows of the first
 * pass, norm weights, rope entries) loads before the wait for the qkv
 * phase. Shared scratch: q (G, 128), the new k and v, the warps' partials
 * (PL_NC, G, 130). */
template <int G>
__device__ __forceinline__ void pl_attention(const pl_args &a, const loom_cuda_pl_layer *Ly, int l,
                                          int len, float *sc, int ct) {
    int lane = ct & 31, wid = ct >> 5, i0 = lane * 4;
    int pos = len - 1, window = Ly->window;
    int lo = window > 0 ? max(0, pos - window + 1) : 0, span = len - lo, per = PL_NC * PL_MAXP;
    int nsplit = max(1, min((span + per - 1) / per, (int)gridDim.x / a.nkv));
    int split = (span + nsplit - 1) / nsplit;
    float *qs = sc, *kn = qs + G * 128, *vn = kn + 128, *wp = vn + 128;
    __shared__ int last;
    int item = blockIdx.x, kh = item / nsplit, sp = item - kh * nsplit;
    if (item >= a.nkv * nsplit) return;
    int p0 = lo + sp * split, p1 = min(len, p0 + split);
    const __nv_bfloat16 *pk = (const __nv_bfloat16 *)Ly->pk, *pv = (const __nv_bfloat16 *)Ly->pv;
    /* before the wait: this warp's first pass of K/V rows and its head's
     * constants */
    uint2 kr[PL_MAXP], vr[PL_MAXP];
#pragma unroll
    for (int j = 0; j < PL_MAXP; j++) {
        int p = p0 + wid + j * PL_NC;
        kr[j] = vr[j] = make_uint2(0, 0);
        if (p >= p1 || p == pos) continue;
        size_t row = ((size_t)a.tab[p / a.bs] * a.bs + p % a.bs) * a.kv_stride + (size_t)kh * 128;
        kr[j] = *(const uint2 *)(pk + row + i0);
        vr[j] = *(const uint2 *)(pv + row + i0);
    }
    int kind = wid < G ? 0 : wid - G + 1;  /* q, k, v (warps past G + 1: none) */
    int h = kind == 0 ? kh * G + wid : kind == 1 ? a.nh + kh : a.nh + a.nkv + kh;
    const float *nw = kind == 0 ? Ly->q_norm : kind == 1 ? Ly->k_norm : NULL;
    int rot = kind < 2 && a.rot;
    float4 wn = nw && kind < 3 ? *(const float4 *)(nw + i0) : make_float4(1, 1, 1, 1);
    float4 bi = Ly->bqkv && kind < 3 ? *(const float4 *)(Ly->bqkv + (size_t)h * 128 + i0)
                                     : make_float4(0, 0, 0, 0);
    float cr[4] = {1, 1, 1, 1}, sr[4] = {0, 0, 0, 0};
    if (rot)
#pragma unroll
        for (int e = 0; e < 4; e++) cr[e] = Ly->cs[(i0 & 63) + e], sr[e] = Ly->sn[(i0 & 63) + e];
    pl_await(a.cnt + l * PL_PHASES, gridDim.x, ct);
    if (kind < 3) {
        float4 v4 = __ldcg((const float4 *)(a.qkv + (size_t)h * 128 + i0));
        float v[4] = {v4.x + bi.x, v4.y + bi.y, v4.z + bi.z, v4.w + bi.w};
        pl_head(v, wn, nw != NULL, a.eps, rot, cr, sr, lane);
        if (kind == 0) {
            *(float4 *)(qs + wid * 128 + i0) =
                make_float4(v[0] * Ly->scale, v[1] * Ly->scale, v[2] * Ly->scale, v[3] * Ly->scale);
        } else {
            float *dst = kind == 1 ? kn : vn;
            *(float4 *)(dst + i0) = make_float4(pl_bf(v[0]), pl_bf(v[1]), pl_bf(v[2]), pl_bf(v[3]));
            if (sp == 0) {  /* one writer of the new row */
                size_t o = (size_t)a.slot[0] * a.kv_stride + (size_t)kh * 128 + i0;
                __nv_bfloat16 *p = (__nv_bfloat16 *)(kind == 1 ? Ly->pk : Ly->pv) + o;
                *(uint2 *)p = make_uint2(pl_pack(v[0], v[1]), pl_pack(v[2], v[3]));
            }
        }
    }
    pl_sync();
    float m[G], ls[G], acc[G][4], q[G][4];
#pragma unroll
    for (int gq = 0; gq < G; gq++) {
        m[gq] = -INFINITY, ls[gq] = 0;
        float4 q4 = *(const float4 *)(qs + gq * 128 + i0);
        q[gq][0] = q4.x, q[gq][1] = q4.y, q[gq][2] = q4.z, q[gq][3] = q4.w;
#pragma unroll
        for (int e = 0; e < 4; e++) acc[gq][e] = 0;
    }
    for (int pb = p0 + wid; pb < p1; pb += PL_NC * PL_MAXP) {
        if (pb != p0 + wid) {  /* later passes (long spans) load here */
#pragma unroll
            for (int j = 0; j < PL_MAXP; j++) {
                int p = pb + j * PL_NC;
                if (p >= p1 || p == pos) continue;
                size_t row = ((size_t)a.tab[p / a.bs] * a.bs + p % a.bs) * a.kv_stride + (size_t)kh * 128;
                kr[j] = *(const uint2 *)(pk + row + i0);
                vr[j] = *(const uint2 *)(pv + row + i0);
            }
        }
        /* the pass's scores first (independent), then one rescale */
        float k[PL_MAXP][4], vv[PL_MAXP][4], sc4[PL_MAXP][G];
#pragma unroll
        for (int j = 0; j < PL_MAXP; j++) {
            if (pb + j * PL_NC == pos) {
#pragma unroll
                for (int e = 0; e < 4; e++) k[j][e] = kn[i0 + e], vv[j][e] = vn[i0 + e];
            } else {
                pl_unpack4(kr[j], k[j]);
                pl_unpack4(vr[j], vv[j]);
            }
#pragma unroll
            for (int gq = 0; gq < G; gq++)
                sc4[j][gq] = q[gq][0] * k[j][0] + q[gq][1] * k[j][1] + q[gq][2] * k[j][2] +
                             q[gq][3] * k[j][3];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int j = 0; j < PL_MAXP; j++)
#pragma unroll
                for (int gq = 0; gq < G; gq++)
                    sc4[j][gq] += __shfl_xor_sync(0xffffffffu, sc4[j][gq], o);
#pragma unroll
        for (int gq = 0; gq < G; gq++) {
            float mn = m[gq];
#pragma unroll
            for (int j = 0; j < PL_MAXP; j++) {
                sc4[j][gq] = pb + j * PL_NC < p1 ? sc4[j][gq] : -INFINITY;
                mn = fmaxf(mn, sc4[j][gq]);
            }
            float cf = expf(m[gq] - mn);
            ls[gq] *= cf;
#pragma unroll
            for (int x = 0; x < 4; x++) acc[gq][x] *= cf;
#pragma unroll
            for (int j = 0; j < PL_MAXP; j++) {
                float e = expf(sc4[j][gq] - mn);
                ls[gq] += e;
#pragma unroll
                for (int x = 0; x < 4; x++) acc[gq][x] = fmaf(e, vv[j][x], acc[gq][x]);
            }
            m[gq] = mn;
        }
    }
    /* the warps' partials, then the item's */
#pragma unroll
    for (int gq = 0; gq < G; gq++) {
        float *w = wp + (size_t)(wid * G + gq) * PL_WPS;
        if (lane == 0) w[128] = m[gq], w[129] = ls[gq];
        *(float4 *)(w + i0) = make_float4(acc[gq][0], acc[gq][1], acc[gq][2], acc[gq][3]);
    }
    pl_sync();
    for (int i = ct; i < G * 128; i += PL_NC * 32) {
        int gq = i >> 7, d = i & 127;
        float M = -INFINITY, Ls = 0, A = 0;
#pragma unroll 1
        for (int w = 0; w < PL_NC; w++) {
            const float *pw = wp + (size_t)(w * G + gq) * PL_WPS;
            if (pw[129] > 0) M = fmaxf(M, pw[128]);
        }
#pragma unroll 1
        for (int w = 0; w < PL_NC; w++) {
            const float *pw = wp + (size_t)(w * G + gq) * PL_WPS;
            if (pw[129] > 0) {
                float e = expf(pw[128] - M);
                Ls += pw[129] * e;
                A += pw[d] * e;
            }
        }
        if (nsplit == 1) {
            a.att[(size_t)(kh * G + gq) * 128 + d] = Ls > 0 ? A / Ls : 0.0f;
        } else {
            float *pp = a.part + ((size_t)(kh * nsplit + sp) * G + gq) * 130;
            pp[d] = A;
            if (d == 0) pp[128] = M, pp[129] = Ls;
        }
    }
    if (nsplit > 1) {
        /* the last split of this KV head to finish combines them */
        pl_sync();
        if (ct == 0) {
            __threadfence();
            last = atomicAdd(a.cnt + PL_PHASES * a.L + l * a.nkv + kh, 1) == nsplit - 1;
            __threadfence();
        }
        pl_sync();
        if (!last) return;
        for (int i = ct; i < G * 128; i += PL_NC * 32) {
            int gq = i >> 7, d = i & 127;
            float M = -INFINITY, Ls = 0, A = 0;
#pragma unroll 1
            for (int s2 = 0; s2 < nsplit; s2++) {
                const float *pp = a.part + ((size_t)(kh * nsplit + s2) * G + gq) * 130;
                if (__ldcg(pp + 129) > 0) M = fmaxf(M, __ldcg(pp + 128));
            }
#pragma unroll 1
            for (int s2 = 0; s2 < nsplit; s2++) {
                const float *pp = a.part + ((size_t)(kh * nsplit + s2) * G + gq) * 130;
                float l2 = __ldcg(pp + 129);
                if (l2 > 0) {
                    float e = expf(__ldcg(pp + 128) - M);
                    Ls += l2 * e;
                    A += __ldcg(pp + d) * e;
                }
            }
            a.att[(size_t)(kh * G + gq) * 128 + d] = Ls > 0 ? A / Ls : 0.0f;
        }
        pl_sync();
    }
    pl_signal(a.cnt + l * PL_PHASES + 1, ct);
}

template <int G>
__global__ void __launch_bounds__(PL_THREADS, 1) pl_kernel(const pl_args a) {
    extern __shared__ __align__(128) unsigned char smem[];
    /* ring, mbarriers, partial sums, norm sums, the block's residual rows,
     * the layer table, then the GEMV input (or the attention scratch) */
    pl_ring g;
    g.slots = (const uint4 *)smem;
    g.ns = a.ns;
    g.s = 0, g.ph = 0, g.k = 0;
    unsigned char *p = smem + (size_t)a.ns * PL_SB;
    g.full = (unsigned long long *)p;
    g.empty = g.full + a.ns;
    p += 2 * 8 * (size_t)a.ns;
    float *psum = (float *)p;          /* 2 x PL_NC */
    float *red = psum + 2 * PL_NC;     /* PL_NC */
    float *xo = red + PL_NC;           /* PL_YBR: rows [r0, r1) of x */
    loom_cuda_pl_layer *lt = (loom_cuda_pl_layer *)(((uintptr_t)(xo + PL_YBR) + 15) & ~(uintptr_t)15);
    uint4 *xs = (uint4 *)(((uintptr_t)(lt + a.L) + 15) & ~(uintptr_t)15);
    float *sc = (float *)xs;           /* attention scratch shares it */
    if (threadIdx.x == 0) {
        for (int i = 0; i < a.ns; i++) pl_mbar_init(&g.full[i], 1), pl_mbar_init(&g.empty[i], 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) pl_produce(a, g);
        return;
    }
    int ct = threadIdx.x - 32;
    /* the layer table into shared memory: no global load of a pointer or
     * scale on any phase's path */
    for (int i = ct; i < a.L * (int)(sizeof *lt / 4); i += PL_NC * 32)
        ((int *)lt)[i] = ((const int *)a.layers)[i];
    pdl_wait();  /* x (the embedding), the rope table and the step's integers */
    int h0, h1;
    pl_rows(a.H, h0, h1);
    for (int i = ct; i < h1 - h0; i += PL_NC * 32) xo[i] = __ldcg(a.x + h0 + i);
    int len = a.lens[0];
    pl_sync();
    /* One call site per phase function: the layer's code stays small enough
     * for the instruction cache. Counters a layer: [0] qkv rows, [1] KV
     * heads attended, [2] o rows, [3] gate/up rows, [4] down rows. */
    int nb = gridDim.x;
    for (int l = 0; l < a.L; l++) {
        const loom_cuda_pl_layer *Ly = &lt[l];
        int *c = a.cnt + l * PL_PHASES;
        for (int ph = 0; ph < 4; ph++) {
            /* what the phase reads: x after the last down, the attention,
             * x after o, gate/up */
            if (ph > 0 || l > 0)
                pl_await(ph == 0 ? c - 1 : c + ph, ph == 1 ? a.nkv : nb, ct);
            if (ph == 0 || ph == 2)
                pl_fill_norm(xs, a.x, ph ? Ly->ffn_norm : Ly->attn_norm, a.H, a.eps, red, ct);
            else
                pl_fill(xs, ph == 1 ? a.att : a.hb, ph == 1 ? a.qd : a.I, ph == 1 ? -1 : a.gelu, ct);
            int R = ph == 0 ? a.qd + 2 * a.kvd : ph == 2 ? 2 * a.I : a.H;
            int C = ph == 1 ? a.qd : ph == 3 ? a.I : a.H;
            float *y = ph == 0 ? a.qkv : ph == 2 ? a.hb : a.x;
            pl_gemv(g, R, C, xs, y, ph == 1 ? Ly->bo : NULL, ph & 1 ? xo : NULL, psum, ct);
            pl_signal(c + (ph ? ph + 1 : 0), ct);
            if (ph == 0) pl_attention<G>(a, Ly, l, len, sc, ct);
        }
    }
    pdl_trigger();
    /* the last block out clears the counters for the next step */
    __shared__ int done;
    pl_sync();
    if (ct == 0) {
        int *end = a.cnt + PL_PHASES * a.L + a.L * a.nkv;
        done = atomicAdd(end, 1) == (int)gridDim.x - 1;
    }
    pl_sync();
    if (done) {
        int n = PL_PHASES * a.L + a.L * a.nkv + 1;
        for (int i = ct; i < n; i += PL_NC * 32) a.cnt[i] = 0;
    }
}

/* ---- host side ------------------------------------------------------------ */

static size_t pl_scratch_bytes(const loom_cuda_pl_shape *s) {
    int group = s->n_heads / s->n_kv_heads;
    size_t xs = (size_t)LOOM_MAX_I(s->hidden, LOOM_MAX_I(s->q_dim, s->inter)) * 2;
    size_t att = ((size_t)group * 128 + 256 + (size_t)PL_NC * group * PL_WPS) * 4;
    return (xs > att ? xs : att) + 16;
}

static size_t pl_fixed_bytes(const loom_cuda_pl_shape *s) {
    return (3 * PL_NC + PL_YBR) * 4 + 16 + (size_t)s->n_layers * sizeof(loom_cuda_pl_layer) +
           pl_scratch_bytes(s);
}

extern "C" int loom_cuda_persist_slots(const loom_cuda *c, const loom_cuda_pl_shape *s) {
    if (c->cc < 90 || s->head_dim != 128 || (s->rot_dim != 0 && s->rot_dim != 128) ||
        s->n_kv_heads <= 0 || s->n_heads % s->n_kv_heads || s->n_heads / s->n_kv_heads > PL_GMAX ||
        s->n_heads / s->n_kv_heads + 2 > PL_NC || s->q_dim != s->n_heads * 128 ||
        (s->n_heads / s->n_kv_heads & (s->n_heads / s->n_kv_heads - 1)))  /* 1, 2, 4 */
        return 0;
    const int cols[3] = {s->hidden, s->q_dim, s->inter};
    for (int i = 0; i < 3; i++)  /* a warp's 128 vectors within one row; a row within a slot */
        if (cols[i] <= 0 || cols[i] % (8 * PL_VW) || cols[i] * 2 > PL_SB) return 0;
    if (s->hidden > 2 * 8 * PL_NC * 32) return 0;
    int rmax = LOOM_MAX_I(s->q_dim + 2 * s->n_kv_heads * 128, LOOM_MAX_I(2 * s->inter, s->hidden));
    if ((rmax + c->n_sm - 1) / c->n_sm > PL_YBR) return 0;
    size_t fixed = pl_fixed_bytes(s);
    if (c->smem_optin <= fixed) return 0;
    int ns = (int)((c->smem_optin - fixed) / (PL_SB + 16));
    ns = ns > 8 ? 8 : ns;
    return ns >= 4 ? ns : 0;
}

extern "C" size_t loom_cuda_persist_part_floats(const loom_cuda *c, const loom_cuda_pl_shape *s) {
    return (size_t)c->n_sm * (size_t)(s->n_heads / s->n_kv_heads) * 130;
}

extern "C" size_t loom_cuda_persist_counters(const loom_cuda_pl_shape *s) {
    return (size_t)PL_PHASES * s->n_layers + (size_t)s->n_layers * s->n_kv_heads + 1;
}

extern "C" loom_status loom_cuda_persist_decode(loom_cuda *c, const loom_cuda_pl_shape *s,
                                                const loom_cuda_pl_layer *d_layers,
                                                const loom_cuda_pl_bufs *b) {
    int ns = loom_cuda_persist_slots(c, s);
    if (!ns)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda persist: shape not supported (hidden %d, "
                        "q %d, inter %d, heads %d/%d)", s->hidden, s->q_dim, s->inter,
                        s->n_heads, s->n_kv_heads);
    size_t smem = (size_t)ns * (PL_SB + 16) + pl_fixed_bytes(s);
    int G = s->n_heads / s->n_kv_heads;
    void (*k)(const pl_args) = G == 1 ? pl_kernel<1> : G == 2 ? pl_kernel<2> : pl_kernel<4>;
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    pl_args a;
    a.layers = d_layers;
    a.L = s->n_layers, a.H = s->hidden, a.nh = s->n_heads, a.nkv = s->n_kv_heads;
    a.I = s->inter, a.qd = s->q_dim, a.kvd = s->n_kv_heads * 128, a.rot = s->rot_dim;
    a.gelu = s->gelu, a.bs = s->block_size, a.ns = ns;
    a.eps = s->eps;
    a.kv_stride = s->kv_stride;
    a.x = b->x, a.qkv = b->qkv, a.att = b->att, a.hb = b->hb, a.part = b->part;
    a.cnt = b->counters;
    a.slot = b->slot, a.tab = b->tab, a.lens = b->lens;
    CUDA_CHECK(loom_cuda_launch(c, k, dim3((unsigned)c->n_sm), dim3(PL_THREADS), smem, a));
    return LOOM_OK;
}
