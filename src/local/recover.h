/* recover.h - rebuilding state from the segments; check and repair. */
#ifndef IDEM_RECOVER_H
#define IDEM_RECOVER_H

#include "log.h"
#include "record.h"

/* How many frames recovery hands over at once. */
#define IDEM__APPLY_WINDOW 32

/* Called with up to IDEM__APPLY_WINDOW committed frames at a time (f[i]
 * at offset off[i] of g), oldest first, while a store opens. Handing over
 * a window lets the index load the cache lines of many keys at once. */
typedef int (*idem__apply_fn)(void *ctx, idem__seg *g, const uint32_t *off,
                              const idem__frame *f, size_t n);

/* Called once before the first apply with the number of key frames
 * about to be applied (an upper bound on the keys). */
typedef int (*idem__reserve_fn)(void *ctx, uint64_t records);

/* Load every segment of lg->dir into lg (lg->dirfd is open and locked),
 * verifying every segment first, then calling reserve once and apply
 * for the committed frames. A torn
 * tail of the newest segment is cut at its last commit; damage anywhere
 * else is IDEM_ECORRUPT with the file and offset in the detail. Leaves an
 * active segment ready for appends. Segments up to the newest sealed one
 * with a key index file (cold.h) are cold: opened with their index, which
 * is built again when it does not check out, and neither verified frame
 * by frame nor applied; lg->secret must be set. */
int idem__recover(idem__log *lg, int64_t now, idem__apply_fn apply,
                  idem__reserve_fn reserve, void *ctx);

/* A reader's walk is over (lg->readonly): 1 when a segment it read is no
 * longer the file its name holds, unless the writer dropped it; a repair
 * renumbered segments under the reader, whose view may miss one. */
int idem__log_renumbered(idem__log *lg);

/* The local: backend's check (struct idem__backend): verify, or repair,
 * the directory that rest names without opening the store, which may be
 * too damaged to open. s only carries the detail. */
int idem__local_check(idem_store *s, const char *rest, int repair,
                      idem_check_report *r);

#endif
