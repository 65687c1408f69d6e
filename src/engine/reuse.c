/* reuse: what a request admitted by the scheduler may take from earlier
 * work, and what a finished one leaves behind: sessions, the prefix cache,
 * disk restores (restore.c is their thread; the planning and taking up of
 * jobs is here), recurrent-state snapshots, and parking.
 *
 * Design notes
 * - One admission call (reuse_admit, the scheduler's admit hook) maps
 *   into the request's sequence whatever it may reuse and returns the
 *   tokens reused; when the disk tier holds more, it also leaves a planned
 *   restore job in r->restore, and the scheduler, once the request holds
 *   its blocks, puts it in RQ_RESTORING and starts the job.
 * - Disk restores never hold up a step. At admission the blocks past the
 *   memory hit that the disk tier's index holds are planned (no I/O); the
 *   request waits in the running set without rows while the restore thread
 *   reads the files into its blocks. When the job is done, the step's start
 *   puts the blocks in the cache and the request prefills the rest (cut
 *   short at the first file that failed). A restoring request is never
 *   preempted, and a cancelled one waits for its job before releasing its
 *   blocks. Recurrent-state snapshots on disk (linear-attention models) go
 *   the same way: the job also reads the highest snapshot above the best
 *   one in memory that lies within the blocks it restored.
 * - Sessions. A request with a save id parks its whole sequence (and
 *   recurrent state) in the session store when it finishes; a request
 *   naming it resumes at admission: dense models from the longest common
 *   prefix of the two token lists (short of the prompt's last token),
 *   models with recurrent state only at exactly the session's end (else
 *   the prefix cache and snapshots take over). The blocks are mapped, the
 *   partial last one copied, so only the new tokens are forwarded. Parked
 *   blocks are reclaimable: wherever blocks are needed, sessions are
 *   evicted (least recently used first) before anything is preempted.
 * - Prompt logprobs need every prompt position computed: such a request
 *   reuses nothing; nor does an embedding pooled over positions (mean,
 *   first). Last-token pooling reuses as usual: the last token is always
 *   computed, and a prompt token's attention is the same whatever was
 *   cached. */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "engine/engine_int.h"
#include "vision/vision.h"

/* Evicts parked sessions until need blocks can be handed out (or none is
 * left to evict). */
static void make_room(loom_engine *e, int need) {
    while (e->sessions && loom_kv_available(e->kv) < need)
        if (!loom_sessions_evict_one(e->sessions)) break;
}

/* Parks a finished request's sequence under its save keys: the blocks
 * holding its tokens, and its recurrent state. */
static void park(loom_engine *e, loom_request *r) {
    loom_kv_seq *seq = &r->seq;
    int keep = loom_sched_blocks(e->kv, seq->n_tokens);
    if (seq->n_blocks > keep) loom_kv_seq_truncate(e->kv, seq, keep * e->kv->lay.block_size);
    loom_session *x = loom_sessions_put(e->sessions, r->save_key, r->save_alias, r->ns, seq, r->keys);
    if (x && x->state) loom_seq_state_save(r->rstate, x->state);
    /* Parked blocks count against the cache's cap like unreferenced cached
     * ones. A kept response was asked for by name, cached blocks were not:
     * those go first, so the response just parked is not the one evicted
     * whenever the cache is full; sessions go only when none is left. */
    while (e->kv->n_lru + e->kv->n_reclaim > e->kv->cache_cap)
        if (!loom_kv_cache_evict_one(e->kv) && !loom_sessions_evict_one(e->sessions)) break;
}

void loom_reuse_spill_state(void *ctx, uint64_t hash, int n_tokens, const void *state) {
    loom_engine *e = ctx;
    loom_kvdisk_put_state(e->disk, hash, n_tokens, state, loom_seq_state_bytes(e->m));
}

/* Linear-attention models: the KV hit is usable only up to the longest
 * boundary with a saved state. Cuts the sequence back to it and restores
 * the state there (or to nothing). Returns the tokens resumed. */
