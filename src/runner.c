/* runner.c - the stream runner: one batch of messages, exactly once.
 *
 * Why this is in the library and not in each tool: the order of the steps
 * is the whole guarantee, and it is easy to get subtly wrong. Claims must
 * be durable before a handler runs (else a crash reissues the same fencing
 * token for a second run); the sink must be durable before the outcomes
 * and the checkpoint commit (else a crash leaves keys DONE whose output
 * was lost); and only a prefix of the batch may commit when the handler
 * breaks (else the checkpoint would skip messages that never ran). The
 * header (idem.h, "The stream runner") states the contract; this file
 * keeps it:
 *
 *   claim -> [sync -> handler -> release+reclaim retries] -> complete/fail
 *   the prefix, release the rest -> commit() -> sync
 *
 * Nothing between the last sync and commit() is durable, so a crash there
 * loses the batch's outcomes together with its checkpoint, and the next
 * run redoes exactly that batch. If commit() itself fails, the sink may
 * hold part of the batch while the store holds none of it; the handle is
 * then poisoned (idem__poison) so no later sync can commit the outcomes
 * without their checkpoint.
 *
 * Memory: a runner keeps its arrays between batches and only grows them;
 * response and error bytes handed back to the caller live in an arena
 * reset at the start of each batch. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "store.h"

#define IDEM__RUNNER_OPTS_VERSION 1u

struct idem_runner {
    idem_store *s;
    idem_runner_opts o;
    size_t cap;               /* messages the arrays below can hold */
    uint32_t *slots;          /* key set: 0 empty, else message index + 1 */
    size_t nslots;
    idem_key *keys;           /* one claim per distinct key */
    idem_outcome *outs;
    size_t *owner;            /* keys[j] belongs to message owner[j] */
    idem_task *tasks;
    idem_completion *items;
    int *st;
    idem__arena mem;          /* data handed back, per batch */
};

void idem_runner_opts_init(idem_runner_opts *o)
{
    memset(o, 0, sizeof *o);
    o->version = IDEM__RUNNER_OPTS_VERSION;
    o->max_attempts = 3;
    o->backoff_ms = 100;
}

int idem_runner_new(idem_store *s, const idem_runner_opts *o,
                    idem_runner **out)
{
    *out = NULL;
    if (!s || !o || o->version != IDEM__RUNNER_OPTS_VERSION ||
        o->max_attempts == 0 || o->lease_ms < 0 || o->ttl_ms < 0 ||
        o->backoff_ms < 0)
        return IDEM_EINVAL;
    idem_runner *r = calloc(1, sizeof *r);
    if (!r)
        return IDEM_ENOMEM;
    r->s = s;
    r->o = *o;
    *out = r;
    return 0;
}

static void idem__runner_arrays_free(idem_runner *r)
{
    free(r->slots);
    free(r->keys);
    free(r->outs);
    free(r->owner);
    free(r->tasks);
    free(r->items);
    free(r->st);
}

void idem_runner_free(idem_runner *r)
{
    if (!r)
        return;
    idem__runner_arrays_free(r);
    idem__arena_free(&r->mem);
    free(r);
}

static int idem__runner_reserve(idem_runner *r, size_t n)
{
    if (n <= r->cap)
        return 0;
    idem__runner_arrays_free(r);
    r->cap = 0;
    size_t ns = 16;
    while (ns < 2 * n)
        ns *= 2;
    r->nslots = ns;
    r->slots = malloc(ns * sizeof *r->slots);
    r->keys = malloc(n * sizeof *r->keys);
    r->outs = malloc(n * sizeof *r->outs);
    r->owner = malloc(n * sizeof *r->owner);
    r->tasks = malloc(n * sizeof *r->tasks);
    r->items = malloc(n * sizeof *r->items);
    r->st = malloc(n * sizeof *r->st);
    if (!r->slots || !r->keys || !r->outs || !r->owner || !r->tasks ||
        !r->items || !r->st)
        return idem__fail(r->s, IDEM_ENOMEM, "out of memory");
    r->cap = n;
    return 0;
}

/* Copy bytes the caller will read after the store or handler moves on. */
static int idem__runner_keep(idem_runner *r, idem_msg *m, const void *p,
                             size_t n)
{
    m->len = n;
    m->data = n ? idem__arena_alloc(&r->mem, n) : NULL;
    if (n && !m->data)
        return idem__fail(r->s, IDEM_ENOMEM, "out of memory");
    if (n)
        memcpy((void *)m->data, p, n);
    return 0;
}

