/* tests/test_cli_rstream.c - `idem dedup` and `idem run` between Redis
 * Streams, on a real redis-server: order and fields kept, nothing left
 * pending, kill -9 at random moments (with a local: store and with the
 * store on the same Redis), two consumers splitting one stream, a dead
 * consumer's entries taken over, entries trimmed under the consumer.
 *
 * Every check reads the output stream itself: each key's first entry
 * exactly once, in input order, with its fields unchanged, and the
 * group's pending list empty at the end. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "killloop.h"
#include "redis_harness.h"

static redisContext *rc;
static char in[128], out[128];  /* stream names, unique to the test */
static char addr[64];

static void setup(void)
{
    t_dir_init();
    snprintf(addr, sizeof addr, "%s", th_redis_addr());
    rc = th_connect(th_first_port(addr));
    snprintf(in, sizeof in, "%sin", th_prefix());
    snprintf(out, sizeof out, "%sout", th_prefix());
}

static void teardown(void)
{
    freeReplyObject(th_cmd(rc, "DEL %s %s", in, out));
    redisFree(rc);
    t_dir_fini();
}

TestSuite(rstream, .init = setup, .fini = teardown, .timeout = 300);

/* On the shared cluster: both streams in one slot (a hash tag). The
 * URIs name another node than the slot's owner, which redirects them
 * (MOVED). rc is a connection to the owner. */
static void setup_cluster(void)
{
    t_dir_init();
    const char *all = th_cluster_addr();
    const char *p = th_prefix();
    snprintf(in, sizeof in, "{%s}in", p);
    snprintf(out, sizeof out, "{%s}out", p);
    redisContext *first = th_connect(th_first_port(all));
    redisReply *r = th_cmd(first, "CLUSTER KEYSLOT %s", in);
    int owner = th_slot_owner(th_first_port(all), (unsigned)r->integer);
    freeReplyObject(r);
    redisFree(first);
    rc = th_connect(owner);
    for (const char *a = all; a; a = strchr(a, ',') ? strchr(a, ',') + 1
                                                    : NULL)
        if (th_first_port(a) != owner) {
            snprintf(addr, sizeof addr, "127.0.0.1:%d", th_first_port(a));
            break;
        }
}

TestSuite(rstream_cluster, .init = setup_cluster, .fini = teardown,
          .timeout = 300);

#define MAXN 5000
static int note_of[MAXN];  /* key k's first entry: its note */

/* n entries {event_id, amount, note}: one in five repeats an earlier
 * key, fresh keys are numbered in input order. Into the input stream,
 * or as JSON lines into f. Returns the number of distinct keys. */
static int fill_to(int n, FILE *f)
{
    int fresh = 0;
    unsigned x = 777;
    cr_assert_leq(n, MAXN);
    for (int i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        int repeat = (x >> 8) % 5 == 0 && fresh;
        int k = repeat ? (int)((x >> 12) % fresh) : fresh++;
        if (!repeat)
            note_of[k] = i;
        if (f)
            fprintf(f, "{\"event_id\":\"e%d\",\"amount\":\"%d\",\"note\":"
                    "\"n%d\"}\n", k, k * 7 % 1000, i);
        else
            freeReplyObject(th_cmd(rc, "XADD %s * event_id e%d amount %d "
                                   "note n%d", in, k, k * 7 % 1000, i));
    }
    return fresh;
}

static long long out_len(void)
{
    redisReply *r = th_cmd(rc, "XLEN %s", out);
    long long n = r->integer;
    freeReplyObject(r);
    return n;
}

static int fill(int n)
{
    return fill_to(n, NULL);
}

static int key_number(const char *s)
{
    return s[0] == 'e' ? (int)strtol(s + 1, NULL, 10) : -1;
}

/* The output stream holds keys e0 .. e(nkeys-1) once each, each entry's
 * fields those of its key's first input entry, in order, plus idem-key;
 * in input order unless `any_order` (two consumers: then an entry of
 * the key, whichever was claimed first). */
static void expect_output(int nkeys, int any_order)
{
    redisReply *r = th_cmd(rc, "XRANGE %s - +", out);
    cr_assert_eq(r->elements, (size_t)nkeys, "%zu entries for %d keys",
                 r->elements, nkeys);
    char *seen = calloc((size_t)nkeys, 1);
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *f = r->element[i]->element[1];
        cr_assert_eq(f->elements, 8);
        cr_assert_str_eq(f->element[0]->str, "event_id");
        cr_assert_str_eq(f->element[2]->str, "amount");
        cr_assert_str_eq(f->element[4]->str, "note");
        cr_assert_str_eq(f->element[6]->str, "idem-key");
        cr_assert_str_eq(f->element[7]->str, f->element[1]->str);
        int k = key_number(f->element[1]->str);
        cr_assert(k >= 0 && k < nkeys && !seen[k], "key %s twice or "
                  "unknown", f->element[1]->str);
        seen[k] = 1;
        cr_assert(any_order || k == (int)i, "entry %zu holds %s", i,
                  f->element[1]->str);
        char want[16];
        snprintf(want, sizeof want, "%d", k * 7 % 1000);
        cr_assert_str_eq(f->element[3]->str, want);
        /* Two consumers race for a key: either entry may win. */
        snprintf(want, sizeof want, "n%d", note_of[k]);
        cr_assert(any_order || !strcmp(f->element[5]->str, want),
                  "key e%d: note %s, not its first entry's", k,
                  f->element[5]->str);
    }
    free(seen);
    freeReplyObject(r);
}

/* Nothing pending in group g of the input stream. */
static void expect_nothing_pending(const char *g)
{
    redisReply *r = th_cmd(rc, "XPENDING %s %s", in, g);
    cr_assert_eq(r->element[0]->integer, 0, "%lld entries still pending",
                 r->element[0]->integer);
    freeReplyObject(r);
}

/* Set: the streams' URIs ask for read-back though the store is on
 * their server (one_script=0). */
static int read_back_only;

static const char *src(const char *params)
{
    static char b[2][512];
    static int t;
    t ^= 1;
    snprintf(b[t], sizeof b[t], "'redis-stream://%s/%s?%s%s'", addr, in,
             params, read_back_only ? "&one_script=0" : "");
    return b[t];
}

static const char *dst(void)
{
    static char b[512];
    snprintf(b, sizeof b, "'redis-stream://%s/%s%s'", addr, out,
             read_back_only ? "?one_script=0" : "");
    return b;
}

Test(rstream, dedup_keeps_first_entries_in_order_with_their_fields)
{
    int nkeys = fill(300);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 300ms --batch 64 2> err",
                       src("group=g"), dst()), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
    /* Again: a new group reads it all again, every key a duplicate. */
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 300ms 2> err", src("group=g2"), dst()),
                 0);
    expect_output(nkeys, 0);
    expect_nothing_pending("g2");
}

/* Kill runs of args (tests/killloop.h): every other one kills itself
 * after 1 to 8 batches, and every one is killed within span seconds;
 * then one run finishes the input. Returns the kills that landed. */
static int cut_power;  /* kill_loop: each kill is a power cut too */

