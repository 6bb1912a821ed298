/* redis/sweep.c - sweep, stats and dump on Redis: SCAN every master.
 *
 * Records carry a TTL, so Redis removes them on its own. What a sweep is
 * for: records written without a TTL (by hand, by older tools, or when
 * a PEXPIRE was lost), which it deletes once created_ts is older than
 * the retention, and records whose expiry passed under a caller's clock
 * before Redis's own. SCAN MATCH PREFIX* COUNT 1000 walks each master;
 * each page's keys go to the scripts as one batch of pipe.c, a
 * call per slot (a script may only touch keys of one slot in a cluster)
 * and up to IDEM__GROUP keys: so a sweep loads the scripts, follows
 * MOVED and ASK, and retries through a broken connection as claims do.
 * A SCAN page itself is asked again on a new connection when its own
 * broke: SCAN only reads, and the cursor is the server's.
 *
 * Stats, dump and check follow no redirect: a slot that moved away
 * mid-scan is counted on its new node if that node is scanned later,
 * and a check, which cannot count on that, says the store changed
 * shape under it. A sweep follows them: deleting twice is harmless.
 *
 * The day layout has its whole days to drop instead: SCAN finds the
 * buckets, and a bucket whose days are over goes at once, with UNLINK
 * (its memory is freed off Redis's main thread). Stats and dump read a
 * bucket a page at a time (HSCAN inside the script), one call per page,
 * so that a day of millions of records never holds Redis up for long.
 *
 * Stats and dump answer {cursor, what}: the hash layout's cursor is
 * always 0 (a call covers its keys), the day layout's is the bucket's
 * HSCAN cursor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

static idem__redis *idem__r(idem_store *s)
{
    return s->impl;
}


typedef struct idem__scan_acc {
    uint64_t deleted;
    uint64_t counts[3];
    uint64_t seen;
    int err;
    idem_scan_fn fn;             /* dump: called for each record ... */
    void *ctx;
    int fn_rc;                   /* ... until it answers nonzero */
    int repair;                  /* check: 0 or 1, its last ARGV */
    char first[256];             /* check: the first unreadable record */
    char errmsg[512];            /* the detail of err */
} idem__scan_acc;

static int idem__num(const redisReply *e, int64_t *v)
{
    if (e->type == REDIS_REPLY_INTEGER) {
        *v = e->integer;
        return 0;
    }
    return -1;
}

/* One dumped record: {name, status, token, released, created, expires,
 * lease, attempts, fp, response}. The hash layout's name is
 * PREFIX{KEY}. */
static int idem__dump_one(const idem__redis *r, const redisReply *e,
                          idem__scan_acc *acc)
{
    int64_t v[7];
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 10 ||
        e->element[0]->type != REDIS_REPLY_STRING ||
        e->element[8]->type != REDIS_REPLY_STRING ||
        e->element[9]->type != REDIS_REPLY_STRING)
        return -1;
    for (int i = 0; i < 7; i++)
        if (idem__num(e->element[i + 1], &v[i]))
            return -1;
    if (v[6] < 1 || v[6] > UINT32_MAX)
        return -1;
    const char *key = e->element[0]->str;
    size_t keylen = e->element[0]->len;
    if (r->cfg.layout == IDEM__LAYOUT_HASH) {
        size_t p = r->cfg.prefixlen;
        if (keylen < p + 2 || memcmp(key, r->cfg.prefix, p) != 0 ||
            key[p] != '{' || key[keylen - 1] != '}')
            return 0;  /* not a name idem gave: not an idem record */
        key += p + 1;
        keylen -= p + 2;
    }
    const redisReply *fp = e->element[8], *d = e->element[9];
    idem_record rec = {.state = (idem_state)v[0], .token = (uint64_t)v[1],
                       .attempts = (uint32_t)v[6], .released = (int)v[2],
                       .created_ms = v[3], .expires_ms = v[4],
                       .lease_until = v[0] == IDEM_STATE_PENDING ? v[5] : 0,
                       .has_fp = fp->len == IDEM_FP_LEN,
                       .data = d->len ? d->str : NULL, .len = d->len};
    if (rec.has_fp)
        memcpy(rec.fp, fp->str, IDEM_FP_LEN);
    acc->fn_rc = acc->fn(acc->ctx, key, keylen, &rec);
    return 0;
}

