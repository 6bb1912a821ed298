/* ksource.c - a Kafka consumer group as the input of dedup and run.
 *
 * Offsets are never committed by librdkafka on its own
 * (enable.auto.commit and enable.auto.offset.store are off): they are
 * committed, synchronously, after the idem commit that covers the
 * messages (ack, ack_flush), by a thread of their own (committer), so
 * that the round trip to the group's coordinator overlaps the next
 * batch's commit instead of delaying it; each commit takes the newest
 * offsets acked, so commits that fall behind merge. The job's checkpoint is the
 * source of truth all the same: it keeps, committed with the records,
 * the next offset of every partition this job has committed messages of
 * (mark, pos: "TOPIC:PARTITION:OFFSET,..."), so a crash between the idem
 * commit and the offset commit repeats nothing. On an assignment each
 * partition starts at the later of the checkpoint's offset, as this run
 * has moved it since (done), and the group's committed one (both only
 * ever move after a commit; the later is the true one, whichever worker
 * made it). The run's own position matters when a partition comes back
 * after the group refused its offsets: an assignment lost (the group
 * moved to a generation without this member, as a loaded member's late
 * rejoin makes it) refuses the commits of the revoke too, and the
 * group's offset is then older than what this run did.
 *
 * Rebalances (cooperative-sticky by default, where partitions move one
 * at a time; eager protocols revoke everything): before partitions go,
 * the batch being committed is waited for (the settle hook of
 * stream.c), so its offsets are committed while they are still ours,
 * and the batch being read is taken back (ND_AGAIN: nothing of it was
 * claimed); the partitions kept are rewound to where the commits left
 * them, so nothing is skipped.
 *
 * A message is a line: its value, as it is (JSON for --key FIELD; any
 * bytes for --key @key, header:NAME, --line). Its key and headers go
 * beside it as the line's meta (connect.h), for the key and for a Kafka
 * sink that reproduces the message. A message with an empty value
 * (a tombstone, or a fence marker of a Kafka sink) is a blank line:
 * passed over, its offset committed. --idle-exit counts only while
 * partitions are assigned and every one has been read to its end; with
 * it, a cluster whose brokers are all gone for as long ends the run
 * with an error (brokers_gone). */
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kafka.h"

#define POLL_SLICE_MS 250
#define COMMIT_RETRY_MS 1000
/* A member that stops heartbeating leaves the group after this long:
 * 10 s (Kafka's default before 3.0) rather than librdkafka's 45 s, so
 * that a killed worker's partitions move on sooner, and a restart on a
 * mock cluster (which waits out the last member's session, docs/
 * streams.md) is not held for most of a minute. The heartbeat runs in
 * librdkafka's thread, whatever the handler does. */
#define SESSION_TIMEOUT_MS "10000"

typedef struct kpart {
    int topic;             /* index in u.topics, -1: not a topic of ours */
    char *name;            /* its topic's name when not ours */
    int32_t partition;
    int owned, eof;
    int64_t done;          /* next offset after the last line marked:
                            * the checkpoint's, -1: none */
    int64_t acked;         /* next offset after the last line acked */
    int64_t sent;          /* acked already committed */
    int64_t start;         /* where the assignment started, -1: unknown */
    int64_t resume;        /* where a rewind goes: done, else the first
                            * offset handed out since the assignment */
    int64_t end_at_assign; /* the partition's end when assigned: what a
                            * dead run may have read lies before it */
} kpart;

typedef struct held {
    rd_kafka_message_t *m;
    char *meta;
} held;

