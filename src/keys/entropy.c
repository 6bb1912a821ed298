/* entropy.c - random bytes for keys, cheaply and safely across fork().
 *
 * A uuid4 is 16 random bytes. Asking the kernel for 16 bytes costs a
 * system call, about a microsecond; asking for 4 KiB costs a few and
 * serves 256 UUIDs, so keys come out at memcpy speed. The bytes come from
 * getrandom(2), the kernel's CSPRNG: no user-space generator here to seed,
 * reseed or get wrong.
 *
 * Buffering creates one hazard: fork() copies the buffer, and parent and
 * child would then hand out the same "random" bytes, i.e. the same keys.
 * So every buffer records the fork generation it was filled in; a
 * pthread_atfork() child handler bumps the generation, and the child's
 * first draw sees the mismatch and refills from the kernel. Should
 * registering the handler fail, each draw compares getpid() instead:
 * slower, equally safe.
 *
 * The buffer is per thread, so drawing takes no lock. */
#include "entropy.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

#define IDEM__ENTROPY_BUF 4096

struct idem__pool {
    unsigned char buf[IDEM__ENTROPY_BUF];
    size_t pos;   /* bytes of buf already handed out */
    unsigned gen; /* fork generation buf was filled in; 0: never */
    pid_t pid;    /* the filler's pid, for the getpid() fallback */
};

static _Thread_local struct idem__pool idem__pool;
static atomic_uint idem__fork_gen = 1;
static pthread_once_t idem__once = PTHREAD_ONCE_INIT;
static atomic_int idem__use_pid;

static void idem__after_fork_child(void)
{
    atomic_fetch_add_explicit(&idem__fork_gen, 1, memory_order_relaxed);
}

static void idem__register(void)
{
    if (pthread_atfork(NULL, NULL, idem__after_fork_child) != 0)
        atomic_store(&idem__use_pid, 1);
}

static int idem__refill(struct idem__pool *p, unsigned gen)
{
    int rc = idem__random_bytes(p->buf, sizeof p->buf);
    if (rc)
        return rc;
    p->pos = 0;
    p->gen = gen;
    if (atomic_load_explicit(&idem__use_pid, memory_order_relaxed))
        p->pid = getpid();
    return 0;
}

int idem__entropy(void *out, size_t n)
{
    struct idem__pool *p = &idem__pool;
    unsigned gen = atomic_load_explicit(&idem__fork_gen, memory_order_relaxed);
    if (p->gen != gen || sizeof p->buf - p->pos < n ||
        (atomic_load_explicit(&idem__use_pid, memory_order_relaxed) &&
         p->pid != getpid())) {
        if (p->gen == 0)
            pthread_once(&idem__once, idem__register);
        int rc = idem__refill(p, gen);
        if (rc)
            return rc;
    }
    memcpy(out, p->buf + p->pos, n);
    p->pos += n;
    return 0;
}
