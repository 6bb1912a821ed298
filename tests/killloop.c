/* tests/killloop.c - kill -9 and power cuts of `idem` runs (see
 * killloop.h): one loop for every stream suite, so that what makes a
 * kill land where read-back matters is written once. */
#include "killloop.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

long t_kills(long dflt)
{
    const char *e = getenv("IDEM_CLI_KILLS");
    return e ? strtol(e, NULL, 10) : dflt;
}

static void sleep_random(double span)
{
    long us = (long)((double)rand() / RAND_MAX * span * 1e6);
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* One run of the loop, the try-th; 1 when a kill landed on it, 0 when it
 * ended by itself (exit 0, asserted). */
/* The first kills to land kill themselves (unless the plan has only
 * random ones): a random kill that comes after the run would have ended
 * lets it do the whole input, and no kill lands after that one, while
 * the suites want at least this many to have landed. */
enum { FIRST_SELF_KILLS = 3 };

static int kill_one(const t_kill_plan *p, int try, long landed)
{
    int at_random = try % p->every == p->every - 1 &&
                    (p->every == 1 || landed >= FIRST_SELF_KILLS);
    if (!at_random) {
        char at[64];
        snprintf(at, sizeof at, "sink-written:%d", 1 + rand() % p->at_max);
        setenv("IDEM_TEST_KILL_AT", at, 1);
    }
    pid_t pid = t_cli_start(t_dir, "%s 2>>err", p->args);
    unsetenv("IDEM_TEST_KILL_AT");
    int hit = 0;
    if (at_random || !p->self_only) {
        sleep_random(p->span);
        hit = kill(pid, SIGKILL) == 0;
    }
    int st = t_wait(pid);
    if (p->power_cut)
        t_power_cut();
    if (st == 128 + SIGKILL && (hit || !at_random))
        return 1;
    cr_assert_eq(st, 0, "a resumed run failed on its own: %s",
                 t_read(t_at("err"), NULL));
    return 0;
}

long t_kill_loop(const t_kill_plan *p)
{
    long landed = 0, want = p->nkills;
    t_synclog_preload(p->power_cut);
    for (int try = 0; landed < want && try < p->tries * want; try++) {
        int killed = kill_one(p, try, landed);
        landed += killed;
        if (!killed && p->done_ends)
            break;
    }
    t_synclog_preload(0);
    return landed;
}

void t_synclog_preload(int on)
{
    /* Under ASan (make asan) idem's runtime must come first among its
     * libraries, and a preload comes before it: the shim only wraps
     * fdatasync and fsync, so the check is turned off, not the shim. */
    static char asan0[1024];
    static int saved;
    char shim[4200], asan[1200];
    if (!saved++)
        snprintf(asan0, sizeof asan0, "%s", getenv("ASAN_OPTIONS") ?
                 getenv("ASAN_OPTIONS") : "");
    snprintf(shim, sizeof shim, "%s/synclog.so", getenv("IDEM_PROGS"));
    snprintf(asan, sizeof asan, "%s%sverify_asan_link_order=0", asan0,
             *asan0 ? ":" : "");
    if (on) {
        setenv("LD_PRELOAD", shim, 1);
        setenv("ASAN_OPTIONS", asan, 1);
        setenv("IDEM_TEST_SYNCED", t_at("synced"), 1);
    } else {
        unsetenv("LD_PRELOAD");
        if (*asan0)
            setenv("ASAN_OPTIONS", asan0, 1);
        else
            unsetenv("ASAN_OPTIONS");
        unsetenv("IDEM_TEST_SYNCED");
    }
}

/* Only a file's last note counts: cutting it to an earlier one first
 * would lose what a later sync made durable. */
enum { MAX_NOTES = 4096 };
static struct note {
    long long size;
    unsigned long long ino;
    char path[512];
} notes[MAX_NOTES];

void t_power_cut(void)
{
    FILE *f = fopen(t_at("synced"), "r");
    if (!f)
        return;
    size_t n = 0;
    while (n < MAX_NOTES && fscanf(f, "%lld %llu %511[^\n]\n", &notes[n].size,
                                   &notes[n].ino, notes[n].path) == 3)
        n++;
    cr_assert(feof(f), "more than %d syncs in a run", MAX_NOTES);
    fclose(f);
    unlink(t_at("synced"));
    for (size_t i = 0; i < n; i++) {
        int last = 1;
        for (size_t j = i + 1; j < n && last; j++)
            last = strcmp(notes[i].path, notes[j].path) != 0;
        struct stat st;
        if (last && stat(notes[i].path, &st) == 0 &&
            st.st_ino == notes[i].ino)
            cr_assert_eq(truncate(notes[i].path, (off_t)notes[i].size), 0,
                         "%s", notes[i].path);
    }
}

int t_cli_cut_at(const char *kill_at, const char *args)
{
    t_synclog_preload(1);
    if (kill_at)
        setenv("IDEM_TEST_KILL_AT", kill_at, 1);
    int st = t_cli(t_dir, "%s 2>>err", args);
    unsetenv("IDEM_TEST_KILL_AT");
    t_synclog_preload(0);
    t_power_cut();
    return st;
}
