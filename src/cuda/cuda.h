/* cuda: the CUDA backend's kernels, behind plain C entry points.
 *
 * Built only with `make CUDA=1` (the .cu files here, nvcc, sm_90). Every kernel
 * here has a plain-C reference on the CPU side (src/ops/ops_ref.c, the
 * forward's attention, moe.c's routing and experts);
 * tests/cuda/test_cuda_kernels.c checks each one
 * against it on random data and odd sizes.
 *
 * Conventions
 * - A loom_cuda is one device, one stream and one cuBLAS handle; it is used
 *   from one thread. Every kernel call is enqueued on that stream and returns
 *   at once; launch errors come back as LOOM_ERR_INTERNAL with file:line and
 *   the CUDA message (loom_last_error()). loom_cuda_sync() waits for the
 *   stream and reports errors of kernels that already ran.
 * - Pointers named d_* are device memory (from loom_cuda_alloc); everything
 *   else is host memory. Shapes are given as (rows, cols), row-major.
 * - The context owns a scratch area that grows on demand (GEMM input
 *   conversion, flash-decoding partials). Growing synchronizes the stream;
 *   after the first step of a given size nothing is allocated again. */
#ifndef LOOM_CUDA_H
#define LOOM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* a C header without extern "C" guards of its own */
#include "sample/sample.h"

/* Element types of weights, tables and KV rows on the device. */
typedef enum loom_cuda_dtype {
    LOOM_CUDA_F32 = 0,
    LOOM_CUDA_F16 = 1,
    LOOM_CUDA_BF16 = 2,
} loom_cuda_dtype;

typedef struct loom_cuda loom_cuda;

/* ---- context, memory ---------------------------------------------------- */

/* Opens device `device` with a fresh non-blocking stream and cuBLAS handle.
 * LOOM_ERR_UNSUPPORTED when there is no such device. */
loom_status loom_cuda_create(int device, loom_cuda **out);
void loom_cuda_free(loom_cuda *c);
/* The device's name ("NVIDIA H200") and compute capability. */
const char *loom_cuda_device_name(const loom_cuda *c);
int loom_cuda_device_cc(const loom_cuda *c);  /* major * 10 + minor */
/* Waits for everything enqueued so far; reports asynchronous errors. */
loom_status loom_cuda_sync(loom_cuda *c);
/* For benchmarks: captures what fn(c, arg) enqueues into a graph, replays
 * it once to warm up, then reps times between two CUDA events; *us is the
 * microseconds of one replay. fn must only enqueue (no sync, no growth of
 * the scratch area). */
loom_status loom_cuda_time_graph(loom_cuda *c, loom_status (*fn)(loom_cuda *c, void *arg),
                                 void *arg, int reps, double *us);

/* Device allocations (cudaMalloc, 256-byte aligned). *d is NULL on failure
 * (LOOM_ERR_NOMEM, naming the size). n == 0 gives NULL and LOOM_OK. */
loom_status loom_cuda_alloc(loom_cuda *c, void **d, size_t n);
void loom_cuda_release(loom_cuda *c, void *d);
/* Copies between host and device, ordered on the stream; both wait for the
 * copy to finish, so the host buffer may be reused on return. */
loom_status loom_cuda_upload(loom_cuda *c, void *d_dst, const void *src, size_t n);
loom_status loom_cuda_download(loom_cuda *c, void *dst, const void *d_src, size_t n);
/* d_dst = 0 (n bytes), enqueued. */
loom_status loom_cuda_memset0(loom_cuda *c, void *d_dst, size_t n);

/* ---- element-wise and row kernels -------------------------------------- */

/* Each of the T rows of n values: y = x / sqrt(mean(x^2) + eps) * w, or
 * * (1 + w) when one_plus; w NULL = unweighted. y may alias x. Also serves
 * q/k norms per head (T = tokens * heads, n = head_dim). */
loom_status loom_cuda_rmsnorm(loom_cuda *c, float *d_y, const float *d_x, const float *d_w,
                              int T, int n, float eps, int one_plus);

/* Each of the T rows of n values: x += y / sqrt(mean(y^2) + eps) * w (w
 * NULL = unweighted): a post norm (gemma's sandwich norms) on a block's
 * output y and the residual add. y must not alias x. */
loom_status loom_cuda_rmsnorm_add(loom_cuda *c, float *d_x, const float *d_y, const float *d_w,
                                  int T, int n, float eps);

/* Rotate-half rope on the first rot_dim dims of every head of d_x
 * (T, n_heads, head_dim): for i < rot_dim / 2, (x[i], x[i + rot_dim/2])
 * rotate by the angle whose cos and sin are d_cos/d_sin[t * ld + i]
 * (tables made on the host, angles in double: loom_cuda_rope_table). */
