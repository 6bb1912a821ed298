/* bench/stream_scripts.c - what the server spends per key on the
 * one-script commit (docs/streams.md, "One script"), step by step.
 *
 * bench/streams.sh times whole pipelines, and on a shared machine their
 * wall clock swings by 2x; the question "which part of the server's work
 * per key would a change remove" needs the parts apart. This runs the
 * library's own calls against a redis-server of its own (it FLUSHALLs
 * it), N fresh keys in batches of 1,000, each step a run of its own:
 *
 *   claims       idem_claim_many() alone: the claim script (64 keys a
 *                call), each fresh key written PENDING
 *   commit       idem_runner_batch() without a handler (dedup): the same
 *                claims, then a commit that puts a checkpoint, so that
 *                one script checks each token and writes each key DONE
 *   commit-xadd  the same, the commit queuing an XADD of each key's entry
 *                (six short fields) with idem_checkpoint_write(), as the
 *                CLI does when its output stream is on the store's server
 *   xadd-client  the same XADDs sent by the client, pipelined, as the
 *                at-least-once reference (bench/stream_alo.c) sends them
 *
 * One line per step: system=NAME n=N script_us_per_key (EVALSHA time, the
 * commands inside included) server_cpu_us_per_key (INFO cpu), then each
 * command's time per key (INFO commandstats, reset before the step; the
 * commands run inside scripts are counted apart too). The server times
 * its commands by the clock, so on a loaded machine they swell with the
 * time it waited for a core; its CPU per key is the figure to compare.
 * The differences say what each part costs: commit minus claims is the
 * completion, commit-xadd minus commit the XADD through the script. */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem/idem.h"
#include "keys36.h"

#define BATCH 1000
#define MAXCMDS 64

enum { CLAIMS, COMMIT, COMMIT_XADD, XADD_CLIENT, STEPS };
static const char *const step_name[STEPS] = {"claims", "commit",
                                             "commit-xadd", "xadd-client"};

typedef struct job {
    idem_store *s;
    int xadd;            /* queue an XADD per committed key */
    size_t base;         /* the batch's first key, for the checkpoint */
} job;

static redisContext *c;

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "stream_scripts: %s: %s\n", what, detail);
    exit(1);
}

static redisReply *cmd(const char *fmt, const char *arg)
{
    redisReply *r = redisCommand(c, fmt, arg);
    if (!r)
        die("redis", c->errstr);
    return r;
}

/* The XADD of key k (six fields, as bench/gen_events writes them). */
static int xadd_argv(const char *k, const char *argv[15], size_t argl[15])
{
    static const char *const f[] = {"XADD", "out", "*", "event_id", NULL,
                                    "type", "payment", "amount", "42",
                                    "user", "u1234", "currency", "EUR",
                                    "idem-key", NULL};
    for (int i = 0; i < 15; i++) {
        argv[i] = f[i] ? f[i] : k;
        argl[i] = strlen(argv[i]);
    }
    return 15;
}

static int commit_step(void *ctx, const idem_msg *m, size_t n)
{
    job *j = ctx;
    for (size_t i = 0; j->xadd && i < n; i++) {
        const char *argv[15];
        size_t argl[15], at;
        if (m[i].result != IDEM_MSG_DONE)
            continue;
        int rc = idem_checkpoint_write(j->s, xadd_argv(m[i].key, argv, argl),
                                       argv, argl, 1, &at);
        if (rc)
            return rc;
    }
    char text[32];
    int len = snprintf(text, sizeof text, "%zu", j->base + n);
    return idem_checkpoint_put(j->s, "bench", text, (size_t)len);
}