static long kill_loop(const char *args, double span, long nkills)
{
    t_kill_plan p = {.args = args, .span = span, .nkills = nkills,
                     .tries = 4, .at_max = 8, .every = 2,
                     .power_cut = cut_power};
    long landed = t_kill_loop(&p);
    cr_assert_eq(t_cli(t_dir, "%s 2>>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    return landed;
}

/* The time one whole run of args takes, on a copy of the input. */
static double clean_span(const char *args)
{
    int64_t t0 = t_mono_ms();
    cr_assert_eq(t_cli(t_dir, "%s 2>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    return (double)(t_mono_ms() - t0) / 1e3;
}

/* Did runs logged in err commit their entries in one script with the
 * store (stream.c's join_store says so at start; a run killed before
 * that says nothing)? How many said so. */
static size_t one_script_runs(void)
{
    char *e = t_read(t_at("err"), NULL);
    size_t n = 0;
    for (const char *p = e; (p = strstr(p, "one-script commit: the store's "
                                        "records with the entries written "
                                        "to")); p++)
        n++;
    free(e);
    return n;
}

/* joined: the store is on the streams' server, so each run commits in
 * one script; else every run uses read-back. */
static void dedup_kill9(const char *store, long nkills, int joined)
{
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    int nkeys = fill(3000);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 200ms --batch 50 --lease 1s --commit-interval "
             "20ms --store %s", src("group=clean"), dst(), store);
    double span = clean_span(args);
    expect_output(nkeys, 0);
    freeReplyObject(th_cmd(rc, "DEL %s", out));
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 200ms --batch 50 --lease 1s --commit-interval "
             "20ms --store %s --job k9", src("group=g"), dst(), store);
    long landed = kill_loop(args, span, nkills);
    /* Kills land while there is work: once the input is done, runs end
     * too soon to be hit, so how many land depends on the machine. */
    cr_assert_geq(landed, nkills < 3 ? nkills : 3, "only %ld kills landed",
                  landed);
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
    size_t ones = one_script_runs();
    if (joined)
        cr_assert_gt(ones, 0, "no run committed in one script");
    else
        cr_assert_eq(ones, 0, "%zu runs committed in one script", ones);
    cr_log_info("dedup stream to stream, store %s: %ld kills, %zu runs in "
                "one script (seed %u)", store, landed, ones, seed);
}

Test(rstream, dedup_kill9_with_a_local_store)
{
    dedup_kill9("local:store", t_kills(25), 0);
}

Test(rstream, dedup_kill9_with_the_store_on_the_same_redis)
{
    char store[256];
    snprintf(store, sizeof store, "'redis://%s?prefix=%s'", addr,
             th_prefix());
    dedup_kill9(store, t_kills(25), 1);
}

/* The same server, but read-back asked for (one_script=0 on the output:
 * the A side of bench/streams.sh): that path stays exact too. */
Test(rstream, dedup_kill9_same_redis_with_read_back)
{
    char store[256];
    snprintf(store, sizeof store, "'redis://%s?prefix=%s'", addr,
             th_prefix());
    read_back_only = 1;
    dedup_kill9(store, t_kills(10), 0);
    read_back_only = 0;
}

/* The store on another server than the streams: read-back, exact. */
Test(rstream, dedup_kill9_store_on_another_redis)
{
    th_servers own = {0};
    th_start_single(&own);
    char store[256];
    snprintf(store, sizeof store, "'redis://127.0.0.1:%d?prefix=%s'",
             own.ports[0], th_prefix());
    dedup_kill9(store, t_kills(10), 0);
    th_stop(&own);
}

/* run: each key's result once, in order, after kills; the handler's
 * answer found in the sink after a crash is not asked for again. store:
 * "" for the default (local:), else a --store option. */
static void run_kill9_n(const char *store, long nkills)
{
    srand((unsigned)time(NULL));
    int nkeys = fill(600);
    char args[2048];
    snprintf(args, sizeof args, "run --key event_id --from %s --to %s "
             "--idle-exit 200ms --batch 20 --lease 1s --commit-interval "
             "10ms --exec '\"$IDEM_PROGS/handler\" log' --job r %s",
             src("group=g"), dst(), store);
    long landed = kill_loop(args, 1.5, nkills);
    cr_assert_geq(landed, nkills < 3 ? nkills : 3);
    redisReply *r = th_cmd(rc, "XRANGE %s - +", out);
    cr_assert_eq(r->elements, (size_t)nkeys, "%zu results for %d keys",
                 r->elements, nkeys);
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *f = r->element[i]->element[1];
        char key[32];
        snprintf(key, sizeof key, "e%zu", i);
        cr_assert_eq(f->elements, 8);
        cr_assert_str_eq(f->element[0]->str, "key");
        cr_assert_str_eq(f->element[1]->str, key);
        cr_assert_str_eq(f->element[3]->str, "done");
        cr_assert(strstr(f->element[5]->str, "\"ok\":true"));
        cr_assert_str_eq(f->element[7]->str, key);
    }
    freeReplyObject(r);
    expect_nothing_pending("g");
}

static void run_kill9(const char *store)
{
    run_kill9_n(store, t_kills(15));
}

Test(rstream, run_kill9_results_once_in_order)
{
    run_kill9("");
}

/* The kills of dedup_kill9 and run_kill9 on a local store, each a power
 * cut too (t_power_cut): what a kill -9 leaves in the page cache is lost. */
Test(rstream, dedup_power_cuts_with_a_local_store)
{
    cut_power = 1;
    dedup_kill9("local:store", t_kills(10), 0);
    cut_power = 0;
}

Test(rstream, run_power_cuts_results_once_in_order)
{
    cut_power = 1;
    run_kill9_n("", t_kills(4));
    cut_power = 0;
}

/* The same with the store on the streams' server: one script commits
 * the results, the completions and the acknowledgements. */
Test(rstream, run_kill9_with_the_store_on_the_same_redis)
{
    char store[256];
    snprintf(store, sizeof store, "--store 'redis://%s?prefix=%s'", addr,
             th_prefix());
    run_kill9(store);
    cr_assert(t_grep(t_at("err"), "one-script commit"));
}

/* Two consumers of one group, sharing a Redis store, split the stream;
 * together they write each key once. */
Test(rstream, two_consumers_split_a_stream)
{
    int nkeys = fill(2000);
#define CONSUMER "dedup --key event_id --from %s --to %s --idle-exit 500ms " \
                 "--batch 20 --lease 2s --store 'redis://%s?prefix=%s' "    \
                 "2>err%d"
    const char *store = th_prefix();  /* one store for both */
    pid_t a = t_cli_start(t_dir, CONSUMER, src("group=g&consumer=a"), dst(),
                          addr, store, 1);
    pid_t b = t_cli_start(t_dir, CONSUMER, src("group=g&consumer=b"), dst(),
                          addr, store, 2);
    cr_assert_eq(t_wait(a), 0, "%s", t_read(t_at("err1"), NULL));
    cr_assert_eq(t_wait(b), 0, "%s", t_read(t_at("err2"), NULL));
    expect_output(nkeys, 1);
    expect_nothing_pending("g");
    redisReply *r = th_cmd(rc, "XINFO CONSUMERS %s g", in);
    cr_assert_eq(r->elements, 2, "both consumers read");
    freeReplyObject(r);
}

/* A consumer killed with entries pending: another one takes them over
 * once they are idle past the lease, and writes nothing twice. */
Test(rstream, a_dead_consumers_entries_are_taken_over)
{
    int nkeys = fill(200);
    pid_t a = t_cli_start(t_dir, "run --key event_id --from %s --to %s "
                          "--batch 50 --lease 1s --commit-interval 10ms "
                          "--exec '\"$IDEM_PROGS/handler\" sleep=20' "
                          "2>err1", src("group=g&consumer=a"), dst());
    /* Killed once it holds entries, however slow the machine: polled,
     * not slept, so a loaded run does not kill it before its first read. */
    long long pending = 0;
    for (int i = 0; i < 1000 && !pending; i++) {
        usleep(10 * 1000);
        redisReply *p = th_cmd(rc, "XPENDING %s g", in);
        /* an error until the consumer has made its group */
        pending = p->type == REDIS_REPLY_ARRAY ? p->element[0]->integer : 0;
        freeReplyObject(p);
    }
    kill(a, SIGKILL);
    t_wait(a);
    cr_assert_gt(pending, 0, "the consumer read nothing in 10 s: %s",
                 t_read(t_at("err1"), NULL));
    redisReply *r;
    cr_assert_eq(t_cli(t_dir, "run --key event_id --from %s --to %s "
                       "--idle-exit 2500ms --lease 1s --exec "
                       "'\"$IDEM_PROGS/handler\"' 2>err2",
                       src("group=g&consumer=b"), dst()), 0, "%s",
                 t_read(t_at("err2"), NULL));
    r = th_cmd(rc, "XRANGE %s - +", out);
    cr_assert_eq(r->elements, (size_t)nkeys, "%zu results for %d keys "
                 "(%lld were pending)", r->elements, nkeys, pending);
    char *seen = calloc((size_t)nkeys, 1);
    for (size_t i = 0; i < r->elements; i++) {
        int k = key_number(r->element[i]->element[1]->element[1]->str);
        cr_assert(k >= 0 && k < nkeys && !seen[k]);
        seen[k] = 1;
    }
    free(seen);
    freeReplyObject(r);
    expect_nothing_pending("g");
}

/* Entries deleted while pending are reported and acknowledged, never
 * waited for. */
Test(rstream, entries_trimmed_under_the_consumer_are_skipped_and_said)
{
    fill(100);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 200ms --batch 10 2>err "
                       "--store local:store", src("group=g"), dst()), 0);
    freeReplyObject(th_cmd(rc, "DEL %s", out));
    /* Read everything into consumer a's pending list, then trim. */
    freeReplyObject(th_cmd(rc, "XGROUP CREATE %s g2 0", in));
    freeReplyObject(th_cmd(rc, "XREADGROUP GROUP g2 a COUNT 1000 STREAMS "
                           "%s >", in));
    freeReplyObject(th_cmd(rc, "XTRIM %s MAXLEN 10", in));
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 200ms --store local:store2 2>err",
                       src("group=g2&consumer=a"), dst()), 0);
    cr_assert(t_grep(t_at("err"), "90 entries of the source had been "
                                  "deleted"), "%s", t_read(t_at("err"), NULL));
    expect_nothing_pending("g2");
    redisReply *r = th_cmd(rc, "XLEN %s", out);
    cr_assert_leq(r->integer, 10);
    freeReplyObject(r);
}