typedef struct k_source {
    source base;
    const char *cmd;
    kafka_uri u;
    rd_kafka_t *rk;
    int cooperative;
    source_opts o;
    pthread_mutex_t mu;    /* parts: the reader and the committer */
    pthread_mutex_t cmu;   /* one offset commit at a time */
    int64_t retry_at;      /* a failed commit is tried again then; 0:
                            * none failed (mu) */
    kpart *parts;
    size_t nparts;
    held *held;
    size_t nheld, capheld;
    int rewind;            /* a revoke took the batch being read back */
    int failed;            /* a rebalance could not be followed: s->err */
    int64_t last_new_ms;
    int64_t down_since;    /* librdkafka said all brokers are down then,
                            * and nothing came since; 0: not down (the
                            * reader's own, as the poll's events are) */
    pthread_t committer;   /* commits offsets acked (ack_flush) */
    pthread_cond_t wake;   /* committer: offsets acked, or quit (mu) */
    int has_committer, commit_asked, quit;
    char *posbuf;
    cli_buf meta;
    char err[1024];
    char worker[800];
} k_source;

static const source_ops k_source_ops;

/* The entry of (topic, partition), made if missing; NULL on ENOMEM. */
static kpart *part_of(k_source *s, const char *topic, int32_t partition)
{
    for (size_t i = 0; i < s->nparts; i++) {
        kpart *p = &s->parts[i];
        const char *t = p->topic >= 0 ? s->u.topics[p->topic] : p->name;
        if (p->partition == partition && !strcmp(t, topic))
            return p;
    }
    kpart *v = realloc(s->parts, (s->nparts + 1) * sizeof *v);
    if (!v)
        return NULL;
    s->parts = v;
    kpart *p = &v[s->nparts];
    *p = (kpart){.topic = -1, .partition = partition, .done = -1,
                 .acked = -1, .sent = -1, .resume = -1, .start = -1};
    for (size_t i = 0; i < s->u.ntopics; i++)
        if (!strcmp(s->u.topics[i], topic))
            p->topic = (int)i;
    if (p->topic < 0 && !(p->name = strdup(topic)))
        return NULL;
    s->nparts++;
    return p;
}

static const char *topic_name(const k_source *s, const kpart *p)
{
    return p->topic >= 0 ? s->u.topics[p->topic] : p->name;
}

/* A line's partition: its `end` holds the index into parts. */
static kpart *part_of_line(k_source *s, const nd_line *l)
{
    return l->end < s->nparts ? &s->parts[l->end] : NULL;
}

/* ---- committing offsets */

/* Commit the offsets acked and not yet committed of the partitions we
 * own (of those in `only` too, unless NULL), synchronously. Commits are
 * made one at a time (cmu), each of the newest offsets, so that they
 * never go back. A failure is said once, and the reader tries again
 * while idle (retry_commit), since the next batch, which would carry
 * the offsets, may be long in coming. 0 or -1. */
static int commit_offsets(k_source *s,
                          const rd_kafka_topic_partition_list_t *only)
{
    pthread_mutex_lock(&s->cmu);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nparts; i++) {
        kpart *p = &s->parts[i];
        const char *t = topic_name(s, p);
        if (p->owned && p->acked > p->sent &&
            (!only || rd_kafka_topic_partition_list_find(only, t,
                                                         p->partition)))
            rd_kafka_topic_partition_list_add(l, t, p->partition)->offset =
                p->acked;
    }
    pthread_mutex_unlock(&s->mu);
    rd_kafka_resp_err_t e =
        l->cnt ? rd_kafka_commit(s->rk, l, 0) : RD_KAFKA_RESP_ERR_NO_ERROR;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; !e && i < l->cnt; i++) {
        kpart *p = part_of(s, l->elems[i].topic, l->elems[i].partition);
        if (p && !l->elems[i].err)
            p->sent = l->elems[i].offset;
    }
    int first = e && !s->retry_at, left = 0;
    for (size_t i = 0; !e && i < s->nparts; i++)  /* left out by `only` */
        left |= s->parts[i].owned && s->parts[i].acked > s->parts[i].sent;
    s->retry_at = e ? cli_mono_ms() + COMMIT_RETRY_MS : left ? s->retry_at : 0;
    pthread_mutex_unlock(&s->mu);
    rd_kafka_topic_partition_list_destroy(l);
    pthread_mutex_unlock(&s->cmu);
    if (first)
        fprintf(stderr, "idem %s: %s: committing offsets: %s; the job's "
                "checkpoint keeps them, and they are committed again until "
                "the group takes them\n", s->cmd, s->u.display,
                rd_kafka_err2str(e));
    return e ? -1 : 0;
}

