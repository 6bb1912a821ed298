/* tests/test_cli_metrics.c - --metrics-listen and stats --format
 * prometheus, end to end.
 *
 * What an operator relies on is checked with the tools they use: the
 * endpoint's text through promtool, a real Prometheus server scraping a
 * running `idem dedup` and answering a query, and the counters against
 * what the run did. The input comes through a FIFO this test holds open,
 * so the job is still running (and serving) when it is scraped. The
 * HTTP client is a few lines of sockets: no dependency for the test. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "redis_harness.h"

TestSuite(cli_metrics, .init = t_dir_init, .fini = t_dir_fini,
          .timeout = 300);

#define WAIT_MS 120000  /* a loaded machine is slow; no assertion on it */

/* A loopback socket bound to a free port; listening if asked. */
static int bound(int *port, int listening)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a));
    cr_assert(!getsockname(fd, (struct sockaddr *)&a, &len));
    if (listening)
        cr_assert(!listen(fd, 1));
    *port = ntohs(a.sin_port);
    return fd;
}

static int free_port(void)
{
    int port;
    close(bound(&port, 0));
    return port;
}

/* GET path from 127.0.0.1:port: the body (malloc'ed) of a 200, else
 * NULL. */
static char *http_get(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char req[1024];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n",
                     path);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    cr_assert(buf);
    ssize_t got = write(fd, req, (size_t)n) == n ? 1 : -1;
    while (got > 0) {
        if (len == cap) {
            buf = realloc(buf, (cap *= 2) + 1);
            cr_assert(buf);
        }
        got = read(fd, buf + len, cap - len);
        len += got > 0 ? (size_t)got : 0;
    }
    close(fd);
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    if (got < 0 || strncmp(buf, "HTTP/1.", 7) || strncmp(buf + 8, " 200", 4) ||
        !body) {
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

/* GET path until its body holds every one of the NULL-terminated needles;
 * the body. Fails the test after WAIT_MS. */
static char *wait_for(int port, const char *path, const char *const *needles)
{
    int64_t end = t_mono_ms() + WAIT_MS;
    char *last = NULL;
    for (;;) {
        free(last);
        last = http_get(port, path);
        size_t i = 0;
        while (last && needles[i] && strstr(last, needles[i]))
            i++;
        if (last && !needles[i])
            return last;
        cr_assert_lt(t_mono_ms(), end, "GET :%d%s never held '%s'; last:\n%s",
                     port, path, needles[i], last ? last : "(no answer)");
        t_sleep_ms(200);
    }
}

static void promtool_check(const char *name)
{
    if (t_sh("command -v promtool >/dev/null")) {
        cr_log_warn("promtool is not installed: %s is not checked", name);
        return;
    }
    cr_assert_eq(t_sh("promtool check metrics < '%s' > '%s.lint' 2>&1",
                      t_at(name), t_at(name)),
                 0, "%s", t_read(t_at("lint"), NULL));
}

/* 100 lines, ids i % 70: 70 new, 30 replays (batches of 10 at most never
 * hold both). */
static void lines(int fd)
{
    for (int i = 0; i < 100; i++) {
        char l[64];
        int n = snprintf(l, sizeof l, "{\"id\":%d}\n", i % 70);
        cr_assert_eq(write(fd, l, (size_t)n), n);
    }
}

/* A running `idem ARGS` reading the FIFO t_dir/in, which *fd holds
 * open. */
static pid_t start_fed(int *fd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static pid_t start_fed(int *fd, const char *fmt, ...)
{
    cr_assert_eq(mkfifo(t_at("in"), 0600), 0);
    char args[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    pid_t pid = t_cli_start(t_dir, "%s < in > out 2> err", args);
    *fd = open(t_at("in"), O_WRONLY);
    cr_assert_geq(*fd, 0);
    return pid;
}

static void counted_run(const char *store)
{
    int port = free_port(), fd;
    pid_t pid = start_fed(&fd, "dedup --key id --batch 10 --store '%s' "
                          "--metrics-listen 127.0.0.1:%d", store, port);
    lines(fd);
    char keys[600];
    snprintf(keys, sizeof keys, "idem_live_keys{job=\"dedup\",store=\"%s\"} "
             "70\n", store);
    const char *want[] = {"outcome=\"new\"} 70\n", "outcome=\"replay\"} 30\n",
                          "result=\"done\"} 70\n", "result=\"replay\"} 30\n",
                          "job=\"dedup\"", "idem_build_info{", keys, NULL};
    char *body = wait_for(port, "/metrics", want);
    t_write(t_at("scrape"), body, strlen(body));
    promtool_check("scrape");
    close(fd);
    cr_assert_eq(t_wait(pid), 0, "%s", t_read(t_at("err"), NULL));
    free(body);
}

Test(cli_metrics, endpoint_counts_what_the_run_did_local)
{
    counted_run("local:store");
    cr_assert_eq(t_cli(t_dir, "stats --format prometheus > p"), 0);
    cr_assert(t_grep(t_at("p"), "idem_live_keys{store=\"local:store\"} 70"),
              "%s", t_read(t_at("p"), NULL));
    promtool_check("p");
}

Test(cli_metrics, endpoint_counts_what_the_run_did_redis)
{
    char uri[512];
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s", th_redis_addr(),
             th_prefix());
    counted_run(uri);
    cr_assert(t_grep(t_at("scrape"), "idem_redis_used_memory_bytes{"));
    cr_assert_eq(t_cli(t_dir, "stats --store '%s' --format prometheus > p",
                       uri), 0);
    cr_assert(t_grep(t_at("p"), "idem_live_keys{store="));
    cr_assert(t_grep(t_at("p"), "idem_redis_evicted_keys{"));
    promtool_check("p");
}

Test(cli_metrics, endpoint_answers_while_the_handler_is_slow)
{
    int port = free_port(), fd;
    pid_t pid = start_fed(&fd, "run --key id --store %s --metrics-listen "
                          "127.0.0.1:%d --exec '\"$IDEM_PROGS/handler\" "
                          "sleep=60000'", "local:store", port);
    cr_assert_eq(write(fd, "{\"id\":1}\n", 9), 9);
    /* Claimed, so in the handler's hands: and not done for a minute. */
    const char *want[] = {"outcome=\"new\"} 1\n", NULL};
    char *body = wait_for(port, "/metrics", want);
    cr_assert(strstr(body, "result=\"done\"} 0\n"), "%s", body);
    free(body);
    body = http_get(port, "/metrics");
    cr_assert(body && strstr(body, "result=\"done\"} 0\n"));
    free(body);
    kill(pid, SIGKILL);
    t_wait(pid);
    close(fd);
}

Test(cli_metrics, busy_or_bad_address_is_a_usage_error)
{
    int port;
    int held = bound(&port, 1);
    t_put("in", "{\"id\":1}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --metrics-listen 127.0.0.1:%d "
                              "in > out 2> err", port), 2);
    char where[64];
    snprintf(where, sizeof where, "--metrics-listen 127.0.0.1:%d", port);
    cr_assert(t_grep(t_at("err"), where), "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "in use"));
    cr_assert_eq(t_sh("test -d '%s/store'", t_dir), 1, "no store opened");
    cr_assert_eq(t_cli(t_dir, "run --key id --exec cat --metrics-listen nope "
                              "in 2> err"), 2);
    cr_assert(t_grep(t_at("err"), "HOST:PORT"));
    /* Port 0 (a port nobody is told), a port that wrapped, no port. */
    const char *bad[] = {"127.0.0.1:0", "127.0.0.1:99999", "[::1]", "[::1:9",
                         "127.0.0.1:+80"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(t_cli(t_dir, "dedup --key id --metrics-listen '%s' in "
                                  "> out 2> err", bad[i]), 2, "%s", bad[i]);
        cr_assert(t_grep(t_at("err"), "1 to 65535"), "%s: %s", bad[i],
                  t_read(t_at("err"), NULL));
    }
    cr_assert_eq(t_cli(t_dir, "stats --json --format prometheus 2> err"), 2);
    close(held);
}

/* Connections to 127.0.0.1:port, opened one after another and held,
 * until stop. */
typedef struct flood {
    int port, fds[400];
    atomic_int n, stop;
} flood;

static void *flood_loop(void *arg)
{
    flood *f = arg;
    while (!atomic_load(&f->stop) && atomic_load(&f->n) < 400) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons(f->port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        struct timeval tv = {.tv_sec = 1};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            f->fds[atomic_fetch_add(&f->n, 1)] = fd;
        else if (fd >= 0)
            close(fd);
    }
    return NULL;
}

/* A flood of connections to the endpoint takes none of the descriptors
 * the job needs: under a limit of 64 it once starved the run of a pipe
 * to its handler (EMFILE, exit 1). */
Test(cli_metrics, a_flood_of_connections_leaves_the_job_its_descriptors)
{
    flood f = {.port = free_port()};
    struct rlimit was, low;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
    low = (struct rlimit){64, was.rlim_max};
    cr_assert_eq(mkfifo(t_at("in"), 0600), 0);
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    pid_t pid = t_cli_start(t_dir, "run --key id --batch 1 --metrics-listen "
                            "127.0.0.1:%d --exec '\"$IDEM_PROGS/handler\"' "
                            "< in > out 2> err", f.port);
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &was), 0);
    int fd = open(t_at("in"), O_WRONLY);
    cr_assert_geq(fd, 0);
    const char *up[] = {"idem_build_info{", NULL};
    free(wait_for(f.port, "/metrics", up));
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, flood_loop, &f), 0);
    while (atomic_load(&f.n) < 100)
        t_sleep_ms(10);
    lines(fd);
    close(fd);
    int st = t_wait(pid);
    atomic_store(&f.stop, 1);
    pthread_join(t, NULL);
    for (int i = 0; i < atomic_load(&f.n); i++)
        close(f.fds[i]);
    cr_assert_eq(st, 0, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "100 lines read, 70 new"), "%s",
              t_read(t_at("err"), NULL));
}

