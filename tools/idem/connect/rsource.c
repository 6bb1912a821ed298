/* rsource.c - a Redis Stream consumer group as the input of dedup and run.
 *
 * Reading goes in three kinds of rounds, all XREADGROUP or XAUTOCLAIM of
 * up to a batch of entries:
 *
 *   1. this consumer's own pending list, from ID 0 on: the entries a
 *      killed run of it read and did not acknowledge. Their keys are
 *      committed (then they come out as duplicates and are acknowledged)
 *      or not (then they are done now);
 *   2. every lease/2, XAUTOCLAIM of entries pending longer than the lease
 *      in any consumer's list: a consumer that died does not keep its
 *      entries. A live one that is only slow loses nothing by it: the
 *      keys are claimed in the store, so the taker waits for them and
 *      finds them done;
 *   3. new entries (">"), blocking at most 250 ms at a time so that a
 *      stop signal or --idle-exit is seen.
 *
 * An entry is acknowledged only after the commit that covers it, by the
 * committing thread on a connection of its own (rs_ack_flush): a crash
 * before that leaves it pending, and round 1 or 2 hands it out again.
 * The XACK's answer is read with the next batch's (send_acks says why
 * that is safe), so the committing thread waits no round trip for it.
 * An entry that the stream no longer holds (trimmed by MAXLEN or XDEL
 * while pending) comes back without fields: it cannot be processed, so
 * it is acknowledged, counted and reported, never waited for.
 *
 * An entry handed out before (rounds 1 and 2) may have its output in the
 * sink already, written by a run that died before its commit, at any
 * time after the entry was first delivered. So before such a round the
 * entries' deliveries are asked for (XPENDING, after TIME): an entry
 * delivered once was first delivered `idle` ms ago; one delivered more
 * often, or not listed, at the earliest when it was added (its ID's
 * milliseconds). That time goes with the line (nd_line.since), and the
 * sink looks for its key among the entries written since (rsink.c),
 * however long ago that was: no time window decides.
 *
 * An entry becomes the JSON object of its fields in order, every value a
 * string: {"event_id":"e1","amount":"12"}. Names and values must be
 * UTF-8 (JSON has no other strings); an entry that is not is bad input
 * (--on-bad-input) like a bad JSON line. The fields also go with the
 * line as its meta (META_FIELD, connect.h), so that the key and a Redis
 * sink take them from there, not by parsing the JSON back. A reply's
 * room is kept for the next one (chunk_done): no allocation per batch.
 *
 * On the store's own server (rs_on_store) the source joins the store
 * (rs_join): the XACKs of a commit are queued with its checkpoint and
 * run by the script that writes it, so an entry is acknowledged in the
 * same step as the completion of its key, not just after. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "rconn.h"
#include "rstream.h"

#define BLOCK_SLICE_MS 250

/* One reply's entries, as JSON lines in text, each followed by its
 * fields as meta (META_FIELD records, connect.h). */
typedef struct chunk {
    cli_buf text;
    nd_line *lines;
    size_t n, cap;            /* lines used, and room */
} chunk;

typedef struct rs_source {
    source base;
    const char *cmd;
    rs_uri u;
    rs_conn rd, ack;          /* the reader's; the committer's */
    rs_arena arena;           /* the reader's replies (rconn.h) */
    uint64_t batch;
    int64_t lease_ms, idle_exit_ms;
    volatile const sig_atomic_t *stop;
    int own_done;             /* round 1 is over */
    char own_cursor[48];      /* the last ID handed out in order (round
                               * 1, new entries): round 1 goes on after
                               * it */
    char claim_cursor[48];
    int64_t next_claim_ms;
    int64_t last_new_ms;      /* for --idle-exit */
    chunk *chunks;            /* held until release; the last is read */
    size_t nchunks, handed;   /* lines of the last chunk handed out */
    chunk spare;              /* a released chunk's room, for the next
                               * reply: no allocation per batch */
    const char **ackv;        /* XACK arguments: stream, group, IDs */
    size_t *ackl;
    size_t nack, capack;
    cli_buf ackids;
    int acks_out;             /* an XACK sent, its answer not read */
    cli_buf sent;             /* its IDs, each ended by a NUL */
    idem_store *st;           /* joined: XACKs go with its checkpoint */
    uint64_t trimmed;
    cli_buf trim_ids;         /* trimmed entries of the reply in hand */
    struct delivery {     /* of the entries a round hands out again: */
        uint64_t ms, seq; /* the entry's ID, and the earliest its */
        uint64_t since;   /* output can have been written (XPENDING) */
    } *dlv;
    size_t ndlv;
    char err[1500];
    char worker[600];         /* rs_uri_ident() with group and consumer */
} rs_source;

