/* loom: LLM inference engine. Public C API.
 *
 * Conventions: handles are opaque; every *_create has a matching *_free
 * (which accepts NULL); parameter structs come from *_default_params() by
 * value. Functions that can fail return loom_status; on failure
 * loom_last_error() returns a message for the calling thread naming what was
 * expected and what was found. The library never prints to stdout and never
 * exits the process. */
#ifndef LOOM_H
#define LOOM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_status {
    LOOM_OK = 0,
    LOOM_ERR_INVALID_ARG = 1,  /* a caller mistake: bad parameter or input */
    LOOM_ERR_IO = 2,           /* a file could not be opened, read or mapped */
    LOOM_ERR_FORMAT = 3,       /* a file is malformed (corrupt, truncated) */
    LOOM_ERR_UNSUPPORTED = 4,  /* valid input loom does not handle (arch, dtype) */
    LOOM_ERR_NOMEM = 5,        /* allocation failed or a memory budget is spent */
    LOOM_ERR_RANGE = 6,        /* an index out of range (token id, position) */
    LOOM_ERR_NO_KV = 7,        /* no free KV blocks for the request */
    LOOM_ERR_ABORTED = 8,      /* the caller cancelled the operation */
    LOOM_ERR_INTERNAL = 9,     /* a bug in loom */
    LOOM_ERR_TIMEOUT = 10,     /* nothing happened within the time asked for */
    LOOM_ERR_BUSY = 11,        /* a queue is full; try again later */
} loom_status;

/* Static name of a status ("LOOM_ERR_FORMAT"). */
const char *loom_status_str(loom_status s);

/* The last error message set on this thread ("" if none). Valid until the
 * next loom call on this thread. */
const char *loom_last_error(void);

/* ---- model ------------------------------------------------------------ */

typedef struct loom_model loom_model;

typedef struct loom_model_params {
    int n_threads;        /* worker threads for the CPU backend; 0 = all cores */
    int device;           /* -1 = CPU (default); n >= 0 = CUDA device n (dense
                             Llama/Mistral/Qwen2/Qwen3 models, CUDA=1 builds) */
    int fast_matmul;      /* CPU: round activations to the weights' fast format
                             (8-bit for MLX-quantized weights, bf16 for bf16
                             weights) where the CPU has instructions for it, as
                             llama.cpp does. Faster; logits then differ from the
                             exact path by about 1e-3 relative. Default 0. */
    int no_copy;          /* CPU: leave the weights in the file mapping (for
                             callers that only read metadata). Default 0: the
                             matrices are copied onto 2 MiB pages at load. */
    int quantize_bits;    /* CPU: 8 or 4 quantizes a float checkpoint at load as
                             `loom convert --bits N` would (every 2-D matrix whose
                             rows split into groups of 64, the embeddings included;
                             MLX affine, scales in the checkpoint's half type), in
                             memory; the tensors left unquantized keep their dtype
                             (convert rounds f32 ones to bf16). Default 0: as stored. */
    int tensor_parallel;  /* CUDA: 0 = the model on one device (default); n >= 1 = split
                             over n ranks (heads, KV heads and the MLP; the sums over
                             NCCL), rank r on tp_devices[r], or on device + r where
                             tp_devices is NULL. Dense attention models with float
                             weights; at most 8 ranks. */
    const int *tp_devices;/* [tensor_parallel] or NULL; one device named for every rank
                             runs the split there (a check of the split on one GPU) */
} loom_model_params;

loom_model_params loom_model_default_params(void);

/* Loads a Hugging Face model directory (config.json + safetensors). The
 * files are mapped; on the CPU the matrices are then copied onto 2 MiB
 * pages (decode streams them every token) and the file's pages dropped,
 * unless no_copy or the memory available cannot hold them. On failure
 * *out is NULL. */
loom_status loom_model_load(const char *dir, const loom_model_params *params,
                            loom_model **out);
/* A drafter for speculative decoding (loom_engine_params.draft_model): on
 * the CPU, on one thread (its matmuls are too small to share). Unless
 * exact, a float causal LM is quantized to 8 bits at load and multiplied
 * with the --fast integer kernels where the CPU has them: its proposals
 * are verified by the target, so only their acceptance can change. A
 * DFlash drafter picks its arithmetic with the engine (draft_exact). */
