/* tests/test_model.c - random operations checked against a model.
 *
 * A few thousand random claims, completions, failures, extensions,
 * forgets, checkpoints, syncs and sweeps on a small key space, with the
 * clock jumping forward, tiny segments (so that rotation, whole-segment
 * drops and compaction happen all the time), clean reopens and simulated
 * crashes (the directory copied as it is on disk while the store is
 * open). After every step the store must answer as the model of
 * the README's protocol does; after a crash, as it did at the last commit.
 * That is what catches a record lost, resurrected or misplaced by the
 * interplay of compaction, checkpoints, expiry and recovery.
 *
 * After every step the log's own invariants (src/local/log.h) are checked too
 * (idem__log_check), so that a step that breaks one is named at once.
 *
 * IDEM_MODEL_SEEDS sets the number of runs per backend (default 8). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "local/log.h"

enum { NKEYS = 40, NCKPT = 3, VMAX = 200, STEPS = 2000 };

typedef struct mrec {
    int present, state, released, has_fp;
    uint64_t token;
    uint64_t max_token;  /* the greatest the key was given, record or not */
    uint32_t attempts;
    int64_t expires, lease;
    uint8_t fp[IDEM_FP_LEN];
    char val[VMAX];
    size_t vlen;
} mrec;

typedef struct model {
    mrec r[NKEYS];
    char ckpt[NCKPT][32];
    int has_ckpt[NCKPT];
} model;

static model cur, durable;  /* now, and as of the last commit */
static unsigned rnd_state;
static char base_dir[4300], store_dir[4500];
static int persistent;      /* local: (reopens, crashes) or mem: */
static long job_steps;      /* steps after which a key index job ran */
static const char *query = "";  /* local: parameters, e.g. "?hot=0" */

static unsigned rnd(unsigned n)
{
    rnd_state = rnd_state * 1103515245u + 12345u;
    return (rnd_state >> 8) % n;
}

static idem_store *open_store(void)
{
    idem_opts o = t_options();
    o.segment_bytes = 4096;
    o.segment_span_ms = 3000;
    o.failure_ttl_ms = 4000;
    o.ttl_ms = 10000;
    idem_store *s;
    char uri[4700];
    snprintf(uri, sizeof uri, "%s%s", t_local_uri(store_dir), query);
    int rc = idem_open(persistent ? uri : "mem:", &o, &s);
    cr_assert_eq(rc, 0, "open: %s", idem_errdetail(s));
    return s;
}

/* Run indexes (run-N.kgf) in the store at the end of a seed, summed:
 * local_cold_runs makes sure that its seeds reach them. */
static int runs_left;

