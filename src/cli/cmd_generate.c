/* loom generate: continue a prompt with the model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "engine/context.h"
#include "grammar/grammar.h"
#include "sample/sample.h"
#include "stream/textstream.h"
#include "template/chat.h"
#include "tokenize/tokenizer.h"

static const char usage[] =
    "usage: loom generate --model DIR (--prompt TEXT | --tokens 1,2,3) [options]\n"
    "\n"
    "Generates a continuation of the prompt. With --prompt the text streams to\n"
    "stdout as it is produced; with --tokens the ids do. With --ids the\n"
    "generated ids are printed as one JSON array on the last line of stdout.\n"
    "Timings go to stderr.\n"
    "\n"
    "  --model DIR        Hugging Face model directory\n"
    "  --prompt TEXT      prompt text (tokenized with the model's tokenizer)\n"
    "  --chat             send --prompt as a user message through the chat template\n"
    "  --tokens LIST      comma-separated prompt token ids\n"
    "  --stop TEXT        stop when TEXT is generated (repeatable)\n"
    "  --max-tokens N     tokens to generate (default 64)\n"
    "  --temperature T    0 = greedy (default 0.8)\n"
    "  --top-k K          keep the K most likely tokens (default 40, 0 = off)\n"
    "  --top-p P          nucleus sampling mass (default 0.95)\n"
    "  --min-p P          drop tokens under P x the top probability (default 0)\n"
    "  --repeat-penalty R penalise tokens of the last 64 (default 1 = off)\n"
    "                     (the five defaults: the model's generation_config.json\n"
    "                     where it gives them, else the values above)\n"
    "  --seed S           random seed (default 1)\n"
    "  --ignore-eos       do not stop at end-of-sequence ids\n"
    "  --ids              print the generated ids as a JSON array\n"
    "  --json-schema FILE the output is JSON valid for the JSON Schema in FILE\n"
    "  --grammar FILE     the output matches the GBNF grammar in FILE (root rule: root)\n"
    "  --regex RE         the output matches the regex RE\n"
    "  --ctx-size N       context length (default: prompt + max tokens)\n"
    "  --kv-type T        KV cache type: f32 (default), f16, bf16, q8, q4\n"
    "  --kv-config FILE   per-layer KV bits (see loom serve --help; default: the\n"
    "                     model directory's kv_config.json, if any)\n"
    "  --image FILE       a PNG or JPEG for a vision-language model, once per image\n"
    "                     in prompt order; the prompt holds each image's placeholders\n"
    "  --threads N        worker threads (default: all cores)\n"
    "  --trace-file FILE  speculative decoding: append the request's timed spans\n"
    "                     (decode.draft, decode.step, ...) to FILE as a JSON line\n"
    CLI_SPEC_USAGE;

/* What the output loop prints each token through. */
typedef struct gen_out {
    loom_textstream *ts;
    int text, json_ids, n_out;
    int32_t *out;
} gen_out;

/* Prints token id (text, or ids); returns whether a stop string ended. */
static int emit(gen_out *g, int32_t id) {
    g->out[g->n_out++] = id;
    int stop = 0;
    if (g->ts) {
        const char *text;
        size_t len;
        loom_ts_push(g->ts, id, &text, &len, &stop);
        if (g->text && !g->json_ids) fwrite(text, 1, len, stdout);
        fflush(stdout);
    } else if (!g->json_ids) {
        printf("%s%d", g->n_out > 1 ? " " : "", id);
        fflush(stdout);
    }
    return stop;
}

/* Speculative decoding goes through the engine (one request), which
 * verifies the proposals; *t1 is when the first token came. */