loom_status loom_draft_model_load(const char *dir, int exact, loom_model **out);
void loom_model_free(loom_model *m);
/* Reads every weight page still read from the mapping now (mapped pages
 * come in lazily) so the first request does not wait on the disk; nothing
 * when the load copied the weights. progress (may be NULL) gets fractions
 * 0..1. */
void loom_model_warm(loom_model *m, void (*progress)(void *ctx, double done), void *ctx);

int loom_model_vocab_size(const loom_model *m);
int loom_model_max_positions(const loom_model *m);
/* Width of the hidden states (and of an embedding request's vector). */
int loom_model_hidden_size(const loom_model *m);
/* Architecture name from config.json ("Qwen3ForCausalLM"). */
const char *loom_model_arch(const loom_model *m);
/* End-of-sequence ids (config.json and generation_config.json). Writes up
 * to cap ids and returns how many there are. */
int loom_model_eos_ids(const loom_model *m, int32_t *out, int cap);

/* Element type of the KV cache. */
typedef enum loom_kv_type {
    LOOM_KV_F32 = 0,     /* exact: what the reference computes */
    LOOM_KV_F16 = 1,     /* half the memory */
    LOOM_KV_BF16 = 2,
    LOOM_KV_Q8 = 3,      /* affine 8-bit, groups of 64 (32 for narrow rows), f16 scale/bias */
    LOOM_KV_Q4 = 4,      /* affine 4-bit, likewise */
} loom_kv_type;

/* ---- session: one sequence with its own KV cache ------------------------ */

/* A context holds the KV cache for one token sequence. It is the simplest
 * way to run a model: feed tokens, read logits. (The engine batches many
 * sequences over a shared paged KV pool; a context is a pool of one.) */
typedef struct loom_context loom_context;

typedef struct loom_context_params {
    int n_ctx;            /* max tokens the sequence may hold; 0 = model max */
    int n_batch;          /* max tokens per forward; 0 = 512 */
    loom_kv_type kv_type; /* default LOOM_KV_F32 */
    const char *kv_config;/* kv_config.json with per-layer KV bits, or NULL (see
                             loom_engine_params.kv_config) */
} loom_context_params;

loom_context_params loom_context_default_params(void);
loom_status loom_context_create(loom_model *m, const loom_context_params *p,
                                loom_context **out);
void loom_context_free(loom_context *c);

/* Appends n tokens to the sequence and runs the model over them. When
 * logits is non-NULL it receives [n, vocab] floats (all positions) if
 * all_logits, else [vocab] for the last token only.
 * Returns LOOM_ERR_RANGE for a token id outside the vocabulary or when the
 * sequence would exceed n_ctx (nothing is appended then). */
loom_status loom_context_eval(loom_context *c, const int32_t *tokens, int n,
                              int all_logits, float *logits);
/* Number of tokens held. */
int loom_context_length(const loom_context *c);
/* Drops every token from position pos on (pos <= length). */
loom_status loom_context_truncate(loom_context *c, int pos);

/* Greedy (temperature 0) generation helper: evaluates the prompt, then
 * produces up to max_tokens ids into out (stopping early at any of the
 * n_stop stop ids, which is included). Returns the count in *n_out. */
loom_status loom_generate_greedy(loom_context *c, const int32_t *prompt,
                                 int n_prompt, int max_tokens,
                                 const int32_t *stop_ids, int n_stop,
                                 int32_t *out, int *n_out);

/* ---- sampling ---------------------------------------------------------- */

typedef struct loom_logit_bias {
    int32_t token;
    float bias;          /* added to the logit; -INFINITY bans the token */
} loom_logit_bias;

/* How a request picks tokens. The steps run in this order: logit bias,
 * repetition penalty (HF style: divide positive logits, multiply negative
 * ones, for every token in the last penalty_last_n tokens of prompt and
 * output), presence and frequency penalties (OpenAI style, over output
 * tokens in the same window), temperature, top-k, top-p, min-p, XTC, then a
 * draw with the request's own random state. Temperature 0 is greedy (argmax
 * after bias and penalties). The same seed gives the same tokens whatever
 * else is running. */
