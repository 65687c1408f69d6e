/* fmt_completions: the answer shapes of /v1/completions, apart from the
 * job so that each endpoint's OpenAI format reads in one place: text,
 * logprobs as parallel arrays (tokens, token_logprobs, top_logprobs,
 * text_offset), echo of the prompt and its token ids. Logprobs entries
 * are kept as small JSON objects and assembled into the arrays at the end. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "serve/job.h"

/* A logprobs entry: token, logprob, text offset, top alternatives. */
static void put_completion_entry(server *s, loom_buf *b, const loom_event *ev, size_t off) {
    loom_buf_printf(b, "{\"t\":%d,\"lp\":%.6g,\"off\":%zu,\"top\":{", ev->token, ev->logprob, off);
    for (int k = 0; k < ev->n_top; k++) {
        if (k) loom_buf_puts(b, ",");
        job_put_token_text(s, b, ev->top_ids[k]);
        loom_buf_printf(b, ":%.6g", ev->top_logprobs[k]);
    }
    loom_buf_puts(b, "}}");
}

/* Completions logprobs object from the entries in c->plp (the prompt's,
 * with echo) and c->lp. */
static void put_completion_logprobs(job *j, choice *c, loom_buf *b) {
    cJSON *arr = NULL;
    loom_buf tmp = {0};
    loom_buf_puts(&tmp, "[");
    if (c->plp.len) loom_buf_put(&tmp, c->plp.p, c->plp.len);
    if (c->plp.len && c->lp.len) loom_buf_puts(&tmp, ",");
    if (c->lp.p) loom_buf_put(&tmp, c->lp.p, c->lp.len);
    loom_buf_puts(&tmp, "]");
    arr = tmp.p ? cJSON_Parse(tmp.p) : NULL;
    loom_buf_free(&tmp);
    loom_buf_puts(b, "{\"tokens\":[");
    int i = 0;
    for (cJSON *e = arr ? arr->child : NULL; e; e = e->next, i++) {
        if (i) loom_buf_puts(b, ",");
        job_put_token_text(j->srv, b, (int32_t)cJSON_GetObjectItem(e, "t")->valueint);
    }
    loom_buf_puts(b, "],\"token_logprobs\":[");
    i = 0;
    for (cJSON *e = arr ? arr->child : NULL; e; e = e->next, i++) {
        const cJSON *lp = cJSON_GetObjectItem(e, "lp"); /* null: the first prompt token */
        if (cJSON_IsNumber(lp)) loom_buf_printf(b, "%s%.6g", i ? "," : "", lp->valuedouble);
        else loom_buf_puts(b, i ? ",null" : "null");
    }
    loom_buf_puts(b, "],\"top_logprobs\":[");
    i = 0;
    for (cJSON *e = arr ? arr->child : NULL; e; e = e->next, i++) {
        char *t = cJSON_PrintUnformatted(cJSON_GetObjectItem(e, "top"));
        loom_buf_printf(b, "%s%s", i ? "," : "", t ? t : "{}");
        free(t);
    }
    loom_buf_puts(b, "],\"text_offset\":[");
    i = 0;
    for (cJSON *e = arr ? arr->child : NULL; e; e = e->next, i++)
        loom_buf_printf(b, "%s%.0f", i ? "," : "", cJSON_GetObjectItem(e, "off")->valuedouble);
    loom_buf_puts(b, "]}");
    cJSON_Delete(arr);
}

static void cmpl_logprob(job *j, choice *c, const loom_event *ev) {
    put_completion_entry(j->srv, &c->lp, ev, c->text_offset);
}

/* echo: the prompt opens the choice's text, as in a blocking answer, with
 * the prompt's logprobs when asked for (then sent once they are all in). */
