/* common.h - small pieces every part of libidem uses.
 *
 * A growable byte buffer, time, and the per-handle error detail. Kept
 * apart from store.h so that key generation and codecs, which know nothing
 * of stores, can use them too. */
#ifndef IDEM_COMMON_H
#define IDEM_COMMON_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "idem/idem.h"

#define IDEM__PRINTF(a, b) __attribute__((format(printf, a, b)))

/* A growable byte buffer. Invariant: len <= cap; data is NULL iff cap is 0.
 * Growth never loses the contents: on ENOMEM the buffer is unchanged. */
typedef struct idem__buf {
    unsigned char *data;
    size_t len, cap;
} idem__buf;

/* Make room for `more` bytes past len. 0 or IDEM_ENOMEM. */
int idem__buf_reserve(idem__buf *b, size_t more);
/* Append n bytes (reserving first). 0 or IDEM_ENOMEM. */
int idem__buf_append(idem__buf *b, const void *p, size_t n);
void idem__buf_free(idem__buf *b);

/* A bump allocator whose allocations all live until the next reset: the
 * memory behind data a call hands back to its caller. Blocks are chained;
 * reset keeps the newest block for reuse and frees the rest. */
typedef struct idem__arena {
    struct idem__arena_block *head;
} idem__arena;

/* n bytes aligned to 8, valid until reset/free; NULL on ENOMEM. */
void *idem__arena_alloc(idem__arena *a, size_t n);
void idem__arena_reset(idem__arena *a);
void idem__arena_free(idem__arena *a);

/* Wall-clock Unix milliseconds. */
int64_t idem__wall_ms(void);
/* Wall-clock Unix microseconds. */
int64_t idem__wall_us(void);
/* Monotonic nanoseconds, for measuring. */
uint64_t idem__mono_ns(void);
/* Monotonic milliseconds, for deadlines. */
int64_t idem__mono_ms(void);
/* Sleep ms milliseconds (nothing if ms <= 0). A signal does not cut the
 * sleep short: callers plan renewals and deadlines by it. */
void idem__sleep_ms(int64_t ms);

/* Copy the string src into dst of cap > 0 bytes, cut to fit, always
 * terminated: for messages, where a cut is better than a failure. */
void idem__scopy(char *dst, size_t cap, const char *src);

/* An array p of *cap elements of size bytes that holds n, with room for
 * one more: p itself, or when full p grown by doubling (from `first`)
 * with *cap updated. NULL on ENOMEM, p and *cap then unchanged. */
void *idem__grow(void *p, size_t n, size_t *cap, size_t size, size_t first);

/* Duplicate a string with malloc (the library's own, so tests can fail
 * it). NULL on ENOMEM. */
char *idem__strdup(const char *s);

/* The value of hex digit c (either case), or -1. */
int idem__hexval(int c);

/* Fill buf with n bytes from getrandom(2). 0 or IDEM_EIO. */
int idem__random_bytes(void *buf, size_t n);

/* Start a thread of the library's with every signal blocked, so that
 * signals keep going to the caller's threads, which expect them. 0, or
 * -1 when no thread could be had. */
int idem__thread_start(pthread_t *t, void *(*fn)(void *), void *arg);

#endif
