/* cuda_rt: the device context (device, stream, cuBLAS handle), device
 * memory, copies and the growable scratch area. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_int.cuh"
#include "cuda/tuning.h"

#define BLAS_WS_BYTES ((size_t)32 << 20)

const char *loom_cublas_str(cublasStatus_t s) { return cublasGetStatusString(s); }

extern "C" loom_status loom_cuda_create(int device, loom_cuda **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda: no device (%s)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (device < 0 || device >= n)
        return loom_err(LOOM_ERR_UNSUPPORTED, "cuda: device %d asked for, %d present", device, n);
    loom_cuda *c = (loom_cuda *)calloc(1, sizeof *c);
    if (!c) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    loom_status st = LOOM_OK;
    cudaDeviceProp prop;
    do {
        e = cudaSetDevice(device);
        if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, device);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            st = loom_err(LOOM_ERR_INTERNAL, "%s:%d: cuda: device %d: %s", __FILE__, __LINE__,
                          device, cudaGetErrorString(e));
            break;
        }
        cublasStatus_t bs = cublasCreate(&c->blas);
        if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(c->blas, c->stream);
        /* f32 GEMMs stay true f32 (no TF32) so they match the reference. */
        if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
        /* Our own workspace: cuBLAS then allocates nothing while a decode
         * step is being captured into a graph. */
        if (bs == CUBLAS_STATUS_SUCCESS) {
            e = cudaMalloc(&c->blas_ws, BLAS_WS_BYTES);
            if (e != cudaSuccess) {
                st = loom_err(LOOM_ERR_NOMEM, "%s:%d: cuda: cuBLAS workspace: %s", __FILE__,
                              __LINE__, cudaGetErrorString(e));
                break;
            }
            bs = cublasSetWorkspace(c->blas, c->blas_ws, BLAS_WS_BYTES);
        }
        if (bs == CUBLAS_STATUS_SUCCESS) {
            e = cudaMalloc((void **)&c->counters, LOOM_CUDA_COUNTERS * sizeof(int));
            if (e == cudaSuccess)
                e = cudaMemset(c->counters, 0, LOOM_CUDA_COUNTERS * sizeof(int));
            /* the legacy stream's memset, done before our non-blocking stream runs */
            if (e == cudaSuccess) e = cudaDeviceSynchronize();
            if (e != cudaSuccess) {
                st = loom_err(LOOM_ERR_NOMEM, "%s:%d: cuda: counters: %s", __FILE__, __LINE__,
                              cudaGetErrorString(e));
                break;
            }
        }
        if (bs != CUBLAS_STATUS_SUCCESS) {
            st = loom_err(LOOM_ERR_INTERNAL, "%s:%d: cublas: %s", __FILE__, __LINE__,
                          loom_cublas_str(bs));
            break;
        }
    } while (0);
    if (st != LOOM_OK) {
        loom_cuda_free(c);
        return st;
    }
    c->device = device;
    c->cc = prop.major * 10 + prop.minor;
    c->n_sm = prop.multiProcessorCount;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    /* the knobs (tuning.h): the defaults are the fastest settings measured
     * on an H200 (bench/RESULTS.md) */
    loom_cuda_tuning t;
    loom_cuda_tuning_read(&t);
    c->pdl = c->cc >= 90 && t.pdl;
    c->gemv_mma = t.gemv_mma;
    c->gemv_ks = t.gemv_ks;
    c->gemv_u = t.gemv_u;
    c->gemv_bps = t.gemv_bps;
    c->gemv_pf = t.gemv_pf;
    c->attn_split_min = t.attn_split_min;
    c->attn_blocks = t.attn_blocks;
    c->attn_cluster = t.attn_cluster;
    c->gemv_w = t.gemv_w;
    c->gemv_pre2 = t.gemv_pre2;
    c->gemv_np = t.gemv_np;
    c->fa_mt = t.fa_mt;
    c->qkv_warp = t.qkv_warp;
    snprintf(c->name, sizeof c->name, "%s", prop.name);
    *out = c;
    return LOOM_OK;
}