static void cmpl_sse_echo(job *j, int index) {
    choice *c = &j->ch[index];
    job_sse_chunk_begin(j, index);
    loom_buf_puts(&j->out, "\"text\":");
    api_put_json_str(&j->out, j->prompt_text ? j->prompt_text : "",
                     j->prompt_text ? strlen(j->prompt_text) : 0);
    loom_buf_puts(&j->out, ",\"logprobs\":");
    if (c->plp.len) {
        choice tmp = *c;
        tmp.lp = (loom_buf){0};
        put_completion_logprobs(j, &tmp, &j->out);
    } else {
        loom_buf_puts(&j->out, "null");
    }
    loom_buf_puts(&j->out, ",\"finish_reason\":null}]}\n\n");
    loom_buf_free(&c->plp); /* later chunks carry only their own tokens */
}

/* A prompt token's logprobs, with echo: the stream sends the echo once
 * they are all in. */
static void cmpl_prompt_logprob(job *j, choice *c, const loom_event *ev) {
    if (!ev) {
        loom_buf_printf(&c->plp, "{\"t\":%d,\"lp\":null,\"off\":0,\"top\":null}", j->prompt[0]);
        c->n_plp = 1;
        return;
    }
    if (c->n_plp == 0 || c->n_plp >= j->n_prompt) return; /* not asked for */
    loom_buf_puts(&c->plp, ",");
    put_completion_entry(j->srv, &c->plp, ev, j->prompt_off[c->n_plp]);
    if (++c->n_plp == j->n_prompt && j->req.stream) cmpl_sse_echo(j, (int)(c - j->ch));
}

static void cmpl_choice(job *j, choice *c, loom_buf *b) {
    loom_buf_puts(b, "\"text\":");
    size_t tl;
    const char *t = loom_ts_text(c->ts, &tl);
    if (j->req.echo) {
        loom_buf e = {0};
        loom_buf_puts(&e, j->prompt_text ? j->prompt_text : "");
        loom_buf_put(&e, t, tl);
        api_put_json_str(b, e.p ? e.p : "", e.len);
        loom_buf_free(&e);
    } else {
        api_put_json_str(b, t, tl);
    }
    loom_buf_puts(b, ",\"logprobs\":");
    if (j->req.logprobs >= 0) put_completion_logprobs(j, c, b);
    else loom_buf_puts(b, "null");
    if (j->req.return_token_ids) {
        loom_buf_puts(b, ",\"prompt_token_ids\":[");
        for (int k = 0; k < j->n_prompt; k++) loom_buf_printf(b, "%s%d", k ? "," : "", j->prompt[k]);
        loom_buf_puts(b, "],\"token_ids\":[");
        for (int k = 0; k < c->n_ids; k++) loom_buf_printf(b, "%s%d", k ? "," : "", c->ids[k]);
        loom_buf_puts(b, "]");
    }
}

/* echo: at once, or once the prompt's logprobs are all in */
static void cmpl_sse_open(job *j) {
    if (!j->req.echo) return;
    for (int i = 0; i < j->n; i++)
        if (j->ch[i].n_plp == (j->req.logprobs >= 0 ? j->n_prompt : 0)) cmpl_sse_echo(j, i);
}

static void cmpl_sse_delta(job *j, int index, const emitted *em, const loom_buf *lp_new) {
    choice *c = &j->ch[index];
    if (!em->content.len && !lp_new) return;
    job_sse_chunk_begin(j, index);
    loom_buf_puts(&j->out, "\"text\":");
    api_put_json_str(&j->out, em->content.p ? em->content.p : "", em->content.len);
    loom_buf_puts(&j->out, ",\"logprobs\":");
    if (lp_new && lp_new->len) {
        choice tmp = *c;
        tmp.lp = *lp_new;
        put_completion_logprobs(j, &tmp, &j->out);
    } else {
        loom_buf_puts(&j->out, "null");
    }
    loom_buf_puts(&j->out, ",\"finish_reason\":null}]}\n\n");
}

const api_endpoint fmt_completions = {
    .kind = API_COMPLETION,
    .id_prefix = "cmpl",
    .object = "text_completion",
    .chunk_object = "text_completion",
    .logprob = cmpl_logprob,
    .prompt_logprob = cmpl_prompt_logprob,
    .put_choice = cmpl_choice,
    .sse_open = cmpl_sse_open,
    .sse_delta = cmpl_sse_delta,
    .final_delta = "\"text\":\"\",",
};
