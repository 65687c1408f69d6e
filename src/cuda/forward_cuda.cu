/* forward_cuda: the dense decoder (Llama, Mistral, Qwen2, Qwen3, Gemma 2,
 * 3 and 4 and the like) and Qwen3-MoE on the GPU, computing what
 * src/model/forward.c computes for the same rows:
 *
 *   embed (* scale) [-> per-layer inputs] -> per layer: rmsnorm -> q/k/v
 *   (+ bias) -> q/k [/v] norms -> rope (per layer kind) -> K/V rows into
 *   the device KV pool -> paged attention (window, softcap) -> o [-> post
 *   norm] -> residual -> rmsnorm -> gate/up -> act * up -> down [-> post
 *   norm] -> residual [-> per-layer input block] [* layer scalar]
 *   -> final norm and head (-> softcap) on the tokens whose logits are wanted.
 *
 * Gemma 4's pieces (ple_inputs, layer_end, the unfused q/k/v path): a
 * layer that shares KV (num_kv_shared_layers) projects q only and its
 * attention reads the rows of the layer it shares with, in the device
 * pool; attention_k_eq_v layers take their values from the raw keys; the
 * MoE block beside the MLP (moe_beside) runs the routed experts' kernels
 * on its own router input, scales and norms.
 *
 * A MoE layer replaces gate/up -> down by moe_ffn below (kernels_moe.cu):
 * the router and routing on the device, then the chosen experts (grouped
 * GEMMs over the step's pairs bucketed by expert, or a GEMV per pair for a
 * few tokens) adding into the residual, with the normed row in f32 as the
 * CPU takes it. Its grids depend on the token count only, so MoE decode
 * steps are captured into graphs like dense ones.
 *
 * Weights are uploaded once (loom_cuda_model_create); the host model stays
 * the owner of the mapping. The device holds its own K/V rows in the exact
 * layout of the host pool (same n_layers, n_blocks, block_size, row bytes),
 * so the host KV pool keeps doing all the bookkeeping (block tables,
 * reference counts, prefix cache) and only its k/v bytes go unused.
 * Activations are carved once for step_tokens; the logits buffer grows on
 * demand. Unsupported model features are refused at create time, naming
 * the feature.
 *
 * One step = one host-to-device copy of the step's integers (token ids, KV
 * slots, positions, block tables; pinned staging), the device work (rope
 * tables are made on the device from the positions), the copies of the
 * results back, and one synchronisation. Decode steps (one token per row)
 * are captured into CUDA graphs keyed by (rows, block-table width rounded
 * up to 16 blocks) and replayed: every per-step value they read lives in
 * the integer buffer, every pointer they hold is fixed. The first step of a
 * key runs eagerly (growing scratch and logits to size), the second
 * captures. A graph is dropped when scratch or logits move. Rows marked in
 * `picks` get the argmax computed on the device and copied back alone.
 * LOOM_CUDA_GRAPHS=0 in the environment turns graphs off.
 *
 * Steps of a few tokens (decode at small batch) are bound by the weight
 * reads and by the count of kernels: with 16-bit weights a layer is then
 * six kernels, qkv GEMV -> qkv_post -> attention -> o GEMV -> gate/up
 * GEMV -> down GEMV (LOOM_CUDA_ATTN_QKV=1: five in decode, the cluster
 * attention taking qkv_post's work, loom_cuda_attn_decode_qkv; off by
 * default, slower on an H200: see attn_qkv below), where each GEMV (loom_cuda_gemv) makes its own input
 * (RMSNorm of x, the f32 attention output rounded, act(gate) * up) and o
 * and down add straight into the residual x. Kernels launched with
 * programmatic dependent launch (sm_90) start while the one before drains
 * and pull small weight matrices into L2 before waiting for it.
 * LOOM_CUDA_GEMV_T=n moves the token count up to which the GEMV replaces
 * cuBLAS (default 2, 0 = never); LOOM_CUDA_PDL=0 turns that launch off. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_int.cuh"
#include "cuda/tuning.h"

/* The model headers are C without extern "C" guards of their own. */
extern "C" {
#include "base/base.h"
#include "model/forward.h"
#include "model/kv_layout.h"
#include "model/linear_attn.h"
#include "model/model.h"
}

/* ---- small kernels ------------------------------------------------------ */

__global__ void fw_add_bias(float *y, const float *b, size_t total, int n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) y[i] += b[i % n];
}

__global__ void fw_add(float *x, const float *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void fw_softcap(float *x, size_t n, float cap) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}

/* K and V rows of this step's tokens into the pool: token t goes to row
 * slot[t] (= block * block_size + position % block_size) of the layer. */
__global__ void fw_kv_store(void *pk, void *pv, int dt, size_t stride, const float *k,
                            const float *v, const int32_t *slot, int kvd) {
    int t = blockIdx.y;
    size_t row = (size_t)slot[t] * stride;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kvd; i += gridDim.x * blockDim.x) {
        float a = k[(size_t)t * kvd + i], b = v[(size_t)t * kvd + i];
        if (dt == LOOM_CUDA_F32) {
            ((float *)pk)[row + i] = a;
            ((float *)pv)[row + i] = b;
        } else if (dt == LOOM_CUDA_F16) {
            ((__half *)pk)[row + i] = __float2half_rn(a);
            ((__half *)pv)[row + i] = __float2half_rn(b);
        } else {
            ((__nv_bfloat16 *)pk)[row + i] = __float2bfloat16_rn(a);
            ((__nv_bfloat16 *)pv)[row + i] = __float2bfloat16_rn(b);
        }
    }
}

/* dst[j] = src[idx[j]] (rows of n floats). */
__global__ void fw_gather(float *dst, const float *src, const int32_t *idx, int n) {
    int j = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        dst[(size_t)j * n + i] = src[(size_t)idx[j] * n + i];
}

/* Embedding rows of an MLX affine-quantized table, times scale. */
__global__ void fw_embed_q(float *out, const uint32_t *w, const unsigned short *sc,
                           const unsigned short *bi, int cols, int bits, int group, int f16,
                           const int32_t *ids, float scale) {
    int t = blockIdx.y;
    size_t id = (size_t)ids[t], words = (size_t)cols * bits / 32;
    int ng = cols / group;
    const uint32_t *row = w + id * words;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < cols; k += gridDim.x * blockDim.x) {
        size_t bit = (size_t)k * bits;
        unsigned sh = (unsigned)(bit % 32);
        unsigned long long v = row[bit / 32] >> sh;
        if (sh + (unsigned)bits > 32) v |= (unsigned long long)row[bit / 32 + 1] << (32 - sh);
        unsigned short s = sc[id * ng + k / group], b = bi[id * ng + k / group];
        float fs = f16 ? __half2float(__ushort_as_half(s)) : __uint_as_float((unsigned)s << 16);
        float fb = f16 ? __half2float(__ushort_as_half(b)) : __uint_as_float((unsigned)b << 16);
        out[(size_t)t * cols + k] = (fs * (float)(v & ((1ull << bits) - 1)) + fb) * scale;
    }
}

/* Embedding rows of an FP8 table (ops.h's loom_f8mat layout), times scale. */
__global__ void fw_embed_f8(float *out, const unsigned char *w, const float *scales, int cols,
                            int br, int bc, const int32_t *ids, float scale) {
    int t = blockIdx.y;
    size_t id = (size_t)ids[t];
    int sc = (cols + bc - 1) / bc;
    const float *sr = scales + (id / br) * sc;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < cols; k += gridDim.x * blockDim.x) {
        __nv_fp8_e4m3 v;
        v.__x = w[id * cols + k];
        out[(size_t)t * cols + k] = float(v) * sr[k / bc] * scale;
    }
}

/* ---- the model on the device -------------------------------------------- */

/* Graph slots: decode keys, and verification steps' (one per token count
 * a speculating row may carry, up to a drafter's block of 16). */
#define FW_GRAPHS 32
/* Layers whose hidden states one forward exports at most. */
#define FW_TAPS_MAX 16

typedef struct dweight {
    int rows, cols;
    int quant;                 /* 1: qm or (f8) fm, else dense d of dt */
    int f8;                    /* 1: FP8 with block scales (fm) */
    loom_cuda_dtype dt;
    const void *d;             /* device (rows, cols) */
    loom_cuda_qmat qm;         /* device pointers */
    loom_cuda_f8mat fm;        /* device pointers */
} dweight;

typedef struct dlayer {
    dweight wq, wk, wv, wo, gate, up, down;
    dweight wqkv;              /* (q_dim + 2 * kv_dim, hidden): wq, wk, wv rows, when fused */
    int fused_qkv;             /* 1: wqkv and qkv_post replace the three GEMMs and the rest */
    const float *bqkv;         /* device [q_dim + 2 * kv_dim] bias (zeros where absent), or NULL */
    dweight gate_up;           /* (2 * inter, hidden): gate rows then up rows, when fused */
    int fused_gu;              /* 1: gate_up is used instead of gate and up */
    const float *attn_norm, *ffn_norm, *q_norm, *k_norm;  /* device or NULL */
    const float *post_attn_norm, *post_ffn_norm;  /* device sandwich norms, or NULL */
    const float *bq, *bk, *bv, *bo;
    /* routed experts instead of the MLP (Qwen3-MoE; kernels_moe.cu) */
    int moe;                   /* 1: the fields below replace gate_up/down */
    int renorm;                /* top-k weights divided by their sum */
    int moe_inter;             /* each expert's width */
    dweight router;            /* (n_experts, hidden), dense */
    const void *egu;           /* device (n_experts, 2 * moe_inter, hidden) of edt: expert e's
                                  gate rows, then its up rows */
    const void *edown;         /* device (n_experts, hidden, moe_inter) of edt */
    loom_cuda_dtype edt;
    dweight sgu, sdown;        /* shared expert: (2 * inter, hidden) gate | up, (hidden, inter);
                                  sgu.rows 0 = none */
    dweight sgate;             /* (1, hidden): its sigmoid gate */
    int gated;                 /* q_proj yields [query | gate] per head (Qwen3.5, Qwen3-Next) */
    /* a Gated DeltaNet token mixer instead of attention (kernels_lin.cu) */
    int lin;                   /* 1: the fields below replace the attention's */
    int lin_fused;             /* in_qkvz/in_ba grouped by key head (Qwen3-Next) */
    int lin_slot;              /* index among the linear layers (recurrent state) */
    dweight in_qkv, in_z, in_b, in_a, in_qkvz, in_ba, lin_out;
    const float *conv_w;       /* device (conv_dim, kernel) */
    const float *neg_a, *dt_bias;  /* device [n_v] */
    const float *lin_norm;     /* device [v_dim] gated RMSNorm weight */
    /* Gemma 4 */
    int kv_layer;              /* layer whose K/V rows the attention reads (itself unless
                                  shared; a sharing layer projects and stores none) */
    int k_eq_v;                /* no v_proj: values are the keys before their norm and rope */
    int v_norm;                /* unweighted RMSNorm on each value head */
    dweight ple_gate, ple_proj;/* (ple_dim, hidden), (hidden, ple_dim); rows 0 = none */
    const float *ple_norm;     /* device [hidden] after ple_proj */
    float out_scale;           /* layer_scalar: x *= it at the layer's end (1: none) */
    /* Gemma 4's MoE block beside the dense MLP (the routed fields above, moe 0) */
    int beside;
    const float *post_ffn_norm1;   /* device [hidden] after the dense MLP */
    const float *pre_moe_norm, *post_moe_norm;  /* device [hidden] around the experts */
    const float *moe_in_scale;     /* device [hidden] router input scale (times hidden^-0.5) */
    const float *moe_expert_scale; /* device [n_experts] on the routing weights */
} dlayer;