/* In the reader, while idle: a commit that failed, tried again. */
static void retry_commit(k_source *s)
{
    pthread_mutex_lock(&s->mu);
    int due = s->retry_at && cli_mono_ms() >= s->retry_at;
    pthread_mutex_unlock(&s->mu);
    if (due)
        commit_offsets(s, NULL);
}

/* The committer thread: each time offsets were acked, it commits the
 * newest ones (commit_offsets), until told to quit. */
static void *committer(void *arg)
{
    k_source *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->commit_asked && !s->quit)
            pthread_cond_wait(&s->wake, &s->mu);
        if (s->quit)
            break;
        s->commit_asked = 0;
        pthread_mutex_unlock(&s->mu);
        commit_offsets(s, NULL);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* The committer told to quit and joined: what it left is committed by
 * the caller. */
static void stop_committer(k_source *s)
{
    if (!s->has_committer)
        return;
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->committer, NULL);
    s->has_committer = 0;
}

/* ---- rebalances */

/* The group's committed offsets of l's partitions, asked again while
 * the broker fails (within timeout_ms). A worker must not start from
 * its own checkpoint for want of them: that may be older than the
 * group's (the partition was another worker's since), and it would read
 * and claim again what the other did. 0, or -1 with s->err set. */
static int committed(k_source *s, rd_kafka_topic_partition_list_t *l)
{
    int64_t until = cli_mono_ms() + s->u.timeout_ms;
    for (;;) {
        rd_kafka_resp_err_t e = rd_kafka_committed(s->rk, l,
                                                   (int)s->u.timeout_ms);
        for (int i = 0; !e && i < l->cnt; i++)
            e = l->elems[i].err;
        if (!e)
            return 0;
        if (cli_mono_ms() >= until) {
            snprintf(s->err, sizeof s->err, "%s: reading the group's "
                     "committed offsets: %s", s->u.display,
                     rd_kafka_err2str(e));
            return -1;
        }
        poll(NULL, 0, POLL_SLICE_MS);
    }
}

/* Each partition starts at the later of the checkpoint's offset (done:
 * as resumed, or moved by this run's commits since) and the group's
 * committed one (left as it is when neither is known: then
 * auto.offset.reset says, earliest by default). A group's offset behind
 * the checkpoint is committed anew (as acked, by the next commit or the
 * idle reader's retry), so that the next owner does not start from it.
 * When the committed offsets cannot be read, the run stops
 * (s->failed). */
static void start_offsets(k_source *s, rd_kafka_topic_partition_list_t *l)
{
    s->down_since = 0;  /* the group's coordinator answered */
    if (committed(s, l)) {
        s->failed = 1;
        return;
    }
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < l->cnt; i++) {
        rd_kafka_topic_partition_t *t = &l->elems[i];
        kpart *p = part_of(s, t->topic, t->partition);
        if (!p)
            continue;
        int64_t group = t->err || t->offset < 0 ? -1 : t->offset;
        int64_t off = p->done > group ? p->done : group;
        t->offset = off >= 0 ? off : RD_KAFKA_OFFSET_INVALID;
        int64_t lo, hi;
        p->end_at_assign = rd_kafka_query_watermark_offsets(
                               s->rk, t->topic, t->partition, &lo, &hi,
                               (int)s->u.timeout_ms) ? INT64_MAX : hi;
        p->owned = 1;
        p->eof = 0;
        p->resume = p->start = off;
        p->done = off;
        p->sent = group;
        p->acked = off > group ? off : -1;
        if (off > group && !s->retry_at)
            s->retry_at = cli_mono_ms();
    }
    pthread_mutex_unlock(&s->mu);
}

