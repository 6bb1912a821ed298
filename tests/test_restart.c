/* tests/test_restart.c - ten million keys survive a close and reopen.
 *
 * IDEM_RESTART_KEYS changes the count (the ASan run uses fewer: the
 * sanitizer's shadow memory makes ten million slow, not wrong). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { BATCH = 10000 };

static void key_of(char *k, size_t i)
{
    snprintf(k, 24, "restart-%015zu", i);
}

Test(restart, ten_million_keys, .timeout = 900)
{
    const char *env = getenv("IDEM_RESTART_KEYS");
    size_t n = env ? strtoul(env, NULL, 10) : 10000000;
    char *dir = t_tmpdir();
    static char names[BATCH][24];
    static idem_key keys[BATCH];
    static idem_outcome outs[BATCH];
    idem_store *s = t_open(t_local_uri(dir));
    for (size_t i = 0; i < n; i += BATCH) {
        size_t m = n - i < BATCH ? n - i : BATCH;
        for (size_t j = 0; j < m; j++) {
            key_of(names[j], i + j);
            keys[j] = (idem_key){names[j], 23, NULL};
        }
        cr_assert_eq(idem_claim_many(s, keys, m, NULL, outs, 0), 0);
    }
    cr_assert_eq(idem_close(s), 0);
    s = t_open(t_local_uri(dir));
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_eq(st.live_keys, n);
    cr_assert_eq(st.pending, n);
    for (size_t i = 0; i < n; i += BATCH) {
        size_t m = n - i < BATCH ? n - i : BATCH;
        for (size_t j = 0; j < m; j++) {
            key_of(names[j], i + j);
            keys[j] = (idem_key){names[j], 23, NULL};
        }
        cr_assert_eq(idem_claim_many(s, keys, m, NULL, outs, IDEM_NOSYNC),
                     0);
        for (size_t j = 0; j < m; j++)
            cr_assert_eq(outs[j].kind, IDEM_BUSY, "%s", names[j]);
    }
    char absent[24];
    key_of(absent, n);
    idem_record r;
    cr_assert_eq(idem_get(s, absent, 23, &r), IDEM_ENOTFOUND);
    idem_close(s);
    t_rmdir(dir);
    free(dir);
}
