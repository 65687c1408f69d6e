/* engine_int: the engine's state, shared by engine.c (the thread, the
 * public API and the step) and reuse.c (what admission may reuse). The
 * queues and the step's plan live in the scheduler, e->s. */
#ifndef LOOM_ENGINE_INT_H
#define LOOM_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/exec.h"
#include "engine/kvdisk.h"
#include "engine/restore.h"
#include "engine/sched.h"
#include "engine/session.h"
#include "engine/snapshot.h"
#include "engine/gate.h"
#include "engine/spec.h"

struct loom_engine {
    loom_model *m;                 /* borrowed */
    loom_engine_params p;
    int n_ctx, max_seqs;
    loom_kv_pool *kv;              /* owned */
    loom_exec *exec;               /* owned: CPU or device forwards */
    loom_sched s;                  /* queues, plan, counters (s.kv is kv) */
    float *logits;                 /* owned (max_seqs, vocab) */
    float *plp_logits;             /* owned (plp_rows, vocab): a prompt-logprob row's
                                      logits; made at the first such submit (under mu) */
    int plp_rows;
    float *hidden;                 /* owned (max_batch_tokens, hidden): embedding rows'
                                      hidden states; made at the first such submit
                                      (under mu) */
    loom_fwd_row *rows;            /* owned [max_seqs] */
    int32_t *picks;                /* owned [max_seqs]: -1 asks the forward for the
                                      token (a device forward answers it), -2 =
                                      sample from the logits */
    loom_sample_pick *samp;        /* owned [max_seqs]: how a -1 row is sampled
                                      (temperature 0: greedy) */
    int32_t *vids;                 /* owned [max_seqs + spec budget]: verification rows'
                                      greedy ids from a device forward (loom_fwd_row's
                                      ids), or NULL (no speculation, or the CPU) */
    FILE *trace;                   /* owned, may be NULL */
    int cache;                     /* prefix cache in use */
    loom_kvdisk *disk;             /* owned disk tier, or NULL */
    loom_snapshots *snaps;         /* owned saved states (linear-attention models) */
    loom_sessions *sessions;       /* owned parked sequences, or NULL (no prefix cache) */
    loom_restorer *restorer;       /* owned disk reader thread, with disk */
    loom_spec *spec;               /* owned drafter, or NULL (no speculation) */
    loom_gate gate;                /* whether a step speculates, by batch size */
    /* engine thread only: decode-only steps' CPU seconds by kind (stats) */
    uint64_t cpu_steps[2];         /* [spec] */
    double cpu_draft, cpu_fwd[2], cpu_commit[2];
    atomic_int restores_ready;     /* finished jobs not yet taken up */
    int has_state;                 /* the model keeps recurrent state per sequence */
    int window;                    /* every layer slides over this many tokens; 0 = no */
    char ns_base[256];             /* namespace text: model and KV layout */
    struct loom_vision *vision;    /* owned vision tower, or NULL: no images */

    pthread_t thread;
    pthread_mutex_t mu;            /* guards inbox, stop, stats */
    pthread_cond_t cv;
    loom_request **inbox;          /* owned [inbox_cap] */
    int n_inbox, inbox_cap;
    int stop;
    uint64_t next_id;
    loom_engine_stats stats;       /* guarded by mu: published counters */
};

/* reuse.c. The scheduler's hooks for e (sessions, prefix cache, disk
 * restores, snapshots); call once the stores exist. */
sched_hooks loom_reuse_hooks(loom_engine *e);
/* Takes up finished disk restores (the step's start). */
void loom_reuse_take_restores(loom_engine *e);
/* The restore thread's callback (ctx: the engine). */
void loom_reuse_restore_done(void *ctx);
/* Builds r->prompt for its prompt rows from r->seq.n_tokens on (the
 * scheduler's prepare hook). */
loom_status loom_reuse_prepare(loom_engine *e, loom_request *r);
/* The snapshot store's spill to the disk tier (ctx: the engine). */
void loom_reuse_spill_state(void *ctx, uint64_t hash, int n_tokens, const void *state);

#endif