static int resume_from_snapshot(loom_engine *e, loom_request *r, const loom_restore_job *j) {
    loom_kv_seq *seq = &r->seq;
    int bs = e->kv->lay.block_size;
    for (int i = seq->n_blocks - 1; i >= 0; i--) {
        uint64_t h = seq->blocks[i] >= 0 ? e->kv->hash[seq->blocks[i]] : 0;
        int n = 0;
        const void *st = h ? loom_snapshots_find(e->snaps, h, &n) : NULL;
        if (!st && j && j->state_found >= 0 && j->state_block[j->state_found] == i) {
            /* a snapshot of an earlier run, read by the restore thread */
            h = j->state_hash[j->state_found];
            n = j->state_tokens;
            void *buf = loom_snapshots_put(e->snaps, h, n);
            if (buf) memcpy(buf, j->state, j->state_bytes);
            st = j->state;
        }
        if (!st || n != (i + 1) * bs) continue;
        loom_kv_seq_truncate(e->kv, seq, n);
        seq->n_hashed = i + 1;
        seq->chain = h;
        loom_seq_state_load(r->rstate, st, n);
        return n;
    }
    loom_kv_seq_truncate(e->kv, seq, 0);
    return 0;
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* Continues the session the request names, if its prompt extends the
 * session's tokens. Returns the tokens resumed, or -1 (nothing mapped). */
static int resume_session(loom_engine *e, loom_request *r) {
    loom_session *x = loom_sessions_find(e->sessions, r->resume_key, r->ns);
    int bs = e->kv->lay.block_size, use = 0;
    if (x) {
        int common = common_prefix(x->tokens, x->seq.n_tokens, r->keys, r->prefill_len);
        if (e->has_state) /* recurrent state exists only at the session's end */
            use = common == x->seq.n_tokens && common < r->prefill_len ? common : 0;
        else /* KV is exact up to any position; one token is left to compute */
            use = LOOM_MIN(common, r->prefill_len - 1);
        /* on a device the partial last block cannot be copied (its rows
         * live in device memory): resume whole blocks only, and a
         * recurrent state, which holds the session's every token, only
         * when they end on a block boundary */
        if (loom_exec_on_device(e->exec)) use = e->has_state && use % bs ? 0 : use / bs * bs;
        /* sliding windows: the blocks the next positions see must be there */
        for (int i = e->window ? LOOM_MAX(use - e->window + 1, 0) / bs : 0;
             use > 0 && i < (use + bs - 1) / bs; i++)
            if (x->seq.blocks[i] < 0) use = 0;
    }
    if (use > 0) {
        x->pinned = 1;
        make_room(e, 1); /* for the copy of the partial last block */
        x->pinned = 0;
        if (loom_kv_seq_share(e->kv, &r->seq, &x->seq, use) != LOOM_OK) {
            loom_kv_seq_release(e->kv, &r->seq);
            loom_err_clear();
            use = 0;
        }
    }
    if (use <= 0) {
        e->s.counters.session_misses++;
        return -1;
    }
    if (x->state) loom_seq_state_load(r->rstate, x->state, use);
    e->s.counters.session_hits++;
    e->s.counters.session_hit_tokens += (uint64_t)use;
    return use;
}

/* The worker finished a job: wake the engine thread. */
void loom_reuse_restore_done(void *ctx) {
    loom_engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    atomic_fetch_add(&e->restores_ready, 1);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* What the disk tier can add to a memory hit, from its index (no I/O):
 * the blocks after the hit, in chain order, and for models with recurrent
 * state the snapshots at boundaries above the highest one in memory.
 * NULL when there is nothing. */
static loom_restore_job *plan_restore(loom_engine *e, loom_request *r) {
    int bs = e->kv->lay.block_size, first = r->seq.n_blocks, max = (r->prefill_len - 1) / bs, n = 0;
    uint64_t chain = r->seq.chain;
    while (first + n < max) {
        uint64_t h = loom_kv_chain_hash(chain, r->keys + (size_t)(first + n) * bs, bs);
        if (!loom_kvdisk_has(e->disk, h)) break;
        chain = h;
        n++;
    }
    uint64_t *bh = malloc(sizeof *bh * (size_t)(first + n + 1)); /* each block's chain hash */
    if (!bh) return NULL;
    chain = r->seq.chain;
    for (int i = 0; i < first + n; i++)
        bh[i] = i < first ? e->kv->hash[r->seq.blocks[i]]
                          : (chain = loom_kv_chain_hash(chain, r->keys + (size_t)i * bs, bs));
    int n_states = 0, *at = NULL;
    if (e->snaps && first + n > 0 && (at = malloc(sizeof *at * (size_t)(first + n)))) {
        for (int i = first + n - 1; i >= 0; i--) {
            int bn = 0;
            if (bh[i] && loom_snapshots_find(e->snaps, bh[i], &bn) && bn == (i + 1) * bs) break;
            if (bh[i] && loom_kvdisk_has_state(e->disk, bh[i])) at[n_states++] = i;
        }
    }
    loom_restore_job *j = n || n_states ? loom_restore_job_new(n, n_states, loom_seq_state_bytes(e->m)) : NULL;
    if (j) {
        j->first = first;
        for (int i = 0; i < n; i++) {
            j->parent[i] = first + i ? bh[first + i - 1] : r->seq.chain;
            j->hash[i] = bh[first + i];
        }
        for (int c = 0; c < n_states; c++) {
            j->state_block[c] = at[c];
            j->state_hash[c] = bh[at[c]];
        }
        j->tokens = r->keys + (size_t)first * bs;
    }
    free(at);
    free(bh);
    return j;
}

/* The admission call: returns the tokens r reuses, with a planned restore
 * in r->restore when the disk tier holds more ("restoring: wait"). */
static int reuse_admit(loom_engine *e, loom_request *r) {
    /* an embedding pooled over positions needs each one computed */
    if (r->plp_next < r->n_prompt || (r->pooling && r->pooling != LOOM_POOLING_LAST)) return 0;
    int hit = e->sessions && r->resume_key ? resume_session(e, r) : -1;
    if (hit >= 0) return hit;
    hit = e->cache ? loom_kv_cache_lookup(e->kv, &r->seq, r->keys, r->prefill_len, r->ns) : 0;
    if (e->restorer) r->restore = plan_restore(e, r);
    if (e->snaps && !r->restore) hit = resume_from_snapshot(e, r, NULL); /* after a restore, else */
    return hit;
}

/* Takes up finished restores: accounts the reads, caches the blocks read
 * and moves the requests on to prefill the rest. */
void loom_reuse_take_restores(loom_engine *e) {
    loom_sched *s = &e->s;
    int bs = e->kv->lay.block_size;
    for (int i = 0; i < s->n_running && atomic_load(&e->restores_ready) > 0; i++) {
        loom_request *r = s->running[i];
        loom_restore_job *j = r->restore;
        if (r->state != RQ_RESTORING || !atomic_load(&j->done)) continue;
        atomic_fetch_sub(&e->restores_ready, 1);
        for (int k = 0; k < j->n_ok; k++) loom_kvdisk_account(e->disk, j->hash[k], LOOM_KVDISK_OK, NULL, j->bytes[k]);
        if (j->n_ok < j->n) loom_kvdisk_account(e->disk, j->hash[j->n_ok], j->result, j->why, j->bytes[j->n_ok]);
        for (int c = 0; c < j->n_states; c++)
            if (j->state_result[c] >= 0)
                loom_kvdisk_account_state(e->disk, j->state_hash[c], j->state_result[c], j->state_why[c],
                                          j->state_bytes);
        loom_kv_count_restored(e->kv, j->n_ok);
        int first = j->first;
        r->seq.n_tokens = (first + j->n_ok) * bs;
        loom_kv_cache_commit(e->kv, &r->seq, r->keys, r->ns);
        int hit = r->seq.n_tokens;
        if (e->snaps) hit = resume_from_snapshot(e, r, j);
        loom_rq_span(r, "cache.disk_restore", NULL, j->t_submit, loom_sched_now(s),
                     RQ_ATTRS({"startToken", first * bs}, {"cachedTokens", j->n_ok * bs}));
        loom_restore_job_free(j);
        r->restore = NULL;
        int n = s->n_running;
        loom_sched_restored(s, i, hit);
        if (s->n_running < n) i--; /* it waits again */
    }
}

/* Saves the state of a stateful request that just reached a boundary.
 * Returns whether it did. */
static int maybe_snapshot(loom_engine *e, loom_request *r) {
    int n = r->seq.n_tokens, bs = e->kv->lay.block_size;
    if (n % bs || (n != r->snap[0] && n != r->snap[1]) || r->seq.n_hashed != n / bs) return 0;
    void *buf = loom_snapshots_put(e->snaps, r->seq.chain, n);
    if (buf) loom_seq_state_save(r->rstate, buf);
    return buf != NULL;
}

/* Image k's tower output into r->features[k] (run once per request: a
 * recompute after preemption takes it from there); its pixels are then
 * not needed and freed. */
static loom_status encode_image(loom_engine *e, loom_request *r, int k) {
    const loom_vision_info *vi = loom_vision_get_info(e->vision);
    loom_request_image *im = &r->images[k];
    size_t cnt = (size_t)loom_vision_tokens(vi, im->grid), H = (size_t)vi->out_hidden;
    if (!r->features && !(r->features = calloc((size_t)r->n_images, sizeof *r->features)))
        return loom_err(LOOM_ERR_NOMEM, "out of memory for the prompt's image features");
    float *f = malloc(sizeof *f * cnt * H * (size_t)(1 + vi->n_deep));
    if (!f) return loom_err(LOOM_ERR_NOMEM, "out of memory for image %d's features", k + 1);
    loom_vision_image img = {.pixels = im->pixels};
    memcpy(img.grid, im->grid, sizeof img.grid);
    loom_status st = loom_vision_encode(e->vision, &img, f, vi->n_deep ? f + cnt * H : NULL);
    if (st) {
        free(f);
        return st;
    }
    r->features[k] = f;
    free((void *)im->pixels);
    im->pixels = NULL;
    e->s.counters.vision_encodes++;
    return LOOM_OK;
}

/* The prepared prompt of a request with images, for its rows from
 * seq.n_tokens on: an image whose placeholders all lie before that (a
 * prefix-cache or session hit holds their KV) is not encoded. */
loom_status loom_reuse_prepare(loom_engine *e, loom_request *r) {
    const loom_vision_info *vi = loom_vision_get_info(e->vision);
    int from = r->seq.n_tokens, at = 0, encoded = 0;
    double t0 = loom_sched_now(&e->s);
    loom_vision_image *imgs = calloc((size_t)r->n_images, sizeof *imgs);
    r->prompt = calloc(1, sizeof *r->prompt);
    loom_status st = imgs && r->prompt ? LOOM_OK
                     : loom_err(LOOM_ERR_NOMEM, "out of memory preparing the prompt's images");
    for (int k = 0; !st && k < r->n_images; k++) {
        /* image k covers the next run of placeholders (checked at submit) */
        while (at < r->n_prompt && r->tokens[at] != vi->image_token) at++;
        at += loom_vision_tokens(vi, r->images[k].grid);
        int want = at > from, have = r->features && r->features[k];
        if (want && !have && !(st = encode_image(e, r, k))) encoded++;
        imgs[k] = (loom_vision_image){.features = want && !st ? r->features[k] : NULL};
        memcpy(imgs[k].grid, r->images[k].grid, sizeof imgs[k].grid);
    }
    if (!st) st = loom_vision_prompt_build(e->vision, r->tokens, r->n_prompt, imgs, r->n_images,
                                           r->prompt);
    free(imgs);
    if (st) {
        free(r->prompt);
        r->prompt = NULL;
        return st;
    }
    loom_rq_span(r, "prefill.vision", NULL, t0, loom_sched_now(&e->s),
                 RQ_ATTRS({"images", r->n_images}, {"encoded", encoded}, {"startToken", from}));
    return LOOM_OK;
}

/* ---- the scheduler's hooks ---------------------------------------------- */

static loom_status hook_prepare(void *ctx, loom_request *r) { return loom_reuse_prepare(ctx, r); }


static int hook_admit(void *ctx, loom_request *r) { return reuse_admit(ctx, r); }

static void hook_restore_start(void *ctx, loom_request *r) {
    loom_engine *e = ctx;
    loom_restore_job *j = r->restore;
    for (int k = 0; k < j->n; k++) j->block[k] = r->seq.blocks[j->first + k];
    j->t_submit = loom_sched_now(&e->s);
    loom_restorer_submit(e->restorer, j);
}

static void hook_make_room(void *ctx, int blocks) { make_room(ctx, blocks); }

static int hook_checkpoint(void *ctx, loom_request *r) { return maybe_snapshot(ctx, r); }

static int hook_park(void *ctx, loom_request *r) {
    park(ctx, r);
    return 1;
}

sched_hooks loom_reuse_hooks(loom_engine *e) {
    return (sched_hooks){
        .ctx = e,
        .admit = hook_admit,
        .restore_start = hook_restore_start,
        .make_room = hook_make_room,
        .checkpoint = e->snaps ? hook_checkpoint : NULL,
        .park = e->sessions ? hook_park : NULL,
        .prepare = e->vision ? hook_prepare : NULL,
    };
}
