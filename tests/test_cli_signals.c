/* tests/test_cli_signals.c - stopping `idem run` and `idem dedup` with
 * real signals, as systemd, Kubernetes and Ctrl-C do.
 *
 * The first SIGTERM or SIGINT is a graceful stop: what the handler
 * answered is committed, the claims it did not answer are released (not
 * left PENDING for a lease), the exit status is 0 (SIGTERM) or 130
 * (SIGINT), and the same command then completes the rest with one result
 * line per key. A second signal ends idem at once, and the rerun still
 * completes every key once. Waits use generous deadlines; no assertion
 * depends on how fast the machine is. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define N 40

static void setup(void)
{
    t_dir_init();
    FILE *f = fopen(t_at("in"), "w");
    cr_assert(f);
    for (int i = 0; i < N; i++)
        fprintf(f, "{\"id\":\"k%d\"}\n", i);
    fclose(f);
}

TestSuite(cli_signals, .init = setup, .fini = t_dir_fini, .timeout = 300);

/* idem run over `in` with the test handler, in the background. */
static pid_t start_run(const char *opts, const char *actions)
{
    return t_cli_start(t_dir, "run --key id --output out %s --exec "
                       "'\"$IDEM_PROGS/handler\" log %s' in 2> err",
                       opts, actions);
}

/* No claim is left PENDING under a lease: each was committed or given
 * back ("released"), so the next run takes it at once. */
static void expect_nothing_pending(void)
{
    cr_assert_eq(t_cli(t_dir, "dump > dump 2> /dev/null"), 0);
    cr_assert_neq(t_sh("grep '\"state\":\"pending\"' '%s' | grep -v "
                       "'\"released\":true'", t_at("dump")), 0, "%s",
                  t_read(t_at("dump"), NULL));
}

/* A rerun completes the job: one result line per key. */
static void expect_rerun_completes(void)
{
    cr_assert_eq(t_cli(t_dir, "run --key id --output out --exec "
                       "'\"$IDEM_PROGS/handler\"' in 2> err2"), 0, "%s",
                 t_read(t_at("err2"), NULL));
    cr_assert_eq(t_lines_of("out"), N);
    cr_assert_eq(t_sh("cd '%s' && for i in $(seq 0 %d); do "
                      "[ \"$(grep -c \"\\\"key\\\":\\\"k$i\\\"\" out)\" = 1 ] "
                      "|| exit 1; done", t_dir, N - 1), 0,
                 "a key has no result line or two");
}

/* A slow handler (0.2 s a message) gets the signal after its first
 * answers; the grace is too short for the rest. */
static void stop_run(int sig, int status, const char *said)
{
    pid_t p = start_run("--grace 1ms", "sleep=200");
    t_wait_lines("log", 3);
    kill(p, sig);
    int st = t_wait(p);
    cr_assert_eq(st, status, "exit %d: %s", st, t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), said), "%s", t_read(t_at("err"), NULL));
    cr_assert(!t_grep(t_at("err"), " 0 messages in flight"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert_lt(t_lines_of("out"), N);
    expect_nothing_pending();
    expect_rerun_completes();
}

Test(cli_signals, run_sigterm_commits_what_is_answered_and_releases_the_rest)
{
    stop_run(SIGTERM, 0, "stopped by SIGTERM");
}

Test(cli_signals, run_sigint_does_the_same_and_exits_130)
{
    stop_run(SIGINT, 130, "stopped by SIGINT");
}

/* Within the grace the handler finishes what it was sent: committed. */
Test(cli_signals, run_in_flight_messages_finish_within_the_grace)
{
    pid_t p = start_run("--grace 10m", "sleep=200");
    t_wait_lines("log", 1);
    kill(p, SIGTERM);
    cr_assert_eq(t_wait(p), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "stopped by SIGTERM"));
    cr_assert_eq(t_lines_of("out"), t_lines_of("log"),
                 "every message the handler got was answered and "
                 "committed");
    expect_nothing_pending();
    expect_rerun_completes();
}

/* A second signal ends idem at once (the first one, SIGINT, could still
 * wait minutes); the handler goes with it, the store and the output stay
 * consistent, and the rerun completes the job. */
Test(cli_signals, a_second_signal_stops_at_once)
{
    char actions[4400];
    snprintf(actions, sizeof actions, "sleep=200 %s/marker", t_dir);
    pid_t p = start_run("--grace 10m", actions);
    t_wait_lines("log", 2);
    kill(p, SIGINT);
    kill(p, SIGTERM);
    cr_assert_eq(t_wait(p), 128 + SIGTERM, "%s", t_read(t_at("err"), NULL));
    char marker[4300];
    snprintf(marker, sizeof marker, "%s/marker", t_dir);
    cr_assert(t_no_process_with(marker), "the handler outlived idem");
    expect_rerun_completes();
}

/* dedup waiting on a pipe that has no more lines yet: a stop signal ends
 * the wait, what was read is committed, exit 0. */
Test(cli_signals, dedup_stops_while_waiting_for_input)
{
    cr_assert_eq(mkfifo(t_at("fifo"), 0600), 0);
    int w = open(t_at("fifo"), O_RDWR);  /* keeps the pipe open, no EOF */
    cr_assert_geq(w, 0);
    static const char lines[] = "a\nb\na\nc\n";
    cr_assert_eq(write(w, lines, sizeof lines - 1),
                 (ssize_t)(sizeof lines - 1));
    pid_t p = t_cli_start(t_dir, "dedup --line --commit-interval 10ms "
                          "--output out < fifo 2> err");
    t_wait_lines("out", 3);
    kill(p, SIGTERM);
    int st = t_wait(p);
    close(w);
    cr_assert_eq(st, 0, "exit %d: %s", st, t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "stopped by SIGTERM"));
    char *out = t_read(t_at("out"), NULL);
    cr_assert_str_eq(out, "a\nb\nc\n");
    free(out);
}