Test(rstream, bad_uris_and_combinations_say_what_is_wrong)
{
    struct {
        const char *args, *says;
    } cases[] = {
        {"--from 'redis-stream://127.0.0.1:1/s'", "?group=NAME"},
        {"--from 'redis-stream://127.0.0.1:1/s?group=g&bogus=1'",
         "unknown parameter 'bogus'"},
        {"--from 'redis-stream://127.0.0.1:99999/s?group=g'", "port"},
        {"--from 'redis-stream://127.0.0.1:1?group=g'", "no stream name"},
        {"--to 'redis-stream://127.0.0.1:1/s?group=g'",
         "unknown parameter 'group'"},
        {"--from 'redis-stream://u:secret@127.0.0.1:1/s?group=g&x=1'",
         "unknown parameter"},
        {"--from in --to out in", "--from and input files"},
        {"--idle-exit 1s in", "--idle-exit is for a stream source"},
        {"--to out --output out2 in", "--to and --output"},
        {"--key @id in", "--key @id (the entry's ID) is for a stream"},
    };
    t_put("in", "{}\n");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_eq(t_cli(t_dir, "dedup --key id %s 2>err", cases[i].args),
                     2, "%s", cases[i].args);
        cr_assert(t_grep(t_at("err"), cases[i].says), "%s: %s",
                  cases[i].args, t_read(t_at("err"), NULL));
        cr_assert(!t_grep(t_at("err"), "secret"));
    }
    /* A server that is not there: exit 1 and the address, no password. */
    cr_assert_eq(t_cli(t_dir, "dedup --key id --from "
                       "'redis-stream://u:secret@127.0.0.1:1/s?group=g' "
                       "2>err"), 1);
    cr_assert(t_grep(t_at("err"), "127.0.0.1:1"));
    cr_assert(!t_grep(t_at("err"), "secret"));
}

Test(rstream_cluster, dedup_kill9_on_a_cluster_with_its_store_there)
{
    char store[1024];
    snprintf(store, sizeof store, "'redis-cluster://%s?prefix=%s'",
             th_cluster_addr(), th_prefix());
    dedup_kill9(store, t_kills(10), 0);  /* read-back: below */
}

/* --key @id: the entry's ID is the key, so a stream read again (a new
 * group, a replay) adds nothing. */
Test(rstream, the_entry_id_as_the_key)
{
    fill(50);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(t_cli(t_dir, "dedup --key @id --from %s --to %s "
                           "--idle-exit 200ms 2>err",
                           src(i ? "group=again" : "group=g"), dst()), 0,
                     "%s", t_read(t_at("err"), NULL));
    redisReply *r = th_cmd(rc, "XRANGE %s - +", out);
    redisReply *q = th_cmd(rc, "XRANGE %s - +", in);
    cr_assert_eq(r->elements, 50);
    for (size_t i = 0; i < 50; i++)
        cr_assert_str_eq(r->element[i]->element[1]->element[7]->str,
                         q->element[i]->element[0]->str);
    freeReplyObject(r);
    freeReplyObject(q);
}

/* SIGTERM stops a stream run gracefully (exit 0: what was done is
 * committed and acknowledged), and the next run goes on from there. */
Test(rstream, sigterm_stops_gracefully_and_the_next_run_goes_on)
{
    int nkeys = fill(300);
    pid_t p = t_cli_start(t_dir, "run --key event_id --from %s --to %s "
                          "--batch 20 --commit-interval 10ms --exec "
                          "'\"$IDEM_PROGS/handler\" sleep=10' 2>err",
                          src("group=g"), dst());
    /* Stopped once something is written, however slow the machine: the
     * rest takes seconds (10 ms an entry), so the stop lands mid-stream. */
    for (int i = 0; i < 3000 && out_len() == 0; i++)
        usleep(10 * 1000);
    kill(p, SIGTERM);
    cr_assert_eq(t_wait(p), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "stopped by SIGTERM"));
    long long done = out_len();
    cr_assert(done > 0 && done < nkeys, "%lld of %d done at the stop",
              done, nkeys);
    cr_assert_eq(t_cli(t_dir, "run --key event_id --from %s --to %s "
                       "--idle-exit 300ms --exec '\"$IDEM_PROGS/handler\"' "
                       "2>err", src("group=g"), dst()), 0);
    cr_assert_eq(out_len(), nkeys);
    expect_nothing_pending("g");
}

/* An input that carries an idem-key of its own (an upstream idem keyed
 * by another field): the output's idem-key is this job's key, in place,
 * so that read-back finds this job's keys. */
