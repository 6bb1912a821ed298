/* bench/keys36.h - the benchmark key stream, shared by `idem bench` and
 * the reference programs so that every system sees the same keys.
 *
 * Key i is 36 bytes like a printed UUID: random (splitmix64 of i, so
 * making a key costs next to nothing and the stream can be replayed) or
 * ordered (a zero-padded counter). */
#ifndef IDEM_BENCH_KEYS36_H
#define IDEM_BENCH_KEYS36_H

#include <stdint.h>
#include <stdio.h>

#define BENCH_KEYLEN 36

static inline uint64_t bench_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Write key i (BENCH_KEYLEN bytes, then a NUL) to k. */
static inline void bench_key(int random, size_t i, char *k)
{
    static const char hex[] = "0123456789abcdef";
    if (!random) {
        snprintf(k, BENCH_KEYLEN + 1, "%036zu", i);
        return;
    }
    uint64_t x = (uint64_t)i * 0x2545f4914f6cdd1du;
    uint64_t w[3] = {bench_splitmix(&x), bench_splitmix(&x),
                     bench_splitmix(&x)};
    for (int j = 0; j < BENCH_KEYLEN; j++) {
        k[j] = hex[w[j / 16] & 15];
        w[j / 16] >>= 4;
    }
    k[8] = k[13] = k[18] = k[23] = '-';
    k[BENCH_KEYLEN] = '\0';
}

#endif
