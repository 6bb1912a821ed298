/* nsink.c - a JetStream subject as the output of dedup and run.
 *
 * Each output line is published as one message (asynchronously, the
 * batch's PubAcks awaited at flush): its data the line without its line
 * end, its headers those of the input message (dedup), with Nats-Msg-Id
 * and idem-key set to the message's key. Nats-Msg-Id is the broker's own
 * fence: a republish of a key within the stream's duplicate window is
 * dropped by the server (its PubAck says duplicate).
 *
 * Outside that window the fence is read-back, as for Redis Streams
 * (rsink.c): the position kept in the job's checkpoint is the stream
 * sequence of the last message published before the commit (the
 * greatest PubAck sequence), and after a crash the messages of the
 * stream after it, on this subject, are read back (ns_read_back): their
 * idem-key (and, for run, the status and result members of their data)
 * say what the dead run wrote and did not commit. A takeover of another
 * worker's key looks in the recent messages (ns_catch_up): everything
 * after a sequence found by time (readback window: twice the lease and
 * 10 s), kept in two generations so that it stays about that long.
 *
 * Messages deleted after the checkpoint before a restart reads them
 * back (the stream's limits, a purge) are said: their keys, if the dead
 * run wrote them, are written again.
 *
 * Reading back goes through an ordered consumer of the stream from the
 * position on, filtered to our subject: the server pushes the messages
 * in order, one request for all of them (a message at a time was 2,000
 * a second). A few (the recent ones since the last batch) are still
 * asked one by one (js_GetMsg), which a consumer's own requests would
 * outweigh; the time search by binary search (seq_at) asks a few too.
 * Direct gets of many at once are not in nats-server 2.9. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "jfields.h"
#include "keymap.h"
#include "nconn.h"
#include "nstream.h"

/* Up to this many messages to read back are asked one by one: a
 * consumer costs a few requests of its own. */
#define SCAN_EACH_MAX 32

typedef struct ns_sink {
    sink base;
    const char *cmd;
    nats_uri u;
    nats_link l;
    char *stream;          /* the stream holding the subject */
    int64_t max_msg;       /* its max_msg_size when it has one, else 0 */
    uint64_t markers;      /* messages written as markers, not yet told
                            * (undone) */
    int64_t window_ms;
    char pos[32];
    pthread_mutex_t mu;    /* PubAcks come on libnats's thread */
    uint64_t acked_max;    /* the greatest sequence PubAcked */
    uint64_t nerr;
    char pub_err[512];
    cli_buf dups;          /* PubAcks saying duplicate: seq, our message */
    keymap back;           /* read back after the checkpoint */
    keymap recent[2];      /* the recent messages: now, and before */
    keymap marked;         /* the keys of markers read back or recent */
    uint64_t recent_seq;   /* the last sequence read into them */
    int64_t recent_at;     /* when recent[0] was started; 0: never */
    uint64_t deep_ms;      /* the earliest time asked for (catch_up) */
    uint64_t gone;         /* messages scan_after found deleted */
    jfields f;
    int published;         /* any message yet */
    char key[1024];        /* the key as a header value */
    uint64_t replay_id;    /* this sink's replays: drawn at open */
    uint64_t replays;      /* ... and counted */
} ns_sink;

static const sink_ops ns_sink_ops;

static int fail(ns_sink *k, const char *what, natsStatus st)
{
    cli_fail(k->cmd, "%s: %s: %s", k->u.display, what, nl_why(st));
    return -1;
}

/* A PubAck saying duplicate names the stream's message the server
 * took ours for: kept (its sequence, then m's data and idem-key) to be
 * checked at the flush (same_message). Under mu. 0 or -1. */
static int note_dup(ns_sink *k, uint64_t seq, natsMsg *m)
{
    const char *key = NULL;
    uint64_t dlen = (uint64_t)natsMsg_GetDataLength(m);
    if (natsMsgHeader_Get(m, "idem-key", &key) != NATS_OK || !key)
        key = "";
    return cli_buf_add(&k->dups, &seq, sizeof seq) ||
                   cli_buf_add(&k->dups, &dlen, sizeof dlen) ||
                   cli_buf_add(&k->dups, natsMsg_GetData(m), dlen) ||
                   cli_buf_add(&k->dups, key, strlen(key) + 1)
               ? -1
               : 0;
}

/* Why the server refused m (pae), into pub_err. A message over the
 * stream's max_msg_size is not refused when the limit is known (a
 * marker takes its place): the limit was lowered during the run, and
 * the run stops at it (later messages of the batch went out: a marker
 * now would come after them). A rerun reads the limit again. Under mu. */
