/* nsource.c - a JetStream durable pull consumer as the input of dedup and
 * run.
 *
 * The consumer is made if missing: explicit acks, AckWait longer than the
 * lease (ack_wait_ms=, else twice the lease) and MaxAckPending of four
 * batches (one whose store sync is in flight, its acks owed: stream.c's
 * sync_overlaps; one committing, one being read, one fetched ahead:
 * with three, the reader waited for the owed acks every other batch,
 * and the worker, finding no batch ready, waited out the sync); one found
 * must ack explicitly and filter what subject= asks. Messages
 * are fetched up to a batch at a time; each is handed out as its data,
 * one line, with its headers beside it (nd_line.meta, connect.h)
 * and its stream sequence as its position.
 *
 * A message is acknowledged only after the commit that covers it, by the
 * committing thread (ns_ack; libnats's flusher sends them without a
 * round trip per batch, ns_ack_flush). Until then it is
 * held, and a timer thread of the source sends +WPI (in progress) for
 * every message held each AckWait/3, so that a slow handler, or a key
 * another worker holds BUSY, does not get the message redelivered to
 * another worker mid-flight. The runner renews its claims every lease/3
 * on its own; the source keeps to the same rhythm with its own clock,
 * which needs no hook into the runner: what it must keep alive is simply
 * what it handed out and was not told is committed.
 *
 * A message a killed run held comes back only once AckWait has passed
 * (JetStream has no "my own pending list" to read first, as a Redis
 * consumer group has). So that it still comes before newer messages, and
 * each key's first message stays first, a run that finds messages
 * pending on the consumer when it starts waits AckWait (and RESUME_SLACK_MS
 * for the server's timer) before its first fetch: the server hands
 * redeliveries out before new messages. But it hands them out in the
 * order their AckWait ran out, not the stream's: a message the dead run
 * had fetched and not yet handed out got no +WPI, so it expired before
 * older ones that did. So the run gathers before it hands out anything
 * (gather): its pulls (no_wait) take everything the consumer had pending
 * and a batch more, over as many pulls as that takes (one takes at most
 * FETCH_MAX), and late answers to pulls that gave up (a stalled server)
 * too, until every message pending at the start has come back or none
 * is left to come (an answer without them, and none pending on the
 * consumer beside those gathered, or one AckWait more: a server late
 * with its redelivery timer); then the lot is put in stream
 * order (in_stream_order), as every later fetch is: redelivered
 * messages are all older than any never delivered. A run that stops
 * cleanly NAKs what it holds uncommitted, which the server redelivers
 * at once. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "nconn.h"
#include "nstream.h"

#define FETCH_SLICE_MS 250
#define FETCH_MAX 4096
#define RESUME_SLACK_MS 250

/* One message handed out: held until acknowledged. */
typedef struct held {
    natsMsg *m;
    char *hdr;
    size_t hdrlen;
} held;

typedef struct ns_source {
    source base;
    const char *cmd;
    nats_uri u;
    nats_link l;
    natsSubscription *sub;
    uint64_t batch;
    int64_t ack_wait_ms, idle_exit_ms, last_new_ms, start_after_ms;
    int64_t resume;           /* a dead run's messages still to come
                               * back while gathering (gather); 0 once
                               * the gathered ones may be handed out */
    int64_t gather_wpi_ms;    /* the last +WPI of the gathered ones */
    int64_t gather_until_ms;  /* 0, or when to stop waiting for a dead
                               * run's messages the server is late with */
    volatile const sig_atomic_t *stop;
    natsMsg **got;            /* fetched: got[next_got..ngot) not handed
                               * out yet (NULL: handed out) */
    int ngot, gotcap, next_got;
    uint64_t late;            /* messages fetched one at a time
                               * (fetch_size) */
    int late_fetch;           /* this fetch is one of those */
    /* Held messages by handout number: hv[i - hbase]; NULL once acked. */
    pthread_mutex_t mu;
    held *hv;
    size_t hn, hcap;
    uint64_t hbase;
    size_t acked_front;
    /* The +WPI timer. */
    pthread_t timer;
    pthread_cond_t cv;
    int timer_on, quit;
    char err[1500];
    char worker[600];
} ns_source;

