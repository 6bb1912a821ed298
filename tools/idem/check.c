/* check.c - `idem check` and `idem repair`: one report, two actions. */
#include <inttypes.h>
#include <string.h>

#include "cli.h"

static const char check_usage[] =
    "usage: idem check [--store URI]\n"
    "\n"
    "Verify the checksum of every record of a local store, without\n"
    "changing it. Exit status 0 when clean; 1 when damaged (it says where;\n"
    "`idem repair` keeps every valid record) or when the store cannot be\n"
    "read (another process holds it, it is not there, or a newer idem\n"
    "wrote it: that is no damage, and it says so).\n"
    "\n"
    "On a Redis store: read every record and report those idem cannot read\n"
    "(a key under the prefix that is not an idem record, a field written\n"
    "by hand): every claim of their key fails until they are gone.\n"
    "\n"
    "  --store URI  local:DIR or redis://... (default $IDEM_STORE, else\n"
    "               " IDEM_DEFAULT_URI ")\n";

static const char repair_usage[] =
    "usage: idem repair [--store URI]\n"
    "\n"
    "Rewrite every damaged segment of a local store keeping each valid\n"
    "record; the damaged bytes are lost, and says how many. A torn tail\n"
    "left by a crash is cut (opening the store does that too). Stop the\n"
    "store's users first; copy the directory if the data matters. A store\n"
    "a newer idem wrote to is refused, and left as it is.\n"
    "\n"
    "On a Redis store: delete the records `idem check` reports unreadable,\n"
    "so that their keys can be claimed again; says how many.\n"
    "\n"
    "  --store URI  local:DIR or redis://... (default $IDEM_STORE, else\n"
    "               " IDEM_DEFAULT_URI ")\n";

/* A Redis store: keys looked at, records readable and not. */
static int report_redis(const char *cmd, const char *uri, int rc,
                        const idem_check_report *r)
{
    printf("%s: %" PRIu64 " keys, %" PRIu64 " records", uri, r->segments,
           r->records);
    if (!r->damaged) {
        printf(", none unreadable\n");
        return 0;
    }
    printf(", %" PRIu64 " unreadable%s\nfirst: %s\n", r->damaged,
           strcmp(cmd, "repair") == 0 ? ", deleted" : "", r->first_damage);
    if (rc)
        printf("run `idem repair --store '%s'` to delete them\n", uri);
    return rc ? 1 : 0;
}

static int report(const char *cmd, const char *uri, int rc,
                  const idem_check_report *r)
{
    const char *why = *r->first_damage ? r->first_damage : idem_strerror(rc);
    if (rc && rc != IDEM_ECORRUPT)  /* details of a handle name the uri */
        return strncmp(why, uri, strlen(uri)) == 0
                   ? cli_fail(cmd, "%s", why)
                   : cli_fail(cmd, "%s: %s", uri, why);
    if (!(idem_uri_caps(uri) & IDEM_CAP_SEGMENTS))
        return report_redis(cmd, uri, rc, r);
    printf("%s: %" PRIu64 " segments, %" PRIu64 " records", uri,
           r->segments, r->records);
    if (!r->damaged && !r->bytes_lost) {
        printf(", no damage\n");
        return 0;
    }
    printf(", %" PRIu64 " damaged regions, %" PRIu64 " bytes %s\n",
           r->damaged, r->bytes_lost, rc ? "damaged" : "lost");
    if (*r->first_damage)
        printf("first damage: %s\n", r->first_damage);
    if (rc)
        printf("run `idem repair --store %s` to keep every valid record\n",
               uri);
    return rc ? 1 : 0;
}

static int check_or_repair(const char *cmd, const char *usage, int argc,
                           char **argv,
                           int (*fn)(const char *, idem_check_report *))
{
    cli_simple o;
    int rc = cli_simple_parse(cmd, argc, argv, usage, 0, 0, 0, "", &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    const char *uri = cli_store_uri(o.uri);
    idem_check_report r;
    rc = fn(uri, &r);
    return report(cmd, cli_shown_uri(uri), rc, &r);
}

int cli_cmd_check(int argc, char **argv)
{
    return check_or_repair("check", check_usage, argc, argv, idem_check);
}

int cli_cmd_repair(int argc, char **argv)
{
    return check_or_repair("repair", repair_usage, argc, argv, idem_repair);
}
