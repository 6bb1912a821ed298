/* redis.c - the redis:// and redis-cluster:// store backends.
 *
 * Every operation is a batch of commands, one EVALSHA of a script from
 * redis_scripts.c per key, run in rounds:
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
 * redis_scripts.c); extend is harmless to repeat. forget is not: a
 * repeated forget answers IDEM_ENOTFOUND for the record it deleted.
 *
 * There is nothing to flush: a write is applied when its reply arrives,
 * and with wait=N replicated as well, so sync() has nothing left to do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redis.h"

/* ARGV after the key: the time, then up to this many. */
#define IDEM__RARGS 6

typedef struct idem__rcmd {
    int script;
    const void *key;
    size_t keylen;
    unsigned slot;
    size_t name_off, name_len;   /* the Redis key, in the batch's names */
    int nargs;
    const char *arg[IDEM__RARGS];
    size_t argl[IDEM__RARGS];
    char num[4][24];             /* storage for numeric arguments */
    redisReply *reply;           /* the answer, once done and status 0 */
    int status;                  /* final error, or 0 */
    int done;
    int ask;                     /* node to send ASKING + command, or -1 */
    int lasterr;                 /* why the last try did not answer */
} idem__rcmd;

/* A batch being built: commands and their key names. */
typedef struct idem__rbatch {
    idem__rcmd *cmds;
    size_t n;
    idem__buf names;
    char now[24];                /* ARGV[1]: "" for server time */
    int write;                   /* the commands change records */
    char firstmsg[256];          /* detail of the first final error */
    char lastmsg[256];           /* detail of the last transient error */
} idem__rbatch;