static void say_refused(ns_sink *k, natsMsg *m, const jsPubAckErr *pae)
{
    const char *key = NULL;
    if (pae && pae->ErrCode == JSStreamMessageExceedsMaximumErr &&
        natsMsgHeader_Get(m, "idem-key", &key) == NATS_OK && key)
        snprintf(k->pub_err, sizeof k->pub_err, "stream %.100s refused the "
                 "message of key '%.200s' as over its max_msg_size (%"
                 PRId64 " bytes when this run started, 0: none): lowered "
                 "since? a rerun writes a marker in its place",
                 k->stream, key, k->max_msg);
    else
        snprintf(k->pub_err, sizeof k->pub_err, "%s",
                 pae && pae->ErrText ? pae->ErrText
                 : pae ? natsStatus_GetText(pae->Err) : "no PubAck");
}

/* A PubAck from another stream than the one read back (?stream= naming
 * one that does not hold the subject) is a failure: its sequence is not
 * a position there, and read-back would find nothing it wrote. */
static void on_pub_ack(jsCtx *js, natsMsg *m, jsPubAck *pa, jsPubAckErr *pae,
                       void *closure)
{
    (void)js;
    ns_sink *k = closure;
    pthread_mutex_lock(&k->mu);
    int elsewhere = pa && (!pa->Stream || strcmp(pa->Stream, k->stream));
    if (pa && !elsewhere && pa->Sequence > k->acked_max)
        k->acked_max = pa->Sequence;
    if (pa && !elsewhere && pa->Duplicate && note_dup(k, pa->Sequence, m) &&
        !k->nerr++)
        snprintf(k->pub_err, sizeof k->pub_err, "out of memory");
    if (elsewhere && !k->nerr++)
        snprintf(k->pub_err, sizeof k->pub_err, "the subject is stored in "
                 "stream %.200s, not %.200s (?stream=)",
                 pa->Stream ? pa->Stream : "(unnamed)", k->stream);
    if (!pa && !k->nerr++)
        say_refused(k, m, pae);
    pthread_mutex_unlock(&k->mu);
    natsMsg_Destroy(m);
}

/* The limit of the stream's own on the size of a message: its
 * max_msg_size (none when 0 or -1; the server compares it with the data
 * and the headers). Read once, at open: a limit lowered during the run
 * is found by the server, in its PubAck (on_pub_ack). 0 or -1. */
static int stream_limit(ns_sink *k)
{
    jsStreamInfo *si = NULL;
    natsStatus st = js_GetStreamInfo(&si, k->l.js, k->stream, NULL, NULL);
    if (st)
        return fail(k, "reading the stream's configuration", st);
    k->max_msg = si->Config->MaxMsgSize > 0 ? si->Config->MaxMsgSize : 0;
    jsStreamInfo_Destroy(si);
    return 0;
}

/* The stream that holds the subject: ?stream=, else asked of the
 * server. 0 or -1. */
static int find_stream(ns_sink *k)
{
    if (k->u.stream)
        return (k->stream = strdup(k->u.stream)) ? 0 : -1;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Stream.Info.SubjectsFilter = k->u.name;
    jsStreamNamesList *names = NULL;
    natsStatus st = js_StreamNames(&names, k->l.js, &jo, NULL);
    if (st == NATS_NOT_FOUND || (!st && names->Count != 1)) {
        cli_fail(k->cmd, "%s: %s stream holds subject %s: create one "
                 "(with a duplicate window), or name it with ?stream=",
                 k->u.display, !st && names->Count ? "more than one"
                                                   : "no", k->u.name);
        jsStreamNamesList_Destroy(names);
        return -1;
    }
    if (st)
        return fail(k, "finding the stream of the subject", st);
    k->stream = strdup(names->List[0]);
    jsStreamNamesList_Destroy(names);
    return k->stream ? 0 : -1;
}

static void ns_close(sink *base);

sink *ns_sink_open(const char *cmd, const char *uri, int64_t lease_ms,
                   int *status)
{
    ns_sink *k = calloc(1, sizeof *k);
    if (!k) {
        *status = cli_fail(cmd, "out of memory");
        return NULL;
    }
    k->base.ops = &ns_sink_ops;
    k->cmd = cmd;
    pthread_mutex_init(&k->mu, NULL);
    k->window_ms = 2 * lease_ms + 10000;
    snprintf(k->pos, sizeof k->pos, "0");
    if (getrandom(&k->replay_id, sizeof k->replay_id, 0) !=
        (ssize_t)sizeof k->replay_id)  /* not drawn: the clock's */
        k->replay_id = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 32;
    if ((*status = nu_parse(cmd, uri, 1, &k->u)) != 0 ||
        (*status = nl_open(cmd, &k->u, &k->l, on_pub_ack, k)) != 0 ||
        (*status = find_stream(k) || stream_limit(k) ? 1 : 0) != 0) {
        ns_close(&k->base);
        return NULL;
    }
    return &k->base;
}