loom_status loom_cuda_rope(loom_cuda *c, float *d_x, int T, int n_heads, int head_dim,
                           int rot_dim, const float *d_cos, const float *d_sin, int ld);
/* Host helper: cos/sin (T, ld) for positions pos[T] and inv_freq[rot_dim/2],
 * both multiplied by scale, exactly as the CPU forward makes them. */
void loom_cuda_rope_table(float *cos_out, float *sin_out, int ld, const int *pos, int T,
                          const double *inv_freq, int rot_dim, double scale);

/* The same table made on the device: positions d_pos[T] and inv_freq
 * d_inv_freq[rot_dim/2] (double) in device memory, angles in double.
 * M-RoPE: with d_stream [rot_dim/2] (0 t, 1 h, 2 w), pair i turns by
 * d_pos[d_stream[i] * pos_ld + t] (pos_ld >= T); NULL: d_pos[t]. */
loom_status loom_cuda_rope_table_dev(loom_cuda *c, float *d_cos, float *d_sin, int ld,
                                     const int32_t *d_pos, int T, const double *d_inv_freq,
                                     int rot_dim, double scale, const unsigned char *d_stream,
                                     int pos_ld);

/* g = silu(g) * u, and g = gelu_tanh(g) * u, over n values. */
loom_status loom_cuda_silu_mul(loom_cuda *c, float *d_g, const float *d_u, size_t n);
loom_status loom_cuda_gelu_tanh_mul(loom_cuda *c, float *d_g, const float *d_u, size_t n);

/* The same over rows of d_g (T, n) with row t of u at d_u + t * ld (ld >=
 * n): g = act(g) * u (gelu: gelu_tanh, else silu), as silu_mul /
 * gelu_tanh_mul compute each value. */
loom_status loom_cuda_act_mul_ld(loom_cuda *c, float *d_g, const float *d_u, int T, int n,
                                 int ld, int gelu);

/* The same after a fused gate/up GEMM: d_gu (T, 2n) holds gate in columns
 * [0, n) and up in [n, 2n); d_out (T, n) = act(gate) * up (gelu: gelu_tanh,
 * else silu). */
loom_status loom_cuda_act_mul_split(loom_cuda *c, float *d_out, const float *d_gu, int T, int n,
                                    int gelu);

/* The same writing d_out16 (T, n) in f16 or bf16 (dt), for a 16-bit GEMM. */
loom_status loom_cuda_act_mul_split16(loom_cuda *c, void *d_out16, const float *d_gu, int T,
                                      int n, int gelu, loom_cuda_dtype dt);

/* The same with d_gu16 (T, 2n) already in bf16 (loom_cuda_gemm16_bf16out):
 * half the bytes read. */
loom_status loom_cuda_act_mul_split_bf16(loom_cuda *c, void *d_out16, const void *d_gu16, int T,
                                         int n, int gelu);

/* Residual add and RMSNorm in one pass, for a 16-bit GEMM next: each of the
 * T rows of n values: x += r (r may be NULL: no add), then d_y16 =
 * x / sqrt(mean(x^2) + eps) * w (w NULL = unweighted) rounded to dt (f16 or
 * bf16). */
loom_status loom_cuda_add_rmsnorm16(loom_cuda *c, void *d_y16, float *d_x, const float *d_r,
                                    const float *d_w, int T, int n, float eps, loom_cuda_dtype dt);

/* x = x * s, and x = (x + y) * s, over n values (y must not alias x). */
loom_status loom_cuda_scale(loom_cuda *c, float *d_x, size_t n, float s);
loom_status loom_cuda_add_scale(loom_cuda *c, float *d_x, const float *d_y, size_t n, float s);

/* d_out (T, cols) = table[ids[t]] * scale, table (vocab, cols) of dtype.
 * Ids are trusted (the caller checked them against the vocabulary). */
loom_status loom_cuda_embed(loom_cuda *c, float *d_out, const void *d_table, loom_cuda_dtype dt,
                            int cols, const int32_t *d_ids, int T, float scale);

/* Each of the T rows of n values: x = softmax(x) in place. */
loom_status loom_cuda_softmax(loom_cuda *c, float *d_x, int T, int n);
/* d_out[t] = index of the largest of row t (first on ties; NaN never wins). */
loom_status loom_cuda_argmax(loom_cuda *c, int32_t *d_out, const float *d_x, int T, int n);

/* After one GEMM for q, k and v: d_qkv (T, (nh + 2 * nkv) * head_dim), the
 * q heads, then the k heads, then the v heads of each token. Adds d_bias
 * (the same width; NULL = none), RMSNorms each q and k head (d_qnorm,
 * d_knorm [head_dim]; NULL = none), applies rope (the first rot_dim dims,
 * tables as for loom_cuda_rope), writes q to d_q (T, nh, head_dim) and the
 * k and v rows of token t to row d_slot[t] of kv (the pool layout of
 * loom_cuda_kv, rows addressed directly by slot = block * block_size +
 * position % block_size). */
