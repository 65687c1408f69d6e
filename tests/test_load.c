/* Loader robustness: corrupt, truncated and inconsistent files give clear
 * errors (status + message naming what was expected and found), never a
 * crash; config.json spellings; writer round trip. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "load/config.h"
#include "load/safetensors.h"
#include "test.h"

static char tmpdir[] = "/tmp/loom-test-load-XXXXXX";

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
}

/* A safetensors file with the given JSON header and data bytes. */
static void write_st(const char *path, const char *header, size_t data_len) {
    size_t hl = strlen(header);
    unsigned char *buf = calloc(1, 8 + hl + data_len);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (unsigned char)(i * 7 + 1);
    write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

static void expect_st_error(const char *header, size_t data_len, loom_status want,
                            const char *needle) {
    char path[256];
    snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);
    write_st(path, header, data_len);
    loom_safetensors *st = (loom_safetensors *)1;
    loom_status s = loom_st_open(path, &st);
    CHECKF(s == want, "header %s: got %s (%s)", header, loom_status_str(s), loom_last_error());
    CHECK(st == NULL);
    CHECKF(strstr(loom_last_error(), needle) != NULL, "message \"%s\" lacks \"%s\"",
           loom_last_error(), needle);
}

static void test_safetensors_errors(void) {
    char path[256];
    loom_safetensors *st = NULL;
    /* missing file */
    snprintf(path, sizeof path, "%s/none.safetensors", tmpdir);
    CHECK(loom_st_open(path, &st) == LOOM_ERR_IO);
    CHECK(strstr(loom_last_error(), "No such file") != NULL);
    /* shorter than the length prefix */
    snprintf(path, sizeof path, "%s/short.safetensors", tmpdir);
    write_bytes(path, "abc", 3);
    CHECK(loom_st_open(path, &st) == LOOM_ERR_FORMAT);
    /* header length past the end of the file */
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_bytes(path, big, sizeof big);
    CHECK(loom_st_open(path, &st) == LOOM_ERR_FORMAT);
    CHECK(strstr(loom_last_error(), "past the end") != NULL);

    expect_st_error("{not json", 0, LOOM_ERR_FORMAT, "not a JSON object");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
                    LOOM_ERR_FORMAT, "past the end");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                    LOOM_ERR_FORMAT, "needs 12 bytes");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
                    LOOM_ERR_FORMAT, "overlap");
    expect_st_error("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                    LOOM_ERR_UNSUPPORTED, "unknown dtype \"Q4\"");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                    LOOM_ERR_FORMAT, "shape");
    expect_st_error("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                    LOOM_ERR_FORMAT, "data_offsets");
    expect_st_error("{\"a\":{\"dtype\":\"F32\"}}", 8, LOOM_ERR_FORMAT, "expected dtype");
    /* 2^61 F64 elements are 2^64 bytes: wrapped, they matched offsets [0, 0] */
    expect_st_error("{\"a\":{\"dtype\":\"F64\",\"shape\":[2147483648,1073741824],"
                    "\"data_offsets\":[0,0]}}", 8, LOOM_ERR_FORMAT, "shape overflows");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0.5,4.5]}}", 8,
                    LOOM_ERR_FORMAT, "bad data_offsets");
    expect_st_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                    "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8,
                    LOOM_ERR_FORMAT, "appears twice");

    /* an F32 tensor at an offset that is not a multiple of 4 reads from an
     * aligned copy holding the same bytes */
    snprintf(path, sizeof path, "%s/odd.safetensors", tmpdir);
    write_st(path, "{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[3,11]}}", 11);
    CHECKF(loom_st_open(path, &st) == LOOM_OK, "%s", loom_last_error());
    if (st) {
        const loom_st_tensor *b = loom_st_find(st, "b");
        CHECK(b && (uintptr_t)b->data % 4 == 0);
        for (int i = 0; b && i < 8; i++)
            CHECK(((const unsigned char *)b->data)[i] == (unsigned char)((3 + i) * 7 + 1));
        loom_st_close(st);
        st = NULL;
    }

    /* a valid file with metadata, every dtype the loader must accept */
    snprintf(path, sizeof path, "%s/ok.safetensors", tmpdir);
    write_st(path,
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[8,12]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[12,16]},"
             "\"u\":{\"dtype\":\"U32\",\"shape\":[1],\"data_offsets\":[16,20]},"
             "\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[20,24]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[24,24]}}",
             24);
    CHECKF(loom_st_open(path, &st) == LOOM_OK, "%s", loom_last_error());
    if (st) {
        CHECK_EQ_INT(loom_st_count(st), 6);
        const loom_st_tensor *t = loom_st_find(st, "b");
        CHECK(t && t->dtype == LOOM_DT_BF16 && t->ndim == 2 && t->shape[1] == 2 && t->nbytes == 4);
        CHECK(loom_st_find(st, "zz") == NULL);
        CHECK(loom_st_metadata(st, "format") && !strcmp(loom_st_metadata(st, "format"), "pt"));
        loom_st_close(st);
    }
}

