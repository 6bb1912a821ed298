/* bench/kafka_alo.c - the at-least-once reference of the Kafka benchmark.
 *
 * usage: kafka_alo BROKERS IN OUT GROUP BATCH IDLE_MS
 *        kafka_alo --load BROKERS TOPIC < LINES
 *
 * What a consumer without idempotency does: a consumer group with
 * auto-commit off reads up to BATCH messages, produces each to OUT with
 * the same value, key and headers (an idempotent producer, acks=all, as
 * idem's sink), waits for every delivery report, then commits the
 * offsets synchronously; again until every partition was read to its end
 * and nothing new came for IDLE_MS. Duplicates are copied like the rest.
 * Prints the messages copied. bench/kafka.sh runs it beside idem, and
 * loads the input with --load: each line of standard input a message,
 * every delivery awaited. */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int failed;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m,
                        void *opaque)
{
    failed |= m->err != 0;
}

static rd_kafka_t *client(rd_kafka_type_t t, const char *brokers,
                          const char *const *props)
{
    char err[256];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    if (t == RD_KAFKA_PRODUCER)
        rd_kafka_conf_set_dr_msg_cb(c, on_delivery);
    rd_kafka_conf_set(c, "bootstrap.servers", brokers, NULL, 0);
    for (size_t i = 0; props[i]; i += 2)
        if (rd_kafka_conf_set(c, props[i], props[i + 1], err, sizeof err)) {
            fprintf(stderr, "kafka_alo: %s\n", err);
            exit(1);
        }
    rd_kafka_t *rk = rd_kafka_new(t, c, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "kafka_alo: %s\n", err);
        exit(1);
    }
    return rk;
}

/* m copied to out (a topic handle made once, as idem's sink has: naming
 * the topic per message would cost the reference a lookup each); 0 or
 * -1. */
static int copy(rd_kafka_t *p, rd_kafka_topic_t *out, rd_kafka_message_t *m)
{
    rd_kafka_headers_t *h = NULL, *copyh = NULL;
    if (rd_kafka_message_headers(m, &h) == 0)
        copyh = rd_kafka_headers_copy(h);
    for (;;) {
        rd_kafka_resp_err_t e = rd_kafka_producev(
            p, RD_KAFKA_V_RKT(out), RD_KAFKA_V_VALUE(m->payload, m->len),
            RD_KAFKA_V_KEY(m->key, m->key_len),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
            RD_KAFKA_V_HEADERS(copyh), RD_KAFKA_V_END);
        if (!e)
            return 0;
        if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
            return -1;
        rd_kafka_poll(p, 10);
    }
}

/* --load: stdin's lines into topic; 0, or 1 if one was not delivered.
 * Each line goes to a partition of its own drawing (no sticky
 * partitioning, which fills one partition at a time): the partitions
 * get about as many each, and none more than the mock keeps. */
static int load(const char *brokers, const char *topic)
{
    const char *props[] = {"linger.ms", "20", "sticky.partitioning.linger.ms",
                           "0", NULL};
    rd_kafka_t *p = client(RD_KAFKA_PRODUCER, brokers, props);
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        size_t n = strcspn(line, "\n");
        while (rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic),
                                 RD_KAFKA_V_VALUE(line, n),
                                 RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                 RD_KAFKA_V_END) ==
               RD_KAFKA_RESP_ERR__QUEUE_FULL)
            rd_kafka_poll(p, 10);
        rd_kafka_poll(p, 0);
    }
    rd_kafka_flush(p, 120000);
    int bad = failed || rd_kafka_outq_len(p);
    rd_kafka_destroy(p);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--load"))
        return load(argv[2], argv[3]);
    if (argc != 7) {
        fprintf(stderr, "usage: kafka_alo BROKERS IN OUT GROUP BATCH "
                "IDLE_MS\n");
        return 2;
    }
    const char *brokers = argv[1], *in = argv[2], *out = argv[3];
    long batch = strtol(argv[5], NULL, 10);
    long long idle = strtoll(argv[6], NULL, 10);
    const char *cprops[] = {"group.id", argv[4], "enable.auto.commit",
                            "false", "enable.auto.offset.store", "false",
                            "enable.partition.eof", "true",
                            "auto.offset.reset", "earliest", NULL};
    const char *pprops[] = {"enable.idempotence", "true", "acks", "all",
                            "linger.ms", "5", NULL};
    rd_kafka_t *c = client(RD_KAFKA_CONSUMER, brokers, cprops);
    rd_kafka_t *p = client(RD_KAFKA_PRODUCER, brokers, pprops);
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(p, out, NULL);
    rd_kafka_poll_set_consumer(c);
    rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, in, RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(c, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    long long copied = 0, last = now_ms();
    int eofs = 0, nparts = -1;
    static char at_end[1024];  /* per partition: read to its end */
    while (!(nparts > 0 && eofs >= nparts && now_ms() - last >= idle)) {
        long n = 0;
        rd_kafka_topic_partition_list_t *offs =
            rd_kafka_topic_partition_list_new(8);
        while (n < batch) {
            rd_kafka_message_t *m = rd_kafka_consumer_poll(c, n ? 0 : 100);
            if (!m)
                break;
            int pt = m->partition >= 0 && m->partition < 1024 ? m->partition
                                                            : 0;
            if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                eofs += !at_end[pt];
                at_end[pt] = 1;
            } else if (!m->err) {
                eofs -= at_end[pt];
                at_end[pt] = 0;
                if (copy(p, rkt, m))
                    return fprintf(stderr, "kafka_alo: produce failed\n"), 1;
                const char *t = rd_kafka_topic_name(m->rkt);
                rd_kafka_topic_partition_t *o =
                    rd_kafka_topic_partition_list_find(offs, t,
                                                       m->partition);
                if (!o)
                    o = rd_kafka_topic_partition_list_add(offs, t,
                                                          m->partition);
                o->offset = m->offset + 1;
                n++;
                last = now_ms();
            }
            rd_kafka_message_destroy(m);
        }
        if (nparts < 0) {
            rd_kafka_topic_partition_list_t *a = NULL;
            if (rd_kafka_assignment(c, &a) == 0 && a->cnt)
                nparts = a->cnt;
            if (a)
                rd_kafka_topic_partition_list_destroy(a);
        }
        if (n) {
            rd_kafka_flush(p, 60000);
            if (failed || rd_kafka_outq_len(p))
                return fprintf(stderr, "kafka_alo: delivery failed\n"), 1;
            if (rd_kafka_commit(c, offs, 0))
                return fprintf(stderr, "kafka_alo: commit failed\n"), 1;
            copied += n;
        }
        rd_kafka_topic_partition_list_destroy(offs);
    }
    printf("%lld\n", copied);
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(p);
    return 0;
}