typedef struct loom_sampling {
    float temperature;          /* 0 = greedy */
    int top_k;                  /* 0 = off */
    float top_p;                /* 1 = off */
    float min_p;                /* 0 = off */
    float xtc_probability;      /* 0 = off */
    float xtc_threshold;        /* tokens at or above this probability are cut */
    float repetition_penalty;   /* 1 = off */
    float presence_penalty;     /* 0 = off */
    float frequency_penalty;    /* 0 = off */
    int penalty_last_n;         /* window in tokens; -1 = whole sequence */
    uint64_t seed;
    const loom_logit_bias *logit_bias;  /* [n_logit_bias], copied at submit */
    int n_logit_bias;
} loom_sampling;

loom_sampling loom_sampling_default(void);

/* The fields of loom_sampling that model and server defaults set, as bits:
 * defaults are layered field by field (a request's own value, else the
 * server's flag, else the model's generation_config.json, else built in). */
enum {
    LOOM_SAMPLING_TEMPERATURE = 1 << 0,
    LOOM_SAMPLING_TOP_P = 1 << 1,
    LOOM_SAMPLING_TOP_K = 1 << 2,
    LOOM_SAMPLING_MIN_P = 1 << 3,
    LOOM_SAMPLING_REPETITION_PENALTY = 1 << 4,
    LOOM_SAMPLING_ALL = (1 << 5) - 1,
};

/* Copies the fields named by the LOOM_SAMPLING_* bits of fields from src
 * into dst; other fields of dst stay. */
void loom_sampling_apply(loom_sampling *dst, const loom_sampling *src, unsigned fields);

/* The sampling defaults of the model's generation_config.json (temperature,
 * top_p, top_k, min_p, repetition_penalty): fills *out, loom_sampling_default()
 * where the file is silent, and returns the LOOM_SAMPLING_* bits of the
 * fields it gives (0 without the file). "do_sample": false there gives
 * temperature 0 (greedy) and leaves top_p, top_k and min_p out, as
 * transformers then applies none of them. */
unsigned loom_model_sampling_defaults(const loom_model *m, loom_sampling *out);

/* How an embedding request pools the hidden states of its prompt
 * positions (after the final norm: transformers' last_hidden_state). */
typedef enum loom_pooling {
    LOOM_POOLING_NONE = 0,  /* not an embedding request: generate */
    LOOM_POOLING_LAST = 1,  /* the last position's (decoder models, Qwen3-Embedding) */
    LOOM_POOLING_MEAN = 2,  /* the mean over all positions */
    LOOM_POOLING_CLS = 3,   /* the first position's */
} loom_pooling;

/* The pooling the model directory asks for: a sentence-transformers
 * modules.json naming a Pooling module whose config.json sets
 * pooling_mode_lasttoken, pooling_mode_mean_tokens or
 * pooling_mode_cls_token; LOOM_POOLING_LAST where there is none. */
loom_pooling loom_model_pooling(const loom_model *m);

/* ---- engine: continuous batching over a shared paged KV pool ----------- */

/* One engine thread owns the model, the KV pool and the scheduler. Callers
 * on any thread submit requests and read each request's events; they never
 * touch the model. At most one engine (or context) may run on a model at a
 * time: they share its thread pool. */
typedef struct loom_engine loom_engine;
typedef struct loom_request loom_request;

/* Who proposes the tokens a decode row verifies (loom_engine_params). */
typedef enum loom_speculative {
    LOOM_SPEC_NONE = 0,
    LOOM_SPEC_NGRAM,        /* prompt lookup: what followed the latest earlier
                               occurrence of the last 3, 2 or 1 tokens */
    LOOM_SPEC_DRAFT,        /* a draft model's greedy tokens */
} loom_speculative;

