/* tp: the sum the ranks of a tensor-parallel model make of their o and down
 * projections' outputs (model/shard.h). On distinct devices it is NCCL's
 * all-reduce (built with LOOM_NCCL; NVLink multicast stays off); ranks that
 * share one device (the tests' way to run a split on one GPU, where NCCL
 * refuses a device twice) add each other's buffers with a kernel, between
 * host barriers. Every rank runs on its own host thread and calls
 * loom_cuda_tp_sum the same number of times in the same order; a rank that
 * fails calls loom_cuda_tp_abort, which releases the others with an error. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_NCCL
#include <nccl.h>
#endif

#include "cuda/cuda_int.cuh"

struct loom_cuda_tp {
    int n, shared;
    int devices[LOOM_TP_MAX];
#ifdef LOOM_NCCL
    ncclComm_t comm[LOOM_TP_MAX];
    int have_comm;
#endif
    /* the ranks' meeting point; aborted once a rank failed (every wait
     * then returns at once, so no rank waits on one that left) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting, aborted;
    unsigned phase;
    /* shared device: each rank's buffer, a scratch sum and two events */
    float *bufs[LOOM_TP_MAX];
    float *tmp[LOOM_TP_MAX];
    size_t tmp_n[LOOM_TP_MAX];
    cudaEvent_t ev[LOOM_TP_MAX], ev2[LOOM_TP_MAX];
};

extern "C" loom_status loom_cuda_tp_create(const int *devices, int n, loom_cuda_tp **out) {
    *out = NULL;
    if (n < 1 || n > LOOM_TP_MAX)
        return loom_err(LOOM_ERR_INVALID_ARG, "tensor parallel: %d ranks (expected 1 to %d)", n,
                        LOOM_TP_MAX);
    loom_cuda_tp *t = (loom_cuda_tp *)calloc(1, sizeof *t);
    if (!t) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    t->n = n;
    memcpy(t->devices, devices, sizeof *devices * (size_t)n);
    int dup = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) dup += devices[i] == devices[j];
    t->shared = n > 1 && dup == n * (n - 1) / 2;
    if (dup && !t->shared) {
        free(t);
        return loom_err(LOOM_ERR_INVALID_ARG, "tensor parallel: the ranks' devices must be all "
                        "distinct or all one (a device named twice among others)");
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    loom_status st = LOOM_OK;
    if (t->shared || n == 1) {
#ifdef LOOM_NCCL
        if (n == 1) {  /* the NCCL path at a world size of one */
            setenv("NCCL_NVLS_ENABLE", "0", 0);
            ncclResult_t r = ncclCommInitAll(t->comm, 1, t->devices);
            if (r != ncclSuccess)
                st = loom_err(LOOM_ERR_INTERNAL, "tensor parallel: NCCL: %s", ncclGetErrorString(r));
            t->have_comm = r == ncclSuccess;
        }
#endif
        for (int i = 0; i < n && st == LOOM_OK && t->shared; i++) {
            cudaError_t e = cudaSetDevice(devices[0]);
            if (e == cudaSuccess) e = cudaEventCreateWithFlags(&t->ev[i], cudaEventDisableTiming);
            if (e == cudaSuccess) e = cudaEventCreateWithFlags(&t->ev2[i], cudaEventDisableTiming);
            if (e != cudaSuccess)
                st = loom_err(LOOM_ERR_INTERNAL, "tensor parallel: events: %s", cudaGetErrorString(e));
        }
    } else {
#ifdef LOOM_NCCL
        /* a program that turns NVLink multicast on can put the GPUs out of
         * service: off unless the user set it */
        setenv("NCCL_NVLS_ENABLE", "0", 0);
        ncclResult_t r = ncclCommInitAll(t->comm, n, t->devices);
        if (r != ncclSuccess)
            st = loom_err(LOOM_ERR_INTERNAL, "tensor parallel: NCCL over %d devices: %s", n,
                          ncclGetErrorString(r));
        t->have_comm = r == ncclSuccess;
#else
        st = loom_err(LOOM_ERR_UNSUPPORTED, "tensor parallel over %d devices needs NCCL: this "
                      "loom was built without it (nccl.h under CUDA_HOME/include)", n);
#endif
    }
    if (st != LOOM_OK) {
        loom_cuda_tp_free(t);
        return st;
    }
    *out = t;
    return LOOM_OK;
}