Test(rstream, an_upstream_idem_key_is_replaced_in_place)
{
    freeReplyObject(th_cmd(rc, "XADD %s * idem-key up1 user u7 n 1", in));
    freeReplyObject(th_cmd(rc, "XADD %s * idem-key up2 user u7 n 2", in));
    freeReplyObject(th_cmd(rc, "XADD %s * idem-key u8 user u8 n 3", in));
    cr_assert_eq(t_cli(t_dir, "dedup --key user --from %s --to %s "
                       "--idle-exit 200ms 2>err", src("group=g"), dst()),
                 0);
    redisReply *r = th_cmd(rc, "XRANGE %s - +", out);
    cr_assert_eq(r->elements, 2);
    const char *want[2][6] = {{"idem-key", "u7", "user", "u7", "n", "1"},
                              {"idem-key", "u8", "user", "u8", "n", "3"}};
    for (size_t i = 0; i < 2; i++) {
        redisReply *f = r->element[i]->element[1];
        cr_assert_eq(f->elements, 6);
        for (size_t j = 0; j < 6; j++)
            cr_assert_str_eq(f->element[j]->str, want[i][j]);
    }
    freeReplyObject(r);
}

/* ---- through Redis Sentinel */

static th_servers sv;

static int is_master_port(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    redisReply *r = c && !c->err ? redisCommand(c, "ROLE") : NULL;
    int m = r && r->type == REDIS_REPLY_ARRAY && r->elements &&
            !strcmp(r->element[0]->str, "master");
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return m;
}

/* Own servers: a master, its replica, three sentinels watching it as
 * "m"; the URIs name the sentinels. */
static void setup_sentinel(void)
{
    t_dir_init();
    th_start_sentinel(&sv, "m");
    snprintf(addr, sizeof addr, "127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d",
             sv.ports[2], sv.ports[3], sv.ports[4]);
    snprintf(in, sizeof in, "in");
    snprintf(out, sizeof out, "out");
    rc = th_connect(sv.ports[0]);
}

static void teardown_sentinel(void)
{
    redisFree(rc);
    th_stop(&sv);
    t_dir_fini();
}

TestSuite(rstream_sentinel, .init = setup_sentinel,
          .fini = teardown_sentinel, .timeout = 300);

/* kill -9 of the master while dedup runs through the sentinels, with the
 * output's entries replicated before each commit (wait=1): the run goes
 * on, or a rerun does, on the promoted replica, and the output holds each
 * key once, in order. */
Test(rstream_sentinel, the_master_dies_mid_stream)
{
    int nkeys = fill(2000);
    freeReplyObject(th_cmd(rc, "WAIT 1 5000"));
    char from[512], to[512];
    snprintf(from, sizeof from, "'redis-stream://%s/in?sentinel=m&group=g"
             "&timeout_ms=30000'", addr);
    snprintf(to, sizeof to, "'redis-stream://%s/out?sentinel=m&wait=1&"
             "timeout_ms=30000'", addr);
#define FAILOVER_RUN "dedup --key event_id --from %s --to %s --idle-exit " \
                     "1s --batch 20 --lease 1s --store local:store 2>>err"
    pid_t p = t_cli_start(t_dir, FAILOVER_RUN, from, to);
    usleep(300 * 1000);
    int early;
    cr_assert_eq(waitpid(p, &early, WNOHANG), 0, "dedup ended before the "
                 "master died: nothing tested");
    th_signal(&sv, sv.ports[0], SIGKILL);
    for (int i = 0; i < 600 && !is_master_port(sv.ports[1]); i++)
        usleep(100 * 1000);
    cr_assert(is_master_port(sv.ports[1]), "no failover");
    /* The old master comes back as a replica, so that WAIT 1 can be
     * met again. */
    th_restart(&sv, sv.ports[0]);
    redisContext *old = th_connect(sv.ports[0]);
    char port[16];
    snprintf(port, sizeof port, "%d", sv.ports[1]);
    freeReplyObject(th_cmd(old, "REPLICAOF 127.0.0.1 %s", port));
    redisFree(old);
    int st = t_wait(p);
    for (int i = 0; st != 0 && i < 5; i++)
        st = t_cli(t_dir, FAILOVER_RUN, from, to);
    cr_assert_eq(st, 0, "%s", t_read(t_at("err"), NULL));
    redisFree(rc);
    rc = th_connect(sv.ports[1]);
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
}

Test(rstream, through_the_shared_sentinels)
{
    const char *s = th_sentinel_addr();  /* "S1,S2,S3/NAME" */
    const char *slash = strchr(s, '/');
    cr_assert(slash);
    char hosts[256];
    snprintf(hosts, sizeof hosts, "%.*s", (int)(slash - s), s);
    /* The shared master holds this test's streams. */
    redisContext *sc = th_connect(th_first_port(hosts));
    redisReply *r = th_cmd(sc, "SENTINEL get-master-addr-by-name %s",
                           slash + 1);
    redisFree(rc);
    rc = th_connect((int)strtol(r->element[1]->str, NULL, 10));
    freeReplyObject(r);
    redisFree(sc);
    int nkeys = fill(100);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from "
                       "'redis-stream://%s/%s?sentinel=%s&group=g' --to "
                       "'redis-stream://%s/%s?sentinel=%s' --idle-exit "
                       "200ms 2>err", hosts, in, slash + 1, hosts, out,
                       slash + 1), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
}

/* `idem ARGS` in t_dir, stderr appended to err; with kill_at, killed by
 * itself there (IDEM_TEST_KILL_AT). Its exit status. */
static int cli_at(const char *kill_at, const char *args)
{
    if (kill_at)
        setenv("IDEM_TEST_KILL_AT", kill_at, 1);
    int st = t_cli(t_dir, "%s 2>>err", args);
    unsetenv("IDEM_TEST_KILL_AT");
    return st;
}

/* The output stream is known by the stream it names: the same output
 * with parameters added keeps the job and its key space,
 * so a replay of the input (a new group) writes nothing again. */
Test(rstream, the_output_keeps_its_keys_whatever_its_uri_parameters)
{
    int nkeys = fill(100);
    char to[512];
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 200ms 2>err", src("group=g"), dst()),
                 0);
    snprintf(to, sizeof to, "'redis-stream://%s/%s?timeout_ms="
             "3000&maxlen=~200000'", addr, out);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 200ms 2>err", src("group=g2"), to), 0,
                 "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(out_len(), nkeys);
}

/* --from and --to naming one stream (however written) is refused: each
 * entry written would be read again (under --key @id, without end). */
Test(rstream, the_input_stream_as_the_output_is_refused)
{
    char to[512];
    snprintf(to, sizeof to, "'redis-stream://%s/0/%s?timeout_ms=3000'",
             addr, in);
    freeReplyObject(th_cmd(rc, "XADD %s * event_id a", in));
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 200ms 2>err", src("group=g"), to), 2);
    cr_assert(t_grep(t_at("err"), "--from and --to name one "
                     "stream"), "%s", t_read(t_at("err"), NULL));
}

/* `run` of the handler logging to t_dir/log, from stream `from` (group g,
 * the consumer named after the host) to `to`, with the store at prefix
 * `store` of the test's server, into buf. */
static void logged_run(char *buf, size_t n, const char *to,
                       const char *from, const char *store)
{
    snprintf(buf, n, "run --key event_id --to %s --lease 1s --batch 1 "
             "--store 'redis://%s?prefix=%s' --idle-exit 300ms --exec "
             "'\"$IDEM_PROGS/handler\" %s/log' --from "
             "'redis-stream://%s/%s?group=g'", to, addr, store, t_dir, addr,
             from);
}