struct loom_cuda_kv;
loom_status loom_cuda_qkv_post(loom_cuda *c, float *d_q, const struct loom_cuda_kv *kv,
                               const float *d_qkv, const float *d_bias, const float *d_qnorm,
                               const float *d_knorm, float eps, const int32_t *d_slot, int T,
                               int nh, int nkv, int head_dim, int rot_dim, const float *d_cos,
                               const float *d_sin, int ld);

/* The same with d_qkv16 in bf16 (loom_cuda_gemm16_bf16out): half the bytes
 * written by the GEMM and read here. */
loom_status loom_cuda_qkv_post_bf16(loom_cuda *c, float *d_q, const struct loom_cuda_kv *kv,
                                    const void *d_qkv16, const float *d_bias,
                                    const float *d_qnorm, const float *d_knorm, float eps,
                                    const int32_t *d_slot, int T, int nh, int nkv, int hd,
                                    int rot_dim, const float *d_cos, const float *d_sin, int ld);

/* ---- sampling ------------------------------------------------------------ */

#define LOOM_CUDA_TOPK_MAX 64

/* One row's sampling is a loom_sample_pick (sample/sample.h), top_k up to
 * LOOM_CUDA_TOPK_MAX. */

/* d_out[t] = the token drawn from row t of d_logits (T, V) with
 * d_params[t] (device memory), for vocabularies where
 * loom_cuda_sample_fits (up to 385,024 entries). */
loom_status loom_cuda_sample(loom_cuda *c, int32_t *d_out, const float *d_logits, int T, int V,
                             const loom_sample_pick *d_params);
int loom_cuda_sample_fits(int V);

/* ---- matrix products --------------------------------------------------- */

/* d_y (T, rows) = d_x (T, cols) @ W^T, W (rows, cols) of dtype, through
 * cuBLAS with f32 accumulation. For f16/bf16 weights x is rounded to the
 * weight's type first (into the context's scratch); f32 is plain SGEMM
 * precision (no TF32). */
loom_status loom_cuda_gemm(loom_cuda *c, float *d_y, const float *d_x, const void *d_w,
                           loom_cuda_dtype dt, int T, int rows, int cols);

/* loom_cuda_gemm with x already in the weight's type (f16 or bf16). */
loom_status loom_cuda_gemm16(loom_cuda *c, float *d_y, const void *d_x16, const void *d_w,
                             loom_cuda_dtype dt, int T, int rows, int cols);

/* loom_cuda_gemm16 for bf16 weights and x with the result rounded to bf16
 * (f32 accumulation): half the bytes written and read next (prefill's
 * gate/up projection, whose output only feeds the activation). */
loom_status loom_cuda_gemm16_bf16out(loom_cuda *c, void *d_y16, const void *d_x16,
                                     const void *d_w, int T, int rows, int cols);

/* d_y += x @ W^T (a residual add inside the GEMM: cuBLAS's beta = 1), x
 * f32 (rounded as loom_cuda_gemm rounds it) or, when x16, already of the
 * weight's 16-bit type. */
loom_status loom_cuda_gemm_acc(loom_cuda *c, float *d_y, const void *d_x, int x16,
                               const void *d_w, loom_cuda_dtype dt, int T, int rows, int cols);

/* How loom_cuda_gemv makes its 16-bit input rows from d_x. */
typedef enum loom_cuda_gemv_mode {
    LOOM_CUDA_GEMV_X16 = 0,     /* d_x (T, cols) already of the weight's type */
    LOOM_CUDA_GEMV_F32 = 1,     /* d_x (T, cols) f32, rounded to the weight's type */
    LOOM_CUDA_GEMV_RMSNORM = 2, /* d_x (T, cols) f32: x / sqrt(mean(x^2) + eps) * d_norm
                                   (NULL = 1), rounded: loom_cuda_add_rmsnorm16 without r */
    LOOM_CUDA_GEMV_SILU = 3,    /* d_x (T, 2 cols) f32, gate | up: silu(gate) * up, rounded:
                                   loom_cuda_act_mul_split16 */
    LOOM_CUDA_GEMV_GELU = 4,    /* the same with gelu_tanh */
} loom_cuda_gemv_mode;

typedef struct loom_cuda_gemv_in {
    loom_cuda_gemv_mode mode;
    const void *d_x;            /* 16-byte aligned */
    const float *d_norm;        /* RMSNORM: weight [cols] or NULL */
    float eps;                  /* RMSNORM */
} loom_cuda_gemv_in;

/* The most tokens loom_cuda_gemv takes for weights of dt with cols columns
 * (the input rows live in shared memory): 0 when it takes none (f32,
 * columns not a multiple of 8), at most 8. */
