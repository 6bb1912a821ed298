/* bench.c - `idem bench`: throughput of a store on a synthetic workload.
 *
 * A program, not a test: it prints one line of name=value pairs so that
 * scripts (bench/run.sh) can set it beside reference systems measured in
 * the same run. Keys are 36 bytes, like a printed UUID: random (a PRNG,
 * so key generation costs next to nothing) or ordered (a zero-padded
 * counter). Every batch is synced, so the figures are durable ones.
 *
 * The seed workload is the load the project was asked to carry: 5e4
 * messages a second for a day, some of them repeats, 80 % of those
 * within an hour of their original. A day of it at that rate takes a
 * day, so the store runs on an injected clock that moves 1/rate of a
 * second a message: the run takes as long as the store needs, and says
 * how many times faster than the real rate that was. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../bench/keys36.h"
#include "cli.h"
#include "idem/idem.h"

#define KEYLEN BENCH_KEYLEN
/* Keys are numbered: far more than a run could ever claim. */
#define BENCH_N_MAX 1000000000000ull

static const char bench_usage[] =
    "usage: idem bench [--store URI]\n"
    "                  [--workload claim|claim-complete|replay|seed]\n"
    "                  [--keys random|ordered] [-n N] [--batch B]\n"
    "                  [--value-size BYTES] [--reopen] [--skip N]\n"
    "                  [--every N] [--overlap]\n"
    "\n"
    "Measures a store. Prints one line of name=value pairs, among them\n"
    "ops_per_sec. Every batch is synced (durable) before the next.\n"
    "\n"
    "  --store URI        store to use (default local:./idem-bench-data);\n"
    "                     use a fresh one: existing keys change the answers\n"
    "  --workload W       claim: NEW claims; claim-complete: claim then\n"
    "                     complete each message; replay: complete N keys\n"
    "                     first (not timed), then time claims answered\n"
    "                     REPLAY (default claim)\n"
    "  --keys K           random or ordered 36-byte keys (default random)\n"
    "  -n N               messages (default 1000000)\n"
    "  --batch B          keys per claim_many/complete_many (default 1000)\n"
    "  --value-size BYTES response size for completions (default 16)\n"
    "  --reopen           then close the store, time reopening it, and\n"
    "                     check one key is there\n"
    "  --skip N           start at key N (default 0): new keys for a store\n"
    "                     that holds keys 0..N-1 from an earlier run\n"
    "  --every N          also print, to stderr, the rate of each N keys\n"
    "                     (is it sustained at the end as at the start?)\n"
    "  --overlap          sync each batch while the next one is claimed,\n"
    "                     as idem dedup and idem run do: a batch is\n"
    "                     durable before the one after it returns\n"
    "                     (claim and claim-complete)\n"
    "\n"
    "seed: messages offered at --rate N a second (default 50000) of an\n"
    "injected clock for --simulate SECONDS (default 86400); --repeats\n"
    "PERCENT of them (default 10) repeat an earlier message, 80 % of those\n"
    "within the hour, the rest within the TTL (--ttl SECONDS, default\n"
    "86400). Each NEW is completed with an empty response. Prints RAM,\n"
    "disk, the repeats that got through as NEW (exit status 1 unless 0)\n"
    "and the p99 latency of a batch, which is every claim's in it.\n"
    "\n"
    "A store past its hot budget (local:PATH?hot=SIZE) also reports its\n"
    "hot and cold keys, and the filter probes, disk reads and false\n"
    "positives of the lookups RAM did not answer.\n";

typedef struct bench_cfg {
    const char *uri, *workload;
    int random_keys, reopen, overlap;
    size_t n, batch, value_size, skip, every;
    uint64_t rate, simulate, repeats, ttl_s;   /* seed */
} bench_cfg;

/* Key i, deterministic: the replay workload regenerates the same keys. */
static void make_key(const bench_cfg *c, size_t i, char *k)
{
    bench_key(c->random_keys, c->skip + i, k);
}


