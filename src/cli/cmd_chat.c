/* loom chat: an interactive terminal chat over the model's chat template.
 * The conversation's KV stays in one context: each turn only prefills what
 * the template added since the previous one. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli/cli.h"
#include "engine/context.h"
#include "sample/sample.h"
#include "stream/textstream.h"
#include "template/chat.h"
#include "tokenize/tokenizer.h"
#include "vision/image.h"
#include "vision/imgproc.h"
#include "vision/imgprompt.h"

static const char usage[] =
    "usage: loom chat --model DIR [options]\n"
    "\n"
    "Chats in the terminal with the model's own chat template, streaming the\n"
    "replies. Commands: /reset (forget the conversation), /image FILE (a PNG or\n"
    "JPEG for the next message, vision-language models), /exit, /help. Ctrl-C\n"
    "stops a reply; Ctrl-C at the prompt twice, or Ctrl-D, quits.\n"
    "\n"
    "  --model DIR        Hugging Face model directory\n"
    "  --system TEXT      system message\n"
    "  --max-tokens N     reply length limit (default 512)\n"
    "  --temperature T    (default 0.7)\n"
    "  --top-p P          (default 0.95)\n"
    "  --top-k K          (default 0 = off)\n"
    "  --min-p P          (default 0 = off)\n"
    "  --repeat-penalty R (default 1.1)\n"
    "                     (the five defaults: the model's generation_config.json\n"
    "                     where it gives them, else the values above)\n"
    "  --seed S           (default 1)\n"
    "  --ctx-size N       context length (default 4096)\n"
    "  --threads N        worker threads (default: all cores)\n";

typedef struct chat_state {
    loom_model *m;
    loom_tok *tok;
    loom_chat_template *tpl;
    loom_context *ctx;
    cJSON *messages;
    const char *system;
    int32_t *held;             /* tokens in the context, in order */
    int n_held;
    int32_t turn_end[16];
    int n_turn_end;
    const loom_sampling *sp;   /* borrowed: the options' sampling */
    int n_turns;
    /* images (vision-language models) */
    const char *dir;           /* the model directory */
    loom_imgproc *proc;        /* owned, or NULL: the model takes no images */
    loom_imgprompt ip;         /* its image markers' expansion, with proc */
    char *images[CLI_MAX_IMAGES]; /* owned paths: the conversation's images, in order */
    int n_tok[CLI_MAX_IMAGES];    /* their placeholder counts */
    int n_images, n_pending;      /* of them, the last n_pending go with the next message */
} chat_state;

static const char commands[] = "/reset, /image FILE, /exit, /quit, /help";

/* Ctrl-C presses since the last line read: the first stops a reply (or
 * warns at the prompt), the second quits. */
static volatile sig_atomic_t interrupts;

static void on_sigint(int sig) {
    (void)sig;
    interrupts++;
}

static void reset(chat_state *c) {
    cJSON_Delete(c->messages);
    c->messages = cJSON_CreateArray();
    if (c->system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", c->system);
        cJSON_AddItemToArray(c->messages, m);
    }
    loom_context_truncate(c->ctx, 0);
    c->n_held = 0;
    for (int k = 0; k < c->n_images; k++) free(c->images[k]);
    c->n_images = c->n_pending = 0;
}

/* The model's image processor and image markers, when it has both. */
static void open_images(chat_state *c) {
    char path[4096], *text = NULL;
    if (loom_path_join(path, sizeof path, c->dir, "config.json") || loom_read_file(path, &text, NULL)) {
        loom_err_clear();
        return;
    }
    cJSON *cfg = cJSON_Parse(text);
    int vision = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(cfg, "vision_config"));
    cJSON_Delete(cfg);
    loom_imgproc *p = vision && loom_imgprompt_parse(text, c->tok, &c->ip) == LOOM_OK ? malloc(sizeof *p) : NULL;
    free(text);
    if (p && loom_imgproc_load(c->dir, p) == LOOM_OK) c->proc = p;
    else free(p);
    loom_err_clear();
}

