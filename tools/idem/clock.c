/* clock.c - the one clock the CLI measures intervals with.
 *
 * Leases, time-outs, --idle-exit, rates and progress are all intervals,
 * which a wall clock stepped by NTP would stretch or shrink: every part
 * of the CLI reads CLOCK_MONOTONIC through these two functions. */
#include <time.h>

#include "cli.h"

int64_t cli_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double cli_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