static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "RssAnon:", 8))  /* heap, not page cache */
            v = strtol(line + 8, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

typedef struct bench_buf {
    char *names;
    idem_key *keys;
    idem_outcome *outs;
    idem_completion *items;
    int *st;
    char *value;
} bench_buf;

/* One batch starting at key `first`: claim, and complete if asked. */
static int run_batch(idem_store *s, const bench_cfg *c, bench_buf *b,
                     size_t first, size_t m, int complete, size_t *news)
{
    for (size_t j = 0; j < m; j++) {
        char *k = b->names + j * (KEYLEN + 1);
        make_key(c, first + j, k);
        b->keys[j] = (idem_key){k, KEYLEN, NULL};
    }
    int rc = idem_claim_many(s, b->keys, m, NULL, b->outs,
                             complete || c->overlap ? IDEM_NOSYNC : 0);
    size_t q = 0;
    for (size_t j = 0; !rc && j < m; j++) {
        *news += b->outs[j].kind == IDEM_NEW;
        if (b->outs[j].kind == IDEM_NEW)
            b->items[q++] = (idem_completion){b->keys[j].key, KEYLEN,
                                              b->outs[j].token, b->value,
                                              c->value_size, 0};
    }
    if (!rc && complete)
        rc = idem_complete_many(s, b->items, q, b->st,
                                c->overlap ? IDEM_NOSYNC : 0);
    if (!rc && c->overlap)  /* the batch before is durable; sync this one */
        rc = idem_sync_wait(s) || idem_sync_start(s) ? -1 : 0;
    if (rc)
        fprintf(stderr, "idem bench: %s\n", idem_errdetail(s));
    return rc;
}

/* With --every: the rate since the last line, once per N keys. */
static void progress(const bench_cfg *c, size_t done, size_t m,
                     double *since)
{
    if (!c->every || done / c->every == (done - m) / c->every)
        return;
    double now = cli_mono_s();
    fprintf(stderr, "idem bench: %zu keys, %.0f/s over the last %zu\n",
            c->skip + done, (double)c->every / (now - *since), c->every);
    *since = now;
}

static int run_all(idem_store *s, const bench_cfg *c, bench_buf *b,
                   int complete, size_t *news)
{
    double since = cli_mono_s();
    for (size_t i = 0; i < c->n; i += c->batch) {
        size_t m = c->n - i < c->batch ? c->n - i : c->batch;
        if (run_batch(s, c, b, i, m, complete, news))
            return 1;
        progress(c, i + m, m, &since);
    }
    if (c->overlap && idem_sync_wait(s) != 0) {
        fprintf(stderr, "idem bench: %s\n", idem_errdetail(s));
        return 1;
    }
    return 0;
}

/* A count option: cli_number() refuses what is not a whole number from
 * 1 up (a "-5" that strtoull() would wrap to 2^64 - 5 included). */
static int parse_size(const char *arg, const char *what, uint64_t hi,
                      size_t *out)
{
    uint64_t v;
    int rc = cli_number("bench", what, arg, 1, hi, &v);
    if (!rc)
        *out = (size_t)v;
    return rc;
}

/* 0, the exit status of bad usage, or -1 after --help. */
static int parse(int argc, char **argv, bench_cfg *c)
{
    static const struct option opts[] = {
        {"store", 1, 0, 's'},      {"workload", 1, 0, 'w'},
        {"keys", 1, 0, 'k'},       {"batch", 1, 0, 'b'},
        {"value-size", 1, 0, 'v'}, {"reopen", 0, 0, 'r'},
        {"skip", 1, 0, 'S'},       {"help", 0, 0, 'h'},
        {"every", 1, 0, 'e'},      {"rate", 1, 0, 'R'},
        {"simulate", 1, 0, 'D'},   {"repeats", 1, 0, 'P'},
        {"ttl", 1, 0, 'T'},        {"overlap", 0, 0, 'o'},
        {0, 0, 0, 0}};
    static const char *const workloads[] = {"claim", "claim-complete",
                                            "replay", "seed", NULL};
    static const char *const keys[] = {"ordered", "random", NULL};
    *c = (bench_cfg){.uri = "local:./idem-bench-data", .workload = "claim",
                     .random_keys = 1, .n = 1000000, .batch = 1000,
                     .value_size = 16, .rate = 50000, .simulate = 86400,
                     .repeats = 10, .ttl_s = 86400};
    int ch, rc = 0, i = 0;
    uint64_t v = 0;
    while (!rc && (ch = cli_getopt_short("bench", argc, argv, ":n:h",
                                          opts)) != -1) {
        switch (ch) {
        case 's': c->uri = optarg; break;
        case 'w':
            rc = cli_choice("bench", "--workload", optarg, workloads, &i);
            c->workload = rc ? c->workload : workloads[i];
            break;
        case 'k':
            rc = cli_choice("bench", "--keys", optarg, keys, &i);
            c->random_keys = i;
            break;
        case 'n': rc = parse_size(optarg, "-n", BENCH_N_MAX, &c->n); break;
        case 'b':
            rc = parse_size(optarg, "--batch", 1000000, &c->batch);
            break;
        case 'v':  /* 0: DONE records with an empty response */
            rc = cli_number("bench", "--value-size", optarg, 0,
                            IDEM_VALUE_MAX, &v);
            c->value_size = (size_t)v;
            break;
        case 'e': rc = parse_size(optarg, "--every", BENCH_N_MAX, &c->every);
                  break;
        case 'R': rc = cli_number("bench", "--rate", optarg, 1, 10000000,
                                  &c->rate); break;
        case 'D': rc = cli_number("bench", "--simulate", optarg, 1,
                                  366 * 86400, &c->simulate); break;
        case 'P': rc = cli_number("bench", "--repeats", optarg, 0, 100,
                                  &c->repeats); break;
        case 'T': rc = cli_number("bench", "--ttl", optarg, 3600,
                                  366 * 86400, &c->ttl_s); break;
        case 'r': c->reopen = 1; break;
        case 'o': c->overlap = 1; break;
        case 'S':
            rc = cli_number("bench", "--skip", optarg, 0, BENCH_N_MAX, &v);
            c->skip = (size_t)v;
            break;
        case 'h': fputs(bench_usage, stdout); return -1;
        default: rc = CLI_EXIT_USAGE;
        }
    }
    if (!rc && optind < argc)
        rc = cli_usage_error("bench", "unexpected argument '%s'",
                             argv[optind]);
    return rc;
}

static int reopen_check(const bench_cfg *c, idem_store **s, double *secs)
{
    int rc = idem_close(*s);
    double t0 = cli_mono_s();
    if (!rc)
        rc = idem_open(c->uri, NULL, s);
    *secs = cli_mono_s() - t0;
    char k[KEYLEN + 1];
    make_key(c, c->n - 1, k);
    idem_record r;
    if (!rc)
        rc = idem_get(*s, k, KEYLEN, &r);
    if (rc)
        fprintf(stderr, "idem bench: reopen: %s\n", idem_errdetail(*s));
    return rc;
}

/* " name=RATE", fp of n, or " name=-" when n is 0. */
static void print_rate(const char *name, uint64_t fp, uint64_t n)
{
    if (n)
        printf(" %s=%.2e", name, (double)fp / (double)n);
    else
        printf(" %s=-", name);
}

/* What a store past its hot budget did (local:PATH?hot=SIZE): the keys
 * it holds in RAM and on disk, and what a lookup RAM did not answer cost:
 * filter blocks read, indexes searched, frames read, and the false
 * positives of the filter in front (over the lookups of keys no cold
 * segment held) and of the segments' filters and lanes (over those asked
 * about a key their segment does not hold); "-" when none was asked. */
static void print_cold(const idem_stats *st)
{
    if (!st->cold_segments)
        return;
    double q = st->cold_lookups ? (double)st->cold_lookups : 1.0;
    uint64_t seg_fp = st->filter_false_positives - st->front_false_positives;
    uint64_t found = st->index_searches - seg_fp;
    printf(" hot_keys=%" PRIu64 " cold_keys=%" PRIu64 " cold_segments=%" PRIu64
           " filter_bytes_per_cold_key=%.2f"
           " front_filter_bytes_per_cold_key=%.2f cold_lookups=%" PRIu64
           " filter_probes_per_lookup=%.2f index_searches_per_lookup=%.4f"
           " frame_reads_per_lookup=%.4f false_positives=%" PRIu64,
           st->hot_keys, st->cold_keys, st->cold_segments,
           (double)st->cold_index_bytes /
               (double)(st->cold_keys ? st->cold_keys : 1),
           (double)st->cold_front_bytes /
               (double)(st->cold_keys ? st->cold_keys : 1),
           st->cold_lookups, (double)st->filter_probes / q,
           (double)st->index_searches / q, (double)st->cold_reads / q,
           st->filter_false_positives);
    print_rate("front_false_positive_rate", st->front_false_positives,
               st->cold_lookups - found);
    print_rate("segment_false_positive_rate", seg_fp,
               st->filters_asked - found);
}

/* ------------------------------------------------------------------------
 * The seed workload */

typedef struct seed_run {
    const bench_cfg *c;
    int64_t now_ms;            /* the injected clock */
    uint64_t n;                /* messages */
    uint64_t repeats, replays, busy, through, fresh, lost;
    double *lat;               /* seconds of each batch */
    size_t nlat;
} seed_run;

static int64_t seed_clock(void *ctx)
{
    return ((const seed_run *)ctx)->now_ms;
}

/* A uniform double in [0, 1) drawn from x and salt. */
static double seed_u(uint64_t x, uint64_t salt)
{
    uint64_t s = x ^ salt;
    return (double)(bench_splitmix(&s) >> 11) * 0x1p-53;
}

static int seed_is_repeat(const seed_run *r, uint64_t i)
{
    return seed_u(i, 0x5eed1) * 100.0 < (double)r->c->repeats;
}

/* The earlier new message that message i repeats: 80 % within the hour
 * before it, the rest within the TTL, less a minute and a batch (the
 * clock moves a batch at a time: a repeat at the TTL's very end may find
 * its original gone, rightly). UINT64_MAX when there is none yet (i is
 * then new itself). A message is new unless it repeats one. */
static uint64_t seed_original(const seed_run *r, uint64_t i)
{
    const bench_cfg *c = r->c;
    double max = (double)c->ttl_s - 60.0 - (double)c->batch / (double)c->rate;
    double hour = max < 3600.0 ? max : 3600.0, u = seed_u(i, 0x5eed2);
    double back_s = seed_u(i, 0x5eed3) < 0.8 ? u * hour
                                              : hour + u * (max - hour);
    if (back_s < 0)
        return UINT64_MAX;
    uint64_t d = 1 + (uint64_t)(back_s * (double)r->c->rate);
    if (d > i)
        return UINT64_MAX;
    uint64_t j = i - d;
    while (seed_is_repeat(r, j))  /* the nearest message that is new */
        if (j-- == 0)
            return UINT64_MAX;
    return j;
}

/* Claim messages [first, first + m): each new one must be NEW and is
 * completed (empty response); each repeat must not be NEW. */
static int seed_batch(idem_store *s, seed_run *r, bench_buf *b,
                      uint64_t first, size_t m)
{
    for (size_t j = 0; j < m; j++) {
        uint64_t i = first + j;
        uint64_t o = seed_is_repeat(r, i) ? seed_original(r, i) : UINT64_MAX;
        bench_key(1, o == UINT64_MAX ? i : o, b->names + j * (KEYLEN + 1));
        b->keys[j] = (idem_key){b->names + j * (KEYLEN + 1), KEYLEN, NULL};
        b->st[j] = o != UINT64_MAX;  /* a repeat (st is free until the
                                      * completions' statuses) */
    }
    int rc = idem_claim_many(s, b->keys, m, NULL, b->outs, IDEM_NOSYNC);
    size_t q = 0;
    for (size_t j = 0; !rc && j < m; j++) {
        idem_outcome_kind k = b->outs[j].kind;
        r->repeats += b->st[j];
        r->through += b->st[j] && k == IDEM_NEW;
        r->replays += b->st[j] && k == IDEM_REPLAY;
        r->busy += b->st[j] && k == IDEM_BUSY;  /* original in this batch */
        r->lost += !b->st[j] && k != IDEM_NEW;
        if (k == IDEM_NEW)
            b->items[q++] = (idem_completion){b->keys[j].key, KEYLEN,
                                              b->outs[j].token, NULL, 0, 0};
    }
    r->fresh += q;
    if (!rc)
        rc = idem_complete_many(s, b->items, q, b->st, 0);
    uint64_t expired;
    if (!rc)  /* what a deployment's periodic sweep does, a little a batch */
        rc = idem_sweep(s, 4 * m, &expired);
    if (rc)
        fprintf(stderr, "idem bench: %s\n", idem_errdetail(s));
    return rc;
}

static int seed_all(idem_store *s, seed_run *r, bench_buf *b)
{
    const bench_cfg *c = r->c;
    int64_t t0 = r->now_ms;
    double since = cli_mono_s();
    for (uint64_t i = 0; i < r->n; i += c->batch) {
        size_t m = r->n - i < c->batch ? (size_t)(r->n - i) : c->batch;
        r->now_ms = t0 + (int64_t)((double)i * 1000.0 / (double)c->rate);
        double t = cli_mono_s();
        if (seed_batch(s, r, b, i, m))
            return 1;
        r->lat[r->nlat++] = cli_mono_s() - t;
        progress(c, (size_t)(i + m), m, &since);
    }
    return 0;
}

static int seed_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void seed_print(const seed_run *r, const idem_stats *st, double secs,
                       long rss_kib_used)
{
    const bench_cfg *c = r->c;
    qsort(r->lat, r->nlat, sizeof *r->lat, seed_cmp);
    double p99 = r->nlat ? r->lat[(r->nlat - 1) * 99 / 100] : 0;
    double keys = st->live_keys ? (double)st->live_keys : 1.0;
    printf("workload=seed store=%s rate=%" PRIu64 " simulated_s=%" PRIu64
           " messages=%" PRIu64 " batch=%zu seconds=%.3f"
           " msgs_per_sec=%.0f times_real_time=%.2f new=%" PRIu64
           " repeats=%" PRIu64 " replayed=%" PRIu64 " busy=%" PRIu64
           " duplicates_through=%" PRIu64 " new_not_new=%" PRIu64
           " live_keys=%" PRIu64 " anon_rss_bytes=%ld"
           " anon_rss_bytes_per_key=%.1f disk_bytes=%" PRIu64
           " disk_bytes_per_key=%.1f p99_batch_ms=%.2f max_batch_ms=%.2f",
           cli_shown_uri(c->uri), c->rate, c->simulate, r->n, c->batch, secs,
           (double)r->n / secs, (double)r->n / secs / (double)c->rate,
           r->fresh, r->repeats, r->replays, r->busy, r->through, r->lost,
           st->live_keys, rss_kib_used * 1024,
           (double)rss_kib_used * 1024.0 / keys,
           st->disk_bytes, (double)st->disk_bytes / keys, p99 * 1e3,
           r->nlat ? r->lat[r->nlat - 1] * 1e3 : 0.0);
    print_cold(st);
    printf("\n");
}

/* 0, or 1 when it failed or a repeat got through as NEW. */
static int bench_seed(const bench_cfg *c, bench_buf *b)
{
    seed_run r = {.c = c, .now_ms = 1767225600000LL,  /* 2026-01-01 */
                  .n = c->rate * c->simulate};
    r.lat = malloc((size_t)(r.n / c->batch + 1) * sizeof *r.lat);
    idem_opts o;
    idem_opts_init(&o);
    o.clock = seed_clock;
    o.clock_ctx = &r;
    o.ttl_ms = (int64_t)c->ttl_s * 1000;
    long rss0 = rss_kib();
    idem_store *s = r.lat ? cli_open_with("bench", c->uri, &o) : NULL;
    if (!r.lat)
        fputs("idem bench: out of memory\n", stderr);
    int rc = s ? 0 : r.lat ? cli_open_status() : 1;
    double t0 = cli_mono_s();
    if (!rc)
        rc = seed_all(s, &r, b);
    double secs = cli_mono_s() - t0;
    idem_stats st = {0};
    if (!rc && (rc = idem_stats_read(s, &st, sizeof st)) != 0)
        fprintf(stderr, "idem bench: stats: %s\n", idem_errdetail(s));
    if (!rc)
        seed_print(&r, &st, secs, rss_kib() - rss0);
    if (s && idem_close(s) && !rc)
        rc = 1;
    free(r.lat);
    return rc ? rc : r.through || r.lost ? 1 : 0;
}

/* The claim, claim-complete and replay workloads. */
static int bench_plain(const bench_cfg *c, bench_buf *b)
{
    idem_store *s = cli_open("bench", c->uri, 0, 0, 0);
    long rss0 = rss_kib();
    int rc = s ? 0 : cli_open_status();
    int replay = !strcmp(c->workload, "replay");
    size_t news = 0, seeded = 0;
    if (!rc && replay)
        rc = run_all(s, c, b, 1, &seeded);
    double t0 = cli_mono_s();
    if (!rc)
        rc = run_all(s, c, b, !strcmp(c->workload, "claim-complete"), &news);
    double secs = cli_mono_s() - t0, reopen = 0;
    long rss1 = rss_kib();
    idem_stats st = {0};
    if (!rc)
        idem_stats_read(s, &st, sizeof st);
    if (!rc && c->reopen)
        rc = reopen_check(c, &s, &reopen);
    if (!rc) {
        printf("workload=%s store=%s keys=%s n=%zu batch=%zu seconds=%.3f "
               "ops_per_sec=%.0f new=%zu index_bytes_per_key=%.1f "
               "anon_rss_bytes_per_key=%.1f",
               c->workload, cli_shown_uri(c->uri),
               c->random_keys ? "random" : "ordered", c->n,
               c->batch, secs, (double)c->n / secs, news,
               st.live_keys ? (double)st.index_bytes / (double)st.live_keys
                            : 0.0,
               (double)(rss1 - rss0) * 1024.0 / (double)c->n);
        printf(" disk_bytes_per_key=%.1f",
               (double)st.disk_bytes / (double)(c->n ? c->n : 1));
        print_cold(&st);
        if (c->reopen)
            printf(" reopen_seconds=%.3f", reopen);
        printf("\n");
    }
    if (s)
        idem_close(s);
    return rc;
}

int cli_cmd_bench(int argc, char **argv)
{
    bench_cfg c;
    int rc = parse(argc, argv, &c);
    if (rc)
        return rc < 0 ? 0 : rc;
    bench_buf b = {malloc(c.batch * (KEYLEN + 1)),
                   malloc(c.batch * sizeof(idem_key)),
                   malloc(c.batch * sizeof(idem_outcome)),
                   malloc(c.batch * sizeof(idem_completion)),
                   malloc(c.batch * sizeof(int)), calloc(1, c.value_size + 1)};
    rc = !b.names || !b.keys || !b.outs || !b.items || !b.st || !b.value;
    if (rc)
        fputs("idem bench: out of memory\n", stderr);
    else
        rc = !strcmp(c.workload, "seed") ? bench_seed(&c, &b)
                                         : bench_plain(&c, &b);
    free(b.names);
    free(b.keys);
    free(b.outs);
    free(b.items);
    free(b.st);
    free(b.value);
    return rc == CLI_EXIT_USAGE ? rc : rc ? 1 : 0;
}
