/* fault.c - pass-through stand-ins for the wrapped calls (temporary).
 *
 * The test binary is linked with --wrap for malloc, calloc, realloc,
 * write, pwrite, fdatasync and ftruncate, so that storage tests can fail
 * the Nth call. Until the fault-injection version lands, these forward
 * every call unchanged. */
#include <stddef.h>
#include <sys/types.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
ssize_t __real_write(int fd, const void *buf, size_t n);
ssize_t __real_pwrite(int fd, const void *buf, size_t n, off_t off);
int __real_fdatasync(int fd);
int __real_ftruncate(int fd, off_t len);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
ssize_t __wrap_write(int fd, const void *buf, size_t n);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off);
int __wrap_fdatasync(int fd);
int __wrap_ftruncate(int fd, off_t len);

void *__wrap_malloc(size_t n)
{
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    return __real_realloc(p, n);
}

ssize_t __wrap_write(int fd, const void *buf, size_t n)
{
    return __real_write(fd, buf, n);
}

ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    return __real_pwrite(fd, buf, n, off);
}

int __wrap_fdatasync(int fd)
{
    return __real_fdatasync(fd);
}

int __wrap_ftruncate(int fd, off_t len)
{
    return __real_ftruncate(fd, len);
}
