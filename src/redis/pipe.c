/* redis/pipe.c - batches of script calls, pipelined per node, retried
 * through redirects and failures within a time budget.
 *
 * Every operation of the Redis backends is a batch of commands, each an
 * EVALSHA of a script from scripts.c, run in rounds:
 *
 *   1. each pending command goes to the connection of the node that owns
 *      its key's slot (a single server owns them all); a connection that
 *      has not loaded the scripts gets SCRIPT LOAD first in the same
 *      pipeline, a command redirected by ASK gets ASKING before it;
 *   2. with wait=N, every connection that carried writes ends its
 *      pipeline with WAIT N, so a write counts as done only once N
 *      replicas have it;
 *   3. every connection's pipeline is written out, then the replies are
 *      read back in order: one round trip per node however many keys;
 *   4. commands whose reply says "not here, not now" (MOVED, ASK,
 *      TRYAGAIN, CLUSTERDOWN, LOADING, NOSCRIPT, a refused or broken
 *      connection) stay pending for the next round, after a backoff when
 *      waiting can help and after reloading the slot map when the
 *      cluster changed shape.
 *
 * The rounds stop when every command has its answer or the call's time
 * budget (timeout_ms) is spent; commands still pending then fail with
 * IDEM_ECONN or IDEM_ETIMEOUT. So a call never hangs, and a failover
 * that completes within the budget is invisible to the caller.
 *
 * Retrying a command whose connection broke after it was sent may run it
 * twice. Reads are harmless; claims, completes and fails carry a request
 * id that makes the second run answer like the first (see
 * scripts.c); extend is harmless to repeat. forget is not: a
 * repeated forget answers IDEM_ENOTFOUND for the record it deleted.
 *
 * Claims and completes take many keys per EVALSHA (up to IDEM__GROUP of
 * them, all of one slot on a cluster): a script call has a fixed cost on
 * the server (parsing, setting up KEYS/ARGV, the reply) that is larger
 * than the work for one key, and sharing it is what brings a claim close
 * to the cost of a plain SET NX. A key that is not an idem record (a
 * string written by hand, say) stops such a script with WRONGTYPE; the
 * group is then sent again one key per call, so that key alone fails and
 * the keys done before it answer the same by their request ids. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redis.h"

/* Bytes of arguments per multi-key call (keys: IDEM__GROUP). */
#define IDEM__GROUP_BYTES (1u << 20)
/* Bytes of commands a connection buffers before it starts sending. */
#define IDEM__EARLY_FLUSH 8192u

static idem__redis *idem__r(idem_store *s)
{
    return s->impl;
}

