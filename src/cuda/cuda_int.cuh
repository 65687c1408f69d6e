/* cuda_int: what the CUDA translation units share (context layout, error
 * checks, scratch). Not part of the backend's C API (cuda.h). */
#ifndef LOOM_CUDA_INT_CUH
#define LOOM_CUDA_INT_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda/cuda.h"

/* base.h is C11 (designated initializers in its inline helpers); the error and
 * log functions declared here are all the CUDA side needs. */
extern "C" loom_status loom_err(loom_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
extern "C" void loom_err_clear(void);
extern "C" void loom_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define LOOM_CUDA_LOG_WARN 1 /* LOOM_LOG_WARN of base.h */

struct loom_cuda {
    int device;
    int cc;                     /* major * 10 + minor */
    int n_sm;
    size_t smem_optin;          /* max dynamic shared memory per block */
    char name[256];
    cudaStream_t stream;        /* owned */
    cublasHandle_t blas;        /* owned, bound to stream */
    void *scratch;              /* owned device scratch, scratch_cap bytes */
    size_t scratch_cap;
    unsigned scratch_gen;       /* bumped when scratch moves (captured graphs hold it) */
    int capturing;              /* a graph capture is open on stream: nothing may grow */
    void *blas_ws;              /* owned cuBLAS workspace (fixed: graphs capture it) */
    int *counters;              /* owned [LOOM_CUDA_COUNTERS], zero between kernels: the
                                   last-block-done tallies (each kernel resets its own) */
    int pdl;                    /* 1: kernels launched through loom_cuda_launch may start
                                   while the one before drains (sm_90; LOOM_CUDA_PDL=0 off) */
    int gemv_mma;               /* loom_cuda_gemv takes the tensor-core kernel from this many
                                   tokens (default 3; LOOM_CUDA_GEMV_MMA=n) */
    int gemv_ks;                /* 1-2 tokens: column slices a row in gemv_split_kernel (1, 2
                                   or 4; LOOM_CUDA_GEMV_KS, 1; 0: the row-group kernel) */
    int gemv_u;                 /* its 16-byte vectors a lane loads per batch (4 or 8;
                                   LOOM_CUDA_GEMV_U; 0: 8 from 4096 columns, else 4) */
    int gemv_w;                 /* gemv_split_kernel's warps a block (8 or 16, LOOM_CUDA_GEMV_W;
                                   0: 16 with 8 vectors a batch, else 8) */
    int gemv_pre2;              /* gemv_split_kernel loads a warp's second item before the PDL
                                   wait too (LOOM_CUDA_GEMV_PRE2, 1; 0: the first only) */
    int gemv_bps;               /* its blocks an SM (LOOM_CUDA_GEMV_BPS; 0: all that fit) */
    int gemv_np;                /* its RMSNORM input: norm weights loaded before the PDL wait,
                                   x kept in registers (LOOM_CUDA_GEMV_NP, 1; 0: gv_fill) */
    size_t gemv_pf;             /* matrices up to this many bytes are pulled into L2 before the
                                   wait for the kernel ahead (LOOM_CUDA_GEMV_PF_MB, 16) */
    int attn_split_min;         /* decode attention splits a sequence down to this many
                                   positions while SMs would idle (LOOM_CUDA_ATTN_SPLIT, 8) */
    int attn_blocks;            /* the split decode attention splits finer while its grid is
                                   under this many blocks an SM (LOOM_CUDA_ATTN_BLOCKS, 4) */
    int attn_cluster;           /* small-batch decode attention in thread-block clusters of
                                   up to this many CTAs (2, 4 or 8; LOOM_CUDA_ATTN_CLUSTER;
                                   0: the split kernel) */
    int fa_mt;                  /* tensor-core prefill attention: 16-row m-tiles a warp (1:
                                   64 query rows a block, queries in registers; 2: 128 rows,
                                   each K/V fragment used twice; LOOM_CUDA_FA_MT, 2) */
    int qkv_warp;               /* qkv_post may take the warp-per-head kernel (head_dim 128;
                                   LOOM_CUDA_QKV_WARP, 1; 0: the block-per-head kernel only) */
};

/* Counters: [0, half) for attention decode (sequence x KV head), [half,
 * 2 * half) for argmax rows. */
#define LOOM_CUDA_COUNTERS 65536

const char *loom_cublas_str(cublasStatus_t s);

/* Every CUDA runtime / cuBLAS call goes through these: on failure they set
 * the thread's error ("file:line: call: message") and return from the
 * enclosing function with LOOM_ERR_INTERNAL (NOMEM for allocations). */
#define CUDA_CHECK(call)                                                          \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess)                                                    \
            return loom_err(e_ == cudaErrorMemoryAllocation ? LOOM_ERR_NOMEM      \
                                                            : LOOM_ERR_INTERNAL,  \
                            "%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,      \
                            cudaGetErrorString(e_), cudaGetErrorName(e_));        \
    } while (0)

#define CUBLAS_CHECK(call)                                                        \
    do {                                                                          \
        cublasStatus_t s_ = (call);                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                          \
            return loom_err(LOOM_ERR_INTERNAL, "%s:%d: %s: %s", __FILE__,         \
                            __LINE__, #call, loom_cublas_str(s_));                \
    } while (0)

/* After a launch: reports a bad configuration at once (file:line of the
 * launch); faults inside the kernel surface at the next sync. */
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* A device scratch area of at least n bytes (grows, synchronizing). */
loom_status loom_cuda_scratch(loom_cuda *c, size_t n, void **out);

/* Programmatic dependent launch. A kernel launched by loom_cuda_launch may
 * start before the kernel ahead of it has finished: it calls pdl_wait()
 * before it reads anything another kernel writes or writes anything at all
 * (only immutable data, the weights, may be touched before), and
 * pdl_trigger() to let the kernel after it be scheduled early. Both are
 * no-ops for a normal launch. Every block must reach pdl_wait(): a kernel
 * counts as finished for the next one only through its own wait. */
__device__ __forceinline__ void pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* (v, i) comes before (w, j) for an argmax or a top-k: larger, or as
 * large and a lower index; i < 0 is no candidate (callers keep NaN out).
 * The order is total, so any reduction order gives the same winner. */
__device__ __forceinline__ bool loom_cuda_before(float v, int i, float w, int j) {
    if (i < 0) return false;
    if (j < 0) return true;
    return v > w || (v == w && i < j);
}

/* The warp's first (v, i) in that order, in every lane. */
__device__ __forceinline__ void loom_cuda_warp_best(float &v, int &i) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (loom_cuda_before(ov, oi, v, i)) v = ov, i = oi;
    }
}

template <typename... P, typename... A>
static inline cudaError_t loom_cuda_launch(const loom_cuda *c, void (*k)(P...), dim3 grid,
                                           dim3 block, size_t smem, A... args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cfg.attrs = at;
    cfg.numAttrs = c->pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, k, args...);
}

static inline unsigned LOOM_MIN_U(unsigned a, unsigned b) { return a < b ? a : b; }

static inline int LOOM_MAX_I(int a, int b) { return a > b ? a : b; }

static inline unsigned loom_cuda_blocks(size_t n, unsigned threads) {
    return (unsigned)((n + threads - 1) / threads);
}

#endif