/* Take the answer of one script call. Stats and dump answers are
 * {cursor, what}: *cursor gets the cursor (NULL: not wanted). */
static int idem__take(idem_store *s, int script, const redisReply *rep,
                      idem__scan_acc *acc, uint64_t *cursor)
{
    idem__redis *r = idem__r(s);
    if (script == IDEM__S_SWEEP && rep->type == REDIS_REPLY_INTEGER) {
        acc->deleted += (uint64_t)rep->integer;
        return 0;
    }
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING ||
        rep->element[1]->type != REDIS_REPLY_ARRAY)
        return -1;
    if (cursor)
        *cursor = strtoull(rep->element[0]->str, NULL, 10);
    const redisReply *w = rep->element[1];
    if (script == IDEM__S_CHECK) {
        if (w->elements != 4 || w->element[0]->type != REDIS_REPLY_INTEGER ||
            w->element[1]->type != REDIS_REPLY_INTEGER ||
            w->element[2]->type != REDIS_REPLY_STRING ||
            w->element[3]->type != REDIS_REPLY_STRING)
            return -1;
        acc->counts[0] += (uint64_t)w->element[0]->integer;
        acc->counts[1] += (uint64_t)w->element[1]->integer;
        if (!acc->first[0] && w->element[2]->len)
            snprintf(acc->first, sizeof acc->first, "%.*s: %s",
                     (int)w->element[2]->len, w->element[2]->str,
                     w->element[3]->str);
        return 0;
    }
    if (script == IDEM__S_STATS) {
        for (size_t k = 0; k < 3 && k < w->elements; k++)
            if (w->element[k]->type == REDIS_REPLY_INTEGER)
                acc->counts[k] += (uint64_t)w->element[k]->integer;
        return 0;
    }
    for (size_t k = 0; k < w->elements && !acc->fn_rc; k++)
        if (idem__dump_one(r, w->element[k], acc))
            return -1;
    return 0;
}

/* Note an error of one call; it is reported once the scan is over. A
 * redirect (moved) ends a check only: see above. */
static void idem__scan_error(idem_store *s, int script, int moved,
                             idem__scan_acc *acc)
{
    if (acc->err || (moved && script != IDEM__S_CHECK))
        return;
    acc->err = IDEM_EPROTO;
    if (moved)
        snprintf(acc->errmsg, sizeof acc->errmsg, "a slot moved during the "
                 "check (%s): run it again", idem_errdetail(s));
    else
        idem__scopy(acc->errmsg, sizeof acc->errmsg, idem_errdetail(s));
}

/* Take what command c of a scan batch answered; *cursor (NULL: not
 * wanted) gets its cursor, 0 when it has none. */
static void idem__take_cmd(idem_store *s, const idem__rbatch *b,
                           const idem__rcmd *c, idem__scan_acc *acc,
                           uint64_t *cursor)
{
    if (cursor)
        *cursor = 0;
    if (c->status) {
        idem__scan_error(s, b->script, c->moved, acc);
    } else if (idem__take(s, b->script, c->reply, acc, cursor)) {
        idem__fail(s, IDEM_EPROTO, "%s: scan: unexpected reply", s->uri);
        idem__scan_error(s, b->script, 0, acc);
    }
}

/* A batch of up to n keys found by SCAN, for script: they are named
 * whole, answered whole, and stay on their node unless swept (see
 * above). multi: a call per slot for many keys; else one per key. */
static int idem__scan_batch(idem_store *s, idem__rbatch *b, int script,
                            size_t n, int multi)
{
    int rc = idem__batch_init(s, b, script, n);
    if (rc)
        return rc;
    b->multi = multi;
    b->raw = 1;
    b->whole = 1;
    b->stay = script != IDEM__S_SWEEP;
    return 0;
}

