/* stats.c - `idem stats`: what a store holds and what it costs. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "keyspace.h"
#include "metricsrv.h"

static const char usage[] =
    "usage: idem stats [--store URI] [--json | --format FORMAT]\n"
    "                  [--key-spaces]\n"
    "\n"
    "Keys by state (live records; expired ones that no sweep removed yet\n"
    "count in `index entries` only), segment files and bytes on disk, RAM\n"
    "held by the index, and when the oldest and newest segments began.\n"
    "\n"
    "  --json       one JSON object (--format json)\n"
    "  --format text|json|prometheus\n"
    "               prometheus: the metrics families of --metrics-listen\n"
    "               (docs/monitoring.md) once, for node_exporter's textfile\n"
    "               collector or cron; the counters of a job are its\n"
    "               endpoint's, here only the store's figures and, on\n"
    "               Redis, each master's INFO\n"
    "  --key-spaces also count live keys per key space (the jobs of dedup\n"
    "               and run; \"(shared)\" for --shared-keys and library\n"
    "               keys). This reads every record: O(keys), as a dump\n"
    "  --store URI  default $IDEM_STORE, else " IDEM_DEFAULT_URI "\n";

/* A segment's start; 0 is a header that repair wrote anew, whose time
 * was lost with the old one. Blank without segments. */
static void when(char *buf, size_t n, int64_t ms, uint64_t segments)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    snprintf(buf, n, "%s", segments ? "unknown (header rewritten by repair)"
                                    : "");
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
    if (!(idem_uri_caps(uri) & IDEM_CAP_SEGMENTS))
        return;
    printf("index entries  %" PRIu64 "\nsegments       %" PRIu64
           "\ndisk           %" PRIu64 " bytes\nRAM (index)    %" PRIu64
           " bytes\noldest         %s\nnewest         %s\n",
           st->live_keys, st->segments, st->disk_bytes, st->index_bytes,
           oldest, newest);
    if (!st->cold_segments)
        return;
    uint64_t q = st->cold_lookups ? st->cold_lookups : 1;
    double cold = (double)(st->cold_keys ? st->cold_keys : 1);
    printf("hot keys       %" PRIu64 "\ncold keys      %" PRIu64
           " (at most) in %" PRIu64 " segments\nRAM (filter)   %" PRIu64
           " bytes (%.2f a cold key), the filter in front\n"
           "mapped filters %" PRIu64
           " bytes (%.2f a cold key), the segments' own: page cache\n"
           "cold lookups   %" PRIu64
           ": %.2f filter probes, %.3f index searches, %.3f frame reads "
           "each; %" PRIu64
           " false positives\n",
           st->hot_keys, st->cold_keys, st->cold_segments,
           st->cold_front_bytes, (double)st->cold_front_bytes / cold,
           st->cold_index_bytes - st->cold_front_bytes,
           (double)(st->cold_index_bytes - st->cold_front_bytes) / cold,
           st->cold_lookups, (double)st->filter_probes / (double)q,
           (double)st->index_searches / (double)q,
           (double)st->cold_reads / (double)q, st->filter_false_positives);
}

/* Live keys per key space, in the order the spaces were first seen. */
typedef struct space_count {
    char name[KS_NAME_MAX + 1];  /* "" for the shared key space */
    uint64_t keys;
} space_count;

typedef struct space_counts {
    space_count *v;
    size_t n;
} space_counts;

static int count_space(void *ctx, const void *key, size_t keylen,
                       const idem_record *rec)
{
    space_counts *c = ctx;
    const char *name;
    size_t len;
    (void)rec;
    ks_split(key, keylen, &name, &len, &key, &keylen);
    len = name ? len : 0;
    size_t i = 0;
    while (i < c->n && (strlen(c->v[i].name) != len ||
                        memcmp(c->v[i].name, name, len)))
        i++;
    if (i == c->n) {
        space_count *v = realloc(c->v, (c->n + 1) * sizeof *v);
        if (!v)
            return IDEM_ENOMEM;
        c->v = v;
        memcpy(v[i].name, name ? name : "", len);
        v[i].name[len] = '\0';
        v[i].keys = 0;
        c->n++;
    }
    c->v[i].keys++;
    return 0;
}

/* The counts as text lines, or as the members of a JSON object. */
static void print_spaces(const space_counts *c, int json)
{
    for (size_t i = 0; i < c->n; i++) {
        const char *name = c->v[i].name[0] ? c->v[i].name : "(shared)";
        cli_buf b = {0};
        if (!json)
            printf("key space      %s: %" PRIu64 " keys\n", name,
                   c->v[i].keys);
        else if (!cli_buf_json_string(&b, name, strlen(name)))
            printf("%s%.*s:%" PRIu64, i ? "," : "", (int)b.len, b.p,
                   c->v[i].keys);
        cli_buf_free(&b);
    }
}

#define STATS_SERVERS 64

