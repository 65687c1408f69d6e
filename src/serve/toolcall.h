/* toolcall: splits a chat completion's text into content, reasoning
 * (<think>...</think>) and tool calls, as it streams.
 *
 * Tool-call syntaxes recognised: Qwen/Hermes `<tool_call>{json}</tool_call>`,
 * Llama 3 `<|python_tag|>{json}` or a bare `{"name": ..., "parameters": ...}`
 * answer, Mistral `[TOOL_CALLS][{...}]`. Once a tool call starts, the rest
 * of the output is kept back and parsed at the end; if it does not parse,
 * it is returned as content. Text that could be the start of a marker is
 * held back until decided, so markers never leak into content. */
#ifndef LOOM_TOOLCALL_H
#define LOOM_TOOLCALL_H

#include "serve/api.h"

#define LOOM_MAX_TOOL_CALLS 16

typedef struct loom_tool_call {
    char *name;        /* owned */
    char *arguments;   /* owned, JSON text of an object */
    char id[32];
} loom_tool_call;

typedef struct loom_toolscan {
    int tools;         /* tool calls enabled */
    int think;         /* reasoning split enabled */
    int state;         /* 0 content, 1 reasoning, 2 tool region */
    int started;       /* some non-space content went out */
    loom_buf pending;      /* held back: a possible marker prefix */
    loom_buf region;       /* the tool-call region */
    loom_buf content;      /* all content emitted */
    loom_buf reasoning;    /* all reasoning emitted */
    loom_tool_call calls[LOOM_MAX_TOOL_CALLS];
    int n_calls;
} loom_toolscan;

/* prompt: the rendered prompt; a prompt ending inside <think> starts in
 * the reasoning state. */
void loom_toolscan_init(loom_toolscan *t, int tools, int think, const char *prompt);
void loom_toolscan_free(loom_toolscan *t);
/* Feeds generated text; appends what became final to content / reasoning.
 * final: the end of the output (flushes, parses tool calls). */
void loom_toolscan_feed(loom_toolscan *t, const char *text, size_t len, int final,
                        loom_buf *content, loom_buf *reasoning);
/* The calls as an OpenAI tool_calls JSON array (stream: with "index"). */
void loom_toolscan_put_calls(const loom_toolscan *t, loom_buf *b, int stream);

#endif
