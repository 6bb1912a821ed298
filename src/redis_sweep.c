/* redis_sweep.c - sweep, stats and dump on Redis: SCAN every master.
 *
 * Records carry a TTL, so Redis removes them on its own. What a sweep is
 * for: records written without a TTL (by hand, by older tools, or when
 * a PEXPIRE was lost), which it deletes once created_ts is older than
 * the retention, and records whose expiry passed under a caller's clock
 * before Redis's own. SCAN MATCH PREFIX* COUNT 1000 walks each master;
 * each page's keys go to one script call per slot (a script may only
 * touch keys of one slot in a cluster), all of a page pipelined.
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
    const char *repair;          /* check: "0" or "1", the last ARGV */
    char first[256];             /* check: the first unreadable record */
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
                       .lease_until = v[0] == IDEM_PENDING ? v[5] : 0,
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

/* Note an error reply of one call; it is reported once the scan is
 * over. A slot that moved away mid-scan is swept on its new node, if
 * that node is scanned later; a check cannot count on that, and says the
 * store changed shape under it. */
static void idem__scan_error(idem_store *s, idem__rconn *conn, int script,
                             const redisReply *rep, idem__scan_acc *acc)
{
    int moved = strncmp(rep->str, "MOVED", 5) == 0 ||
                strncmp(rep->str, "ASK", 3) == 0;
    if (acc->err || (moved && script != IDEM__S_CHECK))
        return;
    if (moved) {
        acc->err = idem__fail(s, IDEM_EPROTO, "%s: a slot moved during the "
                              "check (%s): run it again", s->uri, rep->str);
        return;
    }
    acc->err = IDEM_EPROTO;
    idem__fail(s, IDEM_EPROTO, "%s: scan: %s", s->uri, rep->str);
    if (strncmp(rep->str, "NOSCRIPT", 8) == 0)
        conn->loaded = 0;
}

static int idem__slot_cmp(const void *a, const void *b)
{
    const unsigned *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
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

/* Run `script` over the keys of one SCAN page, grouped by slot. */
static int idem__scan_page(idem_store *s, idem__redis *r, idem__rconn *conn,
                           const redisReply *keys, int script,
                           const char *now, idem__scan_acc *acc)
{
    size_t n = keys->elements;
    if (n == 0)
        return 0;
    unsigned(*order)[2] = malloc(n * sizeof *order);
    const char **argv = malloc((n + 7) * sizeof *argv);
    size_t *lens = malloc((n + 7) * sizeof *lens);
    if (!order || !argv || !lens) {
        free(order);
        free(argv);
        free(lens);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const redisReply *e = keys->element[i];
        if (!idem__ours(r, e))
            continue;
        order[m][0] = r->cfg.cluster ? idem__key_slot(e->str, e->len) : 0;
        order[m++][1] = (unsigned)i;
    }
    n = m;
    qsort(order, n, sizeof *order, idem__slot_cmp);
    char ret[24], days[24];
    snprintf(ret, sizeof ret, "%lld", (long long)s->opts.retention_ms);
    snprintf(days, sizeof days, "%d", r->cfg.days);
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
            argv[argc] = days;
            lens[argc++] = strlen(days);
        } else {
            argv[argc] = "0";  /* the cursor: every key in one call */
            lens[argc++] = 1;
        }
        if (acc->repair) {
            argv[argc] = acc->repair;
            lens[argc++] = 1;
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
            char why[96];
            rc = idem__fail(s, idem__rconn_timed_out(conn) ? IDEM_ETIMEOUT
                                                           : IDEM_ECONN,
                            "%s: %s", s->uri,
                            idem__rconn_why(conn, why, sizeof why));
            break;
        }
        if (rep->type == REDIS_REPLY_ERROR)
            idem__scan_error(s, conn, script, rep, acc);
        else if (idem__take(s, script, rep, acc, NULL) && !acc->err)
            acc->err = idem__fail(s, IDEM_EPROTO, "%s: scan: unexpected "
                                  "reply", s->uri);
        freeReplyObject(rep);
    }
    if (rc)
        idem__rconn_close(conn);
    return rc;
}

/* Day layout, stats and dump: each bucket of a SCAN page, a page of
 * its records per call. */
static int idem__scan_buckets(idem_store *s, idem__rconn *conn,
                              const redisReply *keys, int script,
                              const char *now, idem__scan_acc *acc)
{
    idem__redis *r = idem__r(s);
    int rc = 0;
    for (size_t i = 0; i < keys->elements && !rc && !acc->fn_rc; i++) {
        const redisReply *b = keys->element[i];
        uint64_t cursor = 0;
        if (!idem__ours(r, b))
            continue;
        do {
            char cur[24];
            snprintf(cur, sizeof cur, "%llu", (unsigned long long)cursor);
            const char *argv[7] = {"EVALSHA", r->shas[script], "1", b->str,
                                   now, cur, acc->repair};
            size_t lens[7] = {7, 40, 1, b->len, strlen(now), strlen(cur), 1};
            redisReply *rep = idem__rconn_command(
                s, conn, acc->repair ? 7 : 6, argv, lens, &rc);
            if (!rep)
                break;
            cursor = 0;
            if (rep->type == REDIS_REPLY_ERROR)
                idem__scan_error(s, conn, script, rep, acc);
            else if (idem__take(s, script, rep, acc, &cursor))
                rc = idem__fail(s, IDEM_EPROTO, "%s: scan: unexpected "
                                "reply", s->uri);
            freeReplyObject(rep);
        } while (!rc && cursor && !acc->fn_rc);
    }
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
            const char *la[3] = {"SCRIPT", "LOAD",
                                 idem__script_text(r->cfg.layout, k)};
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
        rc = r->cfg.layout == IDEM__LAYOUT_DAY && script != IDEM__S_SWEEP
                 ? idem__scan_buckets(s, conn, rep->element[1], script, now,
                                      acc)
                 : idem__scan_page(s, r, conn, rep->element[1], script, now,
                                   acc);
        freeReplyObject(rep);
    } while (!rc && *cursor != 0 && (!max_work || acc->seen < max_work) &&
             !acc->fn_rc);
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
        if ((max_work && acc->seen >= max_work) || acc->fn_rc)
            break;
    }
    idem__nosigpipe_end(&sig);
    free(is);
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
    idem__scan_acc acc = {.repair = repair ? "1" : "0"};
    int rc = idem__scan_all(s, IDEM__S_CHECK, 0, &acc);
    out->segments = acc.seen;
    out->records = acc.counts[0];
    out->damaged = acc.counts[1];
    snprintf(out->first_damage, sizeof out->first_damage, "%s", acc.first);
    if (!rc && acc.counts[1] && !repair)
        rc = IDEM_ECORRUPT;
    return rc;
}
