/* tests/test_cli_kafka.c - `idem dedup` and `idem run` between Kafka
 * topics, on librdkafka's mock cluster (tests/progs/kafka_mock: three
 * brokers on loopback, in another process, reached as any client would):
 * each key once in the output with its value, message key and headers
 * unchanged plus idem-key, the group's committed offsets at the end of
 * the input, across kill -9 at random moments and just after the sink
 * was written; two consumers and a rebalance mid-stream; a broker that
 * fails requests and one that goes down; keys in values, headers and
 * message keys; a message without a key.
 *
 * Every check reads the output topic itself. Keys are produced as the
 * message key too, so that each key lives in one input partition and
 * its first message is well defined. The group's session timeout is
 * lowered (3 s) so that a killed member leaves the group soon. */
#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "killloop.h"
#include "redis_harness.h"

#define GROUP_PARAMS "session.timeout.ms=3000&heartbeat.interval.ms=500"

static pid_t mock_pid;
/* What was produced so far in this test: messages, distinct keys, and
 * the generator's state (a second produce() goes on from the first). */
static int produced, fresh, repeat_from;
static unsigned gen_x;
static FILE *mock_in, *mock_out;
static char brokers[256];

/* The mock cluster with topics in and out (4 partitions each). */
static void setup(void)
{
    t_dir_init();
    produced = fresh = repeat_from = 0;
    gen_x = 777;
    int to[2], from[2];
    /* Close-on-exec: the idem processes a test starts must not hold the
     * mock's input open, which ends it when the test ends. */
    cr_assert_eq(pipe2(to, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(from, O_CLOEXEC), 0);
    char prog[600];
    snprintf(prog, sizeof prog, "%s/kafka_mock", getenv("IDEM_PROGS"));
    mock_pid = fork();
    cr_assert_geq(mock_pid, 0);
    if (mock_pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        execl(prog, prog, "in:4", "out:4", "other:2", (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    mock_in = fdopen(to[1], "w");
    mock_out = fdopen(from[0], "r");
    cr_assert(fgets(brokers, sizeof brokers, mock_out), "no mock cluster");
    brokers[strcspn(brokers, "\n")] = 0;
}

/* A run a test started without --idle-exit (it stops it with SIGTERM):
 * killed here if the test failed before, so that it does not outlive
 * the test. */
static pid_t runner_pid;

static void teardown(void)
{
    if (runner_pid > 0) {
        kill(runner_pid, SIGKILL);
        waitpid(runner_pid, NULL, 0);
        runner_pid = 0;
    }
    fclose(mock_in);
    kill(mock_pid, SIGKILL);
    waitpid(mock_pid, NULL, 0);
    fclose(mock_out);
    t_dir_fini();
}

TestSuite(kafka, .init = setup, .fini = teardown, .timeout = 240);

/* A command to the mock; it answers ok. */
static void mock(const char *cmd)
{
    char line[64];
    fprintf(mock_in, "%s\n", cmd);
    fflush(mock_in);
    cr_assert(fgets(line, sizeof line, mock_out));
    cr_assert_str_eq(line, "ok\n", "mock: %s", cmd);
}

/* ---- producing and reading */

enum { KEY_IN_VALUE, KEY_IN_HEADER, KEY_AS_KEY, NO_KEY_ON_SOME };

#define MAXN 3000
static int first_of[MAXN];  /* key k's first message: its number */

/* A client; `max`: its message.max.bytes (NULL: librdkafka's). */
static rd_kafka_t *client_max(rd_kafka_type_t t, const char *group,
                              const char *max)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", brokers, NULL, 0);
    rd_kafka_conf_set(c, "log_level", "2", NULL, 0);
    if (max)
        rd_kafka_conf_set(c, "message.max.bytes", max, NULL, 0);
    if (group) {
        rd_kafka_conf_set(c, "group.id", group, NULL, 0);
        rd_kafka_conf_set(c, "enable.auto.commit", "false", NULL, 0);
    }
    rd_kafka_conf_set(c, "enable.partition.eof", "true", NULL, 0);
    rd_kafka_t *rk = rd_kafka_new(t, c, err, sizeof err);
    cr_assert(rk, "%s", err);
    return rk;
}

static rd_kafka_t *client(rd_kafka_type_t t, const char *group)
{
    return client_max(t, group, NULL);
}

/* n messages into topic: one in five repeats an earlier key; the key
 * is e<K>, by `how`; every message has the header note=n<I> and its
 * value {"event_id":"eK","amount":"..","note":"nI"} (no event_id when
 * the key is elsewhere). Returns the number of distinct keys so far. */
static int produce_to(const char *topic, int n, int how)
{
    rd_kafka_t *rk = client(RD_KAFKA_PRODUCER, NULL);
    unsigned x = gen_x;
    cr_assert_leq(produced + n, MAXN);
    for (int i = produced; i < produced + n; i++) {
        x = x * 1103515245u + 12345u;
        int repeat = (x >> 8) % 5 == 0 && fresh > repeat_from;
        int k = repeat ? repeat_from + (int)((x >> 12) % (unsigned)(fresh -
                                                            repeat_from))
                       : fresh++;
        if (!repeat)
            first_of[k] = i;
        char key[32], note[32], value[200];
        snprintf(key, sizeof key, "e%d", k);
        snprintf(note, sizeof note, "n%d", i);
        if (how == KEY_IN_VALUE || how == NO_KEY_ON_SOME)
            snprintf(value, sizeof value, "{\"event_id\":\"%s\",\"amount\":"
                     "\"%d\",\"note\":\"%s\"}", how == NO_KEY_ON_SOME &&
                     i % 10 == 9 ? "" : key, k * 7 % 1000, note);
        else
            snprintf(value, sizeof value, "{\"amount\":\"%d\",\"note\":"
                     "\"%s\"}", k * 7 % 1000, note);
        if (how == NO_KEY_ON_SOME && i % 10 == 9)  /* no event_id */
            snprintf(value, sizeof value, "{\"note\":\"%s\"}", note);
        rd_kafka_headers_t *h = rd_kafka_headers_new(2);
        rd_kafka_header_add(h, "note", -1, note, -1);
        if (how == KEY_IN_HEADER)
            rd_kafka_header_add(h, "idempotency-key", -1, key, -1);
        cr_assert_eq(rd_kafka_producev(
                         rk, RD_KAFKA_V_TOPIC(topic),
                         RD_KAFKA_V_VALUE(value, strlen(value)),
                         RD_KAFKA_V_KEY(key, strlen(key)),
                         RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                         RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END),
                     0);
        rd_kafka_poll(rk, 0);
    }
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    rd_kafka_destroy(rk);
    produced += n;
    gen_x = x;
    return fresh;
}

static int produce(int n, int how)
{
    return produce_to("in", n, how);
}

/* One message of a new key, as produce() makes them (KEY_IN_VALUE), its
 * value padded to `size` bytes. Returns its key's number. */
static int produce_big(size_t size)
{
    rd_kafka_t *rk = client_max(RD_KAFKA_PRODUCER, NULL, "4000000");
    int k = fresh++, i = produced++;
    first_of[k] = i;
    char key[32], note[32];
    snprintf(key, sizeof key, "e%d", k);
    snprintf(note, sizeof note, "n%d", i);
    char *value = malloc(size);
    cr_assert(value);
    int head = snprintf(value, size, "{\"event_id\":\"%s\",\"note\":\"%s\","
                        "\"pad\":\"", key, note);
    memset(value + head, 'x', size - (size_t)head - 2);
    memcpy(value + size - 2, "\"}", 2);
    rd_kafka_headers_t *h = rd_kafka_headers_new(1);
    rd_kafka_header_add(h, "note", -1, note, -1);
    cr_assert_eq(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("in"),
                                   RD_KAFKA_V_VALUE(value, size),
                                   RD_KAFKA_V_KEY(key, strlen(key)),
                                   RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                   RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END),
                 0);
    cr_assert_eq(rd_kafka_flush(rk, 30000), 0);
    rd_kafka_destroy(rk);
    free(value);
    return k;
}

typedef struct out_msg {
    char key[32], idem_key[32], note[32];
    char value[200];
    int fence;
} out_msg;

static int header(const rd_kafka_message_t *m, const char *name, char *buf,
                  size_t n)
{
    rd_kafka_headers_t *h;
    const void *v;
    size_t len;
    buf[0] = 0;
    if (rd_kafka_message_headers(m, &h) ||
        rd_kafka_header_get_last(h, name, &v, &len))
        return 0;
    snprintf(buf, n, "%.*s", (int)len, v ? (const char *)v : "");
    return 1;
}

/* Every message of topic (nparts partitions) into out; their number. */
static int read_topic(const char *topic, int nparts, out_msg *out, int max)
{
    rd_kafka_t *rk = client(RD_KAFKA_CONSUMER, "reader");
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new(nparts);
    for (int i = 0; i < nparts; i++)
        rd_kafka_topic_partition_list_add(l, topic, i)->offset =
            RD_KAFKA_OFFSET_BEGINNING;
    cr_assert_eq(rd_kafka_assign(rk, l), 0);
    rd_kafka_topic_partition_list_destroy(l);
    int n = 0, eofs = 0;
    int64_t until = t_mono_ms() + 60000;
    while (eofs < nparts) {
        cr_assert_lt(t_mono_ms(), until, "reading %s did not end", topic);
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
            eofs++;
        else if (!m->err) {
            cr_assert_lt(n, max);
            out_msg *o = &out[n++];
            memset(o, 0, sizeof *o);
            snprintf(o->key, sizeof o->key, "%.*s", (int)m->key_len,
                     m->key ? (const char *)m->key : "");
            snprintf(o->value, sizeof o->value, "%.*s", (int)m->len,
                     m->payload ? (const char *)m->payload : "");
            header(m, "idem-key", o->idem_key, sizeof o->idem_key);
            header(m, "note", o->note, sizeof o->note);
            char f[8];
            o->fence = header(m, "idem-fence", f, sizeof f);
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_destroy(rk);
    return n;
}

static int key_number(const char *s)
{
    return s[0] == 'e' ? (int)strtol(s + 1, NULL, 10) : -1;
}

/* The output holds keys e0 .. e(nkeys-1) once each, every message that
 * of its key's first input message: value, message key and headers,
 * plus idem-key. Fence markers are passed over. */
static void expect_output_in(const char *topic, int nparts, int nkeys,
                             int how)
{
    static out_msg out[2 * MAXN];
    int n = read_topic(topic, nparts, out, 2 * MAXN), got = 0;
    char *seen = calloc((size_t)nkeys, 1);
    for (int i = 0; i < n; i++) {
        if (out[i].fence)
            continue;
        got++;
        int k = key_number(out[i].idem_key);
        cr_assert(k >= 0 && k < nkeys && !seen[k], "key '%s' twice or "
                  "unknown", out[i].idem_key);
        seen[k] = 1;
        cr_assert_str_eq(out[i].key, out[i].idem_key);
        char note[32];
        snprintf(note, sizeof note, "n%d", first_of[k]);
        cr_assert_str_eq(out[i].note, note, "key e%d: header of another "
                         "message", k);
        cr_assert(strstr(out[i].value, note), "key e%d: value %s", k,
                  out[i].value);
        if (how == KEY_IN_VALUE)
            cr_assert(strstr(out[i].value, out[i].idem_key));
    }
    cr_assert_eq(got, nkeys, "%d messages for %d keys", got, nkeys);
    free(seen);
}

static void expect_output(int nkeys, int how)
{
    expect_output_in("out", 4, nkeys, how);
}

/* run's output: keys e0 .. e(nkeys-1) once each, each a result done,
 * with its input's message key. */
static void expect_results(int nkeys)
{
    static out_msg out[2 * MAXN];
    int n = read_topic("out", 4, out, 2 * MAXN), got = 0;
    char *seen = calloc((size_t)nkeys, 1);
    for (int i = 0; i < n; i++) {
        if (out[i].fence)
            continue;
        got++;
        int k = key_number(out[i].idem_key);
        cr_assert(k >= 0 && k < nkeys && !seen[k], "key %s twice",
                  out[i].idem_key);
        seen[k] = 1;
        cr_assert_str_eq(out[i].key, out[i].idem_key);
        cr_assert(strstr(out[i].value, "\"status\":\"done\""), "%s",
                  out[i].value);
    }
    cr_assert_eq(got, nkeys, "%d results for %d keys", got, nkeys);
    free(seen);
}

/* The first partition of topic (nparts partitions) whose offset
 * committed by group g is short of its end, described in why; -1 when
 * none is. */
static int short_of_the_end(const char *g, const char *topic, int nparts,
                            char *why, size_t n)
{
    rd_kafka_t *rk = client(RD_KAFKA_CONSUMER, g);
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new(nparts);
    for (int i = 0; i < nparts; i++)
        rd_kafka_topic_partition_list_add(l, topic, i);
    cr_assert_eq(rd_kafka_committed(rk, l, 20000), 0);
    int at = -1;
    for (int i = 0; at < 0 && i < nparts; i++) {
        int64_t lo, hi;
        cr_assert_eq(rd_kafka_query_watermark_offsets(rk, topic, i, &lo, &hi,
                                                      20000), 0);
        if (l->elems[i].offset != hi) {
            at = i;
            snprintf(why, n, "partition %d: committed %lld, end %lld", i,
                     (long long)l->elems[i].offset, (long long)hi);
        }
    }
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return at;
}

/* Group g's committed offsets are the ends of topic (nparts
 * partitions). */
static void expect_committed_in(const char *g, const char *topic,
                                int nparts)
{
    char why[200];
    cr_assert_lt(short_of_the_end(g, topic, nparts, why, sizeof why), 0,
                 "%s", why);
}

static void expect_committed_to_the_end(const char *g)
{
    expect_committed_in(g, "in", 4);
}

static const char *src_of(const char *topic, const char *params)
{
    static char b[2][800];
    static int t;
    t ^= 1;
    snprintf(b[t], sizeof b[t], "'kafka://%s/%s?%s&" GROUP_PARAMS "'",
             brokers, topic, params);
    return b[t];
}

static const char *src(const char *params)
{
    return src_of("in", params);
}

static const char *dst_of(const char *topic)
{
    static char b[800];
    snprintf(b, sizeof b, "'kafka://%s/%s'", brokers, topic);
    return b;
}

static const char *dst(void)
{
    return dst_of("out");
}

/* Messages in topic (nparts partitions): the sum of their ends. */
static long count_topic(const char *topic, int nparts)
{
    rd_kafka_t *rk = client(RD_KAFKA_PRODUCER, NULL);
    long n = 0;
    for (int i = 0; i < nparts; i++) {
        int64_t lo, hi;
        cr_assert_eq(rd_kafka_query_watermark_offsets(rk, topic, i, &lo, &hi,
                                                      20000), 0);
        n += (long)hi;
    }
    rd_kafka_destroy(rk);
    return n;
}

/* Wait (up to two minutes) until topic holds n messages. */
static void await_count(const char *topic, int nparts, long n)
{
    int64_t until = t_mono_ms() + 120000;
    long got;
    while ((got = count_topic(topic, nparts)) < n) {
        cr_assert_lt(t_mono_ms(), until, "%s holds %ld of %ld", topic, got,
                     n);
        t_sleep_ms(200);
    }
}

/* ---- tests */

Test(kafka, dedup_keeps_first_messages_with_their_key_and_headers)
{
    int nkeys = produce(300, KEY_IN_VALUE);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 500ms --batch 64 2> err",
                       src("group=g"), dst()), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g");
    /* kcat reads the output with its headers. */
    cr_assert_eq(t_sh("cd '%s' && kcat -C -b '%s' -t out -e -q -J "
                      "> kcat.json 2>/dev/null", t_dir, brokers), 0);
    cr_assert(t_grep(t_at("kcat.json"), "\"idem-key\",\"e0\""), "%s",
              t_read(t_at("kcat.json"), NULL));
    /* Again, in a new group: every key a duplicate, nothing written. */
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 500ms 2> err", src("group=g2"), dst()),
                 0, "%s", t_read(t_at("err"), NULL));
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g2");
}

/* Kill runs of args (tests/killloop.h): two runs in three kill
 * themselves just after writing the sink and before the commit, after 1
 * to 3 batches; the third is killed within span seconds (joining the
 * group takes a few of them, the work the rest). A run that ends by
 * itself has done the input: no kill can land on work after it. Then one
 * run finishes. Returns the kills that landed. With cut_power, every
 * kill is a random one and a power cut too (t_power_cut). */
static int cut_power;

static long kill_loop(const char *args, double span, long nkills)
{
    t_kill_plan p = {.args = args, .span = span, .nkills = nkills,
                     .tries = 2, .at_max = 3, .every = cut_power ? 1 : 3,
                     .self_only = 1, .done_ends = 1,
                     .power_cut = cut_power};
    long landed = t_kill_loop(&p);
    cr_assert_eq(t_cli(t_dir, "%s 2>>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    return landed;
}

Test(kafka, dedup_kill9_each_key_once)
{
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    int nkeys = produce(3000, KEY_IN_VALUE);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 300ms --batch 20 --lease 1s --commit-interval "
             "20ms --store local:store --job k9", src("group=g"), dst());
    long landed = kill_loop(args, 5.0, t_kills(10));
    cr_assert_geq(landed, t_kills(10) < 3 ? t_kills(10) : 3);
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g");
    fprintf(stderr, "kafka dedup: %ld kills landed (seed %u)\n", landed,
            seed);
}

/* dedup on a local store overlaps a batch's sync with the next batch's
 * writes (stream.c, sync_overlaps), and commits its offsets only after
 * that sync. A power cut (tests/shim/synclog.c) just after the next
 * batch was written, while the sync is still in flight (the shim makes
 * each sync take 200 ms), loses the records and checkpoints of both
 * batches, whose messages are in the output: the rerun resumes at the
 * last durable checkpoint's offsets and must read both batches back
 * from its output offsets, not write their keys again. Cut after the
 * third batch's writes, twice; then a whole run, which reads back more
 * than a batch: each key once, offsets at the end. */
Test(kafka, power_cuts_with_a_sync_in_flight_write_nothing_twice)
{
    int nkeys = produce(600, KEY_IN_VALUE);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 300ms --batch 20 --store local:store --job kp "
             "--stats-json", src("group=g"), dst());
    setenv("IDEM_TEST_SYNC_DELAY_MS", "200", 1);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(t_cli_cut_at("sink-written:3", args), 128 + SIGKILL,
                     "run %d not killed: %s", i, t_read(t_at("err"), NULL));
    unsetenv("IDEM_TEST_SYNC_DELAY_MS");
    unlink(t_at("err"));
    cr_assert_eq(t_cli_cut_at(NULL, args), 0, "%s",
                 t_read(t_at("err"), NULL));
    char *stats = t_read(t_at("err"), NULL), *rb = strstr(stats,
                                                          "\"read_back\":");
    cr_assert(rb && strtol(rb + 12, NULL, 10) > 20, "not more than a "
              "batch read back: %s", stats);
    free(stats);
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g");
}

/* Kills at random moments that are power cuts too, each sync slowed to
 * 50 ms so that many land while one is in flight beside the next
 * batch's writes (the overlap of dedup on a local store): whatever the
 * store lost, each key once and the offsets at the end. */
Test(kafka, dedup_power_cuts_at_random_moments)
{
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    int nkeys = produce(1500, KEY_IN_VALUE);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 300ms --batch 20 --store local:store --job kr",
             src("group=g"), dst());
    cut_power = 1;
    setenv("IDEM_TEST_SYNC_DELAY_MS", "50", 1);
    long landed = kill_loop(args, 5.0, 3);
    unsetenv("IDEM_TEST_SYNC_DELAY_MS");
    cut_power = 0;
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g");
    fprintf(stderr, "kafka power cuts: %ld landed (seed %u)\n", landed,
            seed);
}

/* run: each key's result once, after kills; message keys kept. */
Test(kafka, run_kill9_results_once)
{
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    int nkeys = produce(1000, KEY_AS_KEY);
    char args[2048];
    snprintf(args, sizeof args, "run --key @key --from %s --to %s "
             "--idle-exit 300ms --batch 10 --lease 1s --commit-interval "
             "10ms --exec '\"$IDEM_PROGS/handler\" log' --job r",
             src("group=g"), dst());
    long landed = kill_loop(args, 5.0, t_kills(9));
    cr_assert_geq(landed, t_kills(9) < 3 ? t_kills(9) : 3);
    expect_results(nkeys);
    expect_committed_to_the_end("g");
    fprintf(stderr, "kafka run: %ld kills landed (seed %u)\n", landed,
            seed);
}

/* Two consumers of one group sharing a Redis store: the second joins
 * while the first works through a slow handler, so partitions are
 * taken from it with a batch in flight (a cooperative rebalance);
 * together they run each key once and both did some. b starts once a
 * has committed some results, not after a pause: a loaded machine can
 * make a's join take longer than any pause. a's handler is slow (at
 * most 50 messages a second, whatever the load) so that, while the
 * group rebalances, a gets through a fraction of its 600 messages and
 * b is given partitions with work left; b's is quick, which keeps the
 * test short. */
Test(kafka, two_consumers_and_a_rebalance_mid_stream)
{
    int nkeys = produce(600, KEY_IN_VALUE);
    char store[300];
    snprintf(store, sizeof store, "'redis://%s?prefix=%s'", th_redis_addr(),
             th_prefix());
#define CONSUMER "run --key event_id --from %s --to %s --idle-exit 2s "   \
                 "--batch 10 --lease 2s --store %s --stats-json --exec "  \
                 "'\"$IDEM_PROGS/handler\" sleep=%d' 2>err%d"
    pid_t a = t_cli_start(t_dir, CONSUMER, src("group=g&consumer=a"), dst(),
                          store, 20, 1);
    await_count("out", 4, 20);  /* a has joined and is working */
    pid_t b = t_cli_start(t_dir, CONSUMER, src("group=g&consumer=b"), dst(),
                          store, 5, 2);
    cr_assert_eq(t_wait(a), 0, "%s", t_read(t_at("err1"), NULL));
    cr_assert_eq(t_wait(b), 0, "%s", t_read(t_at("err2"), NULL));
    expect_results(nkeys);
    expect_committed_to_the_end("g");
    cr_assert(!t_grep(t_at("err1"), "\"new\":0,"), "a did nothing: %s",
              t_read(t_at("err1"), NULL));
    cr_assert(!t_grep(t_at("err2"), "\"new\":0,"), "b did nothing: %s",
              t_read(t_at("err2"), NULL));
}

Test(kafka, keys_from_a_header_and_from_the_message_key)
{
    int nkeys = produce(200, KEY_IN_HEADER);
    cr_assert_eq(t_cli(t_dir, "dedup --key header:idempotency-key --from "
                       "%s --to %s --idle-exit 500ms 2> err",
                       src("group=g"), dst()), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, KEY_IN_HEADER);
    /* The message key, into a file: the values, one per line. */
    cr_assert_eq(t_cli(t_dir, "dedup --key @key --from %s --output o "
                       "--idle-exit 500ms 2> err", src("group=g2")), 0,
                 "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(t_lines_of("o"), nkeys);
}

Test(kafka, a_message_without_a_key)
{
    int nkeys = produce(100, NO_KEY_ON_SOME);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 500ms 2> err", src("group=g"), dst()),
                 1, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "partition"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "no key field 'event_id'"));
    /* skip: the run goes on, the keyless ones committed past. */
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--on-missing-key skip --idle-exit 500ms 2> err",
                       src("group=g"), dst()), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_committed_to_the_end("g");
    (void)nkeys;
}