typedef struct loom_engine_params {
    int max_batch_tokens;   /* token budget of one step (default 2048) */
    int max_seqs;           /* sequences running at once (default 64) */
    int block_size;         /* tokens per KV block (default 16) */
    size_t kv_memory;       /* KV pool bytes; 0 = a quarter of RAM, at most
                               what max_seqs full contexts need */
    int n_ctx;              /* max tokens per sequence; 0 = the model's
                               limit, at most 32768 */
    int prefill_chunk;      /* planned prefill chunk; 0 = policy (2048, or
                               smaller for linear-attention models) */
    int max_queue;          /* waiting requests before submit answers
                               LOOM_ERR_BUSY; 0 = unlimited */
    loom_kv_type kv_type;   /* KV element type (default LOOM_KV_F32) */
    const char *kv_config;  /* path of a kv_config.json storing some layers
                               differently: [{"layer_idx": i, "bits": 4|8|16|32,
                               "group_size": 32|64|128}, ...]; other layers use
                               kv_type. NULL = none (the library does not look in
                               the model directory; the loom commands do). The
                               CUDA backend takes one type for all layers. */
    const char *trace_file; /* appends one JSON line per traced request when it
                               ends: {"request", "prompt_tokens",
                               "generated_tokens", "spans": [...]}, spans as
                               loom_request_trace_json writes them; or NULL */
    int prefix_cache;       /* reuse KV of earlier prompts' full blocks (default 1;
                               models with linear-attention layers never do) */
    size_t prefix_cache_bytes; /* cap on KV kept only for reuse (unreferenced cached
                                  blocks and finished requests kept for
                                  continuation); 0 = whole pool */
    const char *prefix_cache_dir; /* disk tier: evicted blocks spill here and
                                     survive restarts; NULL = memory only */
    size_t prefix_cache_disk_bytes; /* cap of the disk tier; 0 = unlimited */
    int prefix_cache_disk_zstd; /* zstd level for the disk tier's block files
                                   (1..19; 0 = off); needs a build with zstd */
    size_t snapshot_bytes;  /* cap on saved recurrent states (linear-attention
                               models); 0 = 1 GiB. The states kept with finished
                               requests (save_id) have a cap of the same size */
    loom_speculative speculative; /* speculative decoding of every request (default off;
                               lossless: greedy output is that of plain decoding,
                               sampled output has the same distribution; CPU only) */
    int draft_tokens;       /* proposals a decode row carries at most (0 = 8) */
    int spec_always;        /* 1: every step speculates; 0 (default): a step at a
                               batch size where speculating steps measured slower
                               than plain ones carries no proposals (probing now
                               and then) */
    int draft_exact;        /* 1: a DFlash drafter multiplies in exact f32 over its
                               checkpoint's values; 0 (default): over 8-bit copies with
                               the --fast integer kernels where the CPU has them (its
                               proposals are verified, so output is the same). A draft
                               model's arithmetic is loom_draft_model_load's */
    loom_model *draft_model; /* borrowed: LOOM_SPEC_DRAFT's drafter, a causal LM over
                               the same vocabulary (a hybrid drafts too: its state goes
                               back to a snapshot) */
    const char *model_dir;  /* the model's directory, for its vision tower
                               (vision-language models): requests may then carry
                               images. NULL = no images */
} loom_engine_params;

/* One image of a request, as the model's image processor left it. The
 * engine runs the vision tower over it once, on its thread, when the
 * request's prefill first needs the image's rows: a prefix-cache or
 * session hit over all of its placeholders runs no tower. */
typedef struct loom_request_image {
    const float *pixels;    /* (t * h * w, patch_dim) pixel_values, copied at submit */
    int grid[3];            /* (t, h, w) in patches */
    uint64_t hash;          /* the decoded image's content (size and RGB bytes,
                               e.g. XXH3): its placeholders' key in the prefix
                               cache, the disk tier and sessions */
} loom_request_image;