/* Copy a message, cut to fit. */
static void idem__scopy(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static idem__redis *idem__r(idem_store *s)
{
    return s->impl;
}

static int idem__batch_init(idem_store *s, idem__rbatch *b, size_t n)
{
    memset(b, 0, sizeof *b);
    b->cmds = calloc(n ? n : 1, sizeof *b->cmds);
    if (!b->cmds)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    if (s->opts.clock)
        snprintf(b->now, sizeof b->now, "%lld", (long long)idem__now(s));
    return 0;
}

static void idem__batch_free(idem__rbatch *b)
{
    for (size_t i = 0; i < b->n; i++)
        if (b->cmds[i].reply)
            freeReplyObject(b->cmds[i].reply);
    free(b->cmds);
    idem__buf_free(&b->names);
}

/* Add a command for key; its arguments are set by the caller with
 * idem__arg/idem__argnum. NULL on ENOMEM. */
static idem__rcmd *idem__add(idem_store *s, idem__rbatch *b, int script,
                             const void *key, size_t keylen)
{
    idem__redis *r = idem__r(s);
    idem__rcmd *c = &b->cmds[b->n];
    memset(c, 0, sizeof *c);
    c->script = script;
    c->key = key;
    c->keylen = keylen;
    c->ask = -1;
    c->name_off = b->names.len;
    /* PREFIX{KEY}: the braces make KEY the hash tag, so all of a key's
     * commands land on one slot whatever the prefix. A KEY holding '}'
     * is still stored under its exact bytes; its tag then ends at its
     * first '}', which only changes which slot it shares. */
    if (idem__buf_append(&b->names, r->cfg.prefix, r->cfg.prefixlen) ||
        idem__buf_append(&b->names, "{", 1) ||
        idem__buf_append(&b->names, key, keylen) ||
        idem__buf_append(&b->names, "}", 1))
        return NULL;
    c->name_len = b->names.len - c->name_off;
    c->slot = idem__key_slot(b->names.data + c->name_off, c->name_len);
    b->n++;
    return c;
}

static void idem__arg(idem__rcmd *c, const void *p, size_t n)
{
    c->arg[c->nargs] = p ? p : "";
    c->argl[c->nargs++] = n;
}

static void idem__argnum(idem__rcmd *c, int slot, long long v)
{
    int n = snprintf(c->num[slot], sizeof c->num[slot], "%lld", v);
    idem__arg(c, c->num[slot], (size_t)n);
}

/* A request id unique to this handle and, by its random base, to every
 * other handle: lets a retried write recognise its own first run. */
static void idem__argrid(idem__redis *r, idem__rcmd *c, int slot)
{
    int n = snprintf(c->num[slot], sizeof c->num[slot], "%016llx%llx",
                     (unsigned long long)r->rid_base,
                     (unsigned long long)r->rid_next++);
    if (n >= (int)sizeof c->num[slot])
        n = (int)sizeof c->num[slot] - 1;
    idem__arg(c, c->num[slot], (size_t)n);
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

/* Errors after which the same command may succeed later. */
static int idem__transient(const char *e)
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

/* Handle reply `rep` to the command of inflight entry e on conn. */
static void idem__on_cmd_reply(idem_store *s, idem__rbatch *b,
                               idem__rconn *conn, size_t cmdi,
                               redisReply *rep, idem__round *rd)
{
    idem__redis *r = idem__r(s);
    idem__rcmd *c = &b->cmds[cmdi];
    char msg[256];
    if (rep->type != REDIS_REPLY_ERROR) {
        c->reply = rep;
        if (!r->cfg.wait || !b->write)
            c->done = 1;  /* else: done once WAIT confirms */
        return;
    }
    const char *e = rep->str;
    int is_ask;
    if (strncmp(e, "NOSCRIPT", 8) == 0) {
        conn->loaded = 0;
        c->lasterr = IDEM_EPROTO;
        snprintf(b->lastmsg, sizeof b->lastmsg, "%s: %s", s->uri, e);
    } else if (strncmp(e, "MOVED ", 6) == 0 || strncmp(e, "ASK ", 4) == 0) {
        int node = r->cfg.cluster ? idem__redirect(r, rep, &is_ask) : -1;
        if (!r->cfg.cluster) {
            snprintf(msg, sizeof msg, "%s: the server is a cluster node "
                     "(%s): use redis-cluster://", s->uri, e);
            idem__final(b, c, IDEM_EPROTO, msg);
        } else if (node < 0) {
            r->map_stale = 1;
            rd->backoff = 1;
            c->lasterr = IDEM_EPROTO;
            snprintf(b->lastmsg, sizeof b->lastmsg, "%s: %s", s->uri, e);
        } else if (is_ask) {
            c->ask = node;
        } else {
            r->map_stale = 1;
        }
    } else if (idem__transient(e)) {
        rd->backoff = 1;
        if (strncmp(e, "READONLY", 8) == 0)
            r->map_stale = r->cfg.cluster;
        c->lasterr = IDEM_ETIMEOUT;
        snprintf(b->lastmsg, sizeof b->lastmsg, "%s: %s", s->uri, e);
    } else if (strncmp(e, "NOAUTH", 6) == 0 ||
               strncmp(e, "WRONGPASS", 9) == 0) {
        snprintf(msg, sizeof msg, "%s: %s", s->uri, e);
        idem__final(b, c, IDEM_EAUTH, msg);
        rd->fatal = IDEM_EAUTH;
    } else {
        /* The script itself failed, e.g. WRONGTYPE: the key holds
         * something that is not an idem record. This key alone fails. */
        snprintf(msg, sizeof msg, "%s: key %zu of the batch: %s", s->uri,
                 cmdi, e);
        idem__final(b, c, IDEM_EPROTO, msg);
    }
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
    int64_t ms = left < r->cfg.connect_ms ? left : r->cfg.connect_ms;
    int rc = idem__rconn_open(s, r, &r->nodes[node], conn, ms);
    if (rc)
        idem__scopy(b->lastmsg, sizeof b->lastmsg, s->detail);
    return rc;
}

static int idem__append_cmd(idem__redis *r, idem__rbatch *b, idem__rconn *conn,
                            size_t i, int write)
{
    idem__rcmd *c = &b->cmds[i];
    const char *argv[5 + IDEM__RARGS];
    size_t lens[5 + IDEM__RARGS];
    int argc = 0;
    if (!conn->loaded) {
        for (int k = 0; k < IDEM__S_COUNT; k++) {
            const char *la[3] = {"SCRIPT", "LOAD", idem__script_text(k)};
            size_t ll[3] = {6, 4, strlen(la[2])};
            if (redisAppendCommandArgv(conn->c, 3, la, ll) != REDIS_OK ||
                idem__rconn_expect(conn, IDEM__IN_LOAD, 0))
                return IDEM_ENOMEM;
        }
        conn->loaded = 1;
    }
    if (c->ask >= 0) {
        const char *aa[1] = {"ASKING"};
        size_t al[1] = {6};
        if (redisAppendCommandArgv(conn->c, 1, aa, al) != REDIS_OK ||
            idem__rconn_expect(conn, IDEM__IN_ASKING, 0))
            return IDEM_ENOMEM;
        c->ask = -1;
    }
    argv[argc] = "EVALSHA";
    lens[argc++] = 7;
    argv[argc] = r->shas[c->script];
    lens[argc++] = 40;
    argv[argc] = "1";
    lens[argc++] = 1;
    argv[argc] = (const char *)b->names.data + c->name_off;
    lens[argc++] = c->name_len;
    argv[argc] = b->now;
    lens[argc++] = strlen(b->now);
    for (int k = 0; k < c->nargs; k++) {
        argv[argc] = c->arg[k];
        lens[argc++] = c->argl[k];
    }
    if (redisAppendCommandArgv(conn->c, argc, argv, lens) != REDIS_OK ||
        idem__rconn_expect(conn, IDEM__IN_CMD, i))
        return IDEM_ENOMEM;
    conn->wrote |= write;
    return 0;
}

static void idem__sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
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
            int code = idem__rconn_timed_out(conn) ? IDEM_ETIMEOUT
                                                   : IDEM_ECONN;
            char msg[256];
            snprintf(msg, sizeof msg, "%s: %s:%d: %s", s->uri,
                     r->nodes[a.node].host, r->nodes[a.node].port,
                     conn->c->errstr[0] ? conn->c->errstr
                                        : "connection lost");
            idem__requeue_conn(b, conn, code, msg);
            idem__rconn_close(conn);
            r->map_stale = r->cfg.cluster;
            rd->backoff = 1;
            return;
        }
        idem__inflight in = conn->in[j];
        if (in.kind == IDEM__IN_CMD) {
            /* A redirect may add a node and move r->nodes: look the
             * connection up again afterwards. */
            idem__on_cmd_reply(s, b, conn, in.cmd, rep, rd);
            conn = idem__conn_at(r, a);
        } else if (in.kind == IDEM__IN_WAIT) {
            long long acked = rep->type == REDIS_REPLY_INTEGER ? rep->integer
                                                               : -1;
            char msg[256];
            snprintf(msg, sizeof msg, "%s: WAIT %d: %s%lld replica(s) "
                     "acknowledged in time", s->uri, r->cfg.wait,
                     acked < 0 ? "failed, " : "only ", acked < 0 ? 0 : acked);
            for (size_t k = 0; k < j; k++) {
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
            freeReplyObject(rep);
        } else {
            /* SCRIPT LOAD or ASKING: an error shows up again as NOSCRIPT
             * or a redirect of the command that follows. */
            if (in.kind == IDEM__IN_LOAD && rep->type == REDIS_REPLY_ERROR)
                conn->loaded = 0;
            freeReplyObject(rep);
        }
    }
    conn->nin = 0;
    conn->wrote = 0;
}

