/* killpoint.c - where the test suite may kill idem on purpose.
 *
 * A crash between two particular steps (a line written to the sink and
 * the commit that covers it, say) is the case exactly-once is about, and
 * a kill -9 at a random moment lands there only now and then. With
 * IDEM_TEST_KILL_AT=NAME[:N] the process kills itself (SIGKILL, as kill
 * -9 would) the Nth time (default the first) it passes the point NAME.
 * NAME:N:SIG raises signal number SIG instead (a stop signal that lands
 * at that very moment, which a test cannot time from outside).
 * Production runs never set it; docs/testing.md lists the points. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void cli_kill_point(const char *name)
{
    static long passed;
    const char *at = getenv("IDEM_TEST_KILL_AT");
    size_t n = strlen(name);
    if (!at || strncmp(at, name, n) || (at[n] && at[n] != ':'))
        return;
    char *end = (char *)at + n;
    long nth = *end == ':' ? strtol(end + 1, &end, 10) : 1;
    long sig = *end == ':' ? strtol(end + 1, NULL, 10) : SIGKILL;
    if (++passed == nth || (sig == SIGKILL && passed > nth))
        raise(sig > 0 && sig < 65 ? (int)sig : SIGKILL);
}
