/* restore: one worker thread and a FIFO of jobs. */
#include "engine/restore.h"

#include <pthread.h>
#include <stdlib.h>

#include "base/base.h"

struct loom_restorer {
    loom_kvdisk *d;              /* borrowed; only its fixed geometry is read here */
    loom_kv_pool *p;             /* borrowed */
    loom_kvdisk_reader *rd;      /* owned */
    void (*notify)(void *ctx);
    void *ctx;
    pthread_t thread;
    pthread_mutex_t mu;          /* guards the queue, busy, stop */
    pthread_cond_t cv;           /* work or stop (worker), idle (drain) */
    loom_restore_job *head, *tail;
    int busy, stop;
};

static void run(loom_restorer *w, loom_restore_job *j) {
    int bs = w->p->lay.block_size;
    j->n_ok = 0;
    j->result = LOOM_KVDISK_OK;
    for (int i = 0; i < j->n; i++) {
        int r = loom_kvdisk_read(w->d, w->rd, w->p, j->hash[i], j->parent[i], j->tokens + (size_t)i * bs,
                                 j->block[i], &j->why, &j->bytes[i]);
        if (r != LOOM_KVDISK_OK) {
            j->result = r;
            break;
        }
        j->n_ok++;
    }
    /* a state only counts at a boundary whose blocks are all there */
    j->state_found = -1;
    for (int c = 0; c < j->n_states; c++) j->state_result[c] = -1;
    for (int c = 0; c < j->n_states; c++) {
        if (j->state_block[c] >= j->first + j->n_ok) continue;
        int n = 0;
        j->state_result[c] = loom_kvdisk_read_state(w->d, j->state_hash[c], &n, j->state, j->state_bytes,
                                                    &j->state_why[c]);
        if (j->state_result[c] == LOOM_KVDISK_OK && n == (j->state_block[c] + 1) * bs) {
            j->state_found = c;
            j->state_tokens = n;
            break;
        }
        if (j->state_result[c] == LOOM_KVDISK_OK) j->state_result[c] = LOOM_KVDISK_MISS;
    }
}

static void *worker(void *arg) {
    loom_restorer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->head && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->head) break; /* stop, nothing left */
        loom_restore_job *j = w->head;
        w->head = j->next;
        if (!w->head) w->tail = NULL;
        w->busy = 1;
        pthread_mutex_unlock(&w->mu);
        run(w, j);
        atomic_store(&j->done, 1);
        w->notify(w->ctx);
        pthread_mutex_lock(&w->mu);
        w->busy = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

loom_status loom_restorer_create(loom_kvdisk *d, loom_kv_pool *p, void (*notify)(void *ctx), void *ctx,
                                 loom_restorer **out) {
    *out = NULL;
    loom_restorer *w = calloc(1, sizeof *w);
    if (!w) return loom_err(LOOM_ERR_NOMEM, "out of memory");
    *w = (loom_restorer){.d = d, .p = p, .notify = notify, .ctx = ctx};
    loom_status s = loom_kvdisk_reader_create(d, &w->rd);
    if (s) {
        free(w);
        return s;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        loom_kvdisk_reader_free(w->rd);
        free(w);
        return loom_err(LOOM_ERR_NOMEM, "prefix cache: cannot start the disk reader thread");
    }
    *out = w;
    return LOOM_OK;
}

void loom_restorer_free(loom_restorer *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    loom_kvdisk_reader_free(w->rd);
    free(w);
}

loom_restore_job *loom_restore_job_new(int n, int n_states, size_t state_bytes) {
    loom_restore_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->n = n;
    j->hash = malloc(sizeof *j->hash * (size_t)(n + 1));
    j->parent = malloc(sizeof *j->parent * (size_t)(n + 1));
    j->block = malloc(sizeof *j->block * (size_t)(n + 1));
    j->bytes = calloc((size_t)n + 1, sizeof *j->bytes);
    j->n_states = n_states;
    j->state_hash = malloc(sizeof *j->state_hash * (size_t)(n_states + 1));
    j->state_block = malloc(sizeof *j->state_block * (size_t)(n_states + 1));
    j->state_result = malloc(sizeof *j->state_result * (size_t)(n_states + 1));
    j->state_why = calloc((size_t)n_states + 1, sizeof *j->state_why);
    j->state_bytes = n_states ? state_bytes : 0;
    j->state = n_states ? malloc(state_bytes) : NULL;
    j->state_found = -1;
    atomic_init(&j->done, 0);
    if (!j->hash || !j->parent || !j->block || !j->bytes || !j->state_hash || !j->state_block ||
        !j->state_result || !j->state_why || (n_states && !j->state)) {
        loom_restore_job_free(j);
        return NULL;
    }
    return j;
}

void loom_restore_job_free(loom_restore_job *j) {
    if (!j) return;
    free(j->hash);
    free(j->parent);
    free(j->block);
    free(j->bytes);
    free(j->state_hash);
    free(j->state_block);
    free(j->state_result);
    free(j->state_why);
    free(j->state);
    free(j);
}

void loom_restorer_submit(loom_restorer *w, loom_restore_job *j) {
    j->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->tail) w->tail->next = j;
    else w->head = j;
    w->tail = j;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void loom_restorer_drain(loom_restorer *w) {
    pthread_mutex_lock(&w->mu);
    while (w->head || w->busy) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}
