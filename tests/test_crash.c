/* tests/test_crash.c - kill -9 a real worker process at random moments,
 * hundreds of times, and check after every kill that the store opens,
 * that every batch the worker saw synced is there with its exact
 * responses, and that nothing it never synced shows as DONE.
 *
 * IDEM_CRASH_KILLS sets the number of kills (default 200). */
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

enum { BATCH = 50 };

static pid_t spawn_child(const char *dir, int *rfd)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        char prog[4200], batch[16];
        snprintf(prog, sizeof prog, "%s/crashchild", getenv("IDEM_PROGS"));
        snprintf(batch, sizeof batch, "%d", BATCH);
        execl(prog, prog, dir, batch, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    *rfd = p[0];
    return pid;
}

/* Block until the child reports its first synced batch (or dies). */
static long first_report(int fd)
{
    char line[32];
    size_t n = 0;
    while (n < sizeof line - 1 && read(fd, &line[n], 1) == 1) {
        if (line[n] == '\n') {
            line[n] = '\0';
            return strtol(line, NULL, 10);
        }
        n++;
    }
    return -1;
}

/* The highest batch number the child printed, or -1. */
static long read_reports(int fd)
{
    long last = -1;
    char buf[65536], line[32];
    size_t ll = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] == '\n') {
                line[ll] = '\0';
                last = strtol(line, NULL, 10);
                ll = 0;
            } else if (ll < sizeof line - 1) {
                line[ll++] = buf[i];
            }
        }
    }
    return last;
}

static void expect_batch(idem_store *s, unsigned long b, int done)
{
    for (int i = 0; i < BATCH; i++) {
        char key[40], resp[48];
        snprintf(key, sizeof key, "b%lu-%d", b, i);
        snprintf(resp, sizeof resp, "resp-b%lu-%d", b, i);
        idem_record r;
        int rc = idem_get(s, key, strlen(key), &r);
        if (!done) {
            cr_assert(rc == IDEM_ENOTFOUND || r.state == IDEM_STATE_PENDING,
                      "unsynced %s shows as %d", key, r.state);
            continue;
        }
        cr_assert_eq(rc, 0, "synced %s missing", key);
        cr_assert_eq(r.state, IDEM_STATE_DONE, "%s", key);
        cr_assert(r.len == strlen(resp) && !memcmp(r.data, resp, r.len),
                  "%s: wrong response", key);
    }
}

static unsigned long checkpoint(idem_store *s)
{
    const void *b;
    size_t n;
    char buf[32] = "0";
    if (idem_checkpoint_get(s, "next", &b, &n) == 0 && n < sizeof buf) {
        memcpy(buf, b, n);
        buf[n] = '\0';
    }
    return strtoul(buf, NULL, 10);
}

/* Kill a child writing the store at dir + query ("?hot=0": every sealed
 * segment goes cold) at random moments; check what it reported synced. */
static void kill9_run(const char *query)
{
    char *tmp = t_tmpdir();
    char dir[4300];
    snprintf(dir, sizeof dir, "%s%s", tmp, query);
    const char *env = getenv("IDEM_CRASH_KILLS");
    long kills = env ? strtol(env, NULL, 10) : 200;
    unsigned seed = (unsigned)time(NULL);
    srand(seed);
    long reported = -1;
    unsigned long verified = 0;  /* batches < this were checked */
    for (long k = 0; k < kills; k++) {
        int fd;
        pid_t pid = spawn_child(dir, &fd);
        /* Half the kills land anywhere, start-up and recovery included;
         * the other half once the child is working, so that it always
         * makes progress however slow this machine (or ASan) is. */
        long early = k % 2 ? first_report(fd) : -1;
        struct timespec ts = {0, (long)(rand() % 25000) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        long last = read_reports(fd);
        if (early > last)
            last = early;
        close(fd);
        int st;
        waitpid(pid, &st, 0);
        cr_assert(WIFSIGNALED(st) || WEXITSTATUS(st) == 0,
                  "child failed on its own (seed %u, kill %ld)", seed, k);
        if (last > reported)
            reported = last;
        idem_store *s = t_open(t_local_uri(dir));
        unsigned long next = checkpoint(s);
        cr_assert_geq((long)next, reported + 1,
                      "batch %ld was synced but the store resumes at %lu "
                      "(seed %u, kill %ld)", reported, next, seed, k);
        for (unsigned long b = verified; b < next; b++)
            expect_batch(s, b, 1);
        expect_batch(s, next, 0);
        for (int i = 0; i < 5 && next; i++)
            expect_batch(s, (unsigned long)rand() % next, 1);
        verified = next;
        cr_assert_eq(idem_close(s), 0);
    }
    cr_assert_gt(reported, 10, "the child made too little progress");
    cr_log_info("%ld kills, %ld batches of %d synced", kills, reported + 1,
                BATCH);
    t_rmdir(tmp);
    free(tmp);
}

Test(crash, kill9_at_random_moments, .timeout = 900)
{
    kill9_run("");
}

Test(crash, kill9_cold, .timeout = 900)
{
    kill9_run("?hot=0&segment=64k");
}

/* A budget the writer is not behind on: keys leave RAM every few
 * batches through a job on a thread of its own (coldjob.h), so kills
 * land while it builds and writes an index, and before its result is
 * taken. */
Test(crash, kill9_while_indexes_are_built, .timeout = 900)
{
    kill9_run("?hot=64k&segment=16k");
}