struct loom_cuda_model {
    loom_cuda *c;              /* borrowed */
    const loom_model *m;       /* borrowed */
    int step_tokens, max_ctx;
    void **allocs;             /* owned device allocations */
    int n_allocs, cap_allocs;
    dweight embed, lm_head;
    const float *final_norm;
    dlayer *layers;            /* owned [n_layers] */
    /* Gemma 4's per-layer inputs (model/ple.c; has_ple models only) */
    dweight ple_embed;         /* (vocab, n_layers * ple_dim) */
    dweight ple_model_proj;    /* (n_layers * ple_dim, hidden) */
    const float *ple_proj_norm;/* device [ple_dim] */
    float *ple_in;             /* (step_tokens, n_layers * ple_dim) every layer's input */
    float *ple_e;              /* (step_tokens, n_layers * ple_dim) the tokens' table rows */
    float *ple_tmp;            /* (step_tokens, ple_dim) */
    /* device KV: (n_layers, n_blocks, block_size) rows of row_bytes, as the host pool */
    void *kv_k, *kv_v;
    int kv_blocks, kv_bs;
    size_t kv_row_bytes;
    loom_cuda_dtype kv_dt;
    /* activations (device) */
    float *x, *xb;             /* (step_tokens, hidden) */
    float *q, *att;            /* (step_tokens, n_heads * head_dim) */
    float *qkv;                /* (step_tokens, q_dim + 2 * kv_dim) fused projection output */
    float *k, *v;              /* (step_tokens, kv_dim) */
    float *hb, *hb2;           /* (step_tokens, 2 * inter), (step_tokens, inter) */
    loom_cuda_dtype act16;     /* F16/BF16: GEMM inputs made in that type by the kernel
                                  before (all q/k/v, gate_up, down weights of it); F32: off */
    int gemv_t;                /* steps of up to this many tokens take loom_cuda_gemv for
                                  16-bit weights (LOOM_CUDA_GEMV_T, default 2; 0: cuBLAS only) */
    int gu16;                  /* 1: the gate/up GEMM writes bf16 for the activation (bf16
                                  weights; LOOM_CUDA_GU16=0: f32) */
    int qkv16;                 /* 1: the q/k/v GEMM writes bf16 for qkv_post (bf16 weights,
                                  cuBLAS steps; LOOM_CUDA_QKV16=0: f32) */
    int attn_qkv;              /* 1: small decode steps fold qkv_post into the cluster
                                  attention (LOOM_CUDA_ATTN_QKV=1; default 0: two kernels) */
    int f8_f32;                /* 1: FP8 prompts through f32 SGEMM (LOOM_CUDA_F8_F32=1), not
                                  bf16 tensor cores */
    int head_am;               /* 1: the greedy picks inside the head's GEMV where it takes
                                  the step (LOOM_CUDA_HEAD_AM, 1; 0: the argmax kernel) */
    int lin_chunk;             /* rows of this many tokens or more take the chunked delta
                                  rule (LOOM_CUDA_LIN_CHUNK; 0, the default: token by token) */
    int small_t;               /* up to this many tokens (and gemv_t) a layer is 4 GEMVs that
                                  make their own inputs + qkv_post + attention; 0: never */
    void *a16;                 /* (step_tokens, max(hidden, inter)) of act16 */
    /* routed experts' scratch (device; MoE models only), K = experts a token */
    float *m_logits;           /* (step_tokens, n_experts) router logits, then the shared
                                  expert's gate */
    int32_t *m_sel;            /* (step_tokens, K) chosen experts */
    float *m_wt;               /* (step_tokens, K) their weights */
    int32_t *m_plan;           /* loom_cuda_moe_plan_ints(step_tokens, K, n_experts) */
    float *m_hb;               /* (step_tokens, max(K * 2 moe_inter, 2 shared inter)) gate | up */
    float *m_ab;               /* (step_tokens, max(K * moe_inter, shared inter)) act * up */
    float *m_y;                /* (step_tokens, K, hidden) each pair's expert output */
    float *m_rin, *m_sum;      /* (step_tokens, hidden) Gemma 4's router, then expert input;
                                  the experts' sum (MoE blocks beside an MLP only) */
    /* gated attention (device; models with the output gate only) */
    float *qraw;               /* (step_tokens, 2 * n_heads * head_dim) [query | gate] per head */
    float *gate;               /* (step_tokens, n_heads * head_dim) */
    /* linear attention's scratch (device; hybrid models only) */
    float *l_qkv, *l_conv;     /* (step_tokens, conv_dim) conv input, conv output then normed */
    float *l_z, *l_o, *l_y;    /* (step_tokens, n_v * v_dim) gate z, delta-rule output, normed */
    float *l_b, *l_a;          /* (step_tokens, n_v) */
    float *l_beta, *l_g;       /* (step_tokens, n_v) */
    float *l_raw;              /* (step_tokens, in_qkvz rows) grouped projections, or NULL */
    float *l_raw_ba;           /* (step_tokens, 2 n_v), or NULL */
    /* Recurrent states on the device: one slot per bound host state (the
     * slot's buffer is the layout of loom_seq_state_save: conv states of
     * every linear layer, then delta-rule states), kept for reuse when
     * the state is freed. d_sptr [step_tokens] holds the step's rows' slot
     * pointers (fixed address: decode graphs read it), staged in h_sptr. */
    loom_seq_state_dev sdev;   /* the hooks the states call (first: container of g) */
    struct dslot {
        loom_seq_state *st;    /* borrowed; NULL: free */
        float *d;              /* owned (one of allocs) */
    } *slots;                  /* owned [n_slots] */
    int n_slots;
    size_t conv_n, rec_n;      /* floats of a slot's two parts */
    float **d_sptr;            /* device [step_tokens] */
    float **h_sptr;            /* pinned [step_tokens] */
    float *cs, *sn;            /* (n_ropes, step_tokens, max_half) */
    int max_half;
    const double *inv_freq[LOOM_MAX_ROPES]; /* device [rot_dim / 2] per rope */
    const unsigned char *stream[LOOM_MAX_ROPES]; /* device [rot_dim / 2]: M-RoPE's streams, or NULL */
    float *d_deep;             /* (step_tokens, hidden): deepstack rows, made when first asked */
    loom_cuda_tp *tp;          /* borrowed: the ranks this shard sums with, or NULL */
    int tp_rank;
    float *logits;             /* (logits_rows, vocab), grown */
    int logits_rows;
    unsigned logits_gen;       /* bumped when logits moves */
    int32_t *ints;             /* device twin of h_ints */
    size_t ints_cap;
    int32_t *ids;              /* device argmax per logits row [ids_cap] */
    int32_t *sids;             /* device sampled token per logits row [ids_cap] */
    loom_sample_pick *samp;    /* device sampling parameters per logits row [ids_cap] */
    int ids_cap;
    /* host staging (pinned: the copies are asynchronous) */
    int32_t *h_ints;           /* owned, ints_cap */
    int32_t *h_ids;            /* owned, ids_cap */
    int32_t *h_sids;           /* owned, ids_cap */
    loom_sample_pick *h_samp;  /* owned, ids_cap */
    /* hidden states exported for a drafter (loom_cuda_set_taps) */
    int n_taps;
    int tap_layers[FW_TAPS_MAX];
    float *d_taps;             /* (step_tokens, n_taps * hidden) device, grown */
    size_t taps_cap;           /* floats d_taps holds */
    float *taps_out;           /* borrowed host (tokens, n_taps * hidden), or NULL: off */
    /* decode graphs */
    int use_graphs;
    struct fw_graph {
        int n_rows, tstride;   /* the key: attention sequences, table width, */
        int verify, taps;      /* verification numerics, hidden states exported */
        int state;             /* 0 free, 1 seen once (eager), 2 captured, -1 refused */
        unsigned sgen, lgen;   /* scratch_gen / logits_gen at capture */
        cudaGraphExec_t exec;  /* owned when state == 2 */
        unsigned long long used;
    } graphs[FW_GRAPHS];
    unsigned long long clock;
    /* LOOM_CUDA_STEP_TIMES=1: where a decode step's wall time goes (see st_*) */
    int st_on, st_cur, st_rows, st_replayed;
    cudaEvent_t st_ev[2][3];    /* ping-pong: before the upload, after the body, after the copies */
    double st_prev_enter, st_sum[6];
    long st_n;
};

static loom_status g_alloc(loom_cuda_model *g, void **d, size_t n) {
    if (g->n_allocs == g->cap_allocs) {
        int cap = g->cap_allocs ? 2 * g->cap_allocs : 64;
        void **na = (void **)realloc(g->allocs, sizeof *na * (size_t)cap);
        if (!na) return loom_err(LOOM_ERR_NOMEM, "out of memory");
        g->allocs = na;
        g->cap_allocs = cap;
    }
    loom_status st = loom_cuda_alloc(g->c, d, n ? n : 16);
    if (st == LOOM_OK) g->allocs[g->n_allocs++] = *d;
    return st;
}

/* Frees one of g's allocations early (a weight copied into a fused one). */
static void g_release(loom_cuda_model *g, const void *d) {
    for (int i = 0; i < g->n_allocs; i++)
        if (g->allocs[i] == d) {
            loom_cuda_release(g->c, g->allocs[i]);
            g->allocs[i] = g->allocs[--g->n_allocs];
            return;
        }
}

static loom_status d2d(void *dst, const void *src, size_t n) {
    CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice));
    return LOOM_OK;
}

static loom_status g_upload(loom_cuda_model *g, const void **d, const void *src, size_t n) {
    void *p;
    loom_status st = g_alloc(g, &p, n);
    if (st == LOOM_OK) st = loom_cuda_upload(g->c, p, src, n);
    *d = p;
    return st;
}

static loom_status up_vec(loom_cuda_model *g, const float **d, const float *v, int n) {
    *d = NULL;
    if (!v) return LOOM_OK;
    return g_upload(g, (const void **)d, v, (size_t)n * sizeof(float));
}

static loom_status up_weight(loom_cuda_model *g, dweight *dw, const loom_weight *w,
                             const char *what) {
    memset(dw, 0, sizeof *dw);
    dw->rows = w->rows;
    dw->cols = w->cols;
    size_t n = (size_t)w->rows * w->cols;
    switch (w->dtype) {
    case LOOM_DT_F32: dw->dt = LOOM_CUDA_F32; return g_upload(g, &dw->d, w->data, n * 4);
    case LOOM_DT_F16: dw->dt = LOOM_CUDA_F16; return g_upload(g, &dw->d, w->data, n * 2);
    case LOOM_DT_BF16: dw->dt = LOOM_CUDA_BF16; return g_upload(g, &dw->d, w->data, n * 2);
    case LOOM_DT_U32: {
        const loom_qmat *q = &w->q;
        size_t ng = (size_t)w->rows * (q->n / q->group);
        dw->quant = 1;
        dw->qm.rows = w->rows;
        dw->qm.cols = q->n;
        dw->qm.bits = q->bits;
        dw->qm.group = q->group;
        dw->qm.f16 = q->f16;
        loom_status st = g_upload(g, (const void **)&dw->qm.d_w, q->w,
                                  (size_t)w->rows * q->n * q->bits / 32 * 4);
        if (st == LOOM_OK) st = g_upload(g, (const void **)&dw->qm.d_scales, q->scales, ng * 2);
        if (st == LOOM_OK) st = g_upload(g, (const void **)&dw->qm.d_biases, q->biases, ng * 2);
        return st;
    }
    case LOOM_DT_F8_E4M3: {
        /* FP8 weights take the f32 path, as MLX-quantized ones (quant) */
        const loom_f8mat *f = &w->f8;
        size_t ns = (size_t)((w->rows + f->br - 1) / f->br) * loom_f8_scale_cols(f);
        dw->quant = dw->f8 = 1;
        loom_cuda_f8mat fm = {NULL, NULL, w->rows, w->cols, f->br, f->bc};
        dw->fm = fm;
        loom_status st = g_upload(g, (const void **)&dw->fm.d_w, f->w, n);
        if (st == LOOM_OK) st = g_upload(g, (const void **)&dw->fm.d_scales, f->scales, ns * 4);
        return st;
    }
    default:
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda forward: weight %s has dtype %d (expected "
                        "F32, F16, BF16, MLX-quantized U32 or F8_E4M3)", what, (int)w->dtype);
    }
}

/* Whether w takes loom_cuda_gemv for T tokens. */
static int use_gemv(const loom_cuda_model *g, const dweight *w, int T) {
    return !w->quant && T <= g->gemv_t && T <= loom_cuda_gemv_max_tokens(g->c, w->dt, w->cols);
}

/* y (T, w->rows) = x made by mode @ w^T (+ bias), or y += that when acc. */
static loom_status gemv(loom_cuda_model *g, float *y, loom_cuda_gemv_mode mode, const void *x,
                        const float *norm, const dweight *w, const float *bias, int T, int acc) {
    loom_cuda_gemv_in in = {mode, x, norm, (float)g->m->cfg.rms_eps};
    return loom_cuda_gemv(g->c, y, &in, w->d, w->dt, T, w->rows, w->cols, bias, acc);
}

/* y (T, w->rows) = a16 (T, w->cols) @ w^T (+ bias): the input already in
 * the weight's 16-bit type. */
