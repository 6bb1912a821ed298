/* dir.h - the store directory: its lock, its identity file, its segments.
 *
 *   PATH/LOCK              flock()ed by the process holding the store;
 *                          holds that process's pid, for the error message
 *   PATH/IDEM              format version and the index hash secret
 *   PATH/TAIL              where the log ended when it was last sealed
 *   PATH/seg-00000001.log  segments, oldest first */
#ifndef IDEM_DIR_H
#define IDEM_DIR_H

#include <stdint.h>

#include "store.h"

#define IDEM__SECRET_LEN 192
#define IDEM__TAIL "TAIL"

/* How idem__dir_open() opens a store directory. */
#define IDEM__DIR_NOCREATE 1u  /* IDEM_ENOTFOUND when it is not there */
#define IDEM__DIR_GROUP 2u     /* create it 0750, not 0700 */
#define IDEM__DIR_NOLOCK 4u    /* a reader: take no lock, write nothing */
#define IDEM__DIR_REPAIR 8u    /* a repair: PATH/LOCK says so beside the
                                * pid, for readers (idem__dir_repairing) */

/* The engine's size parameters of a local: URI (docs/uri.md). */
typedef struct idem__dir_knobs {
    uint64_t hot;       /* hot=SIZE: RAM for the index of hot keys */
    int hot_set;
    uint64_t segment;   /* segment=SIZE: seal segments past this; 0 unset */
} idem__dir_knobs;

/* What follows "local:": the directory (*path, malloc'ed) and the
 * parameters after a '?': mode=group or mode=private added to *how,
 * hot= and segment= into *knobs (may be NULL). IDEM_EINVAL names a
 * parameter it does not know. */
int idem__dir_uri(idem_store *s, const char *rest, char **path,
                  unsigned *how, idem__dir_knobs *knobs);

/* Open (creating as how says) the directory and lock it, unless
 * IDEM__DIR_NOLOCK. *dirfd, *lockfd (-1 without a lock) are set on
 * success. IDEM_ELOCKED names the holder. */
int idem__dir_open(idem_store *s, const char *path, unsigned how,
                   int *dirfd, int *lockfd);

/* Create (or open, as flags say) the file name in the store directory
 * with the store's file mode: 0600, or 0640 when the directory lets its
 * group in. A file descriptor, or -1 with errno. */
int idem__dir_create(int dirfd, const char *name, int flags);

/* Set s->warning when users other than the owner and the group can read
 * a file of the store at dirfd (see idem_warning()). */
void idem__dir_warn_open(idem_store *s, int dirfd, const char *path);

/* Read the secret from PATH/IDEM, creating the file if it is missing
 * (unless nocreate: then IDEM_ENOTFOUND, "not an idem store"). Missing
 * beside segments it is damage: IDEM_ECORRUPT, whatever nocreate. */
int idem__dir_secret(idem_store *s, int dirfd, const char *path,
                     int nocreate, unsigned char secret[IDEM__SECRET_LEN]);
/* Write a new PATH/IDEM with a new secret (repair of a lost one). */
int idem__dir_meta_create(idem_store *s, int dirfd, const char *path,
                          unsigned char *secret);

/* The numbers of the files named PREFIX + 8 digits + SUFFIX (4
 * characters each: "grp-", ".kgf"), sorted. *ids is malloc'ed (may be
 * NULL when *n is 0). */
int idem__dir_ids(idem_store *s, int dirfd, const char *path,
                  const char *prefix, const char *suffix, uint32_t **ids,
                  size_t *n);

/* The ids of the segment files, sorted. *ids is malloc'ed (may be NULL
 * when *n is 0). */
int idem__dir_segments(idem_store *s, int dirfd, const char *path,
                       uint32_t **ids, size_t *n);

/* What PATH/TAIL says: segments first..last existed, and bytes [0, end)
 * of segment last held committed groups only, all durable. */
typedef struct idem__tail {
    uint32_t first;
    uint32_t last;
    uint64_t end;
} idem__tail;

/* Read PATH/TAIL into *t. IDEM_ENOTFOUND (no detail) when there is none;
 * IDEM_ECORRUPT or IDEM_EVERSION with the detail. */
int idem__dir_tail_read(idem_store *s, int dirfd, const char *path,
                        idem__tail *t);

/* Replace PATH/name with len bytes, whole or not at all: temporary
 * file, fsync, rename, directory fsync. */
int idem__dir_replace(idem_store *s, int dirfd, const char *path,
                      const char *name, const void *data, size_t len);

/* The same with the bytes in n pieces, of any size (a write may take
 * less than it was given: the rest is written after it). */
struct iovec;
int idem__dir_replace_v(idem_store *s, int dirfd, const char *path,
                        const char *name, const struct iovec *iov, int n);

/* The same without a store, for a thread of its own (coldjob.h): 0, or
 * the errno of the step that failed, which idem__dir_put_failed() words
 * as the store's error. */
int idem__dir_put(int dirfd, const char *name, const struct iovec *iov,
                  int n);
int idem__dir_put_failed(idem_store *s, const char *path, const char *name,
                         int err);

/* Does a repair hold the store? PATH/LOCK must say so, and be held: asked
 * of the kernel's table of locks (/proc/locks), not by taking a lock,
 * which would turn a writer starting at that instant away. 0 when it
 * cannot tell (a reader in a pid namespace of its own sees no lock of a
 * process outside it). */
int idem__dir_repairing(int dirfd);

/* Replace PATH/TAIL with *t, durably (see dir.c). */
int idem__dir_tail_write(idem_store *s, int dirfd, const char *path,
                         const idem__tail *t);

#endif