static void rs_close(source *base);
static const source_ops rs_source_ops;


int rs_is_uri(const char *uri)
{
    return uri && !strncmp(uri, "redis-stream://", 15);
}

static int failed(rs_source *s, const char *what, const redisReply *r)
{
    if (r)
        snprintf(s->err, sizeof s->err, "%.400s: %.100s: %.600s",
                 s->u.display, what, r->str);
    else
        snprintf(s->err, sizeof s->err, "%.1200s (%.100s)", s->rd.err, what);
    return ND_ERR;
}

/* XGROUP CREATE ... MKSTREAM; an existing group is fine. */
static int make_group(rs_source *s)
{
    const char *argv[] = {"XGROUP", "CREATE", s->u.stream, s->u.group,
                          s->u.start, "MKSTREAM"};
    size_t lens[] = {6, 6, s->u.streamlen, strlen(s->u.group),
                     strlen(s->u.start), 8};
    redisReply *r = rs_call(&s->rd, 6, argv, lens, 0, 1);
    int bad = !r || (r->type == REDIS_REPLY_ERROR &&
                     strncmp(r->str, "BUSYGROUP", 9));
    if (bad)
        failed(s, "creating the consumer group", r);
    rs_reply_free(&s->rd, r);
    return bad ? -1 : 0;
}

source *rs_source_open(const char *cmd, const char *uri,
                       const source_opts *o, int *status)
{
    rs_source *s = calloc(1, sizeof *s);
    if (!s) {
        *status = cli_fail(cmd, "out of memory");
        return NULL;
    }
    s->cmd = cmd;
    s->base.ops = &rs_source_ops;
    if ((*status = rs_uri_parse(cmd, uri, 0, &s->u)) != 0) {
        rs_close(&s->base);
        return NULL;
    }
    s->rd.u = s->ack.u = &s->u;
    s->rd.arena = &s->arena;
    rs_uri_ident(&s->u, 1, s->worker, sizeof s->worker);
    s->batch = o->batch;
    s->lease_ms = o->lease_ms;
    s->idle_exit_ms = o->idle_exit_ms;
    s->stop = o->stop;
    snprintf(s->own_cursor, sizeof s->own_cursor, "0");
    snprintf(s->claim_cursor, sizeof s->claim_cursor, "0-0");
    s->last_new_ms = cli_mono_ms();
    if (make_group(s)) {
        *status = cli_fail(cmd, "%s", s->err);
        rs_close(&s->base);
        return NULL;
    }
    return &s->base;
}

static void chunk_free(chunk *c)
{
    cli_buf_free(&c->text);
    free(c->lines);
    *c = (chunk){0};
}

/* c's room becomes the spare one, or is freed when there is one. */
static void chunk_done(rs_source *s, chunk *c)
{
    if (s->spare.lines) {
        chunk_free(c);
        return;
    }
    s->spare = *c;
    s->spare.n = s->spare.text.len = 0;
    *c = (chunk){0};
}

static void drop_chunks(rs_source *s)
{
    for (size_t i = 0; i < s->nchunks; i++)
        chunk_done(s, &s->chunks[i]);
    free(s->chunks);
    s->chunks = NULL;
    s->nchunks = s->handed = 0;
}

static int flush_acks(rs_source *s, int wait);

static void rs_close(source *base)
{
    rs_source *s = (rs_source *)base;
    if (s->acks_out)
        flush_acks(s, 1);
    drop_chunks(s);
    chunk_free(&s->spare);
    rs_conn_close(&s->rd);
    rs_conn_close(&s->ack);
    rs_arena_free(&s->arena);
    rs_uri_free(&s->u);
    free(s->ackv);
    free(s->ackl);
    cli_buf_free(&s->ackids);
    cli_buf_free(&s->sent);
    cli_buf_free(&s->trim_ids);
    free(s->dlv);
    free(s);
}