/* Publishes still waiting for their PubAck (a failed batch) are given
 * up: libnats would keep them, and its context, past the close. (Asked
 * only after a publish: libnats 3.4.1 has no list to look in before.) */
static void drop_pending(ns_sink *k)
{
    natsMsgList pend = {0};
    if (k->published &&
        js_PublishAsyncGetPendingList(&pend, k->l.js) == NATS_OK)
        natsMsgList_Destroy(&pend);
}

static void ns_close(sink *base)
{
    ns_sink *k = (ns_sink *)base;
    drop_pending(k);
    nl_close(&k->l);  /* before the rest: no PubAck comes after it */
    nu_free(&k->u);
    free(k->stream);
    cli_buf_free(&k->dups);
    km_free(&k->back);
    km_free(&k->recent[0]);
    km_free(&k->recent[1]);
    km_free(&k->marked);
    jf_free(&k->f);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

static const char *ns_pos(const sink *base)
{
    return ((const ns_sink *)base)->pos;
}

static const char *ns_name(const sink *base)
{
    return ((const ns_sink *)base)->u.display;
}

/* The stream's first sequence and last, and how many messages it
 * deleted from its inside (ndel; may be NULL). 0 or -1. */
static int stream_seqs(ns_sink *k, uint64_t *first, uint64_t *last,
                       uint64_t *ndel)
{
    jsStreamInfo *si = NULL;
    natsStatus st = js_GetStreamInfo(&si, k->l.js, k->stream, NULL, NULL);
    if (st)
        return fail(k, "reading the stream's state", st);
    *first = si->State.FirstSeq;
    *last = si->State.LastSeq;
    if (ndel)
        *ndel = si->State.NumDeleted;
    jsStreamInfo_Destroy(si);
    return 0;
}

/* A new job starts at the stream's last message, and so does its look
 * at the recent ones (ns_catch_up goes back from there by time): left
 * at 0, its first look read the whole stream, and an output of long ago
 * hid a retried message whose key was new again (its record expired,
 * another key space). */
static int ns_start(sink *base)
{
    ns_sink *k = (ns_sink *)base;
    uint64_t first, last;
    if (stream_seqs(k, &first, &last, NULL))
        return -1;
    snprintf(k->pos, sizeof k->pos, "%" PRIu64, last);
    k->recent_seq = last;
    return 0;
}

/* Message seq of the stream, or NULL (deleted: *gone). */
static natsMsg *get(ns_sink *k, uint64_t seq, int *gone)
{
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus st = js_GetMsg(&m, k->l.js, k->stream, seq, NULL, &jerr);
    *gone = st == NATS_NOT_FOUND;
    if (st && !*gone)
        fail(k, "reading the stream back", st);
    return st ? NULL : m;
}

/* Remember m's key (with its status and result, if its data has them)
 * in map, when it is of our subject; a marker's key in marked too, so
 * that one found written still counts as not done (ns_forget). 0 or
 * -1. */
static int remember(ns_sink *k, natsMsg *m, keymap *map)
{
    const char *key = NULL;
    if (strcmp(natsMsg_GetSubject(m), k->u.name) ||
        natsMsgHeader_Get(m, "idem-key", &key) != NATS_OK || !key)
        return 0;
    int rc = jf_parse(&k->f, natsMsg_GetData(m),
                      (size_t)natsMsg_GetDataLength(m));
    long st = rc > 0 ? jf_find(&k->f, "status") : -1;
    long res = rc > 0 ? jf_find(&k->f, "result") : -1;
    const jfields *f = &k->f;
    const char *big = NULL;
    if (natsMsgHeader_Get(m, "idem-too-large", &big) == NATS_OK && big &&
        km_put(&k->marked, key, strlen(key), "", 0, "", 0))
        rc = -1;
    if (rc < 0 ||
        km_put(map, key, strlen(key), st >= 0 ? f->buf.p + f->off[st] : "",
               st >= 0 ? f->len[st] : 0,
               res >= 0 ? f->buf.p + f->off[res] : "",
               res >= 0 ? f->len[res] : 0))
        return cli_fail(k->cmd, "out of memory"), -1;
    return 0;
}

/* How many of the stream's messages in (after, last] were deleted from
 * its inside (a message deleted by hand, or by a limit per subject),
 * when it has any (ndel): a consumer passes over them unseen. 0 or -1. */
static int deleted_within(ns_sink *k, uint64_t after, uint64_t last,
                          uint64_t *n)
{
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Stream.Info.DeletedDetails = true;
    jsStreamInfo *si = NULL;
    natsStatus st = js_GetStreamInfo(&si, k->l.js, k->stream, &jo, NULL);
    if (st)
        return fail(k, "reading the stream's deleted messages", st);
    for (int i = 0; i < si->State.DeletedLen; i++)
        *n += si->State.Deleted[i] > after && si->State.Deleted[i] <= last;
    jsStreamInfo_Destroy(si);
    return 0;
}

/* The messages of our subject in [start, last] into map, through an
 * ordered consumer of the stream (one request for all, the server
 * pushing them in order with flow control), which passes over deleted
 * messages and those of other subjects. It ends at last, or when the
 * server says none of ours is left. 0 or -1. */
static int scan_consumer(ns_sink *k, uint64_t start, uint64_t last,
                         keymap *map)
{
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = k->stream;
    so.Ordered = true;
    so.Config.DeliverPolicy = js_DeliverByStartSequence;
    so.Config.OptStartSeq = start;
    natsSubscription *sub = NULL;
    jsConsumerInfo *ci = NULL;
    natsStatus st = js_SubscribeSync(&sub, k->l.js, k->u.name, NULL, &so,
                                     NULL);
    st = st ? st : natsSubscription_GetConsumerInfo(&ci, sub, NULL, NULL);
    int more = !st && ci->NumPending + ci->Delivered.Consumer > 0, rc = 0;
    jsConsumerInfo_Destroy(ci);
    while (!st && !rc && more) {
        natsMsg *m = NULL;
        jsMsgMetaData *md = NULL;
        st = natsSubscription_NextMsg(&m, sub, k->u.timeout_ms);
        st = st ? st : natsMsg_GetMetaData(&md, m);
        if (!st && md->Sequence.Stream <= last)
            rc = remember(k, m, map);
        more = !st && md->NumPending > 0 && md->Sequence.Stream < last;
        jsMsgMetaData_Destroy(md);
        natsMsg_Destroy(m);
    }
    if (sub)
        natsSubscription_Unsubscribe(sub);  /* and its consumer */
    natsSubscription_Destroy(sub);
    return st ? fail(k, "reading the stream back", st) : rc;
}

/* The messages in [start, last] one by one into map (js_GetMsg, which
 * tells a deleted one). 0 or -1. */
static int scan_each(ns_sink *k, uint64_t start, uint64_t last, keymap *map)
{
    for (uint64_t seq = start; seq <= last; seq++) {
        int gone;
        natsMsg *m = get(k, seq, &gone);
        if (!m && !gone)
            return -1;
        k->gone += !m;
        int rc = m ? remember(k, m, map) : 0;
        natsMsg_Destroy(m);
        if (rc)
            return -1;
    }
    return 0;
}

/* The messages after sequence *from up to the stream's last into map;
 * *from becomes the last read. A few (the recent ones since the last
 * batch, a batch in doubt) are asked one by one; more, through a
 * consumer. 0 or -1. */
static int scan_after(ns_sink *k, uint64_t *from, keymap *map)
{
    uint64_t first, last, ndel;
    if (stream_seqs(k, &first, &last, &ndel))
        return -1;
    k->gone += first > *from + 1 ? first - *from - 1 : 0;
    uint64_t start = *from + 1 > first ? *from + 1 : first;
    if (start > last)
        return 0;
    int rc = last - start < SCAN_EACH_MAX
                 ? scan_each(k, start, last, map)
                 : scan_consumer(k, start, last, map) ||
                       (ndel && deleted_within(k, start - 1, last, &k->gone));
    if (!rc)
        *from = last;
    return rc ? -1 : 0;
}

static int ns_read_back(sink *base, const char *pos)
{
    ns_sink *k = (ns_sink *)base;
    char *end;
    uint64_t from = strtoull(pos, &end, 10);
    if (*end || !*pos)
        return cli_fail(k->cmd, "%s: the checkpoint's position '%s' is not "
                        "a stream sequence", k->u.display, pos), -1;
    snprintf(k->pos, sizeof k->pos, "%" PRIu64, from);
    k->recent_seq = from;
    k->gone = 0;
    if (scan_after(k, &from, &k->back))
        return -1;
    if (k->gone)  /* said, not hidden: as rsink.c's say_trimmed() */
        fprintf(stderr, "idem %s: %s: %" PRIu64 " message%s of stream %s "
                "after this job's position %s %s deleted (max_msgs, "
                "max_age, max_bytes, a purge) before %s could be read back: "
                "a key the last run wrote there without committing it is "
                "written again\n", k->cmd, k->u.display, k->gone,
                k->gone == 1 ? "" : "s", k->stream, pos,
                k->gone == 1 ? "was" : "were", k->gone == 1 ? "it" : "they");
    return 0;
}

/* The last sequence stored before wall time t_ns, 0 if none (a binary
 * search; a deleted message counts as older): what comes after it is
 * at or after t_ns. *seq, 0 or -1. */
static int seq_at(ns_sink *k, int64_t t_ns, uint64_t *seq)
{
    uint64_t lo, hi;
    if (stream_seqs(k, &lo, &hi, NULL))
        return -1;
    lo += !lo;  /* an empty stream says 0; sequences start at 1 */
    hi++;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int gone;
        natsMsg *m = get(k, mid, &gone);
        if (!m && !gone)
            return -1;
        int older = !m || natsMsg_GetTime(m) < t_ns;
        natsMsg_Destroy(m);
        if (older)
            lo = mid + 1;
        else
            hi = mid;
    }
    *seq = lo - 1;
    return 0;
}