/* Before partitions go (to another worker, or as the run stops), the
 * batch being committed is waited for, and offsets that a commit of the
 * group failed to take are committed now: the next batch's commit,
 * which would carry them, comes too late for partitions no longer ours,
 * and their new owner would start from the stale ones. */
static void revoked(k_source *s, const rd_kafka_topic_partition_list_t *l)
{
    if (s->o.settle)
        s->o.settle(s->o.settle_ctx);
    if (commit_offsets(s, l))
        commit_offsets(s, l);  /* once more: it may have been a blip */
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < l->cnt; i++) {
        kpart *p = part_of(s, l->elems[i].topic, l->elems[i].partition);
        if (p)
            p->owned = 0;
    }
    pthread_mutex_unlock(&s->mu);
    s->rewind = 1;
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *l, void *opaque)
{
    k_source *s = opaque;
    s->cooperative = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        start_offsets(s, l);
        if (s->cooperative)
            rd_kafka_error_destroy(rd_kafka_incremental_assign(rk, l));
        else
            rd_kafka_assign(rk, l);
        return;
    }
    if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS)
        revoked(s, l);
    if (s->cooperative)
        rd_kafka_error_destroy(rd_kafka_incremental_unassign(rk, l));
    else
        rd_kafka_assign(rk, NULL);
}

/* After a revoke: the partitions kept go back to where their commits
 * left them (the lines read since are taken back). */
static void rewind_kept(k_source *s)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nparts; i++) {
        kpart *p = &s->parts[i];
        if (p->owned && p->resume >= 0)
            rd_kafka_topic_partition_list_add(l, topic_name(s, p),
                                              p->partition)->offset =
                p->resume;
        p->eof = 0;
    }
    pthread_mutex_unlock(&s->mu);
    if (l->cnt)
        rd_kafka_error_destroy(rd_kafka_seek_partitions(
            s->rk, l, (int)s->u.timeout_ms));
    rd_kafka_topic_partition_list_destroy(l);
    s->rewind = 0;
}

/* ---- opening */

static void k_close(source *base);

static int subscribe(k_source *s)
{
    rd_kafka_topic_partition_list_t *l =
        rd_kafka_topic_partition_list_new((int)s->u.ntopics);
    for (size_t i = 0; i < s->u.ntopics; i++)
        rd_kafka_topic_partition_list_add(l, s->u.topics[i],
                                          RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(s->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (!e)
        return 0;
    snprintf(s->err, sizeof s->err, "%s: subscribing: %s", s->u.display,
             rd_kafka_err2str(e));
    return -1;
}

/* librdkafka's errors of the client (its poll serves them, in the
 * reader): said as its log would say them, and the first "all brokers
 * down" of an outage noted (brokers_gone). librdkafka reconnects on its
 * own. */
static void on_error(rd_kafka_t *rk, int err, const char *reason,
                     void *opaque)
{
    k_source *s = opaque;
    if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN && !s->down_since)
        s->down_since = cli_mono_ms();
    kafka_say("ERROR", reason);
}

static int make_consumer(k_source *s)
{
    const char *base[] = {"group.id", s->u.group,
                          "client.id", s->u.consumer,
                          "enable.auto.commit", "false",
                          "enable.auto.offset.store", "false",
                          "enable.partition.eof", "true",
                          "auto.offset.reset", "earliest",
                          "session.timeout.ms", SESSION_TIMEOUT_MS,
                          "partition.assignment.strategy",
                          "cooperative-sticky", NULL};
    rd_kafka_conf_t *c = kafka_conf(s->cmd, &s->u, base);
    if (!c)
        return 1;
    rd_kafka_conf_set_rebalance_cb(c, on_rebalance);
    rd_kafka_conf_set_error_cb(c, on_error);
    rd_kafka_conf_set_opaque(c, s);
    if (!(s->rk = kafka_client(s->cmd, &s->u, RD_KAFKA_CONSUMER, c)))
        return 1;
    rd_kafka_poll_set_consumer(s->rk);
    if (!subscribe(s))
        return 0;
    return cli_fail(s->cmd, "%s", s->err);
}

source *kafka_source_open(const char *cmd, const char *uri,
                          const source_opts *o, int *status)
{
    k_source *s = calloc(1, sizeof *s);
    if (!s) {
        *status = cli_fail(cmd, "out of memory");
        return NULL;
    }
    s->base.ops = &k_source_ops;
    s->cmd = cmd;
    s->o = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->cmu, NULL);
    pthread_cond_init(&s->wake, NULL);
    s->last_new_ms = cli_mono_ms();
    if ((*status = kafka_uri_parse(cmd, uri, 0, &s->u)) == 0)
        *status = make_consumer(s);
    /* Without the thread, ack_flush commits in the caller's. */
    s->has_committer = !*status &&
                       pthread_create(&s->committer, NULL, committer, s) == 0;
    if (*status) {
        k_close(&s->base);
        return NULL;
    }
    snprintf(s->worker, sizeof s->worker, "%s?group=%s&consumer=%s",
             s->u.display, s->u.group, s->u.consumer);
    return &s->base;
}