/* Produce requests that fail (retriable) and a broker down for a while:
 * the idempotent producer retries, the consumer fails over; the output
 * is still each key once. */
Test(kafka, a_broker_failing_requests_and_one_going_down)
{
    int nkeys = produce(600, KEY_IN_VALUE);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "errors 0 20 %d",
             RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS);
    mock(cmd);  /* Produce */
    snprintf(cmd, sizeof cmd, "errors 8 5 %d",
             RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT);
    mock(cmd);  /* OffsetCommit */
    pid_t a = t_cli_start(t_dir, "dedup --key event_id --from %s --to %s "
                          "--idle-exit 2s --batch 20 2>err",
                          src("group=g"), dst());
    t_sleep_ms(3500);
    mock("down 2");
    t_sleep_ms(3000);
    mock("up 2");
    int st = t_wait(a);
    if (st != 0)  /* a run that gave up says why; the next one ends it */
        cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                           "--idle-exit 2s --batch 20 2>>err",
                           src("group=g"), dst()), 0, "%s",
                     t_read(t_at("err"), NULL));
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g");
}

/* A message over the producer's message.max.bytes (1,000,000 by
 * default): the run stops before it, naming the topic, the limit and the
 * key, and so does a rerun; one with the limit raised in the --to URI
 * writes it, and nothing twice. */