/* Read from wall time from_ms (less 5 s for two servers' clocks) on,
 * if that is earlier than asked before: the messages handed out since
 * then may have outputs of a dead run older than the window. */
static int reach_back(ns_sink *k, uint64_t from_ms)
{
    uint64_t t = from_ms > 5000 ? from_ms - 5000 : 1, s;
    if (k->deep_ms && t >= k->deep_ms)
        return 0;
    if (seq_at(k, (int64_t)t * 1000000, &s))
        return -1;
    k->deep_ms = t;
    if (s < k->recent_seq)  /* s is the last before t: read after it */
        k->recent_seq = s;  /* again, into recent[0] */
    return 0;
}

/* The recent messages, up to now: what came after the last one read,
 * into the current generation; every half window a new generation
 * starts and the one before the last is dropped. The first time, from
 * the start of the window; and back to from_ms (0: none), the earliest
 * first delivery of the messages asked about. */
static int ns_catch_up(sink *base, uint64_t from_ms)
{
    ns_sink *k = (ns_sink *)base;
    if (from_ms && reach_back(k, from_ms))
        return -1;
    int64_t now = cli_mono_ms();
    if (!k->recent_at) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t t = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec -
                    k->window_ms * 1000000;
        uint64_t s;
        if (seq_at(k, t, &s))
            return -1;
        k->recent_seq = s < k->recent_seq ? s : k->recent_seq;
        k->recent_at = now;
    } else if (now - k->recent_at >= k->window_ms / 2) {
        keymap old = k->recent[1];
        k->recent[1] = k->recent[0];
        k->recent[0] = old;
        km_clear(&k->recent[0]);
        k->recent_at = now;
        k->deep_ms = 0;  /* what reach_back read may be gone with it */
    }
    return scan_after(k, &k->recent_seq, &k->recent[0]);
}