typedef struct loom_request_params {
    const int32_t *prompt;  /* [n_prompt], copied at submit */
    int n_prompt;
    int max_tokens;         /* tokens to generate; 0 = until the context is full */
    loom_sampling sampling; /* copied and frozen at submit */
    const int32_t *stop_ids;/* [n_stop_ids] extra stop tokens, copied */
    int n_stop_ids;
    int ignore_eos;         /* do not stop at the model's end-of-sequence ids */
    int logprobs;           /* -1 none; 0 the chosen token's; n > 0 also top n (max 20) */
    int prompt_logprobs;    /* -1 none; n >= 0: before the first generated token,
                               one event (prompt = 1) for each prompt token after
                               the first, with its log-probability given the
                               tokens before it and the top n (max 20) there.
                               Every prompt position is computed: such a request
                               takes nothing from the prefix cache or a session */
    int prefill_chunk;      /* 0 = the engine's policy */
    int trace;              /* record timed spans for this request (read them
                               with loom_request_trace_json; the engine's
                               trace_file also gets them) */
    const char *cache_session_id; /* isolates this request's prefix-cache
                                     entries from other sessions ("" is one
                                     too); NULL = shared */
    int snapshot_at;        /* a prompt boundary worth resuming from later (e.g.
                               the conversation before the newest user turn);
                               models with linear-attention layers save their
                               state there when it is >= 256 tokens; 0 = none */
    const char *save_id;    /* keep this request's final state (KV of prompt and
                               output, recurrent state) under this id when it
                               finishes (stop or length), and as the latest turn
                               of its cache_session_id if any; NULL = don't.
                               Kept while memory allows (prefix cache on). */
    const char *resume_id;  /* continue the state kept under this save_id: when
                               the prompt starts with its tokens and adds at
                               least one, only the new tokens are computed. NULL
                               = the latest turn of cache_session_id, if any.
                               An unknown, evicted or unmatched id is no error:
                               the prompt goes through the prefix cache. */
    loom_pooling pooling;   /* != NONE: an embedding request. The prompt is
                               prefilled (batched with other requests), nothing is
                               generated; the final event (LOOM_FINISH_STOP) comes
                               once loom_request_embedding() has the vector. The
                               prompt may fill the whole context. LAST may read the
                               prefix cache (the vector is the same); MEAN and CLS
                               compute every position. */
    int normalize;          /* embeddings: L2-normalise the vector (default 1) */
    const loom_request_image *images; /* [n_images], in prompt order, each over
                               its run of image placeholder tokens (the model's
                               image_token_id, as many as its grid gives); needs
                               an engine with model_dir of a vision-language
                               model. NULL = none */
    int n_images;
    struct loom_grammar *grammar; /* constrained output (src/grammar/grammar.h:
                               compiled from a JSON Schema, GBNF or a regex over
                               the model's vocabulary), or NULL. The engine takes
                               its own reference at submit; the caller releases
                               its own. Only tokens that keep the output a prefix
                               of the grammar's language are drawn (greedy or
                               sampled); end-of-sequence and stop ids only once
                               the output is a whole sentence, and the request
                               stops (finish STOP) when nothing more can follow. */
} loom_request_params;

typedef enum loom_finish {
    LOOM_FINISH_NONE = 0,   /* a token event; more follow */
    LOOM_FINISH_STOP,       /* an end-of-sequence or stop id was generated */
    LOOM_FINISH_LENGTH,     /* max_tokens reached, or the context is full */
    LOOM_FINISH_CANCELLED,  /* cancelled by the caller */
    LOOM_FINISH_ERROR,      /* failed; status and loom_request_error() say why */
} loom_finish;

typedef struct loom_event {
    loom_finish finish;     /* NONE: token fields are valid */
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[20];
    float top_logprobs[20];
    int prompt;             /* 1: token is a prompt token (prompt_logprobs), not
                               a generated one */
    loom_status status;     /* the failure, for LOOM_FINISH_ERROR */
    int n_prompt;           /* usage, filled on the final event */
    int n_generated;
    int n_cached;           /* prompt tokens served from the prefix cache or a
                               continued session (not computed) */
} loom_event;

