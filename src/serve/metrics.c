/* metrics: atomic counters and fixed-bucket histograms. */
#include "serve/metrics.h"

#include <string.h>

#include "serve/api.h"

static const double bounds[METRICS_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                               0.25,  0.5,    1,     2.5,  5,     10,   30};
static const int statuses[9] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
void metrics_init(loom_metrics *m) { memset(m, 0, sizeof *m); }
void metrics_free(loom_metrics *m) { (void)m; }

/* The label's row, taking a free one for a new label (any thread). */
static int endpoint_row(loom_metrics *m, const char *endpoint) {
    if (!strcmp(endpoint, "other")) return METRICS_ENDPOINTS - 1;
    for (int i = 0; i < METRICS_ENDPOINTS - 1; i++) {
        const char *l = atomic_load(&m->endpoint[i]);
        if (!l && atomic_compare_exchange_strong(&m->endpoint[i], &l, endpoint)) return i;
        if (!strcmp(l, endpoint)) return i; /* l: this row's label, perhaps just taken */
    }
    return METRICS_ENDPOINTS - 1;
}

void metrics_add_endpoint(loom_metrics *m, const char *endpoint) { (void)endpoint_row(m, endpoint); }

void metrics_count_request(loom_metrics *m, const char *endpoint, int status) {
    int e = endpoint_row(m, endpoint);
    int k = 7; /* unknown statuses count as 500 */
    for (int i = 0; i < 9; i++)
        if (statuses[i] == status) k = i;
    atomic_fetch_add(&m->requests[e][k], 1);
}

void metrics_count_disconnect(loom_metrics *m) { atomic_fetch_add(&m->disconnects, 1); }

void metrics_add_tokens(loom_metrics *m, uint64_t prompt, uint64_t generated) {
    atomic_fetch_add(&m->prompt_tokens, prompt);
    atomic_fetch_add(&m->generated_tokens, generated);
}

static void observe(metrics_hist *h, double s) {
    int b = METRICS_BUCKETS;
    for (int i = 0; i < METRICS_BUCKETS; i++)
        if (s <= bounds[i]) {
            b = i;
            break;
        }
    atomic_fetch_add(&h->count[b], 1);
    atomic_fetch_add(&h->sum_us, (unsigned long long)(s * 1e6));
}

void metrics_observe_ttft(loom_metrics *m, double s) { observe(&m->ttft, s); }
void metrics_observe_itl(loom_metrics *m, double s) { observe(&m->itl, s); }

static void put_hist(loom_buf *b, const char *name, const char *help, metrics_hist *h) {
    loom_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long cum = 0;
    for (int i = 0; i < METRICS_BUCKETS; i++) {
        cum += atomic_load(&h->count[i]);
        loom_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], cum);
    }
    cum += atomic_load(&h->count[METRICS_BUCKETS]);
    loom_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, cum, name,
              (double)atomic_load(&h->sum_us) * 1e-6, name, cum);
}

