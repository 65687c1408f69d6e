/* loom batch: offline requests in the OpenAI Batch API line format, all
 * submitted at once and run through the engine's scheduler. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cli/cli.h"
#include "serve/server.h"

static const char usage[] =
    "usage: loom batch --model DIR --input requests.jsonl --output results.jsonl [options]\n"
    "\n"
    "Runs every line of the input (OpenAI Batch API format: custom_id, method,\n"
    "url = /v1/chat/completions, /v1/completions or /v1/embeddings, body) through the engine\n"
    "at once, and writes one result line per request, in input order:\n"
    "{\"id\", \"custom_id\", \"response\": {\"status_code\", \"request_id\", \"body\"}, \"error\"}.\n"
    "A bad line becomes an error line; the other requests go on.\n"
    "A model directory without tokenizer.json runs completions whose prompt is\n"
    "token ids: their results have text \"\" and the ids (prompt_token_ids,\n"
    "token_ids), and embeddings of token ids; text prompts, chat and stop\n"
    "strings get an error line.\n"
    "\n"
    "  --model DIR            Hugging Face model directory\n"
    "  --input FILE           requests, one JSON object per line\n"
    "  --output FILE          results\n"
    "  --errors FILE          write failed requests here instead of --output\n"
    "  --max-seqs N           sequences decoding at once (default 64)\n"
    "  --max-batch-tokens N   token budget of one engine step (default 2048)\n"
    "  --prefill-chunk N      planned prefill chunk (default policy: 2048)\n"
    "  --max-tokens N         default max tokens of a request (default 512)\n"
    "  --ctx-size N           max tokens per sequence\n"
    "  --kv-type T            f32 (default), f16, bf16, q8, q4\n"
    "  --kv-config FILE       per-layer KV bits (see loom serve --help; default: the\n"
    "                         model directory's kv_config.json, if any)\n"
    "  --threads N            model threads (default: all cores)\n";

typedef struct batch {
    loom_service *svc;
    char **lines;          /* owned input lines */
    char **results;        /* owned result lines */
    int *failed;           /* the result is an error */
    int n;
    atomic_int next, done;
} batch;

static char *error_line(int index, const char *custom_id, const char *code, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    char id[48];
    snprintf(id, sizeof id, "batch_req_%d", index);
    cJSON_AddStringToObject(o, "id", id);
    if (custom_id) cJSON_AddStringToObject(o, "custom_id", custom_id);
    else cJSON_AddNullToObject(o, "custom_id");
    cJSON_AddNullToObject(o, "response");
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", msg);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* One input line -> one result line. */
static char *run_line(batch *b, int index, int *failed) {
    *failed = 1;
    cJSON *in = cJSON_Parse(b->lines[index]);
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        return error_line(index, NULL, "invalid_json", "the line is not a JSON object");
    }
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(in, "custom_id");
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(in, "url");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(in, "method");
    const cJSON *body = cJSON_GetObjectItemCaseSensitive(in, "body");
    const char *custom_id = cJSON_IsString(cid) ? cid->valuestring : NULL;
    char *out = NULL;
    int routed = cJSON_IsString(url) && loom_service_has_route(url->valuestring);
    if (!custom_id) {
        out = error_line(index, NULL, "missing_custom_id", "'custom_id' must be a string");
    } else if (method && (!cJSON_IsString(method) || strcmp(method->valuestring, "POST"))) {
        out = error_line(index, custom_id, "invalid_method", "'method' must be POST");
    } else if (!routed) {
        char paths[256], msg[300];
        loom_service_paths(paths, sizeof paths);
        snprintf(msg, sizeof msg, "'url' must be %s", paths);
        out = error_line(index, custom_id, "invalid_url", msg);
    } else if (!cJSON_IsObject(body)) {
        out = error_line(index, custom_id, "invalid_body", "'body' must be an object");
    } else {
        char *text = cJSON_PrintUnformatted(body);
        int status = 0;
        char *resp = text ? loom_service_request(b->svc, url->valuestring, text, strlen(text), &status) : NULL;
        free(text);
        cJSON *rb = resp ? cJSON_Parse(resp) : NULL;
        free(resp);
        if (!rb) {
            out = error_line(index, custom_id, "internal_error", "no response");
        } else {
            cJSON *o = cJSON_CreateObject();
            char id[48];
            snprintf(id, sizeof id, "batch_req_%d", index);
            cJSON_AddStringToObject(o, "id", id);
            cJSON_AddStringToObject(o, "custom_id", custom_id);
            cJSON *r = cJSON_AddObjectToObject(o, "response");
            cJSON_AddNumberToObject(r, "status_code", status);
            cJSON_AddStringToObject(r, "request_id", id);
            cJSON_AddItemToObject(r, "body", rb);
            cJSON_AddNullToObject(o, "error");
            out = cJSON_PrintUnformatted(o);
            cJSON_Delete(o);
            *failed = status != 200;
        }
    }
    cJSON_Delete(in);
    return out;
}

static void *worker(void *arg) {
    batch *b = arg;
    for (;;) {
        int i = atomic_fetch_add(&b->next, 1);
        if (i >= b->n) break;
        b->results[i] = run_line(b, i, &b->failed[i]);
        atomic_fetch_add(&b->done, 1);
    }
    return NULL;
}

static void progress(const batch *b, int final) {
    int done = atomic_load(&b->done), w = 30, fill = b->n ? done * w / b->n : w;
    fprintf(stderr, "\r[%.*s%*s] %d/%d", fill, "==============================", w - fill, "", done, b->n);
    if (final) fputc('\n', stderr);
}

