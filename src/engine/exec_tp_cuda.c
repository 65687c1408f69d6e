/* exec_tp_cuda: the executor over a model split across ranks (CUDA=1
 * builds; model/shard.h, cuda/cuda.h's loom_cuda_tp). One host thread per
 * rank owns its device context, shard, device model and KV rows (its
 * heads' share of every row); the engine thread hands each step to all of
 * them and waits. Rank 0 alone computes the head, picks tokens and writes
 * the rows' logits and sequences; the others read the rows and leave
 * them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cuda/cuda.h"
#include "engine/exec_int.h"
#include "model/shard.h"

enum { JOB_NONE, JOB_CREATE, JOB_FORWARD, JOB_FREE, JOB_QUIT };

typedef struct tp_exec tp_exec;

typedef struct tp_rank {
    tp_exec *x;
    int rank, device;
    pthread_t th;
    int started;
    loom_model *shard;         /* owned */
    loom_cuda *cuda;           /* owned */
    loom_cuda_model *gpu;      /* owned */
    loom_kv_layout lay;        /* the host pool's layout at this shard's KV width */
    loom_status st;
    char err[1024];
} tp_rank;

struct tp_exec {
    loom_exec base;
    loom_model *m;             /* borrowed */
    int n;
    tp_rank ranks[LOOM_TP_MAX];
    loom_cuda_tp *tp;          /* owned */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned gen;              /* bumped for each job */
    int job, pending;
    int failed;                /* the first rank that failed a job, or -1 */
    /* the job's arguments */
    int step_tokens, max_ctx;
    loom_kv_pool *kv;
    loom_fwd_row *rows;
    int n_rows;
    int32_t *picks;
    const loom_sample_pick *samp;
};

static loom_status run_job(tp_rank *r, int job) {
    tp_exec *x = r->x;
    switch (job) {
    case JOB_CREATE: {
        loom_status s = loom_model_shard(x->m, r->rank, x->n, &r->shard);
        if (!s) s = loom_cuda_create(r->device, &r->cuda);
        if (!s) {
            r->lay = x->kv->lay;
            r->lay.kv_dim = r->shard->kv_dim;
            r->lay.row_bytes = loom_kv_row_bytes(r->lay.type, r->lay.kv_dim);
            s = loom_cuda_model_create(r->cuda, r->shard, &r->lay, x->step_tokens, x->max_ctx,
                                       &r->gpu);
        }
        if (!s) s = loom_cuda_model_set_tp(r->gpu, x->tp, r->rank);
        return s;
    }
    case JOB_FORWARD:
        return loom_cuda_forward(r->gpu, &r->lay, x->rows, x->n_rows, r->rank ? NULL : x->picks,
                                 r->rank ? NULL : x->samp);
    case JOB_FREE:
        loom_cuda_model_free(r->gpu);
        loom_cuda_free(r->cuda);
        loom_model_shard_free(r->shard);
        r->gpu = NULL;
        r->cuda = NULL;
        r->shard = NULL;
        return LOOM_OK;
    default:
        return LOOM_OK;
    }
}

static void *rank_main(void *arg) {
    tp_rank *r = arg;
    tp_exec *x = r->x;
    unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&x->mu);
        while (x->gen == seen) pthread_cond_wait(&x->go, &x->mu);
        seen = x->gen;
        int job = x->job;
        pthread_mutex_unlock(&x->mu);
        loom_status s = run_job(r, job);
        r->st = s;
        if (s) {
            snprintf(r->err, sizeof r->err, "%s", loom_last_error());
            pthread_mutex_lock(&x->mu);
            if (x->failed < 0) x->failed = r->rank;
            pthread_mutex_unlock(&x->mu);
            loom_cuda_tp_abort(x->tp);  /* the others may be waiting on this rank's sums */
        }
        pthread_mutex_lock(&x->mu);
        if (--x->pending == 0) pthread_cond_signal(&x->done);
        pthread_mutex_unlock(&x->mu);
        if (job == JOB_QUIT) break;
    }
    return NULL;
}

/* Runs job on every rank and waits for all; the error of the rank that
 * failed first (the others then stopped at their next sum) is raised on
 * the calling thread. */