/* A dead letter is never shown as failed first (a counter that went
 * back, which Prometheus takes for a restart): k0 crashes the handler
 * and is set aside, recorded at once, while k1 hangs and keeps the batch
 * from being committed. */
Test(cli_metrics, a_dead_letter_is_never_counted_failed_first)
{
    int port = free_port();
    t_put("in", "{\"id\":\"k0\"}\n{\"id\":\"k1\"}\n");
    pid_t pid = t_cli_start(t_dir, "run --key id --batch 2 --metrics-listen "
                            "127.0.0.1:%d --dead-letter dl --max-attempts 1 "
                            "--backoff 1ms --lease 1h --exec "
                            "'\"$IDEM_PROGS/handler\" crash=k0 hangon=k1' in "
                            "> out 2> err", port);
    const char *want[] = {"kind=\"permanent\"} 1\n", NULL};
    char *body = wait_for(port, "/metrics", want);
    cr_assert(strstr(body, "result=\"failed\"} 0\n"), "%s", body);
    cr_assert(strstr(body, "result=\"dead_letter\"} 0\n"), "%s", body);
    free(body);
    kill(pid, SIGKILL);
    t_wait(pid);
}

/* A Redis server that stops answering (SIGSTOP) holds neither a scrape
 * (answered without its figures) nor the job's stop: its calls would
 * wait the store's timeout_ms, here ten minutes. */
