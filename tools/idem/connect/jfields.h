/* jfields.h - a JSON line's top-level members, as a sink writes them.
 *
 * A Redis Stream entry takes them as its fields; a NATS read-back finds
 * a run's status and result among them. Names and string values are
 * decoded, any other value kept as its JSON text. */
#ifndef IDEM_JFIELDS_H
#define IDEM_JFIELDS_H

#include <stddef.h>
#include <yajl/yajl_parse.h>

#include "cli.h"

typedef struct jfields {
    cli_buf buf;
    size_t *off, *len, nf, capf;  /* names and values in turn, in buf */
    int depth;
    size_t vstart;
    const char *text;
    yajl_handle y;
} jfields;

/* The members of text[0..len): 1 when it is one JSON object, else 0
 * with no fields; -1 out of memory. */
int jf_parse(jfields *f, const char *text, size_t len);
/* One more field (a name or a value). 0 or -1. */
int jf_push(jfields *f, const void *p, size_t n);
/* The index of the value of member `name`, or -1. */
long jf_find(const jfields *f, const char *name);
void jf_free(jfields *f);

#endif
