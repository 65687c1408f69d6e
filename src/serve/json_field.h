/* json_field: the JSON helpers the request translators share (api.c,
 * api_messages.c, api_responses.c, fmt_responses.c): fields read as
 * clients send them, where an explicit null means the same as leaving the
 * field out, and the chat messages they build. */
#ifndef LOOM_SERVE_JSON_FIELD_H
#define LOOM_SERVE_JSON_FIELD_H

#include <cjson/cJSON.h>

/* Field k of o (borrowed), or NULL where o has none, it is null, or o is
 * NULL. */
const cJSON *json_get(const cJSON *o, const char *k);

/* Copies field k of in to out under the name as (k where as is NULL), as
 * it is: the reader of out checks its type. Nothing where json_get finds
 * none. */
void json_copy(const cJSON *in, cJSON *out, const char *k, const char *as);

/* A new chat message {"role": role, "content": content} (the caller owns
 * it). */
cJSON *json_message(const char *role, const char *content);

#endif