Test(kafka, a_message_over_the_size_limit_stops_the_run_naming_it)
{
    produce(40, KEY_IN_VALUE);
    int big = produce_big(1200000);
    int nkeys = produce(40, KEY_IN_VALUE);
    char args[2048], says[64];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 500ms --batch 8 --store local:store",
             src("group=g"), dst());
    snprintf(says, sizeof says, "key 'e%d' (1200000 bytes)", big);
    for (int run = 0; run < 2; run++) {
        cr_assert_eq(t_cli(t_dir, "%s 2>err", args), 1, "%s",
                     t_read(t_at("err"), NULL));
        cr_assert(t_grep(t_at("err"), says), "%s", t_read(t_at("err"), NULL));
        cr_assert(t_grep(t_at("err"), "/out: "));
        cr_assert(t_grep(t_at("err"), "message.max.bytes (1000000)"));
    }
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 500ms --batch 8 --store local:store "
                       "2>err", src("group=g"),
                       dst_of("out?message.max.bytes=2000000")), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g");
}

/* The fence: a run killed while its writes are at the broker and their
 * delivery reports are not (the mock carries Produce out at once and
 * answers it 8 s late) left them in the output; the rerun's fence goes
 * in after them, and it reads them back instead of writing them again. */
Test(kafka, writes_of_a_dead_run_unanswered_by_the_broker_are_read_back)
{
    int nkeys = produce(300, KEY_IN_VALUE);
    mock("slow 0 1 8000");  /* Produce, the next one on each broker */
    pid_t a = runner_pid = t_cli_start(t_dir, "dedup --key event_id --from "
                                       "%s --to %s --batch 100 --store "
                                       "local:store 2>err",
                                       src("group=g"), dst());
    await_count("out", 4, 1);
    kill(a, SIGKILL);
    runner_pid = 0;
    cr_assert_eq(t_wait(a), 128 + SIGKILL);
    char why[200];
    cr_assert_geq(short_of_the_end("g", "in", 4, why, sizeof why), 0,
                  "the killed run committed its batch");
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 500ms --store local:store --stats-json "
                       "2>>err", src("group=g"), dst()), 0, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "\"read_back\":"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(!t_grep(t_at("err"), "\"read_back\":0,"), "nothing read "
              "back: %s", t_read(t_at("err"), NULL));
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g");
}