static void drop_held(k_source *s)
{
    for (size_t i = 0; i < s->nheld; i++) {
        rd_kafka_message_destroy(s->held[i].m);
        free(s->held[i].meta);
    }
    s->nheld = 0;
}

/* As the run ends, offsets acked and not committed (a commit failed,
 * and no batch came since to carry them) are committed before the group
 * is left, polling meanwhile (messages polled are dropped) so that a
 * rebalance under way can end: the group takes no commit during one. */
static void last_commit(k_source *s)
{
    int64_t until = cli_mono_ms() + s->u.timeout_ms;
    while (commit_offsets(s, NULL) && cli_mono_ms() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(s->rk, POLL_SLICE_MS);
        if (m)
            rd_kafka_message_destroy(m);
    }
}

static void k_close(source *base)
{
    k_source *s = (k_source *)base;
    stop_committer(s);
    drop_held(s);
    free(s->held);
    if (s->rk) {
        last_commit(s);
        rd_kafka_consumer_close(s->rk);
        rd_kafka_destroy(s->rk);
    }
    for (size_t i = 0; i < s->nparts; i++)
        free(s->parts[i].name);
    free(s->parts);
    free(s->posbuf);
    cli_buf_free(&s->meta);
    kafka_uri_free(&s->u);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->wake);
    free(s);
}

/* ---- reading */

/* m's key and headers as meta, into a new string; 0 or -1. */
static int make_meta(k_source *s, const rd_kafka_message_t *m, char **out,
                     size_t *len)
{
    rd_kafka_headers_t *h = NULL;
    s->meta.len = 0;
    int rc = m->key ? meta_add(&s->meta, META_KEY, NULL, 0, m->key,
                               m->key_len) : 0;
    if (rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char *name;
        const void *v;
        size_t vn;
        for (size_t i = 0; !rc && !rd_kafka_header_get_all(h, i, &name, &v,
                                                          &vn); i++)
            rc = meta_add(&s->meta, META_HEADER, name, strlen(name), v, vn);
    }
    *out = NULL;
    *len = s->meta.len;
    if (rc || !s->meta.len)
        return rc;
    if (!(*out = malloc(s->meta.len)))
        return -1;
    memcpy(*out, s->meta.p, s->meta.len);
    return 0;
}

/* Hold m until release and make it l. 0 or -1 (out of memory). */
static int hand_out(k_source *s, rd_kafka_message_t *m, nd_line *l)
{
    if (s->nheld == s->capheld) {
        size_t cap = s->capheld ? 2 * s->capheld : 256;
        held *v = realloc(s->held, cap * sizeof *v);
        if (!v)
            return -1;
        s->held = v;
        s->capheld = cap;
    }
    char *meta;
    size_t mlen;
    pthread_mutex_lock(&s->mu);
    kpart *p = part_of(s, rd_kafka_topic_name(m->rkt), m->partition);
    if (p && p->resume < 0)
        p->resume = m->offset;
    if (p)
        p->eof = 0;
    size_t idx = p ? (size_t)(p - s->parts) : 0;
    pthread_mutex_unlock(&s->mu);
    if (!p || make_meta(s, m, &meta, &mlen))
        return -1;
    s->held[s->nheld++] = (held){m, meta};
    *l = (nd_line){.p = m->payload ? (const char *)m->payload : "",
                   .len = m->len, .lineno = (uint64_t)m->offset,
                   .end = idx, .meta = meta, .metalen = mlen};
    return 0;
}

