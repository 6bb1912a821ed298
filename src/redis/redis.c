/* redis.c - the redis://, redis-cluster:// and redis-sentinel:// store
 * backends.
 *
 * Each operation of the store interface becomes a batch of script calls
 * (pipe.c runs them) and each answer becomes an outcome exactly as
 * local: would give it: the scripts (scripts.c) mirror protocol.c,
 * and this file only translates. A single server and a cluster differ
 * only in routing (cluster.c), and a sentinel store is a single server
 * whose node the sentinels name (sentinel.c), so one set of operations
 * serves the three schemes.
 *
 * There is nothing to flush: a write is applied when its reply arrives,
 * and with wait=N replicated as well, so sync() has nothing left to do,
 * except after a checkpoint was queued: then completes and fails are
 * checked (at once, or for the runner's completions by the sync's own
 * script) and applied together with the checkpoint by sync() (ckpt.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

static idem__redis *idem__r(idem_store *s)
{
    return s->impl;
}

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

static int idem__bad_reply(idem_store *s, const char *what)
{
    return idem__fail(s, IDEM_EPROTO, "%s: unexpected reply to %s", s->uri,
                      what);
}

/* Keys whose own script failed (EPROTO) fail alone; keys the server did
 * not answer for, or whose WAIT was not confirmed, fail the batch. */
static int idem__batch_error(int st)
{
    return st && st != IDEM_EPROTO && st != IDEM_ELOST;
}

static int idem__claim_reply(idem_store *s, const redisReply *rep,
                             int64_t lease_ms, idem_outcome *o)
{
    long long kind, token, lease, attempts;
    if (rep->type == REDIS_REPLY_INTEGER && rep->integer > 0) {
        /* A fresh key: NEW, its first claim, with the script's clock in
         * microseconds for token, so the lease ran from token / 1000. */
        o->kind = IDEM_NEW;
        o->token = (uint64_t)rep->integer;
        o->attempts = 1;
        o->lease_until = rep->integer / 1000 + lease_ms;
        return 0;
    }
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 4 ||
        idem__int_of(rep->element[0], &kind) ||
        idem__int_of(rep->element[1], &token) ||
        idem__int_of(rep->element[2], &lease) ||
        idem__int_of(rep->element[3], &attempts) || kind < IDEM_NEW ||
        kind > IDEM_MISMATCH || token < 1 || attempts < 1 ||
        attempts > UINT32_MAX)
        return idem__bad_reply(s, "claim");
    o->kind = (idem_outcome_kind)kind;
    o->token = (uint64_t)token;
    o->attempts = (uint32_t)attempts;
    o->lease_until = lease;
    /* A NEW over a PENDING record whose lease ran out (scripts.c). */
    if (kind == IDEM_NEW && rep->elements > 4 &&
        rep->element[4]->type == REDIS_REPLY_INTEGER &&
        rep->element[4]->integer == 1)
        idem__ctr_add(&s->m.takeovers, 1);
    if (kind == IDEM_REPLAY || kind == IDEM_FAILED) {
        const redisReply *d = rep->elements > 4 ? rep->element[4] : NULL;
        if (!d || d->type != REDIS_REPLY_STRING)
            return idem__bad_reply(s, "claim");
        o->data = idem__out_keep(s, d->str, d->len);
        o->len = d->len;
        if (!o->data)
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    return 0;
}

/* In the day layout a record lives no longer than its bucket, which
 * lasts at least `days` days after the write that put it there: a TTL
 * or lease beyond that is refused rather than cut short in silence. */
static int idem__ttl_fits(idem_store *s, int64_t ms, const char *what)
{
    const idem__rcfg *cfg = &idem__r(s)->cfg;
    if (cfg->layout != IDEM__LAYOUT_DAY || ms <= cfg->days * IDEM__DAY_MS)
        return 0;
    return idem__fail(s, IDEM_EINVAL, "%s: a %s of %lld ms outlives the "
                      "buckets of layout=day (days=%d)", s->uri, what,
                      (long long)ms, cfg->days);
}

/* A batch of n scripts and the map from its items back to the caller's
 * indexes (items skip the keys refused before the batch). */
