/* sweep.c - `idem sweep`: expire now what a long-running job would expire
 * bit by bit, and give back the disk of dead segments (local:) or the
 * memory of records Redis would not expire on its own (Redis). */
#include <inttypes.h>
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: idem sweep [--store URI] [--retention DURATION]\n"
    "\n"
    "Remove every expired record from the index, delete segment files that\n"
    "hold nothing alive, and copy the few live records out of old, mostly\n"
    "dead segments. Expired records are already invisible to every command,\n"
    "and opening a store leaves them out of memory, so from here this gives\n"
    "back disk; long-running commands sweep as they go. Prints what it did.\n"
    "\n"
    "On Redis, where every record has a TTL: walk every master and delete\n"
    "the records past their expiry and those without a TTL (written by\n"
    "hand, or whose PEXPIRE was lost) created longer than --retention ago;\n"
    "with layout=day, drop whole the buckets whose days are over.\n"
    "\n"
    "  --store URI           default $IDEM_STORE, else " IDEM_DEFAULT_URI "\n"
    "  --retention DURATION  Redis: the age past which a record without a\n"
    "                        TTL goes: 30s, 5m, 24h, 7d (default 7d)\n";

static int parse(int argc, char **argv, const char **uri, int64_t *keep)
{
    static const struct option opts[] = {{"store", 1, 0, 's'},
                                         {"retention", 1, 0, 'r'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    int ch, rc = 0;
    while (!rc && (ch = cli_getopt("sweep", argc, argv, opts)) != -1) {
        if (ch == 'h') {
            fputs(usage, stdout);
            return -1;
        }
        rc = ch == 's'   ? (*uri = optarg, 0)
             : ch == 'r' ? cli_duration("sweep", "--retention", optarg, keep)
                         : 2;
    }
    if (!rc && optind < argc)
        rc = cli_usage_error("sweep", "unexpected argument '%s'",
                             argv[optind]);
    return rc;
}

int cli_cmd_sweep(int argc, char **argv)
{
    const char *given = NULL;
    int64_t keep = 0;
    int rc = parse(argc, argv, &given, &keep);
    if (rc)
        return rc < 0 ? 0 : rc;
    const char *uri = cli_store_uri(given);
    idem_opts o;
    idem_opts_init(&o);
    o.flags = IDEM_O_NOCREATE;
    if (keep)
        o.retention_ms = keep;
    idem_store *s = cli_open_with("sweep", uri, &o);
    if (!s)
        return cli_open_status();
    idem_stats before, after;
    uint64_t expired = 0;
    rc = idem_stats_get(s, &before);
    if (!rc)
        rc = idem_sweep(s, 0, &expired);
    if (!rc)
        rc = idem_stats_get(s, &after);
    if (rc)
        rc = cli_store_fail("sweep", s, rc, "sweep");
    else if (!(idem_uri_caps(uri) & IDEM_CAP_SEGMENTS))
        printf("removed %" PRIu64 " records; %" PRIu64 " live\n", expired,
               after.pending + after.done + after.failed);
    else
        printf("removed %" PRIu64 " expired records; segments %" PRIu64
               " -> %" PRIu64 ", disk %" PRIu64 " -> %" PRIu64 " bytes\n",
               expired, before.segments, after.segments, before.disk_bytes,
               after.disk_bytes);
    return idem_close(s) && !rc ? 1 : rc;
}
