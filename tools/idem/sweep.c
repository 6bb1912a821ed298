/* sweep.c - `idem sweep`: expire now what a long-running job would expire
 * bit by bit, and give back the disk of dead segments. */
#include <inttypes.h>

#include "cli.h"

static const char usage[] =
    "usage: idem sweep [--store URI]\n"
    "\n"
    "Remove every expired record from the index, delete segment files that\n"
    "hold nothing alive, and copy the few live records out of old, mostly\n"
    "dead segments. Expired records are already invisible to every command,\n"
    "and opening a store leaves them out of memory, so from here this gives\n"
    "back disk; long-running commands sweep as they go. Prints what it did.\n"
    "\n"
    "  --store URI  default $IDEM_STORE, else local:./idem-data\n";

int idem_cmd_sweep(int argc, char **argv)
{
    cli_simple o;
    int rc = cli_simple_parse("sweep", argc, argv, usage, 0, 0, 0, "", &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    idem_store *s = cli_open("sweep", cli_store_uri(o.uri), IDEM_O_NOCREATE,
                             0, 0);
    if (!s)
        return 1;
    idem_stats before, after;
    uint64_t expired = 0;
    rc = idem_stats_get(s, &before);
    if (!rc)
        rc = idem_sweep(s, 0, &expired);
    if (!rc)
        rc = idem_stats_get(s, &after);
    if (rc)
        rc = cli_store_fail("sweep", s, rc, "sweep");
    else
        printf("removed %" PRIu64 " expired records; segments %" PRIu64
               " -> %" PRIu64 ", disk %" PRIu64 " -> %" PRIu64 " bytes\n",
               expired, before.segments, after.segments, before.disk_bytes,
               after.disk_bytes);
    return idem_close(s) && !rc ? 1 : rc;
}
