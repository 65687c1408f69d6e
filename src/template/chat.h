/* template/chat: applies a model's chat template to a conversation, the way
 * transformers' tokenizer.apply_chat_template(..., tokenize=False) does.
 *
 * The template comes from the model directory: chat_template.jinja if
 * present, else "chat_template" in tokenizer_config.json (a string, or a
 * list of {"name", "template"}), else chat_template.json. Special tokens
 * (bos_token, eos_token, unk_token, pad_token, ...) come from
 * tokenizer_config.json, as plain strings or {"content": ...} objects.
 *
 * Rendering passes the same variables transformers does: messages, tools
 * (None when not given), documents, add_generation_prompt, the special
 * tokens, then every extra keyword (chat_template_kwargs, e.g.
 * enable_thinking), which override the rest.
 *
 * A loaded template is read-only: any number of threads may call
 * loom_chat_apply on it at once. */
#ifndef LOOM_TEMPLATE_CHAT_H
#define LOOM_TEMPLATE_CHAT_H

#include <stddef.h>

#include "loom.h"

typedef struct loom_chat_template loom_chat_template;

/* Loads the chat template and special tokens of a Hugging Face model (or
 * tokenizer) directory. LOOM_ERR_UNSUPPORTED when the directory has no chat
 * template (transformers refuses such models too); LOOM_ERR_FORMAT when the
 * template does not compile (message names the template line). */
loom_status loom_chat_template_load(const char *dir, loom_chat_template **out);

/* Same from the text of a tokenizer_config.json (config_json may be NULL);
 * template_src, when not NULL, replaces the config's template. */
loom_status loom_chat_template_from_config(const char *config_json,
                                           const char *template_src,
                                           loom_chat_template **out);
void loom_chat_template_free(loom_chat_template *t);

/* Names of the templates held ("default", "tool_use", ...); count in *n.
 * Valid while t lives. */
const char *const *loom_chat_template_names(const loom_chat_template *t, int *n);

typedef struct loom_chat_params {
    const char *messages_json;  /* JSON array of message objects; required */
    const char *tools_json;     /* JSON array of tool schemas; NULL = None */
    const char *documents_json; /* JSON array; NULL = None */
    int add_generation_prompt;  /* append the assistant turn header */
    int continue_final_message; /* end the text inside the last message */
    const char *kwargs_json;    /* JSON object of extra variables; NULL = none */
    const char *template_name;  /* pick a named template; NULL = automatic
                                   ("tool_use" when tools are given and it
                                   exists, else "default") */
} loom_chat_params;

/* All NULL / 0. */
loom_chat_params loom_chat_default_params(void);

/* Renders the conversation. On success *out is a NUL-terminated heap string
 * (free with free()), *out_len its length (out_len may be NULL).
 * Errors: LOOM_ERR_INVALID_ARG for malformed JSON inputs, for a render
 * failure (message names the template line), or when the template rejects
 * the conversation with raise_exception() (message is the template's own,
 * e.g. "Conversation roles must alternate user/assistant/user/assistant/...";
 * loom_jinja_last_error_raised() tells this case apart). */
loom_status loom_chat_apply(const loom_chat_template *t, const loom_chat_params *p,
                            char **out, size_t *out_len);

#endif