static void rs_release(source *base)
{
    rs_source *s = (rs_source *)base;
    if (s->nchunks && s->handed < s->chunks[s->nchunks - 1].n) {
        /* Keep the last chunk's lines not yet handed out. */
        chunk last = s->chunks[--s->nchunks];
        drop_chunks(s);
        s->chunks = malloc(sizeof *s->chunks);
        if (s->chunks)
            s->chunks[s->nchunks++] = last;
        return;
    }
    drop_chunks(s);
}

static const char *rs_worker(const source *base)
{
    return ((const rs_source *)base)->worker;
}

static const char *rs_err(const source *base)
{
    return ((const rs_source *)base)->err;
}

static void rs_where(const source *base, const nd_line *l, char *buf,
                     size_t n)
{
    const rs_source *s = (const rs_source *)base;
    snprintf(buf, n, "%s entry %" PRIu64 "-%" PRIu64, s->u.display, l->end,
             l->lineno);
}

static uint64_t rs_lost(source *base)
{
    rs_source *s = (rs_source *)base;
    uint64_t n = s->trimmed;
    s->trimmed = 0;
    return n;
}

/* Queue an ID (text) for XACK: ackv holds "XACK", the stream, the group,
 * then the IDs, as offsets into ackids until sent. 0 or -1. */
static int queue_ack(rs_source *s, const char *id, size_t n)
{
    if (s->nack + 4 > s->capack) {
        size_t cap = s->capack ? 2 * s->capack : 1024;
        const char **v = realloc(s->ackv, cap * sizeof *v);
        if (v)
            s->ackv = v;
        size_t *l = v ? realloc(s->ackl, cap * sizeof *l) : NULL;
        if (!l)
            return -1;
        s->ackl = l;
        s->capack = cap;
    }
    if (!s->nack)
        s->ackids.len = 0;
    size_t off = s->ackids.len;
    if (cli_buf_add(&s->ackids, id, n))
        return -1;
    s->ackv[s->nack + 3] = (const char *)(uintptr_t)off;
    s->ackl[s->nack + 3] = n;
    s->nack++;
    return 0;
}

static int rs_ack(source *base, const nd_line *l)
{
    rs_source *s = (rs_source *)base;
    char id[RS_ID_MAX];
    size_t n = rs_id_format(id, l->end, l->lineno);
    if (queue_ack(s, id, n))
        return cli_fail(s->cmd, "out of memory"), -1;
    return 0;
}

/* Joined: the XACKs queued with the checkpoint, ACK_CHUNK IDs each (a
 * script passes a command's arguments through Lua's stack). 0 or -1
 * with s->err set. */
#define ACK_CHUNK 1000
static int queue_acks(rs_source *s)
{
    const char *hv[3] = {s->ackv[0], s->ackv[1], s->ackv[2]};
    size_t hl[3] = {s->ackl[0], s->ackl[1], s->ackl[2]};
    for (size_t i = 0; i < s->nack; i += ACK_CHUNK) {
        size_t n = s->nack - i < ACK_CHUNK ? s->nack - i : ACK_CHUNK, at;
        /* The command's head goes just before its IDs, over the last
         * IDs of the chunk before (queued already). */
        for (int j = 0; j < 3; j++)
            s->ackv[i + j] = hv[j], s->ackl[i + j] = hl[j];
        int rc = idem_checkpoint_write(s->st, (int)n + 3, &s->ackv[i],
                                       &s->ackl[i], 1, &at);
        if (rc) {
            snprintf(s->err, sizeof s->err, "%.400s: queueing XACK with the "
                     "checkpoint: %.1000s", s->u.display,
                     idem_errdetail(s->st));
            s->nack = 0;
            return -1;
        }
    }
    s->nack = 0;
    return 0;
}

/* The answer of the XACK in flight, if one is: 0, or -1 after putting
 * its IDs back in the queue, to go again with the next ones. */
static int ack_answer(rs_source *s)
{
    if (!s->acks_out)
        return 0;
    s->acks_out = 0;
    void *rv = NULL;
    int ok = s->ack.c && redisGetReply(s->ack.c, &rv) == REDIS_OK &&
             ((redisReply *)rv)->type == REDIS_REPLY_INTEGER;
    if (rv)
        freeReplyObject(rv);
    else
        rs_conn_close(&s->ack);  /* no answer: the connection is spent */
    if (ok)
        return 0;
    for (size_t at = 0; at < s->sent.len;) {
        size_t n = strlen(s->sent.p + at);
        if (queue_ack(s, s->sent.p + at, n))
            break;  /* those left stay pending: duplicates later */
        at += n + 1;
    }
    return -1;
}