Test(cli_metrics, a_frozen_redis_holds_neither_scrape_nor_stop)
{
    th_servers sv;
    th_start_single(&sv);
    int port = free_port(), fd;
    pid_t pid = start_fed(&fd, "dedup --key id --store "
                          "'redis://127.0.0.1:%d?timeout_ms=600000' "
                          "--metrics-listen 127.0.0.1:%d", sv.ports[0],
                          port);
    lines(fd);
    const char *want[] = {"result=\"done\"} 70\n",
                          "idem_redis_used_memory_bytes{", NULL};
    free(wait_for(port, "/metrics", want));
    th_signal(&sv, sv.ports[0], SIGSTOP);
    char *body = http_get(port, "/metrics");
    cr_assert(body, "the scrape was held");
    cr_assert(strstr(body, "result=\"done\"} 70\n"), "%s", body);
    cr_assert_null(strstr(body, "idem_redis_used_memory_bytes{"), "old "
                   "figures shown as new");
    free(body);
    kill(pid, SIGTERM);
    int st = t_wait(pid);
    th_signal(&sv, sv.ports[0], SIGCONT);
    close(fd);
    th_stop(&sv);
    cr_assert_eq(st, 0, "%s", t_read(t_at("err"), NULL));
}

/* Prometheus scrapes a running dedup; its query API answers the count.
 * The server lives under timeout(1), so a failed test leaves nothing
 * running for long. */
Test(cli_metrics, prometheus_scrapes_a_running_dedup, .timeout = 400)
{
    if (t_sh("command -v prometheus >/dev/null")) {
        cr_log_warn("prometheus is not installed: skipped");
        cr_skip_test("prometheus is not installed");
    }
    int port = free_port(), web = free_port(), fd;
    char conf[512];
    snprintf(conf, sizeof conf,
             "global:\n  scrape_interval: 1s\n"
             "scrape_configs:\n  - job_name: idem\n"
             "    static_configs:\n      - targets: ['127.0.0.1:%d']\n",
             port);
    t_put("prom.yml", conf);
    cr_assert_eq(t_sh("cd '%s' && { exec timeout 380 prometheus "
                      "--config.file=prom.yml --storage.tsdb.path=tsdb "
                      "--web.listen-address=127.0.0.1:%d > prom.log 2>&1 & "
                      "echo $! > prom.pid; }", t_dir, web), 0);
    pid_t pid = start_fed(&fd, "dedup --key id --batch 10 --store '%s' "
                          "--metrics-listen 127.0.0.1:%d", "local:store",
                          port);
    lines(fd);
    const char *want[] = {"\"status\":\"success\"", "\"70\"]", NULL};
    char *body = wait_for(web, "/api/v1/query?query=idem_claims_total"
                               "%7Boutcome%3D%22new%22%7D", want);
    cr_assert(strstr(body, "\"job\":\"idem\""), "%s", body);
    free(body);
    close(fd);
    cr_assert_eq(t_wait(pid), 0);
    char *ppid = t_read(t_at("prom.pid"), NULL);
    kill((pid_t)strtol(ppid, NULL, 10), SIGTERM);  /* timeout passes it on */
    free(ppid);
}

