/* snowflake.c - 63-bit time-ordered IDs that never repeat.
 *
 * A snowflake ID is (milliseconds since an epoch, node, sequence). Its
 * uniqueness rests on one promise per node: never issue the same
 * (millisecond, sequence) twice. Two things threaten that promise, and
 * this file is mostly about them.
 *
 * The clock going back. NTP steps, a VM resumed from a snapshot, an
 * operator's `date -s`: the wall clock may read a time whose IDs were
 * already issued. Issuing IDs "ahead of the clock" would keep them unique
 * but make the embedded time a lie without bound; refusing outright turns
 * every small NTP correction into an outage. So a step back up to a bound
 * is waited out, and a larger one is an error the caller sees.
 *
 * A restart with the clock behind. In memory the last issued time dies
 * with the process. A state file keeps a high-water mark: the next
 * process issues only IDs after it. Writing the exact time for every
 * millisecond would cost an fdatasync per millisecond, so the mark is
 * written ahead (reserve_ms) and only when issuing passes it; a clean
 * close writes the exact time. The file holds two checksummed slots,
 * written in turn, and its mark is the larger valid one: a write torn by
 * a crash damages one slot, and every value ever written is at or above
 * what had been issued when it was written, so the larger survivor is
 * always a safe mark. The file is flock()ed: two live processes on one
 * file (one node) would repeat each other's IDs.
 *
 * The 4,096 IDs a millisecond allows are the format's own limit; past it
 * the generator waits for the next millisecond. A mutex serialises
 * callers: the limit, not the lock, bounds the rate. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "common.h"

#define IDEM__SNOWFLAKE_OPTS_VERSION 1u
#define IDEM__MS_BITS 41
#define IDEM__MS_LIMIT (INT64_C(1) << IDEM__MS_BITS)
#define IDEM__SLOT 64
#define IDEM__SLOT_MAGIC "idem-snowflake-hw 1 "
#define IDEM__SLOT_MAGIC_LEN (sizeof IDEM__SLOT_MAGIC - 1)
#define IDEM__SLOT_BODY (IDEM__SLOT_MAGIC_LEN + 20) /* magic + digits */

struct idem_snowflake {
    pthread_mutex_t mu;
    int closed; /* new() failed: only close() is allowed */
    unsigned node;
    int64_t epoch_ms, max_wait_ms, reserve_ms;
    idem_clock_fn clock;
    void *clock_ctx;
    idem_sleep_fn sleep;
    void *sleep_ctx;
    int64_t last_ms; /* Unix ms of the last ID; -1: none yet */
    unsigned seq;    /* its sequence */
    int issued;      /* an ID was issued by this generator */
    int fd;          /* state file, or -1 */
    char *path;
    int64_t reserved; /* the mark in the file; -1: none */
    int slot;         /* the slot the next write goes to */
    char detail[256];
};

static int idem__sf_fail(idem_snowflake *g, int code, const char *fmt, ...)
    IDEM__PRINTF(3, 4);

static int idem__sf_fail(idem_snowflake *g, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->detail, sizeof g->detail, fmt, ap);
    va_end(ap);
    return code;
}

void idem_snowflake_opts_init(idem_snowflake_opts *o)
{
    memset(o, 0, sizeof *o);
    o->version = IDEM__SNOWFLAKE_OPTS_VERSION;
    o->epoch_ms = IDEM_SNOWFLAKE_EPOCH_MS;
    o->max_wait_ms = 1000;
    o->reserve_ms = 200;
}

/* Sleep towards until_ms on the real clock, in slices of at most 100 ms
 * so that a clock stepped forward meanwhile is noticed. */
static void idem__sleep_real(void *ctx, int64_t until_ms)
{
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    int64_t d = until_ms * 1000000 - now_ns;
    if (d <= 0)
        return;
    if (d > 100000000)
        d = 100000000;
    struct timespec rq = {.tv_sec = 0, .tv_nsec = (long)d};
    nanosleep(&rq, NULL);
}

/* With an injected clock the real clock says nothing about it: poll. */
static void idem__sleep_step(void *ctx, int64_t until_ms)
{
    (void)ctx;
    (void)until_ms;
    struct timespec rq = {.tv_sec = 0, .tv_nsec = 1000000};
    nanosleep(&rq, NULL);
}

static int64_t idem__sf_now(const idem_snowflake *g)
{
    return g->clock ? g->clock(g->clock_ctx) : idem__wall_ms();
}

/* ---- the state file ---------------------------------------------------- */