int loom_cuda_gemv_max_tokens(const loom_cuda *c, loom_cuda_dtype dt, int cols);

/* For decode: d_y (T, rows) = x (T, cols) @ W^T (+ d_bias [rows], NULL =
 * none), or d_y += that when accumulate (a residual add). W (rows, cols)
 * f16 or bf16, 16-byte aligned; x made by in->mode in W's type, f32
 * accumulation (the result of gemm16 on that x up to summation order).
 * Reads each weight once for all T tokens, 1 <= T <=
 * loom_cuda_gemv_max_tokens (else LOOM_ERR_UNSUPPORTED). d_y must not
 * overlap d_x. */
loom_status loom_cuda_gemv(loom_cuda *c, float *d_y, const loom_cuda_gemv_in *in,
                           const void *d_w, loom_cuda_dtype dt, int T, int rows, int cols,
                           const float *d_bias, int accumulate);

/* loom_cuda_gemv, then d_argmax[t] = the argmax of d_y's row t (as
 * loom_cuda_argmax: NaN never wins, ties go to the lower row), inside the
 * GEMV's kernel where it can (1-2 tokens, whole rows a warp), else by
 * loom_cuda_argmax after it. */
loom_status loom_cuda_gemv_argmax(loom_cuda *c, float *d_y, const loom_cuda_gemv_in *in,
                                  const void *d_w, loom_cuda_dtype dt, int T, int rows, int cols,
                                  const float *d_bias, int accumulate, int32_t *d_argmax);

/* An MLX affine-quantized matrix on the device, laid out as in ops.h's
 * loom_qmat: row r, element k = scale[r][k/group] * q + bias[r][k/group]. */
typedef struct loom_cuda_qmat {
    const uint32_t *d_w;        /* (rows, cols * bits / 32) packed */
    const uint16_t *d_scales;   /* (rows, cols / group) bf16, or f16 when f16 */
    const uint16_t *d_biases;   /* (rows, cols / group) */
    int rows, cols, bits, group, f16;
} loom_cuda_qmat;

/* d_y (T, rows) = d_x (T, cols) @ dequant(W)^T, dequantizing on the fly (one
 * warp per output row; meant for decode, T small). bits 2, 3, 4, 5, 6, 8. */
loom_status loom_cuda_matmul_q(loom_cuda *c, float *d_y, const float *d_x,
                               const loom_cuda_qmat *w, int T);

/* An FP8 matrix on the device, laid out as ops.h's loom_f8mat: row r,
 * element k = e4m3(w[r][k]) * scales[r / br][k / bc] (kernels_fp8.cu). */
typedef struct loom_cuda_f8mat {
    const uint8_t *d_w;         /* (rows, cols) e4m3fn codes */
    const float *d_scales;      /* (ceil(rows / br), ceil(cols / bc)) f32 */
    int rows, cols, br, bc;
} loom_cuda_f8mat;

/* Decode: d_y (T, rows) = d_x (T, cols) @ dequant(W)^T, dequantizing in
 * registers with f32 accumulation (matmul_f8's result up to summation
 * order). One pass over the weights per 8 tokens. */
loom_status loom_cuda_f8_gemv(loom_cuda *c, float *d_y, const float *d_x,
                              const loom_cuda_f8mat *w, int T);
/* Prefill: the same product through cuBLAS, W dequantized in slices
 * (scratch): to bf16 with x rounded to bf16 (tensor cores, f32
 * accumulation; the precision of loom_cuda_gemm on bf16 weights, about
 * 2^-8 relative a product), or with f32 to f32 (SGEMM, no TF32: the CPU's
 * result up to summation order, at SGEMM speed). */
loom_status loom_cuda_f8_gemm(loom_cuda *c, float *d_y, const float *d_x,
                              const loom_cuda_f8mat *w, int T, int f32);
/* loom_cuda_f8_gemv up to LOOM_CUDA_F8_GEMV_T tokens, else loom_cuda_f8_gemm. */
#define LOOM_CUDA_F8_GEMV_T 16
loom_status loom_cuda_matmul_f8(loom_cuda *c, float *d_y, const float *d_x,
                                const loom_cuda_f8mat *w, int T, int f32);

/* ---- routed experts (kernels_moe.cu; reference src/model/moe.c) ------- */

#define LOOM_CUDA_MOE_KMAX 32   /* most experts a token may take */
#define LOOM_CUDA_MOE_TILE 64   /* grouped rows a block of loom_cuda_moe_gemm */
#define LOOM_CUDA_MOE_TILE_S 16 /* the same for decode batches (few pairs an expert) */

/* Each of the T rows of router logits d_logits (T, E): p = softmax, the
 * top k of p (larger first, the lower index on ties, as moe.c), into
 * d_sel (T, k) experts and d_w (T, k) weights, divided by their sum when
 * renorm. 1 <= k <= min(E, LOOM_CUDA_MOE_KMAX). */
