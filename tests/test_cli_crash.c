/* tests/test_cli_crash.c - kill -9 `idem dedup` and `idem run` at random
 * moments, run the same command again until it finishes, and compare the
 * output byte for byte with an uninterrupted run's.
 *
 * dedup is killed reading a file (resumes at the checkpoint's offset) and
 * reading a pipe (resumes by reading everything again); run is killed with
 * a handler that logs every envelope, and the log must show that no token
 * was ever given twice for a key. Kills per case: 30 for each dedup case,
 * 50 for run (IDEM_CLI_KILLS sets them all).
 *
 * On Redis, whose checkpoints commit with the batch's writes too, dedup
 * is byte-identical as well; the store is emptied between rounds. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "killloop.h"
#include "redis_harness.h"

#define LINES 20000

/* 20,000 events, one in ten a redelivery of an earlier one. */
static void make_input(void)
{
    FILE *f = fopen(t_at("in"), "w");
    cr_assert(f);
    unsigned x = 12345;
    int fresh = 0;
    for (int i = 0; i < LINES; i++) {
        x = x * 1103515245u + 12345u;
        int k = (x >> 8) % 10 == 0 && fresh ? (int)((x >> 12) % fresh)
                                            : fresh++;
        fprintf(f, "{\"id\":\"ev-%d\",\"amount\":%d,\"note\":\"n%u\"}\n", k,
                k * 7 % 1000, k * 13u);
    }
    fclose(f);
}

/* Start idem with argv in t_dir; with `piped`, its stdin is a pipe that a
 * helper fills with the input file. */
static pid_t spawn(const char *const argv[], int piped)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid)
        return pid;
    if (chdir(t_dir) != 0)
        _exit(126);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    if (piped) {
        int p[2];
        if (pipe(p) != 0)
            _exit(126);
        if (fork() == 0) {
            close(p[0]);
            dup2(p[1], 1);
            execlp("cat", "cat", "in", (char *)NULL);
            _exit(127);
        }
        close(p[1]);
        dup2(p[0], 0);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

/* Run to completion once, without kills; returns the seconds it took. */
static double run_clean(const char *const argv[], int piped)
{
    int64_t t0 = t_mono_ms();
    int st;
    waitpid(spawn(argv, piped), &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "clean run failed");
    return (double)(t_mono_ms() - t0) / 1e3;
}

/* Kill runs at random moments until `kills` kills have landed; after each
 * completed run compare the output with ref and start afresh. Returns the
 * number of completed runs that had been killed at least once. */
static int kill_loop(const char *const argv[], int piped, double span,
                     long kills,
                     void (*verify)(void))
{
    int verified = 0, killed_this_round = 0;
    for (long k = 0; k < kills;) {
        pid_t pid = spawn(argv, piped);
        long us = (long)((double)rand() / RAND_MAX * span * 1.2e6);
        struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
        nanosleep(&ts, NULL);
        int landed = kill(pid, SIGKILL) == 0;
        int st;
        waitpid(pid, &st, 0);
        if (WIFSIGNALED(st) && landed) {
            k++;
            killed_this_round = 1;
            continue;
        }
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "a resumed run failed on its own (status %d)", st);
        if (killed_this_round)
            verified++;
        killed_this_round = 0;
        verify();
        t_sh("cd '%s' && rm -rf store out log", t_dir);
    }
    /* finish the last round too */
    int st;
    do
        waitpid(spawn(argv, piped), &st, 0);
    while (!WIFEXITED(st));
    cr_assert_eq(WEXITSTATUS(st), 0);
    verify();
    return verified + killed_this_round;
}

static void same_as_ref(void)
{
    cr_assert_eq(t_sh("cmp -s '%s' '%s'", t_at("out"), t_at("ref")), 0,
                 "the output differs from the uninterrupted run's");
}

/* Each key's tokens in the handler's log only ever grow. */
static void tokens_never_repeat(void)
{
    same_as_ref();
    cr_assert_eq(t_sh("awk '{ if (($1 in t) && $3 <= t[$1]) bad = 1; "
                      "t[$1] = $3 } END { exit bad }' '%s'", t_at("log")), 0,
                 "a token was given twice for one key");
}

/* Empties a store that `rm -rf store` does not reach (NULL: none). */
static void (*reset_store)(void);

