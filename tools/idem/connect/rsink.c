/* rsink.c - a Redis Stream as the output of dedup and run.
 *
 * Each output line becomes one entry (XADD), pipelined per commit: the
 * line's top-level members are its fields in order (string values
 * decoded, any other value as its JSON text), and the field idem-key
 * holds the message's key (set_key). A line that is not a JSON
 * object (--line) is one field, data.
 *
 * Exactly once without a transaction across the stream and the store:
 * the job's checkpoint, committed with the batch's records, holds the ID
 * of the last entry written before it (rs_sink_pos). Writes of a batch
 * happen before its commit, so after a crash the entries past that ID
 * are exactly those of batches that may not have committed. The next
 * run reads them back (rs_sink_read_back) and, for a message whose key
 * it finds there, writes nothing again and records the outcome found
 * (for run: the status and result fields), so a handler's answer is not
 * asked for twice either.
 *
 * Another worker's crash is the other case: a key it wrote and did not
 * commit is taken over here once its lease ran out. A claim that is not
 * a key's first (idem_msg.attempt > 1) therefore looks in the entries of
 * the last readback_ms (default: twice the lease and 10 s) before
 * writing. Those are kept up to date, never trusted from before the
 * question (rs_catch_up): the other worker may have written just before
 * it died, and the claim came after. A worker stalled longer than
 * readback_ms between its write and its commit (its commit then fails
 * with IDEM_ELOST) can still leave a second entry: docs/streams.md says
 * so.
 *
 * Only a claim that may follow such a write asks (stream.c): not the
 * key's first, or of an entry handed out before, or of files read again
 * after a crash. A key's first claim, or one after its record expired,
 * is new, and an entry of that key committed long ago must not hide it;
 * so an entry read back stops being found once it has been taken for
 * this run's output (rs_forget). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

#include "cli.h"
#include "keymap.h"
#include "rconn.h"
#include "rstream.h"

#define PAGE "1000"  /* entries per XRANGE while reading back */
#define PAGE_N 1000

typedef struct rs_sink {
    sink base;
    const char *cmd;
    rs_uri u;
    rs_conn c;
    int64_t window_ms;
    char pos[32];
    char last[32];       /* ID of the last entry of the pipeline */
    size_t queued;       /* XADDs sent, replies not read */
    keymap back;         /* read back after the checkpoint */
    keymap recent;       /* the last window_ms, for takeovers */
    int64_t recent_at;   /* when it was read whole (monotonic ms), 0:
                          * never */
    char recent_last[40];  /* the last entry ID read into it */
    /* One entry being built: fields as offsets into buf. */
    cli_buf buf;
    size_t *off, *len, nf, capf;
    const char **argv;   /* XADD's arguments, reused */
    size_t *argl, capargv;
    int has_key;
    size_t key_field;    /* its index in off/len */
    int depth;
    size_t vstart;
    const char *text;
    yajl_handle y;
} rs_sink;

static void rs_close(sink *base);
static const sink_ops rs_sink_ops;


static int fail(rs_sink *k, const char *what, const redisReply *r)
{
    cli_fail(k->cmd, "%s: %s: %s", k->u.display, what,
             r ? r->str : k->c.err);
    return -1;
}

sink *rs_sink_open(const char *cmd, const char *uri, int64_t lease_ms,
                   int *status)
{
    rs_sink *k = calloc(1, sizeof *k);
    if (!k) {
        *status = cli_fail(cmd, "out of memory");
        return NULL;
    }
    k->base.ops = &rs_sink_ops;
    k->cmd = cmd;
    if ((*status = rs_uri_parse(cmd, uri, 1, &k->u)) != 0) {
        rs_close(&k->base);
        return NULL;
    }
    k->c.u = &k->u;
    k->window_ms = k->u.readback_ms ? k->u.readback_ms
                                    : 2 * lease_ms + 10000;
    snprintf(k->pos, sizeof k->pos, "0-0");
    return &k->base;
}

static void rs_close(sink *base)
{
    rs_sink *k = (rs_sink *)base;
    rs_conn_close(&k->c);
    rs_uri_free(&k->u);
    km_free(&k->back);
    km_free(&k->recent);
    cli_buf_free(&k->buf);
    free(k->off);
    free(k->len);
    free(k->argv);
    free(k->argl);
    if (k->y)
        yajl_free(k->y);
    free(k);
}

static const char *rs_pos(const sink *base)
{
    return ((const rs_sink *)base)->pos;
}

static const char *rs_name(const sink *base)
{
    return ((const rs_sink *)base)->u.display;
}

