/* runner.c - the stream runner: one batch of messages, exactly once.
 *
 * Why this is in the library and not in each tool: the order of the steps
 * is the whole guarantee, and it is easy to get subtly wrong. Claims must
 * be durable before a handler runs (else a crash reissues the same fencing
 * token for a second run); the sink must be written before the outcomes
 * and the checkpoint commit (else a crash leaves keys DONE whose output
 * was lost); only a prefix of the batch may commit (else the checkpoint
 * would skip messages that never ran); and a live worker must never lose
 * a key it is working on (else a second worker runs it again). The
 * header (idem.h, "The stream runner") states the contract; this file
 * keeps it. A batch goes round this loop until every message is settled:
 *
 *   claim what needs a claim, up to the first key another worker holds
 *   -> sync -> handler (leases renewed, the answered prefix committed
 *   every commit_interval) -> commit the prefix -> wait for the busy key
 *   or a retry's backoff -> again
 *
 * The waits are the one place where the runner itself may spend long
 * (a busy key's lease can have minutes to run), so they are where it
 * asks the caller's stop hook: a stop ends the batch as a handler error
 * does (the held claims are released, the store stays usable), since
 * nothing went wrong with the store.
 *
 * A commit is: check that every claim about to complete is still ours
 * (renewing it) where other workers may exist, commit() (the caller's
 * sink and checkpoint), complete/fail the prefix, sync. Completions come
 * after commit() so that a store that applies writes as they are sent
 * (Redis) never holds a DONE key whose output line was not written; a
 * store with group commit makes all of it durable at the sync, together.
 *
 * Invariants:
 * - msgs[0..done) are committed; nothing of msgs[done..n) is.
 * - held[i]: this runner holds msgs[i]'s claim (token msgs[i].token) and
 *   has not finished it. Only held claims are renewed, completed, failed
 *   or released.
 * - No claim is held past the first message whose key another worker
 *   holds: NEW claims behind it are released at once. So a worker that
 *   waits never holds what the other may be waiting for, and two workers
 *   on one input in different orders cannot wait on each other forever.
 * - Any return with an error from the store or from commit() releases
 *   the held claims and poisons the handle (idem__poison): nothing it
 *   buffered since the last sync can become durable without its
 *   checkpoint.
 *
 * Memory: a runner keeps its arrays between batches and only grows them;
 * response and error bytes handed back to the caller live in an arena
 * reset at the start of each batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "store.h"

#include <stddef.h>

#define IDEM__RUNNER_OPTS_VERSION 4u
#define IDEM__BUSY_POLL_MS 200
#define IDEM__STOP_POLL_MS 50   /* the stop hook is asked this often */

struct idem_runner {
    idem_store *s;
    idem_runner_opts o;
    int64_t lease_ms;         /* resolved */
    size_t cap;               /* messages the arrays below can hold */
    uint32_t *slots;          /* key set: 0 empty, else message index + 1 */
    size_t nslots;
    idem_key *keys;           /* a round's claims, in message order */
    idem_outcome *outs;
    size_t *owner;            /* keys[j], items[j] belong to msgs[owner[j]] */
    idem_task *tasks;
    idem_completion *items;
    int *st;
    unsigned char *held;      /* per message: see the invariants */
    uint32_t *runs;           /* per message: handler runs in this batch */
    int64_t *until;           /* per message: its lease was extended to
                               * this time of the store's clock (0: not),
                               * and renewals leave it alone before */
    unsigned char *seen;      /* per task: its answer was recorded */
    idem__arena mem;          /* data handed back, per batch */
    /* The batch in progress. */
    idem_msg *msgs;
    size_t n, done;
    size_t ntasks, recorded;  /* tasks given to the handler; first not
                               * yet looked at by idem__runner_record */
    int in_handler;
    int in_commit;            /* commit() runs: a tick from it waits */
    int tick_rc;              /* a store error met inside the handler */
    size_t retries;           /* released for a retry in this round */
    int64_t backoff_ms;
    int64_t next_renew, last_commit;   /* monotonic ms */
    int64_t next_renew_at;    /* the same deadline on the store's clock,
                               * which leases follow (tests inject one) */
    size_t busy;              /* first message another worker holds */
    int64_t busy_until;
};