static int idem__batch_new(idem_store *s, int script, size_t n,
                           idem__rbatch **bp, size_t **whichp)
{
    idem__rbatch *b = malloc(sizeof *b);
    size_t *which = malloc((n ? n : 1) * sizeof *which);
    int rc = b && which ? idem__batch_init(s, b, script, n)
                        : idem__fail(s, IDEM_ENOMEM, "out of memory");
    if (rc) {
        free(b);
        free(which);
        return rc;
    }
    *bp = b;
    *whichp = which;
    return 0;
}

static void idem__batch_del(idem__rbatch *b, size_t *which)
{
    idem__batch_free(b);
    free(b);
    free(which);
}

/* ------------------------------------------------------------------------
 * Batches over the caller's keys
 *
 * Claims, completes and extends have one shape: each of the caller's n
 * keys that no earlier check refused (its status is 0) becomes an item
 * with its arguments, the batch runs, and each key's reply becomes its
 * status (and outcome). An idem__keyed says what differs. */

typedef struct idem__keyed {
    int script;
    size_t n;                    /* the caller's keys */
    int ncommon;                 /* arguments every key shares ... */
    long long common[2];         /* ... after the time */
    /* Where key i's status goes; nonzero before the run: refused. */
    int *(*status)(void *ctx, size_t i);
    /* Key i as an item of b with its arguments; NULL on ENOMEM. */
    idem__ritem *(*add)(idem_store *s, idem__rbatch *b, size_t i,
                        void *ctx);
    /* Key i's status from its reply (the detail says why if nonzero). */
    int (*answer)(idem_store *s, const redisReply *rep, size_t i,
                  void *ctx);
    void *ctx;
} idem__keyed;

/* Every key not refused yet fails with rc; returns rc. */
static int idem__keyed_refuse(const idem__keyed *k, int rc)
{
    for (size_t i = 0; i < k->n; i++) {
        int *st = k->status(k->ctx, i);
        *st = *st ? *st : rc;
    }
    return rc;
}

/* The keys not refused, as items of b; which[j] is item j's key. */
static int idem__keyed_build(idem_store *s, const idem__keyed *k,
                             idem__rbatch *b, size_t *which)
{
    for (int c = 0; c < k->ncommon; c++)
        idem__batch_common(b, c, k->common[c]);
    for (size_t i = 0; i < k->n; i++) {
        if (*k->status(k->ctx, i))
            continue;
        if (!k->add(s, b, i, k->ctx))
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
        which[b->nitems - 1] = i;
    }
    return 0;
}

/* Each item's answer to its key's status. Returns rc, else the first
 * status that fails the batch. The detail: a key's own refusal if one
 * was answered, else what the run left. */
static int idem__keyed_answers(idem_store *s, const idem__keyed *k,
                               const idem__rbatch *b, const size_t *which,
                               int rc)
{
    char keep[sizeof s->detail];
    idem__scopy(keep, sizeof keep, s->detail);
    for (size_t j = 0; j < b->nitems; j++) {
        const idem__ritem *it = &b->items[j];
        int *st = k->status(k->ctx, which[j]);
        *st = it->reply ? k->answer(s, it->reply, which[j], k->ctx)
                        : it->status;
        if (idem__batch_error(*st) && !rc)
            rc = *st;
        if (*st && it->reply)
            idem__scopy(keep, sizeof keep, s->detail);
    }
    idem__scopy(s->detail, sizeof s->detail, keep);
    return rc;
}

/* Run k's batch, unless rc (an error found before it) refuses every
 * key. 0, or the error that failed the batch. */
static int idem__keyed_run(idem_store *s, const idem__keyed *k, int rc)
{
    idem__rbatch *b = NULL;
    size_t *which = NULL;
    if (!rc)
        rc = idem__batch_new(s, k->script, k->n, &b, &which);
    if (rc)
        return idem__keyed_refuse(k, rc);
    rc = idem__keyed_build(s, k, b, which);
    if (rc) {
        idem__keyed_refuse(k, rc);
        b->nitems = 0;
    } else {
        rc = idem__run(s, b, 1);
    }
    rc = idem__keyed_answers(s, k, b, which, rc);
    idem__batch_del(b, which);
    return rc;
}

/* Claims: the caller's keys and outcomes. */
typedef struct idem__claims {
    const idem_key *keys;
    idem_outcome *outs;
    int64_t lease_ms;
} idem__claims;