static const source_ops ns_source_ops;

int ns_is_uri(const char *uri)
{
    return nu_is_uri(uri);
}

static int failed(ns_source *s, const char *what, natsStatus st)
{
    snprintf(s->err, sizeof s->err, "%.400s: %.100s: %.900s", s->u.display,
             what, nl_why(st));
    return ND_ERR;
}

/* Every held message is in progress: the server restarts its AckWait. */
static void *wpi_timer(void *arg)
{
    ns_source *s = arg;
    int64_t period = s->ack_wait_ms / 3 > 0 ? s->ack_wait_ms / 3 : 1;
    pthread_mutex_lock(&s->mu);
    while (!s->quit) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += period / 1000;
        ts.tv_nsec += (period % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        for (size_t i = 0; !s->quit && i < s->hn; i++)
            if (s->hv[i].m)
                natsMsg_InProgress(s->hv[i].m, NULL);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* A consumer found (made by another program, or by hand) must ack
 * explicitly, one message at a time: with AckNone a message counts as
 * acknowledged once delivered, and with AckAll the ack of a committed
 * message acknowledges the uncommitted ones before it; a kill loses
 * them. Its filter must be the one asked for (subject=), which it
 * would otherwise silently replace. A MaxDeliver is said: the server
 * drops a message delivered that often (kills, restarts) unseen by
 * idem. 0, or 1 with s->err set. */
static int unfit(ns_source *s, const jsConsumerConfig *c)
{
    const char *want = s->u.subject ? s->u.subject : "";
    const char *has = c->FilterSubject ? c->FilterSubject : "";
    if (c->AckPolicy != js_AckExplicit)
        snprintf(s->err, sizeof s->err, "%.400s: the durable consumer "
                 "%.200s does not acknowledge each message explicitly "
                 "(AckPolicy explicit): a kill would lose what it held",
                 s->u.display, s->u.durable);
    else if (s->u.subject && strcmp(want, has))
        snprintf(s->err, sizeof s->err, "%.400s: the durable consumer "
                 "%.200s filters subject '%.200s', not '%.200s'",
                 s->u.display, s->u.durable, has, want);
    else if (c->MaxDeliver > 0)
        fprintf(stderr, "idem %s: %s: the durable consumer %s has "
                "MaxDeliver %" PRId64 ": the server drops a message "
                "delivered that often (after kills or restarts), unseen "
                "by idem\n", s->cmd, s->u.display, s->u.durable,
                c->MaxDeliver);
    return c->AckPolicy != js_AckExplicit ||
           (s->u.subject && strcmp(want, has));
}

/* The consumer: made when missing; its AckWait sets the timer's pace,
 * and messages pending on it (a dead run's) delay the first fetch. */
static int bind_consumer(ns_source *s, int64_t lease_ms)
{
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    natsStatus st = js_GetConsumerInfo(&ci, s->l.js, s->u.name, s->u.durable,
                                       NULL, &jerr);
    if (st == NATS_NOT_FOUND) {
        jsConsumerConfig cc;
        jsConsumerConfig_Init(&cc);
        cc.Durable = s->u.durable;
        cc.AckPolicy = js_AckExplicit;
        cc.AckWait = (s->u.ack_wait_ms ? s->u.ack_wait_ms : 2 * lease_ms) *
                     1000000;
        cc.MaxAckPending = (int64_t)(4 * s->batch);
        cc.FilterSubject = s->u.subject;
        st = js_AddConsumer(&ci, s->l.js, s->u.name, &cc, NULL, &jerr);
    }
    if (st)
        return failed(s, "the durable consumer", st);
    if (unfit(s, ci->Config)) {
        jsConsumerInfo_Destroy(ci);
        return ND_ERR;
    }
    s->ack_wait_ms = ci->Config->AckWait / 1000000;
    if (ci->NumAckPending > 0) {  /* --idle-exit counts from then too */
        s->start_after_ms = s->last_new_ms =
            cli_mono_ms() + s->ack_wait_ms + RESUME_SLACK_MS;
        s->resume = ci->NumAckPending;
    }
    jsConsumerInfo_Destroy(ci);
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = s->u.name;
    so.Consumer = s->u.durable;
    st = js_PullSubscribe(&s->sub, s->l.js, NULL, s->u.durable, NULL, &so,
                          &jerr);
    return st ? failed(s, "subscribing to the durable consumer", st) : 0;
}

static void ns_close(source *base);

source *ns_source_open(const char *cmd, const char *uri,
                       const source_opts *o, int *status)
{
    ns_source *s = calloc(1, sizeof *s);
    if (!s) {
        *status = cli_fail(cmd, "out of memory");
        return NULL;
    }
    s->cmd = cmd;
    s->base.ops = &ns_source_ops;
    s->batch = o->batch;
    s->idle_exit_ms = o->idle_exit_ms;
    s->stop = o->stop;
    s->last_new_ms = cli_mono_ms();
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if ((*status = nu_parse(cmd, uri, 0, &s->u)) != 0 ||
        (*status = nl_open(cmd, &s->u, &s->l, NULL, NULL)) != 0) {
        ns_close(&s->base);
        return NULL;
    }
    nu_ident(&s->u, 1, s->worker, sizeof s->worker);
    if (bind_consumer(s, o->lease_ms)) {
        *status = cli_fail(cmd, "%s", s->err);
        ns_close(&s->base);
        return NULL;
    }
    s->timer_on = pthread_create(&s->timer, NULL, wpi_timer, s) == 0;
    return &s->base;
}

/* Messages held and not committed go back to the server at once (NAK):
 * a clean stop leaves nothing waiting out AckWait. */
static void ns_close(source *base)
{
    ns_source *s = (ns_source *)base;
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->timer_on)
        pthread_join(s->timer, NULL);
    for (size_t i = 0; i < s->hn; i++) {
        if (s->hv[i].m && s->l.nc)
            natsMsg_Nak(s->hv[i].m, NULL);
        natsMsg_Destroy(s->hv[i].m);
        free(s->hv[i].hdr);
    }
    for (int i = s->next_got; i < s->ngot; i++) {
        if (s->got[i] && s->l.nc)
            natsMsg_Nak(s->got[i], NULL);
        natsMsg_Destroy(s->got[i]);
    }
    free(s->got);
    if (s->late)  /* a loaded client or server: said, as a hint */
        fprintf(stderr, "idem %s: %s: %" PRIu64 " message%s fetched one "
                "at a time: answers to earlier pulls came after those had "
                "stopped waiting (fetch_size)\n", s->cmd, s->u.display,
                s->late, s->late == 1 ? " was" : "s were");
    if (s->l.nc)
        natsConnection_FlushTimeout(s->l.nc, s->u.timeout_ms);
    natsSubscription_Destroy(s->sub);
    nl_close(&s->l);
    nu_free(&s->u);
    free(s->hv);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* Lines point into held messages, which live until acknowledged. */
static void ns_release(source *base)
{
    (void)base;
}

static const char *ns_worker(const source *base)
{
    return ((const ns_source *)base)->worker;
}

static const char *ns_err(const source *base)
{
    return ((const ns_source *)base)->err;
}

static void ns_where(const source *base, const nd_line *l, char *buf,
                     size_t n)
{
    const ns_source *s = (const ns_source *)base;
    snprintf(buf, n, "%s message %" PRIu64, s->u.display, l->lineno);
}

/* m's headers as pairs NAME\0VALUE\0, into a new buffer (NULL: none). */
static char *headers(natsMsg *m, size_t *len)
{
    const char **keys = NULL;
    int nk = 0;
    cli_buf b = {0};
    *len = 0;
    if (natsMsgHeader_Keys(m, &keys, &nk) != NATS_OK)
        return NULL;
    int rc = 0;
    for (int i = 0; !rc && i < nk; i++) {
        const char **vals = NULL;
        int nv = 0;
        if (natsMsgHeader_Values(m, keys[i], &vals, &nv) != NATS_OK)
            continue;
        for (int j = 0; !rc && j < nv; j++)
            rc = meta_add(&b, META_HEADER, keys[i], strlen(keys[i]),
                          vals[j], strlen(vals[j]));
        free((void *)vals);
    }
    free((void *)keys);
    if (rc) {
        cli_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

/* Hold m (its handout number: the line's end) and make its line. 0 or
 * -1. */
static int hand_out(ns_source *s, natsMsg *m, nd_line *l)
{
    jsMsgMetaData *md = NULL;
    if (natsMsg_GetMetaData(&md, m) != NATS_OK)
        return -1;
    held h = {m, NULL, 0};
    h.hdr = headers(m, &h.hdrlen);
    pthread_mutex_lock(&s->mu);
    if (s->hn == s->hcap) {
        size_t cap = s->hcap ? 2 * s->hcap : 1024;
        held *v = realloc(s->hv, cap * sizeof *v);
        if (v) {
            s->hv = v;
            s->hcap = cap;
        }
    }
    int ok = s->hn < s->hcap;
    uint64_t no = s->hbase + s->hn;
    if (ok)
        s->hv[s->hn++] = h;
    pthread_mutex_unlock(&s->mu);
    *l = (nd_line){.p = natsMsg_GetData(m),
                   .len = (size_t)natsMsg_GetDataLength(m),
                   .lineno = md->Sequence.Stream, .end = no,
                   .again = md->NumDelivered > 1, .meta = h.hdr,
                   .since = (uint64_t)(md->Timestamp / 1000000),
                   .metalen = h.hdrlen};
    jsMsgMetaData_Destroy(md);
    if (!ok)
        free(h.hdr);
    return ok ? 0 : -1;
}

/* The front of the held list loses its acknowledged messages once they
 * are half of it, so that the list stays the size of what is in hand.
 * acked_front counts the acknowledged ones at the front, so that each
 * ack looks only past them. Under mu. */
static void compact(ns_source *s)
{
    size_t k = s->acked_front;
    while (k < s->hn && !s->hv[k].m)
        k++;
    s->acked_front = k;
    if (k < 1024 || 2 * k < s->hn)
        return;
    memmove(s->hv, s->hv + k, (s->hn - k) * sizeof *s->hv);
    s->hn -= k;
    s->hbase += k;
    s->acked_front = 0;
}

static int ns_ack(source *base, const nd_line *l)
{
    ns_source *s = (ns_source *)base;
    pthread_mutex_lock(&s->mu);
    held *h = l->end >= s->hbase && l->end - s->hbase < s->hn
                  ? &s->hv[l->end - s->hbase] : NULL;
    if (h && h->m) {
        /* A lost ack is a redelivery, a duplicate; a lost connection is
         * said by the flush. */
        (void)natsMsg_Ack(h->m, NULL);
        natsMsg_Destroy(h->m);
        free(h->hdr);
        *h = (held){0};
    }
    compact(s);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* The acks are on their way: libnats's flusher thread writes what is
 * buffered at once. Waiting here for the server to answer a PING behind
 * them would hold the next commit for a round trip through the server's
 * store, once per batch, for nothing: an ack lost after all is a
 * committed message redelivered, a duplicate the store finds. A
 * connection known lost is said; close flushes and waits. */
static int ns_ack_flush(source *base)
{
    ns_source *s = (ns_source *)base;
    if (natsConnection_Status(s->l.nc) == NATS_CONN_STATUS_CONNECTED)
        return 0;
    fprintf(stderr, "idem %s: %s: acknowledging: not connected; the "
            "messages may come again after AckWait, as duplicates\n",
            s->cmd, s->u.display);
    return -1;
}

/* How many one fetch asks for, and why one.
 *
 * libnats before 3.10 (nats.c #749) has a fetch that first takes the
 * messages already waiting in the subscription, asks the server for the
 * rest, and then keeps on until it has as many as that rest: with more
 * than half a batch waiting it never has, and writes past the end of its
 * list (the heap aborts of issue #14). Messages wait there only when they
 * answer a pull that libnats had stopped waiting for: a pull that expired
 * on the client's clock a moment before the server's, on a loaded
 * machine, or one a stalled server answers late.
 *
 * So the invariant kept here: a pull that can expire asks for one
 * message. A fetch that waits (the batch is empty) is such a pull; one
 * that does not wait (filling the batch) asks with no_wait, which the
 * server answers at once, and asks for the whole rest. A pull that
 * expired thus leaves at most one late message, and a fetch asks for
 * one, which libnats takes from those waiting before it asks the server,
 * while any wait. Left open: a server that stalls in the middle of a
 * no_wait pull, whose answer then comes after the fetch gave up on it,
 * and lands in the microseconds between this look and libnats's own.
 * libnats 3.10 has no such window. */
static int fetch_size(ns_source *s, int wait)
{
    int waiting = 0;
    if (natsSubscription_GetPending(s->sub, &waiting, NULL) == NATS_OK &&
        waiting > 0) {
        s->late_fetch = 1;
        return 1;
    }
    s->late_fetch = 0;
    if (wait)
        return 1;
    int64_t want = s->resume + (int64_t)s->batch;
    return (int)(want < FETCH_MAX ? want : FETCH_MAX);
}

typedef struct seq_msg {
    uint64_t seq;
    natsMsg *m;
} seq_msg;

static int by_seq(const void *a, const void *b)
{
    uint64_t x = ((const seq_msg *)a)->seq, y = ((const seq_msg *)b)->seq;
    return (x > y) - (x < y);
}

/* The stream sequence of a message fetched, 0 when it has none. */
static uint64_t stream_seq(natsMsg *m)
{
    jsMsgMetaData *md = NULL;
    if (natsMsg_GetMetaData(&md, m) != NATS_OK)
        return 0;
    uint64_t seq = md->Sequence.Stream;
    jsMsgMetaData_Destroy(md);
    return seq;
}

/* got[from..ngot) in stream order (see the top): redeliveries come in
 * the order their AckWait ran out. 0, or -1 out of memory. */
static int in_stream_order(ns_source *s, int from)
{
    int n = s->ngot - from;
    if (n < 2)
        return 0;
    seq_msg *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return -1;
    int sorted = 1;
    for (int i = 0; i < n; i++) {
        v[i] = (seq_msg){stream_seq(s->got[from + i]), s->got[from + i]};
        sorted &= i == 0 || v[i - 1].seq <= v[i].seq;
    }
    if (!sorted) {
        qsort(v, (size_t)n, sizeof *v, by_seq);
        for (int i = 0; i < n; i++)
            s->got[from + i] = v[i].m;
    }
    free(v);
    return 0;
}

/* One pull (fetch_size) onto the end of got: waiting a slice when
 * `wait`, else with no_wait, answered at once. Its status, with
 * NATS_NO_MEMORY when got could not take its messages (they are NAKed
 * then, and come again at once). */
static natsStatus pull(ns_source *s, int wait)
{
    jsFetchRequest fr;
    jsFetchRequest_Init(&fr);
    fr.Batch = fetch_size(s, wait);
    fr.Expires = (int64_t)FETCH_SLICE_MS * 1000000;
    fr.NoWait = !wait;
    natsMsgList l = {0};
    natsStatus st = natsSubscription_FetchRequest(&l, s->sub, &fr);
    s->late += s->late_fetch ? (uint64_t)l.Count : 0;
    if (s->ngot + l.Count > s->gotcap) {
        int cap = s->ngot + l.Count > 2 * s->gotcap ? s->ngot + l.Count
                                                    : 2 * s->gotcap;
        natsMsg **v = realloc(s->got, (size_t)cap * sizeof *v);
        if (v) {
            s->got = v;
            s->gotcap = cap;
        }
    }
    for (int i = 0; i < l.Count; i++) {
        if (s->ngot < s->gotcap) {
            s->got[s->ngot++] = l.Msgs[i];
            l.Msgs[i] = NULL;
        } else {
            natsMsg_Nak(l.Msgs[i], NULL);
            st = NATS_NO_MEMORY;
        }
    }
    natsMsgList_Destroy(&l);
    return st;
}

/* The gathered messages are in progress too: they wait, not handed out,
 * while the gathering goes on (a stalled server), and must not expire
 * meanwhile. */
static void gathered_in_progress(ns_source *s)
{
    int64_t now = cli_mono_ms();
    if (now - s->gather_wpi_ms < s->ack_wait_ms / 3)
        return;
    s->gather_wpi_ms = now;
    for (int i = 0; i < s->ngot; i++)
        natsMsg_InProgress(s->got[i], NULL);
}

/* A pull that brought nothing and gave up for another reason than
 * its time: a lost connection (the server restarting) reads as nothing
 * yet, a slice later (libnats reconnects on its own); anything else
 * fails the run. 0 or ND_ERR. */
static long pull_failed(ns_source *s, natsStatus st)
{
    if (natsConnection_Status(s->l.nc) != NATS_CONN_STATUS_CONNECTED ||
        st == NATS_CONNECTION_CLOSED || st == NATS_NO_RESPONDERS) {
        struct timespec ts = {0, FETCH_SLICE_MS * 1000000L};
        nanosleep(&ts, NULL);
        return 0;
    }
    return failed(s, "fetching messages", st);
}

/* Are messages of a dead run still pending on the consumer, not yet
 * redelivered? Those the consumer has unacknowledged, less the ones
 * gathered here and those waiting in the subscription (late answers).
 * (A second worker's count too: gather waits for them one AckWait at
 * most.) */
static int dead_ones_left(ns_source *s)
{
    jsConsumerInfo *ci = NULL;
    int waiting = 0;
    if (natsSubscription_GetPending(s->sub, &waiting, NULL) != NATS_OK ||
        js_GetConsumerInfo(&ci, s->l.js, s->u.name, s->u.durable, NULL,
                           NULL) != NATS_OK)
        return 0;
    int left = ci->NumAckPending > (int64_t)s->ngot + waiting;
    jsConsumerInfo_Destroy(ci);
    return left;
}

/* An answer with no redelivery before all came back: the server hands
 * redeliveries out first, so none was ready. Either none is left to
 * come (a dead run's message acknowledged after all, a second worker's
 * counted) or the server is late with them: its timer did not run yet
 * (it was stalled across their AckWait). Wait for them, one AckWait at
 * most, while the consumer still has some pending; after an empty
 * answer, the next pull a slice later. */
static int still_coming(ns_source *s, int got_some)
{
    int64_t now = cli_mono_ms();
    if (!s->gather_until_ms)
        s->gather_until_ms = now + s->ack_wait_ms;
    if (now >= s->gather_until_ms || !dead_ones_left(s))
        return 0;
    struct timespec ts = {0, FETCH_SLICE_MS * 1000000L};
    if (!got_some)  /* the next pull a slice later */
        nanosleep(&ts, NULL);
    return 1;
}

/* One pull of the gathering that starts a run which found messages
 * pending (see the top; s->resume counts those still to come back).
 * It ends once all have come back, or once an answer with a message
 * never delivered before, or with nothing, shows that none is still
 * coming (still_coming). A pull that gave up (NATS_TIMEOUT: a stalled
 * or loaded server) proves nothing: its answer comes later, into the
 * subscription, and later pulls take it. Messages ready to hand out
 * (then all that were gathered, in stream order), or ND_ERR. */
static long gather(ns_source *s)
{
    int from = s->ngot;
    natsStatus st = pull(s, 0);
    if (st == NATS_NO_MEMORY)
        return failed(s, "fetching messages", st);
    int fresh = 0;
    for (int i = from; i < s->ngot; i++) {
        jsMsgMetaData *md = NULL;
        int again = natsMsg_GetMetaData(&md, s->got[i]) == NATS_OK &&
                    md->NumDelivered > 1;
        jsMsgMetaData_Destroy(md);
        s->resume -= again;
        fresh |= !again;
    }
    if (s->ngot > from)
        s->last_new_ms = cli_mono_ms();
    int answered = s->ngot > from || st == NATS_OK || st == NATS_NOT_FOUND;
    if (!answered && st != NATS_TIMEOUT)
        return pull_failed(s, st);
    int proves = fresh || (answered && s->ngot == from);
    if (s->resume > 0 && (!proves || still_coming(s, s->ngot > from))) {
        gathered_in_progress(s);
        return 0;
    }
    s->resume = 0;
    if (in_stream_order(s, 0))
        return failed(s, "fetching messages", NATS_NO_MEMORY);
    return s->ngot;
}

/* One fetch (fetch_size): waiting a slice when `wait`, else only what is
 * there; while gathering, one pull of that (gather). Messages ready to
 * hand out, or ND_ERR (pull_failed). */
static long fetch(ns_source *s, int wait)
{
    if (!s->resume)
        s->ngot = s->next_got = 0;  /* all handed out: each NULL */
    if (cli_mono_ms() < s->start_after_ms) {
        struct timespec ts = {0, FETCH_SLICE_MS * 1000000L};
        if (wait)
            nanosleep(&ts, NULL);
        return 0;
    }
    if (s->resume)
        return gather(s);
    natsStatus st = pull(s, wait);
    if (st == NATS_NO_MEMORY || in_stream_order(s, 0))
        return failed(s, "fetching messages", NATS_NO_MEMORY);
    if (s->ngot > 0)
        return s->ngot;
    if (st == NATS_OK || st == NATS_TIMEOUT || st == NATS_NOT_FOUND)
        return 0;
    return pull_failed(s, st);
}

/* Messages this source has fetched and not acknowledged. */
static long long held_here(ns_source *s)
{
    long long n = s->ngot - s->next_got;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->hn; i++)
        n += s->hv[i].m != NULL;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Before --idle-exit ends the run: does the consumer still have
 * messages to deliver? Those never delivered, and those delivered to
 * another worker and not acknowledged: a dead worker's come back after
 * AckWait, which may be longer than the idle time. A loaded server can
 * also let a fetch pass empty while it has some. Then the idle clock
 * starts again. */
static int more_to_come(ns_source *s)
{
    jsConsumerInfo *ci = NULL;
    if (js_GetConsumerInfo(&ci, s->l.js, s->u.name, s->u.durable, NULL,
                           NULL) != NATS_OK)
        return 0;
    long long n = (long long)ci->NumPending + (long long)ci->NumAckPending -
                  held_here(s);
    jsConsumerInfo_Destroy(ci);
    if (n <= 0)
        return 0;
    s->last_new_ms = cli_mono_ms();
    return 1;
}

static int ns_next(source *base, nd_line *l, int wait)
{
    ns_source *s = (ns_source *)base;
    for (;;) {
        if (!s->resume && s->next_got < s->ngot) {
            natsMsg *m = s->got[s->next_got];
            s->got[s->next_got++] = NULL;  /* held now */
            if (hand_out(s, m, l)) {
                natsMsg_Destroy(m);
                snprintf(s->err, sizeof s->err, "%s: out of memory",
                         s->u.display);
                return ND_ERR;
            }
            return ND_LINE;
        }
        if (*s->stop)
            return ND_IDLE;
        long got = fetch(s, wait);
        if (got < 0)
            return ND_ERR;
        if (got) {
            s->last_new_ms = cli_mono_ms();
            continue;
        }
        if (s->idle_exit_ms &&
            cli_mono_ms() - s->last_new_ms >= s->idle_exit_ms &&
            !more_to_come(s))
            return ND_END;
        if (!wait)
            return ND_IDLE;
    }
}

static long long ns_lag(source *base)
{
    ns_source *s = (ns_source *)base;
    jsConsumerInfo *ci = NULL;
    if (js_GetConsumerInfo(&ci, s->l.js, s->u.name, s->u.durable, NULL,
                           NULL) != NATS_OK)
        return -1;
    long long lag = (long long)ci->NumPending;
    jsConsumerInfo_Destroy(ci);
    return lag;
}

/* Its fetches wait in short slices and look at the stop themselves. */
static int ns_wait(source *base)
{
    return *((ns_source *)base)->stop != 0;
}

static const source_ops ns_source_ops = {
    .next = ns_next, .release = ns_release, .wait = ns_wait,
    .err = ns_err, .where = ns_where, .ack = ns_ack,
    .ack_flush = ns_ack_flush, .lag = ns_lag, .worker = ns_worker,
    .close = ns_close};