void idem_runner_opts_init(idem_runner_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->version = IDEM__RUNNER_OPTS_VERSION;
    o->max_attempts = 3;
    o->backoff_ms = 100;
    o->commit_interval_ms = 200;
}

/* The bytes of options of version v: a program built against the header
 * before the stop hook (version 2), or before flags (version 3), passes
 * a struct that ends before it. */
static size_t idem__runner_opts_size(unsigned v)
{
    return v == IDEM__RUNNER_OPTS_VERSION ? sizeof(idem_runner_opts)
           : v == 3u ? offsetof(idem_runner_opts, flags)
           : v == 2u ? offsetof(idem_runner_opts, stop)
                     : 0;
}

int idem_runner_new(idem_store *s, const idem_runner_opts *o,
                    idem_runner **out)
{
    if (out)
        *out = NULL;
    if (!s || !o || !out || !idem__runner_opts_size(o->version) ||
        o->max_attempts == 0 || o->lease_ms < 0 || o->ttl_ms < 0 ||
        o->backoff_ms < 0 || o->commit_interval_ms < 0)
        return IDEM_EINVAL;
    idem_runner *r = calloc(1, sizeof *r);
    if (!r)
        return IDEM_ENOMEM;
    r->s = s;
    memcpy(&r->o, o, idem__runner_opts_size(o->version));
    r->lease_ms = o->lease_ms ? o->lease_ms : s->opts.lease_ms;
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
    free(r->held);
    free(r->runs);
    free(r->until);
    free(r->seen);
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
    r->held = malloc(n);
    r->runs = malloc(n * sizeof *r->runs);
    r->until = malloc(n * sizeof *r->until);
    r->seen = malloc(n);
    if (!r->slots || !r->keys || !r->outs || !r->owner || !r->tasks ||
        !r->items || !r->st || !r->held || !r->runs || !r->until ||
        !r->seen)
        return idem__fail(r->s, IDEM_ENOMEM, "out of memory");
    r->cap = n;
    return 0;
}

/* A handle whose open failed has no backend: its calls fail with EINVAL,
 * as they would without this question. */
static unsigned idem__runner_caps(const idem_runner *r)
{
    return r->s->be ? r->s->be->caps : 0;
}

static int64_t idem__runner_now(void)
{
    return (int64_t)(idem__mono_ns() / 1000000u);
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

/* Mark repeats of a key within the batch: they take the first's result. */
static void idem__runner_distinct(idem_runner *r, idem_msg *msgs, size_t n)
{
    size_t mask = r->nslots - 1;
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
        } else {
            r->slots[h] = (uint32_t)i + 1;
        }
    }
}

/* ------------------------------------------------------------------------
 * Claims: taking, losing, releasing, renewing */

/* Errors that concern one key, not the store: the batch goes on. */
static int idem__runner_key_error(int code)
{
    return code == IDEM_ELOST || code == IDEM_EVALSIZE ||
           code == IDEM_EPROTO || code == IDEM_ECORRUPT;
}

/* A message whose claim is no longer ours (another worker took the key
 * over) or could not be kept: it is not done here, and says why. */
static void idem__runner_drop(idem_runner *r, size_t i, int code)
{
    r->held[i] = 0;
    r->msgs[i].result = IDEM_MSG_INVALID;
    r->msgs[i].status = code;
}

/* Give msgs[i]'s claim back: the next claim of the key is NEW with a
 * higher token. A claim that is no longer ours needs no release. */
static int idem__runner_release(idem_runner *r, size_t i, const char *why)
{
    idem_msg *m = &r->msgs[i];
    r->held[i] = 0;
    int rc = idem_fail(r->s, m->key, m->keylen, m->token, why, strlen(why),
                       IDEM_RETRYABLE);
    return rc == IDEM_ELOST ? 0 : rc;
}