/* One batch of keys [from, from + n) through step. */
static void batch(int step, idem_store *s, idem_runner *r, job *j,
                  char (*keys)[BENCH_KEYLEN + 1], size_t from, size_t n)
{
    static idem_key k[BATCH];
    static idem_outcome o[BATCH];
    static idem_msg m[BATCH];
    for (size_t i = 0; i < n; i++) {
        k[i] = (idem_key){keys[from + i], BENCH_KEYLEN, NULL};
        m[i] = (idem_msg){.key = keys[from + i], .keylen = BENCH_KEYLEN,
                          .msg = keys[from + i], .msglen = BENCH_KEYLEN};
    }
    size_t done;
    int rc = 0;
    if (step == CLAIMS) {
        rc = idem_claim_many(s, k, n, NULL, o, 0);
    } else if (step == XADD_CLIENT) {
        for (size_t i = 0; i < n; i++) {
            const char *argv[15];
            size_t argl[15];
            redisAppendCommandArgv(c, xadd_argv(keys[from + i], argv, argl),
                                   argv, argl);
        }
        for (size_t i = 0; i < n; i++) {
            void *rep;
            if (redisGetReply(c, &rep) != REDIS_OK)
                die("XADD", c->errstr);
            freeReplyObject(rep);
        }
    } else {
        j->base = from;
        rc = idem_runner_batch(r, m, n, &done);
    }
    if (rc)
        die(step_name[step], idem_errdetail(s));
}

static double server_cpu(void)
{
    redisReply *r = cmd("INFO %s", "cpu");
    const char *u = strstr(r->str, "used_cpu_user:");
    const char *y = strstr(r->str, "used_cpu_sys:");
    double t = (u ? strtod(u + 14, NULL) : 0) + (y ? strtod(y + 13, NULL) : 0);
    freeReplyObject(r);
    return t;
}

/* Each command's time per key since the reset, from its
 * "cmdstat_NAME:calls=C,usec=U,..." line; the scripts' own in *script_us. */
static void print_commands(size_t n, double *script_us)
{
    redisReply *r = cmd("INFO %s", "commandstats");
    *script_us = 0;
    for (const char *p = r->str; (p = strstr(p, "cmdstat_")) != NULL;) {
        p += 8;
        const char *e = strchr(p, ':');
        const char *u = e ? strstr(e, "usec=") : NULL;
        if (!u)
            break;
        int len = (int)(e - p);
        double us = strtod(u + 5, NULL) / (double)n;
        if (len == 7 && !strncmp(p, "evalsha", 7))
            *script_us = us;
        else if (us >= 0.005)
            printf(" %.*s_us_per_key=%.2f", len, p, us);
    }
    freeReplyObject(r);
}

static void run_step(int step, const char *uri, char (*keys)[BENCH_KEYLEN + 1],
                     size_t n)
{
    freeReplyObject(cmd("FLUSHALL%s", ""));
    idem_store *s;
    if (idem_open(uri, NULL, &s))
        die("open", uri);
    job j = {s, step == COMMIT_XADD, 0};
    idem_runner_opts o;
    idem_runner_opts_init(&o);
    o.commit = commit_step;
    o.ctx = &j;
    idem_runner *r;
    if (idem_runner_new(s, &o, &r))
        die("runner", idem_errdetail(s));
    freeReplyObject(cmd("CONFIG RESETSTAT%s", ""));
    double cpu0 = server_cpu();
    for (size_t from = 0; from < n; from += BATCH)
        batch(step, s, r, &j, keys, from, n - from < BATCH ? n - from : BATCH);
    double cpu = server_cpu() - cpu0, script;
    printf("system=%s n=%zu", step_name[step], n);
    print_commands(n, &script);
    printf(" script_us_per_key=%.2f server_cpu_us_per_key=%.2f\n", script,
           cpu * 1e6 / (double)n);
    fflush(stdout);
    idem_runner_free(r);
    if (idem_close(s))
        die("close", uri);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: stream_scripts PORT N\n");
        return 2;
    }
    int port = (int)strtol(argv[1], NULL, 10);
    size_t n = (size_t)strtoull(argv[2], NULL, 10);
    c = redisConnect("127.0.0.1", port);
    if (!c || c->err || !n)
        die("connect", c ? c->errstr : "out of memory");
    char (*keys)[BENCH_KEYLEN + 1] = malloc(n * sizeof *keys);
    if (!keys)
        die("keys", "out of memory");
    for (size_t i = 0; i < n; i++)
        bench_key(1, i, keys[i]);
    char uri[128];
    snprintf(uri, sizeof uri, "redis://127.0.0.1:%d?prefix=b:", port);
    for (int step = 0; step < STEPS; step++)
        run_step(step, uri, keys, n);
    free(keys);
    redisFree(c);
    return 0;
}