static int *idem__claim_status(void *ctx, size_t i)
{
    return &((idem__claims *)ctx)->outs[i].status;
}

static idem__ritem *idem__claim_add(idem_store *s, idem__rbatch *b,
                                    size_t i, void *ctx)
{
    const idem_key *key = &((idem__claims *)ctx)->keys[i];
    idem__ritem *it = idem__item_add(s, b, key->key, key->keylen);
    if (it) {
        idem__arg(it, key->fp, key->fp ? IDEM_FP_LEN : 0);
        idem__argrid(s, it, 0);
    }
    return it;
}

static int idem__claim_answer(idem_store *s, const redisReply *rep,
                              size_t i, void *ctx)
{
    idem__claims *c = ctx;
    return idem__claim_reply(s, rep, c->lease_ms, &c->outs[i]);
}

static int idem__redis_claim_many(idem_store *s, const idem_key *keys,
                                  size_t n, const idem__claim_args *a,
                                  idem_outcome *outs)
{
    idem__claims c = {keys, outs, a->lease_ms};
    idem__keyed k = {.script = a->done ? IDEM__S_CLAIM_DONE : IDEM__S_CLAIM,
                     .n = n, .ncommon = 2, .common = {a->lease_ms, a->ttl_ms},
                     .status = idem__claim_status, .add = idem__claim_add,
                     .answer = idem__claim_answer, .ctx = &c};
    int rc = idem__ttl_fits(s, a->lease_ms, "lease");
    if (!rc)
        rc = idem__ttl_fits(s, a->ttl_ms, "TTL");
    return idem__keyed_run(s, &k, rc);
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
static int idem__finish_reply(idem_store *s, const redisReply *rep,
                              uint64_t token, const char *what)
{
    long long v;
    if (idem__int_of(rep, &v) || v < 0 || v > IDEM__WHY_TAKEN)
        return idem__bad_reply(s, what);
    return v ? idem__why_lost(s, v, token) : 0;
}

int idem__finish_answer_of(idem_store *s, const redisReply *rep,
                        uint64_t token)
{
    return idem__finish_reply(s, rep, token, "complete");
}

/* Completes and extends: the caller's completions and their statuses. */
typedef struct idem__finishes {
    const idem_completion *items;
    int *st;
    const char *what;            /* the script, for messages */
    const char *const *rids;     /* complete: request ids, or NULL */
    int64_t lease_ms;            /* extend: the lease to renew */
} idem__finishes;

static int *idem__finish_status(void *ctx, size_t i)
{
    return &((idem__finishes *)ctx)->st[i];
}

static int idem__finish_answer(idem_store *s, const redisReply *rep,
                               size_t i, void *ctx)
{
    const idem__finishes *f = ctx;
    return idem__finish_reply(s, rep, f->items[i].token, f->what);
}

/* Key i with its token, then a complete's response, TTL and request id,
 * or an extend's lease. */
static idem__ritem *idem__finish_add(idem_store *s, idem__rbatch *b,
                                     size_t i, void *ctx)
{
    const idem__finishes *f = ctx;
    const idem_completion *c = &f->items[i];
    idem__ritem *it = idem__item_add(s, b, c->key, c->keylen);
    if (!it)
        return NULL;
    idem__argnum(it, 0, (long long)c->token);
    if (b->script == IDEM__S_EXTEND) {
        idem__argnum(it, 1, f->lease_ms);
        return it;
    }
    idem__arg(it, c->response, c->len);
    idem__argnum(it, 1, c->ttl_ms ? c->ttl_ms : s->opts.ttl_ms);
    if (f->rids)
        idem__arg(it, f->rids[i], strlen(f->rids[i]));
    else
        idem__argrid(s, it, 2);
    return it;
}

/* The batch of script (complete or extend) over f's n completions, that
 * rc, unless 0, refuses before it runs. */
static int idem__finish_run(idem_store *s, int script, idem__finishes *f,
                            size_t n, int rc)
{
    idem__keyed k = {.script = script, .n = n, .status = idem__finish_status,
                     .add = idem__finish_add, .answer = idem__finish_answer,
                     .ctx = f};
    return idem__keyed_run(s, &k, rc);
}

/* The batch of completes (rids: their request ids, or NULL for new
 * ones) that rc, unless 0, refuses before it runs. */
static int idem__complete_with(idem_store *s, const idem_completion *items,
                               size_t n, int *st, const char *const *rids,
                               int rc)
{
    idem__finishes f = {.items = items, .st = st, .what = "complete",
                        .rids = rids};
    return idem__finish_run(s, IDEM__S_COMPLETE, &f, n, rc);
}

int idem__redis_complete_run(idem_store *s, const idem_completion *items,
                             size_t n, int *st, const char *const *rids)
{
    return idem__complete_with(s, items, n, st, rids, 0);
}

/* With a checkpoint queued, completions wait for idem_sync() (see
 * ckpt.c); otherwise they are applied now. */
static int idem__redis_complete_many(idem_store *s,
                                     const idem_completion *items, size_t n,
                                     int *st)
{
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++)
        if (!st[i] && items[i].ttl_ms)
            rc = idem__ttl_fits(s, items[i].ttl_ms, "TTL");
    if (!rc && idem__ckpt_queued(s))
        return idem__ckpt_hold_completes(s, items, n, st, 1);
    return idem__complete_with(s, items, n, st, NULL, rc);
}