/* Renew the leases of the held claims. A claim that is no longer ours is
 * dropped from the batch. */
static int idem__runner_renew(idem_runner *r)
{
    size_t q = 0;
    int64_t now = idem__now(r->s);
    for (size_t i = r->done; i < r->n; i++)
        if (r->held[i] && r->until[i] - r->lease_ms <= now) {
            const idem_msg *m = &r->msgs[i];
            r->items[q] = (idem_completion){m->key, m->keylen, m->token,
                                            NULL, 0, 0};
            r->owner[q++] = i;
        }
    int rc = q ? idem__extend_many(r->s, r->items, q, r->lease_ms, r->st)
               : 0;
    for (size_t k = 0; !rc && k < q; k++)
        if (r->st[k])
            idem__runner_drop(r, r->owner[k], r->st[k]);
    return rc;
}

/* The next renewal is due a third of a lease from now, by either clock. */
static void idem__runner_plan_renewal(idem_runner *r)
{
    r->next_renew = idem__runner_now() + r->lease_ms / 3;
    r->next_renew_at = idem__now(r->s) + r->lease_ms / 3;
}

/* Renew every held claim once a third of the lease has passed. */
static int idem__runner_keepalive(idem_runner *r)
{
    if (idem__runner_now() < r->next_renew &&
        idem__now(r->s) < r->next_renew_at)
        return 0;
    int rc = idem__runner_renew(r);
    /* From its end: a renewal slower than a third of the lease must not
     * make every later call renew again and starve the handler. */
    idem__runner_plan_renewal(r);
    return rc;
}

static int idem__runner_claim_flags(const idem_runner *r)
{
    /* Without a handler, a store with group commit records NEW keys DONE
     * at once: they become durable with the checkpoint that carries
     * their lines. */
    int dedup_now = !r->o.handler &&
                    (idem__runner_caps(r) & IDEM__CAP_GROUP_COMMIT);
    return IDEM_NOSYNC | (dedup_now ? IDEM_CLAIM_DONE : 0);
}

/* Sort one claim's outcome into msgs[i]. NEW claims behind the first busy
 * key are released at once (see the invariants). */
static int idem__runner_take(idem_runner *r, size_t i, const idem_outcome *o)
{
    idem_msg *m = &r->msgs[i];
    m->token = o->token;
    m->attempt = o->attempts;
    if (o->status || o->kind == IDEM_MISMATCH) {
        idem__runner_drop(r, i, o->status ? o->status : IDEM_EINVAL);
        return 0;
    }
    if (o->kind == IDEM_REPLAY || o->kind == IDEM_FAILED) {
        m->result = o->kind == IDEM_REPLAY ? IDEM_MSG_REPLAY
                                           : IDEM_MSG_REPLAY_FAILED;
        return idem__runner_keep(r, m, o->data, o->len);
    }
    if (o->kind == IDEM_BUSY) {
        if (i < r->busy) {
            r->busy = i;
            r->busy_until = o->lease_until;
        }
        return 0;
    }
    if (i > r->busy)
        return idem__runner_release(r, i, "released: an earlier message's "
                                          "key is held by another worker");
    if (idem__runner_claim_flags(r) & IDEM_CLAIM_DONE) {
        m->result = IDEM_MSG_DONE;  /* recorded DONE by the claim */
        return 0;
    }
    r->held[i] = 1;
    if (!r->o.handler)
        m->result = IDEM_MSG_DONE;  /* completed after commit() */
    return 0;
}

/* On a store one process holds at a time (every store with group commit
 * is one), a claim under a live lease that this runner did not make
 * belongs to a process that is gone: release it and claim again, which
 * takes it over with a higher token. */