typedef struct loom_engine_stats {
    int waiting, running;
    int kv_blocks_total, kv_blocks_free; /* free counts evictable cached blocks */
    int kv_blocks_cached;                /* blocks held in the prefix cache */
    uint64_t steps, prefill_tokens, decode_tokens, preemptions;
    uint64_t cache_hit_tokens, cache_miss_tokens, cache_evicted_blocks;
    uint64_t disk_hit_tokens, disk_reads, disk_writes, disk_bad_files;
    uint64_t disk_bytes;
    int sessions;                        /* finished sequences kept for continuation */
    uint64_t session_hits, session_misses; /* requests that named one: resumed or not */
    uint64_t session_hit_tokens, session_evictions;
    uint64_t vision_encodes;             /* images the vision tower ran over */
    /* Where the KV pool's blocks are; the four holders sum to kv_blocks_total. */
    int kv_blocks_running;               /* referenced by running requests (waiting ones hold none) */
    int kv_blocks_lru;                   /* unreferenced prefix-cache blocks */
    int kv_blocks_parked;                /* held only by kept sessions / responses */
    uint64_t spec_drafted, spec_accepted; /* speculative proposals verified, and kept */
    uint64_t spec_rounds;                /* decode rows that verified proposals */
    uint64_t spec_gated;                 /* steps the gate kept plain (engine/gate.h) */
    int kv_blocks_unused;                /* on the free list */
    int kv_blocks_touched;               /* ever handed out: the pool's resident part */
    int kv_cache_cap_blocks;             /* cap on lru + parked blocks; 0 = no cache */
    int kv_block_size;                   /* tokens per block */
    size_t kv_block_bytes;               /* bytes of one block (K and V, every layer) */
    /* Decode-only steps, plain and speculating (proposals planned), and
     * where each kind spent the engine thread's CPU seconds: the forward
     * (the thread's share: the pool's workers do the rest), the drafter
     * (speculating steps) and the commit (sampling, or verification,
     * rollback and emission, and a DFlash drafter's stash of the
     * forward's hidden states). Apart from wall time, which a shared
     * machine's other work moves. */
    uint64_t plain_steps, spec_steps;
    double plain_fwd_cpu_s, plain_commit_cpu_s;
    double spec_draft_cpu_s, spec_fwd_cpu_s, spec_commit_cpu_s;
} loom_engine_stats;

loom_engine_params loom_engine_default_params(void);
loom_request_params loom_request_default_params(void);

/* Starts the engine thread. The model must outlive the engine. */
loom_status loom_engine_create(loom_model *m, const loom_engine_params *p,
                               loom_engine **out);
/* Stops the engine: running and waiting requests finish as cancelled. */
void loom_engine_free(loom_engine *e);

/* Queues a request. Fails at once (nothing queued) with
 * LOOM_ERR_INVALID_ARG for bad parameters, LOOM_ERR_RANGE when the prompt
 * cannot fit the context or the KV pool, LOOM_ERR_BUSY when the queue is
 * full. On success the caller owns *out and must loom_request_free() it. */
loom_status loom_engine_submit(loom_engine *e, const loom_request_params *p,
                               loom_request **out);
/* Waits for the next event (timeout_ms < 0: forever). Returns LOOM_OK with
 * an event, or LOOM_ERR_TIMEOUT. After the final event it keeps returning
 * that event. */
loom_status loom_request_next(loom_request *r, loom_event *ev, int timeout_ms);
/* Asks the engine to stop the request at the next step boundary. Safe from
 * any thread, any number of times. */
void loom_request_cancel(loom_request *r);
/* An embedding request's pooled vector: after its final event (finish
 * STOP), copies up to cap floats to out and returns the dimension
 * (loom_model_hidden_size); 0 before then or for a generation request. */
int loom_request_embedding(const loom_request *r, float *out, int cap);
/* Message for a LOOM_FINISH_ERROR request ("" otherwise). */
const char *loom_request_error(const loom_request *r);
/* The spans a traced request recorded, as a JSON array of
 * {"name", "start_ms", "dur_ms", "attrs": {...}} (start_ms counts from the
 * submit), in a malloc'd string the caller frees; "[]" for an untraced
 * request, NULL when out of memory. Call only after the final event: the
 * engine records spans until then. */
char *loom_request_trace_json(const loom_request *r);
/* Cancels the request if it still runs and drops the caller's handle. */
void loom_request_free(loom_request *r);

void loom_engine_get_stats(loom_engine *e, loom_engine_stats *s);

#ifdef __cplusplus
}
#endif
#endif