/* Send the XACK built in ackv without waiting for its answer (read by
 * ack_answer at the next flush); its IDs are kept until then. 0, or -1
 * when it could not be sent whole. */
static int send_unanswered(rs_source *s)
{
    rs_conn *c = &s->ack;
    int done = 0;
    if (rs_conn_ready(c) ||
        redisAppendCommandArgv(c->c, (int)(s->nack + 3), s->ackv,
                               s->ackl) != REDIS_OK)
        return -1;
    while (!done)
        if (redisBufferWrite(c->c, &done) != REDIS_OK) {
            rs_conn_close(c);
            return -1;
        }
    s->sent.len = 0;
    for (size_t i = 0; i < s->nack; i++)
        if (cli_buf_add(&s->sent, s->ackv[i + 3], s->ackl[i + 3]) ||
            cli_buf_add(&s->sent, "", 1))
            break;  /* those not kept are not sent again on a failure */
    s->acks_out = 1;
    cli_kill_point("acks-sent");  /* before their answer */
    return 0;
}

/* XACK what is queued (joined: with the checkpoint); 0 or -1 with s->err
 * set.
 *
 * An acknowledgement is not waited for: the XACK of one commit is sent,
 * and its answer read with the next commit's (or when the source
 * closes), so that the committing thread does not spend a round trip on
 * it per batch. This only moves when an entry is forgotten, never before
 * its commit: ack_flush runs after the commit that covers the entries
 * (stream.c), and the XACK is sent then. An XACK lost (a kill -9 just
 * after it was sent, a connection lost, a MOVED or other error for an
 * answer) leaves its entries pending, which is safe: they come again,
 * their keys committed, as duplicates, and are acknowledged then. A
 * failed one is sent again at once with the next, through rs_call
 * (which follows a redirect and connects again), waiting for its
 * answer; so does the last one (wait) before the source closes. */
static int send_acks(rs_source *s, int wait)
{
    int failed_before = ack_answer(s) != 0;
    if (!s->nack)
        return 0;
    s->ackv[0] = "XACK", s->ackl[0] = 4;
    s->ackv[1] = s->u.stream, s->ackl[1] = s->u.streamlen;
    s->ackv[2] = s->u.group, s->ackl[2] = strlen(s->u.group);
    for (size_t i = 0; i < s->nack; i++)
        s->ackv[i + 3] = s->ackids.p + (uintptr_t)s->ackv[i + 3];
    if (s->st)
        return queue_acks(s);
    if (!wait && !failed_before && send_unanswered(s) == 0) {
        s->nack = 0;
        return 0;
    }
    redisReply *r = rs_call(&s->ack, (int)(s->nack + 3), s->ackv, s->ackl,
                            0, 1);
    int bad = !r || r->type == REDIS_REPLY_ERROR;
    if (bad)
        snprintf(s->err, sizeof s->err, "%.400s: XACK: %.1000s",
                 s->u.display, r ? r->str : s->ack.err);
    if (r)
        freeReplyObject(r);
    s->nack = 0;
    return bad ? -1 : 0;
}

static int flush_acks(rs_source *s, int wait)
{
    if (send_acks(s, wait) == 0)
        return 0;
    fprintf(stderr, "idem %s: %s; the entries stay pending and come again "
            "as duplicates\n", s->cmd, s->err);
    return -1;
}

static int rs_ack_flush(source *base)
{
    return flush_acks((rs_source *)base, 0);
}

static int rs_join(source *base, idem_store *st)
{
    rs_source *s = (rs_source *)base;
    s->st = rs_on_store(&s->u, st) ? st : NULL;
    return s->st != NULL;
}

/* An entry gone from the stream is acknowledged by the reader:
 * nothing will ever bring its fields back. Its ID is kept until the
 * reply it came in is let go (the reader's replies share an arena:
 * rconn.h), then the reply's go in one XACK (ack_trimmed). 0 or -1. */