/* Mark repeats of a key within the batch and list the distinct keys. */
static size_t idem__runner_distinct(idem_runner *r, idem_msg *msgs, size_t n)
{
    size_t u = 0, mask = r->nslots - 1;
    if (n)
        memset(r->slots, 0, r->nslots * sizeof *r->slots);
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)XXH3_64bits(msgs[i].key, msgs[i].keylen) & mask;
        for (; r->slots[h]; h = (h + 1) & mask) {
            const idem_msg *f = &msgs[r->slots[h] - 1];
            if (f->keylen == msgs[i].keylen &&
                !memcmp(f->key, msgs[i].key, f->keylen))
                break;
        }
        if (r->slots[h]) {
            msgs[i].result = IDEM_MSG_DUPLICATE;
            msgs[i].first = r->slots[h] - 1;
            continue;
        }
        r->slots[h] = (uint32_t)i + 1;
        r->keys[u] = (idem_key){msgs[i].key, msgs[i].keylen, NULL};
        r->owner[u++] = i;
    }
    return u;
}

static void idem__sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* A PENDING claim under a live lease that this runner did not make. On a
 * store one process holds at a time its maker is gone: release it so the
 * next claim takes over with token + 1. Elsewhere, wait a moment (at
 * most until the lease runs out) and ask again. */
static int idem__runner_unbusy(idem_runner *r, const idem_key *k,
                               const idem_outcome *o)
{
    idem_store *s = r->s;
    if (!(s->be->caps & IDEM__CAP_EXCLUSIVE)) {
        /* Ask again soon: the holder may finish long before its lease
         * runs out. */
        int64_t left = o->lease_until - idem__now(s);
        idem__sleep_ms(left < 200 ? left : 200);
        return 0;
    }
    static const char why[] = "abandoned: its process is gone";
    int rc = idem_fail(s, k->key, k->len, o->token, why, sizeof why - 1,
                       IDEM_RETRYABLE);
    return rc == IDEM_ELOST ? 0 : rc;
}

/* Without a handler, NEW keys are recorded DONE. With group commit that
 * happens at claim time (IDEM_CLAIM_DONE), in the commit that carries
 * the sink's checkpoint. A store without it (Redis) would make them DONE
 * at once, before commit() wrote their lines, and a crash in between
 * would lose the lines for good; there the keys are claimed, and only
 * completed once commit() returned: a crash in between leaves claims
 * that run out with their lease, and a rerun writes the lines again (at
 * least once, never lost). */
static int idem__runner_late(const idem_runner *r)
{
    /* A handle whose open failed has no backend: its calls fail with
     * EINVAL, as they would without this question. */
    return !r->o.handler && r->s->be &&
           !(r->s->be->caps & IDEM__CAP_GROUP_COMMIT);
}

/* Claim keys[0..u) and sort the outcomes into the messages. NEW ones
 * become tasks (with a handler) or DONE (without). */
static int idem__runner_claim(idem_runner *r, idem_msg *msgs, size_t u,
                              size_t *ntasks)
{
    idem_claim_opts co = {r->o.lease_ms, r->o.ttl_ms};
    unsigned fl = IDEM_NOSYNC |
                  (r->o.handler || idem__runner_late(r) ? 0 : IDEM_CLAIM_DONE);
    int rc = idem_claim_many(r->s, r->keys, u, &co, r->outs, fl);
    for (size_t j = 0; !rc && j < u; j++) {
        idem_msg *m = &msgs[r->owner[j]];
        idem_outcome *o = &r->outs[j];
        while (!rc && !o->status && o->kind == IDEM_BUSY) {
            rc = idem__runner_unbusy(r, &r->keys[j], o);
            if (!rc)
                rc = idem_claim_many(r->s, &r->keys[j], 1, &co, o, fl);
        }
        if (rc)
            break;
        m->token = o->token;
        m->attempt = o->attempts;
        if (o->status || o->kind == IDEM_MISMATCH) {
            m->result = IDEM_MSG_INVALID;
            m->status = o->status ? o->status : IDEM_EINVAL;
        } else if (o->kind == IDEM_REPLAY || o->kind == IDEM_FAILED) {
            m->result = o->kind == IDEM_REPLAY ? IDEM_MSG_REPLAY
                                               : IDEM_MSG_REPLAY_FAILED;
            rc = idem__runner_keep(r, m, o->data, o->len);
        } else if (!r->o.handler) {
            m->result = IDEM_MSG_DONE;
        } else {
            r->tasks[(*ntasks)++] = (idem_task){
                m->key, m->keylen, m->msg, m->msglen, o->token, o->attempts,
                r->owner[j], 0, NULL, 0};
        }
    }
    return rc;
}

/* Record one answer; a retry is released now and queued in keys[]. */
static int idem__runner_answer(idem_runner *r, idem_msg *msgs,
                               const idem_task *t, uint32_t round,
                               size_t *nretry)
{
    idem_msg *m = &msgs[t->index];
    int rc = idem__runner_keep(r, m, t->data, t->len);
    if (rc || t->answer == IDEM_TASK_DONE || t->answer == IDEM_TASK_FAIL) {
        m->result = t->answer == IDEM_TASK_DONE ? IDEM_MSG_DONE
                                                : IDEM_MSG_FAILED;
        return rc;
    }
    rc = idem_fail(r->s, t->key, t->keylen, t->token, t->data, t->len,
                   IDEM_RETRYABLE);
    m->result = IDEM_MSG_GAVE_UP;
    if (!rc && round < r->o.max_attempts) {
        m->result = IDEM_MSG_UNDONE;
        r->keys[*nretry] = (idem_key){t->key, t->keylen, NULL};
        r->owner[(*nretry)++] = t->index;
    }
    return rc;
}