/* An event instead of a message: the end of a partition, or an error.
 * 0 to go on, ND_ERR for a fatal one. */
static int event(k_source *s, const rd_kafka_message_t *m)
{
    if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        pthread_mutex_lock(&s->mu);
        kpart *p = part_of(s, rd_kafka_topic_name(m->rkt), m->partition);
        if (p)
            p->eof = 1;
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    char fatal[256];
    int is_fatal = m->err == RD_KAFKA_RESP_ERR__FATAL &&
                   rd_kafka_fatal_error(s->rk, fatal, sizeof fatal);
    if (!is_fatal && m->err != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART &&
        m->err != RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
        return 0;  /* librdkafka retries the others itself */
    snprintf(s->err, sizeof s->err, "%s: %s", s->u.display,
             is_fatal ? fatal : rd_kafka_message_errstr(m));
    return ND_ERR;
}

/* The partitions we own, each with librdkafka's fetch position (the
 * next offset it hands out; unset, below 0, until it has handed out one
 * since the assignment). NULL when librdkafka cannot tell. */
static rd_kafka_topic_partition_list_t *positions(k_source *s)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(4);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nparts; i++)
        if (s->parts[i].owned)
            rd_kafka_topic_partition_list_add(l, topic_name(s, &s->parts[i]),
                                              s->parts[i].partition);
    pthread_mutex_unlock(&s->mu);
    if (rd_kafka_position(s->rk, l) == RD_KAFKA_RESP_ERR_NO_ERROR)
        return l;
    rd_kafka_topic_partition_list_destroy(l);
    return NULL;
}

/* Every partition marked at its end really there: librdkafka's fetch
 * position at the partition's last known end. An end of partition is
 * reported now and then before the end (librdkafka's mock does it on
 * long partitions), which must not end a run by --idle-exit. */
static int really_at_end(k_source *s)
{
    rd_kafka_topic_partition_list_t *l = positions(s);
    int at_end = l != NULL;
    for (int i = 0; at_end && i < l->cnt; i++) {
        int64_t lo, hi;
        rd_kafka_topic_partition_t *t = &l->elems[i];
        /* Nothing consumed since the assignment (no position), or the
         * end not known: the end reported stands. */
        at_end = t->offset < 0 ||
                 rd_kafka_get_watermark_offsets(s->rk, t->topic,
                                                t->partition, &lo, &hi) ||
                 t->offset >= hi;
    }
    if (l)
        rd_kafka_topic_partition_list_destroy(l);
    return at_end;
}

/* Assigned, and every partition read to its end? */
static int caught_up(k_source *s)
{
    int any = 0, all = 1;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nparts; i++)
        if (s->parts[i].owned) {
            any = 1;
            all &= s->parts[i].eof;
        }
    pthread_mutex_unlock(&s->mu);
    return any && all && really_at_end(s);
}

/* With --idle-exit, a cluster none of whose brokers has answered for
 * that long (and timeout_ms at least) ends the run with an error that
 * names the bootstrap servers, rather than polling for ever: the idle
 * clock counts only while partitions are assigned, and a member whose
 * brokers are gone loses its session and its partitions. librdkafka
 * says when all brokers go down, not when one comes back, so a
 * metadata request asks once more before giving up; an answer ends
 * the outage, as a message or an assignment does. Without --idle-exit
 * a run rides an outage out (a service's brokers come back). 1 when
 * gone (s->err says so). */