/* Run every command of b to an answer or to the end of the time budget.
 * Returns 0 if each command has an answer or an error of its own key;
 * otherwise the error (ECONN, ETIMEOUT, EAUTH, ENOMEM) that kept some
 * command from being answered. */
static int idem__run(idem_store *s, idem__rbatch *b, int write)
{
    idem__redis *r = idem__r(s);
    int64_t deadline = idem__mono_ms() + r->cfg.timeout_ms;
    int64_t backoff = 0;
    int fatal = 0;
    idem__active *act = NULL;
    size_t nact = 0, capact = 0;
    idem__sigstate sig;
    b->write = write;
    if (b->n == 0)
        return 0;
    /* Transient failures write the detail as they happen; what the
     * caller sees is the detail from before, or the final errors. */
    char before[sizeof s->detail];
    idem__scopy(before, sizeof before, s->detail);
    idem__nosigpipe_begin(&sig);
    for (;;) {
        size_t pending = 0;
        for (size_t i = 0; i < b->n; i++)
            pending += !b->cmds[i].done;
        if (!pending || fatal)
            break;
        int64_t left = deadline - idem__mono_ms();
        if (left <= 0)
            break;
        if (backoff) {
            idem__sleep_ms(backoff < left ? backoff : left);
            left = deadline - idem__mono_ms();
            if (left <= 0)
                break;
        }
        if (r->cfg.cluster && r->map_stale) {
            int rc = idem__map_refresh(s, r, deadline);
            if (rc == IDEM_EAUTH || rc == IDEM_ENOMEM) {
                fatal = rc;
                idem__scopy(b->lastmsg, sizeof b->lastmsg, s->detail);
                break;
            }
            if (rc)
                idem__scopy(b->lastmsg, sizeof b->lastmsg, s->detail);
            left = deadline - idem__mono_ms();
            if (left <= 0)
                break;
        }
        idem__round rd = {0, 0};
        nact = 0;
        /* 1. dispatch */
        for (size_t i = 0; i < b->n && !fatal; i++) {
            idem__rcmd *c = &b->cmds[i];
            if (c->done)
                continue;
            int node = c->ask >= 0 ? c->ask : idem__route(r, c->slot);
            if (node < 0) {
                r->map_stale = 1;
                rd.backoff = 1;
                c->lasterr = IDEM_ECONN;
                snprintf(b->lastmsg, sizeof b->lastmsg,
                         "%s: no known master serves slot %u", s->uri,
                         c->slot);
                continue;
            }
            size_t k = c->slot % (unsigned)r->cfg.pool;
            int rc = idem__ensure_conn(s, b, (size_t)node, k, left);
            if (rc == IDEM_EAUTH || rc == IDEM_ENOMEM || rc == IDEM_EINVAL) {
                fatal = rc;
                break;
            }
            if (rc) {
                c->lasterr = rc;
                r->map_stale = r->cfg.cluster;
                rd.backoff = 1;
                continue;
            }
            idem__rconn *conn = &r->nodes[node].conns[k];
            if (conn->nin == 0) {
                if (nact == capact) {
                    size_t cap = capact ? capact * 2 : 16;
                    idem__active *p = realloc(act, cap * sizeof *p);
                    if (!p) {
                        fatal = IDEM_ENOMEM;
                        break;
                    }
                    act = p;
                    capact = cap;
                }
                act[nact].node = (size_t)node;
                act[nact++].conn = k;
                idem__rconn_deadline(conn, left);
            }
            if (idem__append_cmd(r, b, conn, i, write)) {
                fatal = IDEM_ENOMEM;
                break;
            }
        }
        if (fatal) {
            for (size_t a = 0; a < nact; a++)
                idem__rconn_close(idem__conn_at(r, act[a]));
            if (fatal == IDEM_ENOMEM)
                snprintf(b->lastmsg, sizeof b->lastmsg, "out of memory");
            else
                idem__scopy(b->lastmsg, sizeof b->lastmsg, s->detail);
            break;
        }
        /* 2. WAIT after the writes of each connection */
        for (size_t a = 0; a < nact && r->cfg.wait; a++) {
            idem__rconn *conn = idem__conn_at(r, act[a]);
            if (!conn->wrote)
                continue;
            char nb[16], tb[24];
            int64_t wait_ms = left - left / 10;
            snprintf(nb, sizeof nb, "%d", r->cfg.wait);
            snprintf(tb, sizeof tb, "%lld", (long long)(wait_ms > 0 ? wait_ms
                                                                    : 1));
            const char *wa[3] = {"WAIT", nb, tb};
            size_t wl[3] = {4, strlen(nb), strlen(tb)};
            if (redisAppendCommandArgv(conn->c, 3, wa, wl) != REDIS_OK ||
                idem__rconn_expect(conn, IDEM__IN_WAIT, 0)) {
                fatal = IDEM_ENOMEM;
                snprintf(b->lastmsg, sizeof b->lastmsg, "out of memory");
            }
        }
        /* 3. write every pipeline, then read every reply */
        /* Each blocking step gets what is left of the budget, so that
         * several slow nodes in a row cannot add up past it. */
        for (size_t a = 0; a < nact; a++) {
            idem__rconn *conn = idem__conn_at(r, act[a]);
            idem__rconn_deadline(conn, deadline - idem__mono_ms());
            if (conn->c && idem__rconn_flush(conn)) {
                char msg[256];
                snprintf(msg, sizeof msg, "%s: %s:%d: %s", s->uri,
                         r->nodes[act[a].node].host,
                         r->nodes[act[a].node].port, conn->c->errstr);
                idem__requeue_conn(b, conn, idem__rconn_timed_out(conn)
                                                ? IDEM_ETIMEOUT
                                                : IDEM_ECONN, msg);
                idem__rconn_close(conn);
                r->map_stale = r->cfg.cluster;
                rd.backoff = 1;
            }
        }
        for (size_t a = 0; a < nact; a++) {
            idem__rconn *conn = idem__conn_at(r, act[a]);
            idem__rconn_deadline(conn, deadline - idem__mono_ms());
            if (conn->c && conn->nin)
                idem__read_conn(s, b, act[a], &rd);
            else
                conn->nin = 0;
        }
        if (rd.fatal)
            fatal = rd.fatal;
        /* 4. back off only when waiting can help; a redirect is retried
         * at once. */
        if (rd.backoff)
            backoff = backoff ? (backoff * 2 > 500 ? 500 : backoff * 2) : 10;
        else
            backoff = 0;
    }
    idem__nosigpipe_end(&sig);
    free(act);
    int rc = 0;
    int64_t spent = r->cfg.timeout_ms - (deadline - idem__mono_ms());
    for (size_t i = 0; i < b->n; i++) {
        idem__rcmd *c = &b->cmds[i];
        if (c->done)
            continue;
        int code = fatal ? fatal : c->lasterr ? c->lasterr : IDEM_ETIMEOUT;
        char msg[400];
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
    idem__scopy(s->detail, sizeof s->detail,
                b->firstmsg[0] ? b->firstmsg : before);
    return rc;
}

/* ------------------------------------------------------------------------
 * Replies into outcomes */

static int idem__int_of(const redisReply *e, long long *v)
{
    if (e->type == REDIS_REPLY_INTEGER) {
        *v = e->integer;
        return 0;
    }
    if (e->type == REDIS_REPLY_STRING && e->len && e->len < 24) {
        char buf[24], *end;
        memcpy(buf, e->str, e->len);
        buf[e->len] = '\0';
        *v = strtoll(buf, &end, 10);
        return *end ? -1 : 0;
    }
    return -1;
}

static int idem__bad_reply(idem_store *s, idem__rbatch *b, idem__rcmd *c,
                           const char *what)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s: unexpected reply to %s", s->uri, what);
    idem__final(b, c, IDEM_EPROTO, msg);
    idem__scopy(s->detail, sizeof s->detail, msg);
    return IDEM_EPROTO;
}

