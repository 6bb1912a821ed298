/* common.c - buffers, clocks, strings: the plumbing under everything.
 *
 * The buffer grows by doubling so that appending a record is amortised
 * O(1); its failure leaves the contents intact, which is what lets a
 * failed append report ENOMEM without a half-written record. */
#include "common.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

int idem__buf_reserve(idem__buf *b, size_t more)
{
    if (more <= b->cap - b->len)
        return 0;
    if (more > SIZE_MAX / 2 - b->len)
        return IDEM_ENOMEM;
    size_t want = b->len + more, cap = b->cap ? b->cap : 256;
    while (cap < want)
        cap *= 2;
    unsigned char *p = realloc(b->data, cap);
    if (!p)
        return IDEM_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

int idem__buf_append(idem__buf *b, const void *p, size_t n)
{
    int rc = idem__buf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

void idem__buf_free(idem__buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

struct idem__arena_block {
    struct idem__arena_block *next;
    size_t used, size;
    unsigned char data[];
};

void *idem__arena_alloc(idem__arena *a, size_t n)
{
    n = (n + 7) & ~(size_t)7;
    struct idem__arena_block *b = a->head;
    if (!b || b->size - b->used < n) {
        size_t size = n > 65536 ? n : 65536;
        if (size > SIZE_MAX - sizeof *b)
            return NULL;
        b = malloc(sizeof *b + size);
        if (!b)
            return NULL;
        b->next = a->head;
        b->used = 0;
        b->size = size;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

void idem__arena_reset(idem__arena *a)
{
    if (!a->head)
        return;
    struct idem__arena_block *keep = a->head, *b = keep->next;
    while (b) {
        struct idem__arena_block *next = b->next;
        free(b);
        b = next;
    }
    keep->next = NULL;
    keep->used = 0;
}

void idem__arena_free(idem__arena *a)
{
    idem__arena_reset(a);
    free(a->head);
    a->head = NULL;
}

int64_t idem__wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t idem__wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

uint64_t idem__mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t idem__mono_ms(void)
{
    return (int64_t)(idem__mono_ns() / 1000000u);
}

void idem__sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    /* nanosleep leaves in ts what is left when a signal interrupts it. */
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void idem__scopy(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

void *idem__grow(void *p, size_t n, size_t *cap, size_t size, size_t first)
{
    if (n < *cap)
        return p;
    size_t want = *cap ? *cap * 2 : first;
    if (want <= *cap || want > SIZE_MAX / size)
        return NULL;
    void *q = realloc(p, want * size);
    if (q)
        *cap = want;
    return q;
}

char *idem__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

int idem__hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int idem__random_bytes(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return IDEM_EIO;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int idem__thread_start(pthread_t *t, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc == 0 ? 0 : -1;
}
