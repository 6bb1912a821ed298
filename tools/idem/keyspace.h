/* keyspace.h - the key spaces of CLI jobs: whose key a stored key is. */
#ifndef IDEM_KEYSPACE_H
#define IDEM_KEYSPACE_H

#include "cli.h"

#define KS_NAME_MAX 200u  /* bytes in a key space's name */

/* A key space: its name and the prefix its keys are stored under. */
typedef struct key_space {
    const char *name;               /* NULL: the shared key space */
    char prefix[KS_NAME_MAX + 2];   /* US NAME US (keyspace.c) */
    size_t len;                     /* of prefix; 0 when shared */
} key_space;

/* Name the key space (NULL: the shared one). -1 if the name is not 1 to
 * KS_NAME_MAX bytes of UTF-8 text without control characters. ks keeps
 * the pointer. */
int ks_set(key_space *ks, const char *name);

/* If a key of klen bytes does not fit in ks, say why in what (for a
 * "FILE:LINE:COL: " message) and return 1; else 0. */
int ks_bad_size(const key_space *ks, size_t klen, char *what, size_t n);

/* Append the stored form of key to b: 0, or -1 when out of memory. */
int ks_add(cli_buf *b, const key_space *ks, const void *key, size_t len);

/* Split a stored key into its key space (*name NULL: shared; else
 * *namelen bytes, not NUL-terminated) and the key as a job gave it. */
void ks_split(const void *stored, size_t len, const char **name,
              size_t *namelen, const void **key, size_t *keylen);

/* Call fn over tasks whose keys are stored in ks, as the handler must see
 * them: without the prefix (restored before returning, for the runner). */
int ks_handle(const key_space *ks, idem_handler_fn fn, void *ctx,
              idem_task *tasks, size_t n);

/* m with its key as the job gave it, for output lines. */
idem_msg ks_user_msg(const key_space *ks, const idem_msg *m);

/* Is the key space named name[0..len) (NULL: shared) this one? */
int ks_is(const key_space *ks, const char *name, size_t len);

/* KEY (keylen bytes) as given to `idem get`/`forget` in key space `name`
 * (NULL: the shared one): its stored form into b (emptied first); 0, or
 * an exit status after saying what is wrong. */
int ks_key_arg(const char *cmd, const char *name, const char *key,
               size_t keylen,
               cli_buf *b);

/* Say that KEY has no live record in key space `name` (NULL: shared);
 * returns 1. */
int ks_not_found(const char *cmd, const char *name, const char *key);

#endif