extern "C" void loom_cuda_tp_free(loom_cuda_tp *t) {
    if (!t) return;
#ifdef LOOM_NCCL
    for (int i = 0; t->have_comm && i < t->n; i++) ncclCommDestroy(t->comm[i]);
#endif
    for (int i = 0; i < t->n; i++) {
        if (t->ev[i]) cudaEventDestroy(t->ev[i]);
        if (t->ev2[i]) cudaEventDestroy(t->ev2[i]);
        if (t->tmp[i]) cudaFree(t->tmp[i]);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

extern "C" void loom_cuda_tp_abort(loom_cuda_tp *t) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    int first = !t->aborted;
    t->aborted = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
#ifdef LOOM_NCCL
    /* ranks blocked in an all-reduce that a failed rank never joins */
    for (int i = 0; first && t->have_comm && i < t->n; i++) ncclCommAbort(t->comm[i]);
    if (first) t->have_comm = 0;
#else
    (void)first;
#endif
}

/* Every rank here, or an error once one has failed. */
static loom_status meet(loom_cuda_tp *t) {
    pthread_mutex_lock(&t->mu);
    unsigned phase = t->phase;
    if (!t->aborted && ++t->waiting == t->n) {
        t->waiting = 0;
        t->phase++;
        pthread_cond_broadcast(&t->cv);
    }
    while (!t->aborted && t->phase == phase) pthread_cond_wait(&t->cv, &t->mu);
    int aborted = t->aborted;
    pthread_mutex_unlock(&t->mu);
    return aborted ? loom_err(LOOM_ERR_INTERNAL, "tensor parallel: another rank failed; the split "
                              "model takes no more steps") : LOOM_OK;
}

extern "C" int loom_cuda_tp_size(const loom_cuda_tp *t) { return t ? t->n : 1; }

#define TRY_TP(call)                  \
    do {                              \
        loom_status s_ = (call);      \
        if (s_ != LOOM_OK) return s_; \
    } while (0)

typedef struct tp_ptrs {
    const float *p[LOOM_TP_MAX];
    int n;
} tp_ptrs;

/* out = the ranks' buffers added in rank order (every rank the same bits) */
__global__ void tp_sum_kernel(float *out, tp_ptrs ps, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = ps.p[0][i];
        for (int j = 1; j < ps.n; j++) s += ps.p[j][i];
        out[i] = s;
    }
}

extern "C" loom_status loom_cuda_tp_sum(loom_cuda_tp *t, int rank, loom_cuda *c, float *buf,
                                        size_t n) {
    if (!t || n == 0) return LOOM_OK;
    pthread_mutex_lock(&t->mu);
    int aborted = t->aborted;
    pthread_mutex_unlock(&t->mu);
    if (aborted) return meet(t);
#ifdef LOOM_NCCL
    if (t->have_comm) {
        ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, t->comm[rank], c->stream);
        if (r != ncclSuccess)
            return loom_err(LOOM_ERR_INTERNAL, "tensor parallel: all-reduce on rank %d: %s", rank,
                            ncclGetErrorString(r));
        return LOOM_OK;
    }
#endif
    if (t->n == 1) return LOOM_OK;
    if (t->tmp_n[rank] < n) {
        if (t->tmp[rank]) cudaFree(t->tmp[rank]);
        t->tmp[rank] = NULL;
        t->tmp_n[rank] = 0;
        CUDA_CHECK(cudaMalloc((void **)&t->tmp[rank], n * sizeof(float)));
        t->tmp_n[rank] = n;
    }
    t->bufs[rank] = buf;
    CUDA_CHECK(cudaEventRecord(t->ev[rank], c->stream));
    TRY_TP(meet(t));  /* every rank's buffer is named and its event recorded */
    tp_ptrs ps;
    ps.n = t->n;
    for (int j = 0; j < t->n; j++) {
        ps.p[j] = t->bufs[j];
        CUDA_CHECK(cudaStreamWaitEvent(c->stream, t->ev[j], 0));
    }
    tp_sum_kernel<<<LOOM_MIN_U(loom_cuda_blocks(n, 256), 1024u), 256, 0, c->stream>>>(
        t->tmp[rank], ps, n);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaEventRecord(t->ev2[rank], c->stream));
    TRY_TP(meet(t));  /* no rank writes its buffer before all have read it */
    for (int j = 0; j < t->n; j++) CUDA_CHECK(cudaStreamWaitEvent(c->stream, t->ev2[j], 0));
    CUDA_CHECK(cudaMemcpyAsync(buf, t->tmp[rank], n * sizeof(float), cudaMemcpyDeviceToDevice,
                               c->stream));
    return LOOM_OK;
}