/* The cluster gone for good after the work: the member's session ends,
 * its partitions go, and --idle-exit, which counts only while
 * partitions are assigned, would never end the run. With --idle-exit
 * the outage is bounded instead (ksource.c, brokers_gone): the run
 * stops with exit status 1 and says so, naming the bootstrap servers.
 * What it wrote before is committed. */
Test(kafka, all_brokers_gone_end_an_idle_exit_run_with_an_error)
{
    int nkeys = produce(50, KEY_IN_VALUE);
    char from[800];
    snprintf(from, sizeof from, "'kafka://%s/in?group=g&timeout_ms=3000&"
             GROUP_PARAMS "'", brokers);
    pid_t a = runner_pid = t_cli_start(t_dir, "dedup --key event_id --from "
                                       "%s --to %s --idle-exit 6s --store "
                                       "local:store 2>err", from, dst());
    await_count("out", 4, nkeys);
    expect_committed_to_the_end("g");
    mock("down 1");
    mock("down 2");
    mock("down 3");
    int64_t until = t_mono_ms() + 60000;
    int st = 0;
    pid_t got;
    while ((got = waitpid(a, &st, WNOHANG)) == 0 && t_mono_ms() < until)
        t_sleep_ms(200);
    cr_assert_eq(got, a, "still polling a minute later: %s",
                 t_read(t_at("err"), NULL));
    runner_pid = 0;
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "no broker of the cluster has answered "
                     "for"), "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), brokers), "%s",
              t_read(t_at("err"), NULL));
    for (int b = 1; b <= 3; b++) {
        char up[16];
        snprintf(up, sizeof up, "up %d", b);
        mock(up);
    }
    expect_output(nkeys, KEY_IN_VALUE);
}