static loom_status linear16(loom_cuda_model *g, float *y, const dweight *w, const float *bias,
                            int T) {
    if (use_gemv(g, w, T)) return gemv(g, y, LOOM_CUDA_GEMV_X16, g->a16, NULL, w, bias, T, 0);
    loom_status st = loom_cuda_gemm16(g->c, y, g->a16, w->d, w->dt, T, w->rows, w->cols);
    if (st != LOOM_OK || !bias) return st;
    size_t total = (size_t)T * w->rows;
    fw_add_bias<<<loom_cuda_blocks(total, 256), 256, 0, g->c->stream>>>(y, bias, total, w->rows);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* y (T, w->rows) = x (T, w->cols) @ w^T (+ bias). */
static loom_status linear(loom_cuda_model *g, float *y, const float *x, const dweight *w,
                          const float *bias, int T) {
    if (use_gemv(g, w, T)) return gemv(g, y, LOOM_CUDA_GEMV_F32, x, NULL, w, bias, T, 0);
    loom_status st = w->f8 ? loom_cuda_matmul_f8(g->c, y, x, &w->fm, T, g->f8_f32)
                     : w->quant ? loom_cuda_matmul_q(g->c, y, x, &w->qm, T)
                                : loom_cuda_gemm(g->c, y, x, w->d, w->dt, T, w->rows, w->cols);
    if (st != LOOM_OK || !bias) return st;
    size_t total = (size_t)T * w->rows;
    fw_add_bias<<<loom_cuda_blocks(total, 256), 256, 0, g->c->stream>>>(y, bias, total, w->rows);
    LAUNCH_CHECK();
    return LOOM_OK;
}

static void st_flush(loom_cuda_model *g);

static loom_cuda_model *of_sdev(loom_seq_state_dev *d) {
    return (loom_cuda_model *)((char *)d - offsetof(loom_cuda_model, sdev));
}

/* loom_seq_state_dev.pull: a slot's state into the host arrays. */
static loom_status sdev_pull(loom_seq_state_dev *d, int slot, float *conv, size_t conv_n,
                             float *rec, size_t rec_n) {
    loom_cuda_model *g = of_sdev(d);
    if (slot < 0 || slot >= g->n_slots || conv_n != g->conv_n || rec_n != g->rec_n)
        return loom_err(LOOM_ERR_INTERNAL, "cuda forward: state slot %d of %d, %zu + %zu floats "
                        "(expected %zu + %zu)", slot, g->n_slots, conv_n, rec_n, g->conv_n,
                        g->rec_n);
    const float *src = g->slots[slot].d;
    loom_status st = loom_cuda_download(g->c, conv, src, conv_n * sizeof(float));
    if (st == LOOM_OK) st = loom_cuda_download(g->c, rec, src + conv_n, rec_n * sizeof(float));
    return st;
}

/* loom_seq_state_dev.release: the slot serves the next state bound. */
static void sdev_release(loom_seq_state_dev *d, int slot) {
    loom_cuda_model *g = of_sdev(d);
    if (slot >= 0 && slot < g->n_slots) g->slots[slot].st = NULL;
}

extern "C" void loom_cuda_model_free(loom_cuda_model *g) {
    if (!g) return;
    if (g->c) loom_cuda_sync(g->c);
    /* states outlive the model: their host arrays take the live copy */
    for (int i = 0; i < g->n_slots; i++)
        if (g->slots[i].st) loom_seq_state_dev_bind(g->slots[i].st, NULL, 0);
    free(g->slots);
    if (g->h_sptr) cudaFreeHost(g->h_sptr);
    st_flush(g);
    for (int i = 0; i < 2 && g->st_on; i++)
        for (int k = 0; k < 3; k++) cudaEventDestroy(g->st_ev[i][k]);
    for (int i = 0; i < g->n_allocs; i++) loom_cuda_release(g->c, g->allocs[i]);
    free(g->allocs);
    free(g->layers);
    for (int i = 0; i < FW_GRAPHS; i++)
        if (g->graphs[i].state == 2) cudaGraphExecDestroy(g->graphs[i].exec);
    if (g->h_ints) cudaFreeHost(g->h_ints);
    if (g->h_ids) cudaFreeHost(g->h_ids);
    if (g->h_sids) cudaFreeHost(g->h_sids);
    if (g->h_samp) cudaFreeHost(g->h_samp);
    free(g);
}

/* The features this forward implements; anything else is refused, named. */
static loom_status check_model(const loom_model *m) {
    const loom_config *c = &m->cfg;
    if (m->n_linear > 0) {
        int nk = c->lin_n_k_heads, nv = c->lin_n_v_heads, dk = c->lin_k_head_dim;
        int dv = c->lin_v_head_dim;
        if (nk <= 0 || nv % nk || dk > loom_cuda_lin_delta_max_k() || c->lin_conv_kernel < 1)
            return loom_err(LOOM_ERR_UNSUPPORTED, "cuda forward: linear attention with %d key "
                            "heads of %d, %d value heads of %d, conv kernel %d (expected key dims "
                            "up to %d)", nk, dk, nv, dv, c->lin_conv_kernel,
                            loom_cuda_lin_delta_max_k());
    }
    for (int l = 0; l < c->n_layers; l++) {
        const loom_layer *L = &m->layers[l];
        int lin = L->kind == LOOM_LAYER_LINEAR;
        if (lin && L->lin.fused &&
            (L->lin.in_qkvz.rows != m->lin_conv_dim + c->lin_n_v_heads * c->lin_v_head_dim ||
             L->lin.in_ba.rows != 2 * c->lin_n_v_heads))
            return loom_err(LOOM_ERR_UNSUPPORTED, "cuda forward: layer %d: grouped projections of "
                            "%d and %d rows (expected %d and %d)", l, L->lin.in_qkvz.rows,
                            L->lin.in_ba.rows, m->lin_conv_dim + c->lin_n_v_heads *
                            c->lin_v_head_dim, 2 * c->lin_n_v_heads);
        if (L->moe_beside && (c->n_experts_used > LOOM_CUDA_MOE_KMAX || L->moe.shared.gate.rows))
            return loom_err(LOOM_ERR_UNSUPPORTED, "cuda forward: layer %d: MoE block beside the "
                            "MLP with top %d experts%s (expected at most %d, no shared expert)", l,
                            c->n_experts_used, L->moe.shared.gate.rows ? " and a shared expert" : "",
                            LOOM_CUDA_MOE_KMAX);
        if (L->is_moe && (L->moe.in_scale || L->moe.expert_scale || L->post_ffn_norm ||
                          c->n_experts_used > LOOM_CUDA_MOE_KMAX))
            return loom_err(LOOM_ERR_UNSUPPORTED, "cuda forward: layer %d: MoE with router "
                            "scales, a norm after it, or top %d experts (expected softmax "
                            "routing to at most %d experts, as Qwen3-MoE)", l, c->n_experts_used,
                            LOOM_CUDA_MOE_KMAX);
    }
    return LOOM_OK;
}

/* A weight the expert kernels read: f32, f16 or bf16. */
static loom_status up_dense(loom_cuda_model *g, dweight *dw, const loom_weight *w,
                            const char *what, int l) {
    if (w->dtype != LOOM_DT_F32 && w->dtype != LOOM_DT_F16 && w->dtype != LOOM_DT_BF16)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda forward: layer %d %s has dtype %d (expected "
                        "F32, F16 or BF16; quantized MoE layers run on the CPU)", l, what,
                        (int)w->dtype);
    return up_weight(g, dw, w, what);
}

static loom_cuda_dtype cuda_dt(loom_dtype dt) {
    return dt == LOOM_DT_F32 ? LOOM_CUDA_F32 : dt == LOOM_DT_F16 ? LOOM_CUDA_F16 : LOOM_CUDA_BF16;
}

/* A MoE layer's router, experts (side by side: gate | up of every expert in
 * one array, down in another, for the grouped kernels) and shared expert. */
static loom_status up_moe(loom_cuda_model *g, dlayer *D, const loom_layer *S, int l) {
    const loom_config *cf = &g->m->cfg;
    const loom_moe *p = &S->moe;
    int E = cf->n_experts, H = cf->hidden_size, I = p->experts[0].gate.rows;
    loom_dtype dt = p->experts[0].gate.dtype;
    D->moe = 1;
    D->renorm = p->renorm;
    D->moe_inter = I;
    D->edt = cuda_dt(dt);
    loom_status st = up_dense(g, &D->router, &p->router, "mlp.gate (router)", l);
    for (int e = 0; e < E && st == LOOM_OK; e++) {
        const loom_mlp *x = &p->experts[e];
        const loom_weight *ws[] = {&x->gate, &x->up, &x->down};
        for (int k = 0; k < 3; k++) {
            int rows = k < 2 ? I : H, cols = k < 2 ? H : I;
            if (ws[k]->dtype != dt || ws[k]->rows != rows || ws[k]->cols != cols ||
                (dt != LOOM_DT_F32 && dt != LOOM_DT_F16 && dt != LOOM_DT_BF16))
                return loom_err(LOOM_ERR_UNSUPPORTED, "cuda forward: layer %d expert %d: "
                                "expected %s weights of one float dtype, gate/up [%d, %d] and "
                                "down [%d, %d]; found dtype %d [%d, %d]", l, e,
                                k == 0 ? "gate" : k == 1 ? "up" : "down", I, H, H, I,
                                (int)ws[k]->dtype, ws[k]->rows, ws[k]->cols);
        }
    }
    size_t es = dt == LOOM_DT_F32 ? 4 : 2, n = (size_t)I * H * es;
    void *gu = NULL, *dn = NULL;
    if (st == LOOM_OK) st = g_alloc(g, &gu, 2 * n * (size_t)E);
    if (st == LOOM_OK) st = g_alloc(g, &dn, n * (size_t)E);
    for (int e = 0; e < E && st == LOOM_OK; e++) {
        const loom_mlp *x = &p->experts[e];
        st = loom_cuda_upload(g->c, (char *)gu + 2 * n * e, x->gate.data, n);
        if (st == LOOM_OK) st = loom_cuda_upload(g->c, (char *)gu + 2 * n * e + n, x->up.data, n);
        if (st == LOOM_OK) st = loom_cuda_upload(g->c, (char *)dn + n * e, x->down.data, n);
    }
    D->egu = gu;
    D->edown = dn;
    const loom_weight *sg = &p->shared.gate, *su = &p->shared.up;
    if (st != LOOM_OK || !sg->rows) return st;
    if (su->dtype != sg->dtype || su->rows != sg->rows || su->cols != sg->cols)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda forward: layer %d shared expert: gate and up "
                        "of one dtype and shape expected", l);
    st = up_dense(g, &D->sdown, &p->shared.down, "shared_expert.down_proj", l);
    if (st == LOOM_OK) st = up_dense(g, &D->sgate, &p->shared_gate, "shared_expert_gate", l);
    if (st == LOOM_OK) st = up_dense(g, &D->sgu, sg, "shared_expert.gate_proj", l);
    if (st != LOOM_OK) return st;
    /* gate rows, then up rows: one product for both */
    size_t ns = (size_t)sg->rows * sg->cols * (sg->dtype == LOOM_DT_F32 ? 4 : 2);
    void *f = NULL;
    st = g_alloc(g, &f, 2 * ns);
    if (st == LOOM_OK) st = d2d(f, D->sgu.d, ns);
    if (st == LOOM_OK) st = loom_cuda_upload(g->c, (char *)f + ns, su->data, ns);
    if (st != LOOM_OK) return st;
    g_release(g, D->sgu.d);
    D->sgu.d = f;
    D->sgu.rows *= 2;
    return LOOM_OK;
}

/* A linear-attention layer's projections, conv, decay and norm weights. */
static loom_status up_lin(loom_cuda_model *g, dlayer *D, const loom_layer *S) {
    const loom_config *cf = &g->m->cfg;
    const loom_linattn *A = &S->lin;
    int nv = cf->lin_n_v_heads, K = cf->lin_conv_kernel;
    D->lin = 1;
    D->lin_fused = A->fused;
    D->lin_slot = A->slot;
    loom_status st;
    if (A->fused) {
        st = up_weight(g, &D->in_qkvz, &A->in_qkvz, "linear_attn.in_proj_qkvz");
        if (st == LOOM_OK) st = up_weight(g, &D->in_ba, &A->in_ba, "linear_attn.in_proj_ba");
    } else {
        st = up_weight(g, &D->in_qkv, &A->in_qkv, "linear_attn.in_proj_qkv");
        if (st == LOOM_OK) st = up_weight(g, &D->in_z, &A->in_z, "linear_attn.in_proj_z");
        if (st == LOOM_OK) st = up_weight(g, &D->in_b, &A->in_b, "linear_attn.in_proj_b");
        if (st == LOOM_OK) st = up_weight(g, &D->in_a, &A->in_a, "linear_attn.in_proj_a");
    }
    if (st == LOOM_OK) st = up_weight(g, &D->lin_out, &A->out, "linear_attn.out_proj");
    if (st == LOOM_OK) st = up_vec(g, &D->conv_w, A->conv, g->m->lin_conv_dim * K);
    if (st == LOOM_OK) st = up_vec(g, &D->neg_a, A->neg_a, nv);
    if (st == LOOM_OK) st = up_vec(g, &D->dt_bias, A->dt_bias, nv);
    if (st == LOOM_OK) st = up_vec(g, &D->lin_norm, A->norm, cf->lin_v_head_dim);
    return st;
}