char *metrics_render(loom_metrics *m, const loom_engine_stats *st, int inflight) {
    loom_buf b = {0};
    loom_buf_puts(&b, "# HELP loom_requests_total HTTP requests by endpoint and status.\n"
                "# TYPE loom_requests_total counter\n");
    for (int e = 0; e < METRICS_ENDPOINTS; e++) {
        const char *label = e < METRICS_ENDPOINTS - 1 ? atomic_load(&m->endpoint[e]) : "other";
        for (int k = 0; label && k < 9; k++) {
            unsigned long long v = atomic_load(&m->requests[e][k]);
            if (v || k == 0)
                loom_buf_printf(&b, "loom_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                          label, statuses[k], v);
        }
    }
    loom_buf_printf(&b,
              "# TYPE loom_prompt_tokens_total counter\nloom_prompt_tokens_total %llu\n"
              "# TYPE loom_generated_tokens_total counter\nloom_generated_tokens_total %llu\n"
              "# TYPE loom_client_disconnects_total counter\nloom_client_disconnects_total %llu\n"
              "# TYPE loom_requests_in_flight gauge\nloom_requests_in_flight %d\n"
              "# TYPE loom_queue_depth gauge\nloom_queue_depth %d\n"
              "# TYPE loom_running_sequences gauge\nloom_running_sequences %d\n"
              "# TYPE loom_kv_blocks_used gauge\nloom_kv_blocks_used %d\n"
              "# TYPE loom_kv_blocks_free gauge\nloom_kv_blocks_free %d\n"
              "# TYPE loom_preemptions_total counter\nloom_preemptions_total %llu\n"
              "# TYPE loom_engine_steps_total counter\nloom_engine_steps_total %llu\n"
              "# TYPE loom_prefix_cache_hit_tokens_total counter\nloom_prefix_cache_hit_tokens_total %llu\n"
              "# TYPE loom_prefix_cache_miss_tokens_total counter\nloom_prefix_cache_miss_tokens_total %llu\n"
              "# TYPE loom_prefix_cache_evicted_blocks_total counter\nloom_prefix_cache_evicted_blocks_total %llu\n"
              "# TYPE loom_prefix_cache_blocks gauge\nloom_prefix_cache_blocks %d\n"
              "# TYPE loom_prefix_cache_disk_hit_tokens_total counter\nloom_prefix_cache_disk_hit_tokens_total %llu\n"
              "# TYPE loom_prefix_cache_disk_reads_total counter\nloom_prefix_cache_disk_reads_total %llu\n"
              "# TYPE loom_prefix_cache_disk_writes_total counter\nloom_prefix_cache_disk_writes_total %llu\n"
              "# TYPE loom_prefix_cache_disk_bytes gauge\nloom_prefix_cache_disk_bytes %llu\n",
              (unsigned long long)atomic_load(&m->prompt_tokens),
              (unsigned long long)atomic_load(&m->generated_tokens),
              (unsigned long long)atomic_load(&m->disconnects), inflight, st->waiting, st->running,
              st->kv_blocks_total - st->kv_blocks_free, st->kv_blocks_free,
              (unsigned long long)st->preemptions, (unsigned long long)st->steps,
              (unsigned long long)st->cache_hit_tokens, (unsigned long long)st->cache_miss_tokens,
              (unsigned long long)st->cache_evicted_blocks, st->kv_blocks_cached,
              (unsigned long long)st->disk_hit_tokens, (unsigned long long)st->disk_reads,
              (unsigned long long)st->disk_writes, (unsigned long long)st->disk_bytes);
    loom_buf_printf(&b,
              "# TYPE loom_sessions gauge\nloom_sessions %d\n"
              "# TYPE loom_session_hits_total counter\nloom_session_hits_total %llu\n"
              "# TYPE loom_session_misses_total counter\nloom_session_misses_total %llu\n"
              "# TYPE loom_session_hit_tokens_total counter\nloom_session_hit_tokens_total %llu\n"
              "# TYPE loom_session_evictions_total counter\nloom_session_evictions_total %llu\n",
              st->sessions, (unsigned long long)st->session_hits,
              (unsigned long long)st->session_misses, (unsigned long long)st->session_hit_tokens,
              (unsigned long long)st->session_evictions);
    loom_buf_printf(&b,
              "# HELP loom_spec_drafted_tokens_total Speculative proposals verified.\n"
              "# TYPE loom_spec_drafted_tokens_total counter\nloom_spec_drafted_tokens_total %llu\n"
              "# HELP loom_spec_accepted_tokens_total Of them, the ones kept.\n"
              "# TYPE loom_spec_accepted_tokens_total counter\nloom_spec_accepted_tokens_total %llu\n",
              (unsigned long long)st->spec_drafted, (unsigned long long)st->spec_accepted);
    /* Where the KV budget is: cached blocks are kept up to the cap by
     * design, so a long-running server's pool fills; these say with what. */
    double bb = (double)st->kv_block_bytes;
    loom_buf_printf(&b,
              "# HELP loom_kv_pool_bytes KV pool size (--kv-memory).\n"
              "# TYPE loom_kv_pool_bytes gauge\nloom_kv_pool_bytes %.0f\n"
              "# HELP loom_kv_bytes KV pool bytes by holder; they sum to loom_kv_pool_bytes.\n"
              "# TYPE loom_kv_bytes gauge\n"
              "loom_kv_bytes{holder=\"requests\"} %.0f\n"
              "loom_kv_bytes{holder=\"prefix_cache\"} %.0f\n"
              "loom_kv_bytes{holder=\"sessions\"} %.0f\n"
              "loom_kv_bytes{holder=\"free\"} %.0f\n"
              "# HELP loom_kv_touched_bytes KV pool bytes ever written (resident; the rest takes no memory yet).\n"
              "# TYPE loom_kv_touched_bytes gauge\nloom_kv_touched_bytes %.0f\n"
              "# HELP loom_kv_reuse_cap_bytes Cap on KV kept for reuse: prefix cache plus sessions (--prefix-cache-bytes).\n"
              "# TYPE loom_kv_reuse_cap_bytes gauge\nloom_kv_reuse_cap_bytes %.0f\n",
              bb * st->kv_blocks_total, bb * st->kv_blocks_running, bb * st->kv_blocks_lru,
              bb * st->kv_blocks_parked, bb * st->kv_blocks_unused, bb * st->kv_blocks_touched,
              bb * st->kv_cache_cap_blocks);
    put_hist(&b, "loom_time_to_first_token_seconds", "Time from request to first token.", &m->ttft);
    put_hist(&b, "loom_inter_token_latency_seconds", "Time between tokens of a request.", &m->itl);
    if (b.oom) {
        loom_buf_free(&b);
        return NULL;
    }
    return b.p;
}
