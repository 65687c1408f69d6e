/* request: event channel, trace spans, reference counting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/buf.h"
#include "engine/request.h"
#include "model/forward.h"
#include "vision/vision.h"

void loom_rq_push(loom_request *r, const loom_event *ev) {
    pthread_mutex_lock(&r->mu);
    if (ev->finish != LOOM_FINISH_NONE) {
        r->final = *ev;
        r->finished = 1;
    } else {
        if (r->ev_len == r->ev_cap) {
            int cap = r->ev_cap ? r->ev_cap * 2 : 16;
            loom_event *ne = malloc(sizeof *ne * (size_t)cap);
            if (!ne) {
                /* No memory to queue a token: turn it into a failure rather
                 * than lose it silently. */
                r->final = (loom_event){.finish = LOOM_FINISH_ERROR, .status = LOOM_ERR_NOMEM};
                snprintf(r->error, sizeof r->error, "out of memory queueing a token");
                r->finished = 1;
                atomic_store(&r->abort, 1);
                pthread_cond_broadcast(&r->cv);
                pthread_mutex_unlock(&r->mu);
                return;
            }
            for (int i = 0; i < r->ev_len; i++) ne[i] = r->events[(r->ev_head + i) % r->ev_cap];
            free(r->events);
            r->events = ne;
            r->ev_cap = cap;
            r->ev_head = 0;
        }
        r->events[(r->ev_head + r->ev_len) % r->ev_cap] = *ev;
        r->ev_len++;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

loom_status loom_request_next(loom_request *r, loom_event *ev, int timeout_ms) {
    struct timespec until;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += timeout_ms / 1000;
        until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&r->mu);
    while (r->ev_len == 0 && !r->finished) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&r->cv, &r->mu);
        } else if (pthread_cond_timedwait(&r->cv, &r->mu, &until) != 0 && r->ev_len == 0 &&
                   !r->finished) {
            pthread_mutex_unlock(&r->mu);
            return LOOM_ERR_TIMEOUT;
        }
    }
    if (r->ev_len > 0) {
        *ev = r->events[r->ev_head];
        r->ev_head = (r->ev_head + 1) % r->ev_cap;
        r->ev_len--;
    } else {
        *ev = r->final;
    }
    pthread_mutex_unlock(&r->mu);
    return LOOM_OK;
}

void loom_request_cancel(loom_request *r) {
    if (r) atomic_store(&r->abort, 1);
}

const char *loom_request_error(const loom_request *r) { return r->error; }

int loom_request_embedding(const loom_request *r, float *out, int cap) {
    loom_request *w = (loom_request *)r; /* the channel's lock */
    pthread_mutex_lock(&w->mu);
    int ok = r->dim > 0 && r->finished && r->final.finish == LOOM_FINISH_STOP;
    pthread_mutex_unlock(&w->mu);
    if (!ok) return 0;
    memcpy(out, r->embed, sizeof(float) * (size_t)LOOM_MIN(cap, r->dim));
    return r->dim;
}

void loom_rq_span(loom_request *r, const char *name, const char *mechanism, double t0, double t1,
                  const rq_attr *attrs, int n) {
    if (!r->trace) return;
    if (r->n_spans == r->span_cap) {
        int cap = r->span_cap ? r->span_cap * 2 : 32;
        rq_span *ns = realloc(r->spans, sizeof *ns * (size_t)cap);
        if (!ns) return; /* tracing is best effort */
        r->spans = ns;
        r->span_cap = cap;
    }
    rq_span *s = &r->spans[r->n_spans++];
    *s = (rq_span){.name = name, .mechanism = mechanism, .t0 = t0, .t1 = t1,
                   .n_attrs = LOOM_MIN(n, RQ_MAX_ATTRS)};
    if (s->n_attrs > 0) memcpy(s->attrs, attrs, sizeof *attrs * (size_t)s->n_attrs);
}

/* The spans as a JSON array; times in ms from the request's submit. Names
 * and keys are static identifiers: nothing to escape. */
static void put_spans(const loom_request *r, loom_buf *b) {
    loom_buf_putc(b, '[');
    for (int i = 0; i < r->n_spans; i++) {
        const rq_span *s = &r->spans[i];
        loom_buf_printf(b, "%s{\"name\":\"%s\",\"start_ms\":%.3f,\"dur_ms\":%.3f,\"attrs\":{",
                        i ? "," : "", s->name, (s->t0 - r->t_submit) * 1e3, (s->t1 - s->t0) * 1e3);
        if (s->mechanism) loom_buf_printf(b, "\"mechanism\":\"%s\"", s->mechanism);
        for (int k = 0; k < s->n_attrs; k++)
            loom_buf_printf(b, "%s\"%s\":%lld", k || s->mechanism ? "," : "", s->attrs[k].key,
                            (long long)s->attrs[k].value);
        loom_buf_puts(b, "}}");
    }
    loom_buf_putc(b, ']');
}

char *loom_request_trace_json(const loom_request *r) {
    loom_buf b = {0};
    put_spans(r, &b);
    if (b.oom) {
        loom_buf_free(&b);
        return NULL;
    }
    return b.p;
}

void loom_rq_write_trace(const loom_request *r, FILE *f) {
    loom_buf b = {0};
    loom_buf_printf(&b, "{\"request\":%llu,\"prompt_tokens\":%d,\"generated_tokens\":%d,\"spans\":",
                    (unsigned long long)r->id, r->n_prompt, r->n_generated);
    put_spans(r, &b);
    loom_buf_puts(&b, "}\n");
    /* a line cut short by a failed allocation would not parse: drop it */
    if (!b.oom) fwrite(b.p, 1, b.len, f);
    loom_buf_free(&b);
}

void loom_rq_release(loom_request *r) {
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
    loom_sampler_free(&r->sampler);
    loom_seq_state_free(r->rstate);
    if (r->keys != r->tokens) free(r->keys);
    free(r->tokens);
    for (int k = 0; k < r->n_images; k++) {
        free((void *)r->images[k].pixels);
        if (r->features) free(r->features[k]);
    }
    free(r->images);
    free(r->features);
    if (r->prompt) loom_vision_prompt_free(r->prompt);
    free(r->prompt);
    free(r->stop_ids);
    free(r->pool_sum);
    free(r->embed);
    free(r->gmask);
    loom_grammar_release(r->grammar);
    free(r->spans);
    free(r->events);
    free(r->seq.blocks);
    free(r->draft_seq.blocks);
    free(r->spec_state);
    loom_seq_state_free(r->draft_state);
    free(r->draft_snap);
    free(r->dfl_ctx); /* NULL once the drafter's done hook ran */
    free(r->dfl_raw);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void loom_request_free(loom_request *r) {
    if (!r) return;
    atomic_store(&r->abort, 1);
    loom_rq_release(r);
}
