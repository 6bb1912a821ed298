/* recjson.h - a record as one JSON line, and back (get, dump, load). */
#ifndef IDEM_RECJSON_H
#define IDEM_RECJSON_H

#include "cli.h"

/* Append key's record as one JSON object and a newline. */
int rec_to_json(cli_buf *b, const void *key, size_t keylen,
                const idem_record *r);

/* Parse one line written by rec_to_json(), every byte of the key and
 * response kept (NUL included), and check that it is a record a store can
 * hold: known fields only, each once and of its type; times and token in
 * range. Key and data point into *scratch (freed by the caller with
 * cli_buf_free). 0, or -1 with a one-line message in err that names the
 * field: `field "fingerprint": must be 32 hex digits; ...`; *col is the
 * column (from 1) of a JSON syntax error, 0 for a field's. */
int rec_from_json(const char *line, size_t len, cli_buf *scratch,
                  const void **key, size_t *keylen, idem_record *r,
                  char *err, size_t errlen, size_t *col);

#endif