static loom_status all_ranks(tp_exec *x, int job) {
    pthread_mutex_lock(&x->mu);
    x->job = job;
    x->pending = x->n;
    x->gen++;
    pthread_cond_broadcast(&x->go);
    while (x->pending > 0) pthread_cond_wait(&x->done, &x->mu);
    int f = x->failed;
    pthread_mutex_unlock(&x->mu);
    if (job == JOB_QUIT || job == JOB_FREE) return LOOM_OK;
    for (int i = 0; i < x->n; i++) {
        const tp_rank *r = &x->ranks[f >= 0 ? f : i];
        if (r->st) return loom_err(r->st, "rank %d (device cuda:%d): %s", r->rank, r->device, r->err);
    }
    return LOOM_OK;
}

static loom_status tp_forward(loom_exec *e, loom_kv_pool *kv, loom_fwd_row *rows, int n_rows,
                              int32_t *picks, const loom_sample_pick *samp) {
    tp_exec *x = (tp_exec *)e;
    x->kv = kv;
    x->rows = rows;
    x->n_rows = n_rows;
    x->picks = picks;
    x->samp = samp;
    loom_status s = all_ranks(x, JOB_FORWARD);
    for (int r = 0; !s && r < n_rows; r++) rows[r].seq->n_tokens += rows[r].n;
    return s;
}

static void tp_free(loom_exec *e) {
    tp_exec *x = (tp_exec *)e;
    int started = 0;
    for (int i = 0; i < x->n; i++) started += x->ranks[i].started;
    if (started == x->n) {
        all_ranks(x, JOB_FREE);
        all_ranks(x, JOB_QUIT);
    } else if (started) {
        /* a failed start: the threads that run end on QUIT, having made nothing */
        pthread_mutex_lock(&x->mu);
        x->job = JOB_QUIT;
        x->pending = started;
        x->gen++;
        pthread_cond_broadcast(&x->go);
        while (x->pending > 0) pthread_cond_wait(&x->done, &x->mu);
        pthread_mutex_unlock(&x->mu);
    }
    for (int i = 0; i < x->n; i++)
        if (x->ranks[i].started) pthread_join(x->ranks[i].th, NULL);
    loom_cuda_tp_free(x->tp);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->go);
    pthread_cond_destroy(&x->done);
    free(x);
}

static const loom_exec_ops tp_ops = {
    .forward = tp_forward, .free = tp_free, .set_taps = NULL, .on_device = 1,
    .pick_top_k_max = LOOM_CUDA_TOPK_MAX,
};

loom_status loom_exec_tp_cuda_create(loom_model *m, loom_kv_pool *kv, int step_tokens, int max_ctx,
                                     loom_exec **out) {
    *out = NULL;
    int n = m->tp_n;
    if (n < 1 || n > LOOM_TP_MAX)
        return loom_err(LOOM_ERR_INVALID_ARG, "tensor parallel: %d ranks (expected 1 to %d)", n,
                        LOOM_TP_MAX);
    if (kv->lay.mixed)
        return loom_err(LOOM_ERR_UNSUPPORTED, "tensor parallel: per-layer KV types "
                        "(kv_config.json) are not supported on CUDA");
    tp_exec *x = calloc(1, sizeof *x);
    if (!x) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    x->base.ops = &tp_ops;
    x->m = m;
    x->n = n;
    x->failed = -1;
    x->kv = kv;
    x->step_tokens = step_tokens;
    x->max_ctx = max_ctx;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->go, NULL);
    pthread_cond_init(&x->done, NULL);
    int dev[LOOM_TP_MAX];
    for (int i = 0; i < n; i++) dev[i] = m->tp_devices[i];
    loom_status s = loom_cuda_tp_create(dev, n, &x->tp);
    for (int i = 0; i < n && !s; i++) {
        tp_rank *r = &x->ranks[i];
        r->x = x;
        r->rank = i;
        r->device = dev[i];
        if (pthread_create(&r->th, NULL, rank_main, r))
            s = loom_err(LOOM_ERR_INTERNAL, "tensor parallel: cannot start the thread of rank %d", i);
        else
            r->started = 1;
    }
    if (!s) s = all_ranks(x, JOB_CREATE);
    if (s) {
        tp_free(&x->base);
        return s;
    }
    *out = &x->base;
    return LOOM_OK;
}