/* A new job starts at the stream's last entry ("0-0" if empty). */
static int rs_start(sink *base)
{
    rs_sink *k = (rs_sink *)base;
    const char *argv[] = {"XREVRANGE", k->u.stream, "+", "-", "COUNT", "1"};
    size_t lens[] = {9, k->u.streamlen, 1, 1, 5, 1};
    redisReply *r = rs_call(&k->c, 6, argv, lens, 0, 1);
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        fail(k, "XREVRANGE", r && r->type == REDIS_REPLY_ERROR ? r : NULL);
        if (r)
            freeReplyObject(r);
        return -1;
    }
    snprintf(k->pos, sizeof k->pos, "0-0");
    if (r->elements)
        snprintf(k->pos, sizeof k->pos, "%.*s",
                 (int)r->element[0]->element[0]->len,
                 r->element[0]->element[0]->str);
    freeReplyObject(r);
    return 0;
}

/* The value of field name in entry fields f, or NULL. */
static const redisReply *field(const redisReply *f, const char *name)
{
    for (size_t i = 0; i + 1 < f->elements; i += 2)
        if (f->element[i]->len == strlen(name) &&
            !memcmp(f->element[i]->str, name, f->element[i]->len))
            return f->element[i + 1];
    return NULL;
}

/* Remember the keys of entries e[0..n) in m. 0 or -1. */
static int remember(keymap *m, const redisReply *entries)
{
    for (size_t i = 0; i < entries->elements; i++) {
        const redisReply *f = entries->element[i]->element[1];
        if (f->type != REDIS_REPLY_ARRAY)
            continue;
        const redisReply *key = field(f, "idem-key"),
                         *st = field(f, "status"), *res = field(f, "result");
        if (key && km_put(m, key->str, key->len, st ? st->str : "",
                          st ? st->len : 0, res ? res->str : "",
                          res ? res->len : 0))
            return -1;
    }
    return 0;
}

/* Every entry after ID from (exclusive) into m; from becomes the last
 * ID read (40 bytes). 0 or -1. */
static int scan_after(rs_sink *k, char *from, keymap *m)
{
    char start[42];
    snprintf(start, sizeof start, "(%s", from);
    for (;;) {
        const char *argv[] = {"XRANGE", k->u.stream, start, "+", "COUNT",
                              PAGE};
        size_t lens[] = {6, k->u.streamlen, strlen(start), 1, 5,
                         strlen(PAGE)};
        redisReply *r = rs_call(&k->c, 6, argv, lens, 0, 1);
        if (!r || r->type != REDIS_REPLY_ARRAY) {
            fail(k, "reading the stream back (XRANGE)",
                 r && r->type == REDIS_REPLY_ERROR ? r : NULL);
            if (r)
                freeReplyObject(r);
            return -1;
        }
        size_t n = r->elements;
        int rc = remember(m, r);
        if (!rc && n) {
            snprintf(from, 40, "%.*s",
                     (int)r->element[n - 1]->element[0]->len,
                     r->element[n - 1]->element[0]->str);
            snprintf(start, sizeof start, "(%s", from);
        }
        freeReplyObject(r);
        if (rc)
            return cli_fail(k->cmd, "out of memory"), -1;
        if (n < PAGE_N)
            return 0;
    }
}

static int rs_read_back(sink *base, const char *pos)
{
    rs_sink *k = (rs_sink *)base;
    char from[40];
    snprintf(k->pos, sizeof k->pos, "%s", pos);
    snprintf(from, sizeof from, "%s", pos);
    return scan_after(k, from, &k->back);
}

/* The last window_ms of entries, up to now: what came after the last
 * one read, and all of it again (to forget the older ones) once every
 * half window. */
static int rs_catch_up(sink *base)
{
    rs_sink *k = (rs_sink *)base;
    if (k->recent_at && cli_mono_ms() - k->recent_at < k->window_ms / 2)
        return scan_after(k, k->recent_last, &k->recent);
    const char *argv[] = {"TIME"};
    redisReply *r = rs_call(&k->c, 1, argv, NULL, 0, 1);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
        fail(k, "TIME", r && r->type == REDIS_REPLY_ERROR ? r : NULL);
        if (r)
            freeReplyObject(r);
        return -1;
    }
    long long ms = strtoll(r->element[0]->str, NULL, 10) * 1000 +
                   strtoll(r->element[1]->str, NULL, 10) / 1000;
    freeReplyObject(r);
    snprintf(k->recent_last, sizeof k->recent_last, "%lld",
             ms > k->window_ms ? ms - k->window_ms : 0);
    km_clear(&k->recent);
    k->recent_at = cli_mono_ms();
    return scan_after(k, k->recent_last, &k->recent);
}