static void idem__slot_render(char out[IDEM__SLOT], int64_t ms)
{
    char body[IDEM__SLOT_BODY + 1];
    snprintf(body, sizeof body, IDEM__SLOT_MAGIC "%020" PRId64, ms);
    uint32_t sum = XXH32(body, IDEM__SLOT_BODY, 0);
    memset(out, ' ', IDEM__SLOT);
    memcpy(out, body, IDEM__SLOT_BODY);
    char tail[10];
    snprintf(tail, sizeof tail, " %08" PRIx32, sum);
    memcpy(out + IDEM__SLOT_BODY, tail, 9);
    out[IDEM__SLOT - 1] = '\n';
}

/* The mark in one slot, or -1 if the slot is not a valid one. */
static int64_t idem__slot_parse(const char *s)
{
    if (memcmp(s, IDEM__SLOT_MAGIC, IDEM__SLOT_MAGIC_LEN) != 0)
        return -1;
    int64_t ms = 0;
    for (size_t i = IDEM__SLOT_MAGIC_LEN; i < IDEM__SLOT_BODY; i++) {
        if (s[i] < '0' || s[i] > '9' || ms > (INT64_MAX - 9) / 10)
            return -1;
        ms = ms * 10 + (s[i] - '0');
    }
    if (s[IDEM__SLOT_BODY] != ' ')
        return -1;
    uint32_t sum = 0;
    for (size_t i = IDEM__SLOT_BODY + 1; i < IDEM__SLOT_BODY + 9; i++) {
        char c = s[i];
        unsigned v;
        if (c >= '0' && c <= '9')
            v = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v = (unsigned)(c - 'a' + 10);
        else
            return -1;
        sum = sum << 4 | v;
    }
    for (size_t i = IDEM__SLOT_BODY + 9; i < IDEM__SLOT - 1; i++)
        if (s[i] != ' ')
            return -1;
    if (s[IDEM__SLOT - 1] != '\n' || XXH32(s, IDEM__SLOT_BODY, 0) != sum)
        return -1;
    return ms;
}

