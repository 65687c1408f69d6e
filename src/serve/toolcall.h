/* toolcall: splits a chat completion's text into content, reasoning and
 * tool calls, as it streams.
 *
 * Syntaxes (the one a model writes is the one its chat template renders
 * tool calls in; loom_toolcall_detect finds it):
 *   QWEN     <tool_call>{"name": .., "arguments": {..}}</tool_call>
 *            (Hermes, Qwen 2.5 / 3) or <tool_call><function=NAME>
 *            <parameter=K>V</parameter></function></tool_call> (Qwen3-Coder,
 *            Qwen 3.5), whose values are typed by the tool's JSON schema
 *   GEMMA4   <|tool_call>call:NAME{k:<|"|>str<|"|>,n:1}<tool_call|>, and
 *            <|channel>thought ... <channel|> reasoning
 *   LLAMA3   <|python_tag|>{json} or a bare {"name": .., "parameters": ..}
 *   MISTRAL  [TOOL_CALLS][{...}]
 *   HARMONY  gpt-oss channels: analysis -> reasoning, final -> content,
 *            commentary to=functions.NAME ... <|message|>{json} -> a call
 *   AUTO     every tag syntax above (the template told nothing)
 * With <think>...</think> reasoning for templates that use it.
 *
 * Each call is parsed when its closing marker arrives (or at the end of
 * the output); one that does not parse is returned as content, whole.
 * Text that could be the start of a marker is held back until decided, so
 * markers never leak into content. */
#ifndef LOOM_TOOLCALL_H
#define LOOM_TOOLCALL_H

#include <cjson/cJSON.h>

#include "serve/api.h"
#include "template/chat.h"
#include "tokenize/tokenizer.h"

#define LOOM_MAX_TOOL_CALLS 16

typedef enum loom_tc_syntax {
    LOOM_TC_AUTO = 0,
    LOOM_TC_QWEN,
    LOOM_TC_GEMMA4,
    LOOM_TC_LLAMA3,
    LOOM_TC_MISTRAL,
    LOOM_TC_HARMONY,
} loom_tc_syntax;

typedef struct loom_tool_call {
    char *name;        /* owned */
    char *arguments;   /* owned, JSON text of an object */
    char id[32];
    int sent;          /* streaming: 0 nothing, 1 the header delta, 2 the arguments too */
} loom_tool_call;

typedef struct loom_toolscan {
    int tools;         /* tool calls enabled */
    int think;         /* reasoning split enabled */
    loom_tc_syntax syntax;
    int state;         /* 0 content, 1 reasoning, 2 tool region; HARMONY: 0 header, 1 body */
    int started;       /* some non-space content went out */
    int after_call;    /* a call just closed: blank text after it is dropped */
    int label;         /* GEMMA4: the reasoning's "thought" label may still come */
    int marker;        /* the open marker of the tool region; -1 a bare JSON answer */
    int channel;       /* HARMONY body: 0 reasoning, 1 content, 2 tool call */
    size_t scanned;    /* region bytes already searched for the close marker */
    loom_buf pending;      /* held back: a possible marker prefix */
    loom_buf region;       /* the tool-call region (HARMONY: the header, the call's text) */
    loom_buf name;         /* HARMONY: the call's recipient */
    loom_buf content;      /* all content emitted */
    loom_buf reasoning;    /* all reasoning emitted */
    cJSON *schema;         /* owned: the request's tools, for parameter types */
    loom_tool_call calls[LOOM_MAX_TOOL_CALLS];
    int n_calls;
} loom_toolscan;

/* The syntax a model writes: the chat template is rendered with one probe
 * tool call in its history and the result is matched; without a template
 * (or a match), the vocabulary's marker tokens decide. Either may be NULL. */
loom_tc_syntax loom_toolcall_detect(const loom_chat_template *chat, const loom_tok *tok);
const char *loom_toolcall_syntax_name(loom_tc_syntax syntax);
/* 1 when the template writes calls as <function=NAME><parameter=K>V
 * (Qwen3-Coder) rather than as JSON. Renders the template: not per token. */
int loom_toolcall_xml_form(const loom_chat_template *chat);
/* The special ids of the syntax's markers, which the text stream must keep
 * (decode skips special tokens): in out[0..cap), returns the count. tools:
 * whether the request has tools (the channel markers are kept regardless). */
int loom_toolcall_keep_ids(loom_tc_syntax syntax, const loom_tok *tok, int tools, int32_t *out,
                           int cap);
/* The ids that open a tool call in the syntax (AUTO: every syntax's), for
 * tool_choice "none" to ban: in out[0..cap), returns the count. Markers
 * that are not one token of the vocabulary are not among them. */
int loom_toolcall_open_ids(loom_tc_syntax syntax, const loom_tok *tok, int32_t *out, int cap);
/* The ids a chat turn ends at: loom_tok_turn_end_ids, except that gpt-oss
 * ends at <|return|> or <|call|> (its <|end|> only ends a message) and a
 * Gemma 4 tool call hands over at <|tool_response>. */
int loom_toolcall_turn_end_ids(loom_tc_syntax syntax, const loom_tok *tok, int32_t *out, int cap);

/* prompt: the rendered prompt; a prompt ending inside <think> starts in
 * the reasoning state. Sets the AUTO syntax. */
void loom_toolscan_init(loom_toolscan *t, int tools, int think, const char *prompt);
/* Call right after init, before any feed: the model's syntax and the
 * request's tools (a JSON array; NULL when none), whose parameter schemas
 * type the values of XML-style calls. */
void loom_toolscan_set_syntax(loom_toolscan *t, loom_tc_syntax syntax, const char *tools_json,
                              const char *prompt);
void loom_toolscan_free(loom_toolscan *t);
/* Feeds generated text; appends what became final to content / reasoning.
 * final: the end of the output (flushes, parses tool calls). */
void loom_toolscan_feed(loom_toolscan *t, const char *text, size_t len, int final,
                        loom_buf *content, loom_buf *reasoning);
/* The calls as an OpenAI tool_calls JSON array (stream: with "index"). */
void loom_toolscan_put_calls(const loom_toolscan *t, loom_buf *b, int stream);
/* Streaming: appends the next tool_calls delta array not yet sent (a call's
 * index, id, type and name with arguments "", then its arguments) and
 * returns 1; returns 0 when everything parsed so far went out. */
int loom_toolscan_next_delta(loom_toolscan *t, loom_buf *b);

#endif
