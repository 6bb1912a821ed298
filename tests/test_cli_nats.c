/* tests/test_cli_nats.c - `idem dedup` and `idem run` between NATS
 * JetStream streams, on a real nats-server (one per test, started by
 * scripts/nats-test.sh in the test's directory): order, data and headers
 * kept, nothing pending on the durable consumer at the end, kill -9 at
 * random moments and just after the sink's write, a restart past the
 * output stream's duplicate window, the server restarted under load, two
 * workers on one durable, and a message redelivered while its key is
 * BUSY. And the attacks on them: headers the output stream would act on,
 * a duplicate window shared by two subjects or two outcomes of a key, a
 * stream trimmed before read-back, a worker resumed past its lease, a
 * handler slower than AckWait, --idle-exit beside a dead worker, the same
 * command twice, a message too large for the output (the server's
 * max_payload, the output stream's max_msg_size, a run's result; a
 * marker found by read-back after a crash), an output of long ago
 * beside a new job's redelivered message whose key is new again, late
 * answers to pulls given up, files on either side, and the NATS secrets
 * kept from the handler.
 *
 * Every check reads the output stream itself (js_GetMsg, sequence by
 * sequence): each key's first message exactly once, in input order. */
#include <nats/nats.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "killloop.h"
#include "redis_harness.h"

static char ndir[512];
static int port;
static natsConnection *nc;
static jsCtx *js;

static void sh_nats(const char *what)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "sh \"$IDEM_SCRIPTS/nats-test.sh\" %s '%s' "
             ">'%s/port.out'", what, ndir, t_dir);
    cr_assert_eq(system(cmd), 0, "nats-test.sh %s failed", what);
}

static void connect_js(void)
{
    char url[64];
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", port);
    cr_assert_eq(natsConnection_ConnectTo(&nc, url), NATS_OK);
    cr_assert_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
}

/* A stream name with its one subject. */
static void add_stream(const char *name, const char *subject,
                       int64_t dup_window_ms)
{
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = name;
    sc.Subjects = &subject;
    sc.SubjectsLen = 1;
    sc.Duplicates = dup_window_ms * 1000000;
    cr_assert_eq(js_AddStream(NULL, js, &sc, NULL, NULL), NATS_OK, "%s",
                 nats_GetLastError(NULL));
}

static void setup(void)
{
    t_dir_init();
    const char *root = getenv("IDEM_REDIS_ROOT");
    snprintf(ndir, sizeof ndir, "%s/nats", root ? root : t_dir);
    if (root) {  /* unique under the shared root, killed at its end */
        char *d = t_tmpdir();
        snprintf(ndir, sizeof ndir, "%s/nats", d);
        free(d);
    }
    sh_nats("start");
    char *p = t_read(t_at("port.out"), NULL);
    port = (int)strtol(p, NULL, 10);
    free(p);
    connect_js();
    add_stream("IN", "in", 0);
    add_stream("OUT", "out", 120000);
}

static void teardown(void)
{
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    sh_nats("stop");
    t_dir_fini();
}

TestSuite(nats, .init = setup, .fini = teardown, .timeout = 240);

#define MAXN 5000
static int note_of[MAXN];

/* n messages on "in": data {"event_id":"eK","amount":"A","note":"nI"},
 * headers Nats-Msg-Id mI (unique), x-key eK and x-note nI; one in five
 * repeats an earlier key. Each awaits its PubAck, or (core) is only
 * sent: a stopped server gets them once it goes on. Returns the number
 * of distinct keys. */
static int fill_by(int n, int core)
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
        char data[128], v[32];
        snprintf(data, sizeof data, "{\"event_id\":\"e%d\",\"amount\":\"%d\","
                 "\"note\":\"n%d\"}", k, k * 7 % 1000, i);
        natsMsg *m = NULL;
        cr_assert_eq(natsMsg_Create(&m, "in", NULL, data, (int)strlen(data)),
                     NATS_OK);
        snprintf(v, sizeof v, "m%d", i);
        natsMsgHeader_Set(m, "Nats-Msg-Id", v);
        snprintf(v, sizeof v, "e%d", k);
        natsMsgHeader_Set(m, "x-key", v);
        snprintf(v, sizeof v, "n%d", i);
        natsMsgHeader_Set(m, "x-note", v);
        cr_assert_eq(core ? natsConnection_PublishMsg(nc, m)
                          : js_PublishMsg(NULL, js, m, NULL, NULL), NATS_OK);
        natsMsg_Destroy(m);
    }
    return fresh;
}

static int fill(int n)
{
    return fill_by(n, 0);
}

static uint64_t last_seq(const char *stream)
{
    jsStreamInfo *si = NULL;
    cr_assert_eq(js_GetStreamInfo(&si, js, stream, NULL, NULL), NATS_OK);
    uint64_t n = si->State.LastSeq;
    jsStreamInfo_Destroy(si);
    return n;
}

static int key_number(const char *s)
{
    return s && s[0] == 'e' ? (int)strtol(s + 1, NULL, 10) : -1;
}

static const char *header(natsMsg *m, const char *name)
{
    const char *v = NULL;
    return natsMsgHeader_Get(m, name, &v) == NATS_OK ? v : NULL;
}

/* OUT holds keys e0 .. e(nkeys-1) once each, in order unless any_order,
 * each with its first input message's data and headers (dedup), or a
 * done result (run). */
static void expect_output(int nkeys, int any_order, int run)
{
    uint64_t n = last_seq("OUT");
    cr_assert_eq(n, (uint64_t)nkeys, "%llu messages for %d keys",
                 (unsigned long long)n, nkeys);
    char *seen = calloc((size_t)nkeys, 1);
    for (uint64_t seq = 1; seq <= n; seq++) {
        natsMsg *m = NULL;
        cr_assert_eq(js_GetMsg(&m, js, "OUT", seq, NULL, NULL), NATS_OK);
        const char *key = header(m, "idem-key");
        int k = key_number(key);
        cr_assert(k >= 0 && k < nkeys && !seen[k], "message %llu: key %s "
                  "twice or unknown", (unsigned long long)seq,
                  key ? key : "(none)");
        seen[k] = 1;
        cr_assert(any_order || k == (int)seq - 1, "message %llu holds %s",
                  (unsigned long long)seq, key);
        cr_assert_str_eq(header(m, "Nats-Msg-Id"), key);
        char want[160];
        if (run) {
            snprintf(want, sizeof want, "{\"key\":\"e%d\",\"status\":"
                     "\"done\",", k);
            cr_assert(!strncmp(natsMsg_GetData(m), want, strlen(want)), "%s",
                      natsMsg_GetData(m));
        } else {
            snprintf(want, sizeof want, "{\"event_id\":\"e%d\",\"amount\":"
                     "\"%d\",\"note\":\"n%d\"}", k, k * 7 % 1000, note_of[k]);
            cr_assert(any_order || !strcmp(natsMsg_GetData(m), want),
                      "%s, not %s", natsMsg_GetData(m), want);
            snprintf(want, sizeof want, "n%d", note_of[k]);
            cr_assert(any_order || !strcmp(header(m, "x-note"), want));
        }
        natsMsg_Destroy(m);
    }
    free(seen);
}

/* Messages of durable d not acknowledged (all: `held` 0; or only those
 * delivered, `held` 1), or -1 when d does not exist yet. */
static int unacked(const char *d, int held)
{
    jsConsumerInfo *ci = NULL;
    if (js_GetConsumerInfo(&ci, js, "IN", d, NULL, NULL) != NATS_OK)
        return -1;
    int n = (int)(ci->NumAckPending + (held ? 0 : (int64_t)ci->NumPending));
    jsConsumerInfo_Destroy(ci);
    return n;
}

/* Nothing pending on durable d: all delivered and acknowledged. */
static int pending(const char *d)
{
    int n = unacked(d, 0);
    cr_assert_geq(n, 0, "no durable %s", d);
    return n;
}

static const char *src(const char *params)
{
    static char b[2][256];
    static int t;
    t ^= 1;
    snprintf(b[t], sizeof b[t], "'nats://127.0.0.1:%d/IN?%s'", port, params);
    return b[t];
}

static const char *dst(void)
{
    static char b[256];
    snprintf(b, sizeof b, "'nats://127.0.0.1:%d/out'", port);
    return b;
}

/* Run args until the durable has nothing pending (a killed run's
 * messages come back after AckWait), at most 20 times. */
static void finish(const char *args, const char *durable)
{
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(t_cli(t_dir, "%s 2>>err", args), 0, "%s",
                     t_read(t_at("err"), NULL));
        if (!pending(durable))
            return;
    }
    cr_assert_fail("%d messages still pending", pending(durable));
}

