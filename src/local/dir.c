/* dir.c - opening, locking and listing a store directory.
 *
 * One process holds a local store at a time: two writers appending to one
 * log would interleave frames. flock() is released by the kernel when the
 * holder dies, even by kill -9, so a crash never leaves a stale lock; the
 * pid inside the file is only there to name the holder in the error.
 *
 * The identity file is written once, to a temporary name, synced and
 * renamed, so it is either whole or absent.
 *
 * The tail file says where the log had durably got to when it was last
 * written: at every new segment, every dropped segment and every clean
 * close, never per commit (that would be a second fsync per commit). What
 * it names must be there: recovery cuts a torn tail only past it, so that
 * damage or loss a crash cannot explain (a deleted or truncated newest
 * segment, garbage in a group that a clean close had sealed) is refused
 * rather than silently dropped. It is replaced the same way as the
 * identity file, so a crash leaves the old one or the new one. A store
 * without one was written before idem kept it, or has never been closed
 * or rotated since: it is read by the rules of the commits alone.
 *
 * A store holds cached responses (payment results, addresses) and the
 * secret that keeps index-hash collisions out of an attacker's reach, so
 * it is private: the directory is created 0700 and every file 0600,
 * whatever the umask. A store created with mode=group (0750) lets its
 * group read it: every file idem creates follows its directory, 0640
 * when the group may enter it. Modes are set with fchmod() after
 * creation, since the umask may take bits the store's mode wants. */
#include "dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#define IDEM__META "IDEM"
#define IDEM__META_LEN (16 + IDEM__SECRET_LEN + 8)

static const unsigned char idem__meta_magic[8] = "IDEMSTO";
static const unsigned char idem__tail_magic[8] = "IDEMEND";

static int idem__errno_code(int err)
{
    return err == ENOSPC || err == EDQUOT ? IDEM_ENOSPC : IDEM_EIO;
}

