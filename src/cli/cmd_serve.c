/* loom serve: the OpenAI-compatible HTTP server. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "serve/server.h"

static const char usage[] =
    "usage: loom serve --model DIR [options]\n"
    "\n"
    "Serves the model over an OpenAI-compatible HTTP API: /v1/chat/completions,\n"
    "/v1/completions, /v1/models, /health, /metrics. Stops on SIGINT/SIGTERM\n"
    "after in-flight requests finish (or the grace period ends).\n"
    "\n"
    "  --model DIR             Hugging Face model directory\n"
    "  --host ADDR             IPv4 address to bind (default 127.0.0.1)\n"
    "  --port N                port (default 8080; 0 picks a free one)\n"
    "  --api-key KEY           require 'Authorization: Bearer KEY' on every route but\n"
    "                          /health (the /v1 ones, their unprefixed aliases, /metrics)\n"
    "  --cors                  send permissive CORS headers\n"
    "  --served-model-name NAME[,NAME...]  names a request's \"model\" may give (others\n"
    "                          get 404 model_not_found); the first is the id reported\n"
    "                          to clients (default: dir name; --model-name is the same)\n"
    "  --max-batch-tokens N    token budget of one engine step (default 2048)\n"
    "  --max-seqs N            sequences decoding at once (default 64)\n"
    "  --max-queue N           waiting requests before 429 (default 256)\n"
    "  --ctx-size N            max tokens per sequence (default: model limit, <= 32768)\n"
    "  --kv-memory SIZE        KV pool size, e.g. 2G or 512M (default: what --max-seqs\n"
    "                          full contexts need, at most RAM/4); see the start-up line\n"
    "  --block-size N          tokens per KV block (default 16)\n"
    "  --kv-type T             KV type: f32 (exact, default), f16, bf16, q8 or q4\n"
    "  --kv-bits 8|4           the same as --kv-type q8 / q4\n"
    "  --kv-config FILE        per-layer KV bits, JSON [{\"layer_idx\": i, \"bits\": 4|8|16|32,\n"
    "                          \"group_size\": 32|64|128}, ...]; other layers use --kv-type\n"
    "                          (default: the model directory's kv_config.json, if any)\n"
    "  --prefill-chunk N       planned prefill chunk (default policy: 2048)\n"
    "  --max-tokens N          default max tokens of a request (default 512)\n"
    "  --temperature T         request defaults, each where the request gives none:\n"
    "  --top-p P               these flags, else the model's generation_config.json,\n"
    "  --top-k K               else temperature 1, top-p 1, top-k 0 (off), min-p 0,\n"
    "  --min-p P               repeat-penalty 1 (off)\n"
    "  --repeat-penalty R\n"
    "  --speculative ngram     speculative decoding by prompt lookup (proposals copied\n"
    "                          from what followed the last 3, 2 or 1 tokens earlier on)\n"
    "  --draft-model DIR       speculative decoding with a draft model (same tokenizer)\n"
    "  --draft-tokens K        proposals a sequence verifies per step at most (default\n"
    "                          8, a block drafter's block); output as plain decoding's (drafters on the CPU)\n"
    "  --draft-exact on|off    off (default): the drafter multiplies over 8-bit copies\n"
    "                          with the integer kernels where the CPU has them; on: exact f32\n"
    "  --spec-gate on|off      on (default): steps at a batch size where speculating\n"
    "                          measured slower than plain decoding carry no proposals\n"
    "  --max-body SIZE         largest request body (default 8M)\n"
    "  --timeout S             idle connection timeout in seconds (default 60)\n"
    "  --header-timeout S      a request's line and headers must arrive within S seconds\n"
    "                          of the connection (or of its request line on a kept-alive\n"
    "                          one), however the client trickles them (default 10)\n"
    "  --body-timeout S        its body must arrive within S seconds of the headers\n"
    "                          (default 60); late clients are disconnected\n"
    "  --max-connections N     open connections at once, one thread each; more are\n"
    "                          refused (default 512)\n"
    "  --max-connections-per-ip N  of them from one client address (default 64;\n"
    "                          0 = no limit)\n"
    "  --grace S               shutdown grace period in seconds (default 10)\n"
    "  --no-prefix-cache       do not reuse KV across requests\n"
    "  --prefix-cache-bytes SIZE  cap on KV kept only for reuse (default: the pool)\n"
    "  --prefix-cache-dir DIR  spill cached KV blocks to DIR; reused after restarts\n"
    "  --prefix-cache-disk-bytes SIZE  cap of the disk tier (default: unlimited)\n"
    "  --prefix-cache-zstd N   compress the disk tier's block files at zstd level N\n"
    "                          (1..19; default 0 = off)\n"
    "  --trace-file FILE       append every request's timed spans as JSON lines\n"
    "  --port-file FILE        write the bound port to FILE when ready\n"
    "  --allowed-media-dir DIR image_url parts may name file:// images under DIR\n"
    "                          (default: none; data: URLs always work, http(s) never)\n"
    "  --threads N             model threads (default: all cores)\n";

/* "2G", "512M", "64K" or plain bytes. */
static int parse_size(const char *opt, const char *v, size_t *out) {
    char *end;
    double x = strtod(v, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1024, end++;
    else if (*end == 'm' || *end == 'M') mul = 1024.0 * 1024, end++;
    else if (*end == 'g' || *end == 'G') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (end == v || *end || !(x > 0)) {
        cli_usage_error("serve", "%s: expected a size like 2G, 512M or 1048576, found \"%s\"", opt, v);
        return 1;
    }
    *out = (size_t)(x * mul);
    return 0;
}

/* "a,b,c": up to 16 names, none empty, each under 256 bytes. */
static int check_names(const char *opt, const char *v) {
    int n = 0;
    for (const char *t = v;; t++) {
        const char *e = strchr(t, ',');
        size_t len = e ? (size_t)(e - t) : strlen(t);
        if (len == 0 || len > 255 || ++n > 16)
            return cli_usage_error("serve", "%s: expected up to 16 comma-separated names of 1 to 255 "
                                   "bytes, found \"%s\"", opt, v);
        if (!e) return 0;
        t = e;
    }
}

int cmd_serve(int argc, char **argv) {
    loom_serve_params p = loom_serve_default_params();
    p.device = cli_device;
    p.fast_matmul = cli_fast;
    p.quantize_bits = cli_quantize;
    p.tensor_parallel = cli_tp;
    p.tp_devices = cli_tp_list ? cli_tp_devices : NULL;
    p.engine.max_queue = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--cors")) { p.cors = 1; continue; }
        if (!strcmp(a, "--no-prefix-cache")) { p.engine.prefix_cache = 0; continue; }
        static const char *valued[] = {"--model", "--host", "--port", "--api-key", "--model-name",
                                       "--served-model-name", "--header-timeout",
                                       "--body-timeout", "--max-connections",
                                       "--max-connections-per-ip",
                                       "--max-batch-tokens", "--max-seqs", "--max-queue",
                                       "--ctx-size", "--kv-memory", "--block-size",
                                       "--prefill-chunk", "--max-tokens", "--max-body", "--timeout",
                                       "--grace", "--trace-file", "--port-file", "--threads",
                                       "--allowed-media-dir",
                                       "--prefix-cache-bytes", "--prefix-cache-dir",
                                       "--prefix-cache-disk-bytes", "--kv-type", "--kv-bits",
                                       "--kv-config", "--prefix-cache-zstd", "--temperature",
                                       "--top-p", "--top-k", "--min-p", "--repeat-penalty",
                                       CLI_SPEC_FLAGS};
        int known = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(valued); k++) known |= !strcmp(a, valued[k]);
        if (!known) return cli_usage_error("serve", "unknown option \"%s\"", a);
        if (!(v = cli_value("serve", argc, argv, &i))) return 2;
        int bad = cli_sampling_flag("serve", a, v, &p.sampling, &p.sampling_set);
        if (bad >= 0) {
            if (bad) return 2;
            continue;
        }
        if ((bad = cli_spec_flag("serve", a, v, &p.engine, &p.draft_model_dir)) >= 0) {
            if (bad) return 2;
            continue;
        }
        bad = 0;
        if (!strcmp(a, "--model")) p.model_dir = v;
        else if (!strcmp(a, "--host")) p.host = v;
        else if (!strcmp(a, "--port")) bad = cli_int("serve", a, v, 0, 65535, &p.port);
        else if (!strcmp(a, "--api-key")) p.api_key = v;
        else if (!strcmp(a, "--model-name") || !strcmp(a, "--served-model-name")) {
            bad = check_names(a, v);
            p.model_name = v;
        }
        else if (!strcmp(a, "--header-timeout")) bad = cli_int("serve", a, v, 1, 86400, &p.header_timeout_s);
        else if (!strcmp(a, "--body-timeout")) bad = cli_int("serve", a, v, 1, 86400, &p.body_timeout_s);
        else if (!strcmp(a, "--max-connections")) bad = cli_int("serve", a, v, 1, 65536, &p.max_connections);
        else if (!strcmp(a, "--max-connections-per-ip")) bad = cli_int("serve", a, v, 0, 65536, &p.max_connections_per_ip);
        else if (!strcmp(a, "--max-batch-tokens")) bad = cli_int("serve", a, v, 1, 1 << 20, &p.engine.max_batch_tokens);
        else if (!strcmp(a, "--max-seqs")) bad = cli_int("serve", a, v, 1, 4096, &p.engine.max_seqs);
        else if (!strcmp(a, "--max-queue")) bad = cli_int("serve", a, v, 0, 1 << 20, &p.engine.max_queue);
        else if (!strcmp(a, "--ctx-size")) bad = cli_int("serve", a, v, 2, 1 << 22, &p.engine.n_ctx);
        else if (!strcmp(a, "--kv-memory")) bad = parse_size(a, v, &p.engine.kv_memory);
        else if (!strcmp(a, "--block-size")) bad = cli_int("serve", a, v, 1, 4096, &p.engine.block_size);
        else if (!strcmp(a, "--prefill-chunk")) bad = cli_int("serve", a, v, 1, 1 << 20, &p.engine.prefill_chunk);
        else if (!strcmp(a, "--max-tokens")) bad = cli_int("serve", a, v, 1, 1 << 22, &p.default_max_tokens);
        else if (!strcmp(a, "--max-body")) bad = parse_size(a, v, &p.max_body);
        else if (!strcmp(a, "--timeout")) bad = cli_int("serve", a, v, 1, 86400, &p.timeout_s);
        else if (!strcmp(a, "--grace")) bad = cli_int("serve", a, v, 0, 86400, &p.grace_s);
        else if (!strcmp(a, "--trace-file")) p.engine.trace_file = v;
        else if (!strcmp(a, "--port-file")) p.port_file = v;
        else if (!strcmp(a, "--allowed-media-dir")) p.allowed_media_dir = v;
        else if (!strcmp(a, "--kv-type")) bad = cli_kv_type("serve", v, &p.engine.kv_type);
        else if (!strcmp(a, "--kv-config")) p.engine.kv_config = v;
        else if (!strcmp(a, "--kv-bits")) {
            if (!strcmp(v, "8")) p.engine.kv_type = LOOM_KV_Q8;
            else if (!strcmp(v, "4")) p.engine.kv_type = LOOM_KV_Q4;
            else return cli_usage_error("serve", "--kv-bits: expected 8 or 4, found \"%s\"", v);
        }
        else if (!strcmp(a, "--prefix-cache-bytes")) bad = parse_size(a, v, &p.engine.prefix_cache_bytes);
        else if (!strcmp(a, "--prefix-cache-dir")) p.engine.prefix_cache_dir = v;
        else if (!strcmp(a, "--prefix-cache-zstd")) bad = cli_int("serve", a, v, 0, 19, &p.engine.prefix_cache_disk_zstd);
        else if (!strcmp(a, "--prefix-cache-disk-bytes")) bad = parse_size(a, v, &p.engine.prefix_cache_disk_bytes);
        else bad = cli_int("serve", a, v, 0, 4096, &p.n_threads);
        if (bad) return 2;
    }
    if (!p.model_dir) return cli_usage_error("serve", "--model is required");
    char kvc[4096];
    p.engine.kv_config = cli_kv_config(p.engine.kv_config, p.model_dir, kvc, sizeof kvc);
    return loom_serve_run(&p);
}
