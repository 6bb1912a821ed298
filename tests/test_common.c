/* test_common.c - the plumbing of src/common.c that the backends and the
 * runner share: a sleep that signals do not cut short, bounded copies. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "store.h" /* src/common.h: tests/common.h has the name */

TestSuite(common, .timeout = 60);

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

/* A process with interval timers or child processes gets signals all the
 * time; a sleep that ended at the first one would renew leases and retry
 * servers early, as often as signals come. */
Test(common, sleep_ms_resumes_after_a_signal)
{
    struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART */
    cr_assert_eq(sigaction(SIGALRM, &sa, NULL), 0);
    struct itimerval every5ms = {{0, 5000}, {0, 5000}};
    cr_assert_eq(setitimer(ITIMER_REAL, &every5ms, NULL), 0);
    uint64_t start = idem__mono_ns();
    idem__sleep_ms(200);
    uint64_t slept_ms = (idem__mono_ns() - start) / 1000000u;
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    cr_assert_gt(alarms, 0, "no signal came during the sleep");
    cr_assert_geq(slept_ms, 200, "slept %llu ms of 200 (%d signals)",
                  (unsigned long long)slept_ms, (int)alarms);
}

Test(common, sleep_ms_of_nothing_returns)
{
    idem__sleep_ms(0);
    idem__sleep_ms(-1);
    idem__sleep_ms(INT64_MIN);
}

Test(common, scopy_cuts_to_fit_and_terminates)
{
    char small[4];
    idem__scopy(small, sizeof small, "abcdef");
    cr_assert_str_eq(small, "abc");
    idem__scopy(small, sizeof small, "ab");
    cr_assert_str_eq(small, "ab");
    char one[1] = {'x'};
    idem__scopy(one, sizeof one, "abc");
    cr_assert_eq(one[0], '\0');
}

Test(common, grow_doubles_keeps_the_contents_and_refuses_an_overflow)
{
    size_t cap = 0;
    int *a = idem__grow(NULL, 0, &cap, sizeof *a, 4);
    cr_assert(a);
    cr_assert_eq(cap, 4u);
    for (size_t n = 0; n < 9; n++) {
        int room = n < cap;
        int *p = idem__grow(a, n, &cap, sizeof *a, 4);
        cr_assert(p);
        cr_assert(!room || p == a, "grown with room left at %zu", n);
        a = p;
        a[n] = (int)n;
    }
    cr_assert_eq(cap, 16u);  /* 4, 8, 16 */
    for (int i = 0; i < 9; i++)
        cr_assert_eq(a[i], i);
    size_t huge = SIZE_MAX / 2 + 1;  /* doubling it wraps */
    cr_assert_null(idem__grow(a, huge, &huge, 1, 4));
    cr_assert_eq(huge, SIZE_MAX / 2 + 1);
    size_t big = SIZE_MAX / 4;  /* twice that many ints: no size_t holds it */
    cr_assert_null(idem__grow(a, big, &big, sizeof *a, 4));
    cr_assert_eq(big, SIZE_MAX / 4);
    free(a);
}