Test(kafka, bad_uris_and_properties_say_what_is_wrong_and_no_secret)
{
    struct {
        const char *args, *says;
    } cases[] = {
        {"--from 'kafka://127.0.0.1:1/t'", "?group=NAME"},
        {"--from 'kafka://127.0.0.1:1/t?group=g&bogus=1'",
         "unknown parameter 'bogus'"},
        {"--from 'kafka://127.0.0.1:1?group=g'", "TOPIC"},
        {"--from 'kafka://127.0.0.1:1/a,b?group=g' --to "
         "'kafka://127.0.0.1:1/x,y'", "one topic"},
        {"--from 'kafka://127.0.0.1:1/t?group=g' --to "
         "'kafka://127.0.0.1:1/t'", "name one stream"},
        {"--key @key in", "--key @key"},
    };
#define NOWHERE "'kafka://127.0.0.1:1/t?group=g&timeout_ms=500"
    t_put("in", "{}\n");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_eq(t_cli(t_dir, "dedup --key id %s 2>err", cases[i].args),
                     2, "%s", cases[i].args);
        cr_assert(t_grep(t_at("err"), cases[i].says), "%s: %s",
                  cases[i].args, t_read(t_at("err"), NULL));
    }
    /* A property refused: named, its value (a secret) not shown. */
    cr_assert_eq(t_cli(t_dir, "dedup --key id --from " NOWHERE
                       "&security.protocol=secret1' 2>err"), 1);
    cr_assert(t_grep(t_at("err"), "security.protocol"));
    cr_assert(!t_grep(t_at("err"), "secret1"), "%s",
              t_read(t_at("err"), NULL));
    t_put("kc", "# a file as kcat -F reads\nsasl.password=secret2\n"
                "sasl.mechanisms=secret3\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --kafka-config kc --from "
                       NOWHERE "' 2>err"), 1);
    cr_assert(t_grep(t_at("err"), "no broker answered"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "127.0.0.1:1"));
    cr_assert(!t_grep(t_at("err"), "secret"), "%s",
              t_read(t_at("err"), NULL));
}