static int idem__slot_write(idem_snowflake *g, int slot, int64_t ms)
{
    char buf[IDEM__SLOT];
    idem__slot_render(buf, ms);
    size_t done = 0;
    while (done < sizeof buf) {
        ssize_t w = pwrite(g->fd, buf + done, sizeof buf - done,
                           (off_t)slot * IDEM__SLOT + (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return idem__sf_fail(g, IDEM_EIO, "state file %s: write: %s",
                                 g->path, w < 0 ? strerror(errno) : "short");
        done += (size_t)w;
    }
    if (fdatasync(g->fd) != 0)
        return idem__sf_fail(g, IDEM_EIO, "state file %s: fdatasync: %s",
                             g->path, strerror(errno));
    return 0;
}

/* Raise the mark in the file to ms, alternating slots. */
static int idem__mark(idem_snowflake *g, int64_t ms)
{
    int rc = idem__slot_write(g, g->slot, ms);
    if (rc)
        return rc;
    g->slot ^= 1;
    g->reserved = ms;
    return 0;
}

static int idem__sync_dir(idem_snowflake *g)
{
    char *dir = idem__strdup(g->path);
    if (!dir)
        return idem__sf_fail(g, IDEM_ENOMEM, "out of memory");
    char *slash = strrchr(dir, '/');
    if (!slash) {
        dir[0] = '.';
        dir[1] = '\0';
    } else if (slash == dir) {
        dir[1] = '\0';
    } else {
        *slash = '\0';
    }
    int rc = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        rc = idem__sf_fail(g, IDEM_EIO, "state file %s: syncing %s: %s",
                           g->path, dir, strerror(errno));
    if (fd >= 0)
        close(fd);
    free(dir);
    return rc;
}

static int idem__open_state(idem_snowflake *g)
{
    int created = 0;
    for (;;) {
        g->fd = open(g->path, O_RDWR | O_CLOEXEC);
        if (g->fd >= 0 || errno != ENOENT)
            break;
        g->fd = open(g->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (g->fd >= 0) {
            created = 1;
            break;
        }
        if (errno != EEXIST)
            break;
    }
    if (g->fd < 0)
        return idem__sf_fail(g, IDEM_EIO, "state file %s: open: %s", g->path,
                             strerror(errno));
    if (flock(g->fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK)
            return idem__sf_fail(g, IDEM_ELOCKED,
                                 "state file %s: locked by another generator "
                                 "(another process, or another handle in "
                                 "this one)",
                                 g->path);
        return idem__sf_fail(g, IDEM_EIO, "state file %s: flock: %s", g->path,
                             strerror(errno));
    }
    if (created) {
        int rc = idem__sync_dir(g);
        if (rc)
            return rc;
    }
    char buf[2 * IDEM__SLOT + 1];
    size_t len = 0;
    while (len < sizeof buf) {
        ssize_t r = pread(g->fd, buf + len, sizeof buf - len, (off_t)len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return idem__sf_fail(g, IDEM_EIO, "state file %s: read: %s",
                                 g->path, strerror(errno));
        if (r == 0)
            break;
        len += (size_t)r;
    }
    int64_t m[2] = {-1, -1};
    for (int i = 0; i < 2; i++)
        if (len >= (size_t)(i + 1) * IDEM__SLOT)
            m[i] = idem__slot_parse(buf + i * IDEM__SLOT);
    int zero = 1;
    for (size_t i = 0; i < len; i++)
        zero &= buf[i] == 0;
    /* All zeros: a file whose creation a crash cut short. */
    if (!zero && (len > 2 * IDEM__SLOT || (m[0] < 0 && m[1] < 0)))
        return idem__sf_fail(g, IDEM_ECORRUPT,
                             "state file %s: not an idem snowflake state "
                             "file, or damaged beyond use (no valid slot); "
                             "if no generator used it, delete it",
                             g->path);
    /* Overwrite the smaller (or invalid) slot first: the larger stays. */
    g->slot = m[0] > m[1] ? 1 : 0;
    g->reserved = m[0] > m[1] ? m[0] : m[1];
    if (g->reserved >= 0) {
        g->last_ms = g->reserved;
        g->seq = IDEM_SNOWFLAKE_SEQ_MAX;
    }
    return 0;
}

/* ---- the generator ----------------------------------------------------- */

int idem_snowflake_new(const idem_snowflake_opts *opts, idem_snowflake **out)
{
    idem_snowflake_opts def;
    if (!out)
        return IDEM_EINVAL;
    if (!opts) {
        idem_snowflake_opts_init(&def);
        opts = &def;
    }
    idem_snowflake *g = calloc(1, sizeof *g);
    *out = g;
    if (!g)
        return IDEM_ENOMEM;
    g->closed = 1;
    g->fd = -1;
    g->last_ms = -1;
    g->reserved = -1;
    if (pthread_mutex_init(&g->mu, NULL) != 0) {
        free(g);
        *out = NULL;
        return IDEM_ENOMEM;
    }
    if (opts->version != IDEM__SNOWFLAKE_OPTS_VERSION)
        return idem__sf_fail(g, IDEM_EINVAL,
                             "options not initialised with "
                             "idem_snowflake_opts_init()");
    if (opts->node > IDEM_SNOWFLAKE_NODE_MAX)
        return idem__sf_fail(g, IDEM_EINVAL, "node %u is out of range 0..%u",
                             opts->node, IDEM_SNOWFLAKE_NODE_MAX);
    if (opts->epoch_ms < 0 || opts->epoch_ms > INT64_MAX - IDEM__MS_LIMIT)
        return idem__sf_fail(g, IDEM_EINVAL,
                             "epoch %" PRId64 " ms is out of range",
                             opts->epoch_ms);
    if (opts->max_wait_ms < 0 || opts->reserve_ms < 0)
        return idem__sf_fail(g, IDEM_EINVAL,
                             "max_wait_ms and reserve_ms must be >= 0");
    if (opts->state_file && opts->reserve_ms > opts->max_wait_ms)
        return idem__sf_fail(g, IDEM_EINVAL,
                             "reserve_ms (%" PRId64 ") must not exceed "
                             "max_wait_ms (%" PRId64 "): a restart after a "
                             "crash could not wait out the reserve",
                             opts->reserve_ms, opts->max_wait_ms);
    g->node = opts->node;
    g->epoch_ms = opts->epoch_ms;
    g->max_wait_ms = opts->max_wait_ms;
    g->reserve_ms = opts->reserve_ms;
    g->clock = opts->clock;
    g->clock_ctx = opts->clock_ctx;
    g->sleep = opts->sleep;
    g->sleep_ctx = opts->sleep_ctx;
    if (!g->sleep)
        g->sleep = g->clock ? idem__sleep_step : idem__sleep_real;
    if (opts->state_file) {
        if (!opts->state_file[0])
            return idem__sf_fail(g, IDEM_EINVAL, "state file name is empty");
        g->path = idem__strdup(opts->state_file);
        if (!g->path)
            return idem__sf_fail(g, IDEM_ENOMEM, "out of memory");
        int rc = idem__open_state(g);
        if (rc)
            return rc;
    }
    g->closed = 0;
    return 0;
}

static int idem__next_locked(idem_snowflake *g, uint64_t *id)
{
    if (g->closed)
        return idem__sf_fail(g, IDEM_EINVAL,
                             "generator is in a closed "
                             "state: idem_snowflake_new() "
                             "failed");
    int64_t ms;
    unsigned seq;
    /* Each sleep should bring the clock to the ms waited for; a clock that
     * does not move (a stuck or injected one) must not hold the lock
     * forever. */
    int64_t sleeps_left = g->max_wait_ms + 1000;
    for (;; sleeps_left--) {
        if (sleeps_left < 0)
            return idem__sf_fail(g, IDEM_ECLOCK,
                                 "the clock did not advance while waiting "
                                 "for ms %" PRId64, g->last_ms + 1);
        int64_t now = idem__sf_now(g);
        if (now < g->epoch_ms)
            return idem__sf_fail(g, IDEM_ECLOCK,
                                 "clock reads %" PRId64 " ms, before the "
                                 "epoch %" PRId64,
                                 now, g->epoch_ms);
        if (now - g->epoch_ms >= IDEM__MS_LIMIT)
            return idem__sf_fail(g, IDEM_ECLOCK,
                                 "clock reads %" PRId64 " ms, past the 41-bit "
                                 "range of the epoch %" PRId64,
                                 now, g->epoch_ms);
        if (now > g->last_ms) {
            ms = now;
            seq = 0;
            break;
        }
        if (now == g->last_ms) {
            if (g->seq < IDEM_SNOWFLAKE_SEQ_MAX) {
                ms = now;
                seq = g->seq + 1;
                break;
            }
            g->sleep(g->sleep_ctx, now + 1);
            continue;
        }
        if (g->last_ms - now > g->max_wait_ms)
            return idem__sf_fail(
                g, IDEM_ECLOCK,
                "clock reads %" PRId64 " ms, %" PRId64 " ms behind the "
                "last ID %s(%" PRId64 "), more than the %" PRId64 " ms "
                "it may wait; refusing to risk a repeated ID",
                now, g->last_ms - now,
                g->issued ? "issued " : "recorded in the state file ",
                g->last_ms, g->max_wait_ms);
        g->sleep(g->sleep_ctx, g->last_ms);
    }
    if (g->fd >= 0 && ms > g->reserved) {
        int rc = idem__mark(g, ms + g->reserve_ms);
        if (rc)
            return rc;
    }
    g->last_ms = ms;
    g->seq = seq;
    g->issued = 1;
    *id = (uint64_t)(ms - g->epoch_ms) << 22 | (uint64_t)g->node << 12 | seq;
    return 0;
}

int idem_snowflake_next(idem_snowflake *g, uint64_t *id)
{
    if (!g || !id)
        return IDEM_EINVAL;
    pthread_mutex_lock(&g->mu);
    g->detail[0] = '\0';
    int rc = idem__next_locked(g, id);
    pthread_mutex_unlock(&g->mu);
    return rc;
}

const char *idem_snowflake_errdetail(const idem_snowflake *g)
{
    return g ? g->detail : "out of memory";
}

int idem_snowflake_free(idem_snowflake *g)
{
    if (!g)
        return 0;
    int rc = 0;
    if (g->fd >= 0 && !g->closed && g->issued && g->last_ms < g->reserved) {
        /* Both slots: until the second write lands, the first one's exact
         * mark and the other's reserved one give a safe maximum. */
        rc = idem__slot_write(g, g->slot, g->last_ms);
        if (!rc)
            rc = idem__slot_write(g, g->slot ^ 1, g->last_ms);
    }
    if (g->fd >= 0)
        close(g->fd);
    pthread_mutex_destroy(&g->mu);
    free(g->path);
    free(g);
    return rc;
}

/* ---- decoding ---------------------------------------------------------- */

int idem_snowflake_decode(uint64_t id, int64_t epoch_ms,
                          idem_snowflake_parts *out)
{
    if (!out || id >> 63 || epoch_ms < 0 ||
        epoch_ms > INT64_MAX - IDEM__MS_LIMIT)
        return IDEM_EINVAL;
    out->since_epoch_ms = (int64_t)(id >> 22);
    out->unix_ms = epoch_ms + out->since_epoch_ms;
    out->node = (unsigned)(id >> 12 & IDEM_SNOWFLAKE_NODE_MAX);
    out->seq = (unsigned)(id & IDEM_SNOWFLAKE_SEQ_MAX);
    return 0;
}

size_t idem_snowflake_format(uint64_t id, char out[IDEM_SNOWFLAKE_STRLEN + 1])
{
    if (id >> 63) {
        out[0] = '\0';
        return 0;
    }
    char tmp[IDEM_SNOWFLAKE_STRLEN];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + id % 10);
        id /= 10;
    } while (id);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = '\0';
    return n;
}

int idem_snowflake_parse(const char *text, size_t len, uint64_t *id)
{
    if (!text || !id || len == 0 || len > IDEM_SNOWFLAKE_STRLEN ||
        (len > 1 && text[0] == '0'))
        return IDEM_EINVAL;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] < '0' || text[i] > '9')
            return IDEM_EINVAL;
        v = v * 10 + (uint64_t)(text[i] - '0');
    }
    if (v >> 63)
        return IDEM_EINVAL;
    *id = v;
    return 0;
}