static void test_writer_roundtrip(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/w.safetensors", tmpdir);
    float a[6] = {1, -2, 3.5f, 4, 5, 6};
    int32_t b[3] = {7, -8, 9};
    loom_st_write_entry e[2] = {
        {.name = "a", .dtype = LOOM_DT_F32, .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b", .dtype = LOOM_DT_I32, .ndim = 1, .shape = {3}, .data = b},
    };
    CHECK(loom_st_write(path, e, 2) == LOOM_OK);
    loom_safetensors *st = NULL;
    CHECKF(loom_st_open(path, &st) == LOOM_OK, "%s", loom_last_error());
    if (!st) return;
    const loom_st_tensor *ta = loom_st_find(st, "a"), *tb = loom_st_find(st, "b");
    CHECK(ta && !memcmp(ta->data, a, sizeof a) && ta->shape[0] == 2 && ta->shape[1] == 3);
    CHECK(tb && !memcmp(tb->data, b, sizeof b));
    CHECK(((uintptr_t)ta->data & 7) == 0);
    loom_st_close(st);
}

static void test_sharded(void) {
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    mkdir(dir, 0700);
    float a[2] = {1, 2}, b[3] = {3, 4, 5};
    loom_st_write_entry ea = {.name = "x.a", .dtype = LOOM_DT_F32, .ndim = 1, .shape = {2}, .data = a};
    loom_st_write_entry eb = {.name = "x.b", .dtype = LOOM_DT_F32, .ndim = 1, .shape = {3}, .data = b};
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    CHECK(loom_st_write(path, &ea, 1) == LOOM_OK);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    CHECK(loom_st_write(path, &eb, 1) == LOOM_OK);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"metadata\":{},\"weight_map\":{\"x.a\":\"model-00001-of-00002.safetensors\","
                      "\"x.b\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes(path, idx, strlen(idx));
    loom_safetensors *st = NULL;
    CHECKF(loom_st_open_dir(dir, &st) == LOOM_OK, "%s", loom_last_error());
    if (st) {
        CHECK_EQ_INT(loom_st_count(st), 2);
        const loom_st_tensor *t = loom_st_find(st, "x.b");
        CHECK(t && ((const float *)t->data)[2] == 5);
        loom_st_close(st);
    }
    /* an index naming a tensor that no shard has */
    idx = "{\"weight_map\":{\"x.a\":\"model-00001-of-00002.safetensors\","
          "\"x.c\":\"model-00002-of-00002.safetensors\"}}";
    write_bytes(path, idx, strlen(idx));
    CHECK(loom_st_open_dir(dir, &st) == LOOM_ERR_FORMAT);
    CHECK(strstr(loom_last_error(), "x.c") != NULL);
    /* an index naming a missing shard */
    idx = "{\"weight_map\":{\"x.a\":\"model-00009.safetensors\"}}";
    write_bytes(path, idx, strlen(idx));
    CHECK(loom_st_open_dir(dir, &st) == LOOM_ERR_IO);
    /* an empty directory */
    snprintf(path, sizeof path, "%s/empty", tmpdir);
    mkdir(path, 0700);
    CHECK(loom_st_open_dir(path, &st) == LOOM_ERR_IO);
    CHECK(strstr(loom_last_error(), "no model.safetensors") != NULL);
}

static void test_config(void) {
    loom_config c;
    /* transformers 5 spelling */
    const char *v5 = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,"
                     "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
                     "\"intermediate_size\":16,\"rope_parameters\":{\"rope_type\":\"llama3\","
                     "\"rope_theta\":500000.0,\"factor\":8.0,\"low_freq_factor\":1.0,"
                     "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}";
    CHECKF(loom_config_parse(v5, "v5", &c) == LOOM_OK, "%s", loom_last_error());
    CHECK(c.rope.type == LOOM_ROPE_LLAMA3 && c.rope.theta == 500000.0 && c.rope.factor == 8.0 &&
          c.rope.original_max_pos == 8192 && c.head_dim == 4 && c.tie_embeddings == 1);
    /* older spelling: rope_theta at top level + rope_scaling */
    const char *v4 = "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,"
                     "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":16,"
                     "\"rope_theta\":123.0,\"tie_word_embeddings\":false,\"rope_scaling\":{\"type\":"
                     "\"linear\",\"factor\":2.0},\"eos_token_id\":[5,6]}";
    CHECKF(loom_config_parse(v4, "v4", &c) == LOOM_OK, "%s", loom_last_error());
    CHECK(c.rope.type == LOOM_ROPE_LINEAR && c.rope.theta == 123.0 && c.rope.factor == 2.0 &&
          c.n_kv_heads == 2 && c.tie_embeddings == 0 && c.n_eos == 2 && c.eos_ids[1] == 6);
    /* missing field, bad type, unsupported rope */
    CHECK(loom_config_parse("{\"architectures\":[\"X\"]}", "c", &c) == LOOM_ERR_FORMAT);
    CHECK(strstr(loom_last_error(), "vocab_size") != NULL);
    CHECK(loom_config_parse("{\"architectures\":[\"X\"],\"vocab_size\":\"ten\"}", "c", &c) ==
          LOOM_ERR_FORMAT);
    CHECK(strstr(loom_last_error(), "vocab_size must be a positive integer, found a string") != NULL);
    CHECK(loom_config_parse("[1,2]", "c", &c) == LOOM_ERR_FORMAT);
    CHECK(loom_config_parse("{\"vocab_size\":3}", "c", &c) == LOOM_ERR_FORMAT);
    CHECK(strstr(loom_last_error(), "architectures") != NULL);
    const char *bad_rope = "{\"architectures\":[\"X\"],\"vocab_size\":10,\"hidden_size\":8,"
                           "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":"
                           "16,\"rope_scaling\":{\"rope_type\":\"longrope\"}}";
    CHECK(loom_config_parse(bad_rope, "c", &c) == LOOM_ERR_UNSUPPORTED);
    CHECK(strstr(loom_last_error(), "longrope") != NULL);
}

/* A model directory: qwen3-tiny's config.json (optionally edited) and its
 * tensors, one of which may be replaced. */
static void make_model_dir(const char *dir, const char *cfg_from, const char *cfg_to,
                           const char *tensor, loom_dtype dt, int r, int c) {
    mkdir(dir, 0700);
    char *text;
    size_t n;
    loom_read_file("tests/fixtures/models/qwen3-tiny/config.json", &text, &n);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    char *at = cfg_from ? strstr(text, cfg_from) : NULL;
    if (at) {
        fwrite(text, 1, (size_t)(at - text), f);
        fputs(cfg_to, f);
        fputs(at + strlen(cfg_from), f);
    } else {
        fputs(text, f);
    }
    fclose(f);
    free(text);
    loom_safetensors *src = NULL;
    loom_st_open("tests/fixtures/models/qwen3-tiny/model.safetensors", &src);
    int cnt = loom_st_count(src);
    loom_st_write_entry *e = calloc((size_t)cnt, sizeof *e);
    void *repl = calloc((size_t)r * c, 4);
    for (int i = 0; i < cnt; i++) {
        const loom_st_tensor *t = loom_st_at(src, i);
        e[i].name = t->name;
        e[i].dtype = t->dtype;
        e[i].ndim = t->ndim;
        memcpy(e[i].shape, t->shape, sizeof t->shape);
        e[i].data = t->data;
        if (tensor && !strcmp(t->name, tensor)) {
            e[i].dtype = dt;
            e[i].ndim = 2;
            e[i].shape[0] = r;
            e[i].shape[1] = c;
            e[i].data = repl;
        }
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    loom_st_write(path, e, cnt);
    free(repl);
    free(e);
    loom_st_close(src);
}

static void expect_model_error(const char *name, const char *from, const char *to,
                               const char *tensor, loom_dtype dt, int r, int c,
                               loom_status want, const char *needle) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    make_model_dir(dir, from, to, tensor, dt, r, c);
    loom_model *m = (loom_model *)1;
    loom_status s = loom_model_load(dir, NULL, &m);
    CHECKF(s == want, "%s: got %s (%s)", name, loom_status_str(s), loom_last_error());
    CHECK(m == NULL);
    CHECKF(strstr(loom_last_error(), needle) != NULL, "%s: message \"%s\" lacks \"%s\"", name,
           loom_last_error(), needle);
}

/* config.json values that parse but make no model: each error names the
 * field, what it must be and what the file has. */
static void test_config_values(void) {
    static const struct { const char *from, *to, *needle; } cases[] = {
        {"\"max_position_embeddings\": 4096", "\"max_position_embeddings\": 0",
         "config.json: max_position_embeddings must be a positive integer, found 0"},
        {"\"max_position_embeddings\": 4096", "\"max_position_embeddings\": 4096.5",
         "max_position_embeddings must be a positive integer, found 4096.5"},
        {"\"rope_theta\": 1000000.0", "\"rope_theta\": -5",
         "rope_parameters.rope_theta must be a positive number, found -5"},
        {"\"vocab_size\": 512", "\"vocab_size\": 2147483647",
         "config.json: vocab_size 2147483647 is larger than the embedding's 512 rows "
         "(tensor model.embed_tokens.weight)"},
        {"\"vocab_size\": 512", "\"vocab_size\": 500", "vocab_size 500 is smaller than"},
        {"\"vocab_size\": 512", "\"vocab_size\": 1e10",
         "vocab_size must be a positive integer, found 10000000000"},
        {"\"hidden_size\": 64", "\"hidden_size\": -64",
         "hidden_size must be a positive integer up to 1048576, found -64"},
        {"\"hidden_size\": 64", "\"hidden_size\": 96",
         "hidden_size 96 differs from the embedding's 64 columns"},
        {"\"num_attention_heads\": 4", "\"num_attention_heads\": 0",
         "num_attention_heads must be a positive integer up to 4096, found 0"},
        {"\"num_attention_heads\": 4", "\"num_attention_heads\": 2000000000",
         "num_attention_heads must be a positive integer up to 4096, found 2000000000"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 8",
         "num_key_value_heads must be a positive integer up to 4, found 8"},
        {"\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3",
         "num_attention_heads 4 is not a multiple of num_key_value_heads 3"},
        {"\"head_dim\": 32", "\"head_dim\": 31", "head_dim must be a positive even integer, found 31"},
        {"\"head_dim\": 32", "\"head_dim\": -2", "head_dim must be a positive integer up to 4096, found -2"},
        {"\"intermediate_size\": 192", "\"intermediate_size\": 0",
         "intermediate_size must be a positive integer up to 16777216, found 0"},
        {"\"num_hidden_layers\": 3", "\"num_hidden_layers\": 0",
         "num_hidden_layers must be a positive integer, found 0"},
        {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 0", "rms_norm_eps must be a positive number, found 0"},
        {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": \"small\"", "rms_norm_eps\": expected a number"},
        {"\"sliding_window\": null", "\"sliding_window\": -1",
         "sliding_window must be a non-negative integer, found -1"},
        {"\"rope_type\": \"default\"", "\"rope_type\": \"linear\", \"factor\": 0",
         "rope_parameters.factor must be a positive number, found 0"},
        {"\"rope_type\": \"default\"", "\"rope_type\": \"linear\", \"factor\": 2, "
         "\"partial_rotary_factor\": 1.5", "rope_parameters.partial_rotary_factor must be in (0, 1], found 1.5"},
        {"\"rope_type\": \"default\"", "\"rope_type\": \"llama3\", \"factor\": 8, "
         "\"low_freq_factor\": 4, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192",
         "rope_parameters.high_freq_factor must be larger than low_freq_factor, found 4"},
        {"\"rope_type\": \"default\"", "\"rope_type\": \"yarn\", \"factor\": 4, \"beta_fast\": -1",
         "rope_parameters.beta_fast must be a positive number, found -1"},
    };
    /* fields of the other families, through the parser alone */
    static const struct { const char *extra, *needle; } family[] = {
        {"\"attn_logit_softcapping\": -50", "attn_logit_softcapping must be a non-negative number "
         "(0 = off), found -50"},
        {"\"final_logit_softcapping\": -1", "final_logit_softcapping must be a non-negative"},
        {"\"query_pre_attn_scalar\": -256", "query_pre_attn_scalar must be a non-negative number"},
        {"\"global_head_dim\": 33", "global_head_dim must be a non-negative even integer, found 33"},
        {"\"num_experts\": -8", "num_experts must be a non-negative integer up to 65536, found -8"},
        {"\"moe_intermediate_size\": 1e12", "moe_intermediate_size must be a non-negative integer"},
        {"\"num_kv_shared_layers\": 5", "num_kv_shared_layers must be a non-negative integer up to 1, "
         "found 5"},
        {"\"partial_rotary_factor\": 0", "partial_rotary_factor must be in (0, 1], found 0"},
        {"\"rope_theta\": 0", "rope_theta must be a positive number, found 0"},
    };
    for (size_t i = 0; i < sizeof family / sizeof family[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"architectures\":[\"X\"],\"vocab_size\":10,\"hidden_size\":8,"
                 "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"intermediate_size\":16,%s}",
                 family[i].extra);
        loom_config c;
        loom_status s = loom_config_parse(text, "config.json", &c);
        CHECKF(s == LOOM_ERR_FORMAT && strstr(loom_last_error(), family[i].needle), "%s: %s (%s)",
               family[i].extra, loom_status_str(s), loom_last_error());
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "config%zu", i);
        expect_model_error(name, cases[i].from, cases[i].to, NULL, 0, 1, 1, LOOM_ERR_FORMAT,
                           cases[i].needle);
    }
}

/* generation_config.json's sampling defaults: the fields given, checked,
 * and do_sample false as greedy without the sampling warpers. */
static void test_gen_sampling(void) {
    char dir[256], path[512];
    snprintf(dir, sizeof dir, "%s/gen", tmpdir);
    make_model_dir(dir, NULL, NULL, NULL, 0, 1, 1);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    static const struct { const char *json, *needle; unsigned set; } cases[] = {
        {"{\"eos_token_id\": 3}", NULL, 0},
        {"{\"temperature\": 0.6, \"top_p\": 0.95, \"top_k\": 20, \"min_p\": 0.05, "
         "\"repetition_penalty\": 1.1, \"do_sample\": true}", NULL, LOOM_SAMPLING_ALL},
        {"{\"temperature\": null, \"top_k\": -1}", NULL, LOOM_SAMPLING_TOP_K},
        {"{\"do_sample\": false, \"temperature\": 0.7, \"top_p\": 0.8, \"top_k\": 5, "
         "\"repetition_penalty\": 1.2}", NULL, LOOM_SAMPLING_TEMPERATURE | LOOM_SAMPLING_REPETITION_PENALTY},
        {"{\"top_p\": 0}", "generation_config.json: top_p must be a number in (0, 1], found 0", 0},
        {"{\"temperature\": \"hot\"}", "temperature must be a number in [0, 100], found a string", 0},
        {"{\"repetition_penalty\": -1}", "repetition_penalty must be a number in (0, 100], found -1", 0},
        {"{\"top_k\": 2.5}", "top_k must be an integer, found 2.5", 0},
        {"{\"top_k\": -3}", "top_k must be a non-negative integer (or -1, off), found -3", 0},
        {"{\"temperature\": 0.6,", "generation_config.json: expected a JSON object, found invalid JSON", 0},
        {"", "generation_config.json: expected a JSON object, found an empty file", 0},
        {"[0.6]", "generation_config.json: expected a JSON object, found another JSON value", 0},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(cases); i++) {
        write_bytes(path, cases[i].json, strlen(cases[i].json));
        loom_config c;
        loom_status s = loom_config_load(dir, &c);
        if (cases[i].needle) {
            CHECKF(s == LOOM_ERR_FORMAT && strstr(loom_last_error(), cases[i].needle),
                   "%s: %s (%s)", cases[i].json, loom_status_str(s), loom_last_error());
            continue;
        }
        CHECKF(s == LOOM_OK, "%s: %s", cases[i].json, loom_last_error());
        CHECKF(c.gen_sampling_set == cases[i].set, "%s: fields %#x, want %#x", cases[i].json,
               c.gen_sampling_set, cases[i].set);
    }
    /* the last good case's values, through the model */
    const char *qwen = "{\"temperature\": 0.6, \"top_p\": 0.95, \"top_k\": 20, \"do_sample\": false, "
                       "\"repetition_penalty\": 1.1}";
    write_bytes(path, qwen, strlen(qwen));
    loom_model *m = NULL;
    CHECKF(loom_model_load(dir, NULL, &m) == LOOM_OK, "%s", loom_last_error());
    if (!m) return;
    loom_sampling d;
    CHECK(loom_model_sampling_defaults(m, &d) ==
          (LOOM_SAMPLING_TEMPERATURE | LOOM_SAMPLING_REPETITION_PENALTY));
    CHECK(d.temperature == 0 && d.top_p == 1 && d.top_k == 0 && d.repetition_penalty == 1.1f);
    loom_model_free(m);
}

static void test_model_errors(void) {
    expect_model_error("transposed", NULL, NULL, "model.layers.1.self_attn.q_proj.weight",
                       LOOM_DT_F32, 64, 128, LOOM_ERR_FORMAT,
                       "tensor model.layers.1.self_attn.q_proj.weight: expected F32/F16/BF16 "
                       "[128, 64], found F32 [64, 128]");
    expect_model_error("wrongtype", NULL, NULL, "model.layers.0.mlp.up_proj.weight", LOOM_DT_I32,
                       192, 64, LOOM_ERR_FORMAT, "found I32 [192, 64]");
    expect_model_error("arch", "Qwen3ForCausalLM", "FancyNewForCausalLM", NULL, 0, 1, 1,
                       LOOM_ERR_UNSUPPORTED, "architecture \"FancyNewForCausalLM\" is not supported");
    expect_model_error("missingtensor", NULL, NULL, "model.norm.weight", LOOM_DT_F32, 1, 1,
                       LOOM_ERR_FORMAT, "model.norm.weight: expected F32/F16/BF16 [64]");
    expect_model_error("act", "\"silu\"", "\"relu\"", NULL, 0, 1, 1, LOOM_ERR_UNSUPPORTED, "relu");
    expect_model_error("layers", "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 300", NULL, 0,
                       1, 1, LOOM_ERR_UNSUPPORTED, "num_hidden_layers 300, at most 256 supported");

    /* a good copy loads; ids outside the vocabulary are refused */
    char dir[256];
    snprintf(dir, sizeof dir, "%s/good", tmpdir);
    make_model_dir(dir, NULL, NULL, NULL, 0, 1, 1);
    loom_model *m = NULL;
    CHECKF(loom_model_load(dir, NULL, &m) == LOOM_OK, "%s", loom_last_error());
    if (!m) return;
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = 8;
    CHECK(loom_context_create(m, &cp, &c) == LOOM_OK);
    float *lg = malloc(sizeof(float) * 512 * 9);
    int32_t bad[2] = {3, 512};
    CHECK(loom_context_eval(c, bad, 2, 0, lg) == LOOM_ERR_RANGE);
    CHECK(strstr(loom_last_error(), "token id 512") != NULL);
    int32_t neg = -1;
    CHECK(loom_context_eval(c, &neg, 1, 0, lg) == LOOM_ERR_RANGE);
    CHECK_EQ_INT(loom_context_length(c), 0);
    int32_t nine[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK(loom_context_eval(c, nine, 9, 0, lg) == LOOM_ERR_RANGE);
    CHECK(strstr(loom_last_error(), "exceed the context") != NULL);
    CHECK(loom_context_eval(c, nine, 8, 0, lg) == LOOM_OK);
    CHECK_EQ_INT(loom_context_length(c), 8);
    CHECK(loom_context_eval(c, nine, 1, 0, lg) == LOOM_ERR_RANGE);
    free(lg);
    loom_context_free(c);
    loom_model_free(m);
}

/* Logits of 16 fixed tokens (all positions), or NULL when the model fails
 * to load; *V gets the vocabulary size. */
static float *fixture_logits(const char *dir, int no_copy, int *V) {
    loom_model_params mp = loom_model_default_params();
    mp.n_threads = 1;
    mp.no_copy = no_copy;
    loom_model *m = NULL;
    loom_context *c = NULL;
    loom_context_params cp = loom_context_default_params();
    cp.n_ctx = 32;
    float *lg = NULL;
    CHECKF(loom_model_load(dir, &mp, &m) == LOOM_OK, "%s: %s", dir, loom_last_error());
    if (m && loom_context_create(m, &cp, &c) == LOOM_OK) {
        *V = loom_model_vocab_size(m);
        int32_t tok[16];
        for (int i = 0; i < 16; i++) tok[i] = (int32_t)((i * 31 + 7) % *V);
        lg = malloc(sizeof(float) * (size_t)*V * 16);
        CHECKF(loom_context_eval(c, tok, 16, 1, lg) == LOOM_OK, "%s: %s", dir, loom_last_error());
    }
    loom_context_free(c);
    loom_model_free(m);
    return lg;
}

/* A copy of a fixture whose safetensors header is padded with 1..7 more
 * spaces (the format allows it), so the data section starts at an odd or
 * otherwise unaligned offset: the tensors load into aligned memory and
 * the logits are the same bits, with the weights copied at load or read
 * from the loader (no_copy). */
static void test_padded_header(const char *fixture) {
    char src[512], dir[256], path[512];
    snprintf(src, sizeof src, "%s/model.safetensors", fixture);
    char *file = NULL;
    size_t size = 0;
    if (loom_read_file(src, &file, &size) != LOOM_OK) {
        CHECKF(0, "%s: %s", src, loom_last_error());
        return;
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | (unsigned char)file[i];
    for (int no_copy = 0; no_copy < 2; no_copy++) {
        int V = 0;
        float *want = fixture_logits(fixture, no_copy, &V);
        for (int pad = 1; pad <= 7 && want; pad++) {
            snprintf(dir, sizeof dir, "%s/padded%d", tmpdir, pad);
            mkdir(dir, 0700);
            const char *names[] = {"config.json", "generation_config.json"};
            for (int k = 0; k < 2; k++) {
                char *text = NULL;
                size_t n = 0;
                snprintf(path, sizeof path, "%s/%s", fixture, names[k]);
                if (loom_read_file(path, &text, &n) != LOOM_OK) continue;
                snprintf(path, sizeof path, "%s/%s", dir, names[k]);
                write_bytes(path, text, n);
                free(text);
            }
            unsigned char *out = malloc(size + (size_t)pad);
            for (int i = 0; i < 8; i++) out[i] = (unsigned char)((hl + (uint64_t)pad) >> (8 * i));
            memcpy(out + 8, file + 8, (size_t)hl);
            memset(out + 8 + hl, ' ', (size_t)pad);
            memcpy(out + 8 + hl + pad, file + 8 + hl, size - 8 - (size_t)hl);
            snprintf(path, sizeof path, "%s/model.safetensors", dir);
            write_bytes(path, out, size + (size_t)pad);
            free(out);
            int V2 = 0;
            float *got = fixture_logits(dir, no_copy, &V2);
            CHECKF(got && V2 == V && !memcmp(got, want, sizeof(float) * (size_t)V * 16),
                   "%s, header padded by %d, no_copy %d: logits differ", fixture, pad, no_copy);
            free(got);
        }
        free(want);
    }
    free(file);
}

int main(void) {
    if (!mkdtemp(tmpdir)) return 1;
    test_padded_header("tests/fixtures/trained/pycoder-16m");
    test_padded_header("tests/fixtures/models/qwen3-tiny-mlx4");
    test_safetensors_errors();
    test_writer_roundtrip();
    test_sharded();
    test_config();
    test_model_errors();
    test_config_values();
    test_gen_sampling();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return test_report("test_load");
}