static int idem__claim_reply(idem_store *s, idem__rbatch *b, idem__rcmd *c,
                             idem_outcome *o)
{
    const redisReply *rep = c->reply;
    long long kind, token, lease;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 3 ||
        idem__int_of(rep->element[0], &kind) ||
        idem__int_of(rep->element[1], &token) ||
        idem__int_of(rep->element[2], &lease) || kind < IDEM_NEW ||
        kind > IDEM_MISMATCH || token < 1)
        return idem__bad_reply(s, b, c, "claim");
    o->kind = (idem_outcome_kind)kind;
    o->token = (uint64_t)token;
    o->attempts = (uint32_t)token;
    o->lease_until = lease;
    if (kind == IDEM_REPLAY || kind == IDEM_FAILED) {
        const redisReply *d = rep->elements > 3 ? rep->element[3] : NULL;
        if (!d || d->type != REDIS_REPLY_STRING)
            return idem__bad_reply(s, b, c, "claim");
        o->data = idem__out_keep(s, d->str, d->len);
        o->len = d->len;
        if (!o->data)
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    return 0;
}

static int idem__redis_claim_many(idem_store *s, const idem_key *keys,
                                  size_t n, const idem__claim_args *a,
                                  idem_outcome *outs)
{
    idem__redis *r = idem__r(s);
    idem__rbatch b;
    int rc = idem__batch_init(s, &b, n);
    if (rc)
        return rc;
    size_t *which = malloc((n ? n : 1) * sizeof *which);
    if (!which) {
        idem__batch_free(&b);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        if (outs[i].status)
            continue;
        idem__rcmd *c = idem__add(s, &b, IDEM__S_CLAIM, keys[i].key,
                                  keys[i].len);
        if (!c) {
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
            break;
        }
        which[b.n - 1] = i;
        idem__arg(c, keys[i].fp, keys[i].fp ? IDEM_FP_LEN : 0);
        idem__argnum(c, 0, a->lease_ms);
        idem__argnum(c, 1, a->ttl_ms);
        idem__argrid(r, c, 2);
    }
    if (rc) {
        for (size_t i = 0; i < n; i++)
            outs[i].status = outs[i].status ? outs[i].status : rc;
        free(which);
        idem__batch_free(&b);
        return rc;
    }
    rc = idem__run(s, &b, 1);
    int first_key_err = 0;
    for (size_t j = 0; j < b.n; j++) {
        idem__rcmd *c = &b.cmds[j];
        idem_outcome *o = &outs[which[j]];
        if (!c->done) {
            o->status = rc;
            continue;
        }
        int st = c->status ? c->status : idem__claim_reply(s, &b, c, o);
        o->status = st;
        /* A key whose own script failed fails alone (EPROTO); a server
         * that did not answer for it, or a WAIT that was not confirmed,
         * is the batch's error too. */
        if (st && st != IDEM_EPROTO && !rc)
            rc = st;
        if (st && !first_key_err)
            first_key_err = st;
    }
    if ((rc || first_key_err) && b.firstmsg[0])
        idem__scopy(s->detail, sizeof s->detail, b.firstmsg);
    free(which);
    idem__batch_free(&b);
    return rc;
}