/* since is not needed: what catch_up read back to it is in recent. */
static int ns_has(sink *base, const void *key, size_t keylen, int recent,
                  uint64_t since, const char **status, const char **result,
                  size_t *rlen)
{
    ns_sink *k = (ns_sink *)base;
    const km_entry *e = km_get(&k->back, key, keylen);
    for (int g = 0; !e && recent && g < 2; g++)
        e = km_get(&k->recent[g], key, keylen);
    if (!e)
        return 0;
    return connect_outcome(km_a(e), e->alen, km_b(e), e->blen, status,
                           result, rlen);
}

/* A key found written is the dead run's output from now on; when that
 * output is a marker, its message's data is missing as it was for the
 * run that wrote it, and is counted so (undone: exit status 3), not
 * passed over as done. */
static void ns_forget(sink *base, const void *key, size_t keylen)
{
    ns_sink *k = (ns_sink *)base;
    km_del(&k->back, key, keylen);
    if (km_get(&k->marked, key, keylen)) {
        k->markers++;
        km_del(&k->marked, key, keylen);
    }
}

/* Is header name one the output stream would act on rather than keep:
 * the two this sink sets, and the input's publish preconditions
 * (Nats-Expected-Stream, -Last-Sequence, ...: met when the input was
 * stored, and false of the output stream, which would refuse the
 * message on every retry) or a rollup (a purge of the output stream,
 * read-back's record)? */
static int not_copied(const char *name)
{
    static const char expected[] = "Nats-Expected-";
    return !strcmp(name, "Nats-Msg-Id") || !strcmp(name, "idem-key") ||
           !strncmp(name, expected, sizeof expected - 1) ||
           !strcmp(name, "Nats-Rollup");
}

/* The input's headers (meta's) on m, but for those not_copied(): each
 * name and value made strings in a buffer on the stack (on the heap
 * only when longer). */
