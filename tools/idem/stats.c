/* stats.c - `idem stats`: what a store holds and what it costs. */
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static const char usage[] =
    "usage: idem stats [--store URI] [--json]\n"
    "\n"
    "Keys by state (live records; expired ones that no sweep removed yet\n"
    "count in `index entries` only), segment files and bytes on disk, RAM\n"
    "held by the index, and when the oldest and newest segments began.\n"
    "Keys are not counted per key space: the store counts by state without\n"
    "reading keys, and a count per key space reads every record, as\n"
    "  idem dump | jq -r '.key_space // \"(shared)\"' | sort | uniq -c\n"
    "does.\n"
    "\n"
    "  --json       one JSON object\n"
    "  --store URI  default $IDEM_STORE, else local:./idem-data\n";

static void when(char *buf, size_t n, int64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    buf[0] = '\0';
    if (ms && gmtime_r(&t, &tm))
        strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Segments, disk and the index exist on the embedded stores only; a
 * server store reports its keys by state. */
static void print_text(const char *uri, const idem_stats *st,
                       const char *oldest, const char *newest)
{
    printf("store          %s\nkeys           %" PRIu64 " pending, %" PRIu64
           " done, %" PRIu64 " failed\n",
           uri, st->pending, st->done, st->failed);
    if (strncmp(uri, "local:", 6) && strncmp(uri, "mem:", 4))
        return;
    printf("index entries  %" PRIu64 "\nsegments       %" PRIu64
           "\ndisk           %" PRIu64 " bytes\nRAM (index)    %" PRIu64
           " bytes\noldest         %s\nnewest         %s\n",
           st->live_keys, st->segments, st->disk_bytes, st->index_bytes,
           oldest, newest);
}

int idem_cmd_stats(int argc, char **argv)
{
    cli_simple o;
    int rc = cli_simple_parse("stats", argc, argv, usage, 1, 0, 0, "", &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    idem_store *s = cli_open("stats", cli_store_uri(o.uri), IDEM_O_NOCREATE,
                             0, 0);
    if (!s)
        return 1;
    idem_stats st;
    rc = idem_stats_get(s, &st);
    if (rc) {
        rc = cli_store_fail("stats", s, rc, "stats");
        idem_close(s);
        return rc;
    }
    char oldest[32], newest[32];
    when(oldest, sizeof oldest, st.oldest_ms);
    when(newest, sizeof newest, st.newest_ms);
    if (o.json)
        printf("{\"index_entries\":%" PRIu64 ",\"pending\":%" PRIu64
               ",\"done\":%" PRIu64 ",\"failed\":%" PRIu64
               ",\"segments\":%" PRIu64 ",\"disk_bytes\":%" PRIu64
               ",\"index_bytes\":%" PRIu64 ",\"oldest_ms\":%lld"
               ",\"newest_ms\":%lld}\n",
               st.live_keys, st.pending, st.done, st.failed, st.segments,
               st.disk_bytes, st.index_bytes, (long long)st.oldest_ms,
               (long long)st.newest_ms);
    else
        print_text(cli_store_uri(o.uri), &st, oldest, newest);
    return idem_close(s) ? 1 : 0;
}