loom_status loom_cuda_moe_route(loom_cuda *c, int32_t *d_sel, float *d_w, const float *d_logits,
                                int T, int E, int k, int renorm);

/* The plan's size in ints for T tokens of k pairs over E experts. */
int loom_cuda_moe_plan_ints(int T, int k, int E);

/* The plan's row tile for T tokens of k pairs over E experts:
 * LOOM_CUDA_MOE_TILE, or LOOM_CUDA_MOE_TILE_S when the experts average
 * fewer than 32 pairs. */
int loom_cuda_moe_tile(int T, int k, int E);

/* Buckets the N = T * k (token, choice) pairs d_sel (T, k) by expert, into
 * d_plan (loom_cuda_moe_plan_ints): off [E + 1] (expert e's grouped rows
 * are [off[e], off[e + 1])), tiles [E + 1] (the running count of tiles of
 * `tile` rows, LOOM_CUDA_MOE_TILE or LOOM_CUDA_MOE_TILE_S), row [N] (pair
 * a's grouped row), src [N] (grouped row r's token). Rows of one expert
 * come in no fixed order. */
loom_status loom_cuda_moe_sort(loom_cuda *c, int32_t *d_plan, const int32_t *d_sel, int T, int k,
                               int E, int tile);

/* Grouped GEMM, one launch for all experts: grouped row r of expert e,
 * d_y (N, rows) row r = x @ W_e^T with W_e = d_w + e * rows * cols elements
 * (rows, cols) of dt, x = d_x row src[r] when gather, else row r (cols
 * wide, f32), over a plan made with the same tile. d_plan NULL: one group
 * of the N rows, expert 0 (a plain GEMM, the router's; tile unused). f32
 * accumulation of f32 x and widened weights, or where
 * loom_cuda_moe_gemm_tc says so, of x rounded to the weights' 16-bit type
 * on the tensor cores. */
loom_status loom_cuda_moe_gemm(loom_cuda *c, float *d_y, const float *d_x, int gather,
                               const void *d_w, loom_cuda_dtype dt, int rows, int cols,
                               const int32_t *d_plan, int E, int N, int tile);

/* 1 where loom_cuda_moe_gemm runs on the tensor cores (a plan, 16-bit
 * weights, cols % 8 == 0, x and the weights on 16 bytes). */
int loom_cuda_moe_gemm_tc(loom_cuda_dtype dt, int cols, int grouped);

/* Decode: d_y (N, rows) row a = d_x row a / kdiv (cols wide) @ W_e^T, e =
 * d_sel[a] (NULL: 0), W_e as for loom_cuda_moe_gemm. Each pair reads its
 * expert's rows; meant for a few tokens. */
loom_status loom_cuda_moe_gemv(loom_cuda *c, float *d_y, const float *d_x, int kdiv,
                               const int32_t *d_sel, const void *d_w, loom_cuda_dtype dt,
                               int rows, int cols, int N);

/* Decode, the experts' down projections and their weighted sum in one:
 * d_out (T, rows) row t = sum over j < k (in order) of d_wt[t k + j] *
 * (d_x row t k + j @ W_sel[t k + j]^T), or d_out += that when acc. */
loom_status loom_cuda_moe_gemv_sum(loom_cuda *c, float *d_out, int acc, const float *d_x,
                                   const int32_t *d_sel, const float *d_wt, const void *d_w,
                                   loom_cuda_dtype dt, int T, int k, int rows, int cols);

/* d_out (T, n) row t = sum over j < k (in order) of d_wt[t k + j] * d_y
 * row plan.row[t k + j] (d_y (N, n) grouped rows), or += when acc. */
loom_status loom_cuda_moe_combine(loom_cuda *c, float *d_out, int acc, const float *d_y,
                                  const int32_t *d_plan, const float *d_wt, int T, int k, int n,
                                  int E);

/* Per-expert scales on the routing weights (Gemma 4): d_wt (T, k) entry a
 * *= d_scale[d_sel[a]], d_scale [n_experts]. */
loom_status loom_cuda_moe_scale_weights(loom_cuda *c, float *d_wt, const int32_t *d_sel,
                                        const float *d_scale, int T, int k);

/* The gated shared expert's add: d_out (T, n) row t += sigmoid(d_g[t]) *
 * d_y row t. */
loom_status loom_cuda_moe_gate_add(loom_cuda *c, float *d_out, const float *d_y, const float *d_g,
                                   int T, int n);

/* ---- Gated DeltaNet (kernels_lin.cu; reference src/model/linear_attn.c) -- */