static int brokers_gone(k_source *s)
{
    int64_t bound = s->o.idle_exit_ms > s->u.timeout_ms ? s->o.idle_exit_ms
                                                        : s->u.timeout_ms;
    if (!s->o.idle_exit_ms || !s->down_since ||
        cli_mono_ms() - s->down_since < bound)
        return 0;
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t e = rd_kafka_metadata(s->rk, 0, NULL, &md,
                                              4 * POLL_SLICE_MS);
    if (md)
        rd_kafka_metadata_destroy(md);
    if (!e) {
        s->down_since = 0;
        return 0;
    }
    snprintf(s->err, sizeof s->err, "%s: no broker of the cluster has "
             "answered for %" PRId64 " s (%s; then %s): stopping, as "
             "--idle-exit asks for an end", s->u.display,
             (cli_mono_ms() - s->down_since) / 1000,
             rd_kafka_err2str(RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN),
             rd_kafka_err2str(e));
    return 1;
}

static int k_next(source *base, nd_line *l, int wait)
{
    k_source *s = (k_source *)base;
    for (;;) {
        if (s->failed)
            return ND_ERR;
        if (s->rewind) {
            rewind_kept(s);
            return ND_AGAIN;
        }
        if (*s->o.stop)
            return ND_IDLE;
        rd_kafka_message_t *m =
            rd_kafka_consumer_poll(s->rk, wait ? POLL_SLICE_MS : 0);
        if (s->failed) {  /* in a rebalance, during the poll */
            if (m)
                rd_kafka_message_destroy(m);
            return ND_ERR;
        }
        if (m && (!m->err || m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF))
            s->down_since = 0;
        if (m && !m->err) {
            s->last_new_ms = cli_mono_ms();
            if (hand_out(s, m, l) == 0)
                return ND_LINE;
            rd_kafka_message_destroy(m);
            snprintf(s->err, sizeof s->err, "out of memory");
            return ND_ERR;
        }
        int rc = m ? event(s, m) : 0;
        if (m)
            rd_kafka_message_destroy(m);
        if (rc)
            return rc;
        if (s->rewind)
            continue;
        if (!m)
            retry_commit(s);
        if (!m && brokers_gone(s))
            return ND_ERR;
        if (!caught_up(s))  /* the idle clock runs only when caught up */
            s->last_new_ms = cli_mono_ms();
        else if (s->o.idle_exit_ms &&
                 cli_mono_ms() - s->last_new_ms >= s->o.idle_exit_ms)
            return ND_END;
        if (!wait && !m)
            return ND_IDLE;
    }
}

/* Messages of our partitions not handed out yet: each one's end (its
 * high watermark, as the last fetch saw it) less where reading stands
 * (the fetch position, else where the assignment started). The
 * partitions whose end or start is not known yet are left out; -1
 * while none is known. Asked after each batch read. */
static long long k_lag(source *base)
{
    k_source *s = (k_source *)base;
    rd_kafka_topic_partition_list_t *l = positions(s);
    long long lag = -1;
    for (int i = 0; l && i < l->cnt; i++) {
        rd_kafka_topic_partition_t *t = &l->elems[i];
        int64_t lo, hi, at = t->offset;
        if (at < 0) {
            pthread_mutex_lock(&s->mu);
            kpart *p = part_of(s, t->topic, t->partition);
            at = p ? p->start : -1;
            pthread_mutex_unlock(&s->mu);
        }
        if (at < 0 || rd_kafka_get_watermark_offsets(s->rk, t->topic,
                                                     t->partition, &lo, &hi) ||
            hi < 0)
            continue;
        lag = (lag < 0 ? 0 : lag) + (hi > at ? hi - at : 0);
    }
    if (l)
        rd_kafka_topic_partition_list_destroy(l);
    return lag;
}

static void k_release(source *base)
{
    drop_held((k_source *)base);
}

static int k_wait(source *base)
{
    return *((k_source *)base)->o.stop != 0;
}

static const char *k_err(const source *base)
{
    return ((const k_source *)base)->err;
}