/* Held claims (idem__complete_held) with a checkpoint queued that the
 * sync commits in one script: checked there, so not now (and in layout
 * hash, which that takes, every TTL fits). */
static int idem__redis_complete_held(idem_store *s,
                                     const idem_completion *items, size_t n,
                                     int *st)
{
    if (!idem__ckpt_queued(s) || !idem__ckpt_folds(idem__r(s)))
        return idem__redis_complete_many(s, items, n, st);
    return idem__ckpt_hold_completes(s, items, n, st, 0);
}

int idem__redis_extend_many(idem_store *s, const idem_completion *items,
                            size_t n, int64_t lease_ms, int *st)
{
    idem__finishes f = {.items = items, .st = st, .what = "extend",
                        .lease_ms = lease_ms};
    return idem__finish_run(s, IDEM__S_EXTEND, &f, n,
                            idem__ttl_fits(s, lease_ms, "lease"));
}

int idem__one_begin(idem_store *s, idem__one *one, int script,
                           const void *key, size_t keylen)
{
    one->b = malloc(sizeof *one->b);
    if (!one->b)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    int rc = idem__batch_init(s, one->b, script, 1);
    if (rc) {
        free(one->b);
        return rc;
    }
    one->it = idem__item_add(s, one->b, key, keylen);
    if (!one->it) {
        idem__batch_free(one->b);
        free(one->b);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    return 0;
}

int idem__one_run(idem_store *s, idem__one *one, int write)
{
    int rc = idem__run(s, one->b, write);
    return rc ? rc : one->it->reply ? 0 : one->it->status;
}

void idem__one_end(idem__one *one)
{
    idem__batch_free(one->b);
    free(one->b);
}

int idem__redis_fail_run(idem_store *s, const void *key, size_t keylen,
                         uint64_t token, const void *err, size_t len,
                         int retryable, int64_t ttl_ms, const char *rid)
{
    idem__one one;
    int rc = idem__one_begin(s, &one, IDEM__S_FAIL, key, keylen);
    if (rc)
        return rc;
    idem__argnum(one.it, 0, (long long)token);
    idem__arg(one.it, err, len);
    idem__arg(one.it, retryable ? "1" : "0", 1);
    idem__argnum(one.it, 1, ttl_ms);
    if (rid)
        idem__arg(one.it, rid, strlen(rid));
    else
        idem__argrid(s, one.it, 2);
    rc = idem__one_run(s, &one, 1);
    if (!rc)
        rc = idem__finish_reply(s, one.it->reply, token, "fail");
    idem__one_end(&one);
    return rc;
}

static int idem__redis_fail(idem_store *s, const void *key, size_t keylen,
                            uint64_t token, const void *err, size_t len,
                            int retryable)
{
    if (idem__ckpt_queued(s))
        return idem__ckpt_hold_fail(s, key, keylen, token, err, len,
                                    retryable);
    return idem__redis_fail_run(s, key, keylen, token, err, len, retryable,
                                s->opts.failure_ttl_ms, NULL);
}

/* A renewed lease is its own check, so extend is applied at once even
 * with a checkpoint queued. */
static int idem__redis_extend(idem_store *s, const void *key, size_t keylen,
                              uint64_t token, int64_t lease_ms)
{
    idem_completion one = {key, keylen, token, NULL, 0, 0};
    int st = 0;
    int rc = idem__redis_extend_many(s, &one, 1, lease_ms, &st);
    return rc ? rc : st;
}

static int idem__get_reply(idem_store *s, const redisReply *rep,
                           idem_record *out)
{
    if (rep->type == REDIS_REPLY_NIL)
        return idem__fail(s, IDEM_ENOTFOUND, "no live record for the key");
    long long v[7];
    int ok = rep->type == REDIS_REPLY_ARRAY && rep->elements >= 9;
    for (int i = 0; ok && i < 7; i++)
        ok = idem__int_of(rep->element[i], &v[i]) == 0;
    const redisReply *fp = ok ? rep->element[7] : NULL;
    const redisReply *d = ok ? rep->element[8] : NULL;
    if (!ok || v[6] < 1 || v[6] > UINT32_MAX ||
        fp->type != REDIS_REPLY_STRING ||
        (fp->len != 0 && fp->len != IDEM_FP_LEN) ||
        (d->type != REDIS_REPLY_STRING && d->type != REDIS_REPLY_NIL))
        return idem__bad_reply(s, "get");
    out->state = (idem_state)v[0];
    out->token = (uint64_t)v[1];
    out->attempts = (uint32_t)v[6];
    out->released = (int)v[2];
    out->created_ms = v[3];
    out->expires_ms = v[4];
    out->lease_until = v[0] == IDEM_STATE_PENDING ? v[5] : 0;
    out->has_fp = fp->len == IDEM_FP_LEN;
    if (out->has_fp)
        memcpy(out->fp, fp->str, IDEM_FP_LEN);
    if (d->type == REDIS_REPLY_STRING && d->len) {
        out->data = idem__out_keep(s, d->str, d->len);
        out->len = d->len;
        if (!out->data)
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    return 0;
}

static int idem__redis_get(idem_store *s, const void *key, size_t keylen,
                           idem_record *out)
{
    idem__one one;
    int rc = idem__one_begin(s, &one, IDEM__S_GET, key, keylen);
    if (rc)
        return rc;
    rc = idem__one_run(s, &one, 0);
    if (!rc)
        rc = idem__get_reply(s, one.it->reply, out);
    idem__one_end(&one);
    return rc;
}

static int idem__redis_forget(idem_store *s, const void *key, size_t keylen)
{
    idem__one one;
    int rc = idem__one_begin(s, &one, IDEM__S_FORGET, key, keylen);
    if (rc)
        return rc;
    rc = idem__one_run(s, &one, 1);
    long long v = 0;
    if (!rc && idem__int_of(one.it->reply, &v))
        rc = idem__bad_reply(s, "forget");
    else if (!rc && v == 0)
        rc = idem__fail(s, IDEM_ENOTFOUND, "no live record for the key");
    idem__one_end(&one);
    return rc;
}

static int idem__redis_import(idem_store *s, const void *key, size_t keylen,
                              const idem_record *rec)
{
    static const char *const states[] = {"0", "1", "2"};
    int rc = idem__ttl_fits(s, rec->expires_ms - idem__now(s), "TTL");
    idem__one one;
    if (!rc)
        rc = idem__one_begin(s, &one, IDEM__S_IMPORT, key, keylen);
    if (rc)
        return rc;
    int pending = rec->state == IDEM_STATE_PENDING;
    idem__arg(one.it, states[rec->state], 1);
    idem__argnum(one.it, 0, (long long)rec->token);
    idem__arg(one.it, pending && rec->released ? "1" : "0", 1);
    idem__argnum(one.it, 1, rec->created_ms);
    idem__argnum(one.it, 2, rec->expires_ms);
    idem__argnum(one.it, 3, pending ? rec->lease_until : 0);
    idem__arg(one.it, rec->has_fp ? rec->fp : NULL,
              rec->has_fp ? IDEM_FP_LEN : 0);
    idem__arg(one.it, rec->data, rec->len);
    idem__argnum(one.it, 4, rec->attempts ? rec->attempts : 1);
    rc = idem__one_run(s, &one, 1);
    long long v;
    if (!rc && idem__int_of(one.it->reply, &v))
        rc = idem__bad_reply(s, "import");
    idem__one_end(&one);
    return rc;
}

static int idem__redis_sync(idem_store *s)
{
    return idem__ckpt_sync(s);
}

/* ------------------------------------------------------------------------
 * Open and close */

static void idem__redis_free(idem__redis *r)
{
    idem__sentinels_free(r);
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
    idem__ckpt_free(&r->ck);
    idem__buf_free(&r->wreply);
    idem__rcfg_free(&r->cfg);
    free(r);
}

/* The one server of a redis:// store, as its URI names it. */
static int idem__redis_server(idem_store *s, char *host, size_t hostlen,
                              int *port, int *db)
{
    const idem__rcfg *c = &idem__r(s)->cfg;
    if (c->cluster || c->sentinel || c->nseeds != 1)
        return idem__fail(s, IDEM_ENOTSUP, "%s: not one server", s->uri);
    if (strlen(c->hosts[0]) >= hostlen)
        return idem__fail(s, IDEM_EINVAL, "the host name is too long");
    memcpy(host, c->hosts[0], strlen(c->hosts[0]) + 1);
    *port = c->ports[0];
    *db = c->db;
    return 0;
}

/* Like local:, close commits what is queued (a checkpoint and its
 * writes). */
static int idem__redis_close(idem_store *s)
{
    int rc = idem__ckpt_sync(s);
    idem__redis_free(idem__r(s));
    s->impl = NULL;
    return rc;
}

/* A redis:// store must not be a cluster node: it would answer MOVED for
 * most keys. */
static int idem__check_single(idem_store *s, idem__redis *r)
{
    idem__rnode *node = &r->nodes[r->single];
    idem__rconn *conn = &node->conns[0];
    int rc = idem__rconn_open(s, r, node, conn, r->cfg.connect_ms);
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
                        "redis-cluster://", s->uri, node->host, node->port);
    else if (rep->type == REDIS_REPLY_ERROR)
        rc = idem__fail(s, IDEM_EPROTO, "%s: INFO: %s", s->uri, rep->str);
    freeReplyObject(rep);
    return rc;
}

/* Send the mark script to node (after ASKING if asking) within ms. The
 * reply (the caller frees it), or NULL with the error in *rc. */
static redisReply *idem__ask_node(idem_store *s, idem__redis *r, int node,
                                  int asking, int64_t ms, const char **argv,
                                  const size_t *lens, int *rc)
{
    idem__rconn *conn = &r->nodes[node].conns[0];
    *rc = conn->c ? 0 : idem__rconn_open(s, r, &r->nodes[node], conn,
                                         ms < r->cfg.connect_ms
                                             ? ms : r->cfg.connect_ms);
    if (*rc)
        return NULL;
    idem__rconn_deadline(conn, ms);
    if (asking) {
        const char *aa[1] = {"ASKING"};
        size_t al[1] = {6};
        freeReplyObject(idem__rconn_command(s, conn, 1, aa, al, rc));
        if (*rc)
            return NULL;
    }
    return idem__rconn_command(s, conn, 6, argv, lens, rc);
}

/* Reads the layout mark and, unless read-only, writes it if absent:
 * one script, so that it works on every Redis idem supports. */
static const char idem__mark_lua[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if not v and ARGV[2] == '1' then redis.call('SET', KEYS[1], ARGV[1]) end\n"
    "return v\n";

/* Ask for the mark until an answer that is not "later" or the budget is
 * spent: an open during a failover or a migration waits like a call
 * (MOVED: a new map; ASK: the node it names; TRYAGAIN, LOADING, a
 * refused connection: a moment). A master that hangs while it serves
 * the mark's slot holds every open up until it is failed over. */
static redisReply *idem__mark_ask(idem_store *s, idem__redis *r,
                                  const idem__buf *name, const char *want,
                                  int set, int *rc)
{
    const char *argv[6] = {"EVAL", idem__mark_lua, "1",
                           (const char *)name->data, want, set ? "1" : "0"};
    size_t lens[6] = {4, sizeof idem__mark_lua - 1, 1, name->len,
                      strlen(want), 1};
    unsigned slot = idem__key_slot(name->data, name->len);
    int64_t deadline = idem__mono_ms() + r->cfg.timeout_ms;
    int ask = -1;
    for (;;) {
        int node = ask >= 0 ? ask : idem__route(r, slot);
        int64_t left = deadline - idem__mono_ms();
        redisReply *rep = NULL;
        if (node < 0)
            *rc = idem__fail(s, IDEM_ECONN, "%s: no known master serves "
                             "the slot of %.*s", s->uri, (int)name->len,
                             name->data);
        else
            rep = idem__ask_node(s, r, node, ask >= 0, left, argv, lens, rc);
        int is_ask = 0, moved = 0, broke = !rep;
        ask = -1;
        if (rep && rep->type == REDIS_REPLY_ERROR && r->cfg.cluster &&
            (strncmp(rep->str, "MOVED ", 6) == 0 ||
             strncmp(rep->str, "ASK ", 4) == 0)) {
            int to = idem__redirect(r, rep, &is_ask);
            ask = is_ask ? to : -1;
            moved = !is_ask;
        }
        int busy = !broke && rep->type == REDIS_REPLY_ERROR &&
                   idem__transient(rep->str);
        int later = broke ? *rc == IDEM_ECONN || *rc == IDEM_ETIMEOUT
                          : busy || ask >= 0 || moved;
        if (!later || idem__mono_ms() + 100 >= deadline)
            return rep;
        freeReplyObject(rep);
        if (ask < 0)
            idem__sleep_ms(100);
        /* READONLY: a sentinel's master was demoted under us. */
        if (idem__has_map(r) && (moved || broke || busy))
            idem__map_refresh(s, r, deadline);
    }
}

/* The layout and its settings decide where every key lives, so a store
 * opened later with another layout, shard count or days would not find
 * the records (or look back too few days) and would answer NEW for keys
 * already done. So the first open writes them beside the records, in
 * PREFIX "layout" (a string without TTL: "hash", or "day shards=16
 * days=7"), and an open that disagrees fails. A prefix used before the
 * mark existed has none, and is marked by its next open. */
static int idem__check_layout(idem_store *s, idem__redis *r)
{
    idem__buf name = {0};
    char want[48];
    if (r->cfg.layout == IDEM__LAYOUT_DAY)
        snprintf(want, sizeof want, "day shards=%d days=%d", r->cfg.shards,
                 r->cfg.days);
    else
        snprintf(want, sizeof want, "hash");
    if (idem__buf_append(&name, r->cfg.prefix, r->cfg.prefixlen) ||
        idem__buf_append(&name, "layout", 6)) {
        idem__buf_free(&name);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    int rc;
    redisReply *rep = idem__mark_ask(s, r, &name, want,
                                     !(s->opts.flags & IDEM_O_READONLY), &rc);
    if (rep && rep->type == REDIS_REPLY_ERROR)
        rc = idem__fail(s, IDEM_EPROTO, "%s: reading %.*s: %s", s->uri,
                        (int)name.len, name.data, rep->str);
    else if (rep && rep->type == REDIS_REPLY_STRING &&
             strcmp(rep->str, want) != 0)
        rc = idem__fail(s, IDEM_EINVAL, "%s: the prefix holds records of "
                        "layout '%s' (%.*s says so), not '%s': open it with "
                        "those settings, or move the records to a new prefix "
                        "with idem dump and idem load", s->uri, rep->str,
                        (int)name.len, name.data, want);
    freeReplyObject(rep);
    idem__buf_free(&name);
    return rc;
}

/* Settings and nodes from the URI: the seeds (a cluster's, or the one
 * server) as nodes, or the sentinels. */
static int idem__redis_setup(idem_store *s, idem__redis *r, const char *rest,
                             int kind)
{
    int rc = idem__rcfg_parse(s, kind, rest, &r->cfg);
    if (!rc && idem__random_bytes(&r->rid_base, sizeof r->rid_base))
        rc = idem__fail(s, IDEM_EIO, "getrandom failed");
    if (!rc)
        rc = idem__ttl_fits(s, s->opts.ttl_ms, "default TTL");
    if (!rc)
        rc = idem__ttl_fits(s, s->opts.failure_ttl_ms, "failure TTL");
    if (rc)
        return rc;
    idem__script_shas(r->cfg.layout, r->shas);
    if (r->cfg.sentinel)
        return idem__sentinels_init(s, r);
    for (size_t i = 0; i < r->cfg.nseeds; i++)
        if (idem__rnode_get(r, r->cfg.hosts[i], strlen(r->cfg.hosts[i]),
                            r->cfg.ports[i]) < 0)
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
    if (kind == IDEM__RK_CLUSTER &&
        !(r->slots = calloc(IDEM__SLOTS, sizeof *r->slots)))
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    return 0;
}

/* Find where keys live (a cluster's map, a sentinel's master), check
 * that the server is of the kind the URI says, and the layout mark. */
static int idem__redis_locate(idem_store *s, idem__redis *r)
{
    idem__sigstate sig;
    idem__nosigpipe_begin(&sig);
    int rc = r->cfg.cluster ? idem__map_refresh(s, r, idem__mono_ms() +
                                                          r->cfg.timeout_ms)
             : r->cfg.sentinel ? idem__sentinel_locate(s, r)
                               : 0;
    if (!rc && !r->cfg.cluster)
        rc = idem__check_single(s, r);
    if (!rc)
        rc = idem__check_layout(s, r);
    idem__nosigpipe_end(&sig);
    return rc;
}

static int idem__redis_open_as(idem_store *s, const char *rest, int kind)
{
    idem__redis *r = calloc(1, sizeof *r);
    if (!r)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    r->map_node = -1;
    s->impl = r;
    int rc = idem__redis_setup(s, r, rest, kind);
    if (!rc)
        rc = idem__redis_locate(s, r);
    if (rc) {
        idem__redis_free(r);
        s->impl = NULL;
    }
    return rc;
}

static int idem__redis_open(idem_store *s, const char *rest)
{
    return idem__redis_open_as(s, rest, IDEM__RK_SINGLE);
}

static int idem__cluster_open(idem_store *s, const char *rest)
{
    return idem__redis_open_as(s, rest, IDEM__RK_CLUSTER);
}

static int idem__sentinel_open(idem_store *s, const char *rest)
{
    return idem__redis_open_as(s, rest, IDEM__RK_SENTINEL);
}

/* idem_check()/idem_repair(): through a handle of the backend's own,
 * read-only for a check, while others use the store. */
static int idem__redis_check_uri(idem_store *s, const char *rest,
                                 int repair, idem_check_report *r)
{
    int rc = s->be->open(s, rest);
    if (rc)
        return rc;
    rc = idem__redis_check(s, repair, r);
    idem__redis_close(s);  /* a check queues nothing for close to write */
    return rc;
}

#define IDEM__REDIS_OPS                                                    \
    .close = idem__redis_close, .claim_many = idem__redis_claim_many,      \
    .complete_many = idem__redis_complete_many, .fail = idem__redis_fail,  \
    .complete_held = idem__redis_complete_held,                            \
    .extend = idem__redis_extend, .get = idem__redis_get,                  \
    .forget = idem__redis_forget, .sync = idem__redis_sync,                \
    .checkpoint_put = idem__ckpt_put, .checkpoint_get = idem__ckpt_get,    \
    .checkpoint_write = idem__ckpt_write_cmd,                              \
    .checkpoint_reply = idem__ckpt_reply, .server = idem__redis_server,    \
    .sweep = idem__redis_sweep, .stats = idem__redis_stats,                \
    .server_metrics = idem__redis_server_metrics,                          \
    .scan = idem__redis_scan, .import = idem__redis_import,                \
    .check = idem__redis_check_uri,                                        \
    .extend_many = idem__redis_extend_many, .poison = idem__ckpt_poison,   \
    .caps = IDEM__CAP_CLAIM_DONE

const struct idem__backend idem__backend_redis = {
    .scheme = "redis", .open = idem__redis_open, IDEM__REDIS_OPS};
const struct idem__backend idem__backend_cluster = {
    .scheme = "redis-cluster", .open = idem__cluster_open, IDEM__REDIS_OPS};
const struct idem__backend idem__backend_sentinel = {
    .scheme = "redis-sentinel", .open = idem__sentinel_open,
    IDEM__REDIS_OPS};