extern "C" void loom_cuda_free(loom_cuda *c) {
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->scratch) cudaFree(c->scratch);
    if (c->blas) cublasDestroy(c->blas);
    if (c->blas_ws) cudaFree(c->blas_ws);
    if (c->counters) cudaFree(c->counters);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" const char *loom_cuda_device_name(const loom_cuda *c) { return c->name; }
extern "C" int loom_cuda_device_cc(const loom_cuda *c) { return c->cc; }

extern "C" loom_status loom_cuda_sync(loom_cuda *c) {
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_time_graph(loom_cuda *c,
                                            loom_status (*fn)(loom_cuda *c, void *arg),
                                            void *arg, int reps, double *us) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    *us = 0;
    CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->capturing = 1;
    loom_status st = fn(c, arg);
    c->capturing = 0;
    cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (st != LOOM_OK) {
        if (graph) cudaGraphDestroy(graph);
        return st;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
    if (e == cudaSuccess) e = cudaEventCreate(&ev[0]);
    if (e == cudaSuccess) e = cudaEventCreate(&ev[1]);
    if (e == cudaSuccess) e = cudaGraphLaunch(exec, c->stream);
    if (e == cudaSuccess) e = cudaEventRecord(ev[0], c->stream);
    for (int r = 0; r < reps && e == cudaSuccess; r++) e = cudaGraphLaunch(exec, c->stream);
    if (e == cudaSuccess) e = cudaEventRecord(ev[1], c->stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(ev[1]);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, ev[0], ev[1]);
    if (ev[0]) cudaEventDestroy(ev[0]);
    if (ev[1]) cudaEventDestroy(ev[1]);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    CUDA_CHECK(e);
    *us = reps > 0 ? 1e3 * ms / reps : 0;
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_alloc(loom_cuda *c, void **d, size_t n) {
    (void)c;
    *d = NULL;
    if (n == 0) return LOOM_OK;
    cudaError_t e = cudaMalloc(d, n);
    if (e != cudaSuccess) {
        *d = NULL;
        return loom_err(e == cudaErrorMemoryAllocation ? LOOM_ERR_NOMEM : LOOM_ERR_INTERNAL,
                        "%s:%d: cudaMalloc of %zu bytes: %s", __FILE__, __LINE__, n,
                        cudaGetErrorString(e));
    }
    return LOOM_OK;
}

extern "C" void loom_cuda_release(loom_cuda *c, void *d) {
    (void)c;
    if (d) cudaFree(d);
}

extern "C" loom_status loom_cuda_upload(loom_cuda *c, void *d_dst, const void *src, size_t n) {
    if (n == 0) return LOOM_OK;
    CUDA_CHECK(cudaMemcpyAsync(d_dst, src, n, cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_download(loom_cuda *c, void *dst, const void *d_src, size_t n) {
    if (n == 0) return LOOM_OK;
    CUDA_CHECK(cudaMemcpyAsync(dst, d_src, n, cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return LOOM_OK;
}

extern "C" loom_status loom_cuda_memset0(loom_cuda *c, void *d_dst, size_t n) {
    if (n == 0) return LOOM_OK;
    CUDA_CHECK(cudaMemsetAsync(d_dst, 0, n, c->stream));
    return LOOM_OK;
}

loom_status loom_cuda_scratch(loom_cuda *c, size_t n, void **out) {
    if (n > c->scratch_cap) {
        if (c->capturing)
            return loom_err(LOOM_ERR_INTERNAL, "cuda: scratch would grow to %zu bytes while a "
                            "graph is captured", n);
        c->scratch_gen++;
        /* Work already enqueued may still read the old area. */
        CUDA_CHECK(cudaStreamSynchronize(c->stream));
        if (c->scratch) CUDA_CHECK(cudaFree(c->scratch));
        c->scratch = NULL;
        c->scratch_cap = 0;
        size_t cap = n + n / 4;
        CUDA_CHECK(cudaMalloc(&c->scratch, cap));
        c->scratch_cap = cap;
    }
    *out = c->scratch;
    return LOOM_OK;
}
