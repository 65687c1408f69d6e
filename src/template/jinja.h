/* template/jinja: a Jinja2 template engine, enough of it for Hugging Face
 * chat templates. Internal to loom; the chat layer (template/chat.h) is the
 * usual entry point.
 *
 * The environment matches what transformers compiles chat templates with:
 * trim_blocks and lstrip_blocks on, one trailing newline of the source
 * dropped, loop controls (break/continue) enabled, the `generation` block
 * rendered transparently, tojson as json.dumps(ensure_ascii=False) and the
 * globals raise_exception(), strftime_now(), range(), namespace(), dict().
 *
 * Values follow Python: printing a list gives its repr with single quotes,
 * None prints "None", an undefined variable prints as "" and is falsy. */
#ifndef LOOM_TEMPLATE_JINJA_H
#define LOOM_TEMPLATE_JINJA_H

#include <stddef.h>

#include "loom.h"

/* A compiled template; rendering does not modify it, so one template may be
 * rendered by several threads at once. */
typedef struct loom_jinja_template loom_jinja_template;

/* Compiles template source (len bytes; need not be NUL-terminated). On a
 * syntax error returns LOOM_ERR_FORMAT with a message naming the line
 * ("template line 3: expected 'endif', found end of template"); *out is NULL
 * then. */
loom_status loom_jinja_compile(const char *src, size_t len,
                               loom_jinja_template **out);
void loom_jinja_free(loom_jinja_template *t);

/* Renders with the variables of vars_json, a JSON object text ("{}" or NULL
 * for none). JSON integers stay integers and key order is kept, as Python's
 * json.loads would. On success *out is a NUL-terminated heap string (free
 * with free()) and *out_len its length (out_len may be NULL).
 *
 * Errors: LOOM_ERR_INVALID_ARG when vars_json is not a JSON object, or when
 * the template fails at render time: a raise_exception("msg") call (the
 * error message is then exactly msg) or an evaluation error such as an
 * attribute of an undefined value (message names the template line).
 * Templates never crash the process; runaway loops are cut off by an output
 * limit and a step limit. */
loom_status loom_jinja_render(const loom_jinja_template *t,
                              const char *vars_json, char **out,
                              size_t *out_len);

/* Non-zero if the last failed render on this thread came from the template's
 * own raise_exception() call (a rejected input, not a broken template). */
int loom_jinja_last_error_raised(void);

#endif