static int rs_has(sink *base, const void *key, size_t keylen, int recent,
                  const char **status, const char **result, size_t *rlen)
{
    rs_sink *k = (rs_sink *)base;
    const km_entry *e = km_get(&k->back, key, keylen);
    e = e || !recent ? e : km_get(&k->recent, key, keylen);
    if (!e)
        return 0;
    static const char *const known[] = {"done", "failed", "gave_up"};
    const char *st = NULL;
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (e->alen == strlen(known[i]) && !memcmp(km_a(e), known[i],
                                                   e->alen))
            st = known[i];
    *status = st;
    *result = st && e->blen ? km_b(e) : NULL;
    *rlen = st ? e->blen : 0;
    return 1;
}

/* ---- turning a JSON line into fields */

static int push(rs_sink *k, const void *p, size_t n)
{
    if (k->nf == k->capf) {
        size_t cap = k->capf ? 2 * k->capf : 64;
        size_t *o = realloc(k->off, cap * sizeof *o);
        if (o)
            k->off = o;
        size_t *l = o ? realloc(k->len, cap * sizeof *l) : NULL;
        if (!l)
            return 0;
        k->len = l;
        k->capf = cap;
    }
    k->off[k->nf] = k->buf.len;
    k->len[k->nf++] = n;
    return cli_buf_add(&k->buf, p, n) == 0;
}

/* A scalar or a whole nested value at depth 1 is a field's value. */
static int on_scalar(void *ctx, const char *p, size_t n)
{
    rs_sink *k = ctx;
    return k->depth != 1 || push(k, p, n);
}

static int on_string(void *ctx, const unsigned char *p, size_t n)
{
    return on_scalar(ctx, (const char *)p, n);
}

static int on_number(void *ctx, const char *p, size_t n)
{
    return on_scalar(ctx, p, n);
}

static int on_bool(void *ctx, int b)
{
    return on_scalar(ctx, b ? "true" : "false", b ? 4 : 5);
}

static int on_null(void *ctx)
{
    return on_scalar(ctx, "null", 4);
}

static int on_key(void *ctx, const unsigned char *p, size_t n)
{
    rs_sink *k = ctx;
    if (k->depth != 1)
        return 1;
    if (n == 8 && !memcmp(p, "idem-key", 8)) {
        k->has_key = 1;
        k->key_field = k->nf + 1;  /* its value comes next */
    }
    return push(k, p, n);
}

static int on_open(void *ctx)
{
    rs_sink *k = ctx;
    if (k->depth++ == 1)
        k->vstart = yajl_get_bytes_consumed(k->y) - 1;
    return 1;
}

static int on_close(void *ctx)
{
    rs_sink *k = ctx;
    if (--k->depth == 1)
        return push(k, k->text + k->vstart,
                    yajl_get_bytes_consumed(k->y) - k->vstart);
    return 1;
}

static const yajl_callbacks fields_cb = {
    on_null, on_bool, NULL, NULL, on_number, on_string,
    on_open, on_key, on_close, on_open, on_close};

/* Fields of text[0..len): its members, or one field "data". */
static int to_fields(rs_sink *k, const char *text, size_t len)
{
    k->buf.len = k->nf = 0;
    k->has_key = k->depth = 0;
    k->text = text;
    if (k->y)
        yajl_free(k->y);
    k->y = yajl_alloc(&fields_cb, NULL, k);
    if (!k->y)
        return -1;
    size_t lead = strspn(text, " \t");
    int object = lead < len && text[lead] == '{' &&
                 yajl_parse(k->y, (const unsigned char *)text, len) ==
                     yajl_status_ok &&
                 yajl_complete_parse(k->y) == yajl_status_ok;
    if (object)
        return 0;
    k->buf.len = k->nf = 0;
    k->has_key = 0;
    return push(k, "data", 4) && push(k, text, len) ? 0 : -1;
}

/* The entry's idem-key is this job's key: added, or, when the line
 * carries another one (the output of an idem upstream keyed otherwise),
 * replaced, since read-back looks for this job's keys. 0 or -1. */
static int set_key(rs_sink *k, const void *key, size_t keylen)
{
    if (!k->has_key)
        return push(k, "idem-key", 8) && push(k, key, keylen) ? 0 : -1;
    size_t i = k->key_field;
    if (k->len[i] == keylen && !memcmp(k->buf.p + k->off[i], key, keylen))
        return 0;
    size_t off = k->buf.len;
    if (cli_buf_add(&k->buf, key, keylen))
        return -1;
    k->off[i] = off;
    k->len[i] = keylen;
    return 0;
}

