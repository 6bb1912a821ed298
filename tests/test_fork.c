/* tests/test_fork.c - a handle copied into a fork child writes nothing.
 *
 * A real process (tests/progs/forker.c) claims a key, forks, and
 * completes and syncs the key in the parent; then the child uses its
 * copy of the handle, or just exits through an atexit handler that closes
 * it. The child's calls must fail, its close must write nothing, and
 * after a reopen the parent's completion must stand. */
#include <stdlib.h>
#include <string.h>

#include "common.h"

TestSuite(fork, .init = t_dir_init, .fini = t_dir_fini, .timeout = 60);

static int forker(const char *uri, const char *mode)
{
    return t_sh("'%s/forker' '%s' %s", getenv("IDEM_PROGS"), uri, mode);
}

/* After the forker ran on t_dir: "k" is DONE with the parent's response,
 * "c" (claimed only in the child) is absent, and the store checks clean. */
static void expect_parent_won(void)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    idem_record r;
    cr_assert_eq(idem_get(s, "k", 1, &r), 0, "%s", idem_errdetail(s));
    cr_assert_eq(r.state, IDEM_STATE_DONE, "k is %d", (int)r.state);
    cr_assert(r.len == 6 && memcmp(r.data, "parent", 6) == 0);
    cr_assert_eq(idem_get(s, "c", 1, &r), IDEM_ENOTFOUND);
    cr_assert_eq(idem_close(s), 0);
    cr_assert_eq(idem_check(t_local_uri(t_dir), NULL), 0);
}

Test(fork, child_calls_fail_and_its_close_writes_nothing)
{
    cr_assert_eq(forker(t_local_uri(t_dir), "calls"), 0);
    expect_parent_won();
}

Test(fork, child_exiting_through_atexit_close_writes_nothing)
{
    cr_assert_eq(forker(t_local_uri(t_dir), "atexit"), 0);
    expect_parent_won();
}

Test(fork, mem_child_calls_fail)
{
    cr_assert_eq(forker("mem:", "calls"), 0);
    cr_assert_eq(forker("mem:", "atexit"), 0);
}
