/* embed: POST /v1/embeddings (embed.c), an endpoint answered with one
 * body, apart from HTTP so that the server and batch mode run the same
 * code. */
#ifndef LOOM_SERVE_EMBED_H
#define LOOM_SERVE_EMBED_H

#include "serve/job.h"

/* Its run parses the body, runs every input through the engine and
 * returns the response body (or an OpenAI error body), with its HTTP
 * status. */
extern const api_endpoint fmt_embeddings;

#endif