extern "C" loom_status loom_cuda_model_create(loom_cuda *c, const loom_model *m,
                                              const struct loom_kv_layout *kv, int step_tokens,
                                              int max_ctx, loom_cuda_model **out) {
    *out = NULL;
    loom_status st = check_model(m);
    if (st != LOOM_OK) return st;
    loom_cuda_tuning tune; /* the model's knobs, read once here */
    loom_cuda_tuning_read(&tune);
    const loom_config *cf = &m->cfg;
    if (kv->type != LOOM_KV_F32 && kv->type != LOOM_KV_F16 && kv->type != LOOM_KV_BF16)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda forward: KV type %s (expected f32, f16 or bf16)",
                        loom_kv_type_name(kv->type));
    if (kv->kv_dim < m->kv_dim || kv->n_layers < cf->n_layers || step_tokens <= 0 || max_ctx <= 0)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda forward: KV pool has %d layers of width %d, "
                        "model needs %d of width %d; step_tokens %d, max_ctx %d", kv->n_layers,
                        kv->kv_dim, cf->n_layers, m->kv_dim, step_tokens, max_ctx);
    loom_cuda_model *g = (loom_cuda_model *)calloc(1, sizeof *g);
    if (!g) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    g->c = c;
    g->m = m;
    g->step_tokens = step_tokens;
    g->max_ctx = max_ctx;
    int H = cf->hidden_size, L = cf->n_layers;
    g->layers = (dlayer *)calloc((size_t)L, sizeof *g->layers);
    if (!g->layers) st = loom_err(LOOM_ERR_NOMEM, "out of memory");
    if (st == LOOM_OK) st = up_weight(g, &g->embed, &m->embed, "embed_tokens");
    if (st == LOOM_OK) {
        if (m->lm_head.data == m->embed.data && m->lm_head.dtype == m->embed.dtype) g->lm_head = g->embed;
        else st = up_weight(g, &g->lm_head, &m->lm_head, "lm_head");
    }
    if (st == LOOM_OK) st = up_vec(g, &g->final_norm, m->final_norm, H);
    for (int l = 0; l < L && st == LOOM_OK; l++) {
        const loom_layer *S = &m->layers[l];
        const loom_attn *A = &S->attn;
        dlayer *D = &g->layers[l];
        int qd = A->wq.rows, kvd = A->wk.rows, hd = A->head_dim, nh_ = cf->n_heads;
        int att = S->kind != LOOM_LAYER_LINEAR;
        if (st == LOOM_OK && !att) st = up_lin(g, D, S);
        D->gated = att && (m->arch->flags & LOOM_ARCH_ATTN_GATE) != 0;
        D->kv_layer = att ? A->kv_layer : l;
        D->k_eq_v = att && A->k_eq_v;
        D->v_norm = att && (m->arch->flags & LOOM_ARCH_V_NORM) != 0;
        D->out_scale = S->out_scale;
        int own_kv = D->kv_layer == l; /* a sharing layer has no k/v weights */
        if (st == LOOM_OK && att) st = up_weight(g, &D->wq, &A->wq, "q_proj");
        if (st == LOOM_OK && att && own_kv) st = up_weight(g, &D->wk, &A->wk, "k_proj");
        if (st == LOOM_OK && att && own_kv && !D->k_eq_v)
            st = up_weight(g, &D->wv, &A->wv, "v_proj");
        /* q, k and v of one dense type side by side: one GEMM for all three
         * (qkv_post stores K and V: not where V takes a norm, is K, or where
         * the layer reads another's) */
        D->fused_qkv = st == LOOM_OK && att && own_kv && !D->k_eq_v && !D->v_norm && !D->gated &&
                       !D->wq.quant && !D->wk.quant && !D->wv.quant &&
                       D->wq.dt == D->wk.dt && D->wq.dt == D->wv.dt && D->wq.cols == D->wk.cols &&
                       D->wq.cols == D->wv.cols && qd == nh_ * hd && kvd == A->n_kv_heads * hd;
        if (D->fused_qkv) {
            size_t es = D->wq.dt == LOOM_CUDA_F32 ? 4 : 2, cols = (size_t)D->wq.cols;
            size_t nq = (size_t)qd * cols * es, nk = (size_t)kvd * cols * es;
            dweight *F = &D->wqkv;
            memset(F, 0, sizeof *F);
            F->rows = qd + 2 * kvd;
            F->cols = (int)cols;
            F->dt = D->wq.dt;
            void *p = NULL;
            if (st == LOOM_OK) st = g_alloc(g, &p, nq + 2 * nk);
            if (st == LOOM_OK) st = d2d(p, D->wq.d, nq);
            if (st == LOOM_OK) st = d2d((char *)p + nq, D->wk.d, nk);
            if (st == LOOM_OK) st = d2d((char *)p + nq + nk, D->wv.d, nk);
            F->d = p;
            if (st == LOOM_OK) {  /* only the fused copy is read from now on */
                g_release(g, D->wq.d);
                g_release(g, D->wk.d);
                g_release(g, D->wv.d);
                D->wq.d = D->wk.d = D->wv.d = NULL;
            }
            if (st == LOOM_OK && (A->bq || A->bk || A->bv)) {
                float *b = (float *)calloc((size_t)qd + 2 * kvd, sizeof(float));
                if (!b) st = loom_err(LOOM_ERR_NOMEM, "out of memory");
                if (b && A->bq) memcpy(b, A->bq, (size_t)qd * 4);
                if (b && A->bk) memcpy(b + qd, A->bk, (size_t)kvd * 4);
                if (b && A->bv) memcpy(b + qd + kvd, A->bv, (size_t)kvd * 4);
                if (st == LOOM_OK) st = up_vec(g, &D->bqkv, b, qd + 2 * kvd);
                free(b);
            }
        }
        if (st == LOOM_OK && att) st = up_weight(g, &D->wo, &A->wo, "o_proj");
        if (st == LOOM_OK && (S->is_moe || S->moe_beside)) st = up_moe(g, D, S, l);
        if (st == LOOM_OK && S->moe_beside) {
            /* the experts beside the dense MLP, not instead of it */
            D->moe = 0;
            D->beside = 1;
            st = up_vec(g, &D->post_ffn_norm1, S->post_ffn_norm1, H);
            if (st == LOOM_OK) st = up_vec(g, &D->pre_moe_norm, S->pre_moe_norm, H);
            if (st == LOOM_OK) st = up_vec(g, &D->post_moe_norm, S->post_moe_norm, H);
            if (st == LOOM_OK) st = up_vec(g, &D->moe_in_scale, S->moe.in_scale, H);
            if (st == LOOM_OK)
                st = up_vec(g, &D->moe_expert_scale, S->moe.expert_scale, cf->n_experts);
        }
        const loom_weight *wg = &S->mlp.gate, *wu = &S->mlp.up;
        D->fused_gu = !S->is_moe && wg->dtype == wu->dtype && wg->cols == wu->cols &&
                      wg->rows == wu->rows &&
                      (wg->dtype == LOOM_DT_BF16 || wg->dtype == LOOM_DT_F16 ||
                       wg->dtype == LOOM_DT_F32);
        if (D->fused_gu) {
            /* one GEMM for both: gate rows, then up rows */
            size_t es = wg->dtype == LOOM_DT_F32 ? 4 : 2, n = (size_t)wg->rows * wg->cols * es;
            dweight *F = &D->gate_up;
            memset(F, 0, sizeof *F);
            F->rows = 2 * wg->rows;
            F->cols = wg->cols;
            F->dt = wg->dtype == LOOM_DT_F32 ? LOOM_CUDA_F32 : wg->dtype == LOOM_DT_F16
                                                                  ? LOOM_CUDA_F16 : LOOM_CUDA_BF16;
            void *p = NULL;
            if (st == LOOM_OK) st = g_alloc(g, &p, 2 * n);
            if (st == LOOM_OK) st = loom_cuda_upload(c, p, wg->data, n);
            if (st == LOOM_OK) st = loom_cuda_upload(c, (char *)p + n, wu->data, n);
            F->d = p;
            D->gate.rows = wg->rows;
            D->gate.cols = wg->cols;
        } else if (!S->is_moe) {
            if (st == LOOM_OK) st = up_weight(g, &D->gate, wg, "gate_proj");
            if (st == LOOM_OK) st = up_weight(g, &D->up, wu, "up_proj");
        }
        if (st == LOOM_OK && !S->is_moe) st = up_weight(g, &D->down, &S->mlp.down, "down_proj");
        if (st == LOOM_OK) st = up_vec(g, &D->attn_norm, S->attn_norm, H);
        if (st == LOOM_OK) st = up_vec(g, &D->ffn_norm, S->ffn_norm, H);
        if (st == LOOM_OK) st = up_vec(g, &D->post_attn_norm, S->post_attn_norm, H);
        if (st == LOOM_OK) st = up_vec(g, &D->post_ffn_norm, S->post_ffn_norm, H);
        if (st == LOOM_OK) st = up_vec(g, &D->q_norm, A->q_norm, hd);
        if (st == LOOM_OK) st = up_vec(g, &D->k_norm, A->k_norm, hd);
        if (st == LOOM_OK) st = up_vec(g, &D->bq, A->bq, qd);
        if (st == LOOM_OK) st = up_vec(g, &D->bk, A->bk, kvd);
        if (st == LOOM_OK) st = up_vec(g, &D->bv, A->bv, kvd);
        if (st == LOOM_OK) st = up_vec(g, &D->bo, A->bo, H);
        if (st == LOOM_OK && m->has_ple) {
            st = up_weight(g, &D->ple_gate, &S->ple_gate, "per_layer_input_gate");
            if (st == LOOM_OK) st = up_weight(g, &D->ple_proj, &S->ple_proj, "per_layer_projection");
            if (st == LOOM_OK) st = up_vec(g, &D->ple_norm, S->ple_norm, H);
        }
    }
    if (st == LOOM_OK && m->has_ple) {
        st = up_weight(g, &g->ple_embed, &m->ple_embed, "embed_tokens_per_layer");
        if (st == LOOM_OK)
            st = up_weight(g, &g->ple_model_proj, &m->ple_model_proj, "per_layer_model_projection");
        if (st == LOOM_OK)
            st = up_vec(g, &g->ple_proj_norm, m->ple_proj_norm, cf->per_layer_input_dim);
    }
    /* device KV pool, the host pool's layout */
    g->kv_blocks = kv->n_blocks;
    g->kv_bs = kv->block_size;
    g->kv_row_bytes = kv->row_bytes;
    g->kv_dt = kv->type == LOOM_KV_F16 ? LOOM_CUDA_F16 : kv->type == LOOM_KV_BF16 ? LOOM_CUDA_BF16
                                                                                 : LOOM_CUDA_F32;
    size_t kv_bytes = (size_t)kv->n_layers * kv->n_blocks * kv->block_size * kv->row_bytes;
    if (st == LOOM_OK) st = g_alloc(g, &g->kv_k, kv_bytes);
    if (st == LOOM_OK) st = g_alloc(g, &g->kv_v, kv_bytes);
    /* activations */
    size_t T = (size_t)step_tokens, qd = (size_t)cf->n_heads * LOOM_MAX_I(m->max_head_dim, 1);
    size_t kvd = (size_t)m->kv_dim, I = (size_t)LOOM_MAX_I(m->max_inter, 1);
    g->max_half = 1;
    for (int i = 0; i < m->n_ropes; i++) g->max_half = LOOM_MAX_I(g->max_half, m->ropes[i].rot_dim / 2);
    size_t rope_n = (size_t)LOOM_MAX_ROPES * T * g->max_half;
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->x, T * H * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->xb, T * H * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->q, T * qd * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->att, T * qd * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->qkv, T * (qd + 2 * kvd) * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->k, T * kvd * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->v, T * kvd * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->hb, 2 * T * I * 4);
    /* 16-bit GEMM inputs when every projection that takes a normed or
     * activated row is one 16-bit dense type */
    g->act16 = LOOM_CUDA_F32;
    /* Sandwich norms (gemma) take the f32-activation path only: the
     * 16-bit and small-step paths add o and down straight into x, where a
     * post norm must come between. */
    int sandwich = 0;
    for (int l = 0; l < L && st == LOOM_OK; l++)
        sandwich |= g->layers[l].post_attn_norm || g->layers[l].post_ffn_norm;
    /* so do per-layer inputs and layer scalars (layer_end, after the MLP's
     * residual add) and value norms (the unfused q/k/v path) */
    for (int l = 0; l < L && st == LOOM_OK; l++)
        sandwich |= g->layers[l].out_scale != 1.0f || g->layers[l].v_norm || g->layers[l].beside;
    sandwich |= m->has_ple;
    /* Hybrids (linear attention, the attention's output gate) take it too:
     * their own kernels read and write f32. */
    int hybrid = m->n_linear > 0 || (m->arch->flags & LOOM_ARCH_ATTN_GATE);
    if (st == LOOM_OK && L > 0 && !sandwich && !hybrid && !g->layers[0].wq.quant &&
        g->layers[0].wq.dt != LOOM_CUDA_F32) {
        loom_cuda_dtype t = g->layers[0].wq.dt;
        int ok = 1;
        for (int l = 0; l < L; l++) {
            const dlayer *D = &g->layers[l];
            const dweight *ws[] = {&D->wq, &D->wk, &D->wv, &D->gate_up, &D->down};
            /* MoE layers: the experts take the normed row in f32 */
            ok &= D->fused_gu || D->moe;
            for (int k = 0; k < (D->moe ? 3 : 5); k++) ok &= !ws[k]->quant && ws[k]->dt == t;
        }
        if (ok) g->act16 = t;
    }
    /* a16 also takes the attention output (prefill, 16-bit o projection) */
    if (st == LOOM_OK && g->act16 != LOOM_CUDA_F32)
        st = g_alloc(g, &g->a16, T * (size_t)LOOM_MAX_I((int)qd, LOOM_MAX_I(H, (int)I)) * 2);
    /* Few tokens: our GEMV instead of cuBLAS. Up to 2 by measurement (H200,
     * bench/cuda_gemv and whole decode steps): at 1-2 tokens it reads the
     * weights at 3.1-4.2 TB/s on the Llama-3-8B shapes and takes 4-6 us on
     * the Qwen3-0.6B ones against cuBLAS's 12-16; at 8 tokens cuBLAS's
     * tensor-core GEMMs win (batch 8: 1,295 against 1,012 tok/s on
     * Llama-3-8B, 4,500 against 4,112 on Qwen3-0.6B). */
    g->gu16 = g->act16 == LOOM_CUDA_BF16 && tune.gu16;
    /* bf16 q/k/v for prefill: H200, Llama-3-8B 4096-token prefill 36,442
     * against 36,152 tok/s, batched vs token-by-token logits within 0.218
     * of 6.1 (f32: 0.202; 5% allowed) */
    g->qkv16 = g->act16 == LOOM_CUDA_BF16 && tune.qkv16;
    /* qkv_post inside the cluster attention: off, as measured (H200,
     * Qwen3-0.6B batch 1: 1,170 tok/s against 1,306 with the two kernels;
     * the cluster kernel then follows the qkv GEMV, which fills the SMs,
     * instead of the small qkv_post, and its table and row loads no
     * longer overlap a kernel ahead) */
    g->attn_qkv = tune.attn_qkv;
    g->gemv_t = tune.gemv_t;
    g->lin_chunk = tune.lin_chunk;
    g->small_t = g->act16 != LOOM_CUDA_F32 ? 8 : 0;
    for (int l = 0; l < L && g->small_t; l++) {
        const dlayer *D = &g->layers[l];
        if (!D->fused_qkv || D->wo.quant) {
            g->small_t = 0;
            break;
        }
        const dweight *ws[] = {&D->wqkv, &D->wo, &D->gate_up, &D->down};
        for (int k = 0; k < (D->moe ? 2 : 4); k++)
            g->small_t = LOOM_MIN_U((unsigned)g->small_t,
                                    (unsigned)loom_cuda_gemv_max_tokens(c, ws[k]->dt, ws[k]->cols));
    }
    g->head_am = tune.head_am;
    g->f8_f32 = tune.f8_f32;
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->hb2, T * I * 4);
    if (st == LOOM_OK && m->has_ple) {
        size_t P = (size_t)cf->per_layer_input_dim, LP = (size_t)L * P;
        st = g_alloc(g, (void **)&g->ple_in, T * LP * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->ple_e, T * LP * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->ple_tmp, T * P * 4);
    }
    int any_moe = 0;
    size_t mhb = 1, mab = 1;
    for (int l = 0; l < L && st == LOOM_OK; l++) {
        const dlayer *D = &g->layers[l];
        if (!D->moe && !D->beside) continue;
        size_t K = (size_t)cf->n_experts_used, Is = (size_t)D->sgu.rows / 2;
        any_moe = 1;
        mhb = LOOM_MAX(mhb, LOOM_MAX(K * 2 * D->moe_inter, 2 * Is));
        mab = LOOM_MAX(mab, LOOM_MAX(K * D->moe_inter, Is));
    }
    if (st == LOOM_OK && any_moe) {
        size_t E = (size_t)cf->n_experts, K = (size_t)cf->n_experts_used;
        size_t plan = (size_t)loom_cuda_moe_plan_ints(step_tokens, (int)K, (int)E);
        st = g_alloc(g, (void **)&g->m_logits, T * E * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->m_sel, T * K * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->m_wt, T * K * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->m_plan, plan * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->m_hb, T * mhb * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->m_ab, T * mab * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->m_y, T * K * H * 4);
        if (st == LOOM_OK && (cf->enable_moe_block)) {
            st = g_alloc(g, (void **)&g->m_rin, T * H * 4);
            if (st == LOOM_OK) st = g_alloc(g, (void **)&g->m_sum, T * H * 4);
        }
    }
    if (st == LOOM_OK && (m->arch->flags & LOOM_ARCH_ATTN_GATE)) {
        st = g_alloc(g, (void **)&g->qraw, 2 * T * qd * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->gate, T * qd * 4);
    }
    if (st == LOOM_OK && m->n_linear > 0) {
        size_t Dc = (size_t)m->lin_conv_dim, nv = (size_t)cf->lin_n_v_heads;
        size_t VD = nv * cf->lin_v_head_dim;
        st = g_alloc(g, (void **)&g->l_qkv, T * Dc * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->l_conv, T * Dc * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->l_z, T * VD * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->l_o, T * VD * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->l_y, T * VD * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->l_b, T * nv * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->l_a, T * nv * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->l_beta, T * nv * 4);
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->l_g, T * nv * 4);
        if (st == LOOM_OK && (m->arch->flags & LOOM_ARCH_LINEAR_FUSED)) {
            st = g_alloc(g, (void **)&g->l_raw, T * (Dc + VD) * 4);
            if (st == LOOM_OK) st = g_alloc(g, (void **)&g->l_raw_ba, T * 2 * nv * 4);
        }
        if (st == LOOM_OK) st = g_alloc(g, (void **)&g->d_sptr, T * sizeof(float *));
        if (st == LOOM_OK && cudaMallocHost((void **)&g->h_sptr, T * sizeof(float *)) != cudaSuccess)
            st = loom_err(LOOM_ERR_NOMEM, "cuda forward: pinned host memory for %zu state "
                          "pointers", T);
        g->conv_n = (size_t)(cf->lin_conv_kernel - 1) * Dc * m->n_linear;
        g->rec_n = nv * cf->lin_k_head_dim * cf->lin_v_head_dim * m->n_linear;
        g->sdev.pull = sdev_pull;
        g->sdev.release = sdev_release;
    }
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->cs, rope_n * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->sn, rope_n * 4);
    if (st == LOOM_OK) st = loom_cuda_memset0(c, g->cs, rope_n * 4);
    if (st == LOOM_OK) st = loom_cuda_memset0(c, g->sn, rope_n * 4);
    for (int i = 0; i < m->n_ropes && st == LOOM_OK; i++)
        st = g_upload(g, (const void **)&g->inv_freq[i], m->ropes[i].inv_freq,
                      (size_t)LOOM_MAX_I(m->ropes[i].rot_dim / 2, 1) * sizeof(double));
    for (int i = 0; i < m->n_ropes && st == LOOM_OK; i++)
        if (m->ropes[i].stream && m->ropes[i].rot_dim >= 2)
            st = g_upload(g, (const void **)&g->stream[i], m->ropes[i].stream,
                          (size_t)(m->ropes[i].rot_dim / 2));
    /* ints: tokens, slots, sel [T each], row_tok [T + 1], row_pos, lens
     * [T each], then block tables (rows, stride) with stride <=
     * ceil(max_ctx / bs), then the rope positions (3 streams of T) and
     * the bidirectional spans' bounds (2 of T) */
    size_t tstride_max = (size_t)(max_ctx + kv->block_size - 1) / kv->block_size;
    g->ints_cap = 11 * T + 1 + T * tstride_max;
    g->ids_cap = step_tokens;
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->ints, g->ints_cap * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->ids, (size_t)g->ids_cap * 4);
    if (st == LOOM_OK) st = g_alloc(g, (void **)&g->sids, (size_t)g->ids_cap * 4);
    if (st == LOOM_OK)
        st = g_alloc(g, (void **)&g->samp, (size_t)g->ids_cap * sizeof(loom_sample_pick));
    if (st == LOOM_OK) {
        cudaError_t e = cudaMallocHost((void **)&g->h_ints, g->ints_cap * 4);
        if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_ids, (size_t)g->ids_cap * 4);
        if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_sids, (size_t)g->ids_cap * 4);
        if (e == cudaSuccess)
            e = cudaMallocHost((void **)&g->h_samp, (size_t)g->ids_cap * sizeof(loom_sample_pick));
        if (e != cudaSuccess)
            st = loom_err(LOOM_ERR_NOMEM, "cuda forward: %zu bytes of pinned host memory: %s",
                          g->ints_cap * 4, cudaGetErrorString(e));
    }
    g->use_graphs = tune.graphs;
    if (st == LOOM_OK && tune.step_times) {
        g->st_on = 1;
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 3; k++) cudaEventCreate(&g->st_ev[i][k]);
    }
    if (st != LOOM_OK) {
        loom_cuda_model_free(g);
        return st;
    }
    *out = g;
    return LOOM_OK;
}

