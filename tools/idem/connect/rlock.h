/* rlock.h - one run of a job at a time, on the server of its stream
 * output (rlock.c says why there). */
#ifndef IDEM_RLOCK_H
#define IDEM_RLOCK_H

#include <stdint.h>

#include "rconn.h"

typedef struct rs_lock rs_lock;

/* Take the lock of job (its checkpoint's name) on u's server, held for
 * lease_ms at a time and renewed by a thread of its own until
 * rs_lock_drop(). Refused while another live run holds it. 0 with *out
 * set, or an exit status after saying why. */
int rs_lock_take(const char *cmd, const rs_uri *u, const char *job,
                 int64_t lease_ms, rs_lock **out);
/* Was the lock lost (not renewed in time, and taken by another run)?
 * Then nothing more may be written for the job. */
int rs_lock_lost(const rs_lock *l);
/* Stop renewing, and give the lock back if it is still ours. NULL: no
 * lock. */
void rs_lock_drop(rs_lock *l);

#endif