static int idem__runner_reclaim(idem_runner *r, size_t j)
{
    static const char why[] = "abandoned: its process is gone";
    idem_claim_opts co = {r->o.lease_ms, r->o.ttl_ms};
    idem_outcome *o = &r->outs[j];
    int rc = 0;
    while (!rc && !o->status && o->kind == IDEM_BUSY) {
        rc = idem_fail(r->s, r->keys[j].key, r->keys[j].keylen, o->token, why,
                       sizeof why - 1, IDEM_RETRYABLE);
        rc = rc == IDEM_ELOST ? 0 : rc;
        if (!rc)
            rc = idem_claim_many(r->s, &r->keys[j], 1, &co, o,
                                 (unsigned)idem__runner_claim_flags(r));
    }
    return rc;
}

/* Take the outcomes of keys[0..u): first every one that needs no further
 * call on the store (their data is valid only until the next call), then
 * the abandoned claims of an exclusive store, one by one. */
static int idem__runner_take_all(idem_runner *r, size_t u)
{
    int excl = (idem__runner_caps(r) & IDEM__CAP_EXCLUSIVE) != 0, rc = 0;
    for (size_t j = 0; !rc && j < u; j++)
        if (!excl || r->outs[j].status || r->outs[j].kind != IDEM_BUSY)
            rc = idem__runner_take(r, r->owner[j], &r->outs[j]);
    for (size_t j = 0; !rc && excl && j < u; j++)
        if (!r->outs[j].status && r->outs[j].kind == IDEM_BUSY) {
            rc = idem__runner_reclaim(r, j);
            if (!rc)
                rc = idem__runner_take(r, r->owner[j], &r->outs[j]);
        }
    return rc;
}

/* Claim every message from done on that is unsettled and holds no claim. */
static int idem__runner_claim(idem_runner *r)
{
    size_t u = 0;
    r->busy = r->n;
    for (size_t i = r->done; i < r->n; i++)
        if (r->msgs[i].result == IDEM_MSG_UNDONE && !r->held[i]) {
            const idem_msg *m = &r->msgs[i];
            r->keys[u] = (idem_key){m->key, m->keylen, NULL};
            r->owner[u++] = i;
        }
    if (!u)
        return 0;
    idem_claim_opts co = {r->o.lease_ms, r->o.ttl_ms};
    int rc = idem_claim_many(r->s, r->keys, u, &co, r->outs,
                             (unsigned)idem__runner_claim_flags(r));
    if (!rc)
        return idem__runner_take_all(r, u);
    /* The claims made (status 0) are ours to give back. */
    for (size_t j = 0; j < u; j++)
        if (!r->outs[j].status && r->outs[j].kind == IDEM_NEW) {
            r->msgs[r->owner[j]].token = r->outs[j].token;
            r->held[r->owner[j]] = !(idem__runner_claim_flags(r) &
                                     IDEM_CLAIM_DONE);
        }
    return rc;
}

/* ------------------------------------------------------------------------
 * The handler's answers */

/* Record one answer. A retry is released now and claimed again in the
 * next round; an answer too large to store becomes a permanent failure
 * that says so, since storing it is impossible and running the effect
 * again would double it. */
static int idem__runner_answer(idem_runner *r, const idem_task *t)
{
    size_t i = t->index;
    idem_msg *m = &r->msgs[i];
    if (!r->held[i])
        return 0;  /* lost meanwhile: the answer counts for nothing */
    if (t->len > IDEM_VALUE_MAX) {
        char why[128];
        int k = snprintf(why, sizeof why, "the handler's answer is %zu "
                         "bytes, over IDEM_VALUE_MAX (%u)", t->len,
                         IDEM_VALUE_MAX);
        m->result = IDEM_MSG_FAILED;
        m->status = IDEM_EVALSIZE;
        return idem__runner_keep(r, m, why, (size_t)k);
    }
    int rc = idem__runner_keep(r, m, t->data, t->len);
    if (rc || t->answer == IDEM_TASK_DONE || t->answer == IDEM_TASK_FAIL) {
        m->result = t->answer == IDEM_TASK_DONE ? IDEM_MSG_DONE
                                                : IDEM_MSG_FAILED;
        return rc;
    }
    r->held[i] = 0;
    rc = idem_fail(r->s, m->key, m->keylen, m->token, t->data, t->len,
                   IDEM_RETRYABLE);
    if (idem__runner_key_error(rc)) {
        idem__runner_drop(r, i, rc);
        return 0;
    }
    if (r->runs[i] >= r->o.max_attempts) {
        m->result = IDEM_MSG_GAVE_UP;
    } else {
        r->retries++;
        m->data = NULL;
        m->len = 0;
    }
    return rc;
}

