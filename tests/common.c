/* tests/common.c - shared test helpers. */
#include "common.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int64_t t_clock_ms = 1700000000000LL;

static int64_t t_clock(void *ctx)
{
    (void)ctx;
    return t_clock_ms;
}

idem_opts t_options(void)
{
    idem_opts o;
    idem_opts_init(&o);
    o.clock = t_clock;
    return o;
}

char *t_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/idem-test-XXXXXX", base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    cr_assert(d, "mkdtemp: %s", strerror(errno));
    char *copy = malloc(strlen(d) + 1);
    cr_assert(copy);
    memcpy(copy, d, strlen(d) + 1);
    return copy;
}

void t_rmdir(const char *dir)
{
    t_sh("rm -rf '%s'", dir);
}

char *t_dir;

void t_dir_init(void)
{
    t_dir = t_tmpdir();
}

void t_dir_fini(void)
{
    t_rmdir(t_dir);
    free(t_dir);
    t_dir = NULL;
}

const char *t_at(const char *name)
{
    return t_path(t_dir, name);
}

void t_put(const char *name, const char *text)
{
    t_write(t_at(name), text, strlen(text));
}

void t_expect(const char *name, const char *text)
{
    t_expect_file(t_at(name), text);
}

const char *t_local_uri(const char *dir)
{
    static char buf[4200];
    snprintf(buf, sizeof buf, "local:%s", dir);
    return buf;
}

idem_store *t_open(const char *uri)
{
    idem_opts o = t_options();
    idem_store *s;
    int rc = idem_open(uri, &o, &s);
    cr_assert_eq(rc, 0, "open %s: %s: %s", uri, idem_strerror(rc),
                 idem_errdetail(s));
    return s;
}

int64_t t_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void t_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000L};
    nanosleep(&ts, NULL);
}

int t_sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return st == -1 ? -1 : WEXITSTATUS(st);
}

char *t_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0, r;
    char *b = malloc(cap + 1);
    cr_assert(b);
    while ((r = fread(b + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            cap *= 2;
            b = realloc(b, cap + 1);
            cr_assert(b);
        }
    }
    fclose(f);
    b[n] = '\0';
    if (len)
        *len = n;
    return b;
}

void t_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "create %s: %s", path, strerror(errno));
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

int t_cli(const char *dir, const char *fmt, ...)
{
    char args[6000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    return t_sh("cd '%s' && IDEM_STORE=local:store \"$IDEM_CLI\" %s", dir,
                args);
}

pid_t t_cli_start(const char *dir, const char *fmt, ...)
{
    char args[6000], cmd[7000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "cd '%s' && IDEM_STORE=local:store exec "
             "\"$IDEM_CLI\" %s", dir, args);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

int t_wait(pid_t pid)
{
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int t_grep(const char *path, const char *text)
{
    char *b = t_read(path, NULL);
    int found = strstr(b, text) != NULL;
    free(b);
    return found;
}

char *t_dir_with(const char *name, const char *text)
{
    char *dir = t_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    t_write(path, text, strlen(text));
    return dir;
}

const char *t_path(const char *dir, const char *name)
{
    static char buf[8][4200];
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

void t_expect_file(const char *path, const char *text)
{
    size_t n;
    char *got = t_read(path, &n);
    cr_assert(n == strlen(text) && !memcmp(got, text, n),
              "%s is\n%s\nwanted\n%s", path, got, text);
    free(got);
}

/* The argv of process pid (a /proc entry's name), its arguments joined
 * by spaces; "" when it is gone or a zombie. */
static void argv_of(const char *pid, char *buf, size_t n)
{
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/cmdline", pid);
    FILE *f = fopen(path, "rb");
    size_t len = f ? fread(buf, 1, n - 1, f) : 0;
    if (f)
        fclose(f);
    for (size_t k = 0; k < len; k++)
        buf[k] = buf[k] ? buf[k] : ' ';
    buf[len] = '\0';
}

int t_processes_with(const char *text)
{
    DIR *d = opendir("/proc");
    cr_assert(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char argv[8192];
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        argv_of(e->d_name, argv, sizeof argv);
        n += strstr(argv, text) != NULL;
    }
    closedir(d);
    return n;
}

int t_no_process_with(const char *text)
{
    for (int waited = 0; t_processes_with(text) && waited < 10000;
         waited += 10)
        t_sleep_ms(10);
    return !t_processes_with(text);
}

/* A power cut after a run: every file of the store the run synced goes
 * back to its size at its last fdatasync that returned (the shim's
 * notes, tests/shim/synclog.c); what was only written is lost. Only a
 * file's last note counts: cutting it to an earlier one first would
 * lose what a later sync made durable. */
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

/* The runs started from now on have the shim preloaded (on), or not. */
void t_synclog(int on)
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

/* A run of args in t_dir (stderr appended to err) with the shim
 * preloaded, killed at kill_at (NULL: not), then a power cut. Its exit
 * status. */
int t_cli_cut_at(const char *kill_at, const char *args)
{
    t_synclog(1);
    if (kill_at)
        setenv("IDEM_TEST_KILL_AT", kill_at, 1);
    int st = t_cli(t_dir, "%s 2>>err", args);
    unsetenv("IDEM_TEST_KILL_AT");
    t_synclog(0);
    t_power_cut();
    return st;
}