static natsStatus copy_headers(natsMsg *m, const char *meta, size_t metalen)
{
    natsStatus st = NATS_OK;
    size_t at = 0;
    meta_rec r;
    char small[512];
    while (!st && meta_next(meta, metalen, &at, &r)) {
        if (r.type != META_HEADER || !r.value)
            continue;
        size_t need = r.namelen + r.valuelen + 2;
        char *name = need <= sizeof small ? small : malloc(need);
        if (!name)
            return NATS_NO_MEMORY;
        char *value = name + r.namelen + 1;
        memcpy(name, r.name, r.namelen);
        name[r.namelen] = 0;
        memcpy(value, r.value, r.valuelen);
        value[r.valuelen] = 0;
        st = not_copied(name) ? NATS_OK : natsMsgHeader_Add(m, name, value);
        if (name != small)
            free(name);
    }
    return st;
}

/* Can key be a header value that reads back as itself? NATS ends a
 * value at a line break and trims spaces and tabs at its ends: a key
 * read back trimmed would not be found (written again after a crash),
 * and Nats-Msg-Id " a" and "a" would be one. Nor empty: an empty
 * Nats-Msg-Id is none. */
static int header_value(const char *key, size_t keylen, size_t max)
{
    return keylen && keylen < max && !memchr(key, 0, keylen) &&
           !memchr(key, '\r', keylen) && !memchr(key, '\n', keylen) &&
           !strchr(" \t", key[0]) && !strchr(" \t", key[keylen - 1]);
}

/* The status member of a run's result line ("" if none). */
static size_t status_of(jfields *f, const char *data, size_t len,
                        const char **st)
{
    long i = jf_parse(f, data, len) > 0 ? jf_find(f, "status") : -1;
    *st = i >= 0 ? f->buf.p + f->off[i] : "";
    return i >= 0 ? f->len[i] : 0;
}

/* Is text a run's line for a duplicate, under --replay emit
 * ("replayed":true)? (dedup writes no duplicates: its data is the
 * input's own, which may hold any member.) */
static int replayed(ns_sink *k, const char *text, size_t len)
{
    if (strcmp(k->cmd, "run") || jf_parse(&k->f, text, len) <= 0)
        return 0;
    long i = jf_find(&k->f, "replayed");
    return i >= 0 && k->f.len[i] == 4 &&
           !memcmp(k->f.buf.p + k->f.off[i], "true", 4);
}

/* m: text on our subject, keyed: idem-key k->key, and Nats-Msg-Id the
 * key too, but for a replay. A replay repeats its key's result for a
 * later message of the key, and the server would drop it as a duplicate
 * of that result within the window (and take it after): its Nats-Msg-Id
 * is KEY#replay-R-N instead, R drawn for the sink and N counting, so
 * that every replay is written. */
static natsStatus keyed(ns_sink *k, const char *text, size_t len,
                        natsMsg **m)
{
    char id[sizeof k->key + 64];
    int replay = replayed(k, text, len);
    if (replay)
        snprintf(id, sizeof id, "%s#replay-%016" PRIx64 "-%" PRIu64, k->key,
                 k->replay_id, ++k->replays);
    natsStatus st = natsMsg_Create(m, k->u.name, NULL, text, (int)len);
    st = st ? st : natsMsgHeader_Set(*m, "Nats-Msg-Id",
                                     replay ? id : k->key);
    return st ? st : natsMsgHeader_Set(*m, "idem-key", k->key);
}

/* The limits a message of the output is held to: the server's
 * max_payload (no stream of the server takes more), the stream's own
 * max_msg_size (both count the data and the headers), and the headers
 * a stream keeps (65,535 bytes). */
enum { FITS, OVER_PAYLOAD, OVER_STREAM, OVER_HEADERS };
#define HEADERS_MAX 65535

/* The limit a message is over, for a marker and for stderr. */
static void say_over(const ns_sink *k, int why, int64_t limit, char *buf,
                     size_t n)
{
    if (why == OVER_PAYLOAD)
        snprintf(buf, n, "over the server's max_payload of %" PRId64
                 " bytes with the headers", limit);
    else if (why == OVER_STREAM)
        snprintf(buf, n, "over the max_msg_size of stream %.200s, %" PRId64
                 " bytes with the headers", k->stream, limit);
    else
        snprintf(buf, n, "with headers over the %" PRId64 " bytes a "
                 "stream keeps", limit);
}

/* What takes the place of a message over a limit (why, limit), which
 * would stop every run at it: a marker of its key, named by its header
 * idem-too-large (the size of the data left out), with the data
 * {"key":…,"status":…,"replayed":true,"error":…} (status and replayed:
 * a run's, so that read-back still finds the outcome and a replay stays
 * one). The input keeps the message itself. It counts as a message not
 * done here (undone: exit status 3). */