/* A step's rows (d_rtok [n_rows + 1]: row r owns tokens [rtok[r],
 * rtok[r + 1])) each carry their recurrent state on the device: d_state
 * [n_rows] points at each row's slot, off (floats) at the layer's part of
 * it (conv state (K - 1, D) oldest first; delta-rule state (nv, dk, dv)). */

/* d_out (T, D) = silu(causal depthwise conv of d_in (T, D) with d_w (D, K)),
 * the K - 1 inputs before a row's first token read from its conv state;
 * then each row's conv state becomes the last K - 1 of (state, inputs). */
loom_status loom_cuda_lin_conv(loom_cuda *c, float *d_out, const float *d_in, const float *d_w,
                               int K, int D, int T, int n_rows, const int32_t *d_rtok,
                               float *const *d_state, size_t off);

/* In place on d_qkv (T, D) = [q (nk dk) | k (nk dk) | v]: q and k heads
 * L2-normalised (q also by 1/sqrt(dk)); d_beta, d_g (T, nv) = sigmoid(b),
 * neg_a * softplus(a + dt_bias) from d_b, d_a (T, nv). */
loom_status loom_cuda_lin_prep(loom_cuda *c, float *d_qkv, float *d_beta, float *d_g,
                               const float *d_b, const float *d_a, const float *d_neg_a,
                               const float *d_dt_bias, int T, int D, int nk, int dk, int nv);

/* The gated delta rule along each row, token by token, d_o (T, nv, dv) from
 * d_qkv as loom_cuda_lin_prep leaves it; the rows' states advance. Value
 * head h reads key head h / (nv / nk); dk up to loom_cuda_lin_delta_max_k(). */
loom_status loom_cuda_lin_delta(loom_cuda *c, float *d_o, const float *d_qkv,
                                const float *d_beta, const float *d_g, int n_rows,
                                const int32_t *d_rtok, float *const *d_state, size_t off, int D,
                                int nk, int nv, int dk, int dv);
int loom_cuda_lin_delta_max_k(void);

/* As loom_cuda_lin_delta (same outputs and states, to rounding), rows of
 * at least chunk_min tokens by the chunked form: T tokens in all, the
 * longest row max_n (both host-side: they size the grid and a device
 * scratch of T nv (dk + dv + loom_cuda_lin_delta_chunk_len() + 1)
 * doubles); shorter rows token by token. chunk_min 1: every row chunked.
 * LOOM_ERR_UNSUPPORTED where the device lacks the shared memory. */
loom_status loom_cuda_lin_delta_chunked(loom_cuda *c, float *d_o, const float *d_qkv,
                                        const float *d_beta, const float *d_g, int T, int n_rows,
                                        int max_n, const int32_t *d_rtok, float *const *d_state,
                                        size_t off, int D, int nk, int nv, int dk, int dv,
                                        int chunk_min);
/* Tokens a chunk of loom_cuda_lin_delta_chunked. */
int loom_cuda_lin_delta_chunk_len(void);

/* d_y (T, nv, dv) = rmsnorm(d_o) * d_w [dv] * silu(d_z) per (token, head). */
loom_status loom_cuda_lin_gated_norm(loom_cuda *c, float *d_y, const float *d_o, const float *d_z,
                                     const float *d_w, int T, int nv, int dv, float eps);

/* Qwen3-Next's projections grouped by key head: d_raw_qkvz (T, nk (2 dk +
 * 2 rep dv)) into d_qkv (T, D) and d_z (T, nk rep dv); d_raw_ba (T, nk 2 rep)
 * into d_b, d_a (T, nk rep). */
loom_status loom_cuda_lin_split(loom_cuda *c, float *d_qkv, float *d_z, float *d_b, float *d_a,
                                const float *d_raw_qkvz, const float *d_raw_ba, int T, int nk,
                                int dk, int rep, int dv, int D);

/* Gated attention: d_raw (T, nh, 2 hd), per head [query | gate], into d_q
 * and d_gate (T, nh, hd); after the attention d_x *= sigmoid(d_gate). */
loom_status loom_cuda_attn_gate_split(loom_cuda *c, float *d_q, float *d_gate,
                                      const float *d_raw, int T, int nh, int hd);
loom_status loom_cuda_attn_gate_mul(loom_cuda *c, float *d_x, const float *d_gate, size_t n);

/* ---- paged attention --------------------------------------------------- */

/* One layer's view of the paged KV pool (src/model/kv_layout.h): the K (V) row
 * of position p of a sequence with block table tbl is
 *   d_k + ((size_t)tbl[p / block_size] * block_size + p % block_size) * row_stride
 * elements of dtype, i.e. d_k = pool K base + layer * n_blocks * block_size
 * rows. Head h's values are elements [h * head_dim, (h + 1) * head_dim). */
typedef struct loom_cuda_kv {
    const void *d_k, *d_v;      /* this layer's first row; borrowed */
    loom_cuda_dtype dt;         /* F32, F16 or BF16 */
    int block_size;
    size_t row_stride;          /* elements between rows (pool row_bytes / size) */
} loom_cuda_kv;