static int idem__runner_is_answer(int a)
{
    return a >= IDEM_TASK_DONE && a <= IDEM_TASK_FAIL;
}

/* Record the answers given so far, in task order up to the first task
 * without one (all of them when `all`). */
static int idem__runner_record(idem_runner *r, int all)
{
    int rc = 0;
    for (size_t k = r->recorded; !rc && k < r->ntasks; k++) {
        if (r->seen[k])
            continue;
        if (!idem__runner_is_answer(r->tasks[k].answer)) {
            if (!all)
                break;
            continue;
        }
        r->seen[k] = 1;
        rc = idem__runner_answer(r, &r->tasks[k]);
    }
    while (r->recorded < r->ntasks && r->seen[r->recorded])
        r->recorded++;
    return rc;
}

/* Hand the held, unanswered messages before the busy key to the handler.
 * *herr receives its error; tasks it left unanswered stay UNDONE. */
static int idem__runner_handle(idem_runner *r, int *herr)
{
    size_t nt = 0;
    for (size_t i = r->done; i < r->busy; i++) {
        idem_msg *m = &r->msgs[i];
        if (!r->held[i] || m->result != IDEM_MSG_UNDONE)
            continue;
        r->runs[i]++;
        r->seen[nt] = 0;
        r->tasks[nt++] = (idem_task){m->key, m->keylen, m->msg, m->msglen,
                                     m->token, m->attempt, i, 0, NULL, 0};
    }
    if (!nt)
        return 0;
    int rc = idem_sync(r->s);  /* the tokens are durable before effects */
    if (rc)
        return rc;
    r->ntasks = nt;
    r->recorded = 0;
    r->in_handler = 1;
    uint64_t t0 = idem__mono_ns();
    *herr = r->o.handler(r->o.ctx, r->tasks, nt);
    idem__hist_observe(&r->s->m.handler, idem__mono_ns() - t0);
    r->in_handler = 0;
    rc = r->tick_rc ? r->tick_rc : idem__runner_record(r, 1);
    for (size_t k = 0; !rc && !*herr && k < nt; k++)
        if (!idem__runner_is_answer(r->tasks[k].answer) &&
            r->held[r->tasks[k].index])
            *herr = IDEM_EINVAL;  /* said 0 but left a task unanswered */
    r->ntasks = 0;
    return rc;
}

/* ------------------------------------------------------------------------
 * Committing */

/* Complete or fail the held claims among msgs[from..to), after commit().
 * A key whose write fails here had its line written already: it is
 * given back if it can be and keeps the error in its status. */
static int idem__runner_finish(idem_runner *r, size_t from, size_t to)
{
    size_t q = 0;
    int rc = 0;
    for (size_t i = from; !rc && i < to; i++) {
        idem_msg *m = &r->msgs[i];
        if (!r->held[i])
            continue;
        if (m->result == IDEM_MSG_DONE) {
            r->items[q] = (idem_completion){m->key, m->keylen, m->token,
                                            m->data, m->len, r->o.ttl_ms};
            r->owner[q++] = i;
            continue;
        }
        r->held[i] = 0;
        int st = idem_fail(r->s, m->key, m->keylen, m->token, m->data,
                           m->len, 0);
        if (idem__runner_key_error(st))
            m->status = st;
        else
            rc = st;
    }
    /* Held: renewed by idem__runner_keepalive() before commit(), so a
     * store that commits them in one step may check them there. */
    if (!rc && q)
        rc = idem__complete_held(r->s, r->items, q, r->st);
    for (size_t k = 0; !rc && k < q; k++) {
        size_t i = r->owner[k];
        r->held[i] = 0;
        if (!r->st[k])
            continue;
        r->msgs[i].status = r->st[k];
        if (r->st[k] != IDEM_ELOST)
            idem__runner_release(r, i, "its completion failed");
    }
    return rc;
}