Test(nats, dedup_keeps_first_messages_in_order_with_data_and_headers)
{
    int nkeys = fill(300);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1s --batch 64", src("durable=d"), dst());
    cr_assert_eq(t_cli(t_dir, "%s 2>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, 0, 0);
    cr_assert_eq(pending("d"), 0);
    /* Again on another durable, keyed by a header: all duplicates. */
    snprintf(args, sizeof args, "dedup --key header:x-key --from %s --to %s "
             "--idle-exit 1s --job h", src("durable=d2"), dst());
    cr_assert_eq(t_cli(t_dir, "%s 2>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert_eq(t_cli(t_dir, "%s --store local:s2 2>err", args), 0);
    cr_assert_eq(last_seq("OUT"), (uint64_t)nkeys + 0 * 1,
                 "the header-keyed run wrote again");
    cr_assert_eq(pending("d2"), 0);
}

/* Random kills land within this many seconds: a rerun after a kill
 * waits out AckWait (2 s with --lease 1s) before its first fetch, so
 * the span goes past it. */
#define SPAN 4.0

/* Kill runs of args (tests/killloop.h): every other one kills itself
 * after 1 to 4 batches, and every one is killed within span seconds.
 * Then one run to the end. Returns the kills that landed. */
static long kill_loop(const char *args, const char *durable, double span,
                      long nkills)
{
    t_kill_plan p = {.args = args, .span = span, .nkills = nkills,
                     .tries = 4, .at_max = 4, .every = 2};
    long landed = t_kill_loop(&p);
    finish(args, durable);
    return landed;
}

Test(nats, dedup_kill9_keeps_each_first_message_once_in_order)
{
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    int nkeys = fill(1500);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1500ms --batch 50 --lease 1s --commit-interval "
             "20ms --store local:store --job k9", src("durable=d"), dst());
    long landed = kill_loop(args, "d", SPAN, t_kills(15));
    cr_assert_geq(landed, t_kills(15) < 3 ? t_kills(15) : 3, "only %ld kills "
                  "landed", landed);
    expect_output(nkeys, 0, 0);
    cr_log_info("nats dedup: %ld kills (seed %u)", landed, seed);
}

Test(nats, run_kill9_results_once_in_order)
{
    srand((unsigned)time(NULL));
    int nkeys = fill(400);
    char args[1024];
    snprintf(args, sizeof args, "run --key event_id --from %s --to %s "
             "--idle-exit 1500ms --batch 20 --lease 1s --commit-interval "
             "10ms --exec '\"$IDEM_PROGS/handler\" log' --job r",
             src("durable=d"), dst());
    long landed = kill_loop(args, "d", SPAN, t_kills(10));
    cr_assert_geq(landed, t_kills(10) < 3 ? t_kills(10) : 3);
    expect_output(nkeys, 0, 1);
    cr_log_info("nats run: %ld kills", landed);
}

/* The output stream's duplicate window (ms); max_msgs > 0 keeps only
 * that many messages, max_size > 0 refuses larger ones (max_msg_size). */
static void update_out(int64_t window_ms, int64_t max_msgs, int32_t max_size)
{
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    const char *subj = "out";
    sc.Name = "OUT";
    sc.Subjects = &subj;
    sc.SubjectsLen = 1;
    sc.Duplicates = window_ms * 1000000LL;
    if (max_msgs > 0)
        sc.MaxMsgs = max_msgs;
    if (max_size > 0)
        sc.MaxMsgSize = max_size;
    cr_assert_eq(js_UpdateStream(NULL, js, &sc, NULL, NULL), NATS_OK, "%s",
                 nats_GetLastError(NULL));
}

/* The duplicate window down to 1 s, so that a test can wait it out. */
static void one_second_window(int64_t max_msgs)
{
    update_out(1000, max_msgs, 0);
}

/* Run args until IDEM_TEST_KILL_AT's point kills it (after the sink's
 * write of a batch, before its commit). */
static void killed_at_sink(const char *args, const char *point)
{
    setenv("IDEM_TEST_KILL_AT", point, 1);
    int st = t_cli(t_dir, "%s 2>>err", args);
    unsetenv("IDEM_TEST_KILL_AT");
    cr_assert_eq(st, 128 + SIGKILL, "not killed at the sink: %s",
                 t_read(t_at("err"), NULL));
}

/* Killed just after writing a batch, rerun after the output stream's
 * duplicate window (1 s) has passed: the server would take the messages
 * again, so only read-back keeps them once. */
Test(nats, a_restart_past_the_duplicate_window_is_exact_by_read_back)
{
    one_second_window(0);
    int nkeys = fill(200);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1500ms --batch 30 --lease 1s --commit-interval "
             "10ms --store local:store --job w", src("durable=d"), dst());
    killed_at_sink(args, "sink-written:2");
    cr_assert_geq(last_seq("OUT"), 31, "the killed batch was not written");
    t_sleep_ms(1500);  /* past the window: the server's fence is gone */
    finish(args, "d");
    expect_output(nkeys, 0, 0);
    cr_assert(t_grep(t_at("err"), "found already written"), "%s",
              t_read(t_at("err"), NULL));
}

/* dedup on a local store overlaps a batch's sync with the next batch's
 * writes (stream.c, sync_overlaps) and acknowledges the batch only
 * after that sync. A power cut (tests/shim/synclog.c) after the sixth
 * batch's writes, while the fifth's sync is still in flight (the shim
 * makes each take 200 ms; the sixth, not the second, so that the
 * reader is ahead and the worker does not settle the fifth early for
 * want of a next batch: nsource.c's MaxAckPending), loses both
 * batches' records and checkpoints; their messages are in the output
 * and come again. Past the duplicate window (the server's fence gone),
 * runs to the end: more than a batch is read back, each key once, in
 * order. */
Test(nats, a_power_cut_with_a_sync_in_flight_writes_nothing_twice)
{
    one_second_window(0);
    int nkeys = fill(300);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1500ms --batch 30 --lease 1s --store local:store "
             "--job pc --stats-json", src("durable=d"), dst());
    setenv("IDEM_TEST_SYNC_DELAY_MS", "200", 1);
    cr_assert_eq(t_cli_cut_at("sink-written:6", args), 128 + SIGKILL,
                 "not killed: %s", t_read(t_at("err"), NULL));
    unsetenv("IDEM_TEST_SYNC_DELAY_MS");
    t_sleep_ms(1500);
    unlink(t_at("err"));
    finish(args, "d");
    char *stats = t_read(t_at("err"), NULL), *rb = strstr(stats,
                                                          "\"read_back\":");
    cr_assert(rb && strtol(rb + 12, NULL, 10) > 30, "not more than a "
              "batch read back: %s", stats);
    free(stats);
    expect_output(nkeys, 0, 0);
}

/* As above with a batch of 400 read back (through a consumer of the
 * output stream, not message by message), one of its messages deleted
 * by hand before the restart: the others are found written, the deleted
 * one is said (its key written again), and each key is there once. */
Test(nats, a_large_batch_past_the_window_is_read_back_through_a_consumer)
{
    one_second_window(0);
    int nkeys = fill(2000);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1500ms --batch 400 --lease 1s --store "
             "local:store --job w", src("durable=d"), dst());
    killed_at_sink(args, "sink-written:3");
    uint64_t written = last_seq("OUT");
    cr_assert_geq(written, 700, "the killed batch was not written");
    /* One of the killed batch's messages (not its last: the end of the
     * stream is not a hole) deleted before the restart. */
    cr_assert_eq(js_DeleteMsg(js, "OUT", written - 1, NULL, NULL),
                 NATS_OK);
    t_sleep_ms(1500);  /* past the window: the server's fence is gone */
    finish(args, "d");
    cr_assert(t_grep(t_at("err"), "found already written"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "1 message of stream OUT"), "%s",
              t_read(t_at("err"), NULL));
    /* Each key once but the deleted message's, written again at the
     * end: the stream holds nkeys messages and one hole. */
    jsStreamInfo *si = NULL;
    cr_assert_eq(js_GetStreamInfo(&si, js, "OUT", NULL, NULL), NATS_OK);
    cr_assert_eq(si->State.Msgs, (uint64_t)nkeys, "%s",
                 t_read(t_at("err"), NULL));
    jsStreamInfo_Destroy(si);
    char *seen = calloc((size_t)nkeys, 1);
    for (uint64_t q = 1; q <= last_seq("OUT"); q++) {
        natsMsg *m = NULL;
        if (q == written - 1)
            continue;
        cr_assert_eq(js_GetMsg(&m, js, "OUT", q, NULL, NULL), NATS_OK);
        int k = key_number(header(m, "idem-key"));
        cr_assert(k >= 0 && k < nkeys && !seen[k], "key %d twice", k);
        seen[k] = 1;
        natsMsg_Destroy(m);
    }
    free(seen);
    cr_assert_eq(pending("d"), 0);
}

/* nats-server killed and started again while dedup runs: the run goes
 * on or fails; rerun, the output is exact. */
Test(nats, the_server_restarted_under_load)
{
    int nkeys = fill(3000);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 3s --batch 50 --lease 1s --commit-interval 10ms "
             "--store local:store --job sr", src("durable=d"), dst());
    pid_t pid = t_cli_start(t_dir, "%s 2>>err", args);
    t_sleep_ms(300);
    sh_nats("stop");
    t_sleep_ms(500);
    sh_nats("restart");
    int st = t_wait(pid);
    cr_assert(st == 0 || st == 1, "exit %d: %s", st,
              t_read(t_at("err"), NULL));
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    connect_js();
    finish(args, "d");
    expect_output(nkeys, 0, 0);
}