/* Killed (IDEM_TEST_KILL_AT) at points 1..3 of `point` in turn, `runs`
 * times, then run to its end. Every run must be killed there: the point
 * comes before the input is done. */
static void killed_at(const char *point, int runs, const char *args)
{
    for (int i = 0; i < runs; i++) {
        char at[64];
        snprintf(at, sizeof at, "%s:%d", point, 1 + i % 3);
        cr_assert_eq(cli_at(at, args), 128 + SIGKILL, "run %d not killed "
                     "at %s: %s", i, at, t_read(t_at("err"), NULL));
    }
    cr_assert_eq(cli_at(NULL, args), 0, "%s", t_read(t_at("err"), NULL));
}

/* Acknowledgements are not waited for (rsource.c): a kill -9 just after
 * an XACK was sent, before its answer was read. Its entries were
 * committed; acknowledged or not, they are duplicates when they come
 * again: each key still once in the output, in order, and nothing is
 * left pending. Through read-back (a local: store) and for run too. */
Test(rstream, kill9_with_an_acknowledgement_unanswered)
{
    int nkeys = fill(1500);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 200ms --batch 50 --store local:store --job ka",
             src("group=g"), dst());
    killed_at("acks-sent", 8, args);
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
    freeReplyObject(th_cmd(rc, "DEL %s", out));
    snprintf(args, sizeof args, "run --key event_id --from %s --to %s "
             "--idle-exit 200ms --batch 50 --exec '\"$IDEM_PROGS/handler\" "
             "log' --store local:store --job kr", src("group=r"), dst());
    killed_at("acks-sent", 6, args);
    redisReply *r = th_cmd(rc, "XRANGE %s - +", out);
    cr_assert_eq(r->elements, (size_t)nkeys, "%zu results for %d keys",
                 r->elements, nkeys);
    for (size_t i = 0; i < r->elements; i++) {
        char key[32];
        snprintf(key, sizeof key, "e%zu", i);
        cr_assert_str_eq(r->element[i]->element[1]->element[1]->str, key);
    }
    freeReplyObject(r);
    expect_nothing_pending("r");
    /* Killed between batches, the handler had nothing in flight. */
    cr_assert_eq(t_sh("test -z \"$(cut -d' ' -f1 '%s/log' | sort | uniq -d)"
                      "\"", t_dir), 0, "the handler ran a key twice");
}

/* On a local store a batch's sync runs while the next batch's entries
 * are written, and the batch is acknowledged after that (stream.c,
 * sync_overlaps): a kill -9 just after a sync was started, before its
 * wait and acknowledgements, leaves that batch and the one read after
 * it pending with their entries written. Each key still once in the
 * output, in order, and nothing left pending. */
Test(rstream, kill9_with_a_sync_in_flight)
{
    int nkeys = fill(1500);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 200ms --batch 50 --store local:store --job ks",
             src("group=g"), dst());
    killed_at("sync-started", 9, args);
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
}

/* Each batch of `batch` entries holds the keys of the one before again
 * (keys 0..batch-1 twice, then the next batch of keys twice...): every
 * duplicate arrives while its original's sync may still be running.
 * The number of keys. */
static int fill_echoed(int n, int batch)
{
    for (int i = 0; i < n; i++) {
        int k = i / (2 * batch) * batch + i % batch;
        if (i % (2 * batch) < batch)
            note_of[k] = i;
        freeReplyObject(th_cmd(rc, "XADD %s * event_id e%d amount %d "
                               "note n%d", in, k, k * 7 % 1000, i));
    }
    return (n + 2 * batch - 1) / (2 * batch) * batch;
}

/* A duplicate in the batch after its original, whose sync was started
 * and not yet waited for: a kill -9 just after each batch's sync
 * started leaves the duplicate pending with its original (never
 * acknowledged before it), and the reruns write each key once. */
Test(rstream, kill9_with_each_duplicate_behind_a_sync_in_flight)
{
    int nkeys = fill_echoed(600, 10);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 200ms --batch 10 --store local:store --job ke",
             src("group=g"), dst());
    killed_at("sync-started", 12, args);
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
}

/* SIGTERM while batches are read ahead and a sync runs: the stop
 * acknowledges nothing not synced, drops what was read ahead, and the
 * next run writes each key once, in order, leaving nothing pending. */
Test(rstream, sigterm_with_batches_read_ahead_and_a_sync_in_flight)
{
    int nkeys = fill_echoed(1200, 10);
    pid_t p = t_cli_start(t_dir, "dedup --key event_id --from %s --to %s "
                          "--batch 10 --store local:store --job kt 2>err",
                          src("group=g"), dst());
    for (int i = 0; i < 3000 && out_len() == 0; i++)
        usleep(10 * 1000);
    kill(p, SIGTERM);
    cr_assert_eq(t_wait(p), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "stopped by SIGTERM"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 300ms --batch 10 --store local:store "
                       "--job kt 2>err", src("group=g"), dst()), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
}

/* Power cuts at points[] in turn, each the first, second and third time
 * it is reached in a run, `runs` runs in all; then a whole run: each of
 * the nkeys keys once, in order, and nothing pending. */
static void cut_through(const char *const *points, int npoints, int runs,
                        const char *args, int nkeys)
{
    for (int i = 0; i < runs; i++) {
        char at[64];
        snprintf(at, sizeof at, "%s:%d", points[i / 3 % npoints],
                 1 + i % 3);
        cr_assert_eq(t_cli_cut_at(at, args), 128 + SIGKILL, "run %d not "
                     "killed at %s: %s", i, at, t_read(t_at("err"), NULL));
    }
    cr_assert_eq(t_cli_cut_at(NULL, args), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
}

/* The same as kill9_with_each_duplicate_behind_a_sync_in_flight, but
 * each kill is a power cut: the batch whose sync was in flight, and the
 * one after it, lose their records; none of their entries may have been
 * acknowledged, and the duplicates among them must still be told. */
Test(rstream, a_power_cut_with_each_duplicate_behind_a_sync_in_flight)
{
    int nkeys = fill_echoed(600, 10);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 200ms --batch 10 --store local:store --job kp",
             src("group=g"), dst());
    static const char *const points[] = {"sync-started"};
    cut_through(points, 1, 12, args, nkeys);
}

/* A power cut at each kill point in turn (the first three times it is
 * reached in a run), on the overlapped path and the input's own
 * duplicates (fill): each key once, in order, nothing pending. */
Test(rstream, a_power_cut_at_every_kill_point)
{
    static const char *const points[] = {"sink-written", "sync-started",
                                         "acks-sent"};
    int nkeys = fill(1500);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 200ms --batch 50 --store local:store --job kc",
             src("group=g"), dst());
    cut_through(points, 3, 9, args, nkeys);
}

/* Two pipelines on one host into one output, both consumers named after
 * the host: each has its own checkpoint. A reads k, writes it and dies
 * before its commit; B then commits further entries. When A runs again
 * (the recent window is 1 ms here), it reads back from its own position
 * and does not run or write k again. */