/* Offset commits that the group refused are made again while the
 * reader is idle, not only by the next batch's commit, which may never
 * come: else a new owner of the partitions (here with a store of its
 * own) starts from the stale offsets and writes again what the first
 * one wrote, and the group's offsets stay behind. */
Test(kafka, offset_commits_that_failed_are_made_again_while_idle)
{
    int nkeys = produce(400, KEY_IN_VALUE);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "errors 8 100000 %d",
             RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE);
    mock(cmd);  /* every OffsetCommit fails */
    pid_t a = runner_pid = t_cli_start(t_dir, "dedup --key event_id --from "
                                       "%s --to %s --batch 50 --store "
                                       "local:sa 2>err1",
                                       src("group=g&consumer=a"), dst());
    await_count("out", 4, nkeys);
    mock("clear 8");
    /* a, idle, commits again what the group refused. */
    char why[200];
    int64_t until = t_mono_ms() + 60000;
    while (short_of_the_end("g", "in", 4, why, sizeof why) >= 0) {
        cr_assert_lt(t_mono_ms(), until, "%s", why);
        t_sleep_ms(200);
    }
    /* b, with a store of its own, is given some of them: it starts
     * where a committed. */
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 2s --store local:sb 2>err2",
                       src("group=g&consumer=b"), dst()), 0, "%s",
                 t_read(t_at("err2"), NULL));
    kill(a, SIGTERM);
    runner_pid = 0;
    cr_assert_eq(t_wait(a), 0, "%s", t_read(t_at("err1"), NULL));
    cr_assert(t_grep(t_at("err2"), " 0 lines read"), "%s",
              t_read(t_at("err2"), NULL));
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g");
}