/* Run a scan batch and take its answers, in order; item i's cursor to
 * cursors[i] (NULL: not wanted). */
static int idem__scan_run(idem_store *s, idem__rbatch *b,
                          idem__scan_acc *acc, uint64_t *cursors)
{
    int rc = idem__run(s, b, b->script == IDEM__S_SWEEP || acc->repair);
    for (size_t i = 0; i < b->n && !rc && !acc->fn_rc; i++) {
        const idem__rcmd *c = &b->cmds[i];
        idem__take_cmd(s, b, c, acc,
                       cursors ? &cursors[b->order[c->first]] : NULL);
    }
    return rc;
}

/* The glob pattern matching every key under the prefix (day layout:
 * every bucket). */
static char *idem__scan_pattern(const idem__redis *r, size_t *len)
{
    static const char bucket[] =
        "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]:{*}";
    char *p = malloc(2 * r->cfg.prefixlen + sizeof bucket + 3);
    size_t n = 0;
    if (!p)
        return NULL;
    for (size_t i = 0; i < r->cfg.prefixlen; i++) {
        char ch = r->cfg.prefix[i];
        if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\')
            p[n++] = '\\';
        p[n++] = ch;
    }
    if (r->cfg.layout == IDEM__LAYOUT_DAY) {
        memcpy(p + n, bucket, sizeof bucket);
        n += sizeof bucket - 1;
    } else {
        memcpy(p + n, "{*", 3);  /* PREFIX{KEY}: not the layout mark */
        n += 2;
    }
    *len = n;
    return p;
}

/* Is a key SCAN found one of this store's? In the day layout its name
 * must end in the tag of the shard its slot belongs to, so that a sweep
 * never drops another application's hash that merely looks like a
 * bucket. (The hash layout's scripts look inside each key instead.) */
static int idem__ours(const idem__redis *r, const redisReply *e)
{
    if (r->cfg.layout != IDEM__LAYOUT_DAY)
        return 1;
    const char *open = memchr(e->str, '{', e->len);
    if (!open || e->len < 2 || e->str[e->len - 1] != '}')
        return 0;
    unsigned slot = idem__key_slot(e->str, e->len);
    unsigned n = (unsigned)r->cfg.shards;
    unsigned i = slot * n / IDEM__SLOTS;  /* the shard, if it is one */
    while (i < n && r->cfg.tag_slots[i] < slot)
        i++;
    if (i >= n || r->cfg.tag_slots[i] != slot)
        return 0;
    size_t tl = (size_t)(e->str + e->len - 1 - (open + 1));
    return tl == strlen(r->cfg.tags[i]) &&
           memcmp(open + 1, r->cfg.tags[i], tl) == 0;
}

/* Run script over the keys of one SCAN page: the hash layout's, and
 * the day layout's buckets to sweep. */