static natsStatus marker(ns_sink *k, const char *text, size_t len,
                         size_t keylen, int why, int64_t limit,
                         natsMsg **m)
{
    int rep = replayed(k, text, len);
    const char *stv;
    size_t sn = status_of(&k->f, text, len, &stv);
    char size[32], over[400];
    snprintf(size, sizeof size, "%zu", len);
    say_over(k, why, limit, over, sizeof over);
    cli_buf d = {0};
    int rc = cli_buf_str(&d, "{") ||
             cli_buf_bytes_member(&d, "key", "key_base64", k->key, keylen) ||
             (sn && (cli_buf_str(&d, ",\"status\":") ||
                     cli_buf_json_string(&d, stv, sn))) ||
             (rep && cli_buf_str(&d, ",\"replayed\":true")) ||
             cli_buf_fmt(&d, ",\"error\":\"too large: %zu bytes of data, "
                         "%s\"}", len, over);
    natsStatus st = rc ? NATS_NO_MEMORY : keyed(k, d.p, d.len, m);
    st = st ? st : natsMsgHeader_Set(*m, "idem-too-large", size);
    cli_buf_free(&d);
    if (!st) {
        k->markers++;
        fprintf(stderr, "idem %s: %s: the message of key '%.200s' (%zu "
                "bytes of data) is %s: written as a marker with the header "
                "idem-too-large instead\n", k->cmd, k->u.display, k->key,
                len, over);
    }
    return st;
}

/* m's headers' size on the wire, as libnats encodes them
 * ("NATS/1.0\r\n", "NAME: VALUE\r\n" each, "\r\n"); -1 if unknown. */
static int64_t header_size(natsMsg *m)
{
    const char **keys = NULL;
    int nk = 0;
    int64_t n = 12;
    if (natsMsgHeader_Keys(m, &keys, &nk) != NATS_OK)
        return -1;
    for (int i = 0; n >= 0 && i < nk; i++) {
        const char **vals = NULL;
        int nv = 0;
        if (natsMsgHeader_Values(m, keys[i], &vals, &nv) != NATS_OK)
            n = -1;
        for (int j = 0; n >= 0 && j < nv; j++)
            n += (int64_t)(strlen(keys[i]) + strlen(vals[j]) + 4);
        free((void *)vals);
    }
    free((void *)keys);
    return n;
}

/* Is m (len bytes of data, with the input's headers of meta, metalen
 * bytes) over a limit: FITS, or the limit it is over (*limit)? Counted
 * cheaply first, as more than it can be: the meta's framing is longer
 * than the wire's, and the sink's two headers are taken at their
 * longest; only a message that may be over is counted exactly. The
 * server's max_payload is the one of its INFO (libnats reads it again
 * on a reconnect, and says 0 meanwhile: unknown, left to the publish,
 * which fails the batch rather than write a marker for a message that
 * fits). */
static int over_limit(ns_sink *k, natsMsg *m, size_t len, size_t metalen,
                      int64_t *limit)
{
    int64_t pay = natsConnection_GetMaxPayload(k->l.nc);
    int64_t hmax = (int64_t)metalen + 2 * (int64_t)(sizeof k->key + 96);
    int64_t most = (int64_t)len + hmax;
    if ((pay <= 0 || most <= pay) && (!k->max_msg || most <= k->max_msg) &&
        hmax <= HEADERS_MAX)
        return FITS;
    int64_t hdr = header_size(m);
    int64_t n = hdr + natsMsg_GetDataLength(m);
    int why = hdr < 0                         ? FITS
              : pay > 0 && n > pay            ? OVER_PAYLOAD
              : k->max_msg && n > k->max_msg  ? OVER_STREAM
              : hdr > HEADERS_MAX             ? OVER_HEADERS
                                              : FITS;
    *limit = why == OVER_PAYLOAD  ? pay
             : why == OVER_STREAM ? k->max_msg
                                  : HEADERS_MAX;
    return why;
}

static int ns_put(sink *base, const char *text, size_t len, const void *key,
                  size_t keylen, const char *meta, size_t metalen)
{
    ns_sink *k = (ns_sink *)base;
    len -= len && text[len - 1] == '\n';  /* the loop's line end */
    if (!header_value(key, keylen, sizeof k->key))
        return cli_fail(k->cmd, "%s: a key of %zu bytes, or with a NUL or "
                        "line break, or a space or tab at either end, "
                        "cannot be a NATS header value", k->u.display,
                        keylen), -1;
    memcpy(k->key, key, keylen);
    k->key[keylen] = 0;
    natsMsg *m = NULL;
    int64_t limit = 0;
    natsStatus st = keyed(k, text, len, &m);
    st = st ? st : copy_headers(m, meta, metalen);
    int why = st ? FITS : over_limit(k, m, len, metalen, &limit);
    if (why) {
        natsMsg_Destroy(m);
        m = NULL;
        st = marker(k, text, len, keylen, why, limit, &m);
    }
    st = st ? st : js_PublishMsgAsync(k->l.js, &m, NULL);
    natsMsg_Destroy(m);  /* NULL once published */
    k->published |= !st;
    return st ? fail(k, "publishing", st) : 0;
}