/* A worker whose checkpoint holds older offsets than the group's (its
 * partitions were another worker's since) starts from the group's: when
 * reading them fails for a moment, it asks again rather than starting
 * from its own checkpoint and writing again what the other one wrote. */
Test(kafka, a_worker_with_an_older_checkpoint_never_starts_from_it)
{
    produce(200, KEY_IN_VALUE);
#define WORKER "dedup --key event_id --from %s --to %s --idle-exit 500ms " \
               "--store local:s%s 2>>err"
    cr_assert_eq(t_cli(t_dir, WORKER, src("group=g&consumer=b"), dst(), "b"),
                 0, "%s", t_read(t_at("err"), NULL));
    repeat_from = fresh;  /* a's store knows none of b's keys, nor needs to */
    int nkeys = produce(300, KEY_IN_VALUE);
    cr_assert_eq(t_cli(t_dir, WORKER, src("group=g&consumer=a"), dst(), "a"),
                 0, "%s", t_read(t_at("err"), NULL));
    char cmd[64];
    snprintf(cmd, sizeof cmd, "errors 9 3 %d",
             RD_KAFKA_RESP_ERR_INVALID_REQUEST);
    mock(cmd);  /* the next three OffsetFetch fail */
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --to %s "
                       "--idle-exit 500ms --store local:sb 2>err2",
                       src("group=g&consumer=b"), dst()), 0, "%s",
                 t_read(t_at("err2"), NULL));
    /* Nothing is read again (the sink's read-back would keep the output
     * right, but every message would be claimed and counted anew). */
    cr_assert(t_grep(t_at("err2"), " 0 lines read"), "%s",
              t_read(t_at("err2"), NULL));
    mock("clear 9");
    expect_output(nkeys, KEY_IN_VALUE);
    expect_committed_to_the_end("g");
}

/* A partition given back to the worker that had it resumes where that
 * worker's run left it, not at the group's offset, when the group
 * refused its offset commits (here every one fails; on a loaded machine
 * an assignment lost to a late rejoin refuses them all the same): an
 * eager rebalance takes a's partitions and gives them back, twice, as b
 * joins the group for another topic and leaves it. a reads its 300
 * messages once, not again from the start, and the group's offsets,
 * once it takes commits again, catch up with a's checkpoint without a
 * message more. */