static int idem__scan_page(idem_store *s, const redisReply *keys, int script,
                           idem__scan_acc *acc)
{
    idem__redis *r = idem__r(s);
    idem__rbatch b;
    int rc = idem__scan_batch(s, &b, script, keys->elements, 1);
    for (size_t i = 0; i < keys->elements && !rc; i++) {
        const redisReply *e = keys->element[i];
        if (idem__ours(r, e) && !idem__item_add(s, &b, e->str, e->len))
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    if (!rc && script == IDEM__S_SWEEP) {
        idem__batch_common(&b, 0, s->opts.retention_ms);
        idem__batch_common(&b, 1, r->cfg.days);
    } else if (!rc) {
        idem__batch_common(&b, 0, 0);  /* the cursor: every key at once */
        if (script == IDEM__S_CHECK)
            idem__batch_common(&b, 1, acc->repair);
    }
    if (!rc)
        rc = idem__scan_run(s, &b, acc, NULL);
    idem__batch_free(&b);
    return rc;
}

/* Where the day layout's scan of a SCAN page's buckets is: per bucket
 * its HSCAN cursor and whether it has more; per item of a round its
 * bucket and next cursor. */
typedef struct idem__bucket_scan {
    uint64_t *cur;
    unsigned char *todo;
    size_t *idx;
    uint64_t *next;
} idem__bucket_scan;

/* One round of the day layout's bucket pages: a call for each bucket
 * of the SCAN page that has more, side by side. */
static int idem__bucket_round(idem_store *s, const redisReply *keys,
                              int script, idem__scan_acc *acc,
                              idem__bucket_scan *bs)
{
    uint64_t *cur = bs->cur;
    unsigned char *todo = bs->todo;
    size_t *idx = bs->idx;
    size_t n = keys->elements, m = 0;
    idem__rbatch b;
    int rc = idem__scan_batch(s, &b, script, n, 0);
    for (size_t i = 0; i < n && !rc; i++) {
        if (!todo[i])
            continue;
        const redisReply *e = keys->element[i];
        idem__ritem *it = idem__item_add(s, &b, e->str, e->len);
        if (!it) {
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
            break;
        }
        int len = snprintf(it->num[0], sizeof it->num[0], "%llu",
                           (unsigned long long)cur[i]);
        idem__arg(it, it->num[0], (size_t)len);
        if (script == IDEM__S_CHECK)
            idem__argnum(it, 1, acc->repair);
        idx[m++] = i;
    }
    if (!rc)
        rc = idem__scan_run(s, &b, acc, bs->next);
    for (size_t j = 0; j < m && !rc; j++) {
        cur[idx[j]] = bs->next[j];
        todo[idx[j]] = bs->next[j] != 0;
    }
    idem__batch_free(&b);
    return rc;
}

/* Day layout, stats, dump and check: every bucket of a SCAN page, a
 * page of its records per call, until each bucket is read to its end. */
static int idem__scan_buckets(idem_store *s, const redisReply *keys,
                              int script, idem__scan_acc *acc)
{
    idem__redis *r = idem__r(s);
    size_t n = keys->elements ? keys->elements : 1;
    idem__bucket_scan bs = {calloc(n, sizeof *bs.cur), calloc(n, 1),
                            calloc(n, sizeof *bs.idx),
                            calloc(n, sizeof *bs.next)};
    int rc = 0, more = 0;
    if (!bs.cur || !bs.todo || !bs.idx || !bs.next)
        rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
    for (size_t i = 0; i < keys->elements && !rc; i++)
        more |= bs.todo[i] = (unsigned char)idem__ours(r, keys->element[i]);
    while (!rc && more && !acc->fn_rc) {
        rc = idem__bucket_round(s, keys, script, acc, &bs);
        more = 0;
        for (size_t i = 0; i < keys->elements; i++)
            more |= bs.todo[i];
    }
    free(bs.cur);
    free(bs.todo);
    free(bs.idx);
    free(bs.next);
    return rc;
}

/* One try of a SCAN page (or an INFO) on node's first connection,
 * connecting first if it is down. The reply, or NULL with *rc the error. */
static redisReply *idem__scan_try(idem_store *s, size_t node, int64_t left,
                                  int argc, const char **argv,
                                  const size_t *lens, int *rc)
{
    idem__redis *r = idem__r(s);
    idem__rnode *nd = &r->nodes[node];
    idem__rconn *conn = &nd->conns[0];
    int64_t ms = left < r->cfg.connect_ms ? left : r->cfg.connect_ms;
    if (!conn->c && (*rc = idem__rconn_open(s, r, nd, conn, ms)) != 0)
        return NULL;
    idem__rconn_deadline(conn, left);
    redisReply *rep = idem__rconn_command(s, conn, argc, argv, lens, rc);
    if (rep && rep->type == REDIS_REPLY_ERROR && idem__transient(rep->str)) {
        *rc = idem__fail(s, IDEM_ETIMEOUT, "%s: %s: %s", s->uri, argv[0],
                         rep->str);
        freeReplyObject(rep);
        return NULL;
    }
    return rep;
}

/* A SCAN page of node, asked again on a new connection while the
 * connection breaks or the node is busy, within the call's budget as
 * claims are: SCAN only reads, and asking again for a cursor returns
 * that page again. INFO, which only reads too, goes the same way. */
static redisReply *idem__scan_call(idem_store *s, size_t node, int argc,
                                   const char **argv, const size_t *lens,
                                   int *rc)
{
    idem__redis *r = idem__r(s);
    int64_t deadline = idem__mono_ms() + r->cfg.timeout_ms;
    int64_t backoff = 10;
    /* A failure that a retry cures leaves the detail as it was. */
    char before[sizeof s->detail];
    idem__scopy(before, sizeof before, s->detail);
    for (;;) {
        int64_t left = deadline - idem__mono_ms();
        redisReply *rep = left > 0 ? idem__scan_try(s, node, left, argc,
                                                    argv, lens, rc)
                                   : NULL;
        if (rep)
            idem__scopy(s->detail, sizeof s->detail, before);
        if (rep || (*rc != IDEM_ECONN && *rc != IDEM_ETIMEOUT))
            return rep;
        /* The node may be gone for good (a failover): the next scan
         * asks where the masters are first. */
        r->map_stale = idem__has_map(r);
        if (left <= 0)
            return rep;
        left = deadline - idem__mono_ms();
        idem__sleep_ms(backoff < left ? backoff : left > 0 ? left : 0);
        backoff = backoff * 2 > 500 ? 500 : backoff * 2;
    }
}

/* Scan node from *cursor until the end or until max_work keys (0: no
 * limit) were seen in this call; *cursor is 0 when the node is done. */
static int idem__scan_node(idem_store *s, size_t node, int script,
                           size_t max_work, uint64_t *cursor,
                           idem__scan_acc *acc)
{
    idem__redis *r = idem__r(s);
    size_t patlen;
    char *pat = idem__scan_pattern(r, &patlen);
    if (!pat)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    int rc = 0;
    do {
        char cur[24];
        snprintf(cur, sizeof cur, "%llu", (unsigned long long)*cursor);
        const char *argv[6] = {"SCAN", cur, "MATCH", pat, "COUNT", "1000"};
        size_t lens[6] = {4, strlen(cur), 5, patlen, 5, 4};
        redisReply *rep = idem__scan_call(s, node, 6, argv, lens, &rc);
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
        rc = r->cfg.layout == IDEM__LAYOUT_DAY && script != IDEM__S_SWEEP
                 ? idem__scan_buckets(s, rep->element[1], script, acc)
                 : idem__scan_page(s, rep->element[1], script, acc);
        freeReplyObject(rep);
    } while (!rc && *cursor != 0 && (!max_work || acc->seen < max_work) &&
             !acc->fn_rc);
    free(pat);
    return rc;
}

/* Every node that serves slots (the server, for redis://; the master,
 * for redis-sentinel://). */
static int idem__masters(idem_store *s, idem__redis *r, unsigned char **is)
{
    if (idem__has_map(r) && r->map_stale) {
        int rc = idem__map_refresh(s, r, idem__mono_ms() + r->cfg.timeout_ms);
        if (rc)
            return rc;
    }
    *is = calloc(r->nnodes ? r->nnodes : 1, 1);
    if (!*is)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    if (!r->cfg.cluster)
        (*is)[r->single] = 1;
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
        rc = idem__scan_node(s, i, script, max_work, &cursor, acc);
        if (max_work)
            r->scan_cursor[i] = cursor;
        if ((max_work && acc->seen >= max_work) || acc->fn_rc)
            break;
    }
    idem__nosigpipe_end(&sig);
    free(is);
    if (!rc && acc->err)
        idem__scopy(s->detail, sizeof s->detail, acc->errmsg);
    return rc ? rc : acc->err;
}