Test(rstream, two_sources_into_one_output_keep_their_own_positions)
{
    char store[128], a[160], to[512], run_a[2048], run_b[2048];
    snprintf(store, sizeof store, "%s", th_prefix());
    snprintf(a, sizeof a, "%sa", store);
    freeReplyObject(th_cmd(rc, "XADD %s * event_id k", a));
    for (int i = 0; i < 20; i++)
        freeReplyObject(th_cmd(rc, "XADD %s * event_id b%d", in, i));
    /* Read-back is what this is about: the sink asks for it, though the
     * store is on its server (else A's entry would not exist). */
    snprintf(to, sizeof to, "'redis-stream://%s/%s?readback_ms=1&"
             "one_script=0'", addr, out);
    logged_run(run_a, sizeof run_a, to, a, store);
    logged_run(run_b, sizeof run_b, to, in, store);
    cr_assert_eq(cli_at("sink-written:1", run_a), 128 + SIGKILL);
    cr_assert_eq(cli_at(NULL, run_b), 0, "%s",
                 t_read(t_at("err"), NULL));
    sleep(1);  /* A's lease runs out */
    cr_assert_eq(cli_at(NULL, run_a), 0, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert_eq(out_len(), 21);
    cr_assert_eq(t_sh("grep -c '^k ' '%s/log' | grep -qx 1", t_dir), 0,
                 "the handler ran k again");
    freeReplyObject(th_cmd(rc, "DEL %s", a));
}

/* A field that is not UTF-8 makes an entry bad input under --key @id
 * and --line too (where the key needs no parse): skipped and said, not
 * written as one field "data" holding the entry's text. */
Test(rstream, an_entry_that_is_not_utf8_is_bad_input_whatever_the_key)
{
    const char *bin = "\xff\xfe";
    for (int line = 0; line < 2; line++) {
        freeReplyObject(th_cmd(rc, "DEL %s %s", in, out));
        freeReplyObject(th_cmd(rc, "XADD %s * event_id a blob %b", in, bin,
                               (size_t)2));
        freeReplyObject(th_cmd(rc, "XADD %s * event_id b", in));
        cr_assert_eq(t_cli(t_dir, "dedup %s --job j%d --from %s --to %s "
                           "--on-bad-input skip --idle-exit 200ms 2>err",
                           line ? "--line" : "--key @id", line,
                           src("group=g"), dst()), 0);
        cr_assert(t_grep(t_at("err"), "is not UTF-8"), "%s",
                  t_read(t_at("err"), NULL));
        cr_assert_eq(out_len(), 1);
        expect_nothing_pending("g");
        redisReply *r = th_cmd(rc, "XRANGE %s - +", out);
        cr_assert_str_eq(r->element[0]->element[1]->element[0]->str,
                         "event_id");
        cr_assert_str_eq(r->element[0]->element[1]->element[1]->str, "b");
        freeReplyObject(r);
    }
}

static long long pending(const char *g)
{
    redisReply *r = th_cmd(rc, "XPENDING %s %s", in, g);
    long long n = r->element[0]->integer;
    freeReplyObject(r);
    return n;
}

/* A key read back after a crash is one the dead run may have written:
 * once committed, its entry in the sink does not hide the key when it
 * comes again after its --ttl, new again, and is written again. */
Test(rstream, a_key_read_back_is_new_again_after_its_ttl)
{
    freeReplyObject(th_cmd(rc, "XADD %s * event_id k note 1", in));
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--ttl 1s --batch 1", src("group=g&consumer=c"), dst());
    char first[1100];
    snprintf(first, sizeof first, "%s --idle-exit 200ms", args);
    cr_assert_eq(cli_at("sink-written:1", first), 128 + SIGKILL);
    pid_t p = t_cli_start(t_dir, "%s --idle-exit 3s 2>>err", args);
    while (pending("g"))  /* until the rerun committed k (read back) */
        usleep(20 * 1000);
    sleep(2);  /* k's record has expired */
    freeReplyObject(th_cmd(rc, "XADD %s * event_id k note 2", in));
    cr_assert_eq(t_wait(p), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(out_len(), 2);
    expect_nothing_pending("g");
}

/* Two consumers of one group, each with a store of its own: a's entries,
 * written to the sink before a died and taken over by b, are looked for
 * in the sink though b's store never saw their keys. */
Test(rstream, entries_taken_over_are_looked_for_with_a_store_each)
{
    for (int i = 0; i < 20; i++)
        freeReplyObject(th_cmd(rc, "XADD %s * event_id e%d", in, i));
    char a[1024], b[1024];
    snprintf(a, sizeof a, "dedup --key event_id --from %s --to %s --lease "
             "500ms --batch 10 --idle-exit 200ms --store local:a",
             src("group=g&consumer=a"), dst());
    snprintf(b, sizeof b, "dedup --key event_id --from %s --to %s --lease "
             "500ms --batch 10 --idle-exit 1500ms --store local:b",
             src("group=g&consumer=b"), dst());
    cr_assert_eq(cli_at("sink-written:1", a), 128 + SIGKILL);
    cr_assert_eq(cli_at(NULL, b), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(out_len(), 20);
    expect_nothing_pending("g");
}

/* Worker A writes k and dies before its commit; worker B, which had
 * just read the sink's recent entries (for r1, a retry), takes k over as
 * soon as A's short lease runs out: it reads the sink again up to now,
 * finds k, and neither runs the handler for k nor writes it again. */
Test(rstream, a_takeover_reads_the_recent_entries_up_to_now)
{
    char a[160], store[128], cmd_a[2048], cmd_b[2048];
    snprintf(store, sizeof store, "%s", th_prefix());
    snprintf(a, sizeof a, "%sa", store);
    freeReplyObject(th_cmd(rc, "XADD %s * event_id k", a));
    freeReplyObject(th_cmd(rc, "XADD %s * event_id r1", in));
    freeReplyObject(th_cmd(rc, "XADD %s * event_id k", in));
    /* A's lease is long enough that A, renewing it every third while
     * its handler sleeps, keeps k on a loaded machine until it dies. */
    const char *common = "run --key event_id --lease 1s --batch 1 "
                         "--backoff 10ms";
    read_back_only = 1;  /* A's entry written before its commit */
    snprintf(cmd_a, sizeof cmd_a, "%s --to %s --store 'redis://%s?prefix="
             "%s' --from 'redis-stream://%s/%s?group=g&consumer=a' "
             "--idle-exit 2s --exec '\"$IDEM_PROGS/handler\" %s/log "
             "sleep=200'", common, dst(), addr, store, addr, a, t_dir);
    snprintf(cmd_b, sizeof cmd_b, "%s --to %s --store 'redis://%s?prefix="
             "%s' --from 'redis-stream://%s/%s?group=g&consumer=b' "
             "--idle-exit 3s --exec '\"$IDEM_PROGS/handler\" %s/log "
             "flaky=r1'", common, dst(), addr, store, addr, in, t_dir);
    setenv("IDEM_TEST_KILL_AT", "sink-written:1", 1);
    pid_t pa = t_cli_start(t_dir, "%s 2>>err", cmd_a);
    unsetenv("IDEM_TEST_KILL_AT");
    /* A holds k once its handler has it. */
    for (int i = 0; i < 1000 && t_sh("grep -q '^k ' '%s/log' 2>/dev/null",
                                     t_dir); i++)
        usleep(10 * 1000);
    cr_assert_eq(cli_at(NULL, cmd_b), 0, "%s",
                 t_read(t_at("err"), NULL));
    t_wait(pa);
    cr_assert_eq(t_sh("grep -c '^k ' '%s/log' | grep -qx 1", t_dir), 0,
                 "the handler ran k twice: %s",
                 t_read(t_at("log"), NULL));
    cr_assert_eq(out_len(), 2);
    freeReplyObject(th_cmd(rc, "DEL %s", a));
    read_back_only = 0;
}

/* A reply that hands entries over and is lost (here the server drops
 * the connection: the reply is over its output limit) is not sent again,
 * which would hand out the next entries and leave these pending unseen:
 * the pending list is read again. Here that fails too, so the run says
 * so (exit 1) instead of ending as idle with the entries left behind;
 * with the limit lifted, the next run does them, in order. */
Test(rstream, a_lost_delivery_is_not_skipped)
{
    th_servers own = {0};
    th_start_single(&own);
    redisContext *c = th_connect(own.ports[0]);
    freeReplyObject(th_cmd(c, "CONFIG SET client-output-buffer-limit "
                           "%s", "normal 256kb 256kb 0"));
    char blob[2001];
    memset(blob, 'x', 2000);
    blob[2000] = 0;
    for (int i = 0; i < 300; i++)
        freeReplyObject(th_cmd(c, "XADD in * event_id e%d blob %s", i,
                               blob));
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from "
             "'redis-stream://127.0.0.1:%d/in?group=g' --to "
             "'redis-stream://127.0.0.1:%d/out' --idle-exit 300ms",
             own.ports[0], own.ports[0]);
    cr_assert_eq(cli_at(NULL, args), 1, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "XREADGROUP"));
    freeReplyObject(th_cmd(c, "CONFIG SET client-output-buffer-limit "
                           "%s", "normal 0 0 0"));
    cr_assert_eq(cli_at(NULL, args), 0, "%s",
                 t_read(t_at("err"), NULL));
    redisReply *r = th_cmd(c, "XRANGE out - +");
    cr_assert_eq(r->elements, 300);
    for (size_t i = 0; i < 300; i++) {
        char want[16];
        snprintf(want, sizeof want, "e%zu", i);
        cr_assert_str_eq(r->element[i]->element[1]->element[1]->str, want);
    }
    freeReplyObject(r);
    redisFree(c);
    th_stop(&own);
}

/* run: a key that gave up (an entry with status gave_up; the key is
 * released) and comes again and is done: its done entry is written, not
 * taken for the gave_up one found in the sink. */
Test(rstream, a_key_that_gave_up_is_written_when_done_later)
{
    freeReplyObject(th_cmd(rc, "XADD %s * event_id k n 1", in));
    char args[1024];
    snprintf(args, sizeof args, "run --key event_id --from %s --to %s "
             "--idle-exit 200ms --max-attempts 2 --backoff 10ms",
             src("group=g"), dst());
    cr_assert_eq(t_cli(t_dir, "%s --exec '\"$IDEM_PROGS/handler\" retry=k' "
                       "2>>err", args), 3);
    freeReplyObject(th_cmd(rc, "XADD %s * event_id k n 2", in));
    cr_assert_eq(t_cli(t_dir, "%s --exec '\"$IDEM_PROGS/handler\"' 2>>err",
                       args), 0, "%s", t_read(t_at("err"), NULL));
    redisReply *r = th_cmd(rc, "XRANGE %s - +", out);
    cr_assert_eq(r->elements, 2);
    cr_assert_str_eq(r->element[0]->element[1]->element[3]->str,
                     "gave_up");
    cr_assert_str_eq(r->element[1]->element[1]->element[3]->str, "done");
    freeReplyObject(r);
}

/* A password holding a raw '?' ends the URI's authority early, and the
 * URI is refused; the refusal does not print the password, of a stream
 * or of the store. */
Test(rstream, a_password_with_a_question_mark_is_not_printed)
{
    t_write(t_at("in"), "{}\n", 3);
    cr_assert_eq(t_cli(t_dir, "dedup --key id --from 'redis-stream://"
                       "u:se?cret@127.0.0.1:1/s?group=g' 2>err"), 2);
    cr_assert_eq(t_cli(t_dir, "dedup --key id --store "
                       "'redis://u:se?cret@127.0.0.1:1' in 2>>err"), 2);
    cr_assert(!t_grep(t_at("err"), "se?cret"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(!t_grep(t_at("err"), "'u:se'"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "u:***@127.0.0.1:1"));
}

/* Files into a stream (any source goes with any output): read from the
 * start on every run, since the sink's checkpoint holds no input
 * position; after a kill -9 between the sink write and the commit, each
 * key's first line is in the stream once, in order. */
Test(rstream, files_into_a_stream_after_kill9)
{
    FILE *f = fopen(t_at("in.ndjson"), "w");
    cr_assert(f);
    int nkeys = fill_to(300, f);
    cr_assert_eq(fclose(f), 0);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --to %s --batch 20 "
             "in.ndjson", dst());
    cr_assert_eq(cli_at("sink-written:3", args), 128 + SIGKILL, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert_eq(cli_at(NULL, args), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --to %s < in.ndjson "
                       "2>>err", dst()), 0);
    expect_output(nkeys, 0);
}

/* A pipe into a stream, after a crash: every line may be one the dead
 * run wrote, so each key is looked for among the entries read back; one
 * found is this run's output from then on, and the key coming again
 * after its --ttl is written again, not hidden by it. */
Test(rstream, a_pipe_into_a_stream_finds_a_key_read_back_once)
{
    t_write(t_at("a"), "{\"id\":\"k\"}\n", 11);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key id --to %s --ttl 1s --batch 1 "
             "--store local:store", dst());
    setenv("IDEM_TEST_KILL_AT", "sink-written:1", 1);
    cr_assert_eq(t_sh("cd '%s' && \"$IDEM_CLI\" %s a 2>>err", t_dir, args),
                 128 + SIGKILL);
    unsetenv("IDEM_TEST_KILL_AT");
    cr_assert_eq(t_sh("cd '%s' && (cat a; sleep 2; cat a) | \"$IDEM_CLI\" "
                      "%s 2>>err", t_dir, args), 0, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert_eq(out_len(), 2, "%s", t_read(t_at("err"), NULL));
}

/* A server that stops answering (SIGSTOP) mid-batch: the write fails
 * within timeout_ms and says so, not with EAGAIN's text; the run stops
 * (exit 1) and a rerun, once the server is back, completes it. */
Test(rstream, a_server_that_stops_answering_is_said_so)
{
    th_servers own = {0};
    th_start_single(&own);
    redisContext *c = th_connect(own.ports[0]);
    freeReplyObject(th_cmd(c, "XADD in * event_id a"));
    char args[1024];
    snprintf(args, sizeof args, "run --key event_id --from "
             "'redis-stream://127.0.0.1:%d/in?group=g&timeout_ms=500' --to "
             "'redis-stream://127.0.0.1:%d/out?timeout_ms=500' --idle-exit "
             "300ms", own.ports[0], own.ports[0]);
    pid_t p = t_cli_start(t_dir, "%s --exec '\"$IDEM_PROGS/handler\" "
                          "sleep=1000' 2>err", args);
    usleep(500 * 1000);  /* the handler has the message */
    th_signal(&own, own.ports[0], SIGSTOP);
    int st = t_wait(p);
    th_signal(&own, own.ports[0], SIGCONT);
    cr_assert_eq(st, 1, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "no answer within timeout_ms"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(!t_grep(t_at("err"), "temporarily unavailable"));
    cr_assert_eq(t_cli(t_dir, "%s --exec '\"$IDEM_PROGS/handler\"' 2>err",
                       args), 0, "%s", t_read(t_at("err"), NULL));
    redisReply *r = th_cmd(c, "XLEN out");
    cr_assert_eq(r->integer, 1);
    freeReplyObject(r);
    redisFree(c);
    th_stop(&own);
}

/* A worker writes its batch and dies before its commit; its entries are
 * taken over by a worker of another name (a replaced pod) long after:
 * later than the sink's window (readback_ms=1 here stands for a wait of
 * minutes). The taker looks in the sink from the entries' first
 * delivery, not from a window, finds them, and writes nothing twice:
 * with a store shared by both, and with a store each. */
Test(rstream, a_takeover_after_the_window_writes_nothing_twice)
{
    for (int i = 0; i < 20; i++)
        freeReplyObject(th_cmd(rc, "XADD %s * event_id e%d", in, i));
    const char *stores[2][2] = {{"local:a", "local:b"}, {NULL, NULL}};
    char shared[256], a[1024], b[1024], to[512];
    snprintf(shared, sizeof shared, "'redis://%s?prefix=%s'", addr,
             th_prefix());
    stores[1][0] = stores[1][1] = shared;
    /* Read-back is what this is about (with the shared store, one script
     * would leave nothing written by the dead worker). */
    read_back_only = 1;
    snprintf(to, sizeof to, "'redis-stream://%s/%s?readback_ms=1&"
             "one_script=0'", addr, out);
    for (int v = 0; v < 2; v++) {
        char g[32];
        snprintf(g, sizeof g, "group=g%d", v);
        freeReplyObject(th_cmd(rc, "DEL %s", out));
        snprintf(a, sizeof a, "dedup --key event_id --from %s --to %s "
                 "--lease 300ms --batch 10 --idle-exit 200ms --store %s "
                 "--key-space s%d", src(g), dst(), stores[v][0], v);
        cr_assert_eq(cli_at("sink-written:1", a), 128 + SIGKILL);
        cr_assert_eq(out_len(), 10);
        sleep(1);  /* past a's lease, and far past the 1 ms window */
        snprintf(g, sizeof g, "group=g%d&consumer=b", v);
        snprintf(b, sizeof b, "dedup --key event_id --from %s --to %s "
                 "--lease 300ms --batch 10 --idle-exit 1s --store %s "
                 "--key-space s%d", src(g), to, stores[v][1], v);
        cr_assert_eq(cli_at(NULL, b), 0, "%s", t_read(t_at("err"), NULL));
        cr_assert_eq(out_len(), 20, "store %s: %lld entries for 20 keys",
                     stores[v][1], out_len());
        snprintf(g, sizeof g, "g%d", v);
        expect_nothing_pending(g);
    }
    read_back_only = 0;
}

/* maxlen=~N below three times --batch is refused before anything is
 * read: the entries a crash leaves to read back (up to two batches)
 * would be trimmed first. */
Test(rstream, a_maxlen_below_three_batches_is_refused)
{
    freeReplyObject(th_cmd(rc, "XADD %s * event_id a", in));
    char to[512];
    snprintf(to, sizeof to, "'redis-stream://%s/%s?maxlen=~149'", addr,
             out);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--batch 50 --idle-exit 200ms 2>err", src("group=g"),
                       to), 2);
    cr_assert(t_grep(t_at("err"), "maxlen=~149 is below three times "
                     "--batch (50)"), "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(pending("g"), 0);
    cr_assert_eq(out_len(), 0);
    snprintf(to, sizeof to, "'redis-stream://%s/%s?maxlen=~150'", addr,
             out);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--batch 50 --idle-exit 200ms 2>err", src("group=g"),
                       to), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(out_len(), 1);
}

/* SIGINT that lands in the last wait before --idle-exit fires (raised
 * by the test hook at that very moment) is a stop: exit 130, said. */
Test(rstream, sigint_in_the_last_idle_wait_exits_130)
{
    freeReplyObject(th_cmd(rc, "XADD %s * event_id a", in));
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 300ms", src("group=g"), dst());
    char at[32];
    snprintf(at, sizeof at, "idle-exit:1:%d", SIGINT);
    cr_assert_eq(cli_at(at, args), 130, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "stopped by SIGINT"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert_eq(out_len(), 1);
    expect_nothing_pending("g");
}

/* Does a job lock of the output stream exist? */
static int locked(void)
{
    redisReply *r = th_cmd(rc, "KEYS %s.idem-lock.*", out);
    int n = (int)r->elements;
    freeReplyObject(r);
    return n;
}

/* The same command started twice at once (one consumer name, one
 * checkpoint) is refused while the first runs, as a second --output
 * writer is; once the first ended, the command runs again. */
Test(rstream, the_same_job_twice_at_once_is_refused)
{
    int nkeys = fill(100);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--lease 1s --store 'redis://%s?prefix=%s'",
             src("group=g&consumer=c"), dst(), addr, th_prefix());
    pid_t a = t_cli_start(t_dir, "%s 2>err1", args);
    for (int i = 0; i < 3000 && !locked(); i++)
        usleep(20 * 1000);
    cr_assert(locked(), "the first run took no lock");
    cr_assert_eq(cli_at(NULL, args), 1, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "is being run by another idem process"),
              "%s", t_read(t_at("err"), NULL));
    kill(a, SIGTERM);
    cr_assert_eq(t_wait(a), 0, "%s", t_read(t_at("err1"), NULL));
    cr_assert(!locked(), "the lock outlived its run");
    cr_assert_eq(t_cli(t_dir, "%s --idle-exit 300ms 2>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
}

/* Entries a dead run wrote past the job's position and that a trim
 * deleted before the rerun could read them back are written again: the
 * rerun says so instead of hiding it. */
Test(rstream, entries_trimmed_before_read_back_are_said)
{
    for (int i = 0; i < 20; i++)
        freeReplyObject(th_cmd(rc, "XADD %s * event_id e%d", in, i));
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--batch 10 --idle-exit 200ms", src("group=g"), dst());
    cr_assert_eq(cli_at("sink-written:1", args), 128 + SIGKILL);
    cr_assert_eq(out_len(), 10);
    freeReplyObject(th_cmd(rc, "XTRIM %s MAXLEN 0", out));
    cr_assert_eq(cli_at(NULL, args), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "may have been deleted (a trim: maxlen, "
                     "XTRIM, XDEL) before they could be read back"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert_eq(out_len(), 20);
    expect_nothing_pending("g");
}

/* One script: a run killed after its sink step and before the commit
 * (IDEM_TEST_KILL_AT=sink-written) has written nothing and acknowledged
 * nothing, since both go with the commit; the next run does it all. */
Test(rstream, one_script_leaves_nothing_written_before_the_commit)
{
    int nkeys = fill(100);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--batch 10 --idle-exit 200ms --lease 1s "
             "--store 'redis://%s?prefix=%s'",
             src("group=g"), dst(), addr, th_prefix());
    cr_assert_eq(cli_at("sink-written:1", args), 128 + SIGKILL);
    cr_assert(t_grep(t_at("err"), "one-script commit"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert_eq(out_len(), 0, "an entry was written before its commit");
    redisReply *r = th_cmd(rc, "XPENDING %s g", in);
    cr_assert_gt(r->element[0]->integer, 0, "acknowledged before its "
                 "commit");
    freeReplyObject(r);
    cr_assert_eq(cli_at("sink-written:3", args), 128 + SIGKILL);
    cr_assert_eq(cli_at(NULL, args), 0, "%s", t_read(t_at("err"), NULL));
    expect_output(nkeys, 0);
    expect_nothing_pending("g");
}