static int note_trimmed(rs_source *s, const redisReply *id)
{
    s->trimmed++;
    return cli_buf_add(&s->trim_ids, id->str, id->len) ||
                   cli_buf_add(&s->trim_ids, "", 1)
               ? -1
               : 0;
}

/* The XACK of the entries noted trimmed, after a read that returned
 * `got`: got, or ND_ERR when the XACK failed. */
static long ack_trimmed(rs_source *s, long got)
{
    size_t n = 0;
    for (size_t at = 0; at < s->trim_ids.len; at++)
        n += s->trim_ids.p[at] == '\0';
    const char **v = n && got >= 0 ? malloc((n + 3) * sizeof *v) : NULL;
    size_t *l = v ? malloc((n + 3) * sizeof *l) : NULL;
    if (n && got >= 0 && !l)
        got = failed(s, "acknowledging trimmed entries (out of memory)",
                     NULL);
    if (l) {
        v[0] = "XACK", l[0] = 4;
        v[1] = s->u.stream, l[1] = s->u.streamlen;
        v[2] = s->u.group, l[2] = strlen(s->u.group);
        size_t at = 0;
        for (size_t i = 3; i < n + 3; i++) {
            v[i] = s->trim_ids.p + at;
            l[i] = strlen(v[i]);
            at += l[i] + 1;
        }
        redisReply *r = rs_call(&s->rd, (int)(n + 3), v, l, 0, 1);
        if (!r || r->type == REDIS_REPLY_ERROR)
            got = failed(s, "XACK of trimmed entries", r);
        rs_reply_free(&s->rd, r);
    }
    free(v);
    free(l);
    s->trim_ids.len = 0;
    return got;
}

/* One XPENDING line [id, consumer, idle, deliveries] into d. 0 or -1. */
static int delivery_of(const redisReply *e, uint64_t now, struct delivery *d)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 4 ||
        e->element[0]->type != REDIS_REPLY_STRING ||
        e->element[2]->type != REDIS_REPLY_INTEGER ||
        e->element[3]->type != REDIS_REPLY_INTEGER ||
        rs_id_parse(e->element[0]->str, e->element[0]->len, &d->ms, &d->seq))
        return -1;
    uint64_t idle = (uint64_t)e->element[2]->integer;
    /* Delivered once: then, at the earliest (TIME came first). */
    d->since = e->element[3]->integer == 1 && now > idle ? now - idle
                                                         : d->ms;
    return 0;
}

/* Before a round of entries handed out before (from `start` on, idle for
 * `idle` ms or more; `own`: this consumer's): when each was first
 * delivered, into s->dlv. A failure only leaves the list empty: the
 * entries' own times are the bound then, which is safe. */
static void deliveries(rs_source *s, const char *start, const char *idle,
                       int own)
{
    char count[24];
    snprintf(count, sizeof count, "%" PRIu64, s->batch);
    const char *argv[9] = {"XPENDING", s->u.stream, s->u.group};
    size_t lens[9] = {8, s->u.streamlen, strlen(s->u.group)};
    int n = 3;
    if (idle) {
        argv[n] = "IDLE", lens[n++] = 4;
        argv[n] = idle, lens[n++] = strlen(idle);
    }
    argv[n] = start, lens[n++] = strlen(start);
    argv[n] = "+", lens[n++] = 1;
    argv[n] = count, lens[n++] = strlen(count);
    if (own)
        argv[n] = s->u.consumer, lens[n++] = strlen(s->u.consumer);
    s->ndlv = 0;
    uint64_t now = 0;
    redisReply *r = rs_server_ms(&s->rd, &now) == 0
                        ? rs_call(&s->rd, n, argv, lens, 0, 1) : NULL;
    struct delivery *d = r && r->type == REDIS_REPLY_ARRAY && r->elements
                             ? realloc(s->dlv, r->elements * sizeof *d)
                             : NULL;
    if (d)
        s->dlv = d;
    for (size_t i = 0; d && i < r->elements; i++)
        if (delivery_of(r->element[i], now, &d[s->ndlv]) == 0)
            s->ndlv++;
    rs_reply_free(&s->rd, r);
}

static int by_id(const void *a, const void *b)
{
    const struct delivery *x = a, *y = b;
    return x->ms != y->ms ? (x->ms < y->ms ? -1 : 1)
                          : (x->seq > y->seq) - (x->seq < y->seq);
}