typedef struct loom_cuda_attn {
    int n_heads, n_kv_heads, head_dim;
    float scale;                /* multiplies q.k */
    float softcap;              /* 0 = off, else cap * tanh(s / cap) */
    int window;                 /* sliding window in tokens, 0 = full */
    int tc;                     /* prefill may use the tensor-core kernel (bf16 KV,
                                   head_dim 64, 80, 96 or 128): queries and
                                   weights rounded to bf16, ~1e-3 relative error */
    /* Prefill only; NULL for plain causal attention. Bidirectional spans
     * (Gemma 3's images): device [T] per token of the step, the first and
     * last position of its span (its own position outside spans); a token
     * attends to keys up to span_hi and, under a window, from span_lo on. */
    const int32_t *span_lo, *span_hi;
} loom_cuda_attn;

/* Decode: one query per sequence. d_q (n_seqs, n_heads, head_dim); sequence
 * s attends to positions [lo, len[s]) with len = d_lens[s] (its query sits
 * at len - 1; lo from the window). Block tables d_tables (n_seqs,
 * table_stride). max_len >= every len (sizes the split grid). Splits of
 * the KV range run in parallel and the last of them to finish combines
 * them (flash-decoding). d_out (n_seqs, n_heads, head_dim). */
loom_status loom_cuda_attn_decode(loom_cuda *c, float *d_out, const float *d_q,
                                  const loom_cuda_kv *kv, const loom_cuda_attn *a,
                                  const int32_t *d_tables, int table_stride,
                                  const int32_t *d_lens, int n_seqs, int max_len);

/* Decode with loom_cuda_qkv_post folded in (one kernel less a layer):
 * d_qkv (n_seqs, (n_heads + 2 * n_kv_heads) * head_dim) is the fused q/k/v
 * projection of each sequence's one new token (sequence s's token is row
 * s; its KV slot d_slot[s], its rope row s of d_cos/d_sin), taken as
 * loom_cuda_qkv_post takes it (bias, q/k norms, rope; rot_dim 0 or
 * head_dim); the new K and V rows are stored into the pool and attention
 * then runs as loom_cuda_attn_decode's over positions up to d_lens[s] - 1
 * (the new one). Where the fused kernel does not apply
 * (loom_cuda_attn_decode_qkv_ok is 0) it runs the two calls, with d_q
 * (n_seqs, n_heads, head_dim) as their q. */
int loom_cuda_attn_decode_qkv_ok(const loom_cuda *c, const loom_cuda_kv *kv,
                                 const loom_cuda_attn *a, int rot_dim, int n_seqs, int max_len);
loom_status loom_cuda_attn_decode_qkv(loom_cuda *c, float *d_out, float *d_q,
                                      const loom_cuda_kv *kv, const loom_cuda_attn *a,
                                      const float *d_qkv, const float *d_bias,
                                      const float *d_qnorm, const float *d_knorm, float eps,
                                      const int32_t *d_slot, int rot_dim, const float *d_cos,
                                      const float *d_sin, int ld, const int32_t *d_tables,
                                      int table_stride, const int32_t *d_lens, int n_seqs,
                                      int max_len);

/* Prefill (any number of new tokens per row, causal): row r owns query
 * tokens [d_row_tok[r], d_row_tok[r + 1]) of d_q (T, n_heads, head_dim)
 * at positions d_row_pos[r] + i, already written to the KV pool; token at
 * position p attends to [lo, p]. max_row_tokens >= every row's count.
 * Tiled with an online softmax. d_out (T, n_heads, head_dim). */
loom_status loom_cuda_attn_prefill(loom_cuda *c, float *d_out, const float *d_q,
                                   const loom_cuda_kv *kv, const loom_cuda_attn *a,
                                   const int32_t *d_tables, int table_stride,
                                   const int32_t *d_row_tok, const int32_t *d_row_pos,
                                   int n_rows, int max_row_tokens);

/* The same with the output in out_dt (f32, f16 or bf16: the input of a
 * 16-bit GEMM, rounded as that GEMM's conversion would round it). The
 * tensor-core kernel writes it directly; the others through scratch.
 * n_tokens: the rows of d_q and d_out (T). */
loom_status loom_cuda_attn_prefill_to(loom_cuda *c, void *d_out, loom_cuda_dtype out_dt,
                                      const float *d_q, const loom_cuda_kv *kv,
                                      const loom_cuda_attn *a, const int32_t *d_tables,
                                      int table_stride, const int32_t *d_row_tok,
                                      const int32_t *d_row_pos, int n_rows, int max_row_tokens,
                                      int n_tokens);


/* ---- dense decoder forward ---------------------------------------------- */

