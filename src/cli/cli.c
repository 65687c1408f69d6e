/* cli: option parsing and error reporting shared by the commands. */
#include "cli/cli.h"

#include <cjson/cJSON.h>

#include "template/chat.h"
#include "tokenize/tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int cli_device = -1;
int cli_fast;
int cli_quantize;
int cli_tp;
int cli_tp_list;
int cli_tp_devices[8];

int cli_fail(const char *what, loom_status s) {
    fprintf(stderr, "loom: error: %s: %s (%s)\n", what, loom_last_error(), loom_status_str(s));
    return 1;
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "loom %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see 'loom %s --help')\n", cmd);
    va_end(ap);
    return 2;
}

int cli_int(const char *cmd, const char *opt, const char *text, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        cli_usage_error(cmd, "%s: expected an integer in [%d, %d], found \"%s\"", opt, lo, hi, text);
        return 1;
    }
    *out = (int)v;
    return 0;
}

int cli_float(const char *cmd, const char *opt, const char *text, float *out) {
    char *end;
    errno = 0;
    float v = strtof(text, &end);
    if (errno || end == text || *end || !isfinite(v)) {
        cli_usage_error(cmd, "%s: expected a number, found \"%s\"", opt, text);
        return 1;
    }
    *out = v;
    return 0;
}

int cli_sampling_flag(const char *cmd, const char *opt, const char *text, loom_sampling *sp,
                      unsigned *set) {
    static const struct {
        const char *opt;
        unsigned bit;
        float lo, hi;
        int lo_open;
    } f[] = {
        {"--temperature", LOOM_SAMPLING_TEMPERATURE, 0, 100, 0},
        {"--top-p", LOOM_SAMPLING_TOP_P, 0, 1, 1},
        {"--min-p", LOOM_SAMPLING_MIN_P, 0, 1, 0},
        {"--repeat-penalty", LOOM_SAMPLING_REPETITION_PENALTY, 0, 100, 1},
    };
    if (!strcmp(opt, "--top-k")) {
        *set |= LOOM_SAMPLING_TOP_K;
        return cli_int(cmd, opt, text, 0, 1 << 30, &sp->top_k);
    }
    float *dst[] = {&sp->temperature, &sp->top_p, &sp->min_p, &sp->repetition_penalty};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (strcmp(opt, f[i].opt)) continue;
        float v;
        if (cli_float(cmd, opt, text, &v)) return 1;
        if (!(f[i].lo_open ? v > f[i].lo : v >= f[i].lo) || v > f[i].hi) {
            cli_usage_error(cmd, "%s: expected a number in %c%g, %g], found \"%s\"", opt,
                            f[i].lo_open ? '(' : '[', f[i].lo, f[i].hi, text);
            return 1;
        }
        *dst[i] = v;
        *set |= f[i].bit;
        return 0;
    }
    return -1;
}

int cli_ids(const char *cmd, const char *opt, const char *text, int32_t **out, int *n) {
    *out = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(sizeof *ids * cap);
    if (!ids) return 1;
    const char *p = text;
    int k = 0;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < INT32_MIN || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            cli_usage_error(cmd, "%s: expected comma-separated token ids like 1,2,3, found \"%s\"",
                            opt, text);
            return 1;
        }
        ids[k++] = (int32_t)v;
        if (!*end) break;
        p = end + 1;
    }
    *out = ids;
    *n = k;
    return 0;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        cli_usage_error(cmd, "option %s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_kv_type(const char *cmd, const char *text, loom_kv_type *out) {
    static const char *names[] = {"f32", "f16", "bf16", "q8", "q4"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(text, names[i])) {
            *out = (loom_kv_type)i;
            return 0;
        }
    cli_usage_error(cmd, "--kv-type: expected f32, f16, bf16, q8 or q4, found \"%s\"", text);
    return 1;
}

const char *cli_kv_config(const char *given, const char *model_dir, char *buf, size_t cap) {
    if (given) return given;
    if (!model_dir) return NULL;
    snprintf(buf, cap, "%s/kv_config.json", model_dir);
    return access(buf, F_OK) == 0 ? buf : NULL;
}

loom_status cli_render_user_turn(const char *model_dir, const char *text, char **out) {
    *out = NULL;
    loom_chat_template *t = NULL;
    loom_status s = loom_chat_template_load(model_dir, &t);
    if (s) return s;
    cJSON *msgs = cJSON_CreateArray();
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", text);
    cJSON_AddItemToArray(msgs, m);
    char *json = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    loom_chat_params cp = loom_chat_default_params();
    cp.messages_json = json;
    cp.add_generation_prompt = 1;
    size_t len;
    s = json ? loom_chat_apply(t, &cp, out, &len) : LOOM_ERR_NOMEM;
    free(json);
    loom_chat_template_free(t);
    return s;
}

int cli_spec_flag(const char *cmd, const char *opt, const char *text, loom_engine_params *p,
                  const char **draft_dir) {
    if (!strcmp(opt, "--speculative")) {
        if (strcmp(text, "ngram"))
            return cli_usage_error(cmd, "--speculative: expected ngram (or --draft-model DIR), found \"%s\"", text);
        p->speculative = LOOM_SPEC_NGRAM;
        return 0;
    }
    if (!strcmp(opt, "--draft-model")) {
        *draft_dir = text;
        p->speculative = LOOM_SPEC_DRAFT;
        return 0;
    }
    if (!strcmp(opt, "--draft-tokens")) return cli_int(cmd, opt, text, 1, 64, &p->draft_tokens) ? 2 : 0;
    if (!strcmp(opt, "--draft-exact")) {
        if (strcmp(text, "on") && strcmp(text, "off"))
            return cli_usage_error(cmd, "--draft-exact: expected on or off, found \"%s\"", text);
        p->draft_exact = !strcmp(text, "on");
        return 0;
    }
    if (!strcmp(opt, "--spec-gate")) {
        if (strcmp(text, "on") && strcmp(text, "off"))
            return cli_usage_error(cmd, "--spec-gate: expected on or off, found \"%s\"", text);
        p->spec_always = !strcmp(text, "off");
        return 0;
    }
    return -1;
}

loom_model_params cli_model_params(int threads) {
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = threads;
    mp.device = cli_device;
    mp.fast_matmul = cli_fast;
    mp.quantize_bits = cli_quantize;
    mp.tensor_parallel = cli_tp;
    mp.tp_devices = cli_tp_list ? cli_tp_devices : NULL;
    return mp;
}


