/* metrics: server counters and latency histograms, rendered in the
 * Prometheus text format. Updated from any connection thread (atomics). */
#ifndef LOOM_METRICS_H
#define LOOM_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "loom.h"

#define METRICS_BUCKETS 14
#define METRICS_ENDPOINTS 16 /* labels at most, the last "other" */

typedef struct metrics_hist {
    atomic_ullong count[METRICS_BUCKETS + 1]; /* last: +Inf */
    atomic_ullong sum_us;
} metrics_hist;

typedef struct loom_metrics {
    _Atomic(const char *) endpoint[METRICS_ENDPOINTS - 1]; /* borrowed labels, in the order
                                                              first seen; NULL: free */
    atomic_ullong requests[METRICS_ENDPOINTS][9]; /* endpoint x status class */
    atomic_ullong prompt_tokens, generated_tokens, disconnects;
    metrics_hist ttft, itl;
} loom_metrics;

void metrics_init(loom_metrics *m);
void metrics_free(loom_metrics *m);
/* endpoint: a label that outlives m (the server's route labels), listed in
 * the order first added or counted; past METRICS_ENDPOINTS - 1 of them, or
 * "other", counts as "other". metrics_add_endpoint lists one before any
 * request, so that it shows with a count of 0. */
void metrics_add_endpoint(loom_metrics *m, const char *endpoint);
void metrics_count_request(loom_metrics *m, const char *endpoint, int status);
void metrics_count_disconnect(loom_metrics *m);
void metrics_add_tokens(loom_metrics *m, uint64_t prompt, uint64_t generated);
void metrics_observe_ttft(loom_metrics *m, double seconds);
void metrics_observe_itl(loom_metrics *m, double seconds);
/* Heap string in the Prometheus text format. */
char *metrics_render(loom_metrics *m, const loom_engine_stats *st, int inflight);

#endif