static loom_status check_rows(const loom_cuda_model *g, const loom_kv_layout *kv,
                              const loom_fwd_row *rows, int n_rows, int *total) {
    if (kv->n_blocks != g->kv_blocks || kv->block_size != g->kv_bs || kv->row_bytes != g->kv_row_bytes)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda forward: KV pool differs from the one the "
                        "model was created with");
    for (int r = 0; r < n_rows && g->m->n_linear == 0; r++)
        if (rows[r].state)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d carries a recurrent state", r);
    return loom_fwd_check_rows(g->m, rows, n_rows, kv->block_size, g->max_ctx, g->step_tokens, total);
}

/* A device slot for st: a free one, else a new one. */
static loom_status bind_slot(loom_cuda_model *g, loom_seq_state *st, int *out) {
    int i = 0;
    while (i < g->n_slots && g->slots[i].st) i++;
    if (i == g->n_slots) {
        struct loom_cuda_model::dslot *ns = (struct loom_cuda_model::dslot *)realloc(
            g->slots, sizeof *ns * (size_t)(g->n_slots + 1));
        if (!ns) return loom_err(LOOM_ERR_NOMEM, "out of memory");
        g->slots = ns;
        void *d = NULL;
        loom_status st = g_alloc(g, &d, (g->conv_n + g->rec_n) * sizeof(float));
        if (st != LOOM_OK) return st;
        g->slots[g->n_slots++] = {NULL, (float *)d};
    }
    loom_seq_state_dev_bind(st, &g->sdev, i);
    g->slots[i].st = st;
    *out = i;
    return LOOM_OK;
}

/* The rows' recurrent states onto the device before the body: each bound
 * to a slot, zeroed there for a row at position 0, or uploaded where the
 * host changed it (a snapshot restored, a copy); d_sptr gets their slots.
 * Checks first what loom_fwd_check_states checks, then changes anything. */
static loom_status lin_states(loom_cuda_model *g, const loom_fwd_row *rows, int n_rows) {
    const loom_model *m = g->m;
    if (m->n_linear == 0) return LOOM_OK;
    for (int r = 0; r < n_rows; r++) {
        loom_seq_state *st = rows[r].state;
        size_t cn, rn;
        const float *rec;
        if (!st)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d has no recurrent state (the "
                            "model has %d linear-attention layers)", r, m->n_linear);
        loom_seq_state_dev_stale(st, &cn, &rec, &rn);
        if (cn != g->conv_n || rn != g->rec_n)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d: recurrent state made for "
                            "another model", r);
        for (int j = 0; j < r; j++)
            if (rows[j].state == st)
                return loom_err(LOOM_ERR_INVALID_ARG, "forward: rows %d and %d share a recurrent "
                                "state", j, r);
        int n = rows[r].seq->n_tokens;
        if (n != 0 && loom_seq_state_tokens(st) != n)
            return loom_err(LOOM_ERR_INVALID_ARG, "forward: row %d: recurrent state holds %d "
                            "tokens, the sequence %d (linear-attention state cannot be rewound)",
                            r, loom_seq_state_tokens(st), n);
    }
    loom_cuda *c = g->c;
    for (int r = 0; r < n_rows; r++) {
        loom_seq_state *st = rows[r].state;
        int slot = loom_seq_state_dev_slot(st, &g->sdev);
        if (slot < 0) {
            loom_status e = bind_slot(g, st, &slot);
            if (e != LOOM_OK) return e;
        }
        float *d = g->slots[slot].d;
        size_t cn, rn;
        const float *rec, *conv = loom_seq_state_dev_stale(st, &cn, &rec, &rn);
        if (rows[r].seq->n_tokens == 0) {
            CUDA_CHECK(cudaMemsetAsync(d, 0, (cn + rn) * sizeof(float), c->stream));
            loom_seq_state_dev_zeroed(st);
        } else if (conv) {
            CUDA_CHECK(cudaMemcpyAsync(d, conv, cn * sizeof(float), cudaMemcpyHostToDevice,
                                       c->stream));
            CUDA_CHECK(cudaMemcpyAsync(d + cn, rec, rn * sizeof(float), cudaMemcpyHostToDevice,
                                       c->stream));
            loom_seq_state_dev_synced(st);
        }
        g->h_sptr[r] = d;
    }
    /* pinned source: rewritten only by the next step, after this one's sync */
    CUDA_CHECK(cudaMemcpyAsync(g->d_sptr, g->h_sptr, (size_t)n_rows * sizeof(float *),
                               cudaMemcpyHostToDevice, c->stream));
    return LOOM_OK;
}

/* Step times (LOOM_CUDA_STEP_TIMES=1), over runs of decode steps of one
 * row count: the wall period between steps, the device time from the
 * upload to the end of the body and to the end of the copies back, the
 * device idle time between the last step's copies and this upload, and
 * the host's time from entry to the body's launch and in the final sync. */
static void st_flush(loom_cuda_model *g) {
    if (!g->st_on || g->st_n == 0) return;
    double n = (double)g->st_n, *a = g->st_sum;
    fprintf(stderr, "cuda step times: %d rows, %ld steps: period %.1f us, device %.1f us "
            "(body %.1f), device idle before the upload %.1f, host to launch %.1f, host in "
            "sync %.1f\n", g->st_rows, g->st_n, 1e6 * a[0] / n, 1e3 * a[2] / n, 1e3 * a[1] / n,
            1e3 * a[3] / n, 1e6 * a[4] / n, 1e6 * a[5] / n);
    g->st_n = 0;
    memset(g->st_sum, 0, sizeof g->st_sum);
}

/* One step's shape and its device integers (views into g->ints). */
typedef struct fw_step {
    int T, n_rows, tstride, max_new, max_len, n_sel, decode;
    int verify;                /* rows carry proposals: the decode path's numerics (below) */
    int taps;                  /* hidden states exported (loom_cuda_set_taps) */
    const int32_t *tok, *slot, *sel, *rtok, *rpos, *lens, *tab;
    const int32_t *rp;         /* rope positions: 3 streams of T (t, h, w) */
    const int32_t *slo, *shi;  /* bidirectional spans' first and last positions [T], or NULL */
    /* prepared input (embeddings, deepstack): the step's rows, never graphed */
    int prep;
    const loom_fwd_row *rows;
    int n_in;
    const int32_t *h_rtok;     /* host: each row's first token, [n_in + 1] */
} fw_step;

#define TRY(call)                                  \
    do {                                           \
        loom_status s_ = (call);                   \
        if (s_ != LOOM_OK) return s_;              \
    } while (0)

/* x += y, or x += post_norm(y) for a sandwich layer. */
static loom_status residual(loom_cuda_model *g, const float *y, const float *post_norm, int T) {
    int H = g->m->cfg.hidden_size;
    if (post_norm)
        return loom_cuda_rmsnorm_add(g->c, g->x, y, post_norm, T, H, (float)g->m->cfg.rms_eps);
    size_t TH = (size_t)T * H;
    fw_add<<<loom_cuda_blocks(TH, 256), 256, 0, g->c->stream>>>(g->x, y, TH);
    LAUNCH_CHECK();
    return LOOM_OK;
}

/* A shard's partial o or down output y (T, hidden) summed over the ranks
 * (a no-op without tensor parallelism). */
static loom_status tp_sum(loom_cuda_model *g, float *y, int T) {
    if (!g->tp) return LOOM_OK;
    return loom_cuda_tp_sum(g->tp, g->tp_rank, g->c, y, (size_t)T * g->m->cfg.hidden_size);
}

/* The hidden states after layer l (x, (T, hidden)) into the column block
 * of d_taps of every tap asking for l: the residual stream, complete at
 * a layer's end on every path of fw_body. */
static loom_status fw_taps(loom_cuda_model *g, const fw_step *S, int l) {
    size_t H = (size_t)g->m->cfg.hidden_size, n = (size_t)g->n_taps;
    for (int k = 0; S->taps && k < g->n_taps; k++)
        if (g->tap_layers[k] == l)
            CUDA_CHECK(cudaMemcpy2DAsync(g->d_taps + (size_t)k * H, n * H * 4, g->x, H * 4, H * 4,
                                         (size_t)S->T, cudaMemcpyDeviceToDevice, g->c->stream));
    return LOOM_OK;
}

/* Up to this many tokens the experts run as GEMVs, each (token, expert)
 * pair reading its expert's rows; above, pairs of a step share experts
 * and the grouped GEMM reads each expert's weights once a row tile. */
#define MOE_GEMV_T 4

/* y (T, w->rows) = x (T, w->cols) @ w^T with x in f32, as the CPU's
 * router and shared expert take it: the expert kernels with one group. */
static loom_status moe_linear(loom_cuda_model *g, float *y, const float *x, const dweight *w,
                              int T) {
    if (T <= MOE_GEMV_T)
        return loom_cuda_moe_gemv(g->c, y, x, 1, NULL, w->d, w->dt, w->rows, w->cols, T);
    return loom_cuda_moe_gemm(g->c, y, x, 0, w->d, w->dt, w->rows, w->cols, NULL, 1, T, 0);
}

/* The shared expert's projections: above the GEMV's few tokens, cuBLAS on
 * the tensor cores (x rounded to the weight's type, as the dense prefill
 * GEMMs and the grouped expert GEMMs take it); the router keeps f32 x,
 * since its top-k choice is a discrete decision. */
static loom_status moe_linear_tc(loom_cuda_model *g, float *y, const float *x, const dweight *w,
                                 int T) {
    if (T <= MOE_GEMV_T || w->dt == LOOM_CUDA_F32) return moe_linear(g, y, x, w, T);
    return loom_cuda_gemm(g->c, y, x, w->d, w->dt, T, w->rows, w->cols);
}

static loom_status moe_experts(loom_cuda_model *g, const dlayer *D, const float *xin, float *out,
                               int acc, int T);

/* x += moe(xb) for a MoE layer (moe.c's loom_moe_ffn), xb (T, hidden) the
 * normed input: the router, routing, the gated shared expert, then the
 * routed experts, all on the device with grids fixed by T (capturable). */
static loom_status moe_ffn(loom_cuda_model *g, const dlayer *D, int T) {
    const loom_config *cf = &g->m->cfg;
    loom_cuda *c = g->c;
    int E = cf->n_experts, K = cf->n_experts_used, H = cf->hidden_size;
    int gelu = g->m->act == LOOM_ACT_GELU_TANH;
    TRY(moe_linear(g, g->m_logits, g->xb, &D->router, T));
    TRY(loom_cuda_moe_route(c, g->m_sel, g->m_wt, g->m_logits, T, E, K, D->renorm));
    if (D->sgu.rows) {
        int Is = D->sgu.rows / 2;
        TRY(moe_linear_tc(g, g->m_hb, g->xb, &D->sgu, T));
        TRY(loom_cuda_act_mul_split(c, g->m_ab, g->m_hb, T, Is, gelu));
        TRY(moe_linear_tc(g, g->m_y, g->m_ab, &D->sdown, T));
        TRY(moe_linear(g, g->m_logits, g->xb, &D->sgate, T));  /* routing is done */
        TRY(loom_cuda_moe_gate_add(c, g->x, g->m_y, g->m_logits, T, H));
    }
    return moe_experts(g, D, g->xb, g->x, 1, T);
}

/* The routed experts on their input xin (T, hidden), the routing (m_sel,
 * m_wt) done: out = (acc: out +) the weighted sum of each token's experts. */
static loom_status moe_experts(loom_cuda_model *g, const dlayer *D, const float *xin, float *out,
                               int acc, int T) {
    const loom_config *cf = &g->m->cfg;
    loom_cuda *c = g->c;
    int E = cf->n_experts, K = cf->n_experts_used, H = cf->hidden_size, I = D->moe_inter;
    int N = T * K, gelu = g->m->act == LOOM_ACT_GELU_TANH;
    if (T <= MOE_GEMV_T) {
        TRY(loom_cuda_moe_gemv(c, g->m_hb, xin, K, g->m_sel, D->egu, D->edt, 2 * I, H, N));
        TRY(loom_cuda_act_mul_split(c, g->m_ab, g->m_hb, N, I, gelu));
        return loom_cuda_moe_gemv_sum(c, out, acc, g->m_ab, g->m_sel, g->m_wt, D->edown, D->edt,
                                      T, K, H, I);
    }
    int tile = loom_cuda_moe_tile(T, K, E);
    TRY(loom_cuda_moe_sort(c, g->m_plan, g->m_sel, T, K, E, tile));
    TRY(loom_cuda_moe_gemm(c, g->m_hb, xin, 1, D->egu, D->edt, 2 * I, H, g->m_plan, E, N, tile));
    TRY(loom_cuda_act_mul_split(c, g->m_ab, g->m_hb, N, I, gelu));
    TRY(loom_cuda_moe_gemm(c, g->m_y, g->m_ab, 0, D->edown, D->edt, H, I, g->m_plan, E, N,
                           tile));
    return loom_cuda_moe_combine(c, out, acc, g->m_y, g->m_plan, g->m_wt, T, K, H, E);
}

/* Gemma 4's MoE block beside the dense MLP (moe.c's loom_moe_beside), the
 * MLP's post-normed output in xb: routing on rmsnorm(x) * in_scale, the
 * weights renormalised then times their experts' scales, the experts on
 * rmsnorm(x) * pre_moe_norm, and xb += rmsnorm(their sum) * post_moe_norm. */
static loom_status moe_beside(loom_cuda_model *g, const dlayer *D, int T) {
    const loom_config *cf = &g->m->cfg;
    loom_cuda *c = g->c;
    int E = cf->n_experts, K = cf->n_experts_used, H = cf->hidden_size;
    float eps = (float)cf->rms_eps;
    TRY(loom_cuda_rmsnorm(c, g->m_rin, g->x, D->moe_in_scale, T, H, eps, 0));
    TRY(moe_linear(g, g->m_logits, g->m_rin, &D->router, T));
    TRY(loom_cuda_moe_route(c, g->m_sel, g->m_wt, g->m_logits, T, E, K, D->renorm));
    if (D->moe_expert_scale)
        TRY(loom_cuda_moe_scale_weights(c, g->m_wt, g->m_sel, D->moe_expert_scale, T, K));
    TRY(loom_cuda_rmsnorm(c, g->m_rin, g->x, D->pre_moe_norm, T, H, eps, 0)); /* routing is done */
    TRY(moe_experts(g, D, g->m_rin, g->m_sum, 0, T));
    return loom_cuda_rmsnorm_add(c, g->xb, g->m_sum, D->post_moe_norm, T, H, eps);
}

/* rmsnorm(x) -> MLP or MoE -> x += (post norm of) it, all in f32: the
 * second half of a layer on the f32-activation path. */