static int idem__why_lost(idem_store *s, long long why, uint64_t token)
{
    return idem__fail(s, IDEM_ELOST, "token %llu does not hold the key (%s)",
                      (unsigned long long)token,
                      why == IDEM__WHY_NONE       ? "no live record"
                      : why == IDEM__WHY_FINISHED ? "already finished"
                      : why == IDEM__WHY_RELEASED ? "it was released"
                                                  : "another worker took it "
                                                    "over");
}

/* The answer of a finishing script: 0 or IDEM_ELOST (detail set). */
static int idem__finish_reply(idem_store *s, idem__rbatch *b, idem__rcmd *c,
                              uint64_t token, const char *what)
{
    long long v;
    if (c->status)
        return c->status;
    if (idem__int_of(c->reply, &v) || v < 0 || v > IDEM__WHY_TAKEN)
        return idem__bad_reply(s, b, c, what);
    return v ? idem__why_lost(s, v, token) : 0;
}

static int idem__redis_complete_many(idem_store *s,
                                     const idem_completion *items, size_t n,
                                     int *st)
{
    idem__redis *r = idem__r(s);
    idem__rbatch b;
    int rc = idem__batch_init(s, &b, n);
    if (rc)
        return rc;
    size_t *which = malloc((n ? n : 1) * sizeof *which);
    if (!which) {
        idem__batch_free(&b);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        if (st[i])
            continue;
        const idem_completion *it = &items[i];
        idem__rcmd *c = idem__add(s, &b, IDEM__S_COMPLETE, it->key,
                                  it->keylen);
        if (!c) {
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
            break;
        }
        which[b.n - 1] = i;
        idem__argnum(c, 0, (long long)it->token);
        idem__arg(c, it->response, it->len);
        idem__argnum(c, 1, it->ttl_ms ? it->ttl_ms : s->opts.ttl_ms);
        idem__argrid(r, c, 2);
    }
    if (rc) {
        for (size_t i = 0; i < n; i++)
            st[i] = st[i] ? st[i] : rc;
        free(which);
        idem__batch_free(&b);
        return rc;
    }
    rc = idem__run(s, &b, 1);
    char lostmsg[sizeof s->detail] = "";
    for (size_t j = 0; j < b.n; j++) {
        idem__rcmd *c = &b.cmds[j];
        if (!c->done) {
            st[which[j]] = rc;
            continue;
        }
        st[which[j]] = idem__finish_reply(s, &b, c, items[which[j]].token,
                                          "complete");
        if (st[which[j]] && st[which[j]] != IDEM_ELOST &&
            st[which[j]] != IDEM_EPROTO && !rc)
            rc = st[which[j]];
        if (st[which[j]] == IDEM_ELOST && !lostmsg[0])
            idem__scopy(lostmsg, sizeof lostmsg, s->detail);
    }
    if (rc || b.firstmsg[0])
        idem__scopy(s->detail, sizeof s->detail, b.firstmsg);
    else if (lostmsg[0])
        idem__scopy(s->detail, sizeof s->detail, lostmsg);
    free(which);
    idem__batch_free(&b);
    return rc;
}

/* Run one command; its reply stays in b.cmds[0].reply. */
static int idem__run_one(idem_store *s, idem__rbatch *b, int write)
{
    int rc = idem__run(s, b, write);
    return rc ? rc : b->cmds[0].status;
}