static void k_where(const source *base, const nd_line *l, char *buf,
                    size_t n)
{
    const k_source *s = (const k_source *)base;
    const kpart *p = l->end < s->nparts ? &s->parts[l->end] : NULL;
    snprintf(buf, n, "%s partition %" PRId32 " offset %" PRIu64,
             p ? topic_name(s, p) : "?", p ? p->partition : -1, l->lineno);
}

static const char *k_worker(const source *base)
{
    return ((const k_source *)base)->worker;
}

/* ---- positions and offsets */

static void k_mark(source *base, const nd_line *l)
{
    k_source *s = (k_source *)base;
    pthread_mutex_lock(&s->mu);
    kpart *p = part_of_line(s, l);
    if (p && (int64_t)l->lineno + 1 > p->done)
        p->done = p->resume = (int64_t)l->lineno + 1;
    pthread_mutex_unlock(&s->mu);
}

static const char *k_pos(source *base)
{
    k_source *s = (k_source *)base;
    cli_buf b = {0};
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; !rc && i < s->nparts; i++) {
        const kpart *p = &s->parts[i];
        if (p->done >= 0)
            rc = cli_buf_fmt(&b, "%s%s:%" PRId32 ":%" PRId64,
                             b.len ? "," : "", topic_name(s, p),
                             p->partition, p->done);
    }
    pthread_mutex_unlock(&s->mu);
    free(s->posbuf);
    s->posbuf = NULL;
    if (rc || cli_buf_add(&b, "", 1)) {
        cli_buf_free(&b);
        return "";  /* none kept: the group's offsets are resumed */
    }
    s->posbuf = b.p;
    return s->posbuf;
}

static int k_resume(source *base, const char *pos)
{
    k_source *s = (k_source *)base;
    const char *p = pos;
    while (*p) {
        size_t n = strcspn(p, ",");
        char topic[256];
        int32_t part;
        int64_t off;
        int used = 0;
        if (n >= 300 || sscanf(p, "%255[^:]:%" SCNd32 ":%" SCNd64 "%n",
                               topic, &part, &off, &used) != 3 ||
            (size_t)used != n) {
            snprintf(s->err, sizeof s->err, "the checkpoint's source "
                     "position is not one idem wrote: %.200s", pos);
            return -1;
        }
        kpart *k = part_of(s, topic, part);
        if (!k) {
            snprintf(s->err, sizeof s->err, "out of memory");
            return -1;
        }
        k->done = off;
        p += n + (p[n] == ',');
    }
    return 0;
}

static int k_ack(source *base, const nd_line *l)
{
    k_source *s = (k_source *)base;
    pthread_mutex_lock(&s->mu);
    kpart *p = part_of_line(s, l);
    if (p && (int64_t)l->lineno + 1 > p->acked)
        p->acked = (int64_t)l->lineno + 1;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* The offsets acked go to the committer: the committing thread goes on
 * to the next batch (the checkpoint holds them meanwhile). */
static int k_ack_flush(source *base)
{
    k_source *s = (k_source *)base;
    if (!s->has_committer)
        return commit_offsets(s, NULL);
    pthread_mutex_lock(&s->mu);
    s->commit_asked = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Is any partition of ours short of its end at the assignment? Before
 * it, a dead run may have handed out messages and written their output. */
static int k_in_doubt(source *base)
{
    k_source *s = (k_source *)base;
    int doubt = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->nparts; i++) {
        const kpart *p = &s->parts[i];
        doubt |= p->owned && p->done < p->end_at_assign;
    }
    pthread_mutex_unlock(&s->mu);
    return doubt;
}

static const source_ops k_source_ops = {
    .next = k_next, .release = k_release, .wait = k_wait, .err = k_err,
    .where = k_where, .ack = k_ack, .ack_flush = k_ack_flush, .lag = k_lag,
    .worker = k_worker, .close = k_close, .mark = k_mark, .pos = k_pos,
    .resume = k_resume, .no_pending = 1, .in_doubt = k_in_doubt};