/* Is the stream's message orig the one we published (data, idem-key),
 * or its equal: our subject, our key, the same status (a run's result
 * may differ in its text from one attempt to the next)? The duplicate
 * window is the stream's, not the subject's, and takes any message with
 * the same Nats-Msg-Id for ours: another job's output of the same key on
 * another subject of the stream, or a run's gave_up before its done. */
static int same_message(ns_sink *k, natsMsg *orig, const char *data,
                        size_t dlen, const char *key)
{
    const char *okey = NULL, *st, *ost;
    if (strcmp(natsMsg_GetSubject(orig), k->u.name) ||
        natsMsgHeader_Get(orig, "idem-key", &okey) != NATS_OK || !okey ||
        strcmp(okey, key))
        return 0;
    char mine[32];  /* done, failed, gave_up: longer ones are cut */
    size_t n = status_of(&k->f, data, dlen, &st);
    n = n < sizeof mine ? n : sizeof mine;
    memcpy(mine, st, n);
    size_t on = status_of(&k->f, natsMsg_GetData(orig),
                          (size_t)natsMsg_GetDataLength(orig), &ost);
    on = on < sizeof mine ? on : sizeof mine;
    return on == n && !memcmp(ost, mine, n);
}

/* The duplicates of this batch are ours, or the batch fails: a message
 * the server dropped for another's would be lost. 0 or -1. */
static int check_dups(ns_sink *k)
{
    pthread_mutex_lock(&k->mu);
    cli_buf d = k->dups;
    k->dups = (cli_buf){0};
    pthread_mutex_unlock(&k->mu);
    int rc = 0;
    for (size_t at = 0; !rc && at < d.len;) {
        uint64_t seq, dlen;
        memcpy(&seq, d.p + at, sizeof seq);
        memcpy(&dlen, d.p + at + sizeof seq, sizeof dlen);
        const char *data = d.p + at + 2 * sizeof seq;
        const char *key = data + dlen;
        at += 2 * sizeof seq + dlen + strlen(key) + 1;
        int gone;
        natsMsg *orig = get(k, seq, &gone);
        rc = !orig && !gone ? -1 : 0;  /* gone: cannot tell; as ours */
        if (orig && !same_message(k, orig, data, (size_t)dlen, key)) {
            cli_fail(k->cmd, "%s: the message of key '%.200s' was "
                     "dropped by stream %s as a duplicate of its "
                     "message %" PRIu64 " (subject %.200s), not ours: "
                     "its Nats-Msg-Id is the key, and the duplicate "
                     "window is the stream's; give this output a stream "
                     "of its own, or wait out the window",
                     k->u.display, key, k->stream, seq,
                     natsMsg_GetSubject(orig));
            rc = -1;
        }
        natsMsg_Destroy(orig);
    }
    cli_buf_free(&d);
    return rc;
}

static int ns_flush(sink *base)
{
    ns_sink *k = (ns_sink *)base;
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = k->u.timeout_ms;
    natsStatus st = js_PublishAsyncComplete(k->l.js, &po);
    pthread_mutex_lock(&k->mu);
    uint64_t nerr = k->nerr, seq = k->acked_max;
    k->nerr = 0;
    pthread_mutex_unlock(&k->mu);
    if (st)
        return fail(k, "waiting for the PubAcks", st);
    if (nerr)
        return cli_fail(k->cmd, "%s: %" PRIu64 " publish%s failed: %s",
                        k->u.display, nerr, nerr == 1 ? "" : "es",
                        k->pub_err), -1;
    if (check_dups(k))
        return -1;
    if (seq > strtoull(k->pos, NULL, 10))
        snprintf(k->pos, sizeof k->pos, "%" PRIu64, seq);
    return 0;
}

/* Messages written as markers since the last call. */
static uint64_t ns_undone(sink *base)
{
    ns_sink *k = (ns_sink *)base;
    uint64_t n = k->markers;
    k->markers = 0;
    return n;
}

int ns_ident(const char *cmd, const char *uri, int as_sink, char *buf,
             size_t size)
{
    nats_uri u;
    int rc = nu_parse(cmd, uri, as_sink, &u);
    if (!rc)
        nu_ident(&u, 0, buf, size);
    nu_free(&u);
    return rc;
}

static const sink_ops ns_sink_ops = {
    .start = ns_start, .read_back = ns_read_back,
    .catch_up = ns_catch_up, .has = ns_has, .forget = ns_forget,
    .put = ns_put, .flush = ns_flush, .pos = ns_pos, .name = ns_name,
    .undone = ns_undone, .close = ns_close};
