/* test_keys_faults.c - the key generators under failed allocations and
 * failed syncs (tests/fault.c): errors come back, nothing leaks, nothing
 * is issued that the state file does not cover. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

static int64_t fixed_clock(void *ctx)
{
    return *(int64_t *)ctx;
}

Test(keys_faults, out_of_memory_in_constructors, .timeout = 10)
{
    idem_uuid7_gen *u = (idem_uuid7_gen *)1;
    t_fail_alloc_after = 0;
    cr_assert_eq(idem_uuid7_gen_new(NULL, &u), IDEM_ENOMEM);
    cr_assert_null(u);

    idem_bizkey_gen *b = (idem_bizkey_gen *)1;
    t_fail_alloc_after = 0;
    cr_assert_eq(idem_bizkey_gen_new(NULL, &b), IDEM_ENOMEM);
    cr_assert_null(b);

    idem_snowflake *s = (idem_snowflake *)1;
    t_fail_alloc_after = 0;
    cr_assert_eq(idem_snowflake_new(NULL, &s), IDEM_ENOMEM);
    cr_assert_null(s);

    /* The state file's name is copied: that allocation failing leaves a
     * closed handle that explains itself. */
    char *dir = t_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/sf.state", dir);
    idem_snowflake_opts o;
    idem_snowflake_opts_init(&o);
    o.state_file = path;
    t_fail_alloc_after = 1;
    cr_assert_eq(idem_snowflake_new(&o, &s), IDEM_ENOMEM);
    cr_assert_not_null(s);
    cr_assert_str_eq(idem_snowflake_errdetail(s), "out of memory");
    uint64_t id;
    cr_assert_eq(idem_snowflake_next(s, &id), IDEM_EINVAL);
    cr_assert_eq(idem_snowflake_free(s), 0);
    t_fail_alloc_after = -1;
    t_rmdir(dir);
}

/* The mark is synced before the IDs it covers are handed out. */
Test(keys_faults, failed_sync_of_the_mark_issues_nothing, .timeout = 10)
{
    char *dir = t_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/sf.state", dir);
    int64_t now = 1750000000000;
    idem_snowflake_opts o;
    idem_snowflake_opts_init(&o);
    o.state_file = path;
    o.clock = fixed_clock;
    o.clock_ctx = &now;
    idem_snowflake *g;
    cr_assert_eq(idem_snowflake_new(&o, &g), 0);
    uint64_t id = 7;
    t_fail_sync_after = 0;
    cr_assert_eq(idem_snowflake_next(g, &id), IDEM_EIO);
    cr_assert_eq(id, 7u, "no ID without a durable mark");
    cr_assert(strstr(idem_snowflake_errdetail(g), "fdatasync"), "%s",
              idem_snowflake_errdetail(g));
    /* The generator recovers once the disk does. */
    cr_assert_eq(idem_snowflake_next(g, &id), 0);
    uint64_t first = id;
    /* A failed write at close: reported; the reserved mark stays. */
    t_fail_write_after = 0;
    cr_assert_eq(idem_snowflake_free(g), IDEM_EIO);
    t_fail_write_after = -1;
    now += 300; /* past the reserve: nothing to wait for */
    cr_assert_eq(idem_snowflake_new(&o, &g), 0);
    cr_assert_eq(idem_snowflake_next(g, &id), 0, "%s",
                 idem_snowflake_errdetail(g));
    cr_assert_gt(id, first);
    cr_assert_eq(idem_snowflake_free(g), 0);
    t_rmdir(dir);
}

Test(keys_faults, null_pointers_are_einval, .timeout = 10)
{
    uint8_t u[IDEM_UUID_LEN];
    uint64_t id;
    cr_assert_eq(idem_uuid4(NULL), IDEM_EINVAL);
    cr_assert_eq(idem_uuid7(NULL), IDEM_EINVAL);
    cr_assert_eq(idem_uuid7_gen_new(NULL, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_uuid7_gen_next(NULL, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_uuid_parse(NULL, 36, u), IDEM_EINVAL);
    cr_assert_eq(idem_uuid_parse("01936d2b-8c41-7a3f-8e2d-5b7c9a1e3f40", 36,
                                 NULL),
                 IDEM_EINVAL);
    cr_assert_eq(idem_snowflake_new(NULL, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_snowflake_next(NULL, &id), IDEM_EINVAL);
    cr_assert_eq(idem_snowflake_decode(1, 0, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_snowflake_parse("12", 2, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_snowflake_free(NULL), 0);
    cr_assert_eq(idem_bizkey_gen_new(NULL, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_bizkey_gen_make(NULL, "order", "1", "x", 1, NULL, 0,
                                      NULL),
                 IDEM_EINVAL);
    cr_assert_eq(idem_bizkey_parse("order:1:ab", 10, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_fingerprint_sha256("x", 1, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_fingerprint_sha256(NULL, 1, u), IDEM_EINVAL);
    idem_uuid7_gen_free(NULL);
    idem_bizkey_gen_free(NULL);
}