/* Commit the settled prefix of the batch. `always`: call commit() even
 * when the prefix did not grow (the end of a round). */
static int idem__runner_commit(idem_runner *r, int always)
{
    size_t p = r->done;
    while (p < r->n && r->msgs[p].result != IDEM_MSG_UNDONE)
        p++;
    if (p == r->done && !always)
        return 0;
    /* Still ours? Every held claim was renewed less than a third of a
     * lease ago, by both clocks, or is renewed now: a claim can only be
     * lost by a lease running out, which a stall that long would have
     * made due. */
    int rc = idem__runner_keepalive(r);
    if (!rc && r->o.commit) {
        r->in_commit = 1;
        rc = r->o.commit(r->o.ctx, r->msgs, p);
        r->in_commit = 0;
    }
    if (!rc)
        rc = idem__runner_finish(r, r->done, p);
    if (!rc)
        rc = r->o.flags & IDEM_RUNNER_SYNC_START ? idem_sync_start(r->s)
                                                 : idem_sync(r->s);
    if (!rc) {
        idem__metrics_messages(&r->s->m, r->msgs + r->done, p - r->done);
        r->done = p;
        r->last_commit = idem__runner_now();
    }
    return rc;
}

int idem_runner_extend(idem_runner *r, size_t index, int64_t ms,
                       int64_t *granted)
{
    if (!r || !r->in_handler || index >= r->n || ms <= 0)
        return IDEM_EINVAL;
    int64_t ttl = r->o.ttl_ms ? r->o.ttl_ms : r->s->opts.ttl_ms;
    ms = ms < ttl ? ms : ttl;
    if (granted)
        *granted = ms;
    idem_msg *m = &r->msgs[index];
    if (!r->held[index] || ms <= r->lease_ms)
        return 0;  /* lost meanwhile, or the renewals cover it */
    int rc = idem_extend(r->s, m->key, m->keylen, m->token, ms);
    if (rc == IDEM_ELOST) {
        idem__runner_drop(r, index, rc);
        return 0;
    }
    if (!rc)
        r->until[index] = idem__now(r->s) + ms;
    return rc;
}

int idem_runner_tick(idem_runner *r)
{
    if (!r || !r->in_handler || r->in_commit)
        return 0;
    if (r->tick_rc)
        return r->tick_rc;
    int rc = idem__runner_record(r, 0);
    if (!rc)
        rc = idem__runner_keepalive(r);
    if (!rc && r->o.commit_interval_ms &&
        idem__runner_now() - r->last_commit >= r->o.commit_interval_ms)
        rc = idem__runner_commit(r, 0);
    r->tick_rc = rc;
    return rc;
}

/* ------------------------------------------------------------------------
 * Waiting between rounds */

/* Has the caller asked for a stop? */
static int idem__runner_stopped(const idem_runner *r)
{
    return r->o.stop && r->o.stop(r->o.ctx);
}

/* Sleep ms, keeping the held claims alive; IDEM_ESTOPPED as soon as a
 * stop is asked for. */
static int idem__runner_nap(idem_runner *r, int64_t ms)
{
    int64_t end = idem__runner_now() + ms;
    int rc = 0;
    for (int64_t now; !rc && (now = idem__runner_now()) < end;) {
        if (idem__runner_stopped(r))
            return IDEM_ESTOPPED;
        int64_t step = end - now;
        if (r->next_renew - now < step)
            step = r->next_renew - now;
        if (r->o.stop && step > IDEM__STOP_POLL_MS)
            step = IDEM__STOP_POLL_MS;
        idem__sleep_ms(step > 0 ? step : 0);
        rc = idem__runner_keepalive(r);
    }
    return rc;
}

/* Before the next round: back off after retries; then, if a key is held
 * by another worker, wait a moment and ask again: the holder may finish
 * long before its lease runs out. IDEM_ESTOPPED when a stop is asked
 * for, before or during the wait. */
