/* tuning: every environment knob of the CUDA backend, in one struct.
 *
 * loom_cuda_tuning_read reads them all; loom_cuda_create and
 * loom_cuda_model_create each call it once and keep what they use, so a
 * knob set between two creates (the GPU tests do) applies to the next one.
 * Nothing else in src/cuda reads the environment. Unset, or set to a value
 * outside what a knob takes, a knob has its default: the fastest setting
 * measured on an H200 (bench/RESULTS.md). */
#ifndef LOOM_CUDA_TUNING_H
#define LOOM_CUDA_TUNING_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_cuda_tuning {
    /* the context (loom_cuda_create) */
    /* LOOM_CUDA_PDL=0: no programmatic dependent launch (default on; sm_90 only) */
    int pdl;
    /* LOOM_CUDA_GEMV_MMA: tokens from which the GEMV is the tensor-core kernel (3) */
    int gemv_mma;
    /* LOOM_CUDA_GEMV_KS: 1-2 tokens: column slices a row, 1, 2 or 4 (1; <= 0: row groups) */
    int gemv_ks;
    /* LOOM_CUDA_GEMV_U: 16-byte vectors a lane loads per batch, 4 or 8 (0: by width) */
    int gemv_u;
    /* LOOM_CUDA_GEMV_W: the split GEMV's warps a block, 8 or 16 (0: by vectors) */
    int gemv_w;
    /* LOOM_CUDA_GEMV_PRE2=0: only a warp's first item loads before the PDL wait (1) */
    int gemv_pre2;
    /* LOOM_CUDA_GEMV_BPS: the split GEMV's blocks an SM (0: all that fit) */
    int gemv_bps;
    /* LOOM_CUDA_GEMV_NP=0: the RMSNorm input is made by gv_fill (1: in registers) */
    int gemv_np;
    /* LOOM_CUDA_GEMV_PF_MB: matrices up to this many MiB go to L2 early (16), in bytes */
    size_t gemv_pf;
    /* LOOM_CUDA_ATTN_SPLIT: decode attention splits down to this many positions (8) */
    int attn_split_min;
    /* LOOM_CUDA_ATTN_BLOCKS: split finer while under this many blocks an SM (4) */
    int attn_blocks;
    /* LOOM_CUDA_ATTN_CLUSTER: decode attention clusters of 2, 4 or 8 CTAs (8; 0: split) */
    int attn_cluster;
    /* LOOM_CUDA_FA_MT: tensor-core prefill attention m-tiles a warp, 1 or 2 (2) */
    int fa_mt;
    /* LOOM_CUDA_QKV_WARP=0: qkv_post by the block-per-head kernel only (1: warp kernel) */
    int qkv_warp;
    /* the model (loom_cuda_model_create) */
    /* LOOM_CUDA_GU16=0: the gate/up GEMM writes f32, not bf16, for bf16 weights (1) */
    int gu16;
    /* LOOM_CUDA_QKV16=0: the q/k/v GEMM writes f32, not bf16, for bf16 weights (1) */
    int qkv16;
    /* LOOM_CUDA_ATTN_QKV=1: qkv_post folds into the cluster decode attention (0) */
    int attn_qkv;
    /* LOOM_CUDA_GEMV_T: steps of up to this many tokens take the GEMV (2; 0: cuBLAS) */
    int gemv_t;
    /* LOOM_CUDA_HEAD_AM=0: greedy picks by the argmax kernel (1: in the head's GEMV) */
    int head_am;
    /* LOOM_CUDA_F8_F32=1: FP8 prompts dequantize to f32 for SGEMM, not to bf16 (0) */
    int f8_f32;
    /* LOOM_CUDA_LIN_CHUNK=n: rows of n tokens or more take the chunked delta
       rule (0, the default: token by token, which measured 2-4x faster on
       the H200 at every length, bench/cuda_delta) */
    int lin_chunk;
    /* LOOM_CUDA_GRAPHS=0: decode steps are not captured into CUDA graphs (1) */
    int graphs;
    /* LOOM_CUDA_STEP_TIMES=1: where each decode step's time goes, on stderr (0) */
    int step_times;
} loom_cuda_tuning;

/* Every knob as the environment sets it now. */
void loom_cuda_tuning_read(loom_cuda_tuning *t);

#ifdef __cplusplus
}
#endif

#endif