static loom_status gen_engine(loom_model *m, const loom_engine_params *ep, const loom_request_params *rp,
                              gen_out *g, double *t1) {
    loom_engine *e = NULL;
    loom_request *r = NULL;
    loom_status s = loom_engine_create(m, ep, &e);
    if (!s) s = loom_engine_submit(e, rp, &r);
    for (int stop = 0; !s && !stop;) {
        loom_event ev;
        if ((s = loom_request_next(r, &ev, -1))) break;
        if (ev.finish == LOOM_FINISH_ERROR) s = loom_err(ev.status, "%s", loom_request_error(r));
        if (ev.finish != LOOM_FINISH_NONE) break;
        if (g->n_out == 0) *t1 = loom_now();
        stop = emit(g, ev.token);
    }
    loom_request_free(r);
    if (e) {
        loom_engine_stats st;
        loom_engine_get_stats(e, &st);
        if (st.spec_rounds)
            fprintf(stderr, "speculative: %llu of %llu proposals accepted; %.2f tokens per verifying step; "
                    "%llu steps gated\n", (unsigned long long)st.spec_accepted, (unsigned long long)st.spec_drafted,
                    1.0 + (double)st.spec_accepted / (double)st.spec_rounds, (unsigned long long)st.spec_gated);
    }
    loom_engine_free(e);
    return s;
}

/* The end of the output and the timings (stderr). */
static void report(gen_out *g, const char *prompt_text, int json_ids, int n_prompt, double t0,
                   double t1, double t2) {
    if (g->ts) {
        const char *text;
        size_t len;
        int stopped;
        loom_ts_finish(g->ts, &text, &len, &stopped);
        if (prompt_text && !json_ids) fwrite(text, 1, len, stdout);
    }
    if (prompt_text && !json_ids) {
        printf("\n");
    } else if (json_ids) {
        printf("[");
        for (int k = 0; k < g->n_out; k++) printf("%s%d", k ? ", " : "", g->out[k]);
        printf("]\n");
    } else if (!prompt_text) {
        printf("\n");
    }
    fflush(stdout);
    int n_out = g->n_out;
    fprintf(stderr, "prompt: %d tokens in %.3f s (%.1f tok/s); generated: %d tokens in %.3f s "
            "(%.1f tok/s)\n", n_prompt, t1 - t0, n_prompt / (t1 - t0 + 1e-12), n_out, t2 - t1,
            n_out > 1 ? (n_out - 1) / (t2 - t1 + 1e-12) : 0.0);
}

/* Evaluates tokens and picks the next id; with a grammar (gm) only among
 * the tokens it allows, EOS once the output is whole; *id -1 when nothing
 * is allowed. */
static loom_status next_token(loom_context *c, const int32_t *tokens, int n, loom_sampler *smp, float *logits,
                              loom_gmatcher *gm, uint32_t *bits, const int32_t *eos, int n_eos, int32_t *id) {
    if (!gm) return loom_context_eval_next(c, tokens, n, smp, logits, id);
    loom_status s = loom_context_eval(c, tokens, n, 0, logits);
    if (s) return s;
    float keep[16];
    for (int k = 0; k < n_eos; k++) keep[k] = logits[eos[k]];
    int allowed = loom_gmatcher_mask_logits(gm, bits, logits, smp->vocab);
    if (loom_gmatcher_done(gm))
        for (int k = 0; k < n_eos; k++) logits[eos[k]] = keep[k], allowed++;
    *id = -1;
    if (!allowed) return LOOM_OK;
    loom_sample_result r;
    loom_sampler_pick(smp, logits, -1, &r);
    *id = r.id;
    return LOOM_OK;
}

