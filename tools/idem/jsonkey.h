/* jsonkey.h - find the idempotency key in one JSON line. */
#ifndef IDEM_JSONKEY_H
#define IDEM_JSONKEY_H

#include <stddef.h>

/* A key path: "event_id", a dotted path "user.id", or a JSON Pointer
 * "/user/id" (RFC 6901: ~1 is '/', ~0 is '~'). A segment of digits also
 * indexes an array ("items.0.id"). */
typedef struct jk_path {
    char **seg;
    size_t *len;
    size_t n;
    const char *spec;   /* as given, for messages */
} jk_path;

/* 0, or -1 with a message in err (an empty segment, say). p keeps spec
 * (for messages). */
int jk_path_parse(const char *spec, jk_path *p, char *err, size_t errlen);
void jk_path_free(jk_path *p);

typedef enum jk_result {
    JK_OK = 0,      /* *key holds the key */
    JK_MISSING,     /* valid JSON without the field */
    JK_NOT_SCALAR,  /* the field is an object, array, bool or null */
    JK_BAD_JSON     /* not one valid JSON value: see jk_error() */
} jk_result;

typedef struct jk jk;

jk *jk_new(const jk_path *path);
void jk_free(jk *x);

/* Parse line[0..len) (without its newline) completely and find the
 * path's value: a string's decoded bytes, or a number's text as written.
 * When a field appears twice in one object the last one counts, as in
 * most JSON readers. *key stays valid until the next call. */
jk_result jk_extract(jk *x, const char *line, size_t len, const char **key,
                     size_t *keylen);

/* After JK_BAD_JSON: the parser's message and the 1-based column
 * (in characters) where it stopped; after JK_NOT_SCALAR: the type found.
 * A key (or a member name on its path) holding an escape that denotes no
 * character is JK_BAD_JSON too, at the escape's column. */
const char *jk_error(const jk *x);
size_t jk_column(const jk *x);

/* For YAJL callers: the string whose closing quote is line[end] (YAJL's
 * bytes consumed, minus one, in a string callback) as written, escapes
 * undecoded. Returns the offset in line of its first \u escape that
 * denotes no character (a UTF-16 surrogate outside a high-low pair, which
 * YAJL would decode to '?' or to another character), or 0 if there is
 * none (an escape is never a string's first byte: its quote is). */
size_t jk_bad_escape(const char *line, size_t end);

#endif