/* Two workers on one durable, one Redis store: each key once. */
Test(nats, two_workers_on_one_durable)
{
    int nkeys = fill(2000);
    const char *redis = th_redis_addr();
    const char *prefix = th_prefix();
#define WORKER "dedup --key event_id --from %s --to %s --idle-exit 2s "  \
               "--batch 20 --lease 2s --store 'redis://%s?prefix=%s' " \
               "2>err%d"
    pid_t a = t_cli_start(t_dir, WORKER, src("durable=d&worker=a"), dst(),
                          redis, prefix, 1);
    pid_t b = t_cli_start(t_dir, WORKER, src("durable=d&worker=b"), dst(),
                          redis, prefix, 2);
    cr_assert_eq(t_wait(a), 0, "%s", t_read(t_at("err1"), NULL));
    cr_assert_eq(t_wait(b), 0, "%s", t_read(t_at("err2"), NULL));
    expect_output(nkeys, 1, 0);
    cr_assert_eq(pending("d"), 0);
}

/* Has the handler logging to name had a message? */
static int logged(const char *name)
{
    return !access(t_at(name), F_OK) && t_grep(t_at(name), "e0");
}

/* A worker stalled (SIGSTOP) past AckWait: its message goes to a
 * second worker while the first one's claim is live (BUSY); the second
 * waits, the first resumes and commits, the second finds it done and
 * never runs it. (Both in one key space: a --job of each its own would
 * make them two keys, and only the server's duplicate window kept the
 * output once.) */
Test(nats, a_message_redelivered_while_its_key_is_busy)
{
    fill(1);
    const char *redis = th_redis_addr();
    const char *prefix = th_prefix();
#define SLOW "run --key event_id --from %s --to %s --idle-exit 3s "   \
             "--lease 20s --store 'redis://%s?prefix=%s' "              \
             "--exec '\"$IDEM_PROGS/handler\" log%d sleep=%d' 2>err%d"
    pid_t a = t_cli_start(t_dir, SLOW,
                          src("durable=d&ack_wait_ms=1000&worker=a"), dst(),
                          redis, prefix, 1, 3000, 1);
    /* a holds the key's claim once its handler has the message (the
     * consumer counting it delivered is too soon: a stopped before its
     * claim left b a new key). */
    for (int i = 0; i < 400 && !logged("log1"); i++)
        t_sleep_ms(50);
    cr_assert(logged("log1"), "the first worker got nothing");
    kill(a, SIGSTOP);
    pid_t b = t_cli_start(t_dir, SLOW, src("durable=d&worker=b"), dst(),
                          redis, prefix, 2, 0, 2);
    t_sleep_ms(2500);  /* past AckWait: b has it, and waits on a's claim */
    kill(a, SIGCONT);
    cr_assert_eq(t_wait(a), 0, "%s", t_read(t_at("err1"), NULL));
    cr_assert_eq(t_wait(b), 0, "%s", t_read(t_at("err2"), NULL));
    cr_assert_eq(last_seq("OUT"), 1, "the result was written twice");
    cr_assert(!logged("log2"), "the second worker ran the key");
    cr_assert_eq(pending("d"), 0);
}

Test(nats, bad_uris_say_what_is_wrong_and_hide_secrets)
{
    struct {
        const char *args, *says;
    } cases[] = {
        {"--from 'nats://127.0.0.1:1/S'", "?durable=NAME"},
        {"--from 'nats://127.0.0.1:1/S?durable=d&bogus=1'",
         "unknown parameter 'bogus'"},
        {"--from 'nats://127.0.0.1:99999/S?durable=d'", "port"},
        {"--from 'nats://127.0.0.1:1?durable=d'", "no stream name"},
        {"--from 'nats://127.0.0.1:1/S?durable=a.b'", "durable name"},
        {"--to 'nats://127.0.0.1:1/s?durable=d'",
         "unknown parameter 'durable'"},
        {"--from 'nats://u:secret@127.0.0.1:1/S?durable=d&x=1'",
         "unknown parameter"},
        {"--key header:x in", "is for a stream source"},
        {"--key @id --from 'nats://127.0.0.1:1/S?durable=d'",
         "--key header:Nats-Msg-Id"},
    };
    t_put("in", "{}\n");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int st = t_cli(t_dir, "dedup %s%s 2>err", strstr(cases[i].args,
                       "--key") ? "" : "--key id ", cases[i].args);
        cr_assert_eq(st, 2, "%s", cases[i].args);
        cr_assert(t_grep(t_at("err"), cases[i].says), "%s: %s",
                  cases[i].args, t_read(t_at("err"), NULL));
        cr_assert(!t_grep(t_at("err"), "secret"));
    }
    /* A server that refuses the password: exit 1, no password shown. */
    cr_assert_eq(t_cli(t_dir, "dedup --key id --from "
                       "'nats://u:secret@127.0.0.1:1/S?durable=d' 2>err"), 1);
    cr_assert(t_grep(t_at("err"), "127.0.0.1:1"));
    cr_assert(!t_grep(t_at("err"), "secret"));
}

/* One message on "in" with data {"event_id":"eN"} (N counting from 0)
 * and the header name: value. */
static void put_with_header(const char *name, const char *value)
{
    static int n;
    char data[64];
    snprintf(data, sizeof data, "{\"event_id\":\"e%d\"}", n++);
    natsMsg *m = NULL;
    cr_assert_eq(natsMsg_Create(&m, "in", NULL, data, (int)strlen(data)),
                 NATS_OK);
    natsMsgHeader_Set(m, name, value);
    cr_assert_eq(js_PublishMsg(NULL, js, m, NULL, NULL), NATS_OK);
    natsMsg_Destroy(m);
}

/* The input stream's publish preconditions (Nats-Expected-*, met when
 * the message was stored in IN, as an event-sourced stream's writers
 * set them) are not asked again of the output stream, where they fail:
 * OUT refused the batch, every rerun, for ever. */
Test(nats, the_inputs_publish_preconditions_are_not_republished)
{
    put_with_header("Nats-Expected-Stream", "IN");
    put_with_header("Nats-Expected-Last-Subject-Sequence", "1");
    put_with_header("Nats-Expected-Last-Sequence", "2");
    put_with_header("x-kept", "yes");
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1s", src("durable=d"), dst());
    cr_assert_eq(t_cli(t_dir, "%s 2>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert_eq(last_seq("OUT"), 4);
    cr_assert_eq(pending("d"), 0);
    natsMsg *m = NULL;
    cr_assert_eq(js_GetMsg(&m, js, "OUT", 4, NULL, NULL), NATS_OK);
    cr_assert_str_eq(header(m, "x-kept"), "yes", "other headers are kept");
    natsMsg_Destroy(m);
}

/* ?stream= naming a stream that does not hold the subject: the publishes
 * go to the stream that does, and read-back would look in the wrong one
 * (a restart past the duplicate window wrote again). Refused. */
Test(nats, a_stream_parameter_that_does_not_hold_the_subject_is_refused)
{
    add_stream("OTHER", "other", 0);
    fill(3);
    char to[256];
    snprintf(to, sizeof to, "'nats://127.0.0.1:%d/out?stream=OTHER'", port);
    int st = t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                   "--idle-exit 1s 2>err", src("durable=d"), to);
    cr_assert_eq(st, 1, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "OUT"), "%s", t_read(t_at("err"), NULL));
}

/* The handler gets idem's environment without the NATS password or
 * token (IDEM_NATS_PASSWORD, IDEM_NATS_TOKEN), and cannot read them in
 * idem's own /proc/PID/environ either. The test's server has no
 * authentication, so it takes any. */
Test(nats, the_handler_does_not_inherit_the_nats_secrets)
{
    static const char *const how[] = {"IDEM_NATS_PASSWORD", "IDEM_NATS_TOKEN"};
    fill(2);
    for (int i = 0; i < 2; i++) {
        char from[256];
        snprintf(from, sizeof from, "'nats://%s127.0.0.1:%d/IN?durable=s%d'",
                 i ? "" : "u@", port, i);
        cr_assert_eq(t_sh("cd '%s' && IDEM_KEPT=yes %s=N4tsS3cret "
                          "\"$IDEM_CLI\" run --key event_id --job s%d "
                          "--from %s --to %s --idle-exit 1s --exec 'env > "
                          "env%d; tr \"\\0\" \"\\n\" < /proc/$PPID/environ "
                          ">> env%d; exec \"$IDEM_PROGS/handler\"' 2>err",
                          t_dir, how[i], i, from, dst(), i, i), 0, "%s",
                     t_read(t_at("err"), NULL));
        const char *got = t_at(i ? "env1" : "env0");
        cr_assert(t_grep(got, "IDEM_KEPT=yes"), "%s: no environment",
                  how[i]);
        cr_assert(!t_grep(got, "N4tsS3cret"), "%s reached the handler",
                  how[i]);
    }
}

/* A handler slower than AckWait (each message takes longer than it, the
 * batch five times as long): +WPI keeps every message fetched with the
 * worker, so none is handed out again meanwhile. */
Test(nats, a_handler_slower_than_ack_wait_gets_each_message_once)
{
    int nkeys = fill(6);
    cr_assert_eq(t_cli(t_dir, "run --key event_id --from %s --to %s "
                       "--idle-exit 1s --batch 10 --lease 5s --exec "
                       "'\"$IDEM_PROGS/handler\" log sleep=1500' 2>err",
                       src("durable=d&ack_wait_ms=1000"), dst()), 0, "%s",
                 t_read(t_at("err"), NULL));
    jsConsumerInfo *ci = NULL;
    cr_assert_eq(js_GetConsumerInfo(&ci, js, "IN", "d", NULL, NULL), NATS_OK);
    int64_t again = ci->NumRedelivered;
    jsConsumerInfo_Destroy(ci);
    cr_assert_eq(again, 0, "%lld redelivered", (long long)again);
    cr_assert(t_grep(t_at("err"), "6 lines read"), "%s",
              t_read(t_at("err"), NULL));
    expect_output(nkeys, 0, 1);
}

