/* metricsrv.c - the /metrics endpoint of run and dedup.
 *
 * A job that runs for days is watched by Prometheus, which scrapes
 * GET /metrics. The endpoint lives in libmicrohttpd's own thread so that
 * it answers whatever the runner does, a handler that takes minutes
 * included: a scrape copies the store handle's counters, which the
 * library keeps as relaxed atomics and lets any thread read
 * (idem_metrics_get()), so no scrape ever waits for the runner, and the
 * runner never waits for a scrape. The one lock guards the handle's
 * life: taken by a scrape for the copy alone, and by the runner only to
 * hand a handle over or take it back before closing it.
 *
 * The Redis servers' own figures (INFO, and the live keys) are asked
 * when scraped, never on the runner's path, by a collector thread with a
 * read-only handle of its own (a handle is used by one thread at a
 * time). A scrape waits for it a few seconds at most, and a stop never:
 * a server that does not answer held each call up to the store's
 * timeout_ms, twice when the handle was not open yet, and the stop
 * joined the scrape that waited (SIGTERM took 10 s to exit). A collector
 * still waiting at the stop is left to finish, and frees what it uses.
 *
 * The socket is bound here, before the store opens: a port already in
 * use is a mistake in the command line, said at once with the address,
 * not a job that runs blind. */
#include "metricsrv.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSRV_NODES 64  /* Redis masters asked for INFO */

/* Connections served at once; more are closed as they come. Prometheus
 * keeps one per server; without a bound, a flood of connections took
 * every descriptor the process may have (1024 by default), and the job
 * failed for want of a pipe to its handler. */
#define MSRV_CONNECTIONS 32u

#define MSRV_WAIT_S 8  /* a scrape's wait for the servers' figures */

/* The servers' figures as the collector last read them. */
typedef struct srv_figures {
    idem_server_metrics sv[MSRV_NODES];
    size_t n;
    int64_t keys;
} srv_figures;

struct metrics_srv {
    struct MHD_Daemon *d;
    int fd;
    pthread_mutex_t mu;      /* guards s, job and the collector's state */
    idem_store *s;
    char job[IDEM_CHECKPOINT_NAME_MAX + 1];
    char *uri;
    /* The collector's: */
    idem_store *info;        /* its own handle, for INFO and the count */
    int64_t keys, keys_at, keys_took;  /* its last count */
    pthread_t collector;
    int has_collector;       /* uri names a Redis store: one runs */
    pthread_cond_t cv;       /* want or got moved, or stopping */
    uint64_t want, got;      /* figures asked for by scrapes, and read */
    int busy, abandoned;     /* it asks the servers; it frees m */
    srv_figures fig;
    atomic_int stopping;     /* msrv_stop() began: ask the servers no more */
    _Atomic long long lag;
    uint64_t failed, dead_letter;  /* guarded by mu */
};

int msrv_render(const idem_metrics *m, const char *job, const char *uri,
                cli_buf *out)
{
    out->len = 0;
    size_t n = idem_metrics_format(m, job, uri, NULL, 0);
    if (cli_buf_reserve(out, n + 1))
        return -1;
    idem_metrics_format(m, job, uri, out->p, n + 1);
    out->len = n;
    return 0;
}

/* The Redis servers' figures into sv; how many. Errors leave them out:
 * a scrape still says what the job did. */
static size_t servers(metrics_srv *m, idem_server_metrics *sv)
{
    if (!m->info) {
        idem_opts o;
        idem_opts_init(&o);
        o.flags = IDEM_O_READONLY;
        if (idem_open(m->uri, &o, &m->info)) {
            idem_close(m->info);
            m->info = NULL;
            return 0;
        }
    }
    size_t n = 0;
    if (atomic_load(&m->stopping) ||
        idem_server_metrics_get(m->info, sv, MSRV_NODES, &n))
        return 0;
    return n < MSRV_NODES ? n : MSRV_NODES;
}

/* A Redis store's live keys, counted as `idem stats` counts them
 * (idem_stats_get(): a SCAN of every master) on the endpoint's handle.
 * That is O(keys), so a count serves the scrapes that come before it is
 * ten times as old as it took (a second at least): counting takes at
 * most a tenth of the endpoint's time however large the store. -1 (left
 * out) when the last count failed. */