/* /image FILE: checked (decoded, planned) now, sent with the next message. */
static void add_image(chat_state *c, const char *file) {
    if (!c->proc) {
        fprintf(stderr, "loom: error: %s takes no images (no vision_config or "
                        "preprocessor_config.json)\n", c->dir);
        return;
    }
    if (c->n_images == CLI_MAX_IMAGES) {
        fprintf(stderr, "loom: error: a conversation holds at most %d images\n", CLI_MAX_IMAGES);
        return;
    }
    loom_image img = {0};
    loom_imgproc_plan plan;
    loom_status s = loom_image_load(file, &img);
    if (!s) s = loom_imgproc_plan_image(c->proc, img.w, img.h, &plan);
    loom_image_free(&img);
    char *path = s ? NULL : strdup(file);
    if (s || !path) {
        fprintf(stderr, "loom: error: %s\n", s ? loom_last_error() : "out of memory");
        return;
    }
    c->n_tok[c->n_images] = plan.n_tokens;
    c->images[c->n_images++] = path;
    c->n_pending++;
    fprintf(stderr, "(image %s, %d tokens, goes with the next message)\n", file, plan.n_tokens);
}

/* One turn: render, reuse the common prefix of the context, generate. */
static int turn(chat_state *c, const char *user, int max_tokens, float *logits) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    if (c->n_pending) { /* the images first, then the text, as Qwen-VL's examples */
        cJSON *parts = cJSON_AddArrayToObject(m, "content");
        for (int k = 0; k < c->n_pending; k++) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddStringToObject(p, "type", "image");
            cJSON_AddItemToArray(parts, p);
        }
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type", "text");
        cJSON_AddStringToObject(p, "text", user);
        cJSON_AddItemToArray(parts, p);
        c->n_pending = 0;
    } else {
        cJSON_AddStringToObject(m, "content", user);
    }
    cJSON_AddItemToArray(c->messages, m);
    char *msgs = cJSON_PrintUnformatted(c->messages);
    loom_chat_params cp = loom_chat_default_params();
    cp.messages_json = msgs;
    cp.add_generation_prompt = 1;
    char *text = NULL;
    size_t len = 0;
    loom_status s = loom_chat_apply(c->tpl, &cp, &text, &len);
    free(msgs);
    if (s) return cli_fail("chat template", s);
    if (c->n_images) { /* each image's marker expanded to its tokens, as the server does */
        char *expanded = NULL;
        s = loom_imgprompt_expand(&c->ip, text, len, c->n_tok, c->n_images, &expanded, &len);
        free(text);
        if (s) return cli_fail("chat template", s);
        text = expanded;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    s = loom_tok_encode(c->tok, text, len, LOOM_TOK_NO_SPECIAL, &ids, &n);
    free(text);
    if (s) return cli_fail("tokenizing", s);
    int keep = 0;
    while (keep < c->n_held && keep < (int)n - 1 && c->held[keep] == ids[keep]) keep++;
    /* a prepared prompt (images) is evaluated whole: the context takes
     * its rows from its first token on */
    if (c->n_images) keep = 0;
    loom_context_truncate(c->ctx, keep);
    int cap = (int)n + max_tokens + 1;
    int32_t *held = realloc(c->held, sizeof *held * (size_t)cap);
    if (!held) {
        free(ids);
        return 1;
    }
    c->held = held;
    memcpy(c->held, ids, sizeof *ids * n);
    c->n_held = (int)n;
    if (c->n_images) {
        cli_vision cv;
        s = cli_vision_prompt(c->m, c->dir, ids, (int)n, (const char *const *)c->images, c->n_images, &cv);
        if (!s) {
            s = loom_context_eval_input(c->ctx, ids, (int)n, &cv.p.in, 0, logits);
            cli_vision_free(&cv);
        }
    } else {
        s = loom_context_eval(c->ctx, ids + keep, (int)n - keep, 0, logits);
    }
    free(ids);
    if (s) return cli_fail("prompt", s);
    /* As the server's requests: a sampler per reply whose penalty window
     * holds the whole conversation, then what the reply adds. */
    loom_sampling sp = *c->sp;
    sp.seed += (uint64_t)c->n_turns++;
    loom_sampler sampler = {0}, *smp = &sampler;
    if ((s = loom_sampler_init(smp, &sp, loom_model_vocab_size(c->m)))) return cli_fail("sampling", s);
    for (int i = 0; i < c->n_held; i++) loom_sampler_accept(smp, c->held[i], 0);
    loom_textstream *ts = NULL;
    if ((s = loom_ts_create(c->tok, NULL, 0, 1, &ts))) {
        loom_sampler_free(smp);
        return cli_fail("detokenizer", s);
    }
    int ctx = LOOM_MIN(c->n_held, 4);
    loom_ts_prime(ts, c->held + c->n_held - ctx, (size_t)ctx);

    char *reply = NULL;
    size_t reply_len = 0, reply_cap = 0;
    int V = loom_model_vocab_size(c->m);
    int stopped_by_user = 0;
    for (int i = 0; i < max_tokens; i++) {
        if (interrupts) {
            stopped_by_user = 1;
            break;
        }
        loom_sample_result r;
        loom_sampler_pick(smp, logits, -1, &r);
        loom_sampler_accept(smp, r.id, 1);
        int end = 0;
        for (int k = 0; k < c->n_turn_end; k++) end |= r.id == c->turn_end[k];
        if (end) break;
        const char *piece;
        size_t pl;
        int stopped;
        loom_ts_push(ts, r.id, &piece, &pl, &stopped);
        fwrite(piece, 1, pl, stdout);
        fflush(stdout);
        if (reply_len + pl + 1 > reply_cap) {
            reply_cap = (reply_len + pl + 1) * 2;
            char *nr = realloc(reply, reply_cap);
            if (!nr) break;
            reply = nr;
        }
        memcpy(reply + reply_len, piece, pl);
        reply_len += pl;
        c->held[c->n_held++] = r.id;
        if ((s = loom_context_eval(c->ctx, &r.id, 1, 0, logits))) {
            cli_fail("decode", s);
            break;
        }
    }
    (void)V;
    const char *piece;
    size_t pl;
    int stopped;
    loom_ts_finish(ts, &piece, &pl, &stopped);
    fwrite(piece, 1, pl, stdout);
    printf("\n");
    fflush(stdout);
    if (stopped_by_user) fprintf(stderr, "(reply stopped)\n");
    loom_ts_free(ts);
    loom_sampler_free(smp);
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "role", "assistant");
    char *full = malloc(reply_len + pl + 1);
    if (full) {
        if (reply_len) memcpy(full, reply, reply_len);
        memcpy(full + reply_len, piece, pl);
        full[reply_len + pl] = 0;
        cJSON_AddStringToObject(a, "content", full);
    }
    free(full);
    free(reply);
    cJSON_AddItemToArray(c->messages, a);
    return 0;
}

