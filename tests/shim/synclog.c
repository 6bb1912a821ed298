/* tests/shim/synclog.c - what a power cut would leave of a local store.
 *
 * A kill -9 loses nothing the process wrote: the page cache keeps it,
 * so a crash test built on kills alone cannot tell a commit that was
 * synced from one that was only written. Preloaded into idem
 * (LD_PRELOAD), this notes in $IDEM_TEST_SYNCED, for every fdatasync
 * or fsync that returned 0, the file's size when the call began, its
 * inode and its name: all of that is on the disk. A test then cuts each file back to its last such
 * size (the worst a power cut may do) before the next run, unless
 * another file was renamed over the name since (a rewrite). The size is
 * taken before the call, as a write racing it would not be covered.
 *
 * With IDEM_TEST_SYNC_DELAY_MS=N each call first sleeps N ms, as a slow
 * disk would: a sync that idem runs beside other work (a local store's
 * idem_sync_start) is then still in flight when a kill point a little
 * later is reached, so that a test can cut the power at that moment
 * rather than hope for it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Exported whatever -fvisibility says: it is what the preload is for. */
__attribute__((visibility("default"))) int fdatasync(int fd);
__attribute__((visibility("default"))) int fsync(int fd);

static void note_synced(int fd, const struct stat *st)
{
    const char *log = getenv("IDEM_TEST_SYNCED");
    char link[64], path[4096], line[4200];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = log ? readlink(link, path, sizeof path - 1) : -1;
    if (n <= 0)
        return;
    path[n] = '\0';
    int len = snprintf(line, sizeof line, "%lld %llu %s\n",
                       (long long)st->st_size,
                       (unsigned long long)st->st_ino, path);
    int lf = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (lf < 0)
        return;
    if (len > 0 && (size_t)len < sizeof line)
        (void)!write(lf, line, (size_t)len);  /* one line: O_APPEND */
    close(lf);
}

/* real: the libc function of that name. */
static int synced(int fd, int (*real)(int))
{
    struct stat st;
    int sized = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    const char *delay = getenv("IDEM_TEST_SYNC_DELAY_MS");
    long ms = delay ? strtol(delay, NULL, 10) : 0;
    struct timespec ts = {ms / 1000, ms % 1000 * 1000000};
    if (ms > 0)
        nanosleep(&ts, NULL);
    int rc = real(fd);
    if (rc == 0 && sized)
        note_synced(fd, &st);
    return rc;
}

__attribute__((visibility("default"))) int fdatasync(int fd)
{
    static int (*real)(int);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "fdatasync");
    return synced(fd, real);
}

__attribute__((visibility("default"))) int fsync(int fd)
{
    static int (*real)(int);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "fsync");
    return synced(fd, real);
}