struct loom_kv_layout;
struct loom_fwd_row;
typedef struct loom_cuda_model loom_cuda_model;

/* Uploads the weights of m (borrowed; must outlive the result) once and
 * allocates the device KV rows in the host pool's layout kv (same
 * layers, blocks, block size and row bytes; type f32, f16 or bf16) plus
 * activations for step_tokens tokens per forward over sequences of up to
 * max_ctx positions. Dense decoders (Llama, Mistral, Qwen2, Qwen3, Gemma 2,
 * 3 and 4, and their MLX-quantized forms), Qwen3-MoE (experts of f32, f16
 * or bf16, with or without a gated shared expert) and the Qwen3.5 /
 * Qwen3-Next hybrids: LOOM_ERR_UNSUPPORTED names what else a model needs
 * (routing to more than LOOM_CUDA_MOE_KMAX experts a token, linear-attention
 * heads the kernels do not take, ...). */
loom_status loom_cuda_model_create(loom_cuda *c, const loom_model *m,
                                   const struct loom_kv_layout *kv, int step_tokens, int max_ctx,
                                   loom_cuda_model **out);
void loom_cuda_model_free(loom_cuda_model *g);

/* loom_forward (model/forward.h) on the GPU for the same rows: the host
 * pool kv supplies block tables only (its k/v bytes are neither read nor
 * written; the device twin holds the rows). Logits land in each row's out;
 * seq->n_tokens advances. Synchronous: returns when the logits are on the
 * host. Rows must carry no recurrent state.
 * picks: NULL, or [n_rows]: a row with picks[r] == -1 and logits LAST gets
 * the index of its largest logit (first on ties) in picks[r], computed on
 * the device, and its out is left unwritten (greedy decoding without the
 * vocabulary-sized copy); other entries are left alone. samp: NULL, or
 * [n_rows]: such a row with samp[r].temperature > 0 gets the token drawn
 * with samp[r] (loom_cuda_sample) instead of the argmax, where the device
 * sampler takes the vocabulary (loom_cuda_sample_fits; else its logits are
 * written to out and picks[r] stays -1). A row with logits ALL and ids set
 * (verification) gets every position's greedy id there instead of logits. */
loom_status loom_cuda_forward(loom_cuda_model *g, struct loom_kv_layout *kv,
                              struct loom_fwd_row *rows, int n_rows, int32_t *picks,
                              const loom_sample_pick *samp);

/* A drafter's companion rows (model/forward.h: loom_fwd_set_taps): until
 * set again, every loom_cuda_forward on g also writes the hidden state
 * after each layer layers[k] (the residual stream, before the final norm)
 * of its t-th token (rows in order) to out [t, k * hidden, (k + 1) *
 * hidden), copied to the host with the logits. out NULL or n 0 stops it.
 * Up to 16 layers; the device buffer (step_tokens rows) is made on the
 * first call. On an error the taps are off. */
loom_status loom_cuda_set_taps(loom_cuda_model *g, const int *layers, int n, float *out);

/* Tensor parallelism (model/shard.h): n ranks, rank r on device
 * devices[r], each a loom_cuda_model of its shard on its own host thread.
 * Distinct devices sum through NCCL (a build with LOOM_NCCL; NVLink
 * multicast off unless NCCL_NVLS_ENABLE says otherwise); ranks all on one
 * device (tests of a split on one GPU) through a kernel between host
 * barriers; one rank through NCCL where built with it, else as itself. */
#define LOOM_TP_MAX 8
typedef struct loom_cuda_tp loom_cuda_tp;
loom_status loom_cuda_tp_create(const int *devices, int n, loom_cuda_tp **out);
void loom_cuda_tp_free(loom_cuda_tp *t);
int loom_cuda_tp_size(const loom_cuda_tp *t);
/* buf [n] on rank's device becomes the sum over the ranks of theirs (in
 * c's stream); every rank calls it in the same order. */
loom_status loom_cuda_tp_sum(loom_cuda_tp *t, int rank, loom_cuda *c, float *buf, size_t n);
/* A rank failed: every sum waiting or to come returns an error (NCCL's
 * communicators are aborted), so no rank waits on it; t serves no more. */
void loom_cuda_tp_abort(loom_cuda_tp *t);
/* g (a shard's model) as rank of t: its o and down outputs are summed over
 * the ranks before each residual, decode graphs are off, and a rank other
 * than 0 computes no head and hands nothing back: its loom_cuda_forward
 * reads the rows and leaves them (and picks, logits, sequences) alone;
 * rank 0 writes picks and logits but leaves each seq->n_tokens for the
 * caller to advance once every rank has succeeded. */
loom_status loom_cuda_model_set_tp(loom_cuda_model *g, loom_cuda_tp *t, int rank);

#ifdef __cplusplus
}
#endif

#endif