int idem__dir_create(int dirfd, const char *name, int flags)
{
    struct stat st;
    mode_t mode = fstat(dirfd, &st) == 0 && (st.st_mode & S_IXGRP) ? 0640
                                                                 : 0600;
    int fd = openat(dirfd, name, flags | O_CREAT | O_CLOEXEC, mode);
    /* A file that another user owns (a group store) keeps its mode. */
    if (fd >= 0 && fchmod(fd, mode) != 0 && errno != EPERM) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

static int idem__lock(idem_store *s, int dirfd, const char *path,
                      int repair, int *lockfd)
{
    int fd = idem__dir_create(dirfd, "LOCK", O_RDWR);
    if (fd < 0)
        return idem__fail(s, idem__errno_code(errno), "%s/LOCK: %s", path,
                          strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t r = pread(fd, pid, sizeof pid - 1, 0);
        pid[r > 0 ? r : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        close(fd);
        char *by = strstr(pid, " repair");
        if (by) {
            *by = '\0';
            return idem__fail(s, IDEM_ELOCKED,
                              "%s: being repaired (`idem repair`, pid %s); "
                              "open it once the repair is over", path, pid);
        }
        /* flock() locks are per open file: a second handle of this very
         * process is refused too, and its own pid would read as "another
         * process". */
        if (*pid && strtol(pid, NULL, 10) == (long)getpid())
            return idem__fail(s, IDEM_ELOCKED,
                              "%s: in use by another handle of this process "
                              "(pid %s); close it before opening the store "
                              "again", path, pid);
        return idem__fail(s, IDEM_ELOCKED,
                          "%s: in use by another process (pid %s); "
                          "one process may hold a local store at a time",
                          path, *pid ? pid : "unknown");
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld%s\n", (long)getpid(),
                     repair ? " repair" : "");
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
        int err = errno;
        close(fd);
        return idem__fail(s, idem__errno_code(err), "%s/LOCK: %s", path,
                          strerror(err));
    }
    *lockfd = fd;
    return 0;
}

/* One line of /proc/locks: "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0
 * EOF" (device numbers in hex); one that waits for a lock has "->"
 * after its number and holds nothing. Does it hold file ino of dev (a
 * lock of any kind: only idem locks PATH/LOCK)? */
static int idem__lock_line_holds(const char *line, const struct stat *st)
{
    char kind[16];
    unsigned maj, min;
    unsigned long ino;
    long pid;
    return sscanf(line, "%*d: %15s %*s %*s %ld %x:%x:%lu", kind, &pid, &maj,
                  &min, &ino) == 5 &&
           strcmp(kind, "->") != 0 && maj == major(st->st_dev) &&
           min == minor(st->st_dev) && ino == (unsigned long)st->st_ino;
}

/* Does PATH/LOCK, whose file is st, say a repair took it? */
static int idem__lock_says_repair(int dirfd, struct stat *st)
{
    char text[64];
    int fd = openat(dirfd, "LOCK", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t r = fstat(fd, st) == 0 ? pread(fd, text, sizeof text - 1, 0) : -1;
    close(fd);
    text[r > 0 ? r : 0] = '\0';
    return strstr(text, " repair\n") != NULL;
}

int idem__dir_repairing(int dirfd)
{
    struct stat st;
    if (!idem__lock_says_repair(dirfd, &st))
        return 0;
    FILE *f = fopen("/proc/locks", "re");
    if (!f)
        return 0;
    char line[256];
    int held = 0;
    while (!held && fgets(line, sizeof line, f))
        held = idem__lock_line_holds(line, &st);
    fclose(f);
    return held;
}

/* A size parameter's value: digits, then k, M or G (powers of 1024).
 * 0, or -1 when it is not one. */
static int idem__size_param(const char *p, size_t len, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = 0;
    for (; i < len && p[i] >= '0' && p[i] <= '9'; i++) {
        if (v > (UINT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (uint64_t)(p[i] - '0');
    }
    unsigned shift = 0;
    if (i + 1 == len)
        shift = p[i] == 'k' ? 10 : p[i] == 'M' ? 20 : p[i] == 'G' ? 30 : 99;
    if (!i || shift == 99 || i + (shift != 0) != len ||
        (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = v << shift;
    return 0;
}

/* hot=SIZE or segment=SIZE into *k; 1 if p[0, len) is neither. */
static int idem__knob(idem_store *s, const char *rest, const char *p,
                      size_t len, idem__dir_knobs *k)
{
    uint64_t *dst = len > 4 && !memcmp(p, "hot=", 4) ? &k->hot
                    : len > 8 && !memcmp(p, "segment=", 8) ? &k->segment
                                                           : NULL;
    if (!dst)
        return 1;
    size_t name = (size_t)(strchr(p, '=') - p) + 1;
    int bad = idem__size_param(p + name, len - name, dst);
    /* Offsets in a segment are 32-bit: idem_opts stops at 2 GiB too. */
    if (bad || (dst == &k->segment && (!*dst || *dst > (1ull << 31))))
        return idem__fail(s, IDEM_EINVAL, "local:%s: '%.*s' is not a size "
                          "(digits, then k, M or G; segment= 1 to 2G)",
                          rest, (int)len, p);
    if (dst == &k->hot)
        k->hot_set = 1;
    return 0;
}

int idem__dir_uri(idem_store *s, const char *rest, char **path,
                  unsigned *how, idem__dir_knobs *knobs)
{
    size_t n = strcspn(rest, "?");
    idem__dir_knobs unused;
    idem__dir_knobs *k = knobs ? knobs : &unused;
    memset(k, 0, sizeof *k);
    *path = NULL;
    for (const char *p = rest + n; *p;) {
        p++;
        size_t len = strcspn(p, "&");
        int rc = len ? idem__knob(s, rest, p, len, k) : 0;
        if (rc <= 0) {  /* an empty one, a size, or its error */
            if (rc)
                return rc;
        } else if (len == 10 && !memcmp(p, "mode=group", 10))
            *how |= IDEM__DIR_GROUP;
        else if (len == 12 && !memcmp(p, "mode=private", 12))
            *how &= ~IDEM__DIR_GROUP;
        else
            return idem__fail(s, IDEM_EINVAL, "local:%s: unknown parameter "
                              "'%.*s' (known: mode=private, mode=group, "
                              "hot=SIZE, segment=SIZE)",
                              rest, (int)len, p);
        p += len;
    }
    if (!(*path = malloc(n + 1)))
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    memcpy(*path, rest, n);
    (*path)[n] = '\0';
    return 0;
}

int idem__dir_open(idem_store *s, const char *path, unsigned how,
                   int *dirfd, int *lockfd)
{
    mode_t mode = how & IDEM__DIR_GROUP ? 0750 : 0700;
    *lockfd = -1;
    if (!*path)
        return idem__fail(s, IDEM_EINVAL,
                          "local: needs a directory, e.g. local:./idem-data");
    int made = !(how & IDEM__DIR_NOCREATE) && mkdir(path, mode) == 0;
    if (!made && !(how & IDEM__DIR_NOCREATE) && errno != EEXIST)
        return idem__fail(s, errno == ENOENT ? IDEM_EINVAL
                                             : idem__errno_code(errno),
                          "%s: cannot create the store directory: %s", path,
                          strerror(errno));
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return idem__fail(s, errno == ENOENT ? IDEM_ENOTFOUND : IDEM_EIO,
                          "%s: %s", path, strerror(errno));
    int repair = (how & IDEM__DIR_REPAIR) != 0;
    int rc = made && fchmod(fd, mode) != 0
                 ? idem__fail(s, IDEM_EIO, "%s: chmod: %s", path,
                              strerror(errno))
             : how & IDEM__DIR_NOLOCK ? 0
                                      : idem__lock(s, fd, path, repair,
                                                   lockfd);
    if (rc) {
        close(fd);
        return rc;
    }
    *dirfd = fd;
    return 0;
}

void idem__dir_warn_open(idem_store *s, int dirfd, const char *path)
{
    struct stat dir, st;
    int fd = dup(dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d || fstat(dirfd, &dir) != 0 || !(dir.st_mode & S_IXOTH)) {
        if (d)
            closedir(d);
        else if (fd >= 0)
            close(fd);
        return;  /* others cannot reach the files (or we cannot tell) */
    }
    rewinddir(d);
    struct dirent *de;
    while ((de = readdir(d)))
        if (fstatat(dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(st.st_mode) && (st.st_mode & S_IROTH)) {
            snprintf(s->warning, sizeof s->warning,
                     "%.180s: other users can read this store (%.40s is "
                     "mode %04o, the directory %04o); chmod o-rwx %.180s",
                     path, de->d_name, (unsigned)(st.st_mode & 07777),
                     (unsigned)(dir.st_mode & 07777), path);
            break;
        }
    closedir(d);
}

static int idem__meta_parse(idem_store *s, const char *path,
                            const unsigned char *m, ssize_t n,
                            unsigned char *secret)
{
    uint32_t version;
    uint64_t check;
    memcpy(&check, m + IDEM__META_LEN - 8, 8);
    if (n != IDEM__META_LEN || memcmp(m, idem__meta_magic, 8) != 0 ||
        check != XXH3_64bits(m, IDEM__META_LEN - 8))
        return idem__fail(s, IDEM_ECORRUPT,
                          "%s/IDEM: not an idem store identity file", path);
    memcpy(&version, m + 8, 4);
    if (version != 1)
        return idem__fail(s, IDEM_EVERSION,
                          "%s: store format %u is newer than this idem (1)",
                          path, version);
    memcpy(secret, m + 16, IDEM__SECRET_LEN);
    return 0;
}

/* Write the n pieces whole: 0, or -1 with errno (ENOSPC for a write
 * that took nothing). */
static int idem__write_all(int fd, const struct iovec *iov, int n)
{
    for (int i = 0; i < n; i++) {
        const unsigned char *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left) {
            ssize_t w = write(fd, p, left);
            if (w <= 0) {
                errno = w == 0 ? ENOSPC : errno;
                return -1;
            }
            p += w;
            left -= (size_t)w;
        }
    }
    return 0;
}

/* Replace name whole or not at all: write a temporary, fsync it, rename
 * it over name, fsync the directory. A crash leaves the old file or the
 * new one, never a mix. */
int idem__dir_put(int dirfd, const char *name, const struct iovec *iov,
                  int n)
{
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%s.tmp", name);
    int fd = idem__dir_create(dirfd, tmp, O_WRONLY | O_TRUNC);
    if (fd < 0)
        return errno;
    int ok = idem__write_all(fd, iov, n) == 0 && fsync(fd) == 0;
    int err = errno;
    close(fd);
    if (ok && renameat(dirfd, tmp, dirfd, name) != 0)
        ok = 0, err = errno;
    else if (ok && fsync(dirfd) != 0)
        return errno;
    /* A temporary left behind would hold the room a full disk needs
     * back, for as long as nothing writes name again. */
    if (!ok)
        (void)unlinkat(dirfd, tmp, 0);
    return ok ? 0 : err;
}

int idem__dir_put_failed(idem_store *s, const char *path, const char *name,
                         int err)
{
    return idem__fail(s, idem__errno_code(err), "%s/%s: cannot write: %s",
                      path, name, strerror(err));
}

int idem__dir_replace_v(idem_store *s, int dirfd, const char *path,
                        const char *name, const struct iovec *iov, int n)
{
    int err = idem__dir_put(dirfd, name, iov, n);
    return err ? idem__dir_put_failed(s, path, name, err) : 0;
}

int idem__dir_replace(idem_store *s, int dirfd, const char *path,
                      const char *name, const void *data, size_t len)
{
    struct iovec one = {(void *)data, len};
    return idem__dir_replace_v(s, dirfd, path, name, &one, 1);
}

int idem__dir_meta_create(idem_store *s, int dirfd, const char *path,
                          unsigned char *secret)
{
    unsigned char m[IDEM__META_LEN] = {0};
    uint32_t version = 1;
    memcpy(m, idem__meta_magic, 8);
    memcpy(m + 8, &version, 4);
    if (idem__random_bytes(secret, IDEM__SECRET_LEN))
        return idem__fail(s, IDEM_EIO, "getrandom failed");
    memcpy(m + 16, secret, IDEM__SECRET_LEN);
    uint64_t check = XXH3_64bits(m, IDEM__META_LEN - 8);
    memcpy(m + IDEM__META_LEN - 8, &check, 8);
    return idem__dir_replace(s, dirfd, path, IDEM__META, m, sizeof m);
}

/* Does the directory hold a segment? A failed listing says no: the
 * caller's own error follows. */
static int idem__has_segments(idem_store *s, int dirfd, const char *path)
{
    uint32_t *ids;
    size_t n;
    if (idem__dir_segments(s, dirfd, path, &ids, &n) != 0)
        return 0;
    free(ids);
    return n > 0;
}

int idem__dir_secret(idem_store *s, int dirfd, const char *path,
                     int nocreate, unsigned char secret[IDEM__SECRET_LEN])
{
    unsigned char m[IDEM__META_LEN + 1];
    int fd = openat(dirfd, IDEM__META, O_RDONLY | O_CLOEXEC);
    /* Segments without the identity file: a store that lost a file, not
     * a new one; check, repair, stats and every open say the same. */
    if (fd < 0 && errno == ENOENT && idem__has_segments(s, dirfd, path))
        return idem__fail(s, IDEM_ECORRUPT,
                          "%s/IDEM is missing beside the store's segments; "
                          "run `idem repair --store local:%s`", path, path);
    if (fd < 0 && errno == ENOENT && nocreate)
        return idem__fail(s, IDEM_ENOTFOUND,
                          "%s: not an idem store (no IDEM file)", path);
    if (fd < 0 && errno == ENOENT)
        return idem__dir_meta_create(s, dirfd, path, secret);
    if (fd < 0)
        return idem__fail(s, IDEM_EIO, "%s/IDEM: %s", path, strerror(errno));
    ssize_t n = read(fd, m, sizeof m);
    close(fd);
    return idem__meta_parse(s, path, m, n, secret);
}

static int idem__cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Is name PREFIX + 8 digits + SUFFIX (4 characters each, as in
 * "seg-00000001.log")? Then *id is the number. */
static int idem__parse_name(const char *name, const char *prefix,
                            const char *suffix, uint32_t *id)
{
    if (strlen(name) != 16 || memcmp(name, prefix, 4) != 0 ||
        strcmp(name + 12, suffix) != 0)
        return 0;
    uint32_t v = 0;
    for (int i = 4; i < 12; i++) {
        if (name[i] < '0' || name[i] > '9')
            return 0;
        v = v * 10 + (uint32_t)(name[i] - '0');
    }
    *id = v;
    return 1;
}

int idem__dir_ids(idem_store *s, int dirfd, const char *path,
                  const char *prefix, const char *suffix, uint32_t **ids,
                  size_t *n)
{
    *ids = NULL;
    *n = 0;
    int fd = dup(dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return idem__fail(s, IDEM_EIO, "%s: %s", path, strerror(errno));
    }
    rewinddir(d);
    size_t cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint32_t id;
        if (!idem__parse_name(de->d_name, prefix, suffix, &id))
            continue;
        uint32_t *p = idem__grow(*ids, *n, &cap, sizeof *p, 16);
        if (!p) {
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
            break;
        }
        *ids = p;
        (*ids)[(*n)++] = id;
    }
    closedir(d);
    if (rc) {
        free(*ids);
        *ids = NULL;
        *n = 0;
        return rc;
    }
    if (*n)
        qsort(*ids, *n, sizeof **ids, idem__cmp_u32);
    return 0;
}

int idem__dir_segments(idem_store *s, int dirfd, const char *path,
                       uint32_t **ids, size_t *n)
{
    int rc = idem__dir_ids(s, dirfd, path, "seg-", ".log", ids, n);
    if (!rc && *n && (*ids)[0] == 0)  /* no segment is numbered 0 */
        memmove(*ids, *ids + 1, --*n * sizeof **ids);
    return rc;
}

/* PATH/TAIL: magic, version, first, last, 0, end, XXH3-64 of the rest. */
#define IDEM__TAIL_LEN 40

int idem__dir_tail_read(idem_store *s, int dirfd, const char *path,
                        idem__tail *t)
{
    unsigned char m[IDEM__TAIL_LEN + 1];
    int fd = openat(dirfd, IDEM__TAIL, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return IDEM_ENOTFOUND;
    if (fd < 0)
        return idem__fail(s, IDEM_EIO, "%s/%s: %s", path, IDEM__TAIL,
                          strerror(errno));
    ssize_t n = read(fd, m, sizeof m);
    close(fd);
    uint32_t version;
    uint64_t check;
    memcpy(&check, m + IDEM__TAIL_LEN - 8, 8);
    if (n != IDEM__TAIL_LEN || memcmp(m, idem__tail_magic, 8) != 0 ||
        check != XXH3_64bits(m, IDEM__TAIL_LEN - 8))
        return idem__fail(s, IDEM_ECORRUPT,
                          "%s/%s: damaged; run `idem repair --store "
                          "local:%s`", path, IDEM__TAIL, path);
    memcpy(&version, m + 8, 4);
    if (version != 1)
        return idem__fail(s, IDEM_EVERSION,
                          "%s/%s: format %u is newer than this idem (1)",
                          path, IDEM__TAIL, version);
    memcpy(&t->first, m + 12, 4);
    memcpy(&t->last, m + 16, 4);
    memcpy(&t->end, m + 24, 8);
    return 0;
}

int idem__dir_tail_write(idem_store *s, int dirfd, const char *path,
                         const idem__tail *t)
{
    unsigned char m[IDEM__TAIL_LEN] = {0};
    uint32_t version = 1;
    memcpy(m, idem__tail_magic, 8);
    memcpy(m + 8, &version, 4);
    memcpy(m + 12, &t->first, 4);
    memcpy(m + 16, &t->last, 4);
    memcpy(m + 24, &t->end, 8);
    uint64_t check = XXH3_64bits(m, IDEM__TAIL_LEN - 8);
    memcpy(m + IDEM__TAIL_LEN - 8, &check, 8);
    return idem__dir_replace(s, dirfd, path, IDEM__TAIL, m, sizeof m);
}