int cmd_chat(int argc, char **argv) {
    const char *model = NULL;
    int threads = 0, max_tokens = 512, n_ctx = 4096, seed = 1;
    loom_sampling sp = loom_sampling_default();
    sp.temperature = 0.7f;
    sp.top_p = 0.95f;
    sp.repetition_penalty = 1.1f;
    unsigned sp_set = 0;  /* LOOM_SAMPLING_* bits the flags give */
    chat_state c;
    memset(&c, 0, sizeof c);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        static const char *valued[] = {"--model", "--system", "--max-tokens", "--temperature",
                                       "--top-p", "--top-k", "--min-p", "--repeat-penalty",
                                       "--seed", "--ctx-size", "--threads"};
        int known = 0;
        for (size_t k = 0; k < LOOM_ARRAY_LEN(valued); k++) known |= !strcmp(a, valued[k]);
        if (!known) return cli_usage_error("chat", "unknown option \"%s\"", a);
        if (!(v = cli_value("chat", argc, argv, &i))) return 2;
        int bad = cli_sampling_flag("chat", a, v, &sp, &sp_set);
        if (bad >= 0) {
            if (bad) return 2;
            continue;
        }
        bad = 0;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--system")) c.system = v;
        else if (!strcmp(a, "--max-tokens")) bad = cli_int("chat", a, v, 1, 1 << 20, &max_tokens);
        else if (!strcmp(a, "--seed")) bad = cli_int("chat", a, v, 0, 1 << 30, &seed);
        else if (!strcmp(a, "--ctx-size")) bad = cli_int("chat", a, v, 16, 1 << 22, &n_ctx);
        else bad = cli_int("chat", a, v, 0, 4096, &threads);
        if (bad) return 2;
    }
    if (!model) return cli_usage_error("chat", "--model is required");
    sp.seed = (uint64_t)seed;
    int rc = 1;
    float *logits = NULL;
    c.sp = &sp;
    loom_model_params mp = cli_model_params(threads);
    loom_status s = loom_model_load(model, &mp, &c.m);
    if (!s) s = loom_tok_load_dir(model, &c.tok);
    if (!s) s = loom_chat_template_load(model, &c.tpl);
    if (s) { rc = cli_fail("loading", s); goto done; }
    c.dir = model;
    open_images(&c);
    loom_sampling gen;
    loom_sampling_apply(&sp, &gen, loom_model_sampling_defaults(c.m, &gen) & ~sp_set);
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = n_ctx;
    if ((s = loom_context_create(c.m, &cp, &c.ctx))) { rc = cli_fail("context", s); goto done; }
    loom_sampler check = {0};
    s = loom_sampler_init(&check, &sp, loom_model_vocab_size(c.m));
    loom_sampler_free(&check);
    if (s) { rc = cli_fail("sampling", s); goto done; }
    logits = malloc(sizeof(float) * (size_t)loom_model_vocab_size(c.m));
    if (!logits) goto done;
    c.n_turn_end = loom_tok_turn_end_ids(c.tok, c.turn_end, 12);
    int32_t eos[4];
    int ne = LOOM_MIN(loom_model_eos_ids(c.m, eos, 4), 4);
    for (int i = 0; i < ne && c.n_turn_end < 16; i++) c.turn_end[c.n_turn_end++] = eos[i];
    reset(&c);
    fprintf(stderr, "loom chat: %s (%s). /reset clears the conversation, /exit quits.\n", model,
            loom_model_arch(c.m));
    /* no SA_RESTART: Ctrl-C at the prompt ends the read with EINTR */
    struct sigaction sa = {.sa_handler = on_sigint};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    char line[8192];
    for (;;) {
        if (interrupts >= 2) break;
        fprintf(stderr, "> ");
        if (!fgets(line, sizeof line, stdin)) {
            if (ferror(stdin) && errno == EINTR && interrupts < 2) {
                clearerr(stdin);
                fprintf(stderr, "\n(Ctrl-C again or Ctrl-D to quit)\n");
                continue;
            }
            fputc('\n', stderr); /* the shell's prompt starts on a line of its own */
            break;
        }
        interrupts = 0;
        line[strcspn(line, "\n")] = 0;
        if (!line[0]) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            reset(&c);
            fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        if (!strcmp(line, "/image")) {
            fprintf(stderr, "loom: error: /image needs a file: /image FILE\n");
            continue;
        }
        if (!strncmp(line, "/image ", 7)) {
            add_image(&c, line + 7 + strspn(line + 7, " "));
            continue;
        }
        if (!strcmp(line, "/help")) {
            fprintf(stderr, "commands: %s; Ctrl-C stops a reply, Ctrl-D quits\n", commands);
            continue;
        }
        if (line[0] == '/' && line[1] && line[1] != ' ' && line[1] != '/') {
            /* a typo must not reach the model as a message */
            fprintf(stderr, "loom: error: unknown command %.*s; commands: %s (start a message "
                            "with // to send a leading /)\n", (int)strcspn(line, " \t"), line, commands);
            continue;
        }
        const char *msg = line[0] == '/' && line[1] == '/' ? line + 1 : line;
        if (loom_context_length(c.ctx) + 16 > n_ctx) {
            fprintf(stderr, "(context full: conversation cleared)\n");
            reset(&c);
        }
        turn(&c, msg, LOOM_MIN(max_tokens, n_ctx - loom_context_length(c.ctx) - 256 > 0
                                                ? n_ctx - loom_context_length(c.ctx) - 256
                                                : 16),
             logits);
    }
    rc = 0;
done:
    free(logits);
    for (int k = 0; k < c.n_images; k++) free(c.images[k]);
    free(c.proc);
    free(c.held);
    cJSON_Delete(c.messages);
    loom_context_free(c.ctx);
    loom_chat_template_free(c.tpl);
    loom_tok_free(c.tok);
    loom_model_free(c.m);
    return rc;
}