/* A worker stopped past its lease and AckWait while its handler works:
 * a second worker takes the key over, writes and commits; the output
 * stream's duplicate window (1 s) passes; the first resumes. Its result
 * must not be written a second time. */
Test(nats, a_worker_resumed_past_its_lease_does_not_write_again)
{
    one_second_window(0);
    fill(1);
    const char *redis = th_redis_addr();
    const char *prefix = th_prefix();
#define PAUSED "run --key event_id --from %s --to %s --idle-exit 2s "   \
               "--lease 2s --store 'redis://%s?prefix=%s' "              \
               "--exec '\"$IDEM_PROGS/handler\" log%d sleep=%d' 2>err%d"
    pid_t a = t_cli_start(t_dir, PAUSED,
                          src("durable=d&ack_wait_ms=1000&worker=a"), dst(),
                          redis, prefix, 1, 1500, 1);
    for (int i = 0; i < 400 && !logged("log1"); i++)
        t_sleep_ms(50);
    cr_assert(logged("log1"), "the first worker got nothing");
    kill(a, SIGSTOP);
    pid_t b = t_cli_start(t_dir, PAUSED, src("durable=d&worker=b"), dst(),
                          redis, prefix, 2, 0, 2);
    cr_assert_eq(t_wait(b), 0, "%s", t_read(t_at("err2"), NULL));
    cr_assert_eq(last_seq("OUT"), 1, "%s", t_read(t_at("err2"), NULL));
    t_sleep_ms(1500);  /* past the window */
    kill(a, SIGCONT);
    int st = t_wait(a);
    cr_assert_eq(st, 3, "the first worker did not say its claim was lost: "
                 "%s", t_read(t_at("err1"), NULL));
    cr_assert_eq(last_seq("OUT"), 1, "written again: %s",
                 t_read(t_at("err1"), NULL));
    cr_assert_eq(pending("d"), 0);
}

/* Messages of the output stream deleted by its limits (max_msgs 5)
 * between a kill just after the sink's write and the restart, past the
 * duplicate window: read-back cannot see them, so their keys are written
 * again. That is said, not hidden. */
Test(nats, output_deleted_before_read_back_is_said)
{
    one_second_window(5);
    fill(60);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1500ms --batch 20 --lease 1s --store local:store "
             "--job t", src("durable=d"), dst());
    killed_at_sink(args, "sink-written:2");
    t_sleep_ms(1500);  /* past the window */
    finish(args, "d");
    cr_assert(t_grep(t_at("err"), "deleted"), "%s",
              t_read(t_at("err"), NULL));
}

/* The same command twice at once (one worker name, one job, one Redis
 * store), killed and rerun: each key once. */
Test(nats, the_same_command_twice_at_once)
{
    srand((unsigned)time(NULL));
    int nkeys = fill(1500);
    const char *redis = th_redis_addr();
    const char *prefix = th_prefix();
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 2s --batch 20 --lease 1s --commit-interval 10ms "
             "--store 'redis://%s?prefix=%s'", src("durable=d"), dst(),
             redis, prefix);
    for (int round = 0; round < 3; round++) {
        pid_t a = t_cli_start(t_dir, "%s 2>>err1", args);
        pid_t b = t_cli_start(t_dir, "%s 2>>err2", args);
        t_sleep_ms(200 + rand() % 800);
        if (round < 2)
            kill(a, SIGKILL);
        int sa = t_wait(a), sb = t_wait(b);
        cr_assert(sa == 0 || sa == 128 + SIGKILL, "exit %d: %s", sa,
                  t_read(t_at("err1"), NULL));
        cr_assert_eq(sb, 0, "%s", t_read(t_at("err2"), NULL));
    }
    finish(args, "d");
    expect_output(nkeys, 1, 0);
}

/* One message on "in" without headers: {"event_id":"eK","pad":"x…"},
 * len bytes of data. */
static void put_sized(int k, size_t len)
{
    char *data = malloc(len + 1);
    cr_assert(data);
    int head = snprintf(data, len + 1, "{\"event_id\":\"e%d\",\"pad\":\"", k);
    cr_assert(head > 0 && (size_t)head + 2 <= len);
    memset(data + head, 'x', len - (size_t)head - 2);
    memcpy(data + len - 2, "\"}", 2);
    cr_assert_eq(js_Publish(NULL, js, "in", data, (int)len, NULL, NULL),
                 NATS_OK, "%s", nats_GetLastError(NULL));
    free(data);
}

/* OUT's message seq is key ek's: with marker > 0, a marker of that many
 * bytes of data left out, whose data says `says`; else not a marker. */
static void expect_at(uint64_t seq, int k, long marker, const char *says)
{
    natsMsg *m = NULL;
    cr_assert_eq(js_GetMsg(&m, js, "OUT", seq, NULL, NULL), NATS_OK);
    cr_assert_eq(key_number(header(m, "idem-key")), k, "message %llu",
                 (unsigned long long)seq);
    const char *size = header(m, "idem-too-large");
    if (marker) {
        cr_assert(size && strtol(size, NULL, 10) == marker, "%s",
                  size ? size : "not a marker");
        cr_assert(strstr(natsMsg_GetData(m), says), "%s",
                  natsMsg_GetData(m));
        cr_assert(strstr(natsMsg_GetData(m), "too large"));
    }
    cr_assert(marker || !size, "message %llu is a marker",
              (unsigned long long)seq);
    natsMsg_Destroy(m);
}

/* args twice: the first run writes a marker (exit status 3, said), the
 * second nothing again (0); the output holds n messages. */
static void twice_with_a_marker(const char *args, uint64_t n)
{
    for (int i = 0; i < 2; i++)
        cr_assert_eq(t_cli(t_dir, "%s 2>err%d", args, i), i ? 0 : 3, "%s",
                     t_read(t_at(i ? "err1" : "err0"), NULL));
    cr_assert(t_grep(t_at("err0"), "written as a marker"));
    cr_assert(t_grep(t_at("err0"), "1 message was not done here"), "%s",
              t_read(t_at("err0"), NULL));
    cr_assert_eq(last_seq("OUT"), n, "%s", t_read(t_at("err1"), NULL));
    cr_assert_eq(pending("d"), 0);
}

/* A message that fits the server's max_payload (1 MiB) in IN but not
 * once the sink has set its two headers: no stream of the server takes
 * it, and it stopped every run at it. Now a marker of its key takes its
 * place, named by the header idem-too-large, and the messages after it
 * go on, in order; the run exits 3; a rerun writes nothing again. */
Test(nats, a_message_too_large_for_the_output_is_written_as_a_marker)
{
    put_sized(0, 1048576 - 40);
    put_with_header("x-after", "1");  /* e0 again: a duplicate */
    put_with_header("x-after", "2");  /* e1 */
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1s --lease 1s", src("durable=d"), dst());
    twice_with_a_marker(args, 2);
    expect_at(1, 0, 1048536, "over the server's max_payload");
    expect_at(2, 1, 0, NULL);
}

/* The output stream's own max_msg_size (1000 bytes, below max_payload):
 * the server refused the message in its PubAck, after later ones of the
 * batch went out, and the run stopped there, every rerun too. Now it is
 * found before the publish and takes the same path as max_payload: a
 * marker in its place, in order. The count is the server's, data and
 * headers: 957 bytes of data with the sink's two headers of key e0 (43
 * bytes) are the 1000 and are written; 958 are over. */
Test(nats, a_message_over_the_output_streams_max_msg_size_is_a_marker)
{
    update_out(120000, 0, 1000);
    put_sized(0, 957);
    put_sized(1, 958);
    put_sized(2, 100);
    put_sized(1, 100);  /* e1 again: a duplicate */
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1s --batch 2", src("durable=d"), dst());
    twice_with_a_marker(args, 3);
    expect_at(1, 0, 0, NULL);
    expect_at(2, 1, 958, "over the max_msg_size of stream OUT, 1000 bytes");
    expect_at(3, 2, 0, NULL);
    cr_assert(t_grep(t_at("err0"), "key 'e1'"), "%s",
              t_read(t_at("err0"), NULL));
}

/* run whose handler answers e0 with a result over max_payload: the
 * result line becomes a marker with the line's status (done), so that
 * read-back still finds the outcome; e1's result follows it. */
Test(nats, a_run_result_over_max_payload_is_written_as_a_marker)
{
    put_sized(0, 60);
    put_sized(1, 60);
    char args[1024];
    snprintf(args, sizeof args, "run --key event_id --from %s --to %s "
             "--idle-exit 1s --exec '\"$IDEM_PROGS/handler\" "
             "big=e0:1100000'", src("durable=d"), dst());
    twice_with_a_marker(args, 2);
    natsMsg *m = NULL;
    cr_assert_eq(js_GetMsg(&m, js, "OUT", 1, NULL, NULL), NATS_OK);
    const char *size = header(m, "idem-too-large");
    cr_assert(size && strtol(size, NULL, 10) > 1100000, "%s",
              size ? size : "not a marker");
    cr_assert(strstr(natsMsg_GetData(m), "\"status\":\"done\""), "%s",
              natsMsg_GetData(m));
    natsMsg_Destroy(m);
    expect_at(2, 1, 0, NULL);
    expect_output(2, 1, 1);
}

