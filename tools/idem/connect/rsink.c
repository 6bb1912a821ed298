/* rsink.c - a Redis Stream as the output of dedup and run.
 *
 * Each output line becomes one entry (XADD), pipelined per commit: the
 * line's top-level members are its fields in order (string values
 * decoded, any other value as its JSON text), and the field idem-key
 * holds the message's key (set_key). A line that is not a JSON
 * object (--line) is one field, data. A line that came with its fields
 * (dedup from a Redis Stream: META_FIELD meta, connect.h) is written
 * with those, not parsed. The batch's XADDs are formatted into one
 * buffer (resp_command) and sent as one write at the flush, whose
 * answers all come before the commit (below).
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
 * a key's first (idem_msg.attempt > 1), or of an entry handed out
 * before, therefore looks among the entries written since the dead run
 * could have written it: for an entry handed out before, since its
 * first delivery (nd_line.since, from XPENDING: rsource.c), however long
 * ago; otherwise (another entry of the key was held by the dead worker)
 * within the last readback_ms (default: twice the lease and 10 s). The
 * recent entries are kept up to date, never trusted from before the
 * question (rs_catch_up): the other worker may have written just before
 * it died, and the claim came after. Each key keeps its latest entry's
 * time, so that an entry older than the question (of the key's earlier
 * life) is not taken for this one. docs/streams.md says what remains.
 *
 * Only a claim that may follow such a write asks (stream.c): not the
 * key's first, or of an entry handed out before, or of files read again
 * after a crash. A key's first claim, or one after its record expired,
 * is new, and an entry of that key committed long ago must not hide it;
 * so an entry read back stops being found once it has been taken for
 * this run's output (rs_forget).
 *
 * When the stream is on the store's own server (rs_on_store: the same
 * host, port and database), none of that window exists: the sink joins
 * the store (rs_join) and each XADD is queued with the job's checkpoint
 * (idem_checkpoint_write), run by the one script that writes the
 * checkpoint and its completions. The entries, the completions (and the
 * source's XACKs, rsource.c) land together or not at all; a crash leaves
 * nothing written and uncommitted. The position then comes from the
 * script's answers (the XADD IDs), read at the next flush, so the
 * checkpoint holds the position of the commit before: a rerun reads
 * back that one batch of committed entries, whose keys are duplicates,
 * which keeps a restart exact also after a script that failed half way
 * (a write the server refused) or a run that wrote before it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "jfields.h"
#include "keymap.h"
#include "rconn.h"
#include "rlock.h"
#include "rstream.h"

#define PAGE "1000"  /* entries per XRANGE while reading back */
#define PAGE_N 1000
#define CLOCK_SLACK_MS 5000  /* two servers' clocks may differ this much */

typedef struct rs_sink {
    sink base;
    const char *cmd;
    rs_uri u;
    rs_conn c;
    rs_lock *lock;       /* the job's, while it runs (rlock.c) */
    int64_t lease_ms;
    int64_t window_ms;
    char pos[32];
    char last[32];       /* ID of the last entry of the pipeline */
    size_t queued;       /* XADDs queued, replies not read */
    cli_buf out;         /* ... in the protocol's form, until the flush */
    keymap back;         /* read back after the checkpoint */
    keymap recent;       /* entries since recent_from, for takeovers */
    int64_t recent_at;   /* when it was read whole (monotonic ms), 0:
                          * never */
    uint64_t recent_from;  /* it holds every entry from this time on
                            * (ms, the server's clock) ... */
    uint64_t win_from;   /* ... and the window began here then */
    char recent_last[40];  /* the last entry ID read into it */
    jfields f;           /* the entry being built */
    const char **argv;   /* XADD's arguments, reused */
    size_t *argl, capargv;
    int has_key;
    size_t key_field;    /* its index in off/len */
    idem_store *st;      /* joined: XADDs go with its checkpoint */
    size_t lastw;        /* joined: the index of the last XADD queued, */
    int pending;         /* 1 while its batch is queued, 2 once flushed
                          * (its commit has run when the next batch
                          * starts), 0: nothing to read */
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
    k->lease_ms = lease_ms;
    k->window_ms = k->u.readback_ms ? k->u.readback_ms
                                    : 2 * lease_ms + 10000;
    snprintf(k->pos, sizeof k->pos, "0-0");
    return &k->base;
}

