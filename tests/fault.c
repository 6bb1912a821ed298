/* tests/fault.c - failing the Nth allocation, write, sync or unlink on
 * purpose.
 *
 * The test binary is linked with --wrap for these functions, so every call
 * that libidem.a makes comes through here. Disarmed (-1) they pass
 * through. This is how the tests show that ENOMEM, ENOSPC and EIO are
 * returned as errors without crashes, leaks or lost data.
 *
 * A test may also stop the library at a chosen unlink or mmap, to run
 * another handle there (t_unlink_hook, t_mmap_hook): how a race between
 * two of them is made to happen at one point, every time. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include "common.h"

long t_fail_alloc_after = -1;
long t_fail_write_after = -1;
long t_fail_sync_after = -1;
long t_fail_mmap_after = -1;
long t_fail_unlink_after = -1;
int t_fail_errno = EIO;
void (*t_unlink_hook)(const char *name);
void (*t_mmap_hook)(int fd);

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
ssize_t __real_write(int fd, const void *p, size_t n);
ssize_t __real_pwrite(int fd, const void *p, size_t n, off_t off);
int __real_fdatasync(int fd);
int __real_ftruncate(int fd, off_t len);
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd,
                  off_t off);
int __real_unlinkat(int dirfd, const char *name, int flags);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);
ssize_t __wrap_write(int fd, const void *p, size_t n);
ssize_t __wrap_pwrite(int fd, const void *p, size_t n, off_t off);
int __wrap_fdatasync(int fd);
int __wrap_ftruncate(int fd, off_t len);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd,
                  off_t off);
int __wrap_unlinkat(int dirfd, const char *name, int flags);

/* Count down; true when this call must fail. */
static int t_trip(long *counter)
{
    if (*counter < 0)
        return 0;
    if (*counter == 0) {
        *counter = -1;
        return 1;
    }
    (*counter)--;
    return 0;
}

void *__wrap_malloc(size_t n)
{
    return t_trip(&t_fail_alloc_after) ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    return t_trip(&t_fail_alloc_after) ? NULL : __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
    return t_trip(&t_fail_alloc_after) ? NULL : __real_realloc(p, n);
}

void *__wrap_aligned_alloc(size_t a, size_t n)
{
    return t_trip(&t_fail_alloc_after) ? NULL : __real_aligned_alloc(a, n);
}

ssize_t __wrap_write(int fd, const void *p, size_t n)
{
    if (t_trip(&t_fail_write_after)) {
        errno = t_fail_errno;
        return -1;
    }
    return __real_write(fd, p, n);
}

ssize_t __wrap_pwrite(int fd, const void *p, size_t n, off_t off)
{
    if (t_trip(&t_fail_write_after)) {
        errno = t_fail_errno;
        return -1;
    }
    return __real_pwrite(fd, p, n, off);
}

int __wrap_fdatasync(int fd)
{
    if (t_trip(&t_fail_sync_after)) {
        errno = t_fail_errno;
        return -1;
    }
    return __real_fdatasync(fd);
}

int __wrap_ftruncate(int fd, off_t len)
{
    return __real_ftruncate(fd, len);
}

void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd,
                  off_t off)
{
    if (t_mmap_hook)
        t_mmap_hook(fd);
    if (t_trip(&t_fail_mmap_after)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return __real_mmap(addr, len, prot, flags, fd, off);
}

int __wrap_unlinkat(int dirfd, const char *name, int flags)
{
    if (t_unlink_hook)
        t_unlink_hook(name);
    if (t_trip(&t_fail_unlink_after)) {
        errno = t_fail_errno;
        return -1;
    }
    return __real_unlinkat(dirfd, name, flags);
}