/* Killed just after the sink wrote a marker in place of a message too
 * large for the output, before the commit: the rerun finds the marker
 * by read-back and takes it as written, as any output. It must still
 * say that the message's data is missing (exit status 3), as the run
 * that wrote the marker would have: with 0, a supervisor never learns
 * that the output lacks it. */
Test(nats, a_marker_read_back_after_a_crash_still_exits_3)
{
    put_sized(0, 1048576 - 40);
    put_with_header("x-after", "1");  /* e0 again: a duplicate */
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1s --lease 1s --store local:store --job mk",
             src("durable=d"), dst());
    killed_at_sink(args, "sink-written:1");
    cr_assert_eq(last_seq("OUT"), 1, "the marker was not written");
    int st = t_cli(t_dir, "%s 2>err1", args);
    cr_assert(t_grep(t_at("err1"), "found already written"), "%s",
              t_read(t_at("err1"), NULL));
    cr_assert_eq(st, 3, "the rerun hid the missing data: %s",
                 t_read(t_at("err1"), NULL));
    cr_assert(t_grep(t_at("err1"), "1 message was not done here"), "%s",
              t_read(t_at("err1"), NULL));
    cr_assert_eq(last_seq("OUT"), 1);
    expect_at(1, 0, 1048536, "over the server's max_payload");
    cr_assert_eq(pending("d"), 0);
}

/* Deliver durable d's next message to no one: fetched here and never
 * acknowledged, as by a worker that died before its claim. It comes
 * back after AckWait, delivered a second time. */
static void delivered_once(const char *d)
{
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = "IN";
    so.Consumer = d;
    natsSubscription *sub = NULL;
    natsMsgList got = {0};
    cr_assert_eq(js_PullSubscribe(&sub, js, NULL, d, NULL, &so, NULL),
                 NATS_OK, "%s", nats_GetLastError(NULL));
    cr_assert_eq(natsSubscription_Fetch(&got, sub, 1, 5000, NULL), NATS_OK);
    cr_assert_eq(got.Count, 1);
    natsMsgList_Destroy(&got);
    natsSubscription_Destroy(sub);
}

/* A worker that fetched the first n messages of a new durable "d"
 * (AckWait 1.5 s, MaxAckPending max_pending, 0: the server's) and
 * died, having sent +WPI for the first half 500 ms after the fetch:
 * the second half, which it had not handed out yet, expires first.
 * Returns settle_ms later (1000: the second half has expired, the first
 * half expires 500 ms later). */
static void dead_worker(int n, int64_t max_pending, int settle_ms)
{
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = "d";
    cc.AckPolicy = js_AckExplicit;
    cc.AckWait = 1500 * (int64_t)1000000;
    cc.MaxAckPending = max_pending;
    cr_assert_eq(js_AddConsumer(NULL, js, "IN", &cc, NULL, NULL), NATS_OK);
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = "IN";
    so.Consumer = "d";
    natsSubscription *sub = NULL;
    cr_assert_eq(js_PullSubscribe(&sub, js, NULL, "d", NULL, &so, NULL),
                 NATS_OK, "%s", nats_GetLastError(NULL));
    natsMsgList got[16] = {{0}};
    int lists = 0, have = 0;
    for (; have < n && lists < 16; have += got[lists++].Count)
        cr_assert_eq(natsSubscription_Fetch(&got[lists], sub, n - have, 5000,
                                            NULL), NATS_OK);
    cr_assert_eq(have, n);
    t_sleep_ms(500);
    for (int i = 0, k = 0; i < lists; i++)  /* the first half, in progress */
        for (int j = 0; j < got[i].Count; j++, k++)
            if (k < n / 2)
                cr_assert_eq(natsMsg_InProgress(got[i].Msgs[j], NULL),
                             NATS_OK);
    cr_assert_eq(natsConnection_Flush(nc), NATS_OK);
    for (int i = 0; i < lists; i++)
        natsMsgList_Destroy(&got[i]);
    natsSubscription_Destroy(sub);
    t_sleep_ms(settle_ms);
}

/* n messages in, `dead` of them held by a dead worker (dead_worker),
 * then a run with --batch `batch`: each key's first message once, in
 * order, nothing pending. */
