/* recover.h - rebuilding state from the segments; check and repair. */
#ifndef IDEM_RECOVER_H
#define IDEM_RECOVER_H

#include "log.h"
#include "record.h"

/* Called for each committed frame, oldest first, while a store opens. */
typedef int (*idem__apply_fn)(void *ctx, idem__seg *g, uint32_t off,
                              const idem__frame *f);

/* Load every segment of lg->dir into lg (lg->dirfd is open and locked),
 * verifying each frame and calling apply for the committed ones. A torn
 * tail of the newest segment is cut at its last commit; damage anywhere
 * else is IDEM_ECORRUPT with the file and offset in the detail. Leaves an
 * active segment ready for appends. */
int idem__recover(idem__log *lg, int64_t now, idem__apply_fn apply,
                  void *ctx);

#endif
