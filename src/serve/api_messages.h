/* api_messages: the request shapes of Anthropic's Messages API and
 * OpenAI's Responses API, translated into the chat request api_parse takes
 * (messages, tools, tool_choice, stop, response_format), so that both run
 * through the same validation, chat template and tool-call parsing as
 * /v1/chat/completions. Errors name the field as the client sent it. No
 * HTTP and no engine here. */
#ifndef LOOM_API_MESSAGES_H
#define LOOM_API_MESSAGES_H

#include "serve/api.h"

/* POST /v1/messages (count: /v1/messages/count_tokens, where max_tokens is
 * not asked for). On success req is parsed as API_CHAT and *client holds
 * the body as sent (owned by the caller); on failure err is filled in
 * Anthropic's dialect and -1 returned. */
int api_messages_parse(const char *body, size_t len, int vocab, int count, api_req *req,
                       cJSON **client, api_error *err);

/* POST /v1/responses: input (a string, or message, function_call and
 * function_call_output items), instructions, max_output_tokens, tools,
 * tool_choice, text.format, over the body as sent (in, from
 * api_parse_object, borrowed). history: the chat messages of the
 * conversation its previous_response_id continues (borrowed), or NULL.
 * As api_messages_parse, in OpenAI's dialect. */
int api_responses_parse(const cJSON *in, const cJSON *history, int vocab, api_req *req,
                        api_error *err);

/* The chat messages the input of a request adds to its conversation,
 * appended to out (an array): what a stored response keeps beside its
 * output. */
int api_responses_input(const cJSON *in, cJSON *out, api_error *err);

#endif