/* Room for n arguments of XADD, kept from entry to entry. 0 or -1. */
static int argv_room(rs_sink *k, size_t n)
{
    if (n <= k->capargv)
        return 0;
    size_t cap = n < 64 ? 64 : 2 * n;
    const char **v = realloc(k->argv, cap * sizeof *v);
    if (v)
        k->argv = v;
    size_t *l = v ? realloc(k->argl, cap * sizeof *l) : NULL;
    if (!l)
        return -1;
    k->argl = l;
    k->capargv = cap;
    return 0;
}

static int rs_put(sink *base, const char *text, size_t len, const void *key,
                  size_t keylen, const char *meta, size_t metalen)
{
    rs_sink *k = (rs_sink *)base;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        len--;
    if (to_fields(k, text, len) || set_key(k, key, keylen))
        return cli_fail(k->cmd, "out of memory"), -1;
    char maxlen[24];
    snprintf(maxlen, sizeof maxlen, "%" PRIu64, k->u.maxlen);
    size_t n = 0;
    if (argv_room(k, k->nf + 6))
        return cli_fail(k->cmd, "out of memory"), -1;
    const char **argv = k->argv;
    size_t *lens = k->argl;
    argv[n] = "XADD", lens[n++] = 4;
    argv[n] = k->u.stream, lens[n++] = k->u.streamlen;
    if (k->u.maxlen) {
        argv[n] = "MAXLEN", lens[n++] = 6;
        argv[n] = "~", lens[n++] = 1;
        argv[n] = maxlen, lens[n++] = strlen(maxlen);
    }
    argv[n] = "*", lens[n++] = 1;
    for (size_t i = 0; i < k->nf; i++)
        argv[n] = k->buf.p + k->off[i], lens[n++] = k->len[i];
    int rc = rs_conn_ready(&k->c) ? fail(k, "connecting", NULL)
             : redisAppendCommandArgv(k->c.c, (int)n, argv, lens) != REDIS_OK
                 ? fail(k, "XADD", NULL)
                 : 0;
    k->queued += rc == 0;
    return rc;
}

/* After a failure nothing queued can be trusted: the connection goes,
 * and the caller fails the batch (the next run reads back). */
static int broken(rs_sink *k, const char *what, const redisReply *r)
{
    snprintf(k->c.err, sizeof k->c.err, "%s", rs_conn_why(&k->c));
    fail(k, what, r && r->type == REDIS_REPLY_ERROR ? r : NULL);
    rs_conn_close(&k->c);
    k->queued = 0;
    return -1;
}

static int wait_replicas(rs_sink *k)
{
    char n[24], ms[24];
    snprintf(n, sizeof n, "%" PRIu64, k->u.wait);
    snprintf(ms, sizeof ms, "%" PRId64, k->u.timeout_ms);
    const char *argv[] = {"WAIT", n, ms};
    redisReply *r = rs_call(&k->c, 3, argv, NULL, k->u.timeout_ms, 0);
    int ok = r && r->type == REDIS_REPLY_INTEGER &&
             (uint64_t)r->integer >= k->u.wait;
    if (!ok)
        cli_fail(k->cmd, "%s: WAIT %s: %s", k->u.display, n,
                 !r ? k->c.err : r->type == REDIS_REPLY_INTEGER
                                     ? "too few replicas acknowledged the "
                                       "entries in time"
                                     : r->str);
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

static int rs_flush(sink *base)
{
    rs_sink *k = (rs_sink *)base;
    for (; k->queued; k->queued--) {
        void *rv = NULL;
        if (redisGetReply(k->c.c, &rv) != REDIS_OK)
            return broken(k, "XADD", NULL);
        redisReply *r = rv;
        if (r->type != REDIS_REPLY_STRING) {
            broken(k, "XADD", r);
            freeReplyObject(r);
            return -1;
        }
        snprintf(k->last, sizeof k->last, "%.*s", (int)r->len, r->str);
        freeReplyObject(r);
    }
    if (k->u.wait && wait_replicas(k))
        return -1;
    if (k->last[0])
        snprintf(k->pos, sizeof k->pos, "%s", k->last);
    return 0;
}

int rs_ident(const char *cmd, const char *uri, int as_sink, char *buf,
             size_t size)
{
    rs_uri u;
    int rc = rs_uri_parse(cmd, uri, as_sink, &u);
    if (!rc)
        rs_uri_ident(&u, 0, buf, size);
    rs_uri_free(&u);
    return rc;
}

static void rs_forget(sink *base, const void *key, size_t keylen)
{
    km_del(&((rs_sink *)base)->back, key, keylen);
}

static const sink_ops rs_sink_ops = {
    .start = rs_start, .read_back = rs_read_back,
    .catch_up = rs_catch_up, .has = rs_has, .forget = rs_forget,
    .put = rs_put, .flush = rs_flush, .pos = rs_pos, .name = rs_name,
    .close = rs_close};