static loom_status ffn_f32(loom_cuda_model *g, const dlayer *D, int T) {
    const loom_config *cf = &g->m->cfg;
    loom_cuda *c = g->c;
    int H = cf->hidden_size, gelu = g->m->act == LOOM_ACT_GELU_TANH, I = D->gate.rows;
    TRY(loom_cuda_rmsnorm(c, g->xb, g->x, D->ffn_norm, T, H, (float)cf->rms_eps, 0));
    if (D->moe) return moe_ffn(g, D, T);
    const float *hin;
    if (D->fused_gu) {
        TRY(linear(g, g->hb, g->xb, &D->gate_up, NULL, T));
        TRY(loom_cuda_act_mul_split(c, g->hb2, g->hb, T, I, gelu));
        hin = g->hb2;
    } else {
        TRY(linear(g, g->hb, g->xb, &D->gate, NULL, T));
        TRY(linear(g, g->hb2, g->xb, &D->up, NULL, T));
        size_t TI = (size_t)T * I;
        if (gelu) TRY(loom_cuda_gelu_tanh_mul(c, g->hb, g->hb2, TI));
        else TRY(loom_cuda_silu_mul(c, g->hb, g->hb2, TI));
        hin = g->hb;
    }
    TRY(linear(g, g->xb, hin, &D->down, NULL, T));
    TRY(tp_sum(g, g->xb, T));
    if (D->beside) {
        TRY(loom_cuda_rmsnorm(c, g->xb, g->xb, D->post_ffn_norm1, T, H, (float)cf->rms_eps, 0));
        TRY(moe_beside(g, D, T));
    }
    return residual(g, g->xb, D->post_ffn_norm, T);
}

/* A linear-attention layer (linear_attn.c's loom_lin_forward, then the
 * MLP or MoE): projections -> causal conv over each row's conv state ->
 * q/k norms, beta, decay -> the delta rule over each row's state -> gated
 * RMSNorm -> out projection, all on the device; the rows' states (slots
 * d_sptr points at) advance in place. */
static loom_status lin_layer(loom_cuda_model *g, const dlayer *D, const fw_step *S) {
    const loom_model *m = g->m;
    const loom_config *cf = &m->cfg;
    loom_cuda *c = g->c;
    int T = S->T, H = cf->hidden_size, nk = cf->lin_n_k_heads, nv = cf->lin_n_v_heads;
    int dk = cf->lin_k_head_dim, dv = cf->lin_v_head_dim, K = cf->lin_conv_kernel;
    int Dc = m->lin_conv_dim;
    float eps = (float)cf->rms_eps;
    size_t conv_off = (size_t)D->lin_slot * (K - 1) * Dc;
    size_t rec_off = g->conv_n + (size_t)D->lin_slot * nv * dk * dv;
    TRY(loom_cuda_rmsnorm(c, g->xb, g->x, D->attn_norm, T, H, eps, 0));
    if (D->lin_fused) {
        TRY(linear(g, g->l_raw, g->xb, &D->in_qkvz, NULL, T));
        TRY(linear(g, g->l_raw_ba, g->xb, &D->in_ba, NULL, T));
        TRY(loom_cuda_lin_split(c, g->l_qkv, g->l_z, g->l_b, g->l_a, g->l_raw, g->l_raw_ba, T, nk,
                                dk, nv / nk, dv, Dc));
    } else {
        TRY(linear(g, g->l_qkv, g->xb, &D->in_qkv, NULL, T));
        TRY(linear(g, g->l_z, g->xb, &D->in_z, NULL, T));
        TRY(linear(g, g->l_b, g->xb, &D->in_b, NULL, T));
        TRY(linear(g, g->l_a, g->xb, &D->in_a, NULL, T));
    }
    TRY(loom_cuda_lin_conv(c, g->l_conv, g->l_qkv, D->conv_w, K, Dc, T, S->n_rows, S->rtok,
                           g->d_sptr, conv_off));
    TRY(loom_cuda_lin_prep(c, g->l_conv, g->l_beta, g->l_g, g->l_b, g->l_a, D->neg_a, D->dt_bias,
                           T, Dc, nk, dk, nv));
    /* Long prefill rows by chunks; decode (graphs capture it) and proposals
     * token by token. Either way the states end as the recurrence leaves
     * them (to rounding): the prefix cache and decode read them. */
    loom_status ds = LOOM_ERR_UNSUPPORTED;
    if (g->lin_chunk > 0 && !S->decode && !S->verify && S->max_new >= g->lin_chunk) {
        ds = loom_cuda_lin_delta_chunked(c, g->l_o, g->l_conv, g->l_beta, g->l_g, T, S->n_rows,
                                         S->max_new, S->rtok, g->d_sptr, rec_off, Dc, nk, nv,
                                         dk, dv, g->lin_chunk);
        if (ds == LOOM_ERR_UNSUPPORTED) loom_err_clear();  /* too little shared memory */
        else TRY(ds);
    }
    if (ds == LOOM_ERR_UNSUPPORTED)
        TRY(loom_cuda_lin_delta(c, g->l_o, g->l_conv, g->l_beta, g->l_g, S->n_rows, S->rtok,
                                g->d_sptr, rec_off, Dc, nk, nv, dk, dv));
    TRY(loom_cuda_lin_gated_norm(c, g->l_y, g->l_o, g->l_z, D->lin_norm, T, nv, dv, eps));
    TRY(linear(g, g->xb, g->l_y, &D->lin_out, NULL, T));
    TRY(residual(g, g->xb, D->post_attn_norm, T));
    return ffn_f32(g, D, T);
}

/* out (T, w's columns) = rows ids[t] of the table w, times scale. */
static loom_status embed_rows(loom_cuda_model *g, float *out, const dweight *w,
                              const int32_t *ids, int T, float scale) {
    loom_cuda *c = g->c;
    if (w->f8) {
        const loom_cuda_f8mat *f = &w->fm;
        dim3 grid(LOOM_MIN_U(loom_cuda_blocks((size_t)f->cols, 256), 64u), (unsigned)T);
        fw_embed_f8<<<grid, 256, 0, c->stream>>>(out, f->d_w, f->d_scales, f->cols, f->br, f->bc,
                                                 ids, scale);
        LAUNCH_CHECK();
        return LOOM_OK;
    }
    if (w->quant) {
        const loom_cuda_qmat *q = &w->qm;
        dim3 grid(LOOM_MIN_U(loom_cuda_blocks((size_t)q->cols, 256), 64u), (unsigned)T);
        fw_embed_q<<<grid, 256, 0, c->stream>>>(out, q->d_w, q->d_scales, q->d_biases, q->cols,
                                                q->bits, q->group, q->f16, ids, scale);
        LAUNCH_CHECK();
        return LOOM_OK;
    }
    return loom_cuda_embed(c, out, w->d, w->dt, w->cols, ids, T, scale);
}

/* Every layer's per-layer input (ple.c's loom_ple_inputs) from the scaled
 * token embeddings in x: ple_in (T, n_layers, P) = (norm(proj(x) /
 * sqrt(hidden)) + table(id) * its scale) / sqrt(2). */
static loom_status ple_inputs(loom_cuda_model *g, const fw_step *S) {
    const loom_model *m = g->m;
    const loom_config *cf = &m->cfg;
    int T = S->T, P = cf->per_layer_input_dim, L = cf->n_layers;
    size_t n = (size_t)T * L * P;
    TRY(linear(g, g->ple_in, g->x, &g->ple_model_proj, NULL, T));
    TRY(loom_cuda_scale(g->c, g->ple_in, n, (float)(1.0 / sqrt((double)cf->hidden_size))));
    TRY(loom_cuda_rmsnorm(g->c, g->ple_in, g->ple_in, g->ple_proj_norm, T * L, P,
                          (float)cf->rms_eps, 0));
    TRY(embed_rows(g, g->ple_e, &g->ple_embed, S->tok, T, m->ple_embed_scale));
    return loom_cuda_add_scale(g->c, g->ple_in, g->ple_e, n, (float)0.70710678118654752440);
}

/* What ends layer l after the MLP's residual add: its per-layer input
 * block, x += norm(proj(act(gate(x)) * ple_l)) (ple.c's loom_ple_block),
 * and its layer scalar. */
static loom_status layer_end(loom_cuda_model *g, const dlayer *D, int l, int T) {
    const loom_config *cf = &g->m->cfg;
    int H = cf->hidden_size;
    if (D->ple_gate.rows) {
        int P = cf->per_layer_input_dim, gelu = g->m->act == LOOM_ACT_GELU_TANH;
        TRY(linear(g, g->ple_tmp, g->x, &D->ple_gate, NULL, T));
        TRY(loom_cuda_act_mul_ld(g->c, g->ple_tmp, g->ple_in + (size_t)l * P, T, P,
                                 cf->n_layers * P, gelu));
        TRY(linear(g, g->xb, g->ple_tmp, &D->ple_proj, NULL, T));
        TRY(residual(g, g->xb, D->ple_norm, T));
    }
    if (D->out_scale != 1.0f) TRY(loom_cuda_scale(g->c, g->x, (size_t)T * H, D->out_scale));
    return LOOM_OK;
}

/* Prepared input: a row's own layer-0 input rows in place of its token
 * embeddings (image features spliced in on the host). */
static loom_status fw_embeds(loom_cuda_model *g, const fw_step *S) {
    size_t H = (size_t)g->m->cfg.hidden_size;
    for (int r = 0; S->prep && r < S->n_in; r++)
        if (S->rows[r].embeds)
            CUDA_CHECK(cudaMemcpyAsync(g->x + (size_t)S->h_rtok[r] * H, S->rows[r].embeds,
                                       (size_t)S->rows[r].n * H * sizeof(float),
                                       cudaMemcpyHostToDevice, g->c->stream));
    return LOOM_OK;
}

/* Deepstack: after layer l, plane l of a row's features added to its
 * tokens' hidden states (as the CPU forward's add_deepstack). */
static loom_status fw_deepstack(loom_cuda_model *g, const fw_step *S, int l) {
    size_t H = (size_t)g->m->cfg.hidden_size;
    for (int r = 0; S->prep && r < S->n_in; r++) {
        const loom_fwd_row *row = &S->rows[r];
        if (!row->deepstack || l >= row->n_deep) continue;
        size_t n = (size_t)row->n * H, t0 = (size_t)S->h_rtok[r] * H;
        CUDA_CHECK(cudaMemcpyAsync(g->d_deep + t0, row->deepstack + (size_t)l * row->pos_ld * H,
                                   n * sizeof(float), cudaMemcpyHostToDevice, g->c->stream));
        fw_add<<<loom_cuda_blocks(n, 256), 256, 0, g->c->stream>>>(g->x + t0, g->d_deep + t0, n);
        LAUNCH_CHECK();
    }
    return LOOM_OK;
}

/* Everything on the device between the integer upload and the copies back:
 * what a decode graph captures. Reads per-step values only from S's
 * device arrays. */