static int count_runs(void)
{
    DIR *d = opendir(store_dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strncmp(e->d_name, "run-", 4) == 0;
    if (d)
        closedir(d);
    return n;
}

static int is_live(const mrec *m)
{
    return m->present && t_clock_ms < m->expires;
}

static int holds(const mrec *m, uint64_t token)
{
    return is_live(m) && m->state == IDEM_STATE_PENDING && !m->released &&
           m->token == token;
}

static void key_name(char *buf, size_t n, int k)
{
    snprintf(buf, n, "key-%d", k);
}

static void expect_key(idem_store *s, int k, const char *when)
{
    char key[24];
    key_name(key, sizeof key, k);
    const mrec *m = &cur.r[k];
    idem_record r;
    int rc = idem_get(s, key, strlen(key), &r);
    if (!is_live(m)) {
        cr_assert_eq(rc, IDEM_ENOTFOUND, "%s: %s is back (state %d)", when,
                     key, r.state);
        return;
    }
    cr_assert_eq(rc, 0, "%s: %s lost: %s", when, key, idem_errdetail(s));
    cr_assert_eq((int)r.state, m->state, "%s: %s state", when, key);
    cr_assert_eq(r.token, m->token, "%s: %s token", when, key);
    cr_assert_eq(r.attempts, m->attempts, "%s: %s attempts", when, key);
    cr_assert_eq(r.expires_ms, m->expires, "%s: %s expiry", when, key);
    cr_assert_eq(r.released, m->released, "%s: %s released", when, key);
    cr_assert(r.len == m->vlen && (!r.len || !memcmp(r.data, m->val, r.len)),
              "%s: %s value", when, key);
}

static void expect_all(idem_store *s, const char *when)
{
    for (int k = 0; k < NKEYS; k++)
        expect_key(s, k, when);
    for (int c = 0; c < NCKPT; c++) {
        char name[24];
        snprintf(name, sizeof name, "ckpt-%d", c);
        const void *b;
        size_t n;
        int rc = idem_checkpoint_get(s, name, &b, &n);
        if (!cur.has_ckpt[c]) {
            cr_assert_eq(rc, IDEM_ENOTFOUND, "%s: %s", when, name);
            continue;
        }
        cr_assert_eq(rc, 0, "%s: %s lost", when, name);
        cr_assert(n == strlen(cur.ckpt[c]) && !memcmp(b, cur.ckpt[c], n),
                  "%s: %s value", when, name);
    }
}

static void do_claim(idem_store *s, const char *key, mrec *m,
                     const char *when)
{
    static const int64_t ttls[] = {500, 3000, 20000, 3600000};
    static const int64_t leases[] = {200, 1000, 5000};
    uint8_t fp[IDEM_FP_LEN] = {(uint8_t)rnd(2)};
    int use_fp = rnd(3) == 0;
    idem_claim_opts co = {leases[rnd(3)], ttls[rnd(4)]};
    idem_key ik = {key, strlen(key), use_fp ? fp : NULL};
    idem_outcome o;
    int rc = idem_claim(s, &ik, &co, &o);
    cr_assert_eq(rc, 0, "%s: claim: %s", when, idem_errdetail(s));
    int live = is_live(m), want;
    if (live && use_fp && m->has_fp && memcmp(m->fp, fp, IDEM_FP_LEN))
        want = IDEM_MISMATCH;
    else if (live && m->state == IDEM_STATE_DONE)
        want = IDEM_REPLAY;
    else if (live && m->state == IDEM_STATE_FAILED)
        want = IDEM_FAILED;
    else if (live && !m->released && t_clock_ms < m->lease)
        want = IDEM_BUSY;
    else
        want = IDEM_NEW;
    cr_assert_eq(o.kind, want, "%s: claim %s", when, key);
    if (want == IDEM_REPLAY || want == IDEM_FAILED)
        cr_assert(o.len == m->vlen &&
                      (!o.len || !memcmp(o.data, m->val, o.len)),
                  "%s: claim %s data", when, key);
    if (want != IDEM_NEW)
        return;
    mrec n = {.present = 1, .state = IDEM_STATE_PENDING};
    /* Above every token the key had, whatever became of its records. */
    cr_assert_gt(o.token, m->max_token, "%s: claim %s token", when, key);
    n.token = n.max_token = o.token;
    n.attempts = live ? m->attempts + 1 : 1;
    n.lease = t_clock_ms + co.lease_ms;
    n.expires = t_clock_ms + co.ttl_ms;
    if (live && m->expires > n.expires)
        n.expires = m->expires;
    if (n.expires < n.lease)
        n.expires = n.lease;
    if (use_fp || (live && m->has_fp)) {
        n.has_fp = 1;
        memcpy(n.fp, use_fp ? fp : m->fp, IDEM_FP_LEN);
    }
    cr_assert_eq(o.attempts, n.attempts, "%s: claim %s attempts", when, key);
    *m = n;
}

/* Copy the store directory as it is on disk and go on from the copy,
 * as a restart after kill -9 would. */
static idem_store *crash(idem_store *s, int *gen)
{
    char copy[4450];
    snprintf(copy, sizeof copy, "%s.%d", base_dir, ++*gen);
    /* A job building a key index may write and rename its temporary
     * file while cp lists and reads the directory: a crash in the middle
     * of a job. A temporary that went before cp came to it is one the
     * crash did not leave; nothing else may fail to copy. */
    cr_assert_eq(t_sh("cp -r '%s' '%s' 2>'%s.err'; r=$?; [ $r = 0 ] || "
                      "! grep -v \"\\.tmp': No such file or directory$\" "
                      "'%s.err'; r=$?; rm -f '%s.err'; exit $r",
                      store_dir, copy, copy, copy, copy),
                 0);
    idem_close(s);
    t_rmdir(store_dir);
    snprintf(store_dir, sizeof store_dir, "%s", copy);
    cur = durable;
    return open_store();
}

/* The invariants of s's log hold. */
static void expect_log_ok(idem_store *s, const char *when)
{
    char why[256] = "";
    idem__log *lg = idem__engine_log(s);
    cr_assert(lg, "%s: not a local: or mem: store", when);
    cr_assert_eq(idem__log_check(lg, why, sizeof why), 0, "%s: log: %s",
                 when, why);
}

static void run(unsigned seed)
{
    rnd_state = seed;
    memset(&cur, 0, sizeof cur);
    memset(&durable, 0, sizeof durable);
    snprintf(store_dir, sizeof store_dir, "%s", base_dir);
    int gen = 0;
    idem_store *s = open_store();
    for (int step = 0; step < STEPS; step++) {
        char when[64], key[24];
        snprintf(when, sizeof when, "seed %u step %d", seed, step);
        int k = (int)rnd(NKEYS);
        key_name(key, sizeof key, k);
        mrec *m = &cur.r[k];
        uint64_t tok = is_live(m) ? m->token : 1;
        if (rnd(5) == 0)
            tok++;  /* sometimes a stale or foreign token */
        if (rnd(4) == 0)
            t_clock_ms += rnd(1500);
        unsigned op = rnd(100);
        if (op < 30) {
            do_claim(s, key, m, when);
        } else if (op < 50) {
            char v[VMAX];
            size_t vl = rnd(VMAX);
            for (size_t i = 0; i < vl; i++)
                v[i] = (char)('a' + rnd(26));
            int64_t ttl = rnd(2) ? 0 : 2000 + rnd(20000);
            int ok = holds(m, tok);
            int rc = idem_complete(s, key, strlen(key), tok, v, vl, ttl);
            cr_assert_eq(rc, ok ? 0 : IDEM_ELOST, "%s: complete", when);
            if (ok) {
                m->state = IDEM_STATE_DONE;
                m->lease = 0;
                m->expires = t_clock_ms + (ttl ? ttl : 10000);
                memcpy(m->val, v, vl);
                m->vlen = vl;
            }
        } else if (op < 58) {
            int retry = rnd(2);
            char v[16];
            size_t vl = (size_t)snprintf(v, sizeof v, "err-%u", rnd(100));
            int ok = holds(m, tok);
            int rc = idem_fail(s, key, strlen(key), tok, v, vl,
                               retry ? IDEM_RETRYABLE : 0);
            cr_assert_eq(rc, ok ? 0 : IDEM_ELOST, "%s: fail", when);
            if (ok) {
                m->lease = 0;
                if (retry) {
                    m->released = 1;
                } else {
                    m->state = IDEM_STATE_FAILED;
                    m->expires = t_clock_ms + 4000;
                }
                memcpy(m->val, v, vl);
                m->vlen = vl;
            }
        } else if (op < 63) {
            int64_t lease = 200 + rnd(5000);
            int ok = holds(m, tok);
            int rc = idem_extend(s, key, strlen(key), tok, lease);
            cr_assert_eq(rc, ok ? 0 : IDEM_ELOST, "%s: extend", when);
            if (ok) {
                m->lease = t_clock_ms + lease;
                if (m->expires < m->lease)
                    m->expires = m->lease;
                m->vlen = 0;
            }
        } else if (op < 68) {
            int rc = idem_forget(s, key, strlen(key));
            cr_assert_eq(rc, is_live(m) ? 0 : IDEM_ENOTFOUND, "%s: forget",
                         when);
            m->present = 0;
        } else if (op < 75) {
            expect_key(s, k, when);
        } else if (op < 80) {
            int c = (int)rnd(NCKPT);
            char name[24];
            snprintf(name, sizeof name, "ckpt-%d", c);
            snprintf(cur.ckpt[c], sizeof cur.ckpt[c], "pos-%d", step);
            cr_assert_eq(idem_checkpoint_put(s, name, cur.ckpt[c],
                                             strlen(cur.ckpt[c])),
                         0);
            cur.has_ckpt[c] = 1;
        } else if (op < 88) {
            cr_assert_eq(idem_sync(s), 0, "%s: %s", when, idem_errdetail(s));
            durable = cur;
        } else if (op < 94) {
            static const size_t work[] = {0, 1, 5, 50};
            uint64_t expired;
            int rc = idem_sweep(s, work[rnd(4)], &expired);
            cr_assert_eq(rc, 0, "%s: sweep: %s", when, idem_errdetail(s));
            durable = cur;  /* a sweep commits first */
        } else if (!persistent) {
            expect_all(s, when);
        } else if (op < 97) {
            cr_assert_eq(idem_close(s), 0);
            durable = cur;
            s = open_store();
            expect_all(s, when);
        } else {
            s = crash(s, &gen);
            expect_all(s, when);
        }
        expect_log_ok(s, when);
        job_steps += persistent && idem__engine_log(s)->job.running;
    }
    expect_all(s, "end");
    idem_close(s);
    runs_left += count_runs();
    t_rmdir(store_dir);
}

/* IDEM_MODEL_SEEDS seeds, or seeds. */
static void run_all(int local, int seeds)
{
    persistent = local;
    const char *env = getenv("IDEM_MODEL_SEEDS");
    int n = env ? (int)strtol(env, NULL, 10) : seeds;
    char *d = t_tmpdir();
    snprintf(base_dir, sizeof base_dir, "%s", d);
    free(d);
    for (int i = 1; i <= n; i++)
        run((unsigned)i * 7919u);
}

Test(model, local_with_reopens_and_crashes, .timeout = 600)
{
    run_all(1, 8);
}

/* No hot budget: every sealed segment (4 KiB) goes cold at the next
 * commit, so most lookups go through Bloom filters and key indexes. */
Test(model, local_cold, .timeout = 600)
{
    query = "?hot=0";
    run_all(1, 8);
}

/* A segment a commit: runs of 256 segments fill up, so lookups also go
 * through run indexes. Three seeds: each commit costs a segment's and a
 * key index's fsyncs. */
Test(model, local_cold_runs, .timeout = 600)
{
    query = "?hot=0&segment=1";
    run_all(1, 3);
    cr_assert_gt(runs_left, 0, "no seed kept a run index to its end");
}

/* A budget of 21 keys and 4 KiB segments: keys leave RAM through jobs
 * that run while the model claims, completes, expires, sweeps, reopens
 * and crashes (coldjob.h). The budget is below the model's NKEYS keys,
 * or nothing would ever go cold; and the writer must not always be
 * behind, or every job would be waited for as soon as it started: the
 * test checks that jobs were left running between steps. */
Test(model, local_cold_in_the_background, .timeout = 600)
{
    query = "?hot=1k";
    job_steps = 0;
    run_all(1, 8);
    cr_assert_gt(job_steps, 0, "no step left a key index job running");
}

Test(model, mem, .timeout = 600)
{
    run_all(0, 8);
}