Test(kafka, a_partition_given_back_resumes_where_the_run_left_it)
{
    int nkeys = produce(300, KEY_IN_VALUE);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "errors 8 100000 %d",
             RD_KAFKA_RESP_ERR_OFFSET_METADATA_TOO_LARGE);
    mock(cmd);  /* every OffsetCommit fails */
#define EAGER "partition.assignment.strategy=range&group=g&consumer="
    pid_t a = runner_pid = t_cli_start(t_dir, "dedup --key event_id --from "
                                       "%s --to %s --batch 50 --store "
                                       "local:sa 2>err1",
                                       src(EAGER "a"), dst());
    await_count("out", 4, nkeys);
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --from %s --output "
                       "/dev/null --idle-exit 1s --store local:sb 2>err2",
                       src_of("other", EAGER "b")), 0, "%s",
                 t_read(t_at("err2"), NULL));
    mock("clear 8");
    char why[200];
    int64_t until = t_mono_ms() + 60000;
    while (short_of_the_end("g", "in", 4, why, sizeof why) >= 0) {
        cr_assert_lt(t_mono_ms(), until, "%s", why);
        t_sleep_ms(200);
    }
    kill(a, SIGTERM);
    runner_pid = 0;
    cr_assert_eq(t_wait(a), 0, "%s", t_read(t_at("err1"), NULL));
    cr_assert(t_grep(t_at("err1"), " 300 lines read"), "%s",
              t_read(t_at("err1"), NULL));
    expect_output(nkeys, KEY_IN_VALUE);
}

/* Many partitions and a long topic name: the source's and the sink's
 * positions are long, and a checkpoint keeps them whole (a position cut
 * short is one a resumed run cannot read back from). */
Test(kafka, many_partitions_and_long_topic_names)
{
    static const char in[] = "orders.payments.eu-west-1.settlement-events."
                             "with-a-long-name-as-some-companies-name-them";
    char cmd[300];
    snprintf(cmd, sizeof cmd, "topic %s:32", in);
    mock(cmd);
    mock("topic wide:200");
    int nkeys = produce_to(in, 600, KEY_IN_VALUE);
    char args[2048];
    snprintf(args, sizeof args, "dedup --key event_id --from %s --to %s "
             "--idle-exit 500ms --batch 40 --store local:store",
             src_of(in, "group=g"), dst_of("wide"));
    setenv("IDEM_TEST_KILL_AT", "sink-written:3", 1);
    int st = t_cli(t_dir, "%s 2>err", args);
    unsetenv("IDEM_TEST_KILL_AT");
    cr_assert_eq(st, 128 + SIGKILL, "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(t_cli(t_dir, "%s 2>>err", args), 0, "%s",
                 t_read(t_at("err"), NULL));
    expect_output_in("wide", 200, nkeys, KEY_IN_VALUE);
    expect_committed_in("g", in, 32);
}

/* A loopback port nothing listens on (the kernel's pick). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    cr_assert(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
              !getsockname(fd, (struct sockaddr *)&a, &n));
    close(fd);
    return ntohs(a.sin_port);
}

/* idem_source_lag_messages as the endpoint on port serves it; -1 when
 * it is not there (yet). */
static long long scrape_lag(int port)
{
    if (t_sh("cd '%s' && curl -sf http://127.0.0.1:%d/metrics > scrape",
             t_dir, port) != 0)
        return -1;
    char *body = t_read(t_at("scrape"), NULL);
    const char *p = strstr(body, "\nidem_source_lag_messages{");
    p = p ? strstr(p, "} ") : NULL;
    long long lag = p ? strtoll(p + 2, NULL, 10) : -1;
    free(body);
    return lag;
}

/* Scrape until the lag is `want` (-2: any above 0). */
static long long await_lag(int port, long long want)
{
    int64_t until = t_mono_ms() + 120000;
    long long lag;
    while ((lag = scrape_lag(port)) != want && !(want == -2 && lag > 0)) {
        cr_assert_lt(t_mono_ms(), until, "lag %lld, not %lld", lag, want);
        t_sleep_ms(200);
    }
    return lag;
}

/* The source's lag on the metrics endpoint: the messages of the group's
 * partitions not read yet, from their high watermarks. While the
 * handler holds the first batch, the rest is behind; then none is. */
Test(kafka, the_lag_of_the_source_from_the_high_watermarks)
{
    int nkeys = produce(300, KEY_AS_KEY);
    int port = free_port();
    pid_t a = runner_pid = t_cli_start(
        t_dir, "run --key @key --from %s --to %s --batch 10 "
        "--metrics-listen 127.0.0.1:%d --exec '\"$IDEM_PROGS/handler\" "
        "waitfor=gate' 2>err", src("group=g"), dst(), port);
    long long lag = await_lag(port, -2);
    cr_assert_leq(lag, 300);
    t_put("gate", "");
    await_count("out", 4, nkeys);
    await_lag(port, 0);
    kill(a, SIGTERM);
    runner_pid = 0;
    cr_assert_eq(t_wait(a), 0, "%s", t_read(t_at("err"), NULL));
    expect_results(nkeys);
}