/* --format prometheus: the store's figures as the endpoint renders them,
 * the gauges from idem_stats (this handle has done nothing to count). */
static int print_prometheus(idem_store *s, const char *uri,
                            const idem_stats *st)
{
    idem_metrics m;
    idem_server_metrics sv[STATS_SERVERS];
    idem_metrics_init(&m);
    idem_metrics_get(s, &m);
    m.live_keys = (int64_t)st->live_keys;
    if (idem_uri_caps(uri) & IDEM_CAP_SEGMENTS) {
        m.store_bytes = (int64_t)st->disk_bytes;
        m.segments = (int64_t)st->segments;
    }
    m.expired_total = st->expired_total;
    int rc = idem_server_metrics_get(s, sv, STATS_SERVERS, &m.nservers);
    if (rc)
        return cli_store_fail("stats", s, rc, "reading the servers' INFO");
    m.servers = sv;
    m.nservers = m.nservers < STATS_SERVERS ? m.nservers : STATS_SERVERS;
    cli_buf b = {0};
    rc = msrv_render(&m, NULL, uri, &b);
    if (!rc)
        fwrite(b.p, 1, b.len, stdout);
    cli_buf_free(&b);
    return rc ? cli_fail("stats", "out of memory") : 0;
}

/* --json or --format: 0 text, 1 json, 2 prometheus; -1 after saying
 * why not. */
static int stats_format(const cli_simple *o)
{
    static const char *const names[] = {"text", "json", "prometheus", NULL};
    int f = o->json;
    if (o->format && cli_choice("stats", "--format", o->format, names, &f))
        return -1;
    if (o->json && f != 1)
        return cli_usage_error("stats", "--json and --format %s disagree",
                               o->format), -1;
    return f;
}

int cli_cmd_stats(int argc, char **argv)
{
    cli_simple o;
    int rc = cli_simple_parse("stats", argc, argv, usage,
                              CLI_JSON | CLI_PER_SPACE | CLI_FORMAT, 0, 0,
                              "", &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    int format = stats_format(&o);
    if (format < 0)
        return CLI_EXIT_USAGE;
    o.json = format == 1;
    idem_store *s = cli_open("stats", cli_store_uri(o.uri), IDEM_O_READONLY,
                             0, 0);
    if (!s)
        return cli_open_status();
    idem_stats st;
    rc = idem_stats_read(s, &st, sizeof st);
    if (rc) {
        rc = cli_store_fail("stats", s, rc, "stats");
        idem_close(s);
        return rc;
    }
    char oldest[48], newest[48];
    when(oldest, sizeof oldest, st.oldest_ms, st.segments);
    when(newest, sizeof newest, st.newest_ms, st.segments);
    space_counts c = {0};
    if (format == 2) {
        rc = print_prometheus(s, cli_store_uri(o.uri), &st);
    } else if (o.per_space && (rc = idem_scan(s, count_space, &c)) != 0) {
        rc = cli_store_fail("stats", s, rc, "counting keys per key space");
    } else if (o.json) {
        printf("{\"index_entries\":%" PRIu64 ",\"pending\":%" PRIu64
               ",\"done\":%" PRIu64 ",\"failed\":%" PRIu64
               ",\"segments\":%" PRIu64 ",\"disk_bytes\":%" PRIu64
               ",\"index_bytes\":%" PRIu64 ",\"oldest_ms\":%lld"
               ",\"newest_ms\":%lld",
               st.live_keys, st.pending, st.done, st.failed, st.segments,
               st.disk_bytes, st.index_bytes, (long long)st.oldest_ms,
               (long long)st.newest_ms);
        printf(",\"hot_keys\":%" PRIu64 ",\"cold_keys\":%" PRIu64
               ",\"cold_segments\":%" PRIu64 ",\"cold_index_bytes\":%" PRIu64
               ",\"cold_lookups\":%" PRIu64 ",\"filter_probes\":%" PRIu64
               ",\"index_searches\":%" PRIu64
               ",\"filter_false_positives\":%" PRIu64
               ",\"cold_reads\":%" PRIu64 ",\"cold_front_bytes\":%" PRIu64
               ",\"filters_asked\":%" PRIu64
               ",\"front_false_positives\":%" PRIu64,
               st.hot_keys, st.cold_keys, st.cold_segments,
               st.cold_index_bytes, st.cold_lookups, st.filter_probes,
               st.index_searches, st.filter_false_positives, st.cold_reads,
               st.cold_front_bytes, st.filters_asked,
               st.front_false_positives);
        if (o.per_space) {
            fputs(",\"key_spaces\":{", stdout);
            print_spaces(&c, 1);
            fputs("}", stdout);
        }
        fputs("}\n", stdout);
    } else {
        print_text(cli_shown_uri(cli_store_uri(o.uri)), &st, oldest,
                   newest);
        print_spaces(&c, 0);
    }
    free(c.v);
    return idem_close(s) || rc ? 1 : 0;
}