/* The earliest time the output of entry ms-seq, handed out before, can
 * have been written. s->dlv is in ID order, as XPENDING lists. */
static uint64_t since_of(const rs_source *s, uint64_t ms, uint64_t seq)
{
    struct delivery want = {ms, seq, 0};
    const struct delivery *d =
        s->ndlv ? bsearch(&want, s->dlv, s->ndlv, sizeof *d, by_id) : NULL;
    uint64_t t = d && d->since > ms ? d->since : ms;
    return t ? t : 1;
}

/* Entry e's fields f ([f, v, ...]) to c, as a JSON object (*len bytes)
 * and then as META_FIELD records. 0 or -1. */
static int add_fields(chunk *c, const redisReply *f, size_t *len)
{
    size_t off = c->text.len;
    int rc = cli_buf_add(&c->text, "{", 1);
    for (size_t i = 0; !rc && i + 1 < f->elements; i += 2) {
        const redisReply *k = f->element[i], *v = f->element[i + 1];
        rc = (i && cli_buf_add(&c->text, ",", 1)) ||
             cli_buf_json_string(&c->text, k->str, k->len) ||
             cli_buf_add(&c->text, ":", 1) ||
             cli_buf_json_string(&c->text, v->str, v->len);
    }
    rc = rc || cli_buf_add(&c->text, "}", 1);
    *len = c->text.len - off;
    for (size_t i = 0; !rc && i + 1 < f->elements; i += 2) {
        const redisReply *k = f->element[i], *v = f->element[i + 1];
        rc = meta_add(&c->text, META_FIELD, k->str, k->len, v->str, v->len);
    }
    return rc ? -1 : 0;
}

/* Append entry e ([id, [f, v, ...]]) to c as a JSON line with its fields
 * as meta; a trimmed entry (no fields) is acknowledged at once instead.
 * 0 or -1. */
static int add_entry(rs_source *s, chunk *c, const redisReply *e,
                     int again)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
        e->element[0]->type != REDIS_REPLY_STRING)
        return -1;
    const redisReply *id = e->element[0], *f = e->element[1];
    uint64_t ms, seq;
    if (rs_id_parse(id->str, id->len, &ms, &seq))
        return -1;
    if (f->type != REDIS_REPLY_ARRAY)
        return note_trimmed(s, id);
    size_t off = c->text.len, len;
    if (add_fields(c, f, &len))
        return -1;
    c->lines[c->n++] = (nd_line){.p = (const char *)(uintptr_t)off,
                                 .len = len, .lineno = seq, .end = ms,
                                 .again = again,
                                 .meta = (const char *)(uintptr_t)(off + len),
                                 .metalen = c->text.len - off - len,
                                 .since = again ? since_of(s, ms, seq) : 0};
    return 0;
}

/* The entries array of one reply into a new chunk (`again`: entries
 * handed out before). Returns how many lines it holds, or -1. */
static long take_entries(rs_source *s, const redisReply *arr, int again)
{
    if (arr->type != REDIS_REPLY_ARRAY)
        return -1;
    chunk c = s->spare;
    s->spare = (chunk){0};
    if (c.cap < arr->elements + 1) {
        nd_line *v = realloc(c.lines, (arr->elements + 1) * sizeof *v);
        if (!v) {
            chunk_free(&c);
            return -1;
        }
        c.lines = v;
        c.cap = arr->elements + 1;
    }
    int rc = 0;
    for (size_t i = 0; !rc && i < arr->elements; i++)
        rc = add_entry(s, &c, arr->element[i], again);
    for (size_t i = 0; !rc && i < c.n; i++) {
        nd_line *l = &c.lines[i];
        l->p = c.text.p + (uintptr_t)l->p;
        l->meta = c.text.p + (uintptr_t)l->meta;
    }
    chunk *v = rc || !c.n ? NULL
               : realloc(s->chunks, (s->nchunks + 1) * sizeof *v);
    if (!v) {
        long got = rc || c.n ? -1 : 0;
        chunk_done(s, &c);
        return got;
    }
    s->chunks = v;
    s->chunks[s->nchunks++] = c;
    s->handed = 0;
    return (long)c.n;
}