static loom_status fw_body(loom_cuda_model *g, const fw_step *S) {
    const loom_model *m = g->m;
    const loom_config *cf = &m->cfg;
    loom_cuda *c = g->c;
    int T = S->T, H = cf->hidden_size, nh = cf->n_heads, bs = g->kv_bs;
    for (int i = 0; i < m->n_ropes; i++) {
        size_t off = (size_t)i * g->step_tokens * g->max_half;
        TRY(loom_cuda_rope_table_dev(c, g->cs + off, g->sn + off, g->max_half, S->rp, T,
                                     g->inv_freq[i], m->ropes[i].rot_dim, m->ropes[i].scale,
                                     g->stream[i], T));
    }
    TRY(embed_rows(g, g->x, &g->embed, S->tok, T, m->embed_scale));
    TRY(fw_embeds(g, S));
    if (m->has_ple) TRY(ple_inputs(g, S));

    float eps = (float)cf->rms_eps;
    size_t TH = (size_t)T * H;
    /* a shard's o and down outputs are summed before they join x: not the
     * small-step path, whose GEMVs add them into x themselves */
    int small = g->act16 != LOOM_CUDA_F32 && T <= g->small_t && T <= g->gemv_t && !g->tp;
    for (int l = 0; l < cf->n_layers; l++) {
        if (l > 0) { /* every path below ends its layer with continue */
            TRY(fw_deepstack(g, S, l - 1));
            TRY(fw_taps(g, S, l - 1));
        }
        const loom_layer *L = &m->layers[l];
        const loom_attn *A = &L->attn;
        const dlayer *D = &g->layers[l];
        if (D->lin) {
            TRY(lin_layer(g, D, S));
            TRY(layer_end(g, D, l, T));
            continue;
        }
        int hd = A->head_dim, nkv = A->n_kv_heads, kvd = nkv * hd;
        const loom_rope *R = &m->ropes[A->rope];
        int a16 = g->act16 != LOOM_CUDA_F32;
        /* the rows of the layer whose KV this one reads (its own unless shared) */
        size_t layer_off = (size_t)D->kv_layer * g->kv_blocks * g->kv_bs * g->kv_row_bytes;
        int own_kv = D->kv_layer == l;
        size_t esz = g->kv_dt == LOOM_CUDA_F32 ? 4 : 2;
        char *pk = (char *)g->kv_k + layer_off, *pv = (char *)g->kv_v + layer_off;
        loom_cuda_kv dkv = {pk, pv, g->kv_dt, bs, g->kv_row_bytes / esz};
        size_t roff = (size_t)A->rope * g->step_tokens * g->max_half;
        /* verification keeps to the decode path's roundings: no bf16
         * queries and weights in the attention, no bf16 q/k/v or gate/up
         * (below), so a target's pick over a proposal is the pick plain
         * decoding makes there, up to the order of f32 sums */
        loom_cuda_attn at = {nh, nkv, hd, A->scale, (float)cf->attn_softcap, A->window, !S->verify,
                             S->slo, S->shi};
        if (small) {
            /* x holds the whole residual: each GEMV makes its own input (norm,
             * activation) and wo and down add into x */
            int gelu = m->act == LOOM_ACT_GELU_TANH;
            TRY(gemv(g, g->qkv, LOOM_CUDA_GEMV_RMSNORM, g->x, D->attn_norm, &D->wqkv, NULL, T, 0));
            /* not for verification: a token's attention there reads the K/V
             * rows other blocks of the fused kernel store */
            if (S->decode && g->attn_qkv && !S->verify &&
                loom_cuda_attn_decode_qkv_ok(c, &dkv, &at, R->rot_dim, S->n_rows, S->max_len)) {
                /* qkv_post inside the attention: five kernels a layer */
                TRY(loom_cuda_attn_decode_qkv(c, g->att, g->q, &dkv, &at, g->qkv, D->bqkv,
                                              D->q_norm, D->k_norm, eps, S->slot, R->rot_dim,
                                              g->cs + roff, g->sn + roff, g->max_half, S->tab,
                                              S->tstride, S->lens, S->n_rows, S->max_len));
            } else {
                TRY(loom_cuda_qkv_post(c, g->q, &dkv, g->qkv, D->bqkv, D->q_norm, D->k_norm, eps,
                                       S->slot, T, nh, nkv, hd, R->rot_dim, g->cs + roff,
                                       g->sn + roff, g->max_half));
                if (S->decode)
                    TRY(loom_cuda_attn_decode(c, g->att, g->q, &dkv, &at, S->tab, S->tstride,
                                              S->lens, S->n_rows, S->max_len));
                else
                    TRY(loom_cuda_attn_prefill(c, g->att, g->q, &dkv, &at, S->tab, S->tstride,
                                               S->rtok, S->rpos, S->n_rows, S->max_new));
            }
            TRY(gemv(g, g->x, LOOM_CUDA_GEMV_F32, g->att, NULL, &D->wo, D->bo, T, 1));
            if (D->moe) {
                TRY(loom_cuda_rmsnorm(c, g->xb, g->x, D->ffn_norm, T, H, eps, 0));
                TRY(moe_ffn(g, D, T));
                continue;
            }
            TRY(gemv(g, g->hb, LOOM_CUDA_GEMV_RMSNORM, g->x, D->ffn_norm, &D->gate_up, NULL, T, 0));
            TRY(gemv(g, g->x, gelu ? LOOM_CUDA_GEMV_GELU : LOOM_CUDA_GEMV_SILU, g->hb, NULL,
                     &D->down, NULL, T, 1));
            continue;
        }
        /* 16-bit inputs: the o and down projections add into x themselves */
        int oacc = a16 && !D->wo.quant && !g->tp;
        if (a16)
            TRY(loom_cuda_add_rmsnorm16(c, g->a16, g->x, NULL, D->attn_norm, T, H, eps, g->act16));
        else
            TRY(loom_cuda_rmsnorm(c, g->xb, g->x, D->attn_norm, T, H, eps, 0));
        if (D->fused_qkv) {
            /* one GEMM, then bias, q/k norms, rope and the K/V store in one pass */
            if (a16 && g->qkv16 && !S->verify && D->wqkv.dt == LOOM_CUDA_BF16 &&
                !use_gemv(g, &D->wqkv, T)) {
                /* bf16 q/k/v: half the bytes between the GEMM and qkv_post */
                TRY(loom_cuda_gemm16_bf16out(c, g->qkv, g->a16, D->wqkv.d, T, D->wqkv.rows,
                                             D->wqkv.cols));
                TRY(loom_cuda_qkv_post_bf16(c, g->q, &dkv, g->qkv, D->bqkv, D->q_norm, D->k_norm,
                                            eps, S->slot, T, nh, nkv, hd, R->rot_dim,
                                            g->cs + roff, g->sn + roff, g->max_half));
            } else {
                if (a16) TRY(linear16(g, g->qkv, &D->wqkv, NULL, T));
                else TRY(linear(g, g->qkv, g->xb, &D->wqkv, NULL, T));
                TRY(loom_cuda_qkv_post(c, g->q, &dkv, g->qkv, D->bqkv, D->q_norm, D->k_norm, eps,
                                       S->slot, T, nh, nkv, hd, R->rot_dim, g->cs + roff,
                                       g->sn + roff, g->max_half));
            }
        } else {
            /* k and v only where the layer keeps its own KV; v the raw k
             * (bias included) where k_eq_v */
            int vproj = own_kv && !D->k_eq_v;
            if (a16) {
                TRY(linear16(g, g->q, &D->wq, D->bq, T));
                if (own_kv) TRY(linear16(g, g->k, &D->wk, D->bk, T));
                if (vproj) TRY(linear16(g, g->v, &D->wv, D->bv, T));
            } else {
                if (D->gated) {
                    /* per head [query | gate]: the gate multiplies the attention's output */
                    TRY(linear(g, g->qraw, g->xb, &D->wq, D->bq, T));
                    TRY(loom_cuda_attn_gate_split(c, g->q, g->gate, g->qraw, T, nh, hd));
                } else {
                    TRY(linear(g, g->q, g->xb, &D->wq, D->bq, T));
                }
                if (own_kv) TRY(linear(g, g->k, g->xb, &D->wk, D->bk, T));
                if (vproj) TRY(linear(g, g->v, g->xb, &D->wv, D->bv, T));
            }
            if (own_kv && D->k_eq_v)
                CUDA_CHECK(cudaMemcpyAsync(g->v, g->k, (size_t)T * kvd * sizeof(float),
                                           cudaMemcpyDeviceToDevice, c->stream));
            if (D->q_norm) TRY(loom_cuda_rmsnorm(c, g->q, g->q, D->q_norm, T * nh, hd, eps, 0));
            TRY(loom_cuda_rope(c, g->q, T, nh, hd, R->rot_dim, g->cs + roff, g->sn + roff,
                               g->max_half));
            if (own_kv) {
                if (D->k_norm) TRY(loom_cuda_rmsnorm(c, g->k, g->k, D->k_norm, T * nkv, hd, eps, 0));
                if (D->v_norm) TRY(loom_cuda_rmsnorm(c, g->v, g->v, NULL, T * nkv, hd, eps, 0));
                TRY(loom_cuda_rope(c, g->k, T, nkv, hd, R->rot_dim, g->cs + roff, g->sn + roff,
                                   g->max_half));
                dim3 grid(LOOM_MIN_U(loom_cuda_blocks((size_t)kvd, 256), 16u), (unsigned)T);
                fw_kv_store<<<grid, 256, 0, c->stream>>>(pk, pv, (int)g->kv_dt,
                                                         g->kv_row_bytes / esz, g->k, g->v,
                                                         S->slot, kvd);
                LAUNCH_CHECK();
            }
        }
        /* tc (at's last field): bf16 KV already rounds K and V; prefill may
         * round q and the weights too and run on the tensor cores */
        /* prefill with a 16-bit o projection: the attention writes its
         * input (a16) directly */
        int o16 = oacc && !S->decode && D->wo.dt == g->act16 && !use_gemv(g, &D->wo, T);
        if (S->decode)
            TRY(loom_cuda_attn_decode(c, g->att, g->q, &dkv, &at, S->tab, S->tstride, S->lens,
                                      S->n_rows, S->max_len));
        else if (o16)
            TRY(loom_cuda_attn_prefill_to(c, g->a16, g->act16, g->q, &dkv, &at, S->tab,
                                          S->tstride, S->rtok, S->rpos, S->n_rows, S->max_new, T));
        else
            TRY(loom_cuda_attn_prefill(c, g->att, g->q, &dkv, &at, S->tab, S->tstride, S->rtok,
                                       S->rpos, S->n_rows, S->max_new));
        if (D->gated) TRY(loom_cuda_attn_gate_mul(c, g->att, g->gate, (size_t)T * nh * hd));
        int gelu = m->act == LOOM_ACT_GELU_TANH, I = D->gate.rows;
        if (a16) {
            if (!oacc) {
                TRY(linear(g, g->xb, g->att, &D->wo, D->bo, T));
                TRY(tp_sum(g, g->xb, T));
            } else if (use_gemv(g, &D->wo, T)) {
                TRY(gemv(g, g->x, LOOM_CUDA_GEMV_F32, g->att, NULL, &D->wo, D->bo, T, 1));
            } else {
                TRY(loom_cuda_gemm_acc(c, g->x, o16 ? g->a16 : (const void *)g->att, o16,
                                       D->wo.d, D->wo.dt, T, D->wo.rows, D->wo.cols));
                if (D->bo) {
                    fw_add_bias<<<loom_cuda_blocks(TH, 256), 256, 0, c->stream>>>(g->x, D->bo,
                                                                                TH, H);
                    LAUNCH_CHECK();
                }
            }
            if (D->moe) {
                if (!oacc) TRY(residual(g, g->xb, NULL, T));
                TRY(loom_cuda_rmsnorm(c, g->xb, g->x, D->ffn_norm, T, H, eps, 0));
                TRY(moe_ffn(g, D, T));
                continue;
            }
            TRY(loom_cuda_add_rmsnorm16(c, g->a16, g->x, oacc ? NULL : g->xb, D->ffn_norm, T, H,
                                        eps, g->act16));
            if (g->gu16 && !S->verify && !use_gemv(g, &D->gate_up, T) && I % 4 == 0) {
                /* bf16 gate/up: half the bytes between the GEMM and the activation */
                TRY(loom_cuda_gemm16_bf16out(c, g->hb, g->a16, D->gate_up.d, T, D->gate_up.rows,
                                             D->gate_up.cols));
                TRY(loom_cuda_act_mul_split_bf16(c, g->a16, g->hb, T, I, gelu));
            } else {
                TRY(linear16(g, g->hb, &D->gate_up, NULL, T));
                TRY(loom_cuda_act_mul_split16(c, g->a16, g->hb, T, I, gelu, g->act16));
            }
            if (g->tp) {
                TRY(linear16(g, g->xb, &D->down, NULL, T));
                TRY(tp_sum(g, g->xb, T));
                TRY(residual(g, g->xb, NULL, T));
            } else if (use_gemv(g, &D->down, T))
                TRY(gemv(g, g->x, LOOM_CUDA_GEMV_X16, g->a16, NULL, &D->down, NULL, T, 1));
            else
                TRY(loom_cuda_gemm_acc(c, g->x, g->a16, 1, D->down.d, D->down.dt, T,
                                       D->down.rows, D->down.cols));
            continue;
        }
        TRY(linear(g, g->xb, g->att, &D->wo, D->bo, T));
        TRY(tp_sum(g, g->xb, T));
        TRY(residual(g, g->xb, D->post_attn_norm, T));
        TRY(ffn_f32(g, D, T));
        TRY(layer_end(g, D, l, T));
    }
    TRY(fw_deepstack(g, S, cf->n_layers - 1));
    TRY(fw_taps(g, S, cf->n_layers - 1));

    int n_sel = g->tp_rank > 0 ? 0 : S->n_sel, V = cf->vocab_size;  /* rank 0 has the head */
    if (n_sel > 0) {
        /* every token selected: sel is the identity, x is read in place */
        const float *hx = g->x;
        if (n_sel < T) {
            dim3 grid(LOOM_MIN_U(loom_cuda_blocks((size_t)H, 256), 64u), (unsigned)n_sel);
            fw_gather<<<grid, 256, 0, c->stream>>>(g->xb, g->x, S->sel, H);
            LAUNCH_CHECK();
            hx = g->xb;
        }
        /* The final norm made inside the GEMV, and there the greedy picks
         * too (not after a softcap: it can tie values the raw logits order). */
        int am_done = 0;
        if (use_gemv(g, &g->lm_head, n_sel)) {
            am_done = g->head_am && !(cf->final_softcap > 0);
            loom_cuda_gemv_in in = {LOOM_CUDA_GEMV_RMSNORM, hx, g->final_norm, eps};
            TRY(loom_cuda_gemv_argmax(c, g->logits, &in, g->lm_head.d, g->lm_head.dt, n_sel,
                                      g->lm_head.rows, g->lm_head.cols, NULL, 0,
                                      am_done ? g->ids : NULL));
        } else {
            TRY(loom_cuda_rmsnorm(c, g->xb, hx, g->final_norm, n_sel, H, eps, 0));
            TRY(linear(g, g->logits, g->xb, &g->lm_head, NULL, n_sel));
        }
        size_t NV = (size_t)n_sel * V;
        if (cf->final_softcap > 0) {
            fw_softcap<<<loom_cuda_blocks(NV, 256), 256, 0, c->stream>>>(g->logits, NV,
                                                                        (float)cf->final_softcap);
            LAUNCH_CHECK();
        }
        /* greedy picks for the rows that take them (cheap next to the head) */
        if (!am_done) TRY(loom_cuda_argmax(c, g->ids, g->logits, n_sel, V));
    }
    return LOOM_OK;
}

/* The graph slot of a decode key: the existing one, else a free or the
 * least recently used one (reset). */
static struct loom_cuda_model::fw_graph *graph_slot(loom_cuda_model *g, const fw_step *S) {
    struct loom_cuda_model::fw_graph *best = NULL;
    for (int i = 0; i < FW_GRAPHS; i++) {
        struct loom_cuda_model::fw_graph *x = &g->graphs[i];
        if (x->state != 0 && x->n_rows == S->n_rows && x->tstride == S->tstride &&
            x->verify == S->verify && x->taps == S->taps)
            return x;
        if (!best || x->state == 0 || (best->state != 0 && x->used < best->used)) best = x;
    }
    if (best->state == 2) cudaGraphExecDestroy(best->exec);
    memset(best, 0, sizeof *best);
    best->n_rows = S->n_rows;
    best->tstride = S->tstride;
    best->verify = S->verify;
    best->taps = S->taps;
    return best;
}

/* Runs the body of a decode step through its graph (capturing it on the
 * second step of its key), or eagerly. */