static void a_dead_worker_then_a_run(int n, int dead, int64_t max_pending,
                                     int batch)
{
    int nkeys = fill(n);
    dead_worker(dead, max_pending, 1000);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 1s --batch %d --store local:store",
             src("durable=d"), dst(), batch);
    cr_assert_eq(t_cli(t_dir, "%s 2>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, 0, 0);
    cr_assert_eq(pending("d"), 0);
}

/* A dead worker's messages come back in the order their AckWait ran
 * out, not the stream's: the later half of what it fetched had no +WPI
 * (it was not handed out yet) and expires first. The next run still
 * writes each key's first message first, in order. */
Test(nats, a_dead_runs_messages_come_back_in_stream_order)
{
    a_dead_worker_then_a_run(40, 20, 0, 8);
}

/* The same with more of them than one fetch takes (4096: a --batch
 * over 1024 makes a consumer whose MaxAckPending lets a run hold
 * more): the first fetch held the second half and the front of the
 * first, and the rest of the first half came after it. */
Test(nats, a_dead_runs_messages_past_one_fetch_come_back_in_stream_order)
{
    a_dead_worker_then_a_run(5000, 4800, 20000, 1200);
}

/* A key whose record expired (--ttl) comes again, delivered a second
 * time (a worker died before its claim), to a worker whose job is new
 * (a worker added): its claim is the key's first, and its output must
 * be written. Only the recent outputs (twice the lease and 10 s, and
 * back to the message's own time) may count as a dead run's; the
 * key's output of long ago is not. A new job's first look at the
 * recent messages read the whole output stream instead, found that
 * old output, and wrote nothing: the message was lost. */
Test(nats, an_output_of_long_ago_does_not_hide_a_new_jobs_message)
{
    one_second_window(0);
    put_with_header("x-n", "0");  /* e0 */
    char args[1024];
#define TTL "dedup --key event_id --from %s --to %s --idle-exit 1s "  \
            "--lease 100ms --ttl 2s --store local:store"
    snprintf(args, sizeof args, TTL, src("durable=d&worker=a"), dst());
    cr_assert_eq(t_cli(t_dir, "%s 2>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert_eq(last_seq("OUT"), 1);
    t_sleep_ms(11000);  /* e0 expired; its output older than the window */
    static const char data[] = "{\"event_id\":\"e0\",\"n\":1}";
    cr_assert_eq(js_Publish(NULL, js, "in", data, sizeof data - 1, NULL,
                            NULL), NATS_OK);
    delivered_once("d");
    snprintf(args, sizeof args, TTL, src("durable=d&worker=b"), dst());
    cr_assert_eq(t_cli(t_dir, "%s 2>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert_eq(last_seq("OUT"), 2, "the expired key's new message was "
                 "taken for written: %s", t_read(t_at("err"), NULL));
    natsMsg *m = NULL;
    cr_assert_eq(js_GetMsg(&m, js, "OUT", 2, NULL, NULL), NATS_OK);
    cr_assert_str_eq(natsMsg_GetData(m), data);
    natsMsg_Destroy(m);
    cr_assert_eq(pending("d"), 0);
}

/* Pull requests waiting on durable d. */
static int waiting(const char *d)
{
    jsConsumerInfo *ci = NULL;
    if (js_GetConsumerInfo(&ci, js, "IN", d, NULL, NULL) != NATS_OK)
        return 0;
    int n = (int)ci->NumWaiting;
    jsConsumerInfo_Destroy(ci);
    return n;
}

/* A worker killed while a second one runs with --idle-exit: the dead
 * one's messages come back after AckWait (3 s), longer than the idle
 * time (1 s). The second does not end while they are still to come.
 * Both wait on the durable before the messages come (a worker that
 * finds messages held by another at its start waits AckWait first, and
 * the other could take them all meanwhile), the messages put at once
 * (new messages start the idle time again). */
Test(nats, idle_exit_waits_for_a_dead_workers_messages)
{
    const char *redis = th_redis_addr();
    const char *prefix = th_prefix();
#define IDLE "dedup --key event_id --from %s --to %s --idle-exit %s "   \
             "--batch 50 --lease 1s --store 'redis://%s?prefix=%s' "     \
             "2>>err%d"
    pid_t b = t_cli_start(t_dir, IDLE,
                          src("durable=d&worker=b&ack_wait_ms=3000"), dst(),
                          "1s", redis, prefix, 2);
    setenv("IDEM_TEST_KILL_AT", "sink-written:1", 1);
    pid_t a = t_cli_start(t_dir, IDLE,
                          src("durable=d&worker=a&ack_wait_ms=3000"), dst(),
                          "1s", redis, prefix, 1);
    unsetenv("IDEM_TEST_KILL_AT");
    for (int i = 0; i < 600 && waiting("d") < 2; i++)
        t_sleep_ms(50);
    cr_assert_geq(waiting("d"), 2, "the workers did not start");
    int nkeys = fill(300);
    int sa = t_wait(a);
    cr_assert_eq(t_wait(b), 0, "%s", t_read(t_at("err2"), NULL));
    cr_assert_eq(sa, 128 + SIGKILL, "%s", t_read(t_at("err1"), NULL));
    cr_assert_eq(pending("d"), 0, "b ended with messages to come: %s",
                 t_read(t_at("err2"), NULL));
    expect_output(nkeys, 1, 0);
}

/* The suite's nats-server: its pid (nats-test.sh keeps it in DIR/pid). */
static pid_t server_pid(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/pid", ndir);
    char *p = t_read(path, NULL);
    pid_t pid = (pid_t)strtol(p, NULL, 10);
    free(p);
    cr_assert_gt(pid, 0);
    return pid;
}

/* Outside ASan (which has its own allocator), idem runs with glibc's
 * heap checks: a write past the end of a block aborts it at the free. */
static void heap_checks(int on)
{
#ifndef __SANITIZE_ADDRESS__
    static const char lib[] = "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0";
    if (on && access(lib, R_OK) == 0) {
        setenv("LD_PRELOAD", lib, 1);
        setenv("GLIBC_TUNABLES", "glibc.malloc.check=3:"
               "glibc.malloc.perturb=165", 1);
        return;
    }
#endif
    (void)on;
    unsetenv("LD_PRELOAD");
    unsetenv("GLIBC_TUNABLES");
}

/* libnats 3.4.1's fetch takes the messages waiting in the subscription
 * first, those of an earlier pull that came after its fetch had
 * stopped waiting, and with more than half a batch of them it wrote
 * past the end of its list (heap aborts under load; fetch_size() in
 * nsource.c fetches one at a time while any wait). Forced here: the
 * server stopped (SIGSTOP) while the worker's pulls give up one after
 * another, messages sent to it meanwhile; once it goes on it answers
 * all those pulls at once (up to MaxAckPending), and what the pulls
 * given up get waits in the subscription. Each key's
 * first message once, in order, nothing pending, and the late ones
 * said. Whether more than half a batch was waiting at the moment of a
 * fetch is not seen from here. */
Test(nats, late_answers_to_given_up_pulls_are_taken_once_in_order)
{
    /* MaxAckPending a batch and three quarters: the pull at work when
     * the server goes on takes a batch, three quarters of one wait for
     * the next fetch, and the server answers the pulls given up again as
     * soon as acks make room. */
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = "d";
    cc.AckPolicy = js_AckExplicit;
    cc.MaxAckPending = 35;
    cr_assert_eq(js_AddConsumer(NULL, js, "IN", &cc, NULL, NULL), NATS_OK);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--batch 20 --store local:store --job late", src("durable=d"),
             dst());
    heap_checks(1);
    pid_t pid = t_cli_start(t_dir, "%s 2>err", args);
    heap_checks(0);
    for (int i = 0; i < 600 && waiting("d") < 1; i++)
        t_sleep_ms(50);
    cr_assert_geq(waiting("d"), 1, "the worker does not pull");
    pid_t server = server_pid();
    kill(server, SIGSTOP);
    int nkeys = fill_by(600, 1);
    t_sleep_ms(1500);  /* pulls of 250 ms each give up meanwhile */
    kill(server, SIGCONT);
    cr_assert_eq(natsConnection_FlushTimeout(nc, 30000), NATS_OK);
    for (int i = 0; i < 1200 && (last_seq("OUT") < (uint64_t)nkeys ||
                                 pending("d")); i++)
        t_sleep_ms(100);
    kill(pid, SIGTERM);
    cr_assert_eq(t_wait(pid), 0, "%s", t_read(t_at("err"), NULL));
    expect_output(nkeys, 0, 0);
    cr_assert_eq(pending("d"), 0);
    cr_assert(t_grep(t_at("err"), "fetched one at a time"), "no answer "
              "came late: %s", t_read(t_at("err"), NULL));
}

/* A dead worker's messages, redelivered in the order their AckWait ran
 * out (dead_worker), while the server is stopped (SIGSTOP) across the
 * next run's first pull, which gives up: the server answers it once it
 * goes on, and its messages wait in the subscription, to be fetched one
 * at a time. They are still handed out in stream order. */
Test(nats, a_dead_runs_messages_in_order_past_a_pull_given_up)
{
    int nkeys = fill(40);
    dead_worker(20, 0, 1000);
    t_sleep_ms(800);  /* the first half expired too, after the second */
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 3s --batch 8 --store local:store",
             src("durable=d"), dst());
    pid_t pid = t_cli_start(t_dir, "%s 2>err", args);
    t_sleep_ms(700);  /* it has found the consumer's pending messages */
    pid_t server = server_pid();
    kill(server, SIGSTOP);
    t_sleep_ms(2500);  /* past its wait of AckWait and 250 ms, and its pull */
    kill(server, SIGCONT);
    cr_assert_eq(t_wait(pid), 0, "%s", t_read(t_at("err"), NULL));
    expect_output(nkeys, 0, 0);
    cr_assert_eq(pending("d"), 0);
    cr_assert(t_grep(t_at("err"), "fetched one at a time"), "the first "
              "pull did not give up: %s", t_read(t_at("err"), NULL));
}

/* A dead worker's messages, with the server stopped (SIGSTOP) from
 * before their AckWait runs out until after the next run's first pulls
 * gave up: once it goes on, its redelivery timer and the pulls waiting
 * race, and a pull served first gets new messages while the dead
 * worker's are not back yet. They are still handed out first, in stream
 * order. (On the code before the gathering, 5 runs of 12 failed here.) */
Test(nats, a_dead_runs_messages_in_order_when_the_server_redelivers_late)
{
    int nkeys = fill(40);
    dead_worker(20, 0, 0);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 3s --batch 8 --store local:store",
             src("durable=d"), dst());
    pid_t pid = t_cli_start(t_dir, "%s 2>err", args);
    t_sleep_ms(600);  /* it has found the consumer's pending messages */
    pid_t server = server_pid();
    kill(server, SIGSTOP);
    t_sleep_ms(2800);  /* past their AckWait, its wait and its first pulls */
    kill(server, SIGCONT);
    cr_assert_eq(t_wait(pid), 0, "%s", t_read(t_at("err"), NULL));
    expect_output(nkeys, 0, 0);
    cr_assert_eq(pending("d"), 0);
}

/* NATS into a file, killed at random and just after writes: the file
 * holds each key's first message once, in order. */
Test(nats, nats_into_a_file_under_kill9)
{
    srand((unsigned)time(NULL));
    int nkeys = fill(800);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --output "
             "out.ndjson --idle-exit 1500ms --batch 30 --lease 1s "
             "--commit-interval 10ms --store local:store --job f",
             src("durable=d"));
    long landed = kill_loop(args, "d", 1.5, t_kills(8));
    cr_assert_geq(landed, 2);
    FILE *f = fopen(t_at("out.ndjson"), "r");
    cr_assert(f);
    char line[256];
    int k = 0;
    while (fgets(line, sizeof line, f)) {
        char want[160];
        snprintf(want, sizeof want, "{\"event_id\":\"e%d\",\"amount\":"
                 "\"%d\",\"note\":\"n%d\"}\n", k, k * 7 % 1000, note_of[k]);
        cr_assert_str_eq(line, want, "line %d", k + 1);
        k++;
    }
    fclose(f);
    cr_assert_eq(k, nkeys);
}

/* A file into NATS, killed just after the sink's write and rerun past
 * the duplicate window: each key once, in order. */
Test(nats, a_file_into_nats_past_the_window)
{
    one_second_window(0);
    static char in[200 * 32];
    size_t len = 0;
    for (int i = 0; i < 200; i++)
        len += (size_t)snprintf(in + len, sizeof in - len,
                                "{\"event_id\":\"e%d\"}\n", i % 150);
    t_write(t_at("in.ndjson"), in, len);
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --to %s --batch 40 "
             "--store local:store --job fi in.ndjson", dst());
    setenv("IDEM_TEST_KILL_AT", "sink-written:2", 1);
    int st = t_cli(t_dir, "%s 2>>err", args);
    unsetenv("IDEM_TEST_KILL_AT");
    cr_assert_eq(st, 128 + SIGKILL, "%s", t_read(t_at("err"), NULL));
    t_sleep_ms(1500);
    cr_assert_eq(t_cli(t_dir, "%s 2>>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    uint64_t n = last_seq("OUT");
    cr_assert_eq(n, 150, "%s", t_read(t_at("err"), NULL));
    for (uint64_t q = 1; q <= n; q++) {
        natsMsg *m = NULL;
        cr_assert_eq(js_GetMsg(&m, js, "OUT", q, NULL, NULL), NATS_OK);
        cr_assert_eq(key_number(header(m, "idem-key")), (int)q - 1);
        natsMsg_Destroy(m);
    }
}

/* Two jobs whose outputs are two subjects of one stream, with keys in
 * common (both keyed by event_id). The duplicate window is the stream's,
 * not a subject's: the server dropped the second job's messages as
 * duplicates of the first's, and the job counted them written. Now the
 * second job stops and says so, its messages kept on its durable. */
Test(nats, another_subjects_message_is_not_taken_for_ours)
{
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    const char *subjects[] = {"res.a", "res.b"};
    sc.Name = "RES";
    sc.Subjects = subjects;
    sc.SubjectsLen = 2;
    cr_assert_eq(js_AddStream(NULL, js, &sc, NULL, NULL), NATS_OK);
    int nkeys = fill(50);
    for (int i = 0; i < 2; i++) {
        char from[64], to[128];
        snprintf(from, sizeof from, "durable=d%d", i);
        snprintf(to, sizeof to, "'nats://127.0.0.1:%d/%s'", port,
                 subjects[i]);
        cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                           "--idle-exit 1s 2>err", src(from), to), i, "%s",
                     t_read(t_at("err"), NULL));
    }
    cr_assert(t_grep(t_at("err"), "as a duplicate of its message 1 "
                     "(subject res.a)"), "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(last_seq("RES"), (uint64_t)nkeys);
    cr_assert_eq(pending("d1"), 50, "the second job's messages were lost");
}