/* Splits text into non-empty lines (in place). */
static int split_lines(char *text, char ***out) {
    int cap = 64, n = 0;
    char **lines = malloc(sizeof *lines * (size_t)cap);
    for (char *p = text; lines && *p;) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        char *q = p;
        while (*q == ' ' || *q == '\t' || *q == '\r') q++;
        if (*q) {
            if (n == cap) {
                char **nl = realloc(lines, sizeof *lines * (size_t)(cap *= 2));
                if (!nl) break;
                lines = nl;
            }
            lines[n++] = p;
        }
        if (!e) break;
        p = e + 1;
    }
    *out = lines;
    return n;
}

int cmd_batch(int argc, char **argv) {
    loom_serve_params p = loom_serve_default_params();
    p.device = cli_device;
    p.fast_matmul = cli_fast;
    p.quantize_bits = cli_quantize;
    p.tensor_parallel = cli_tp;
    p.tp_devices = cli_tp_list ? cli_tp_devices : NULL;
    p.tokenizer_optional = 1; /* token-id requests need none */
    const char *input = NULL, *output = NULL, *errors = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        static const char *valued[] = {"--model", "--input", "--output", "--errors", "--max-seqs",
                                       "--max-batch-tokens", "--max-tokens", "--ctx-size",
                                       "--kv-type", "--threads", "--kv-config", "--prefill-chunk"};
        int known = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(valued); k++) known |= !strcmp(a, valued[k]);
        if (!known) return cli_usage_error("batch", "unknown option \"%s\"", a);
        if (!(v = cli_value("batch", argc, argv, &i))) return 2;
        int bad = 0;
        if (!strcmp(a, "--model")) p.model_dir = v;
        else if (!strcmp(a, "--input")) input = v;
        else if (!strcmp(a, "--output")) output = v;
        else if (!strcmp(a, "--errors")) errors = v;
        else if (!strcmp(a, "--max-seqs")) bad = cli_int("batch", a, v, 1, 4096, &p.engine.max_seqs);
        else if (!strcmp(a, "--max-batch-tokens")) bad = cli_int("batch", a, v, 1, 1 << 20, &p.engine.max_batch_tokens);
        else if (!strcmp(a, "--prefill-chunk")) bad = cli_int("batch", a, v, 1, 1 << 20, &p.engine.prefill_chunk);
        else if (!strcmp(a, "--max-tokens")) bad = cli_int("batch", a, v, 1, 1 << 22, &p.default_max_tokens);
        else if (!strcmp(a, "--ctx-size")) bad = cli_int("batch", a, v, 2, 1 << 22, &p.engine.n_ctx);
        else if (!strcmp(a, "--kv-type")) bad = cli_kv_type("batch", v, &p.engine.kv_type);
        else if (!strcmp(a, "--kv-config")) p.engine.kv_config = v;
        else bad = cli_int("batch", a, v, 0, 4096, &p.n_threads);
        if (bad) return 2;
    }
    if (!p.model_dir || !input || !output)
        return cli_usage_error("batch", "--model, --input and --output are required");
    char kvc[4096];
    p.engine.kv_config = cli_kv_config(p.engine.kv_config, p.model_dir, kvc, sizeof kvc);
    char *text = NULL;
    loom_status st = loom_read_file(input, &text, NULL);
    if (st) return cli_fail("reading the input", st);
    batch b;
    memset(&b, 0, sizeof b);
    b.n = split_lines(text, &b.lines);
    b.results = calloc((size_t)b.n + 1, sizeof *b.results);
    b.failed = calloc((size_t)b.n + 1, sizeof *b.failed);
    int rc = 1;
    FILE *out = NULL, *err = NULL;
    if (!b.lines || !b.results || !b.failed) goto done;
    out = fopen(output, "w");
    err = errors ? fopen(errors, "w") : NULL;
    if (!out || (errors && !err)) {
        fprintf(stderr, "loom: error: cannot write %s\n", !out ? output : errors);
        goto done;
    }
    if ((st = loom_service_open(&p, &b.svc))) {
        rc = cli_fail("loading", st);
        goto done;
    }
    /* Enough threads that every request is in the engine at once. */
    int n_workers = LOOM_MIN(b.n, 512);
    pthread_t *th = calloc((size_t)n_workers + 1, sizeof *th);
    int started = 0;
    for (int i = 0; th && i < n_workers; i++)
        if (pthread_create(&th[i], NULL, worker, &b) == 0) started++;
    if (!started) worker(&b);
    int tty = isatty(2);
    while (tty && atomic_load(&b.done) < b.n) {
        progress(&b, 0);
        usleep(200000);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    free(th);
    if (tty) progress(&b, 1);
    int n_failed = 0;
    for (int i = 0; i < b.n; i++) {
        FILE *f = b.failed[i] && err ? err : out;
        fprintf(f, "%s\n", b.results[i] ? b.results[i] : "{\"error\":{\"code\":\"internal_error\"}}");
        n_failed += b.failed[i];
    }
    fprintf(stderr, "loom batch: %d requests, %d failed\n", b.n, n_failed);
    rc = 0;
done:
    if (out && fclose(out) != 0) rc = 1;
    if (err && fclose(err) != 0) rc = 1;
    loom_service_close(b.svc);
    for (int i = 0; b.results && i < b.n; i++) free(b.results[i]);
    free(b.results);
    free(b.failed);
    free(b.lines);
    free(text);
    return rc;
}
