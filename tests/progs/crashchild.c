/* tests/progs/crashchild.c - a worker for the crash test, killed at
 * random moments.
 *
 * usage: crashchild DIR BATCH
 *
 * Forever: resume at the batch number the store's checkpoint "next" says,
 * claim BATCH keys "b<batch>-<i>", complete each with the response
 * "resp-b<batch>-<i>", store checkpoint next=batch+1 and sync: all in one
 * commit. After each sync returns, print the batch number on stdout: from
 * then on the parent may rely on it being durable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"

static unsigned long next_batch(idem_store *s)
{
    const void *b;
    size_t n;
    char buf[32];
    if (idem_checkpoint_get(s, "next", &b, &n) != 0 || n >= sizeof buf)
        return 0;
    memcpy(buf, b, n);
    buf[n] = '\0';
    return strtoul(buf, NULL, 10);
}

static int run_batch(idem_store *s, unsigned long b, size_t n)
{
    char (*names)[40] = malloc(n * sizeof *names);
    char (*resps)[48] = malloc(n * sizeof *resps);
    idem_key *keys = malloc(n * sizeof *keys);
    idem_outcome *outs = malloc(n * sizeof *outs);
    idem_completion *done = malloc(n * sizeof *done);
    int *st = malloc(n * sizeof *st);
    if (!names || !resps || !keys || !outs || !done || !st)
        return 1;
    for (size_t i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "b%lu-%zu", b, i);
        snprintf(resps[i], sizeof resps[i], "resp-b%lu-%zu", b, i);
        keys[i] = (idem_key){names[i], strlen(names[i]), NULL};
    }
    int rc = idem_claim_many(s, keys, n, NULL, outs, IDEM_NOSYNC);
    size_t m = 0;
    for (size_t i = 0; !rc && i < n; i++)
        if (outs[i].kind == IDEM_NEW)
            done[m++] = (idem_completion){names[i], strlen(names[i]),
                                          outs[i].token, resps[i],
                                          strlen(resps[i]), 0};
    char next[32];
    int len = snprintf(next, sizeof next, "%lu", b + 1);
    if (!rc)
        rc = idem_checkpoint_put(s, "next", next, (size_t)len);
    if (!rc)
        rc = idem_complete_many(s, done, m, st, 0);
    free(names);
    free(resps);
    free(keys);
    free(outs);
    free(done);
    free(st);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    char uri[4200];
    snprintf(uri, sizeof uri, "local:%s", argv[1]);
    size_t batch = strtoul(argv[2], NULL, 10);
    idem_opts o;
    idem_opts_init(&o);
    o.segment_bytes = 256 * 1024;  /* many segments: rollover under fire */
    idem_store *s;
    int rc = idem_open(uri, &o, &s);
    if (rc) {
        fprintf(stderr, "crashchild: %s\n", idem_errdetail(s));
        return 1;
    }
    for (unsigned long b = next_batch(s);; b++) {
        rc = run_batch(s, b, batch);
        if (rc) {
            fprintf(stderr, "crashchild: %s\n", idem_errdetail(s));
            return 1;
        }
        printf("%lu\n", b);
        fflush(stdout);
    }
}