static int idem__runner_wait(idem_runner *r)
{
    int rc = idem__runner_stopped(r) ? IDEM_ESTOPPED : 0;
    if (!rc && r->retries) {
        rc = idem__runner_nap(r, r->backoff_ms);
        r->backoff_ms *= 2;
        r->retries = 0;
    }
    if (rc || r->busy == r->n)
        return rc;
    /* At most until the lease runs out; at least a little, since the
     * clocks of client and server may disagree. */
    int64_t left = r->busy_until - idem__now(r->s);
    if (left > IDEM__BUSY_POLL_MS)
        left = IDEM__BUSY_POLL_MS;
    return idem__runner_nap(r, left < 10 ? 10 : left);
}

/* ------------------------------------------------------------------------
 * A batch */

static void idem__runner_start(idem_runner *r, idem_msg *msgs, size_t n)
{
    idem__arena_reset(&r->mem);
    for (size_t i = 0; i < n; i++) {
        msgs[i].result = IDEM_MSG_UNDONE;
        msgs[i].status = 0;
        msgs[i].token = msgs[i].attempt = 0;
        msgs[i].data = NULL;
        msgs[i].len = 0;
    }
    if (n) {
        memset(r->held, 0, n);
        memset(r->runs, 0, n * sizeof *r->runs);
        memset(r->until, 0, n * sizeof *r->until);
    }
    r->msgs = msgs;
    r->n = n;
    r->done = r->ntasks = 0;
    r->tick_rc = 0;
    r->retries = 0;
    r->backoff_ms = r->o.backoff_ms;
    r->last_commit = idem__runner_now();
    if (r->s->be)
        idem__runner_plan_renewal(r);
    idem__runner_distinct(r, msgs, n);
}

/* The batch stops short: give back every claim not committed. The first
 * error that is not one key's own (a server gone) ends the releases:
 * each would wait out the store's timeout, and the leases of the rest
 * run out by themselves. */
static void idem__runner_abandon(idem_runner *r)
{
    static const char cut[] = "not committed: the batch stopped before it";
    int rc = 0;
    for (size_t i = r->done; i < r->n; i++)
        if (r->held[i]) {
            if (!rc) {
                rc = idem__runner_release(r, i, cut);
                rc = idem__runner_key_error(rc) ? 0 : rc;
            }
            r->held[i] = 0;
            r->msgs[i].result = IDEM_MSG_UNDONE;
        }
}

int idem_runner_batch(idem_runner *r, idem_msg *msgs, size_t n,
                      size_t *committed)
{
    size_t dummy;
    committed = committed ? committed : &dummy;
    *committed = 0;
    if (!r || (n && !msgs) || r->in_handler)
        return IDEM_EINVAL;
    int rc = idem__runner_reserve(r, n);
    if (rc)
        return rc;
    idem__runner_start(r, msgs, n);
    int herr = 0;  /* the handler's error, or IDEM_ESTOPPED: the batch
                    * ends short, and the store is fine */
    for (;;) {
        rc = idem__runner_claim(r);
        if (!rc && r->o.handler)
            rc = idem__runner_handle(r, &herr);
        if (!rc)
            rc = idem__runner_commit(r, 1);
        if (rc || herr || r->done == n)
            break;
        rc = idem__runner_wait(r);
        if (rc == IDEM_ESTOPPED) {
            herr = rc;
            rc = 0;
        }
        if (rc || herr)
            break;
    }
    /* After a store error, poison first: what the batch buffered (on
     * Redis: a queued checkpoint and its writes) is dropped, and the
     * releases are written on their own (on a local store they are
     * refused too: its next open takes the claims over at once). */
    if (rc)
        idem__poison(r->s, rc);
    if (rc || herr)
        idem__runner_abandon(r);
    if (!rc && herr)
        rc = idem_sync(r->s);  /* the releases */
    *committed = r->done;
    r->msgs = NULL;
    return rc ? rc : herr;
}