int idem__batch_init(idem_store *s, idem__rbatch *b, int script, size_t n)
{
    memset(b, 0, sizeof *b);
    b->script = script;
    b->multi = script == IDEM__S_CLAIM || script == IDEM__S_COMPLETE ||
               script == IDEM__S_CLAIM_DONE || script == IDEM__S_EXTEND;
    /* Checkpoint scripts name their key whole, in any layout. */
    b->raw = script == IDEM__S_CKPT_PUT || script == IDEM__S_CKPT_GET ||
             script == IDEM__S_CKPT_CLEAR || script == IDEM__S_CKPT_COMMIT;
    b->items = calloc(n ? n : 1, sizeof *b->items);
    b->order = calloc(n ? n : 1, sizeof *b->order);
    b->cmds = calloc(n ? n : 1, sizeof *b->cmds);
    if (!b->items || !b->order || !b->cmds) {
        idem__batch_free(b);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    int64_t now = idem__now(s);
    if (s->opts.clock)
        snprintf(b->now, sizeof b->now, "%lld", (long long)now);
    /* The buckets named run from days + 1 before the client's day to
     * the day after it: the script finds today and the days before it
     * among them for a server clock up to a day off the client's. */
    int64_t today = now / IDEM__DAY_MS - (now % IDEM__DAY_MS < 0);
    b->day0 = today - idem__r(s)->cfg.days - 1;
    return 0;
}

void idem__batch_free(idem__rbatch *b)
{
    for (size_t i = 0; b->cmds && i < b->n; i++)
        if (b->cmds[i].reply)
            freeReplyObject(b->cmds[i].reply);
    free(b->cmds);
    free(b->items);
    free(b->order);
    idem__buf_free(&b->names);
    idem__buf_free(&b->buckets);
    memset(b, 0, sizeof *b);
}

/* Day layout: the key is a field of its shard's buckets. The shard is a
 * hash of the key's bytes, and is part of the data's format. */
static void idem__item_day(idem__redis *r, idem__ritem *it, const void *key,
                           size_t keylen)
{
    it->shard = idem__crc16(key, keylen) % (unsigned)r->cfg.shards;
    it->slot = r->cfg.tag_slots[it->shard];
}

/* The slot of a key named in full (b->names from name_off on). */
static void idem__item_slot(const idem__redis *r, const idem__rbatch *b,
                            idem__ritem *it)
{
    /* On a single server "slot" only picks one of the pool's
     * connections: any key may share a script call with any other, but
     * a key given twice must go down the same connection to keep its
     * order. */
    unsigned slot = r->cfg.cluster || r->cfg.pool > 1
                        ? idem__key_slot(b->names.data + it->name_off,
                                         it->name_len)
                        : 0;
    it->slot = r->cfg.cluster ? slot : slot % (unsigned)r->cfg.pool;
}

int idem__record_name(const idem__redis *r, idem__buf *out, const void *key,
                      size_t keylen)
{
    /* PREFIX{KEY}: the braces make KEY the hash tag, so all of a key's
     * commands land on one slot whatever the prefix. A KEY holding '}'
     * is still stored under its exact bytes; its tag then ends at its
     * first '}', which only changes which slot it shares. */
    return idem__buf_append(out, r->cfg.prefix, r->cfg.prefixlen) ||
                   idem__buf_append(out, "{", 1) ||
                   idem__buf_append(out, key, keylen) ||
                   idem__buf_append(out, "}", 1)
               ? IDEM_ENOMEM
               : 0;
}

idem__ritem *idem__item_add(idem_store *s, idem__rbatch *b, const void *key,
                            size_t keylen)
{
    idem__redis *r = idem__r(s);
    idem__ritem *it = &b->items[b->nitems];
    int day = r->cfg.layout == IDEM__LAYOUT_DAY && !b->raw;
    int wrap = !day && !b->raw;
    memset(it, 0, sizeof *it);
    it->name_off = b->names.len;
    if (wrap ? idem__record_name(r, &b->names, key, keylen)
             : idem__buf_append(&b->names, key, keylen))
        return NULL;
    it->name_len = b->names.len - it->name_off;
    b->nitems++;
    if (day)
        idem__item_day(r, it, key, keylen);
    else
        idem__item_slot(r, b, it);
    return it;
}

void idem__arg(idem__ritem *it, const void *p, size_t n)
{
    it->arg[it->nargs] = p ? p : "";
    it->argl[it->nargs++] = n;
}

void idem__argnum(idem__ritem *it, int slot, long long v)
{
    int n = snprintf(it->num[slot], sizeof it->num[slot], "%lld", v);
    idem__arg(it, it->num[slot], (size_t)n);
}

size_t idem__rid(idem_store *s, char buf[24])
{
    idem__redis *r = idem__r(s);
    int n = snprintf(buf, 24, "%016llx%llx", (unsigned long long)r->rid_base,
                     (unsigned long long)r->rid_next++);
    return n >= 24 ? 23 : (size_t)n;
}

void idem__argrid(idem_store *s, idem__ritem *it, int slot)
{
    size_t n = idem__rid(s, it->num[slot]);
    idem__arg(it, it->num[slot], n);
}

void idem__batch_common(idem__rbatch *b, int slot, long long v)
{
    int n = snprintf(b->cnum[slot], sizeof b->cnum[slot], "%lld", v);
    b->common[b->ncommon] = b->cnum[slot];
    b->commonl[b->ncommon++] = (size_t)n;
}

/* Order the items by slot, keeping the caller's order within a slot (a
 * key given twice is claimed in that order): a counting sort over the
 * 16384 slots, O(n) and with no shared state. */
static int idem__sort_slots(idem__rbatch *b)
{
    uint32_t *start = calloc(IDEM__SLOTS + 1, sizeof *start);
    if (!start)
        return IDEM_ENOMEM;
    for (size_t i = 0; i < b->nitems; i++)
        start[b->items[i].slot + 1]++;
    for (size_t k = 0; k < IDEM__SLOTS; k++)
        start[k + 1] += start[k];
    for (size_t i = 0; i < b->nitems; i++)
        b->order[start[b->items[i].slot]++] = i;
    free(start);
    return 0;
}

/* Group the items into commands: one per item, or for multi-key scripts
 * up to IDEM__GROUP items of one slot per command. */
static int idem__group(idem__rbatch *b)
{
    for (size_t i = 0; i < b->nitems; i++)
        b->order[i] = i;
    if (b->multi && b->nitems > 1) {
        int differ = 0;
        for (size_t i = 1; i < b->nitems && !differ; i++)
            differ = b->items[i].slot != b->items[0].slot;
        if (differ && idem__sort_slots(b))
            return IDEM_ENOMEM;
    }
    b->n = 0;
    for (size_t i = 0; i < b->nitems;) {
        idem__rcmd *c = &b->cmds[b->n++];
        memset(c, 0, sizeof *c);
        c->first = i;
        c->slot = b->items[b->order[i]].slot;
        c->ask = -1;
        size_t bytes = 0;
        do {
            const idem__ritem *it = &b->items[b->order[i]];
            for (int k = 0; k < it->nargs; k++)
                bytes += it->argl[k];
            i++;
        } while (b->multi && i < b->nitems && i - c->first < IDEM__GROUP &&
                 bytes < IDEM__GROUP_BYTES &&
                 b->items[b->order[i]].slot == c->slot);
        c->count = i - c->first;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Rounds */

typedef struct idem__active {
    size_t node, conn;
} idem__active;

static idem__rconn *idem__conn_at(idem__redis *r, idem__active a)
{
    return &r->nodes[a.node].conns[a.conn];
}

static void idem__final(idem__rbatch *b, idem__rcmd *c, int code,
                        const char *msg)
{
    c->done = 1;
    c->status = code;
    if (c->reply && code) {
        freeReplyObject(c->reply);
        c->reply = NULL;
    }
    if (code && !b->firstmsg[0])
        idem__scopy(b->firstmsg, sizeof b->firstmsg, msg);
}

/* Take back every command of a connection that broke: unless its answer
 * is final already, it goes round again. */
static void idem__requeue_conn(idem__rbatch *b, idem__rconn *conn, int code,
                               const char *msg)
{
    for (size_t j = 0; j < conn->nin; j++) {
        if (conn->in[j].kind != IDEM__IN_CMD)
            continue;
        idem__rcmd *c = &b->cmds[conn->in[j].cmd];
        if (c->done)
            continue;
        if (c->reply) {
            freeReplyObject(c->reply);
            c->reply = NULL;
        }
        c->lasterr = code;
    }
    idem__scopy(b->lastmsg, sizeof b->lastmsg, msg);
}

int idem__transient(const char *e)
{
    static const char *const words[] = {"TRYAGAIN", "CLUSTERDOWN",
                                        "LOADING", "BUSY ", "MASTERDOWN",
                                        "READONLY"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (strncmp(e, words[i], strlen(words[i])) == 0)
            return 1;
    return 0;
}

typedef struct idem__round {
    int backoff;         /* something may get better by waiting */
    int fatal;           /* an error that ends the call for every key */
} idem__round;

/* A redirect of command c: MOVED or ASK. */
static void idem__on_redirect(idem_store *s, idem__rbatch *b, idem__rcmd *c,
                              const redisReply *rep, idem__round *rd)
{
    idem__redis *r = idem__r(s);
    char msg[sizeof b->firstmsg];
    if (!r->cfg.cluster) {
        snprintf(msg, sizeof msg, "%s: the server is a cluster node (%s): "
                 "use redis-cluster://", s->uri, rep->str);
        idem__final(b, c, IDEM_EPROTO, msg);
        return;
    }
    if (b->stay) {
        snprintf(msg, sizeof msg, "%s: %s", s->uri, rep->str);
        idem__final(b, c, IDEM_EPROTO, msg);
        c->moved = 1;
        return;
    }
    int is_ask;
    int node = idem__redirect(r, rep, &is_ask);
    if (node < 0) {
        r->map_stale = 1;
        rd->backoff = 1;
        c->lasterr = IDEM_EPROTO;
        snprintf(b->lastmsg, sizeof b->lastmsg, "%s: %s", s->uri, rep->str);
    } else if (is_ask) {
        c->ask = node;
    } else {
        r->map_stale = 1;
    }
}

/* A script over many keys stopped at a key that is not an idem record
 * (WRONGTYPE). Send each key on its own, so that only that key fails;
 * keys the script had already done answer the same again, by their
 * request ids. */
static void idem__split_cmd(idem__rbatch *b, idem__rcmd *c)
{
    for (size_t j = 1; j < c->count; j++) {
        idem__rcmd *d = &b->cmds[b->n++];
        memset(d, 0, sizeof *d);
        d->first = c->first + j;
        d->count = 1;
        d->slot = c->slot;
        d->ask = -1;
    }
    c->count = 1;
    c->lasterr = IDEM_EPROTO;
}

/* An error reply to command c: retried, split or final. */
static void idem__on_cmd_error(idem_store *s, idem__rbatch *b,
                               idem__rconn *conn, idem__rcmd *c,
                               const redisReply *rep, idem__round *rd)
{
    idem__redis *r = idem__r(s);
    const char *e = rep->str;
    char msg[sizeof b->firstmsg];
    snprintf(msg, sizeof msg, "%s: %s", s->uri, e);
    if (strncmp(e, "NOSCRIPT", 8) == 0) {
        conn->loaded = 0;
        c->lasterr = IDEM_EPROTO;
        idem__scopy(b->lastmsg, sizeof b->lastmsg, msg);
    } else if (strncmp(e, "MOVED ", 6) == 0 || strncmp(e, "ASK ", 4) == 0) {
        idem__on_redirect(s, b, c, rep, rd);
    } else if (idem__transient(e)) {
        rd->backoff = 1;
        if (strncmp(e, "READONLY", 8) == 0)
            r->map_stale = idem__has_map(r);
        c->lasterr = IDEM_ETIMEOUT;
        idem__scopy(b->lastmsg, sizeof b->lastmsg, msg);
    } else if (strncmp(e, "NOAUTH", 6) == 0 ||
               strncmp(e, "WRONGPASS", 9) == 0) {
        idem__final(b, c, IDEM_EAUTH, msg);
        rd->fatal = IDEM_EAUTH;
    } else if (c->count > 1) {
        idem__split_cmd(b, c);
    } else {
        /* The script failed, e.g. WRONGTYPE: the key holds something
         * that is not an idem record. This key alone fails. */
        idem__final(b, c, IDEM_EPROTO, msg);
    }
}

/* Handle reply `rep` to command cmdi, sent on conn. */
static void idem__on_cmd_reply(idem_store *s, idem__rbatch *b,
                               idem__rconn *conn, size_t cmdi,
                               redisReply *rep, idem__round *rd)
{
    idem__redis *r = idem__r(s);
    idem__rcmd *c = &b->cmds[cmdi];
    if (rep->type != REDIS_REPLY_ERROR) {
        c->reply = rep;
        if (!r->cfg.wait || !b->write)
            c->done = 1;  /* else: done once WAIT confirms */
        return;
    }
    idem__on_cmd_error(s, b, conn, c, rep, rd);
    freeReplyObject(rep);
}

/* Make sure node's connection k is up; 0 or the error. */
static int idem__ensure_conn(idem_store *s, idem__rbatch *b, size_t node,
                             size_t k, int64_t left)
{
    idem__redis *r = idem__r(s);
    idem__rconn *conn = &r->nodes[node].conns[k];
    if (conn->c)
        return 0;
    /* One attempt per connection and round: a dead node owning many of
     * the batch's commands must not cost one connect timeout each. */
    if (conn->fail_round == r->round)
        return conn->fail_code;
    if (left <= 0)
        return IDEM_ETIMEOUT;
    int64_t ms = left < r->cfg.connect_ms ? left : r->cfg.connect_ms;
    int rc = idem__rconn_open(s, r, &r->nodes[node], conn, ms);
    if (rc) {
        idem__scopy(b->lastmsg, sizeof b->lastmsg, s->detail);
        conn->fail_round = r->round;
        conn->fail_code = rc;
    }
    return rc;
}

/* The names of shard's buckets for days day0 .. day0 + days + 2, all
 * of one length, into b->buckets: PREFIX YYYY-MM-DD:{TAG}. */
static int idem__bucket_names(idem__redis *r, idem__rbatch *b,
                              unsigned shard)
{
    b->buckets.len = 0;
    for (int d = 0; d < r->cfg.days + 3; d++) {
        time_t t = (time_t)((b->day0 + d) * (IDEM__DAY_MS / 1000));
        struct tm tm;
        char date[32];
        size_t dl = gmtime_r(&t, &tm) ? strftime(date, sizeof date,
                                                 "%Y-%m-%d", &tm) : 0;
        if (dl != 10)
            return -1;
        int n = snprintf(date + dl, sizeof date - dl, ":{%s}",
                         r->cfg.tags[shard]);
        if (idem__buf_append(&b->buckets, r->cfg.prefix, r->cfg.prefixlen) ||
            idem__buf_append(&b->buckets, date, dl + (size_t)n))
            return -1;
    }
    return 0;
}

/* Queue one command on conn's pipeline with the reply it is owed: kind,
 * and for IDEM__IN_CMD the command's index. 0 or IDEM_ENOMEM. */
static int idem__pipe_cmd(idem__rconn *conn, int kind, size_t cmd, int argc,
                          const char **argv, const size_t *lens)
{
    if (redisAppendCommandArgv(conn->c, argc, argv, lens) != REDIS_OK ||
        idem__rconn_expect(conn, kind, cmd))
        return IDEM_ENOMEM;
    return 0;
}

/* A connection that has not loaded the scripts gets SCRIPT LOAD of each
 * ahead of its first EVALSHA, in the same pipeline. */
static int idem__pipe_loads(const idem__redis *r, idem__rconn *conn)
{
    if (conn->loaded)
        return 0;
    for (int k = 0; k < IDEM__S_COUNT; k++) {
        const char *la[3] = {"SCRIPT", "LOAD",
                             idem__script_text(r->cfg.layout, k)};
        size_t ll[3] = {6, 4, strlen(la[2])};
        if (idem__pipe_cmd(conn, IDEM__IN_LOAD, 0, 3, la, ll))
            return IDEM_ENOMEM;
    }
    conn->loaded = 1;
    return 0;
}

/* A command that ASK redirected goes after ASKING, once. */
static int idem__pipe_asking(idem__rconn *conn, idem__rcmd *c)
{
    if (c->ask < 0)
        return 0;
    const char *aa[1] = {"ASKING"};
    size_t al[1] = {6};
    if (idem__pipe_cmd(conn, IDEM__IN_ASKING, 0, 1, aa, al))
        return IDEM_ENOMEM;
    c->ask = -1;
    return 0;
}

/* An EVALSHA's arguments as they are built, into b->argv and b->argl,
 * with room for the numbers among them. */
typedef struct idem__args {
    const char **v;
    size_t *l;
    int n;
    char num[4][24];
    int nnum;
} idem__args;

static void idem__push(idem__args *a, const void *p, size_t len)
{
    a->v[a->n] = p;
    a->l[a->n++] = len;
}

static void idem__push_num(idem__args *a, long long v)
{
    char *p = a->num[a->nnum++];
    int n = snprintf(p, sizeof a->num[0], "%lld", v);
    idem__push(a, p, (size_t)n);
}

/* The day layout's KEYS are the buckets of the shard of c's keys:
 * numkeys, the buckets, then ARGV now, day0, days and the number of
 * keys. */
static int idem__push_day_head(idem__redis *r, idem__rbatch *b,
                               const idem__rcmd *c, idem__args *a)
{
    int nb = r->cfg.days + 3;
    if (idem__bucket_names(r, b, b->items[b->order[c->first]].shard))
        return IDEM_ENOMEM;
    idem__push_num(a, nb);
    size_t one = b->buckets.len / (size_t)nb;
    for (int d = 0; d < nb; d++)
        idem__push(a, b->buckets.data + (size_t)d * one, one);
    idem__push(a, b->now, strlen(b->now));
    idem__push_num(a, b->day0);
    idem__push_num(a, r->cfg.days);
    idem__push_num(a, (long long)c->count);
    return 0;
}

/* What c's keys bring, in order: their names, or (own) the arguments
 * of their own. */
static void idem__push_items(const idem__rbatch *b, const idem__rcmd *c,
                             int own, idem__args *a)
{
    for (size_t j = 0; j < c->count; j++) {
        const idem__ritem *it = &b->items[b->order[c->first + j]];
        if (!own)
            idem__push(a, b->names.data + it->name_off, it->name_len);
        for (int k = 0; own && k < it->nargs; k++)
            idem__push(a, it->arg[k], it->argl[k]);
    }
}

/* EVALSHA sha numkeys KEYS... ARGV... of command c. The hash layout's
 * KEYS are the keys' names, and now starts ARGV; the day layout's are
 * buckets (above), and the names follow in ARGV. Then the arguments the
 * batch's keys share, then each key's own. */
static int idem__evalsha_args(idem__redis *r, idem__rbatch *b,
                              const idem__rcmd *c, idem__args *a)
{
    int day = r->cfg.layout == IDEM__LAYOUT_DAY && !b->raw;
    idem__push(a, "EVALSHA", 7);
    idem__push(a, r->shas[b->script], 40);
    if (day && idem__push_day_head(r, b, c, a))
        return IDEM_ENOMEM;
    if (!day)
        idem__push_num(a, (long long)c->count);
    idem__push_items(b, c, 0, a);
    if (!day)
        idem__push(a, b->now, strlen(b->now));
    for (int k = 0; k < b->ncommon; k++)
        idem__push(a, b->common[k], b->commonl[k]);
    idem__push_items(b, c, 1, a);
    return 0;
}

/* Step 1's writing of command i on conn: the scripts if conn lacks
 * them, ASKING if a redirect asks for it, then the EVALSHA. 0 or
 * IDEM_ENOMEM. */
static int idem__append_cmd(idem__redis *r, idem__rbatch *b, idem__rconn *conn,
                            size_t i)
{
    idem__rcmd *c = &b->cmds[i];
    idem__args a = {.v = b->argv, .l = b->argl};
    if (idem__pipe_loads(r, conn) || idem__pipe_asking(conn, c) ||
        idem__evalsha_args(r, b, c, &a) ||
        idem__pipe_cmd(conn, IDEM__IN_CMD, i, a.n, a.v, a.l))
        return IDEM_ENOMEM;
    conn->wrote |= b->write;
    return 0;
}

/* A connection broke (or timed out) this round: its commands go round
 * again, on a new connection, after a backoff and (cluster) a new map. */
static void idem__conn_broke(idem_store *s, idem__rbatch *b, idem__active a,
                             idem__round *rd)
{
    idem__redis *r = idem__r(s);
    idem__rconn *conn = idem__conn_at(r, a);
    char msg[sizeof b->lastmsg], why[96];
    snprintf(msg, sizeof msg, "%s: %s:%d: %s", s->uri, r->nodes[a.node].host,
             r->nodes[a.node].port, idem__rconn_why(conn, why, sizeof why));
    idem__requeue_conn(b, conn, idem__rconn_timed_out(conn) ? IDEM_ETIMEOUT
                                                            : IDEM_ECONN,
                       msg);
    idem__rconn_close(conn);
    r->map_stale = idem__has_map(r);
    rd->backoff = 1;
}

/* The reply to the WAIT after the first nin replies of conn: the
 * writes among them that answered are done if enough replicas have
 * them, else they fail with ETIMEOUT. */
static void idem__on_wait_reply(idem_store *s, idem__rbatch *b,
                                const idem__rconn *conn, size_t nin,
                                const redisReply *rep)
{
    idem__redis *r = idem__r(s);
    long long acked = rep->type == REDIS_REPLY_INTEGER ? rep->integer : -1;
    char msg[sizeof b->firstmsg];
    snprintf(msg, sizeof msg, "%s: WAIT %d: %s%lld replica(s) acknowledged "
             "in time", s->uri, r->cfg.wait, acked < 0 ? "failed, " : "only ",
             acked < 0 ? 0 : acked);
    /* A master that lost its replicas may have lost its place too (a
     * sentinel's master deposed while it was cut off): the next round
     * asks where the master is. */
    if (acked < r->cfg.wait)
        r->map_stale = idem__has_map(r);
    for (size_t k = 0; k < nin; k++) {
        if (conn->in[k].kind != IDEM__IN_CMD)
            continue;
        idem__rcmd *c = &b->cmds[conn->in[k].cmd];
        if (c->done || !c->reply)
            continue;
        if (acked >= r->cfg.wait)
            c->done = 1;
        else
            idem__final(b, c, IDEM_ETIMEOUT, msg);
    }
}

/* Read every reply a connection is owed this round. */
static void idem__read_conn(idem_store *s, idem__rbatch *b, idem__active a,
                            idem__round *rd)
{
    idem__redis *r = idem__r(s);
    idem__rconn *conn = idem__conn_at(r, a);
    for (size_t j = 0; j < conn->nin; j++) {
        redisReply *rep = NULL;
        if (redisGetReply(conn->c, (void **)&rep) != REDIS_OK || !rep) {
            idem__conn_broke(s, b, a, rd);
            return;
        }
        idem__inflight in = conn->in[j];
        if (in.kind == IDEM__IN_CMD) {
            /* A redirect may add a node and move r->nodes: look the
             * connection up again afterwards. */
            idem__on_cmd_reply(s, b, conn, in.cmd, rep, rd);
            conn = idem__conn_at(r, a);
            continue;
        }
        if (in.kind == IDEM__IN_WAIT)
            idem__on_wait_reply(s, b, conn, j, rep);
        /* SCRIPT LOAD or ASKING: an error shows up again as NOSCRIPT or
         * a redirect of the command that follows. */
        else if (in.kind == IDEM__IN_LOAD && rep->type == REDIS_REPLY_ERROR)
            conn->loaded = 0;
        freeReplyObject(rep);
    }
    conn->nin = 0;
    conn->wrote = 0;
}

/* The connections a round writes to, in the order they were first
 * used, and the call's deadline. */
typedef struct idem__actives {
    idem__active *a;
    size_t n, cap;
    int64_t deadline;
} idem__actives;

/* Note conn (node's connection k) as used by this round. 0 or ENOMEM. */
static int idem__activate(idem__rconn *conn, size_t node, size_t k,
                          idem__actives *act)
{
    if (conn->nin)
        return 0;  /* already in the list */
    idem__active *p = idem__grow(act->a, act->n, &act->cap, sizeof *p, 16);
    if (!p)
        return IDEM_ENOMEM;
    act->a = p;
    act->a[act->n].node = node;
    act->a[act->n++].conn = k;
    idem__rconn_deadline(conn, act->deadline - idem__mono_ms());
    return 0;
}

/* Step 1 for command i: to the connection of the node that owns its
 * slot. 0, or an error that ends the call (EAUTH, ENOMEM, EINVAL). */
static int idem__dispatch_cmd(idem_store *s, idem__rbatch *b, size_t i,
                              idem__actives *act, idem__round *rd)
{
    idem__redis *r = idem__r(s);
    idem__rcmd *c = &b->cmds[i];
    int node = c->ask >= 0 ? c->ask : idem__route(r, c->slot);
    if (node < 0) {
        r->map_stale = 1;
        rd->backoff = 1;
        c->lasterr = IDEM_ECONN;
        snprintf(b->lastmsg, sizeof b->lastmsg, "%s: no known master "
                 "serves slot %u", s->uri, c->slot);
        return 0;
    }
    size_t k = c->slot % (unsigned)r->cfg.pool;
    int rc = idem__ensure_conn(s, b, (size_t)node, k,
                               act->deadline - idem__mono_ms());
    if (rc == IDEM_EAUTH || rc == IDEM_ENOMEM || rc == IDEM_EINVAL)
        return rc;
    if (rc) {
        c->lasterr = rc;
        r->map_stale = idem__has_map(r);
        rd->backoff = 1;
        return 0;
    }
    idem__rconn *conn = &r->nodes[node].conns[k];
    if (idem__activate(conn, (size_t)node, k, act) ||
        idem__append_cmd(r, b, conn, i))
        return IDEM_ENOMEM;
    /* Send what is built as it grows, so that the server works on the
     * first commands while the rest are formatted. A failure here shows
     * again, and is handled, at step 3. */
    if (conn->c && sdslen(conn->c->obuf) >= IDEM__EARLY_FLUSH)
        (void)idem__rconn_flush(conn);
    return 0;
}

/* 1. dispatch every pending command. 0 or the error that ends the
 * call; then the round's connections are closed (half-built pipelines)
 * and b->lastmsg says why. */
static int idem__dispatch(idem_store *s, idem__rbatch *b, idem__actives *act,
                          idem__round *rd)
{
    int fatal = 0;
    for (size_t i = 0; i < b->n && !fatal; i++)
        if (!b->cmds[i].done)
            fatal = idem__dispatch_cmd(s, b, i, act, rd);
    if (!fatal)
        return 0;
    for (size_t a = 0; a < act->n; a++)
        idem__rconn_close(idem__conn_at(idem__r(s), act->a[a]));
    if (fatal == IDEM_ENOMEM)
        snprintf(b->lastmsg, sizeof b->lastmsg, "out of memory");
    else
        idem__scopy(b->lastmsg, sizeof b->lastmsg, s->detail);
    return fatal;
}

/* 2. WAIT after the writes of each connection. 0 or ENOMEM. */
static int idem__append_waits(idem_store *s, idem__rbatch *b,
                              const idem__actives *act)
{
    idem__redis *r = idem__r(s);
    int fatal = 0;
    for (size_t a = 0; a < act->n && r->cfg.wait; a++) {
        idem__rconn *conn = idem__conn_at(r, act->a[a]);
        if (!conn->wrote)
            continue;
        char nb[16], tb[24];
        /* Redis times out blocked clients on its cron (10 Hz by
         * default), so WAIT may answer ~100 ms after its timeout:
         * leave room for that before the call's own deadline. */
        int64_t lw = act->deadline - idem__mono_ms();
        int64_t wait_ms = lw > 400 ? lw - 200 : lw / 2;
        snprintf(nb, sizeof nb, "%d", r->cfg.wait);
        snprintf(tb, sizeof tb, "%lld", (long long)(wait_ms > 0 ? wait_ms
                                                                : 1));
        const char *wa[3] = {"WAIT", nb, tb};
        size_t wl[3] = {4, strlen(nb), strlen(tb)};
        if (idem__pipe_cmd(conn, IDEM__IN_WAIT, 0, 3, wa, wl)) {
            fatal = IDEM_ENOMEM;
            snprintf(b->lastmsg, sizeof b->lastmsg, "out of memory");
        }
    }
    return fatal;
}

/* 3. write every pipeline, then read every reply. Each blocking step
 * gets what is left of the budget, so that several slow nodes in a row
 * cannot add up past it. */
static void idem__exchange(idem_store *s, idem__rbatch *b,
                           const idem__actives *act, idem__round *rd)
{
    idem__redis *r = idem__r(s);
    for (size_t a = 0; a < act->n; a++) {
        idem__rconn *conn = idem__conn_at(r, act->a[a]);
        idem__rconn_deadline(conn, act->deadline - idem__mono_ms());
        if (conn->c && idem__rconn_flush(conn))
            idem__conn_broke(s, b, act->a[a], rd);
    }
    for (size_t a = 0; a < act->n; a++) {
        idem__rconn *conn = idem__conn_at(r, act->a[a]);
        idem__rconn_deadline(conn, act->deadline - idem__mono_ms());
        if (conn->c && conn->nin)
            idem__read_conn(s, b, act->a[a], rd);
        else
            conn->nin = 0;
    }
}

/* 4. back off only when waiting can help; a redirect is retried at
 * once. The next round's pause after one that waited `backoff`. */
static int64_t idem__next_backoff(int64_t backoff, const idem__round *rd)
{
    if (!rd->backoff)
        return 0;
    return backoff ? (backoff * 2 > 500 ? 500 : backoff * 2) : 10;
}

/* Before a round: pause, and reload a stale slot map. 0 to go on, 1
 * when the budget is spent, or an error that ends the call. */
static int idem__prepare_round(idem_store *s, idem__rbatch *b,
                               int64_t deadline, int64_t backoff)
{
    idem__redis *r = idem__r(s);
    int64_t left = deadline - idem__mono_ms();
    if (left > 0 && backoff) {
        idem__sleep_ms(backoff < left ? backoff : left);
        left = deadline - idem__mono_ms();
    }
    if (left <= 0)
        return 1;
    if (!idem__has_map(r) || !r->map_stale)
        return 0;
    int rc = idem__map_refresh(s, r, deadline);
    if (rc)
        idem__scopy(b->lastmsg, sizeof b->lastmsg, s->detail);
    if (rc == IDEM_EAUTH || rc == IDEM_ENOMEM)
        return rc;
    return deadline - idem__mono_ms() <= 0;
}

/* Every command still pending at the end fails: with the error that
 * ended the call, or the last reason it had none. The first code. */
static int idem__fail_pending(idem_store *s, idem__rbatch *b, int fatal,
                              int64_t deadline)
{
    idem__redis *r = idem__r(s);
    int rc = 0;
    int64_t spent = r->cfg.timeout_ms - (deadline - idem__mono_ms());
    for (size_t i = 0; i < b->n; i++) {
        idem__rcmd *c = &b->cmds[i];
        if (c->done)
            continue;
        int code = fatal ? fatal : c->lasterr ? c->lasterr : IDEM_ETIMEOUT;
        char msg[2 * sizeof b->lastmsg];
        if (fatal)
            idem__scopy(msg, sizeof msg, b->lastmsg);
        else
            snprintf(msg, sizeof msg, "%s: no answer within %lld ms%s%s",
                     s->uri, (long long)spent, b->lastmsg[0] ? "; last: " : "",
                     b->lastmsg);
        idem__final(b, c, code, msg);
        if (!rc)
            rc = code;
    }
    return rc;
}

static int idem__pending(const idem__rbatch *b)
{
    for (size_t i = 0; i < b->n; i++)
        if (!b->cmds[i].done)
            return 1;
    return 0;
}

/* Run every command of b to an answer or to the end of the time budget.
 * Returns 0 if each command has an answer or an error of its own key;
 * otherwise the error (ECONN, ETIMEOUT, EAUTH, ENOMEM) that kept some
 * command from being answered. */
static int idem__rounds(idem_store *s, idem__rbatch *b)
{
    idem__redis *r = idem__r(s);
    idem__actives act = {NULL, 0, 0, idem__mono_ms() + r->cfg.timeout_ms};
    int64_t backoff = 0;
    int fatal = 0;
    idem__sigstate sig;
    /* Transient failures write the detail as they happen; what the
     * caller sees is the detail from before, or the final errors. */
    char before[sizeof s->detail];
    idem__scopy(before, sizeof before, s->detail);
    idem__nosigpipe_begin(&sig);
    while (!fatal && idem__pending(b)) {
        int rc = idem__prepare_round(s, b, act.deadline, backoff);
        if (rc) {
            fatal = rc == 1 ? 0 : rc;
            break;
        }
        idem__round rd = {0, 0};
        act.n = 0;
        r->round++;
        fatal = idem__dispatch(s, b, &act, &rd);
        if (fatal)
            break;
        fatal = idem__append_waits(s, b, &act);
        idem__exchange(s, b, &act, &rd);
        if (rd.fatal)
            fatal = rd.fatal;
        backoff = idem__next_backoff(backoff, &rd);
    }
    idem__nosigpipe_end(&sig);
    free(act.a);
    int rc = idem__fail_pending(s, b, fatal, act.deadline);
    idem__scopy(s->detail, sizeof s->detail,
                b->firstmsg[0] ? b->firstmsg : before);
    return rc;
}


/* Give each item its own answer: the command's reply, or its element
 * of the reply of a multi-key script (unless the batch answers whole). */
static void idem__distribute(idem_store *s, idem__rbatch *b, int rc)
{
    int split = b->multi && !b->whole;
    for (size_t i = 0; i < b->n; i++) {
        idem__rcmd *c = &b->cmds[i];
        const redisReply *rep = c->reply;
        int bad = split && rep && c->status == 0 &&
                  (rep->type != REDIS_REPLY_ARRAY || rep->elements != c->count);
        for (size_t j = 0; j < c->count; j++) {
            idem__ritem *it = &b->items[b->order[c->first + j]];
            if (!c->done)
                it->status = rc;
            else if (c->status)
                it->status = c->status;
            else if (bad)
                it->status = IDEM_EPROTO;
            else
                it->reply = split ? rep->element[j] : rep;
            if (it->reply && it->reply->type == REDIS_REPLY_ERROR) {
                /* A key's own failure inside a multi-key script. */
                char msg[sizeof b->firstmsg];
                snprintf(msg, sizeof msg, "%s: %s", s->uri, it->reply->str);
                if (!b->firstmsg[0])
                    idem__scopy(b->firstmsg, sizeof b->firstmsg, msg);
                it->status = IDEM_EPROTO;
                it->reply = NULL;
            }
            if (bad && !b->firstmsg[0])
                snprintf(b->firstmsg, sizeof b->firstmsg, "%s: a script "
                         "answered %zu results for %zu keys", s->uri,
                         rep->type == REDIS_REPLY_ARRAY ? rep->elements : 0,
                         c->count);
        }
    }
    if (b->firstmsg[0])
        idem__scopy(s->detail, sizeof s->detail, b->firstmsg);
}

int idem__run(idem_store *s, idem__rbatch *b, int write)
{
    b->write = write;
    if (b->nitems == 0)
        return 0;
    if (write && (s->opts.flags & IDEM_O_READONLY)) {
        for (size_t i = 0; i < b->nitems; i++)
            b->items[i].status = IDEM_EINVAL;
        return idem__fail(s, IDEM_EINVAL, "the store was opened read-only");
    }
    if (idem__group(b))
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    int rc = idem__rounds(s, b);
    idem__distribute(s, b, rc);
    return rc;
}