/* A run's key that gave up (a retryable failure, --max-attempts 1) and
 * is done at its next message, within the duplicate window: the server
 * takes the done result for the gave_up one (one Nats-Msg-Id) and drops
 * it. That is said, and the message kept, not counted written. */
Test(nats, a_done_result_is_not_dropped_for_the_gave_up_one)
{
    for (int i = 0; i < 2; i++) {
        char data[64];
        snprintf(data, sizeof data, "{\"event_id\":\"e0\",\"n\":%d}", i);
        cr_assert_eq(js_Publish(NULL, js, "in", data, (int)strlen(data),
                                NULL, NULL), NATS_OK);
    }
    int st = t_cli(t_dir, "run --key event_id --max-attempts 1 --from %s "
                   "--to %s --idle-exit 1s --batch 1 --exec "
                   "'\"$IDEM_PROGS/handler\" flaky=e0' 2>err",
                   src("durable=d"), dst());
    natsMsg *m = NULL;
    cr_assert_eq(js_GetMsg(&m, js, "OUT", 1, NULL, NULL), NATS_OK);
    cr_assert(strstr(natsMsg_GetData(m), "gave_up"), "%s",
              natsMsg_GetData(m));
    natsMsg_Destroy(m);
    cr_assert_eq(last_seq("OUT"), 1);
    cr_assert_eq(st, 1, "the done result was dropped unsaid: %s",
                 t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "as a duplicate"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert_eq(pending("d"), 1);
}

/* run --replay emit: a duplicate's line repeats its key's result, and
 * with the key as its Nats-Msg-Id the server dropped it as a duplicate
 * of that result inside the window (and took it outside). Each replay
 * has a Nats-Msg-Id of its own, and all are written, in order; the
 * first results keep the key as theirs. */
Test(nats, replays_are_written_inside_the_duplicate_window)
{
    static const int keys[] = {0, 0, 1, 0, 1};
    for (int i = 0; i < 5; i++) {
        char data[64];
        snprintf(data, sizeof data, "{\"event_id\":\"e%d\",\"n\":%d}",
                 keys[i], i);
        cr_assert_eq(js_Publish(NULL, js, "in", data, (int)strlen(data),
                                NULL, NULL), NATS_OK);
    }
    cr_assert_eq(t_cli(t_dir, "run --key event_id --replay emit --from %s "
                       "--to %s --idle-exit 1s --batch 2 --exec "
                       "'\"$IDEM_PROGS/handler\"' 2>err", src("durable=d"),
                       dst()), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(last_seq("OUT"), 5, "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(pending("d"), 0);
    char ids[5][1100];
    for (uint64_t q = 1; q <= 5; q++) {
        natsMsg *m = NULL;
        cr_assert_eq(js_GetMsg(&m, js, "OUT", q, NULL, NULL), NATS_OK);
        int k = keys[q - 1], rep = q > 3 || q == 2;
        cr_assert_eq(key_number(header(m, "idem-key")), k);
        cr_assert_eq(strstr(natsMsg_GetData(m), "\"replayed\":true") != NULL,
                     rep, "%s", natsMsg_GetData(m));
        const char *id = header(m, "Nats-Msg-Id");
        snprintf(ids[q - 1], sizeof ids[q - 1], "%s", id);
        cr_assert(rep ? !strncmp(id, header(m, "idem-key"), 2) &&
                            strstr(id, "#replay-")
                      : !strcmp(id, header(m, "idem-key")), "%s", id);
        for (uint64_t p = 1; p < q; p++)
            cr_assert_str_neq(ids[p - 1], id);
        natsMsg_Destroy(m);
    }
}

/* A durable consumer made elsewhere that would lose messages on a kill
 * (AckNone: acknowledged on delivery; AckAll: acknowledged with a later
 * one), or filters another subject than asked, is refused. */
Test(nats, an_unfit_durable_consumer_is_refused)
{
    static const struct {
        jsAckPolicy ack;
        const char *filter, *params, *says;
    } cases[] = {
        {js_AckNone, NULL, "durable=c0", "AckPolicy explicit"},
        {js_AckAll, NULL, "durable=c1", "AckPolicy explicit"},
        {js_AckExplicit, "in.x", "durable=c2&subject=in",
         "filters subject 'in.x'"},
    };
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    const char *subjects[] = {"in", "in.x"};
    sc.Name = "IN";
    sc.Subjects = subjects;
    sc.SubjectsLen = 2;
    cr_assert_eq(js_UpdateStream(NULL, js, &sc, NULL, NULL), NATS_OK);
    fill(5);
    for (int i = 0; i < 3; i++) {
        jsConsumerConfig cc;
        jsConsumerConfig_Init(&cc);
        char name[16];
        snprintf(name, sizeof name, "c%d", i);
        cc.Durable = name;
        cc.AckPolicy = cases[i].ack;
        cc.FilterSubject = cases[i].filter;
        cr_assert_eq(js_AddConsumer(NULL, js, "IN", &cc, NULL, NULL),
                     NATS_OK, "%s", nats_GetLastError(NULL));
        cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                           "--idle-exit 1s 2>err", src(cases[i].params),
                           dst()), 1, "%s: %s", cases[i].params,
                     t_read(t_at("err"), NULL));
        cr_assert(t_grep(t_at("err"), cases[i].says), "%s",
                  t_read(t_at("err"), NULL));
    }
    cr_assert_eq(last_seq("OUT"), 0);
}

/* A key with a space at either end: NATS trims header values, so the
 * key read back from idem-key was not the key written (and after a
 * crash past the duplicate window it was written again). Refused, as a
 * key with a line break is; nothing is written or lost. */
Test(nats, a_key_with_spaces_at_its_ends_is_refused)
{
    static const char data[] = "{\"event_id\":\" e0 \"}";
    cr_assert_eq(js_Publish(NULL, js, "in", data, sizeof data - 1, NULL,
                            NULL), NATS_OK);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 1s 2>err", src("durable=d"), dst()), 1,
                 "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "at either end"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert_eq(last_seq("OUT"), 0);
    cr_assert_eq(pending("d"), 1);
}

/* Input headers named as the sink's own but for their case are kept,
 * and do not change what idem-key and Nats-Msg-Id read back as. */
Test(nats, headers_named_as_the_sinks_own_in_another_case)
{
    put_with_header("Idem-Key", "zzz");
    put_with_header("NATS-MSG-ID", "zzz");
    put_with_header("idem-key", "zzz");
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 1s 2>err", src("durable=d"), dst()), 0,
                 "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(last_seq("OUT"), 3);
    for (uint64_t q = 1; q <= 3; q++) {
        natsMsg *m = NULL;
        cr_assert_eq(js_GetMsg(&m, js, "OUT", q, NULL, NULL), NATS_OK);
        const char **v = NULL;
        int n = 0;
        cr_assert_eq(natsMsgHeader_Values(m, "idem-key", &v, &n), NATS_OK);
        cr_assert_eq(n, 1, "message %llu: %d idem-key values",
                     (unsigned long long)q, n);
        cr_assert_eq(key_number(v[0]), (int)q - 1, "%s", v[0]);
        free((void *)v);
        cr_assert_eq(key_number(header(m, "Nats-Msg-Id")), (int)q - 1);
        natsMsg_Destroy(m);
    }
}

/* Credentials: nkey= and creds=, against servers of their own that ask
 * for them. Debian has neither nsc nor nk, so the keys are made here:
 * an nkey is an Ed25519 key (OpenSSL's) in NATS's text form: base32 of
 * a prefix byte naming its role, the key, and a CRC-16 (XMODEM), as the
 * nkeys library writes it; a creds file holds a user JWT (claims signed
 * by its account's key, the account's by its operator's) and the user's
 * seed. */
enum { NK_SEED = 18 << 3, NK_OPERATOR = 14 << 3, NK_ACCOUNT = 0,
       NK_USER = 20 << 3 };

typedef struct nkey {
    unsigned char seed[32], pub[32];
    char seed_txt[64], pub_txt[64];
} nkey;

static unsigned crc16(const unsigned char *p, size_t n)
{
    unsigned crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (unsigned)p[i] << 8;
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1;
        crc &= 0xffff;
    }
    return crc;
}