static loom_status fw_run(loom_cuda_model *g, const fw_step *S, int graphable) {
    loom_cuda *c = g->c;
    if (!graphable || !g->use_graphs) return fw_body(g, S);
    struct loom_cuda_model::fw_graph *x = graph_slot(g, S);
    x->used = ++g->clock;
    if (x->state == 2 && (x->sgen != c->scratch_gen || x->lgen != g->logits_gen)) {
        cudaGraphExecDestroy(x->exec);  /* scratch or logits moved: capture again */
        x->state = 1;
    }
    if (x->state == 2) {
        CUDA_CHECK(cudaGraphLaunch(x->exec, c->stream));
        g->st_replayed = 1;
        return LOOM_OK;
    }
    if (x->state != 1) {  /* first sight (sizes scratch and logits) or refused */
        if (x->state == 0) x->state = 1;
        return fw_body(g, S);
    }
    cudaGraph_t graph = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->capturing = 1;
    loom_status st = fw_body(g, S);
    c->capturing = 0;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    cudaGraphExec_t exec = NULL;
    if (st == LOOM_OK && e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (st != LOOM_OK || e != cudaSuccess) {
        /* Something in the body cannot be captured: this key runs eagerly. */
        loom_log(LOOM_CUDA_LOG_WARN, "cuda forward: decode graph for %d rows not captured (%s); "
                 "running without", S->n_rows, st != LOOM_OK ? loom_last_error()
                                                             : cudaGetErrorString(e));
        cudaGetLastError();
        loom_err_clear();
        x->state = -1;
        return fw_body(g, S);
    }
    x->exec = exec;
    x->state = 2;
    x->sgen = c->scratch_gen;
    x->lgen = g->logits_gen;
    CUDA_CHECK(cudaGraphLaunch(x->exec, c->stream));
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_model_set_tp(loom_cuda_model *g, loom_cuda_tp *t, int rank) {
    if (rank < 0 || rank >= loom_cuda_tp_size(t))
        return loom_err(LOOM_ERR_INVALID_ARG, "tensor parallel: rank %d of %d", rank,
                        loom_cuda_tp_size(t));
    if (g->taps_out)
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor parallel: a drafter's hidden states are "
                        "not exported from a split model");
    g->tp = t;
    g->tp_rank = rank;
    g->use_graphs = 0;  /* the sums hold host barriers (one device) or NCCL calls */
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_set_taps(loom_cuda_model *g, const int *layers, int n,
                                          float *out) {
    const loom_config *cf = &g->m->cfg;
    g->taps_out = NULL;
    if (!out || n <= 0) return LOOM_OK;
    if (g->tp)
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor parallel: a drafter's hidden states are "
                        "not exported from a split model");
    if (n > FW_TAPS_MAX)
        return loom_err(LOOM_ERR_INVALID_ARG, "cuda forward: %d layers' hidden states asked for, "
                        "at most %d", n, FW_TAPS_MAX);
    for (int k = 0; k < n; k++)
        if (layers[k] < 0 || layers[k] >= cf->n_layers)
            return loom_err(LOOM_ERR_INVALID_ARG, "cuda forward: hidden states of layer %d asked "
                            "for; the model has %d layers", layers[k], cf->n_layers);
    int same = n == g->n_taps;
    for (int k = 0; k < n && same; k++) same = g->tap_layers[k] == layers[k];
    size_t need = (size_t)g->step_tokens * n * cf->hidden_size;
    if (need > g->taps_cap) {
        CUDA_CHECK(cudaStreamSynchronize(g->c->stream));
        if (g->d_taps) g_release(g, g->d_taps);
        g->d_taps = NULL;
        g->taps_cap = 0;
        TRY(g_alloc(g, (void **)&g->d_taps, need * sizeof(float)));
        g->taps_cap = need;
        same = 0;
    }
    if (!same) {
        memcpy(g->tap_layers, layers, sizeof *layers * (size_t)n);
        g->n_taps = n;
        g->logits_gen++; /* captured graphs copy the old layers, or into the old buffer */
    }
    g->taps_out = out;
    return LOOM_OK;
}

/* A row's span bounds (the CPU forward's tok_first / tok_last): a run of
 * equal groups >= 0 is one span, every other token its own position. */
static void fw_spans(const loom_fwd_row *row, int32_t *lo, int32_t *hi) {
    int p0 = row->seq->n_tokens, n = row->n;
    const int32_t *g = row->groups;
    for (int a = 0, b; a < n; a = b) {
        for (b = a + 1; g && g[a] >= 0 && b < n && g[b] == g[a];) b++;
        for (int i = a; i < b; i++) {
            lo[i] = g && g[a] >= 0 ? p0 + a : p0 + i;
            hi[i] = g && g[a] >= 0 ? p0 + b - 1 : p0 + i;
        }
    }
}

/* Whether row r gets its token from the device: asked for (picks -1, last
 * logits), and greedy or of a vocabulary the device sampler takes (else
 * its logits are copied and the pick left to the host). */
static int takes_pick(const loom_fwd_row *rows, int r, const int32_t *picks,
                      const loom_sample_pick *samp, int V) {
    if (!picks || picks[r] != -1 || rows[r].logits != LOOM_LOGITS_LAST) return 0;
    return !(samp && samp[r].temperature > 0) || loom_cuda_sample_fits(V);
}

/* Whether row r gets every position's greedy id (a verification row that
 * asks: loom_fwd_row's ids) instead of its logits. */
static int takes_ids(const loom_fwd_row *row) {
    return row->ids && row->logits == LOOM_LOGITS_ALL;
}

extern "C" loom_status loom_cuda_forward(loom_cuda_model *g, loom_kv_layout *kv,
                                         loom_fwd_row *rows, int n_rows, int32_t *picks_in,
                                         const loom_sample_pick *samp_in) {
    const loom_model *m = g->m;
    const loom_config *cf = &m->cfg;
    loom_cuda *c = g->c;
    int T = 0;
    if (n_rows <= 0) return LOOM_OK;
    double st_enter = g->st_on ? loom_now() : 0, st_launch = 0, st_sync = 0;
    loom_status st = check_rows(g, kv, rows, n_rows, &T);
    if (st != LOOM_OK) return st;
    int V = cf->vocab_size, bs = kv->block_size;

    /* Host side of the step: ids, KV slots, positions, rows, tables. */
    fw_step S;
    memset(&S, 0, sizeof S);
    S.T = T;
    S.n_rows = n_rows;
    S.tstride = 1;
    S.decode = 1;
    int all_dec = 1, hidden = 0, deep = 0, spans = 0;
    for (int r = 0; r < n_rows; r++) {
        for (int i = 0; rows[r].groups && i < rows[r].n && !spans; i++) spans = rows[r].groups[i] >= 0;
        S.prep |= rows[r].embeds != NULL || rows[r].deepstack != NULL;
        deep |= rows[r].deepstack != NULL && rows[r].n_deep > 0;
        int end = rows[r].seq->n_tokens + rows[r].n;
        S.tstride = LOOM_MAX_I(S.tstride, (end + bs - 1) / bs);
        S.max_new = LOOM_MAX_I(S.max_new, rows[r].n);
        S.max_len = LOOM_MAX_I(S.max_len, end);
        S.n_sel += loom_fwd_row_logits(&rows[r]);
        S.decode &= rows[r].n == 1;
        S.verify |= rows[r].decode && rows[r].n > 1;
        all_dec &= rows[r].decode && loom_fwd_row_logits(&rows[r]) == rows[r].n;
        hidden |= rows[r].hidden != NULL;
    }
    S.taps = g->taps_out != NULL;
    /* A step of decode rows only, some carrying proposals (every token's
     * logits wanted), is a decode step of T one-token sequences: token i
     * of a row at position p attends to [lo, p] through the row's own
     * block table, after the step's K/V rows are stored. Each token then
     * takes plain decoding's attention, and the step a decode graph. */
    int expand = S.verify && all_dec && !hidden;
    if (expand) {
        S.decode = 1;
        S.n_rows = T;
    }
    int graphable = S.decode && S.n_sel == S.n_rows && !hidden && !S.prep;
    if (S.decode) {
        /* Round the table width up to 16 blocks (and size the attention grid
         * by it) so that a decode graph serves many steps. */
        int tmax = (g->max_ctx + bs - 1) / bs;
        S.tstride = LOOM_MIN_U((unsigned)((S.tstride + 15) / 16 * 16), (unsigned)tmax);
        S.max_len = S.tstride * bs;
    }
    /* lens and tables per attention sequence (S.n_rows <= T: ints_cap).
     * Every offset follows from T and S.n_rows alone, which a decode
     * graph's key fixes: a verification step of T tokens has as many
     * attention sequences whatever rows carry them, and a graph replayed
     * for it must find its lengths and tables where it read them. */
    int ns = S.n_rows;
    int32_t *h_tok = g->h_ints, *h_slot = h_tok + T, *h_sel = h_slot + T;
    int32_t *h_rtok = h_sel + T, *h_rpos = h_rtok + T + 1, *h_lens = h_rpos + T;
    int32_t *h_tab = h_lens + ns, *h_rp = h_tab + (size_t)ns * S.tstride;
    int32_t *h_slo = h_rp + 3 * (size_t)T, *h_shi = h_slo + T;
    size_t n_ints = (size_t)(h_rp - g->h_ints) + (spans ? 5 : 3) * (size_t)T;
    for (int r = 0, t = 0, j = 0; r < n_rows; r++) {
        const loom_kv_seq *seq = rows[r].seq;
        h_rtok[r] = t;
        h_rpos[r] = seq->n_tokens;
        for (int i = 0; i < rows[r].n; i++, t++) {
            int pos = seq->n_tokens + i;
            h_tok[t] = rows[r].tokens[i];
            h_slot[t] = seq->blocks[pos / bs] * bs + pos % bs;
            for (int k = 0; k < 3; k++)
                h_rp[(size_t)k * T + t] = rows[r].pos3 ? rows[r].pos3[(size_t)k * rows[r].pos_ld + i]
                                                       : pos + rows[r].pos_delta;
            if (rows[r].logits == LOOM_LOGITS_ALL || (rows[r].logits == LOOM_LOGITS_LAST && i == rows[r].n - 1))
                h_sel[j++] = t;
            if (!expand && i > 0) continue;
            /* the sequence of the row, or (expanded) of its token t */
            int q = expand ? t : r;
            h_lens[q] = expand ? pos + 1 : seq->n_tokens + rows[r].n;
            for (int b = 0; b < S.tstride; b++)
                h_tab[(size_t)q * S.tstride + b] = b < seq->n_blocks ? seq->blocks[b] : -1;
        }
        h_rtok[r + 1] = t;
        if (spans) fw_spans(&rows[r], h_slo + h_rtok[r], h_shi + h_rtok[r]);
    }
    S.tok = g->ints;
    S.slot = S.tok + T;
    S.sel = S.slot + T;
    S.rtok = S.sel + T;
    S.rpos = S.rtok + T + 1;
    S.lens = S.rpos + T;
    S.tab = S.lens + ns;
    S.rp = S.tab + (size_t)ns * S.tstride;
    S.slo = spans ? S.rp + 3 * (size_t)T : NULL;
    S.shi = spans ? S.slo + T : NULL;
    S.rows = rows;
    S.n_in = n_rows;
    S.h_rtok = h_rtok;
    if (deep && !g->d_deep)
        TRY(g_alloc(g, (void **)&g->d_deep, (size_t)g->step_tokens * cf->hidden_size * sizeof(float)));
    int st_step = g->st_on && graphable && g->use_graphs && S.n_sel <= g->logits_rows;
    cudaEvent_t *ev = g->st_ev[g->st_cur];
    if (st_step) CUDA_CHECK(cudaEventRecord(ev[0], c->stream));
    /* Pinned source: the copy runs in stream order; h_ints is rewritten
     * only by the next step, after this one's final synchronisation. */
    CUDA_CHECK(cudaMemcpyAsync(g->ints, g->h_ints, n_ints * 4, cudaMemcpyHostToDevice, c->stream));
    TRY(lin_states(g, rows, n_rows));

    if (S.n_sel > g->logits_rows && g->tp_rank == 0) {  /* other ranks run no head */
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        if (g->logits) {
            for (int i = 0; i < g->n_allocs; i++)
                if (g->allocs[i] == g->logits) g->allocs[i] = g->allocs[--g->n_allocs];
            loom_cuda_release(c, g->logits);
            g->logits = NULL;
            g->logits_rows = 0;
        }
        TRY(g_alloc(g, (void **)&g->logits, (size_t)S.n_sel * V * 4));
        g->logits_rows = S.n_sel;
        g->logits_gen++;
    }
    g->st_replayed = 0;
    TRY(fw_run(g, &S, graphable));
    if (g->tp_rank > 0) {  /* rank 0 hands back what the step made */
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        return LOOM_OK;
    }
    st_step &= g->st_replayed;
    if (S.taps)
        CUDA_CHECK(cudaMemcpyAsync(g->taps_out, g->d_taps,
                                   (size_t)T * g->n_taps * cf->hidden_size * sizeof(float),
                                   cudaMemcpyDeviceToHost, c->stream));
    if (hidden) {
        /* embeddings: every token's hidden state after the final norm, in
         * xb (the head has read it by now, in stream order); the rows that
         * ask get theirs */
        int H = cf->hidden_size;
        TRY(loom_cuda_rmsnorm(c, g->xb, g->x, g->final_norm, T, H, (float)cf->rms_eps, 0));
        for (int r = 0; r < n_rows; r++)
            if (rows[r].hidden)
                CUDA_CHECK(cudaMemcpyAsync(rows[r].hidden, g->xb + (size_t)h_rtok[r] * H,
                                           (size_t)rows[r].n * H * 4, cudaMemcpyDeviceToHost, c->stream));
    }
    if (st_step) {
        CUDA_CHECK(cudaEventRecord(ev[1], c->stream));
        st_launch = loom_now();
    }

    /* rows that take a device pick: greedy (argmax, computed in the body)
     * or sampled here from their logits row */
    int any = 0, n_samp = 0;
    for (int r = 0, j = 0; r < n_rows; r++) {
        int cnt = loom_fwd_row_logits(&rows[r]);
        int pick = takes_pick(rows, r, picks_in, samp_in, V);
        any |= pick || takes_ids(&rows[r]);
        for (int k = 0; k < cnt; k++, j++) {
            int sampled = pick && samp_in && samp_in[r].temperature > 0;
            /* other rows: a cheap, valid setting (one round); their result is unused */
            loom_sample_pick one = {1.0f, 1.0f, 0.0f, 1, 0.0};
            g->h_samp[j] = sampled ? samp_in[r] : one;
            n_samp += sampled;
        }
    }
    if (any) {
        if (n_samp) {
            CUDA_CHECK(cudaMemcpyAsync(g->samp, g->h_samp, (size_t)S.n_sel * sizeof *g->samp,
                                       cudaMemcpyHostToDevice, c->stream));
            TRY(loom_cuda_sample(c, g->sids, g->logits, S.n_sel, V, g->samp));
            CUDA_CHECK(cudaMemcpyAsync(g->h_sids, g->sids, (size_t)S.n_sel * 4,
                                       cudaMemcpyDeviceToHost, c->stream));
        }
        CUDA_CHECK(cudaMemcpyAsync(g->h_ids, g->ids, (size_t)S.n_sel * 4, cudaMemcpyDeviceToHost,
                                   c->stream));
    }
    for (int r = 0, j = 0; r < n_rows; r++) {
        int cnt = loom_fwd_row_logits(&rows[r]);
        int pick = takes_pick(rows, r, picks_in, samp_in, V);
        if (cnt && !pick && !takes_ids(&rows[r]))
            CUDA_CHECK(cudaMemcpyAsync(rows[r].out, g->logits + (size_t)j * V, (size_t)cnt * V * 4,
                                       cudaMemcpyDeviceToHost, c->stream));
        j += cnt;
    }
    if (st_step) {
        CUDA_CHECK(cudaEventRecord(ev[2], c->stream));
        st_sync = loom_now();
    }
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    if (st_step) {
        /* the previous step's events are complete and not yet re-recorded */
        double now = loom_now();
        float body = 0, all = 0, idle = 0;
        cudaEventElapsedTime(&body, ev[0], ev[1]);
        cudaEventElapsedTime(&all, ev[0], ev[2]);
        int prev = g->st_prev_enter > 0 && g->st_rows == n_rows;
        if (prev) cudaEventElapsedTime(&idle, g->st_ev[g->st_cur ^ 1][2], ev[0]);
        if (!prev || g->st_n == 128) st_flush(g);
        if (prev) {
            double *a = g->st_sum;
            a[0] += st_enter - g->st_prev_enter;
            a[1] += body;
            a[2] += all;
            a[3] += idle;
            a[4] += st_launch - st_enter;
            a[5] += now - st_sync;
            g->st_n++;
        }
        g->st_rows = n_rows;
        g->st_prev_enter = st_enter;
        g->st_cur ^= 1;
    } else if (g->st_on) {
        g->st_prev_enter = 0;
    }
    for (int r = 0, j = 0; r < n_rows; r++) {
        int cnt = loom_fwd_row_logits(&rows[r]);
        if (cnt && takes_pick(rows, r, picks_in, samp_in, V))
            picks_in[r] = samp_in && samp_in[r].temperature > 0 ? g->h_sids[j] : g->h_ids[j];
        if (takes_ids(&rows[r])) memcpy(rows[r].ids, g->h_ids + j, sizeof *rows[r].ids * (size_t)cnt);
        j += cnt;
    }
    for (int r = 0; r < n_rows && m->n_linear > 0; r++) loom_seq_state_dev_advanced(rows[r].state);
    loom_fwd_commit_states(rows, n_rows);
    /* a split model's sequences advance once every rank has succeeded */
    for (int r = 0; r < n_rows && !g->tp; r++) rows[r].seq->n_tokens += rows[r].n;
    return LOOM_OK;
}
#undef TRY