static int idem__redis_fail(idem_store *s, const void *key, size_t keylen,
                            uint64_t token, const void *err, size_t len,
                            int retryable)
{
    idem__redis *r = idem__r(s);
    idem__rbatch b;
    int rc = idem__batch_init(s, &b, 1);
    if (rc)
        return rc;
    idem__rcmd *c = idem__add(s, &b, IDEM__S_FAIL, key, keylen);
    if (!c) {
        idem__batch_free(&b);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    idem__argnum(c, 0, (long long)token);
    idem__arg(c, err, len);
    idem__arg(c, retryable ? "1" : "0", 1);
    idem__argnum(c, 1, s->opts.failure_ttl_ms);
    idem__argrid(r, c, 2);
    rc = idem__run_one(s, &b, 1);
    if (!rc)
        rc = idem__finish_reply(s, &b, c, token, "fail");
    idem__batch_free(&b);
    return rc;
}

static int idem__redis_extend(idem_store *s, const void *key, size_t keylen,
                              uint64_t token, int64_t lease_ms)
{
    idem__rbatch b;
    int rc = idem__batch_init(s, &b, 1);
    if (rc)
        return rc;
    idem__rcmd *c = idem__add(s, &b, IDEM__S_EXTEND, key, keylen);
    if (!c) {
        idem__batch_free(&b);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    idem__argnum(c, 0, (long long)token);
    idem__argnum(c, 1, lease_ms);
    rc = idem__run_one(s, &b, 1);
    if (!rc)
        rc = idem__finish_reply(s, &b, c, token, "extend");
    idem__batch_free(&b);
    return rc;
}

static int idem__redis_get(idem_store *s, const void *key, size_t keylen,
                           idem_record *out)
{
    idem__rbatch b;
    int rc = idem__batch_init(s, &b, 1);
    if (rc)
        return rc;
    idem__rcmd *c = idem__add(s, &b, IDEM__S_GET, key, keylen);
    if (!c) {
        idem__batch_free(&b);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    rc = idem__run_one(s, &b, 0);
    const redisReply *rep = rc ? NULL : c->reply;
    if (rep && rep->type == REDIS_REPLY_NIL) {
        rc = idem__fail(s, IDEM_ENOTFOUND, "no live record for the key");
    } else if (rep) {
        long long v[6];
        int ok = rep->type == REDIS_REPLY_ARRAY && rep->elements >= 8;
        for (int i = 0; ok && i < 6; i++)
            ok = idem__int_of(rep->element[i], &v[i]) == 0;
        const redisReply *fp = ok ? rep->element[6] : NULL;
        const redisReply *d = ok ? rep->element[7] : NULL;
        if (!ok || fp->type != REDIS_REPLY_STRING ||
            (fp->len != 0 && fp->len != IDEM_FP_LEN) ||
            (d->type != REDIS_REPLY_STRING && d->type != REDIS_REPLY_NIL)) {
            rc = idem__bad_reply(s, &b, c, "get");
        } else {
            out->state = (idem_state)v[0];
            out->token = (uint64_t)v[1];
            out->attempts = (uint32_t)v[1];
            out->released = (int)v[2];
            out->created_ms = v[3];
            out->expires_ms = v[4];
            out->lease_until = v[0] == IDEM_PENDING ? v[5] : 0;
            out->has_fp = fp->len == IDEM_FP_LEN;
            if (out->has_fp)
                memcpy(out->fp, fp->str, IDEM_FP_LEN);
            if (d->type == REDIS_REPLY_STRING && d->len) {
                out->data = idem__out_keep(s, d->str, d->len);
                out->len = d->len;
                if (!out->data)
                    rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
            }
        }
    }
    idem__batch_free(&b);
    return rc;
}

static int idem__redis_forget(idem_store *s, const void *key, size_t keylen)
{
    idem__rbatch b;
    int rc = idem__batch_init(s, &b, 1);
    if (rc)
        return rc;
    idem__rcmd *c = idem__add(s, &b, IDEM__S_FORGET, key, keylen);
    if (!c) {
        idem__batch_free(&b);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    rc = idem__run_one(s, &b, 1);
    long long v;
    if (!rc && idem__int_of(c->reply, &v))
        rc = idem__bad_reply(s, &b, c, "forget");
    else if (!rc && v == 0)
        rc = idem__fail(s, IDEM_ENOTFOUND, "no live record for the key");
    idem__batch_free(&b);
    return rc;
}

static int idem__redis_sync(idem_store *s)
{
    (void)s;
    return 0;
}

/* ------------------------------------------------------------------------
 * Sweep and stats: SCAN every master, then one script per slot's keys.
 *
 * Records carry a TTL, so Redis removes them on its own. What a sweep is
 * for: records written without a TTL (by hand, by older tools, or when
 * a PEXPIRE was lost), which it deletes once created_ts is older than
 * the retention, and records whose expiry passed under a caller's clock
 * before Redis's own. A script may only touch keys of one slot in a
 * cluster, so the keys of each SCAN page are grouped by slot. */

typedef struct idem__scan_acc {
    uint64_t deleted;
    uint64_t counts[3];
    uint64_t seen;
    int err;
} idem__scan_acc;

static int idem__slot_cmp(const void *a, const void *b)
{
    const unsigned *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

/* The glob pattern matching every key under the prefix. */
static char *idem__scan_pattern(const idem__redis *r, size_t *len)
{
    char *p = malloc(2 * r->cfg.prefixlen + 2);
    size_t n = 0;
    if (!p)
        return NULL;
    for (size_t i = 0; i < r->cfg.prefixlen; i++) {
        char ch = r->cfg.prefix[i];
        if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\')
            p[n++] = '\\';
        p[n++] = ch;
    }
    p[n++] = '*';
    p[n] = '\0';
    *len = n;
    return p;
}

/* Run `script` over the keys of one SCAN page, grouped by slot. */
static int idem__scan_page(idem_store *s, idem__redis *r, idem__rconn *conn,
                           const redisReply *keys, int script,
                           const char *now, idem__scan_acc *acc)
{
    size_t n = keys->elements;
    if (n == 0)
        return 0;
    unsigned(*order)[2] = malloc(n * sizeof *order);
    const char **argv = malloc((n + 6) * sizeof *argv);
    size_t *lens = malloc((n + 6) * sizeof *lens);
    if (!order || !argv || !lens) {
        free(order);
        free(argv);
        free(lens);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        order[i][0] = r->cfg.cluster
                          ? idem__key_slot(keys->element[i]->str,
                                           keys->element[i]->len)
                          : 0;
        order[i][1] = (unsigned)i;
    }
    qsort(order, n, sizeof *order, idem__slot_cmp);
    char ret[24];
    snprintf(ret, sizeof ret, "%lld", (long long)s->opts.retention_ms);
    size_t groups = 0;
    int rc = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && order[j][0] == order[i][0])
            j++;
        int argc = 0;
        char nk[24];
        snprintf(nk, sizeof nk, "%zu", j - i);
        argv[argc] = "EVALSHA";
        lens[argc++] = 7;
        argv[argc] = r->shas[script];
        lens[argc++] = 40;
        argv[argc] = nk;
        lens[argc++] = strlen(nk);
        for (size_t k = i; k < j; k++) {
            const redisReply *e = keys->element[order[k][1]];
            argv[argc] = e->str;
            lens[argc++] = e->len;
        }
        argv[argc] = now;
        lens[argc++] = strlen(now);
        if (script == IDEM__S_SWEEP) {
            argv[argc] = ret;
            lens[argc++] = strlen(ret);
        }
        if (redisAppendCommandArgv(conn->c, argc, argv, lens) != REDIS_OK) {
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
            break;
        }
        groups++;
        i = j;
    }
    free(order);
    free(argv);
    free(lens);
    if (!rc && idem__rconn_flush(conn))
        groups = 0, rc = idem__fail(s, IDEM_ECONN, "%s: %s", s->uri,
                                    conn->c->errstr);
    for (size_t g = 0; g < groups; g++) {
        redisReply *rep;
        if (redisGetReply(conn->c, (void **)&rep) != REDIS_OK) {
            rc = idem__fail(s, idem__rconn_timed_out(conn) ? IDEM_ETIMEOUT
                                                           : IDEM_ECONN,
                            "%s: %s", s->uri, conn->c->errstr);
            break;
        }
        if (rep->type == REDIS_REPLY_INTEGER) {
            acc->deleted += (uint64_t)rep->integer;
        } else if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 3) {
            for (int k = 0; k < 3; k++)
                if (rep->element[k]->type == REDIS_REPLY_INTEGER)
                    acc->counts[k] += (uint64_t)rep->element[k]->integer;
        } else if (rep->type == REDIS_REPLY_ERROR &&
                   strncmp(rep->str, "MOVED", 5) != 0 &&
                   strncmp(rep->str, "ASK", 3) != 0 && !acc->err) {
            /* A slot that moved away mid-scan is swept on its new node;
             * any other error is reported once the scan is over. */
            acc->err = IDEM_EPROTO;
            idem__fail(s, IDEM_EPROTO, "%s: sweep: %s", s->uri, rep->str);
            if (strncmp(rep->str, "NOSCRIPT", 8) == 0)
                conn->loaded = 0;
        }
        freeReplyObject(rep);
    }
    if (rc)
        idem__rconn_close(conn);
    return rc;
}

/* Scan node from *cursor until the end or until max_work keys (0: no
 * limit) were seen in this call; *cursor is 0 when the node is done. */
static int idem__scan_node(idem_store *s, idem__redis *r, size_t node,
                           int script, size_t max_work, uint64_t *cursor,
                           idem__scan_acc *acc)
{
    idem__rconn *conn = &r->nodes[node].conns[0];
    int rc = 0;
    if (!conn->c)
        rc = idem__rconn_open(s, r, &r->nodes[node], conn, r->cfg.connect_ms);
    if (rc)
        return rc;
    idem__rconn_deadline(conn, r->cfg.timeout_ms);
    if (!conn->loaded) {
        for (int k = 0; k < IDEM__S_COUNT && !rc; k++) {
            const char *la[3] = {"SCRIPT", "LOAD", idem__script_text(k)};
            size_t ll[3] = {6, 4, strlen(la[2])};
            redisReply *rep = idem__rconn_command(s, conn, 3, la, ll, &rc);
            if (rep && rep->type == REDIS_REPLY_ERROR)
                rc = idem__fail(s, IDEM_EPROTO, "%s: SCRIPT LOAD: %s",
                                s->uri, rep->str);
            freeReplyObject(rep);
        }
        if (rc)
            return rc;
        conn->loaded = 1;
    }
    char now[24] = "";
    if (s->opts.clock)
        snprintf(now, sizeof now, "%lld", (long long)idem__now(s));
    size_t patlen;
    char *pat = idem__scan_pattern(r, &patlen);
    if (!pat)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    do {
        char cur[24];
        snprintf(cur, sizeof cur, "%llu", (unsigned long long)*cursor);
        const char *argv[6] = {"SCAN", cur, "MATCH", pat, "COUNT", "1000"};
        size_t lens[6] = {4, strlen(cur), 5, patlen, 5, 4};
        redisReply *rep = idem__rconn_command(s, conn, 6, argv, lens, &rc);
        if (!rep)
            break;
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_STRING ||
            rep->element[1]->type != REDIS_REPLY_ARRAY) {
            rc = idem__fail(s, IDEM_EPROTO, "%s: SCAN: %s", s->uri,
                            rep->type == REDIS_REPLY_ERROR ? rep->str
                                                           : "bad reply");
            freeReplyObject(rep);
            break;
        }
        *cursor = strtoull(rep->element[0]->str, NULL, 10);
        acc->seen += rep->element[1]->elements;
        rc = idem__scan_page(s, r, conn, rep->element[1], script, now, acc);
        freeReplyObject(rep);
    } while (!rc && *cursor != 0 && (!max_work || acc->seen < max_work));
    free(pat);
    return rc;
}

/* Every node that serves slots (the server, for redis://). */
static int idem__masters(idem_store *s, idem__redis *r, unsigned char **is)
{
    if (r->cfg.cluster && r->map_stale) {
        int rc = idem__map_refresh(s, r, idem__mono_ms() + r->cfg.timeout_ms);
        if (rc)
            return rc;
    }
    *is = calloc(r->nnodes ? r->nnodes : 1, 1);
    if (!*is)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    if (!r->cfg.cluster)
        (*is)[0] = 1;
    else
        for (size_t k = 0; k < IDEM__SLOTS; k++)
            if (r->slots[k])
                (*is)[r->slots[k] - 1] = 1;
    return 0;
}

static int idem__scan_all(idem_store *s, int script, size_t max_work,
                          idem__scan_acc *acc)
{
    idem__redis *r = idem__r(s);
    unsigned char *is;
    int rc = idem__masters(s, r, &is);
    if (rc)
        return rc;
    idem__sigstate sig;
    idem__nosigpipe_begin(&sig);
    /* With a work limit the cursors persist, so successive sweeps walk
     * the whole keyspace a page at a time; stats always start afresh. */
    size_t nn = r->nnodes;
    for (size_t i = 0; i < nn && !rc; i++) {
        if (!is[i])
            continue;
        uint64_t cursor = max_work ? r->scan_cursor[i] : 0;
        rc = idem__scan_node(s, r, i, script, max_work, &cursor, acc);
        if (max_work)
            r->scan_cursor[i] = cursor;
        if (max_work && acc->seen >= max_work)
            break;
    }
    idem__nosigpipe_end(&sig);
    free(is);
    return rc ? rc : acc->err;
}

static int idem__redis_sweep(idem_store *s, size_t max_work,
                             uint64_t *expired)
{
    idem__scan_acc acc = {0};
    int rc = idem__scan_all(s, IDEM__S_SWEEP, max_work, &acc);
    *expired = acc.deleted;
    idem__r(s)->expired_total += acc.deleted;
    return rc;
}

static int idem__redis_stats(idem_store *s, idem_stats *out)
{
    idem__scan_acc acc = {0};
    int rc = idem__scan_all(s, IDEM__S_STATS, 0, &acc);
    out->live_keys = acc.seen;
    out->pending = acc.counts[0];
    out->done = acc.counts[1];
    out->failed = acc.counts[2];
    out->expired_total = idem__r(s)->expired_total;
    return rc;
}

/* ------------------------------------------------------------------------
 * Open and close */

static void idem__redis_free(idem__redis *r)
{
    for (size_t i = 0; i < r->nnodes; i++) {
        for (int k = 0; k < r->cfg.pool; k++) {
            idem__rconn_close(&r->nodes[i].conns[k]);
            free(r->nodes[i].conns[k].in);
        }
        free(r->nodes[i].conns);
        free(r->nodes[i].host);
    }
    free(r->nodes);
    free(r->slots);
    free(r->scan_cursor);
    idem__rcfg_free(&r->cfg);
    free(r);
}

static int idem__redis_close(idem_store *s)
{
    idem__redis_free(idem__r(s));
    s->impl = NULL;
    return 0;
}

/* A redis:// store must not be a cluster node: it would answer MOVED for
 * most keys. */
static int idem__check_single(idem_store *s, idem__redis *r)
{
    idem__rconn *conn = &r->nodes[0].conns[0];
    int rc = idem__rconn_open(s, r, &r->nodes[0], conn, r->cfg.connect_ms);
    if (rc)
        return rc;
    idem__rconn_deadline(conn, r->cfg.timeout_ms);
    const char *argv[2] = {"INFO", "cluster"};
    size_t lens[2] = {4, 7};
    redisReply *rep = idem__rconn_command(s, conn, 2, argv, lens, &rc);
    if (!rep)
        return rc;
    if (rep->type == REDIS_REPLY_STRING &&
        strstr(rep->str, "cluster_enabled:1"))
        rc = idem__fail(s, IDEM_EINVAL, "%s: %s:%d is a cluster node: use "
                        "redis-cluster://", s->uri, r->nodes[0].host,
                        r->nodes[0].port);
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = idem__fail(s, IDEM_EPROTO, "%s: INFO: %s", s->uri, rep->str);
    freeReplyObject(rep);
    return rc;
}

static int idem__redis_open_as(idem_store *s, const char *rest, int cluster)
{
    idem__redis *r = calloc(1, sizeof *r);
    if (!r)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    s->impl = r;
    int rc = idem__rcfg_parse(s, cluster, rest, &r->cfg);
    if (!rc && idem__random_bytes(&r->rid_base, sizeof r->rid_base))
        rc = idem__fail(s, IDEM_EIO, "getrandom failed");
    if (!rc)
        idem__script_shas(r->shas);
    for (size_t i = 0; !rc && i < r->cfg.nseeds; i++) {
        int node = idem__rnode_get(r, r->cfg.hosts[i],
                                   strlen(r->cfg.hosts[i]), r->cfg.ports[i]);
        if (node < 0)
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
        else
            r->nodes[node].is_seed = 1;
    }
    if (!rc && cluster) {
        r->slots = calloc(IDEM__SLOTS, sizeof *r->slots);
        if (!r->slots)
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    if (!rc) {
        idem__sigstate sig;
        idem__nosigpipe_begin(&sig);
        rc = cluster ? idem__map_refresh(s, r, idem__mono_ms() +
                                                   r->cfg.timeout_ms)
                     : idem__check_single(s, r);
        idem__nosigpipe_end(&sig);
    }
    if (rc) {
        idem__redis_free(r);
        s->impl = NULL;
    }
    return rc;
}

static int idem__redis_open(idem_store *s, const char *rest)
{
    return idem__redis_open_as(s, rest, 0);
}

static int idem__cluster_open(idem_store *s, const char *rest)
{
    return idem__redis_open_as(s, rest, 1);
}

#define IDEM__REDIS_OPS                                                    \
    .close = idem__redis_close, .claim_many = idem__redis_claim_many,      \
    .complete_many = idem__redis_complete_many, .fail = idem__redis_fail,  \
    .extend = idem__redis_extend, .get = idem__redis_get,                  \
    .forget = idem__redis_forget, .sync = idem__redis_sync,                \
    .checkpoint_put = NULL, .checkpoint_get = NULL,                        \
    .sweep = idem__redis_sweep, .stats = idem__redis_stats

const struct idem__backend idem__backend_redis = {
    .scheme = "redis", .open = idem__redis_open, IDEM__REDIS_OPS};
const struct idem__backend idem__backend_cluster = {
    .scheme = "redis-cluster", .open = idem__cluster_open, IDEM__REDIS_OPS};