/* p[0..n) and its CRC in base32 (no padding) into out. */
static void nk_text(unsigned char *p, size_t n, char *out)
{
    static const char b32[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    unsigned crc = crc16(p, n);
    p[n] = (unsigned char)(crc & 0xff);
    p[n + 1] = (unsigned char)(crc >> 8);
    n += 2;
    unsigned acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        acc = (acc << 8) | p[i];
        for (bits += 8; bits >= 5; bits -= 5)
            *out++ = b32[(acc >> (bits - 5)) & 31];
    }
    if (bits)
        *out++ = b32[(acc << (5 - bits)) & 31];
    *out = 0;
}

static void nk_make(nkey *k, int role)
{
    cr_assert_eq(RAND_bytes(k->seed, 32), 1);
    EVP_PKEY *pk = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL,
                                                k->seed, 32);
    size_t n = 32;
    cr_assert(pk && EVP_PKEY_get_raw_public_key(pk, k->pub, &n) == 1);
    EVP_PKEY_free(pk);
    unsigned char raw[40];
    raw[0] = (unsigned char)(NK_SEED | role >> 5);
    raw[1] = (unsigned char)((role & 31) << 3);
    memcpy(raw + 2, k->seed, 32);
    nk_text(raw, 34, k->seed_txt);
    raw[0] = (unsigned char)role;
    memcpy(raw + 1, k->pub, 32);
    nk_text(raw, 33, k->pub_txt);
}

/* p[0..n) in base64url without padding, appended to out. */
static void b64url(const unsigned char *p, size_t n, char *out)
{
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                            "abcdefghijklmnopqrstuvwxyz0123456789-_";
    out += strlen(out);
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 |
                     (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *out++ = t[v >> 18 & 63];
        *out++ = t[v >> 12 & 63];
        if (i + 1 < n)
            *out++ = t[v >> 6 & 63];
        if (i + 2 < n)
            *out++ = t[v & 63];
    }
    *out = 0;
}

/* A JWT of claims `nats` (a JSON object's members) about sub, signed by
 * iss, into out (size 4096). */
static void jwt(const nkey *iss, const char *sub, const char *name,
                const char *nats, char *out)
{
    static int jti;
    char claims[2048];
    snprintf(claims, sizeof claims, "{\"jti\":\"T%08dJTI\",\"iat\":%ld,"
             "\"iss\":\"%s\",\"name\":\"%s\",\"sub\":\"%s\",\"nats\":{%s,"
             "\"version\":2}}", ++jti, (long)time(NULL) - 60, iss->pub_txt,
             name, sub, nats);
    static const char head[] = "{\"typ\":\"JWT\",\"alg\":\"ed25519-nkey\"}";
    out[0] = 0;
    b64url((const unsigned char *)head, strlen(head), out);
    memcpy(out + strlen(out), ".", 2);
    b64url((const unsigned char *)claims, strlen(claims), out);
    EVP_PKEY *pk = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL,
                                                iss->seed, 32);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char sig[64];
    size_t n = sizeof sig;
    cr_assert(pk && md && EVP_DigestSignInit(md, NULL, NULL, NULL, pk) == 1);
    cr_assert_eq(EVP_DigestSign(md, sig, &n, (const unsigned char *)out,
                                strlen(out)), 1);
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(pk);
    memcpy(out + strlen(out), ".", 2);
    b64url(sig, n, out);
}

/* The suite's server replaced by one with configuration conf, connected
 * to with o; its streams IN and OUT made. */
static void start_with(const char *conf, natsOptions *o)
{
    sh_nats("stop");
    t_put("auth.conf", conf);
    setenv("NATS_TEST_CONF", t_at("auth.conf"), 1);
    char *d = t_tmpdir();
    snprintf(ndir, sizeof ndir, "%s/nats-auth", d);
    free(d);
    sh_nats("start");
    unsetenv("NATS_TEST_CONF");
    char *p = t_read(t_at("port.out"), NULL);
    port = (int)strtol(p, NULL, 10);
    free(p);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    char url[64];
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", port);
    cr_assert_eq(natsOptions_SetURL(o, url), NATS_OK);
    cr_assert_eq(natsConnection_Connect(&nc, o), NATS_OK, "%s",
                 nats_GetLastError(NULL));
    natsOptions_Destroy(o);
    cr_assert_eq(natsConnection_JetStream(&js, nc, NULL), NATS_OK);
    add_stream("IN", "in", 0);
    add_stream("OUT", "out", 120000);
}

/* dedup from IN to out with the URI parameters cred on both sides:
 * exit 0, or (bad) 1; and the seed nowhere in what idem says. */
static void dedup_with(const char *cred, int bad, const char *seed)
{
    char args[1024];
    snprintf(args, sizeof args, "dedup --key event_id --from "
             "'nats://127.0.0.1:%d/IN?durable=d&%s' --to "
             "'nats://127.0.0.1:%d/out?%s' --idle-exit 1s", port, cred,
             port, cred);
    int st = t_cli(t_dir, "%s 2>err", args);
    cr_assert_eq(st, bad ? 1 : 0, "%s: %s", cred, t_read(t_at("err"), NULL));
    cr_assert(!t_grep(t_at("err"), seed), "%s", t_read(t_at("err"), NULL));
}

Test(nats, an_nkey_user_is_let_in_by_its_seed_file)
{
    nkey user, other;
    nk_make(&user, NK_USER);
    nk_make(&other, NK_USER);
    char conf[256];
    snprintf(conf, sizeof conf, "authorization { users = [ { nkey: %s } ] }\n",
             user.pub_txt);
    t_put("user.nk", user.seed_txt);
    t_put("other.nk", other.seed_txt);
    natsOptions *o = NULL;
    cr_assert_eq(natsOptions_Create(&o), NATS_OK);
    cr_assert_eq(natsOptions_SetNKeyFromSeed(o, user.pub_txt,
                                             t_at("user.nk")), NATS_OK);
    start_with(conf, o);
    int nkeys = fill(50);
    char cred[512];
    snprintf(cred, sizeof cred, "nkey=%s&nkey_pub=%s", t_at("other.nk"),
             other.pub_txt);
    dedup_with(cred, 1, other.seed_txt);  /* a key the server lacks */
    snprintf(cred, sizeof cred, "nkey=%s&nkey_pub=%s", t_at("user.nk"),
             user.pub_txt);
    dedup_with(cred, 0, user.seed_txt);
    expect_output(nkeys, 0, 0);
    cr_assert_eq(pending("d"), 0);
}

Test(nats, a_creds_file_of_an_operators_user_lets_it_in)
{
    nkey op, sys, acc, user, other;
    nk_make(&op, NK_OPERATOR);
    nk_make(&sys, NK_ACCOUNT);  /* JetStream asks for a system account */
    nk_make(&acc, NK_ACCOUNT);
    nk_make(&user, NK_USER);
    nk_make(&other, NK_USER);
    char opjwt[4096], sysjwt[4096], accjwt[4096], ujwt[4096], conf[16384],
        creds[8192];
    jwt(&op, op.pub_txt, "op", "\"type\":\"operator\"", opjwt);
    jwt(&op, sys.pub_txt, "sys", "\"type\":\"account\"", sysjwt);
    jwt(&op, acc.pub_txt, "acc", "\"limits\":{\"subs\":-1,\"data\":-1,"
        "\"payload\":-1,\"imports\":-1,\"exports\":-1,\"wildcards\":true,"
        "\"conn\":-1,\"leaf\":-1,\"mem_storage\":-1,\"disk_storage\":-1,"
        "\"streams\":-1,\"consumer\":-1},\"type\":\"account\"", accjwt);
    jwt(&acc, user.pub_txt, "u", "\"pub\":{},\"sub\":{},\"subs\":-1,"
        "\"data\":-1,\"payload\":-1,\"type\":\"user\"", ujwt);
    snprintf(conf, sizeof conf, "operator: %s\nsystem_account: %s\n"
             "resolver: MEMORY\nresolver_preload: { %s: %s, %s: %s }\n",
             opjwt, sys.pub_txt, sys.pub_txt, sysjwt, acc.pub_txt, accjwt);
    static const char creds_fmt[] =
        "-----BEGIN NATS USER JWT-----\n%s\n------END NATS USER JWT------\n"
        "\n-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY "
        "SEED------\n";
    snprintf(creds, sizeof creds, creds_fmt, ujwt, user.seed_txt);
    t_put("user.creds", creds);
    /* The user's JWT with another's seed: its nonce signed wrong. */
    snprintf(creds, sizeof creds, creds_fmt, ujwt, other.seed_txt);
    t_put("other.creds", creds);
    natsOptions *o = NULL;
    cr_assert_eq(natsOptions_Create(&o), NATS_OK);
    cr_assert_eq(natsOptions_SetUserCredentialsFromFiles(
                     o, t_at("user.creds"), NULL), NATS_OK);
    start_with(conf, o);
    int nkeys = fill(50);
    char cred[512];
    snprintf(cred, sizeof cred, "creds=%s", t_at("other.creds"));
    dedup_with(cred, 1, other.seed_txt);
    snprintf(cred, sizeof cred, "creds=%s", t_at("user.creds"));
    dedup_with(cred, 0, user.seed_txt);
    expect_output(nkeys, 0, 0);
    cr_assert_eq(pending("d"), 0);
}