static void crash_case(const char *const *argv, int piped, long nkills,
                       void (*verify)(void))
{
    t_dir_init();
    make_input();
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    double span = run_clean(argv, piped);
    t_sh("cd '%s' && mv out ref && rm -rf store log", t_dir);
    if (reset_store)
        reset_store();
    int rounds = kill_loop(argv, piped, span, nkills, verify);
    cr_assert_gt(rounds, 0, "no killed run ever finished (seed %u)", seed);
    cr_log_info("%ld kills over %d resumed runs (seed %u)", nkills, rounds,
                seed);
    t_dir_fini();
}

static char cli[4200], handler[4300];

static void paths(void)
{
    snprintf(cli, sizeof cli, "%s", getenv("IDEM_CLI"));
    snprintf(handler, sizeof handler, "%s/handler log",
             getenv("IDEM_PROGS"));
}

Test(cli_crash, dedup_file_kill9, .timeout = 900)
{
    paths();
    const char *argv[] = {cli, "dedup", "--key", "id", "--batch", "300",
                    "--store", "local:store", "--output", "out", "in", NULL};
    crash_case(argv, 0, t_kills(30), same_as_ref);
}

Test(cli_crash, dedup_pipe_kill9, .timeout = 900)
{
    paths();
    const char *argv[] = {cli, "dedup", "--key", "id", "--batch", "300",
                    "--store", "local:store", "--output", "out", NULL};
    crash_case(argv, 1, t_kills(30), same_as_ref);
}

Test(cli_crash, run_kill9, .timeout = 900)
{
    paths();
    const char *argv[] = {cli, "run", "--key", "id", "--batch", "300",
                          "--store", "local:store", "--output", "out",
                          "--exec", handler, "in", NULL};
    crash_case(argv, 0, t_kills(50), tokens_never_repeat);
}

/* Redis: out is ref byte for byte (and, for run, no token is given
 * twice); then the store is emptied for the next round, on every node of
 * a cluster. */
static char redis_ports[8][16], redis_prefix[64];
static int nports;

static void flush_redis(void)
{
    /* One DEL per key, on the node that listed it: a DEL of many keys
     * fails on a cluster when they lie in different slots. */
    for (int i = 0; i < nports; i++)
        t_sh("redis-cli -p %s --scan --pattern '%s*' | sed 's/^/DEL /' | "
             "redis-cli -p %s > /dev/null", redis_ports[i], redis_prefix,
             redis_ports[i]);
}

static void same_and_flush(void)
{
    same_as_ref();
    flush_redis();
}

static void tokens_and_flush(void)
{
    tokens_never_repeat();
    flush_redis();
}

/* The store URI for scheme over addrs ("h:p,h:p"), whose ports the
 * flush visits. */
static const char *redis_case(const char *scheme, const char *addrs)
{
    static char uri[512];
    paths();
    snprintf(redis_prefix, sizeof redis_prefix, "%s", th_prefix());
    nports = 0;
    for (const char *p = addrs; p && nports < 8; p = strchr(p, ',')) {
        p += *p == ',';
        snprintf(redis_ports[nports++], sizeof redis_ports[0], "%d",
                 th_first_port(p));
    }
    snprintf(uri, sizeof uri, "%s://%s?prefix=%s", scheme, addrs,
             redis_prefix);
    reset_store = flush_redis;
    return uri;
}

static void dedup_on(const char *uri, long n)
{
    const char *argv[] = {cli, "dedup", "--key", "id", "--batch", "300",
                          "--lease", "1s", "--store", uri, "--output", "out",
                          "in", NULL};
    crash_case(argv, 0, n, same_and_flush);
}

static void run_on(const char *uri, long n)
{
    const char *argv[] = {cli, "run", "--key", "id", "--batch", "300",
                          "--lease", "1s", "--store", uri, "--output", "out",
                          "--exec", handler, "in", NULL};
    crash_case(argv, 0, n, tokens_and_flush);
}

Test(cli_crash, dedup_redis_kill9, .timeout = 900)
{
    dedup_on(redis_case("redis", th_redis_addr()), t_kills(20));
    th_shared_stop();
}

Test(cli_crash, run_redis_kill9, .timeout = 900)
{
    run_on(redis_case("redis", th_redis_addr()), t_kills(10));
    th_shared_stop();
}

Test(cli_crash, dedup_cluster_kill9, .timeout = 900)
{
    dedup_on(redis_case("redis-cluster", th_cluster_addr()), t_kills(10));
    th_shared_stop();
}

Test(cli_crash, run_cluster_kill9, .timeout = 900)
{
    run_on(redis_case("redis-cluster", th_cluster_addr()), t_kills(10));
    th_shared_stop();
}