static int64_t redis_keys(metrics_srv *m)
{
    int64_t now = cli_mono_ms();
    int64_t every = m->keys_took > 100 ? 10 * m->keys_took : 1000;
    if (!m->info || (m->keys_at && now - m->keys_at < every))
        return m->keys;
    idem_stats st;
    m->keys = idem_stats_get(m->info, &st) ? -1 : (int64_t)st.live_keys;
    m->keys_at = cli_mono_ms();
    m->keys_took = m->keys_at - now;
    return m->keys;
}

/* A copy of everything, taken without waiting for the runner. */
static void snapshot(metrics_srv *m, idem_metrics *mt, char *job, size_t n)
{
    idem_metrics_init(mt);
    pthread_mutex_lock(&m->mu);
    if (m->s)
        idem_metrics_get(m->s, mt);
    snprintf(job, n, "%s", m->job);
    /* The runner records a dead letter as failed, and counts it before
     * the loop can say which it was (at once, when the first batch has
     * not been committed yet): the loop's own pair, one commit behind, is
     * the one whose difference never goes back. */
    mt->messages[IDEM_MR_FAILED] =
        m->failed > m->dead_letter ? m->failed - m->dead_letter : 0;
    mt->messages[IDEM_MR_DEAD_LETTER] = m->dead_letter;
    pthread_mutex_unlock(&m->mu);
    mt->source_lag = atomic_load_explicit(&m->lag, memory_order_relaxed);
}

/* The collector: the servers' figures each time a scrape asks, until
 * the stop. A server that did not answer INFO is not asked to count. */
static void msrv_free(metrics_srv *m);

static void *collect(void *arg)
{
    metrics_srv *m = arg;
    srv_figures *f = malloc(sizeof *f);
    pthread_mutex_lock(&m->mu);
    while (f && !atomic_load(&m->stopping)) {
        if (m->got >= m->want) {
            pthread_cond_wait(&m->cv, &m->mu);
            continue;
        }
        uint64_t gen = m->want;
        m->busy = 1;
        pthread_mutex_unlock(&m->mu);
        f->n = atomic_load(&m->stopping) ? 0 : servers(m, f->sv);
        f->keys = f->n && !atomic_load(&m->stopping) ? redis_keys(m) : -1;
        pthread_mutex_lock(&m->mu);
        m->busy = 0;
        m->fig = *f;
        m->got = gen;
        pthread_cond_broadcast(&m->cv);
    }
    int mine = m->abandoned;
    pthread_mutex_unlock(&m->mu);
    free(f);
    if (mine)
        msrv_free(m);
    return NULL;
}

/* The servers' figures into mt and sv, if the collector reads them
 * within MSRV_WAIT_S: else none, rather than old ones. */
static void server_figures(metrics_srv *m, idem_metrics *mt,
                           idem_server_metrics *sv)
{
    if (!m->has_collector)
        return;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += MSRV_WAIT_S;
    pthread_mutex_lock(&m->mu);
    uint64_t gen = ++m->want;
    pthread_cond_broadcast(&m->cv);
    while (m->got < gen && !atomic_load(&m->stopping) &&
           !pthread_cond_timedwait(&m->cv, &m->mu, &until))
        ;
    if (m->got >= gen) {
        memcpy(sv, m->fig.sv, m->fig.n * sizeof *sv);
        mt->nservers = m->fig.n;
        mt->live_keys = m->fig.keys;
    }
    pthread_mutex_unlock(&m->mu);
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code,
                             const char *type, char *body, size_t len,
                             enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **con_cls)
{
    metrics_srv *m = cls;
    static char not_found[] = "GET /metrics\n";
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return reply(c, 405, "text/plain", not_found, strlen(not_found),
                     MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/metrics"))
        return reply(c, 404, "text/plain", not_found, strlen(not_found),
                     MHD_RESPMEM_PERSISTENT);
    idem_metrics mt;
    char job[IDEM_CHECKPOINT_NAME_MAX + 1];
    idem_server_metrics sv[MSRV_NODES];
    snapshot(m, &mt, job, sizeof job);
    mt.servers = sv;
    server_figures(m, &mt, sv);
    cli_buf b = {0};
    if (msrv_render(&mt, job[0] ? job : NULL, m->uri, &b)) {
        cli_buf_free(&b);
        return MHD_NO;
    }
    return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p,
                 b.len, MHD_RESPMEM_MUST_FREE);
}

/* A port in digits, 1 to 65535: getaddrinfo() took 0 (a port nobody
 * could be told) and 99999 (port 34463) without a word. */