static void rs_close(sink *base)
{
    rs_sink *k = (rs_sink *)base;
    rs_lock_drop(k->lock);
    rs_conn_close(&k->c);
    rs_uri_free(&k->u);
    km_free(&k->back);
    km_free(&k->recent);
    jf_free(&k->f);
    cli_buf_free(&k->out);
    free(k->argv);
    free(k->argl);
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

static int rs_lock_job(sink *base, const char *job)
{
    rs_sink *k = (rs_sink *)base;
    return rs_lock_take(k->cmd, &k->u, job, k->lease_ms, &k->lock);
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

/* Remember the keys of entries e[0..n) in m: per key its latest entry's
 * time (ms of its ID, 8 bytes) and status as value a, its result as b.
 * 0 or -1. */
static int remember(keymap *m, const redisReply *entries)
{
    char a[8 + 16];
    for (size_t i = 0; i < entries->elements; i++) {
        const redisReply *e = entries->element[i], *f = e->element[1];
        uint64_t ms, seq;
        if (f->type != REDIS_REPLY_ARRAY ||
            rs_id_parse(e->element[0]->str, e->element[0]->len, &ms, &seq))
            continue;
        const redisReply *key = field(f, "idem-key"),
                         *st = field(f, "status"), *res = field(f, "result");
        size_t stl = st && st->len <= 16 ? st->len : 0;
        memcpy(a, &ms, 8);
        if (stl)
            memcpy(a + 8, st->str, stl);
        if (key && km_put(m, key->str, key->len, a, 8 + stl,
                          res ? res->str : "", res ? res->len : 0))
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

/* Is ID a (text) after ID b? */
static int id_after(const char *a, size_t alen, const char *b)
{
    uint64_t ams, aseq, bms, bseq;
    return !rs_id_parse(a, alen, &ams, &aseq) &&
           !rs_id_parse(b, strlen(b), &bms, &bseq) &&
           (ams > bms || (ams == bms && aseq > bseq));
}

/* XINFO STREAM's fields that tell a trim past a position. */
typedef struct trim_info {
    long long length, added;      /* added: -1 before Redis 7 */
    const redisReply *first, *last;  /* first entry's ID, last ID made */
} trim_info;

static void trim_field(trim_info *t, const redisReply *n,
                       const redisReply *v)
{
    if (n->type != REDIS_REPLY_STRING)
        return;
    if (!strcmp(n->str, "length") && v->type == REDIS_REPLY_INTEGER)
        t->length = v->integer;
    else if (!strcmp(n->str, "entries-added") &&
             v->type == REDIS_REPLY_INTEGER)
        t->added = v->integer;
    else if (!strcmp(n->str, "last-generated-id") &&
             v->type == REDIS_REPLY_STRING)
        t->last = v;
    else if (!strcmp(n->str, "first-entry") &&
             v->type == REDIS_REPLY_ARRAY && v->elements == 2 &&
             v->element[0]->type == REDIS_REPLY_STRING)
        t->first = v->element[0];
}

/* Entries after pos deleted before they could be read back (a trim by
 * maxlen, XTRIM or XDEL) may have been the dead run's: their keys are
 * written again. Said, not hidden, when the stream has lost entries and
 * none is left at or before pos (where a trim would have stopped), so
 * that those right after pos may be among the lost; an older server
 * (no entries-added count) says nothing. */
static void say_trimmed(rs_sink *k, const char *pos)
{
    const char *argv[] = {"XINFO", "STREAM", k->u.stream};
    size_t lens[] = {5, 6, k->u.streamlen};
    redisReply *r = rs_call(&k->c, 3, argv, lens, 0, 1);
    trim_info t = {0, -1, NULL, NULL};
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY &&
                       i + 1 < r->elements; i += 2)
        trim_field(&t, r->element[i], r->element[i + 1]);
    const redisReply *after = t.first ? t.first : t.last;
    if (t.added > t.length && after && id_after(after->str, after->len, pos))
        fprintf(stderr, "idem %s: %s: entries after this job's position %s "
                "may have been deleted (a trim: maxlen, XTRIM, XDEL) before "
                "they could be read back: a key the last run wrote there "
                "without committing it is written again\n", k->cmd,
                k->u.display, pos);
    if (r)
        freeReplyObject(r);
}

static int rs_read_back(sink *base, const char *pos)
{
    rs_sink *k = (rs_sink *)base;
    char from[40];
    snprintf(k->pos, sizeof k->pos, "%s", pos);
    snprintf(from, sizeof from, "%s", pos);
    say_trimmed(k, pos);
    return scan_after(k, from, &k->back);
}

/* Where a lookup for a takeover delivered at `since` starts: the clocks
 * of the source's server and ours may differ by up to CLOCK_SLACK_MS. */
static uint64_t since_start(uint64_t since)
{
    return since > CLOCK_SLACK_MS ? since - CLOCK_SLACK_MS : 0;
}

/* The recent entries up to now, and back to `from` (a takeover's
 * since; 0: none): the last window_ms at least. What came after the last
 * entry read, unless `from` is older than what the map holds, or half a
 * window passed (to forget the older ones): then all of it again. */
static int rs_catch_up(sink *base, uint64_t from)
{
    rs_sink *k = (rs_sink *)base;
    int older = from && since_start(from) < k->recent_from;
    if (k->recent_at && !older &&
        cli_mono_ms() - k->recent_at < k->window_ms / 2)
        return scan_after(k, k->recent_last, &k->recent);
    uint64_t now;
    if (rs_server_ms(&k->c, &now))
        return fail(k, "reading the server's clock", NULL);
    k->win_from = now > (uint64_t)k->window_ms ? now - (uint64_t)k->window_ms
                                               : 0;
    k->recent_from = from && since_start(from) < k->win_from
                         ? since_start(from) : k->win_from;
    /* "MS" as an ID is MS-0; scan_after starts after it. */
    snprintf(k->recent_last, sizeof k->recent_last, "%" PRIu64,
             k->recent_from ? k->recent_from - 1 : 0);
    km_clear(&k->recent);
    k->recent_at = cli_mono_ms();
    return scan_after(k, k->recent_last, &k->recent);
}

/* Is entry e of the recent map one the lookup (since, 0: the window
 * only) is for? */
static int recent_enough(const rs_sink *k, const km_entry *e,
                         uint64_t since)
{
    uint64_t ms, from = k->win_from;
    memcpy(&ms, km_a(e), 8);
    if (since && since_start(since) < from)
        from = since_start(since);
    return ms >= from;
}

static int rs_has(sink *base, const void *key, size_t keylen, int recent,
                  uint64_t since, const char **status, const char **result,
                  size_t *rlen)
{
    rs_sink *k = (rs_sink *)base;
    const km_entry *e = km_get(&k->back, key, keylen);
    if (!e && recent) {
        e = km_get(&k->recent, key, keylen);
        e = e && recent_enough(k, e, since) ? e : NULL;
    }
    if (!e)
        return 0;
    return connect_outcome(km_a(e) + 8, e->alen - 8, km_b(e), e->blen,
                           status, result, rlen);
}

/* The fields a source handed out with the line (META_FIELD records,
 * connect.h), which the line is the JSON object of: taken as they are,
 * not parsed back out of the JSON. 1, or -1 out of memory. */
static int meta_fields(rs_sink *k, const char *meta, size_t metalen)
{
    size_t at = 0;
    meta_rec r;
    k->f.buf.len = k->f.nf = 0;
    while (meta_field_next(meta, metalen, &at, &r))
        if (jf_push(&k->f, r.name, r.namelen) ||
            jf_push(&k->f, r.value, r.valuelen))
            return -1;
    return 1;
}

/* Fields of text[0..len): the fields it came with (meta), else its
 * members, or one field "data"; the index of idem-key's value, if it
 * has one. */
static int to_fields(rs_sink *k, const char *text, size_t len,
                     const char *meta, size_t metalen)
{
    int rc = meta_has_fields(meta, metalen) ? meta_fields(k, meta, metalen)
                                            : jf_parse(&k->f, text, len);
    if (rc < 0)
        return -1;
    if (!rc && (jf_push(&k->f, "data", 4) || jf_push(&k->f, text, len)))
        return -1;
    long i = rc ? jf_find(&k->f, "idem-key") : -1;
    k->has_key = i >= 0;
    k->key_field = i >= 0 ? (size_t)i : 0;
    return 0;
}

/* The entry's idem-key is this job's key: added, or, when the line
 * carries another one (the output of an idem upstream keyed otherwise),
 * replaced, since read-back looks for this job's keys. 0 or -1. */
static int set_key(rs_sink *k, const void *key, size_t keylen)
{
    jfields *f = &k->f;
    if (!k->has_key)
        return jf_push(f, "idem-key", 8) || jf_push(f, key, keylen) ? -1 : 0;
    size_t i = k->key_field;
    if (f->len[i] == keylen && !memcmp(f->buf.p + f->off[i], key, keylen))
        return 0;
    size_t off = f->buf.len;
    if (cli_buf_add(&f->buf, key, keylen))
        return -1;
    f->off[i] = off;
    f->len[i] = keylen;
    return 0;
}

/* "*N\r\n" or "$N\r\n" at p; where it ends. */
static char *resp_head(char *p, char type, size_t n)
{
    char d[24];
    size_t i = 0;
    do
        d[i++] = (char)('0' + n % 10);
    while ((n /= 10) != 0);
    *p++ = type;
    while (i)
        *p++ = d[--i];
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* One command appended to b as the protocol has it (what
 * redisAppendCommandArgv would queue, without an allocation per
 * command): the batch's XADDs go to the server as one write. 0 or -1. */
static int resp_command(cli_buf *b, size_t argc, const char **argv,
                        const size_t *lens)
{
    size_t need = 24;
    for (size_t i = 0; i < argc; i++)
        need += lens[i] + 24;
    if (cli_buf_reserve(b, need))
        return -1;
    char *p = resp_head(b->p + b->len, '*', argc);
    for (size_t i = 0; i < argc; i++) {
        p = resp_head(p, '$', lens[i]);
        memcpy(p, argv[i], lens[i]);
        p += lens[i];
        *p++ = '\r';
        *p++ = '\n';
    }
    b->len = (size_t)(p - b->p);
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

static int rs_join(sink *base, idem_store *st)
{
    rs_sink *k = (rs_sink *)base;
    k->st = rs_on_store(&k->u, st) ? st : NULL;
    return k->st != NULL;
}

/* Joined: the position the last commit's script gave (the ID its last
 * XADD answered); left as it was when that is not known. */
static void joined_pos(rs_sink *k)
{
    const char *id;
    size_t n;
    if (k->pending &&
        idem_checkpoint_reply(k->st, k->lastw, &id, &n) == 0 && n &&
        n < sizeof k->pos)
        snprintf(k->pos, sizeof k->pos, "%.*s", (int)n, id);
    k->pending = 0;
}

/* Joined: the XADD built in argv[0..n) goes with the checkpoint. */
static int queue_xadd(rs_sink *k, size_t n)
{
    size_t at;
    if (k->pending == 2)
        joined_pos(k);
    int rc = idem_checkpoint_write(k->st, (int)n, k->argv, k->argl, 1, &at);
    if (rc)
        return cli_fail(k->cmd, "%s: queueing XADD with the checkpoint: "
                        "%s", k->u.display, idem_errdetail(k->st)), -1;
    k->lastw = at;
    k->pending = 1;
    return 0;
}

static int rs_put(sink *base, const char *text, size_t len, const void *key,
                  size_t keylen, const char *meta, size_t metalen)
{
    /* Redis entries carry no key or headers of their own; a line's meta
     * may hold its fields (stream.c passes them only with the line they
     * make). */
    rs_sink *k = (rs_sink *)base;
    if (rs_lock_lost(k->lock))
        return cli_fail(k->cmd, "%s: the job's lock was not renewed for "
                        "--lease and may be another run's now (this one "
                        "stalled, or lost the server): nothing more is "
                        "written; run the job again", k->u.display), -1;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        len--;
    if (to_fields(k, text, len, meta, metalen) || set_key(k, key, keylen))
        return cli_fail(k->cmd, "out of memory"), -1;
    char maxlen[24];
    snprintf(maxlen, sizeof maxlen, "%" PRIu64, k->u.maxlen);
    size_t n = 0;
    if (argv_room(k, k->f.nf + 6))
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
    for (size_t i = 0; i < k->f.nf; i++)
        argv[n] = k->f.buf.p + k->f.off[i], lens[n++] = k->f.len[i];
    if (k->st)
        return queue_xadd(k, n);
    if (resp_command(&k->out, n, argv, lens))
        return cli_fail(k->cmd, "out of memory"), -1;
    k->queued++;
    return 0;
}

/* After a failure nothing queued can be trusted: the connection goes,
 * and the caller fails the batch (the next run reads back). */
static int broken(rs_sink *k, const char *what, const redisReply *r)
{
    snprintf(k->c.err, sizeof k->c.err, "%s", rs_conn_why(&k->c));
    fail(k, what, r && r->type == REDIS_REPLY_ERROR ? r : NULL);
    rs_conn_close(&k->c);
    k->queued = k->out.len = 0;
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
    if (k->st && k->pending == 2)
        joined_pos(k);  /* a batch of no entries after one of some */
    else if (k->st && k->pending == 1)
        k->pending = 2;
    if (k->st)
        return 0;  /* written by the commit */
    if (k->queued && rs_conn_ready(&k->c)) {
        k->queued = k->out.len = 0;
        return fail(k, "connecting", NULL);
    }
    if (k->queued && redisAppendFormattedCommand(k->c.c, k->out.p,
                                                 k->out.len) != REDIS_OK)
        return broken(k, "XADD", NULL);
    k->out.len = 0;
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

/* MAXLEN ~ N below three times the batch is refused. A crash leaves at
 * most two batches of entries past the checkpoint (one whose sync was
 * in flight, and the next: stream.c, sync_overlaps), and the rerun must
 * find them all (read-back): trimmed, they are written again. Three
 * times the batch leaves a batch of room for what the other writers of
 * the stream (the group's other workers) add before the rerun reads
 * back; docs/streams.md says what more they need. */
static int rs_check(sink *base, uint64_t batch)
{
    rs_sink *k = (rs_sink *)base;
    if (!k->u.maxlen || k->u.maxlen >= 3 * batch)
        return 0;
    return cli_usage_error(k->cmd, "%s: maxlen=~%" PRIu64 " is below three "
                           "times --batch (%" PRIu64 "): a crash leaves up "
                           "to two batches of entries to read back, which "
                           "the trim would delete first, and they would be "
                           "written again. Give maxlen=~%" PRIu64 " or "
                           "more, or a smaller --batch", k->u.display,
                           k->u.maxlen, batch, 3 * batch);
}

static void rs_forget(sink *base, const void *key, size_t keylen)
{
    km_del(&((rs_sink *)base)->back, key, keylen);
}

static const sink_ops rs_sink_ops = {
    .lock = rs_lock_job, .start = rs_start, .read_back = rs_read_back,
    .catch_up = rs_catch_up, .has = rs_has, .forget = rs_forget,
    .join = rs_join, .put = rs_put, .flush = rs_flush, .pos = rs_pos,
    .name = rs_name, .check = rs_check, .close = rs_close};
