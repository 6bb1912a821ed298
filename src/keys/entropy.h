/* entropy.h - what the key generators share inside libidem.
 *
 * Only the per-thread entropy buffer: uuid4 and uuid7 both draw random
 * bits from it, and it must be one buffer so that the fork rule (a child
 * never reuses what its parent buffered) is enforced in one place. */
#ifndef IDEM_ENTROPY_H
#define IDEM_ENTROPY_H

#include <stddef.h>

/* Fill out with n <= 256 bytes from the calling thread's buffer of
 * getrandom(2) output, refilling it as needed. 0 or IDEM_EIO (then out is
 * unchanged). Thread-safe; fork-safe. */
int idem__entropy(void *out, size_t n);

#endif