/* Run the handler over the NEW tasks, retrying retryable failures. The
 * handler's error, if any, is returned in *herr; unanswered tasks stay
 * UNDONE. */
static int idem__runner_handle(idem_runner *r, idem_msg *msgs, size_t nt,
                               int *herr)
{
    int64_t backoff = r->o.backoff_ms;
    for (uint32_t round = 1; nt; round++) {
        int rc = idem_sync(r->s);
        if (rc)
            return rc;
        *herr = r->o.handler(r->o.ctx, r->tasks, nt);
        size_t nretry = 0;
        for (size_t i = 0; !rc && i < nt; i++)
            if (r->tasks[i].answer >= IDEM_TASK_DONE &&
                r->tasks[i].answer <= IDEM_TASK_FAIL)
                rc = idem__runner_answer(r, msgs, &r->tasks[i], round,
                                         &nretry);
            else if (!*herr)
                *herr = IDEM_EINVAL;  /* said 0 but left a task unanswered */
        if (rc || *herr || !nretry)
            return rc;
        idem__sleep_ms(backoff);
        backoff *= 2;
        nt = 0;
        rc = idem__runner_claim(r, msgs, nretry, &nt);
        if (rc)
            return rc;
    }
    return 0;
}

/* Finish the claims of messages [0, p) and release those of [p, n). */
static int idem__runner_finish(idem_runner *r, idem_msg *msgs, size_t n,
                               size_t p)
{
    static const char cut[] = "not committed: an earlier message broke "
                              "the handler";
    size_t q = 0;
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        idem_msg *m = &msgs[i];
        if (i < p && m->result == IDEM_MSG_DONE)
            r->items[q++] = (idem_completion){m->key, m->keylen, m->token,
                                              m->data, m->len,
                                              r->o.ttl_ms};
        else if (i < p && m->result == IDEM_MSG_FAILED)
            rc = idem_fail(r->s, m->key, m->keylen, m->token, m->data,
                           m->len, 0);
        else if (i >= p && m->token &&
                 (m->result == IDEM_MSG_UNDONE ||
                  m->result == IDEM_MSG_DONE ||
                  m->result == IDEM_MSG_FAILED)) {
            rc = idem_fail(r->s, m->key, m->keylen, m->token, cut,
                           sizeof cut - 1, IDEM_RETRYABLE);
            rc = rc == IDEM_ELOST ? 0 : rc;
            m->result = IDEM_MSG_UNDONE;
        }
    }
    if (!rc && q)
        rc = idem_complete_many(r->s, r->items, q, r->st, IDEM_NOSYNC);
    /* A key whose completion failed (IDEM_ELOST: another worker holds
     * it now; or an error of its own) is not done, and says why. */
    for (size_t i = 0, k = 0; !rc && k < q; i++)
        if (i < p && msgs[i].result == IDEM_MSG_DONE && r->st[k++] != 0) {
            msgs[i].result = IDEM_MSG_INVALID;
            msgs[i].status = r->st[k - 1];
        }
    return rc;
}

int idem_runner_batch(idem_runner *r, idem_msg *msgs, size_t n,
                      size_t *committed)
{
    size_t dummy;
    committed = committed ? committed : &dummy;
    *committed = 0;
    if (!r || (n && !msgs))
        return IDEM_EINVAL;
    int rc = idem__runner_reserve(r, n);
    if (rc)
        return rc;
    idem__arena_reset(&r->mem);
    for (size_t i = 0; i < n; i++) {
        msgs[i].result = IDEM_MSG_UNDONE;
        msgs[i].status = 0;
        msgs[i].token = msgs[i].attempt = 0;
        msgs[i].data = NULL;
        msgs[i].len = 0;
    }
    size_t nt = 0, u = idem__runner_distinct(r, msgs, n);
    int herr = 0;
    rc = idem__runner_claim(r, msgs, u, &nt);
    if (!rc && nt)
        rc = idem__runner_handle(r, msgs, nt, &herr);
    size_t p = 0;
    while (p < n && msgs[p].result != IDEM_MSG_UNDONE)
        p++;
    if (!rc && r->o.handler)
        rc = idem__runner_finish(r, msgs, n, p);
    if (!rc && r->o.commit && (rc = r->o.commit(r->o.ctx, msgs, p)) != 0) {
        idem__poison(r->s, rc);
        /* Late claims are released at once (without group commit the
         * poison holds nothing back), so a retry need not wait out the
         * lease. */
        if (idem__runner_late(r))
            idem__runner_finish(r, msgs, n, 0);
    }
    if (!rc && idem__runner_late(r))
        rc = idem__runner_finish(r, msgs, n, p);
    if (!rc)
        rc = idem_sync(r->s);
    if (!rc)
        *committed = p;
    return rc ? rc : herr;
}