int idem__redis_sweep(idem_store *s, size_t max_work,
                             uint64_t *expired)
{
    idem__scan_acc acc = {0};
    *expired = 0;
    if (s->opts.flags & IDEM_O_READONLY)
        return idem__fail(s, IDEM_EINVAL, "the store was opened read-only");
    int rc = idem__scan_all(s, IDEM__S_SWEEP, max_work, &acc);
    *expired = acc.deleted;
    idem__r(s)->expired_total += acc.deleted;
    return rc;
}

int idem__redis_stats(idem_store *s, idem_stats *out)
{
    idem__scan_acc acc = {0};
    int rc = idem__scan_all(s, IDEM__S_STATS, 0, &acc);
    /* Hash layout: the keys under the prefix; day layout: the records
     * in the buckets. */
    out->live_keys = idem__r(s)->cfg.layout == IDEM__LAYOUT_DAY
                         ? acc.counts[0] + acc.counts[1] + acc.counts[2]
                         : acc.seen;
    out->pending = acc.counts[0];
    out->done = acc.counts[1];
    out->failed = acc.counts[2];
    out->expired_total = idem__r(s)->expired_total;
    return rc;
}

int idem__redis_scan(idem_store *s, idem_scan_fn fn, void *ctx)
{
    idem__scan_acc acc = {.fn = fn, .ctx = ctx};
    int rc = idem__scan_all(s, IDEM__S_DUMP, 0, &acc);
    return acc.fn_rc ? acc.fn_rc : rc;
}