static int port_ok(const char *p)
{
    size_t n = strspn(p, "0123456789");
    if (!n || n > 5 || p[n])
        return 0;
    long v = strtol(p, NULL, 10);
    return v >= 1 && v <= 65535;
}

/* HOST:PORT split at the last ':'; a bracketed HOST loses its brackets. */
static int split(const char *addr, char *host, size_t n, const char **port)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || !port_ok(colon + 1))
        return -1;
    size_t len = (size_t)(colon - addr);
    if (addr[0] == '[') {
        if (len < 2 || addr[len - 1] != ']')
            return -1;
        addr++;
        len -= 2;
    }
    if (len >= n)
        return -1;
    memcpy(host, addr, len);
    host[len] = '\0';
    *port = colon + 1;
    return 0;
}

/* A listening socket on addr, or -1 after saying why. */
static int bind_addr(const char *cmd, const char *addr)
{
    char host[256];
    const char *port;
    if (split(addr, host, sizeof host, &port))
        return cli_usage_error(cmd, "--metrics-listen wants HOST:PORT, "
                               "PORT from 1 to 65535 (127.0.0.1:9464, "
                               "[::1]:9464, :9464 for every address), not "
                               "'%s'", addr), -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai;
    int e = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai);
    if (e)
        return cli_usage_error(cmd, "--metrics-listen %s: %s", addr,
                               gai_strerror(e)), -1;
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) ||
        listen(fd, 16)) {
        cli_usage_error(cmd, "--metrics-listen %s: cannot listen there: %s",
                        addr, strerror(errno));
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

metrics_srv *msrv_start(const char *cmd, const char *addr, const char *uri,
                        int *status)
{
    *status = CLI_EXIT_USAGE;
    int fd = bind_addr(cmd, addr);
    if (fd < 0)
        return NULL;
    metrics_srv *m = calloc(1, sizeof *m);
    if (m)
        m->uri = strdup(uri);
    if (!m || !m->uri) {
        close(fd);
        free(m);
        *status = cli_fail(cmd, "out of memory");
        return NULL;
    }
    m->fd = fd;
    m->lag = -1;
    m->keys = -1;
    pthread_mutex_init(&m->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* The server's thread inherits a mask without SIGTERM and SIGINT:
     * a stop signal must land in the reading thread, whose wait for
     * input it ends (stream.c). */
    sigset_t stops, old;
    sigemptyset(&stops);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stops, &old);
    m->has_collector = !(idem_uri_caps(uri) & IDEM_CAP_SEGMENTS) &&
                       !pthread_create(&m->collector, NULL, collect, m);
    m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                            answer, m, MHD_OPTION_LISTEN_SOCKET, fd,
                            MHD_OPTION_CONNECTION_TIMEOUT, 30u,
                            MHD_OPTION_CONNECTION_LIMIT, MSRV_CONNECTIONS,
                            MHD_OPTION_END);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!m->d) {
        *status = cli_fail(cmd, "--metrics-listen %s: cannot start the "
                           "HTTP server", addr);
        msrv_stop(m);
        return NULL;
    }
    *status = 0;
    return m;
}

void msrv_attach(metrics_srv *m, idem_store *s, const char *job)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->s = s;
    snprintf(m->job, sizeof m->job, "%s", job ? job : "");
    pthread_mutex_unlock(&m->mu);
}

void msrv_note_lag(metrics_srv *m, long long lag)
{
    if (m)
        atomic_store_explicit(&m->lag, lag, memory_order_relaxed);
}

void msrv_note_failures(metrics_srv *m, uint64_t failed, uint64_t dead)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->failed = failed;
    m->dead_letter = dead;
    pthread_mutex_unlock(&m->mu);
}

static void msrv_free(metrics_srv *m)
{
    idem_close(m->info);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m->uri);
    free(m);
}

void msrv_stop(metrics_srv *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    atomic_store(&m->stopping, 1);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (m->d)
        MHD_stop_daemon(m->d);  /* its scrapes wait no more */
    else
        close(m->fd);
    pthread_mutex_lock(&m->mu);
    int has = m->has_collector, left = has && m->busy;
    pthread_t t = m->collector;
    m->abandoned = left;
    pthread_mutex_unlock(&m->mu);
    if (left) {
        pthread_detach(t);  /* m is the collector's to free now */
        return;
    }
    if (has)
        pthread_join(t, NULL);
    msrv_free(m);
}