int cmd_generate(int argc, char **argv) {
    const char *model = NULL, *tokens = NULL, *prompt_text = NULL;
    const char *stops[16];
    int n_stops = 0, n_images = 0;
    const char *images[CLI_MAX_IMAGES];
    int threads = 0, max_tokens = 64, ignore_eos = 0, json_ids = 0, n_ctx = 0, seed = 1, chat = 0;
    loom_kv_type kv_type = LOOM_KV_F32;
    const char *kv_config = NULL;
    char kvc[4096];
    loom_engine_params ep = loom_engine_default_params();
    const char *draft_dir = NULL;
    loom_model *draft = NULL;
    const char *gsrc = NULL; /* --json-schema / --grammar file, or --regex */
    char gkind = 0;          /* 'j', 'g', 'r' */
    loom_sampling sp = loom_sampling_default();
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    unsigned sp_set = 0;  /* LOOM_SAMPLING_* bits the flags give */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--ignore-eos")) { ignore_eos = 1; continue; }
        if (!strcmp(a, "--ids")) { json_ids = 1; continue; }
        if (!strcmp(a, "--chat")) { chat = 1; continue; }
        static const char *valued[] = {"--model", "--tokens", "--max-tokens", "--temperature",
                                       "--top-k", "--top-p", "--min-p", "--seed", "--ctx-size",
                                       "--threads", "--prompt", "--stop", "--repeat-penalty",
                                       "--kv-type", "--kv-config", "--image", "--json-schema", "--grammar",
                                       "--regex", "--trace-file", CLI_SPEC_FLAGS};
        int known = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(valued); k++) known |= !strcmp(a, valued[k]);
        if (!known) return cli_usage_error("generate", "unknown option \"%s\"", a);
        if (!(v = cli_value("generate", argc, argv, &i))) return 2;
        int bad = cli_sampling_flag("generate", a, v, &sp, &sp_set);
        if (bad < 0) bad = cli_spec_flag("generate", a, v, &ep, &draft_dir);
        if (bad >= 0) {
            if (bad) return 2;
            continue;
        }
        bad = 0;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--prompt")) prompt_text = v;
        else if (!strcmp(a, "--trace-file")) ep.trace_file = v;
        else if (!strcmp(a, "--stop")) {
            if (n_stops == 16) return cli_usage_error("generate", "at most 16 --stop strings");
            stops[n_stops++] = v;
        }
        else if (!strcmp(a, "--max-tokens")) bad = cli_int("generate", a, v, 0, 1 << 24, &max_tokens);
        else if (!strcmp(a, "--seed")) bad = cli_int("generate", a, v, 0, 1 << 30, &seed);
        else if (!strcmp(a, "--ctx-size")) bad = cli_int("generate", a, v, 1, 1 << 24, &n_ctx);
        else if (!strcmp(a, "--kv-type")) bad = cli_kv_type("generate", v, &kv_type);
        else if (!strcmp(a, "--kv-config")) kv_config = v;
        else if (!strcmp(a, "--image")) {
            if (n_images == CLI_MAX_IMAGES)
                return cli_usage_error("generate", "at most %d --image", CLI_MAX_IMAGES);
            images[n_images++] = v;
        }
        else if (!strcmp(a, "--json-schema") || !strcmp(a, "--grammar") || !strcmp(a, "--regex")) {
            if (gkind) return cli_usage_error("generate", "give one of --json-schema, --grammar and --regex");
            gkind = a[2], gsrc = v;
        }
        else bad = cli_int("generate", a, v, 0, 4096, &threads);
        if (bad) return 2;
    }
    if (!model || !tokens == !prompt_text)
        return cli_usage_error("generate", "--model and one of --prompt or --tokens are required");
    if (n_images && ep.speculative)
        return cli_usage_error("generate", "--image does not combine with --speculative or "
                               "--draft-model (speculation takes text prompts)");
    sp.seed = (uint64_t)seed;
    int32_t *prompt = NULL;
    int n_prompt = 0;
    if (tokens && cli_ids("generate", "--tokens", tokens, &prompt, &n_prompt)) return 2;

    int rc = 1;
    loom_tok *tok = NULL;
    loom_textstream *ts = NULL;
    loom_model *m = NULL;
    loom_context *c = NULL;
    loom_sampler smp = {0};
    float *logits = NULL;
    cli_vision cv = {0};
    loom_gvocab *gv = NULL;
    loom_grammar *gram = NULL;
    loom_gmatcher gm = {0};
    uint32_t *gbits = NULL;
    char *gtext = NULL;
    int32_t *out = malloc(sizeof *out * (size_t)(max_tokens + 1));
    loom_model_params mp = cli_model_params(threads);
    loom_status s = loom_model_load(model, &mp, &m);
    if (s != LOOM_OK) { rc = cli_fail("loading model", s); goto done; }
    loom_sampling gen;
    loom_sampling_apply(&sp, &gen, loom_model_sampling_defaults(m, &gen) & ~sp_set);
    if (prompt_text || n_stops || gkind) {
        if ((s = loom_tok_load_dir(model, &tok))) { rc = cli_fail("loading tokenizer", s); goto done; }
        if ((s = loom_ts_create(tok, stops, n_stops, 1, &ts))) { rc = cli_fail("stop strings", s); goto done; }
    }
    if (chat && !prompt_text) {
        rc = cli_usage_error("generate", "--chat needs --prompt");
        goto done;
    }
    int32_t turn_end[8];
    int n_turn_end = 0;
    if (prompt_text) {
        size_t n = 0;
        char *rendered = NULL;
        if (chat) {
            if ((s = cli_render_user_turn(model, prompt_text, &rendered))) { rc = cli_fail("chat template", s); goto done; }
            n_turn_end = loom_tok_turn_end_ids(tok, turn_end, 8);
        }
        char *expanded = NULL;
        size_t len = 0;
        if (n_images && (s = cli_vision_expand(model, tok, images, n_images, rendered ? rendered : prompt_text,
                                               &expanded, &len))) {
            free(rendered);
            rc = cli_fail("the prompt's images", s);
            goto done;
        }
        const char *text = expanded ? expanded : rendered ? rendered : prompt_text;
        s = loom_tok_encode(tok, text, strlen(text), rendered ? LOOM_TOK_NO_SPECIAL : LOOM_TOK_ADD_SPECIAL_CONFIG,
                            &prompt, &n);
        free(rendered);
        free(expanded);
        if (s) { rc = cli_fail("tokenizing the prompt", s); goto done; }
        n_prompt = (int)n;
        if (!n_prompt) { fprintf(stderr, "loom: error: the prompt encodes to no tokens\n"); goto done; }
        int ctx = LOOM_MIN(n_prompt, 4);
        loom_ts_prime(ts, prompt + n_prompt - ctx, (size_t)ctx);
    }
    double t_img = loom_now();
    if (n_images && (s = cli_vision_prompt(m, model, prompt, n_prompt, images, n_images, &cv))) {
        rc = cli_fail("preparing the images", s);
        goto done;
    }
    t_img = loom_now() - t_img;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n_ctx ? n_ctx : n_prompt + max_tokens;
    cp.n_batch = cli_vision_n_batch(&cv);
    cp.kv_type = kv_type;
    cp.kv_config = cli_kv_config(kv_config, model, kvc, sizeof kvc);
    if ((s = loom_context_create(m, &cp, &c))) { rc = cli_fail("creating context", s); goto done; }
    int V = loom_model_vocab_size(m);
    int32_t eos[16];
    int n_eos = ignore_eos ? 0 : LOOM_MIN(loom_model_eos_ids(m, eos, 16), 16);
    logits = malloc(sizeof(float) * (size_t)V);
    if (!logits || !out) {
        fprintf(stderr, "loom: error: out of memory\n");
        goto done;
    }
    if (gkind) {
        char err[512];
        size_t glen;
        if (gkind != 'r' && (s = loom_read_file(gsrc, &gtext, &glen))) {
            rc = cli_fail(gsrc, s);
            goto done;
        }
        if ((s = loom_gvocab_from_tok(tok, V, &gv))) { rc = cli_fail("grammar vocabulary", s); goto done; }
        s = gkind == 'j' ? loom_grammar_from_schema(gtext, gv, &gram, err, sizeof err)
          : gkind == 'g' ? loom_grammar_from_gbnf(gtext, gv, &gram, err, sizeof err)
                         : loom_grammar_from_regex(gsrc, gv, &gram, err, sizeof err);
        if (s) {
            fprintf(stderr, "loom: error: %s: %s\n", gkind == 'r' ? "--regex" : gsrc, err);
            rc = 2;
            goto done;
        }
        loom_gmatcher_init(&gm, gram);
        if (!(gbits = malloc(sizeof *gbits * (size_t)((loom_gvocab_size(gv) + 31) / 32)))) {
            fprintf(stderr, "loom: error: out of memory\n");
            goto done;
        }
    }
    gen_out go = {.ts = ts, .text = prompt_text != NULL, .json_ids = json_ids, .out = out};
    if (ep.speculative) {
        if (draft_dir && (s = loom_draft_model_load(draft_dir, ep.draft_exact, &draft))) { rc = cli_fail("loading the draft model", s); goto done; }
        ep.draft_model = draft;
        ep.max_seqs = 1;
        ep.n_ctx = cp.n_ctx;
        ep.kv_type = kv_type;
        ep.kv_config = cp.kv_config;
        ep.prefix_cache = 0;
        ep.max_batch_tokens = LOOM_MAX(512, 1 + (ep.draft_tokens ? ep.draft_tokens : 8));
        loom_request_params rp = loom_request_default_params();
        rp.prompt = prompt;
        rp.n_prompt = n_prompt;
        rp.max_tokens = max_tokens;
        rp.sampling = sp;
        rp.ignore_eos = ignore_eos;
        rp.stop_ids = turn_end;
        rp.n_stop_ids = ignore_eos ? 0 : n_turn_end;
        rp.logprobs = -1;
        rp.grammar = gram; /* the engine masks each pick by it */
        rp.trace = ep.trace_file != NULL;
        double t0 = loom_now(), t1 = t0;
        if ((s = gen_engine(m, &ep, &rp, &go, &t1))) { rc = cli_fail("speculative decoding", s); goto done; }
        report(&go, prompt_text, json_ids, n_prompt, t0, t1, loom_now());
        rc = 0;
        goto done;
    }
    if ((s = loom_sampler_init(&smp, &sp, V))) { rc = cli_fail("sampling", s); goto done; }
    /* the penalty window sees the prompt, then each token, as the server's */
    for (int k = 0; k < n_prompt; k++) loom_sampler_accept(&smp, prompt[k], 0);
    double t0 = loom_now();
    int32_t id = 0;
    if (n_images) loom_context_prepare(c, &cv.p.in);
    /* with no token to make, the prompt still runs (its timing is reported) */
    s = max_tokens > 0 ? next_token(c, prompt, n_prompt, &smp, logits, gram ? &gm : NULL, gbits, eos, n_eos, &id)
                       : loom_context_eval(c, prompt, n_prompt, 0, NULL);
    if (s) { rc = cli_fail("prompt", s); goto done; }
    double t1 = loom_now();
    while (go.n_out < max_tokens && id >= 0) {
        loom_sampler_accept(&smp, id, 1);
        int stop = emit(&go, id);
        for (int k = 0; k < n_eos; k++) stop |= eos[k] == id;
        for (int k = 0; k < n_turn_end && !ignore_eos; k++) stop |= turn_end[k] == id;
        if (stop || go.n_out == max_tokens) break;
        if (gram && id >= 0 && loom_gmatcher_accept_token(&gm, id) == 0 && loom_gmatcher_done(&gm) &&
            !loom_gmatcher_can_continue(&gm))
            break; /* the grammar is whole and nothing can follow */
        if ((s = next_token(c, &id, 1, &smp, logits, gram ? &gm : NULL, gbits, eos, n_eos, &id))) {
            rc = cli_fail("decode", s);
            goto done;
        }
        if (id < 0) break; /* nothing the grammar allows */
    }
    if (n_images) fprintf(stderr, "images: %d decoded, preprocessed and encoded in %.3f s\n", n_images, t_img);
    report(&go, prompt_text, json_ids, n_prompt, t0, t1, loom_now());
    rc = 0;
done:
    cli_vision_free(&cv);
    loom_ts_free(ts);
    loom_grammar_release(gram);
    loom_gvocab_free(gv);
    free(gbits);
    free(gtext);
    loom_tok_free(tok);
    loom_sampler_free(&smp);
    free(logits);
    free(out);
    free(prompt);
    loom_context_free(c);
    loom_model_free(draft);
    loom_model_free(m);
    return rc;
}