int idem__redis_check(idem_store *s, int repair, idem_check_report *out)
{
    idem__scan_acc acc = {.repair = repair != 0};
    int rc = idem__scan_all(s, IDEM__S_CHECK, 0, &acc);
    out->segments = acc.seen;
    out->records = acc.counts[0];
    out->damaged = acc.counts[1];
    snprintf(out->first_damage, sizeof out->first_damage, "%s", acc.first);
    if (!rc && acc.counts[1] && !repair)
        rc = IDEM_ECORRUPT;
    return rc;
}

/* One INFO field of a reply's text ("name:value\r\n"), or -1. */
static int64_t idem__info_field(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n')) {
        p += *p == '\n';
        if (!strncmp(p, name, n) && p[n] == ':')
            return strtoll(p + n + 1, NULL, 10);
    }
    return -1;
}

/* INFO of node i into *out. */
static int idem__node_info(idem_store *s, size_t i, idem_server_metrics *out)
{
    idem__redis *r = idem__r(s);
    const char *argv[1] = {"INFO"};
    size_t lens[1] = {4};
    int rc = 0;
    redisReply *rep = idem__scan_call(s, i, 1, argv, lens, &rc);
    if (!rep)
        return rc;
    if (rep->type != REDIS_REPLY_STRING) {
        freeReplyObject(rep);
        return idem__fail(s, IDEM_EPROTO, "%s: INFO: bad reply", s->uri);
    }
    snprintf(out->node, sizeof out->node, "%s:%d", r->nodes[i].host,
             r->nodes[i].port);
    out->evicted_keys = idem__info_field(rep->str, "evicted_keys");
    out->used_memory_bytes = idem__info_field(rep->str, "used_memory");
    out->keyspace_hits = idem__info_field(rep->str, "keyspace_hits");
    out->keyspace_misses = idem__info_field(rep->str, "keyspace_misses");
    freeReplyObject(rep);
    return 0;
}

int idem__redis_server_metrics(idem_store *s, idem_server_metrics *out,
                               size_t max, size_t *n)
{
    idem__redis *r = idem__r(s);
    unsigned char *is;
    int rc = idem__masters(s, r, &is);
    if (rc)
        return rc;
    idem__sigstate sig;
    idem__nosigpipe_begin(&sig);
    for (size_t i = 0; i < r->nnodes && !rc; i++) {
        if (!is[i])
            continue;
        if (*n < max)
            rc = idem__node_info(s, i, &out[*n]);
        ++*n;
    }
    idem__nosigpipe_end(&sig);
    free(is);
    return rc;
}
