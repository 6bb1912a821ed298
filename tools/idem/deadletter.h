/* deadletter.h - poison messages set aside in the --dead-letter file. */
#ifndef IDEM_DEADLETTER_H
#define IDEM_DEADLETTER_H

#include "cli.h"
#include "keyspace.h"

typedef struct dl_entry dl_entry;

typedef struct dead_letters {
    const char *path;       /* NULL: no --dead-letter */
    int fd;
    int line_mode;          /* messages are text, not JSON */
    const key_space *ks;
    dl_entry **keys;        /* the keys of ks in the file, sorted */
    size_t n, cap;
    cli_buf line;
} dead_letters;

/* Open (or create, 0600) d->path for appending and load the keys its
 * lines name in key space ks. 0, or an exit status after saying why. */
int dl_open(dead_letters *d, const char *cmd, const key_space *ks);

/* The error the file gives for key (as the job gave it), or NULL when
 * the key is not in it; *len its length. */
const char *dl_find(const dead_letters *d, const void *key, size_t keylen,
                    size_t *len);

/* Append the line of a message set aside after `attempts` handler faults
 * whose last one was err (made valid UTF-8 first), make it durable, and
 * remember its key. 0, or 1 after saying why. */
int dl_add(dead_letters *d, const char *cmd, const void *key, size_t keylen,
           const void *msg, size_t msglen, uint32_t attempts,
           const char *err);

void dl_close(dead_letters *d);

#endif