/* A reply to a command that hands entries to this consumer (XREADGROUP
 * ">", XAUTOCLAIM) was lost: the server may have run it, so that entries
 * now wait in this consumer's pending list that nothing here has seen.
 * Sent again, the command would hand out the next ones instead, and
 * those would be left behind until a later run, out of order. So the
 * pending list is read again, after `after` (NULL: after own_cursor):
 * its entries come in order, and those already in hand come again as
 * duplicates. 0. */
static long lost_delivery(rs_source *s, const char *after)
{
    if (after)
        snprintf(s->own_cursor, sizeof s->own_cursor, "%s", after);
    s->own_done = 0;
    return 0;
}

/* XREADGROUP ... STREAMS stream `from`; block_ms < 0: no BLOCK. The
 * entries read, 0 when none, or ND_ERR. from is ">" (new entries) or
 * own_cursor (this consumer's pending list, after that ID). */
static long read_group(rs_source *s, const char *from, int64_t block_ms)
{
    int fresh = !strcmp(from, ">");
    char count[24], block[24];
    snprintf(count, sizeof count, "%" PRIu64, s->batch);
    snprintf(block, sizeof block, "%" PRId64, block_ms);
    const char *argv[11] = {"XREADGROUP", "GROUP", s->u.group,
                            s->u.consumer, "COUNT", count};
    size_t lens[11] = {10, 5, strlen(s->u.group), strlen(s->u.consumer), 5,
                       strlen(count)};
    int n = 6;
    if (block_ms >= 0) {
        argv[n] = "BLOCK", lens[n++] = 5;
        argv[n] = block, lens[n++] = strlen(block);
    }
    argv[n] = "STREAMS", lens[n++] = 7;
    argv[n] = s->u.stream, lens[n++] = s->u.streamlen;
    argv[n] = from, lens[n++] = strlen(from);
    redisReply *r = rs_call(&s->rd, n, argv, lens,
                            block_ms > 0 ? block_ms : 0, !fresh);
    long got = 0;
    if (!r && fresh)
        got = lost_delivery(s, NULL);
    else if (!r || r->type == REDIS_REPLY_ERROR)
        got = failed(s, "XREADGROUP", r);
    else if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
             r->element[0]->elements == 2) {
        /* The last ID handed out in order: what a lost delivery
         * follows. */
        const redisReply *entries = r->element[0]->element[1];
        if (entries->elements) {
            const redisReply *last = entries->element[entries->elements - 1];
            snprintf(s->own_cursor, sizeof s->own_cursor, "%.*s",
                     (int)last->element[0]->len, last->element[0]->str);
        }
        got = take_entries(s, entries, !fresh);
        if (got < 0)
            got = failed(s, "reading entries (out of memory, or a reply "
                         "that is not a stream's)", NULL);
    }
    rs_reply_free(&s->rd, r);
    return ack_trimmed(s, got);
}

/* XAUTOCLAIM of entries idle longer than the lease. */
static long claim_idle(rs_source *s)
{
    char idle[24], count[24];
    snprintf(idle, sizeof idle, "%" PRId64, s->lease_ms);
    snprintf(count, sizeof count, "%" PRIu64, s->batch);
    const char *argv[] = {"XAUTOCLAIM", s->u.stream, s->u.group,
                          s->u.consumer, idle, s->claim_cursor, "COUNT",
                          count};
    size_t lens[] = {10, s->u.streamlen, strlen(s->u.group),
                     strlen(s->u.consumer), strlen(idle),
                     strlen(s->claim_cursor), 5, strlen(count)};
    deliveries(s, s->claim_cursor, idle, 0);
    redisReply *r = rs_call(&s->rd, 8, argv, lens, 0, 0);
    long got = 0;
    if (!r)
        got = lost_delivery(s, "0");  /* claimed entries may be older */
    else if (r->type == REDIS_REPLY_ERROR || r->type != REDIS_REPLY_ARRAY ||
             r->elements < 2)
        got = failed(s, "XAUTOCLAIM", r && r->type == REDIS_REPLY_ERROR
                                           ? r : NULL);
    else {
        snprintf(s->claim_cursor, sizeof s->claim_cursor, "%.*s",
                 (int)r->element[0]->len, r->element[0]->str);
        if (r->elements > 2 && r->element[2]->type == REDIS_REPLY_ARRAY)
            s->trimmed += r->element[2]->elements;
        got = take_entries(s, r->element[1], 1);
        if (got < 0)
            got = failed(s, "reading claimed entries", NULL);
    }
    if (!strcmp(s->claim_cursor, "0-0"))
        s->next_claim_ms = cli_mono_ms() + s->lease_ms / 2;
    rs_reply_free(&s->rd, r);
    return ack_trimmed(s, got);
}

