/* linehash.h - --line-hash: a line's key is its SHA-256, in hex. */
#ifndef IDEM_LINEHASH_H
#define IDEM_LINEHASH_H

#include <stddef.h>

#include "idem/idem.h"
#include "idem/keys.h"

#define LH_KEY_LEN 64u  /* the key: SHA-256 in lowercase hex */

/* A hasher for one thread, or NULL after saying why ("idem CMD: ..."). */
idem_bizkey_gen *lh_new(const char *cmd);

/* Write the key of line[0..n) to key (LH_KEY_LEN bytes, no NUL): 0, or 1
 * after saying why it failed. */
int lh_key(idem_bizkey_gen *g, const char *cmd, const char *line, size_t n,
           char key[LH_KEY_LEN]);

#endif
