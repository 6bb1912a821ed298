/* tests/test_cli_workers.c - the runner composed with the world around
 * it: two workers on one store and one input, slow handlers, a TTL and a
 * lease shorter than a batch, a worker stalled past its lease, and a kill
 * -9 while a slow batch is half answered.
 *
 * Each case checks the promise as a user sees it, over real processes:
 * every key's handler runs exactly once in total (from the handlers' one
 * shared log, appended a whole line at a time), and every key has exactly
 * one result line across the workers' outputs. Nothing here asserts on
 * timing: a worker started "1.5 s later" may start at any moment, and the
 * outcome must be the same. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "redis_harness.h"

/* n events {"event_id":"kI"}, keys k0..k(n-1), each once. */
static void make_input(int n)
{
    FILE *f = fopen(t_at("in"), "w");
    cr_assert(f);
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"event_id\":\"k%d\",\"amount\":%d}\n", i, i);
    fclose(f);
}

TestSuite(workers, .init = t_dir_init, .fini = t_dir_fini, .timeout = 240);

/* `idem run` over the file `input` in the background, its stderr in
 * NAME.err, its output in NAME; the handler logs every envelope to the
 * shared file "log". */
static pid_t start_run_on(const char *input, const char *name,
                          const char *store, const char *opts,
                          const char *actions)
{
    char cmd[6000];
    snprintf(cmd, sizeof cmd,
             "exec \"$IDEM_CLI\" run --key event_id --store '%s' --output "
             "'%s' %s --exec '\"$IDEM_PROGS/handler\" log %s' '%s' "
             "2> '%s.err'", store, name, opts, actions, input, name);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (chdir(t_dir) != 0)
            _exit(126);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* The same over the file "in". */
static pid_t start_run(const char *name, const char *store, const char *opts,
                       const char *actions)
{
    return start_run_on("in", name, store, opts, actions);
}

/* The exit status of pid, or 128 + the signal that ended it. */
static int wait_for(pid_t pid)
{
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* How often "needle" occurs in the file at path (0 if absent). */
static int occurrences(const char *path, const char *needle)
{
    if (access(path, F_OK) != 0)
        return 0;
    char *b = t_read(path, NULL);
    int n = 0;
    for (const char *p = b; (p = strstr(p, needle)) != NULL; p++)
        n++;
    free(b);
    return n;
}

/* How many envelopes of key kI the handlers logged ("kI TOKEN" lines). */
static int runs_of(int i)
{
    char logged[64], first[64];
    snprintf(logged, sizeof logged, "\nk%d ", i);
    snprintf(first, sizeof first, "k%d ", i);
    if (access(t_at("log"), F_OK) != 0)
        return 0;
    char *log = t_read(t_at("log"), NULL);
    int ran = occurrences(t_at("log"), logged) +
              (strncmp(log, first, strlen(first)) == 0);
    free(log);
    return ran;
}

/* Every key k0..k(n-1): run `runs` times by the handlers (any number if
 * runs < 0), and one result line with status done across the outputs. */
static void expect_each_key(int n, int runs, const char *const outs[],
                            int nouts)
{
    for (int i = 0; i < n; i++) {
        char result[64];
        snprintf(result, sizeof result,
                 "{\"key\":\"k%d\",\"status\":\"done\"", i);
        int ran = runs_of(i);
        if (runs >= 0)
            cr_assert_eq(ran, runs, "k%d ran %d times", i, ran);
        int lines = 0;
        for (int j = 0; j < nouts; j++)
            lines += occurrences(t_at(outs[j]), result);
        cr_assert_eq(lines, 1, "k%d has %d result lines", i, lines);
    }
}

/* Two workers on one input and one store, the second started while the
 * first is half way through a batch that outlasts its lease. */
static void two_workers(const char *store)
{
    make_input(30);
    /* Workers of one job share its keys by naming its key space. */
    const char *opts = "--lease 1s --batch 30 --key-space orders";
    pid_t w1 = start_run("out1", store, opts, "sleep=100");
    t_sleep_ms(1500);
    pid_t w2 = start_run("out2", store, opts, "sleep=100");
    int st1 = wait_for(w1), st2 = wait_for(w2);
    cr_assert_eq(st1, 0, "worker 1 exited %d", st1);
    cr_assert_eq(st2, 0, "worker 2 exited %d", st2);
    const char *const outs[] = {"out1", "out2"};
    expect_each_key(30, 1, outs, 2);
}

static const char *redis_store(const char *scheme, const char *addr)
{
    static char uri[512];
    snprintf(uri, sizeof uri, "%s://%s?prefix=%s", scheme, addr,
             th_prefix());
    return uri;
}

Test(workers, two_on_one_redis_each_key_once)
{
    two_workers(redis_store("redis", th_redis_addr()));
    th_shared_stop();
}

/* A handler slower than --lease that extends its lease: it is not
 * killed as hung, and a second worker started meanwhile does not take
 * its keys over. */
Test(workers, a_handler_that_extends_its_lease_keeps_its_keys)
{
    make_input(3);
    const char *store = redis_store("redis", th_redis_addr());
    /* A lease of 4 s leaves the renewals of the messages waiting their
     * turn (every 1.3 s) room on a loaded machine. */
    const char *opts = "--lease 4s --batch 3 --key-space slow";
    pid_t w1 = start_run("out1", store, opts, "extend=30s sleep=7000");
    for (int waited = 0; t_lines_of("log") < 1 && waited < 60000;
         waited += 10)
        t_sleep_ms(10);
    t_sleep_ms(4500);  /* past the lease of the first message */
    pid_t w2 = start_run("out2", store, opts, "");
    int st1 = wait_for(w1), st2 = wait_for(w2);
    cr_assert_eq(st1, 0, "worker 1 exited %d: %s", st1,
                 t_read(t_at("out1.err"), NULL));
    cr_assert_eq(st2, 0, "worker 2 exited %d", st2);
    const char *const outs[] = {"out1", "out2"};
    expect_each_key(3, 1, outs, 2);
    th_shared_stop();
}

Test(workers, two_on_one_cluster_each_key_once)
{
    two_workers(redis_store("redis-cluster", th_cluster_addr()));
    th_shared_stop();
}

/* A TTL and a lease shorter than the batch: the claims are renewed while
 * the handler works, so every result is stored and written. */
Test(workers, slow_batch_outlives_ttl_and_lease_local)
{
    make_input(5);
    pid_t w = start_run("out", "local:store",
                        "--ttl 1s --lease 1s --batch 5", "sleep=500");
    cr_assert_eq(wait_for(w), 0);
    const char *const outs[] = {"out"};
    expect_each_key(5, 1, outs, 1);
    w = start_run("out", "local:store", "--ttl 1s --lease 1s --batch 5",
                  "sleep=500");
    cr_assert_eq(wait_for(w), 0);
    expect_each_key(5, 1, outs, 1);
}

/* Finished work is committed by time, not only at the end of a batch:
 * with a slow handler the output grows while the batch is still being
 * answered, and a kill -9 there sends back to the handler only what was
 * not committed. */
Test(workers, slow_handler_commits_by_time_then_kill9)
{
    make_input(20);
    pid_t w = start_run("out", "local:store", "--commit-interval 100ms",
                        "sleep=300");
    /* Two lines: the first one's commit is done before the second one
     * is written, as commits follow one another. */
    for (int waited = 0; t_lines_of("out") < 2 && waited < 120000;
         waited += 20)
        t_sleep_ms(20);
    int ran = t_lines_of("log");
    cr_assert_gt(t_lines_of("out"), 1, "nothing committed");
    cr_assert_lt(ran, 20, "committed only when the batch ended");
    kill(w, SIGKILL);
    wait_for(w);
    /* Committed is what the store holds done: a line in the output may
     * be ahead of its commit (written and synced first), and the rerun
     * cuts it back and runs its key again. */
    cr_assert_eq(t_cli(t_dir, "dump > dump"), 0);
    char *dump = t_read(t_at("dump"), NULL);
    w = start_run("out", "local:store", "--commit-interval 100ms",
                  "sleep=1");
    cr_assert_eq(wait_for(w), 0);
    const char *const outs[] = {"out"};
    expect_each_key(20, -1, outs, 1);
    /* What was committed before the kill never ran again. */
    for (int i = 0; i < 20; i++) {
        char record[64];
        snprintf(record, sizeof record, "\"key\":\"k%d\",", i);
        const char *r = strstr(dump, record);
        if (!r || !strstr(r, "\"state\":\"done\"") ||
            strchr(r, '\n') < strstr(r, "\"state\":\"done\""))
            continue;
        cr_assert_eq(runs_of(i), 1, "k%d was committed, yet ran again", i);
    }
    free(dump);
}

/* A worker stalled (SIGSTOP) for longer than its lease loses its keys to
 * a second worker. When it wakes it must not report them done: it says
 * so on stderr and exits 3, and each key has one result line. */
Test(workers, stalled_worker_reports_lost_keys_redis)
{
    make_input(6);
    const char *store = redis_store("redis", th_redis_addr());
    pid_t w1 = start_run("out1", store, "--lease 1s --key-space s",
                         "sleep=300");
    for (int waited = 0; t_lines_of("log") == 0 && waited < 60000;
         waited += 10)
        t_sleep_ms(10);
    kill(w1, SIGSTOP);
    t_sleep_ms(1500);  /* its leases run out */
    pid_t w2 = start_run("out2", store, "--lease 1s --key-space s",
                         "sleep=1");
    int st2 = wait_for(w2);
    kill(w1, SIGCONT);
    int st1 = wait_for(w1);
    cr_assert_eq(st2, 0);
    cr_assert_eq(st1, 3, "the stalled worker exited %d", st1);
    cr_assert(t_grep(t_at("out1.err"), "lost to another worker"));
    const char *const outs[] = {"out1", "out2"};
    expect_each_key(6, -1, outs, 2);
    th_shared_stop();
}

/* The same job started twice on a Redis store (an instance started while
 * the last one still stops, an overlapping cron run): the store lets both
 * in, but the output is the job's and has one checkpoint. The first run
 * waits on a pipe after committing a and b; the second would cut the
 * output back to that, append c and commit its length; the first would
 * then write d over c, and a rerun finds c done: its line lost for good.
 * The second run is refused before it touches anything, and runs once the
 * first has ended. */
Test(workers, one_output_is_written_by_one_run_at_a_time)
{
    const char *store = redis_store("redis", th_redis_addr());
    cr_assert_eq(mkfifo(t_at("fifo"), 0600), 0);
    /* keeps the pipe open, no EOF, and only here: not in the runs */
    int w = open(t_at("fifo"), O_RDWR | O_CLOEXEC);
    cr_assert_geq(w, 0);
    cr_assert_eq(write(w, "a\nb\n", 4), 4);
    pid_t first = t_cli_start(t_dir, "dedup --line --store '%s' "
                              "--commit-interval 10ms --output out < fifo "
                              "2> first.err", store);
    for (int waited = 0; t_lines_of("out") < 2 && waited < 60000;
         waited += 10)
        t_sleep_ms(10);
    cr_assert_eq(t_lines_of("out"), 2, "the first run committed nothing");
    t_write(t_at("in"), "a\nb\nc\n", 6);
    cr_assert_eq(t_cli(t_dir, "dedup --line --store '%s' --output out in "
                              "2> second.err", store), 1);
    cr_assert(t_grep(t_at("second.err"), "--output out is being written by "
                                         "another idem process"), "%s",
              t_read(t_at("second.err"), NULL));
    cr_assert_eq(write(w, "d\n", 2), 2);
    close(w);
    cr_assert_eq(wait_for(first), 0, "%s", t_read(t_at("first.err"), NULL));
    cr_assert_eq(t_cli(t_dir, "dedup --line --store '%s' --output out in "
                              "2> second.err", store), 0);
    char *out = t_read(t_at("out"), NULL);
    cr_assert_str_eq(out, "a\nb\nd\nc\n");
    free(out);
    th_shared_stop();
}

/* pid's exit status once it ends within a minute, else -1. */
static int exit_within_a_minute(pid_t pid)
{
    for (int waited = 0; waited < 60000; waited += 10) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        t_sleep_ms(10);
    }
    return -1;
}

/* Worker A holds k0..k2 (its handler extends their leases by ten minutes
 * and works until the test lets it end); worker B, on the same store and
 * key space, runs b0 and then waits for k0. A SIGTERM to B ends that
 * wait, though A's leases have minutes to run: B exits 0, with b0
 * committed and A's keys left alone, and A, let go, does every key once. */
Test(workers, sigterm_ends_a_wait_for_another_workers_key)
{
    make_input(3);
    t_write(t_at("inb"), "{\"event_id\":\"b0\"}\n", 18);
    cr_assert_eq(t_sh("cat '%s' >> '%s'", t_at("in"), t_at("inb")), 0);
    const char *store = redis_store("redis", th_redis_addr());
    char actions[4400];
    snprintf(actions, sizeof actions, "extend=10m waitfor=%s/go", t_dir);
    pid_t a = start_run("outa", store, "--key-space both", actions);
    t_wait_lines("log", 1);  /* A has claimed its whole batch */
    pid_t b = start_run_on("inb", "outb", store, "--key-space both", "");
    t_wait_lines("outb", 1);  /* b0 is committed: B is at k0 */
    kill(b, SIGTERM);
    int st = exit_within_a_minute(b);
    t_write(t_at("go"), "", 0);
    if (st < 0) {
        kill(b, SIGKILL);
        wait_for(b);
    }
    cr_assert_eq(st, 0, "B exited %d (-1: still waiting a minute after "
                 "SIGTERM): %s", st, t_read(t_at("outb.err"), NULL));
    cr_assert(t_grep(t_at("outb.err"), "stopped by SIGTERM"), "%s",
              t_read(t_at("outb.err"), NULL));
    cr_assert_eq(wait_for(a), 0, "%s", t_read(t_at("outa.err"), NULL));
    const char *const outs[] = {"outa", "outb"};
    expect_each_key(3, 1, outs, 2);
    cr_assert_eq(t_lines_of("outb"), 1, "B wrote a line of A's keys");
    th_shared_stop();
}

/* ------------------------------------------------------------------------
 * Errors of one key: the key ends in a defined state, is named on stderr,
 * and the exit status is not 0. */

/* An answer over IDEM_VALUE_MAX cannot be stored: it is recorded as a
 * permanent failure that says so (running it again would double the
 * effect), the others are done, and a rerun runs nothing. */
Test(workers, an_answer_too_large_is_a_reported_permanent_failure)
{
    make_input(3);
    pid_t w = start_run("out", "local:store", "--key-space t", "big=k1");
    cr_assert_eq(wait_for(w), 3);
    cr_assert(t_grep(t_at("out.err"), "key 'k1': the handler's answer is too "
                                      "large to store"));
    cr_assert(t_grep(t_at("out"), "{\"key\":\"k1\",\"status\":\"failed\""));
    cr_assert_eq(t_cli(t_dir, "get --key-space t k1 | grep -q failed"), 0);
    w = start_run("out2", "local:store", "--key-space t", "");
    cr_assert_eq(wait_for(w), 0);
    cr_assert_eq(t_lines_of("log"), 3, "nothing ran again");
}

/* A record idem cannot read (a string where a hash belongs) makes the
 * claim of its key fail: the key is named, the others are done, exit 3. */
Test(workers, a_key_the_store_refuses_is_reported)
{
    make_input(3);
    const char *prefix = th_prefix();
    char store[512];
    snprintf(store, sizeof store, "redis://%s?prefix=%s", th_redis_addr(),
             prefix);
    redisContext *c = th_connect(th_first_port(th_redis_addr()));
    freeReplyObject(th_cmd(c, "SET %s{k1} garbage", prefix));
    redisFree(c);
    pid_t w = start_run("out", store, "--shared-keys", "");
    cr_assert_eq(wait_for(w), 3);
    cr_assert(t_grep(t_at("out.err"), "key 'k1': the store refused its key"));
    const char *const outs[] = {"out"};
    for (int i = 0; i < 3; i += 2) {
        char result[64];
        snprintf(result, sizeof result, "{\"key\":\"k%d\",\"status\":"
                 "\"done\"", i);
        cr_assert_eq(occurrences(t_at(outs[0]), result), 1);
    }
    th_shared_stop();
}

/* ------------------------------------------------------------------------
 * The handler's whole process tree ends with it */

/* sh forks the handler it is given; a hung handler killed at the end of
 * its lease (and the restarted one after it) must leave no process of
 * its tree behind: a survivor would go on running effects for claims
 * that were released and given to another. */
Test(workers, a_killed_handler_leaves_no_process_behind)
{
    make_input(4);
    char actions[4400];
    snprintf(actions, sizeof actions, "hang=2 %s/marker", t_dir);
    pid_t w = start_run("out", "local:store", "--lease 1s --restart 1",
                        actions);
    int st = wait_for(w);
    cr_assert_eq(st, 1, "the handler hangs again after its restart: %d", st);
    cr_assert(t_grep(t_at("out.err"), "within the lease"));
    char marker[4300];
    snprintf(marker, sizeof marker, "%s/marker", t_dir);
    cr_assert(t_no_process_with(marker),
              "a handler of the killed tree is still running");
}

/* kill -9 of idem itself: what the handler started (here a shell that
 * the handler's shell put in the background) dies too, found by the
 * marker in its argv. */
Test(workers, kill9_of_idem_leaves_no_process_of_the_handler_tree)
{
    make_input(4);
    pid_t w = t_cli_start(t_dir, "run --key event_id --output out --exec "
                          "'sh -c \"sleep 60; : %s/marker\" & exec "
                          "\"$IDEM_PROGS/handler\" hang=1' in 2> err", t_dir);
    char child[4300];
    snprintf(child, sizeof child, "sh -c sleep 60; : %s/marker", t_dir);
    for (int waited = 0; !t_processes_with(child) && waited < 60000;
         waited += 10)
        t_sleep_ms(10);
    cr_assert(t_processes_with(child), "the handler's child never started");
    kill(w, SIGKILL);
    t_wait(w);
    cr_assert(t_no_process_with(child), "a process of the handler's tree "
              "outlived idem");
}

/* ------------------------------------------------------------------------
 * A store error is not a handler error */

/* Redis stops answering for longer than timeout_ms while the handler
 * works: the run stops (exit 1) instead of restarting the handler, which
 * did nothing wrong, over claims it still holds; the rerun from the
 * checkpoint ends with one result line per key. */
Test(workers, a_store_error_stops_the_run_it_does_not_restart_the_handler)
{
    make_input(200);
    char store[512];
    snprintf(store, sizeof store, "redis://%s?prefix=%s&timeout_ms=300",
             th_redis_addr(), th_prefix());
    const char *opts = "--restart 3 --commit-interval 50ms --lease 2s";
    pid_t w = start_run("out", store, opts, "sleep=10");
    for (int waited = 0; t_lines_of("log") < 20 && waited < 60000;
         waited += 10)
        t_sleep_ms(10);
    redisContext *c = th_connect(th_first_port(th_redis_addr()));
    freeReplyObject(th_cmd(c, "CLIENT PAUSE 1500 WRITE"));
    redisFree(c);
    int st = wait_for(w);
    cr_assert_eq(st, 1, "exit %d: %s", st, t_read(t_at("out.err"), NULL));
    cr_assert(!t_grep(t_at("out.err"), "restarting the handler"),
              "%s", t_read(t_at("out.err"), NULL));
    t_sleep_ms(1600);
    w = start_run("out", store, "--lease 2s", "");
    cr_assert_eq(wait_for(w), 0);
    const char *const outs[] = {"out"};
    expect_each_key(200, -1, outs, 1);
    th_shared_stop();
}