/* Round 1 while it lasts: this consumer's pending list, after
 * own_cursor. Entries read, 0 once it is over, or ND_ERR. */
static long own_round(rs_source *s)
{
    if (s->own_done)
        return 0;
    char start[50];
    snprintf(start, sizeof start, "%s%s", strcmp(s->own_cursor, "0") ? "("
                                                                     : "",
             strcmp(s->own_cursor, "0") ? s->own_cursor : "-");
    deliveries(s, start, NULL, 1);
    long got = read_group(s, s->own_cursor, -1);
    s->own_done = got == 0;
    return got;
}

/* One round: own pending first, then idle ones now and then, then new
 * ones (blocking when wait); after a lost delivery, own pending again at
 * once. Entries read, 0, or ND_ERR. */
static long fetch_round(rs_source *s, int wait)
{
    long got = own_round(s);
    if (!got && cli_mono_ms() >= s->next_claim_ms)
        got = claim_idle(s);
    if (!got && s->own_done)
        got = read_group(s, ">", wait ? BLOCK_SLICE_MS : -1);
    return got ? got : own_round(s);
}

/* A round, and the clock of --idle-exit: anything read restarts it. */
static long fetch(rs_source *s, int wait)
{
    long got = fetch_round(s, wait);
    if (got > 0)
        s->last_new_ms = cli_mono_ms();
    return got;
}

static int rs_next(source *base, nd_line *l, int wait)
{
    rs_source *s = (rs_source *)base;
    for (;;) {
        chunk *c = s->nchunks ? &s->chunks[s->nchunks - 1] : NULL;
        if (c && s->handed < c->n) {
            *l = c->lines[s->handed++];
            return ND_LINE;
        }
        if (*s->stop)
            return ND_IDLE;  /* the caller sees the stop */
        long got = fetch(s, wait);
        if (got < 0)
            return ND_ERR;
        if (got)
            continue;
        if (s->idle_exit_ms &&
            cli_mono_ms() - s->last_new_ms >= s->idle_exit_ms) {
            cli_kill_point("idle-exit");
            /* A stop signal in the last wait is a stop (130 after
             * SIGINT), not an idle exit. */
            return *s->stop ? ND_IDLE : ND_END;
        }
        if (!wait)
            return ND_IDLE;
    }
}

static long long rs_lag(source *base)
{
    rs_source *s = (rs_source *)base;
    const char *argv[] = {"XINFO", "GROUPS", s->u.stream};
    size_t lens[] = {5, 6, s->u.streamlen};
    redisReply *r = rs_call(&s->rd, 3, argv, lens, 0, 1);
    long long lag = -1;
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements;
         i++) {
        const redisReply *g = r->element[i];
        int ours = 0;
        for (size_t j = 0; g->type == REDIS_REPLY_ARRAY && j + 1 < g->elements;
             j += 2) {
            const redisReply *k = g->element[j], *v = g->element[j + 1];
            if (k->type != REDIS_REPLY_STRING)
                continue;
            if (!strcmp(k->str, "name") && v->type == REDIS_REPLY_STRING)
                ours = !strcmp(v->str, s->u.group);
            if (ours && !strcmp(k->str, "lag") &&
                v->type == REDIS_REPLY_INTEGER)
                lag = v->integer;
        }
    }
    rs_reply_free(&s->rd, r);
    return lag;
}

/* Its reads block in short slices and look at the stop themselves. */
static int rs_wait(source *base)
{
    return *((rs_source *)base)->stop != 0;
}

static const source_ops rs_source_ops = {
    .next = rs_next, .release = rs_release, .wait = rs_wait,
    .err = rs_err, .where = rs_where, .ack = rs_ack,
    .ack_flush = rs_ack_flush, .join = rs_join, .lag = rs_lag, .lost = rs_lost,
    .worker = rs_worker, .close = rs_close};