/* The alerting rules and their unit tests (docs/monitoring/). */
Test(cli_metrics, promtool_tests_the_alerting_rules)
{
    if (t_sh("command -v promtool >/dev/null")) {
        cr_log_warn("promtool is not installed: skipped");
        cr_skip_test("promtool is not installed");
    }
    const char *scripts = getenv("IDEM_SCRIPTS");
    cr_assert(scripts);
    cr_assert_eq(t_sh("cd '%s/../docs/monitoring' && promtool check rules "
                      "idem.rules.yml > '%s/out' 2>&1 && promtool test rules "
                      "idem.rules.test.yml >> '%s/out' 2>&1", scripts, t_dir,
                      t_dir),
                 0, "%s", t_read(t_at("out"), NULL));
}

/* On a terminal a file job shows how far it is through its input and
 * when it should end; on a pipe, or with --quiet, nothing. script(1)
 * gives the run a terminal; a handler that sleeps 300 ms per message
 * makes the run last past the line's half-second refresh on any
 * machine. */
Test(cli_metrics, progress_line_shows_percent_and_eta_on_a_tty)
{
    t_put("in", "{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n{\"id\":4}\n"
                "{\"id\":5}\n{\"id\":6}\n");
    t_put("go.sh", "IDEM_STORE=local:$1 exec \"$IDEM_CLI\" run $2 --key id "
                   "--batch 1 --exec '\"$IDEM_PROGS/handler\" sleep=300' in "
                   "> /dev/null\n");
    cr_assert_eq(t_sh("cd '%s' && script -qec 'sh go.sh s1' /dev/null > tty "
                      "2>&1", t_dir), 0, "%s", t_read(t_at("tty"), NULL));
    cr_assert(t_grep(t_at("tty"), "%, ETA "), "%s", t_read(t_at("tty"), NULL));
    cr_assert_eq(t_sh("cd '%s' && sh go.sh s2 2> err", t_dir), 0);
    cr_assert(t_grep(t_at("err"), "6 lines read"));
    cr_assert(!t_grep(t_at("err"), "ETA"), "not on a pipe or file");
    cr_assert_eq(t_sh("cd '%s' && script -qec 'sh go.sh s3 --quiet' "
                      "/dev/null > tty 2>&1", t_dir), 0);
    cr_assert(!t_grep(t_at("tty"), "ETA"), "not with --quiet");
}

/* A stream source: the endpoint serves while dedup waits for entries,
 * with the source's lag, and SIGTERM (which must reach the reading
 * thread, not the server's) still stops it. */
Test(cli_metrics, stream_source_lag_and_stop)
{
    char in[128], out[128];
    snprintf(in, sizeof in, "%sin", th_prefix());
    snprintf(out, sizeof out, "%sout", th_prefix());
    redisContext *rc = th_connect(th_first_port(th_redis_addr()));
    for (int i = 0; i < 50; i++)
        freeReplyObject(th_cmd(rc, "XADD %s * event_id e%d", in, i % 40));
    int port = free_port();
    pid_t pid = t_cli_start(t_dir, "dedup --key event_id --from "
                            "'redis-stream://%s/%s?group=g' --to "
                            "'redis-stream://%s/%s' --metrics-listen "
                            "127.0.0.1:%d > o 2> err", th_redis_addr(), in,
                            th_redis_addr(), out, port);
    const char *want[] = {"outcome=\"new\"} 40\n",
                          "result=\"duplicate\"} 10\n",
                          "idem_source_lag_messages{", NULL};
    char *body = wait_for(port, "/metrics", want);
    t_write(t_at("scrape"), body, strlen(body));
    promtool_check("scrape");
    free(body);
    kill(pid, SIGTERM);
    cr_assert_eq(t_wait(pid), 0, "%s", t_read(t_at("err"), NULL));
    redisFree(rc);
}
