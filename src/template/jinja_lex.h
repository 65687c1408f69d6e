/* template/jinja_lex: the lexer of the Jinja engine (jinja_lex.c): template
 * source to the tokens the parser (jinja_parse.c) reads. Not for use outside
 * src/template. */
#ifndef LOOM_TEMPLATE_JINJA_LEX_H
#define LOOM_TEMPLATE_JINJA_LEX_H

#include "template/jinja_int.h"

#define jinja_lex loom_jinja_jinja_lex
#define jinja_syntax_err loom_jinja_jinja_syntax_err

enum {
    T_EOF, T_TEXT, T_BLOCK_BEGIN, T_BLOCK_END, T_VAR_BEGIN, T_VAR_END,
    T_NAME, T_STRING, T_INT, T_FLOAT, T_OP,
};

typedef struct tok {
    int type;
    int line;
    const char *s;     /* text / name / operator / decoded string */
    size_t n;
    int64_t i;
    double f;
} tok;

/* Splits len bytes of template source into tokens, the last one T_EOF.
 * Newlines are normalised and one trailing newline dropped first, in a copy
 * in the arena that the tokens' text points into. *toks (heap: free() it,
 * on failure too) gets *n tokens. A syntax error is LOOM_ERR_FORMAT naming
 * the line. */
loom_status jinja_lex(jarena *a, const char *src, size_t len, tok **toks, size_t *n);

/* Sets *st to the syntax error "template line N: ..." unless it holds an
 * error already; returns *st. */
loom_status jinja_syntax_err(loom_status *st, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
