/* coproc.c - talking to the handler of `idem run`.
 *
 * The handler is started once (sh -c CMD) and kept: starting a process
 * per message would cost more than most handlers' work. Its stdin gets
 * one envelope per NEW message,
 *
 *   {"key":"k1","token":3,"attempt":2,"message":{...the input line...}}
 *
 * and its stdout must give one answer line per envelope, in order:
 *
 *   {"ok":true,...}                       done; the whole line is the
 *                                         result, cached for replays
 *   {"error":"...","retryable":true}      failed, try again later
 *   {"error":"..."}                       failed for good (cached)
 *
 * (exactly that; the grammar is stated where answers are parsed). An
 * answer may carry "key"; if it does it must be the envelope's key,
 * which catches a handler that skipped or doubled a line. Envelopes and
 * answers are pipelined: we write while we read, with non-blocking pipes
 * and poll(2), so a handler that reads a line, answers, and reads the
 * next (each answer flushed) runs at full speed and never deadlocks.
 *
 * What can go wrong, and what we do: the handler exits (EOF, EPIPE), it
 * writes a line that is not an answer or names another key, or it
 * gives no answer for a whole lease. Each time it is killed, the reason is
 * kept in err, and the call returns an error: the runner then commits the
 * answers before the first missing one and nothing after it.
 *
 * While the handler works, the runner is ticked (idem_runner_tick) at
 * least every TICK_MS: it renews the batch's leases and commits the
 * answers given so far, so a slow handler neither loses its keys to
 * another worker nor has much finished work redone after a crash. Before
 * each tick the answers read so far get real pointers into rb, and the
 * runner copies them; rb may move afterwards.
 *
 * The handler runs in a process group of its own, and every kill ends the
 * whole group: sh forks the command it is given, so killing sh alone
 * would leave the real handler running effects for claims that are about
 * to be released, taken over or given to a restarted handler. When idem
 * itself dies (kill -9), nobody is left to kill the group, so a watcher
 * does: a small child of idem that joins the handler's group, holds the
 * read end of a pipe whose only writer is idem, and kills its whole
 * group (itself included) when a read returns end of file, which
 * happens exactly when idem is gone. PR_SET_PDEATHSIG on the group
 * leader alone would leave its children (python3 starting a subprocess,
 * `sleep 999 &`) running under pid 1, and a subreaper would have to be
 * idem, which dies. The watcher is idem's child, not the handler's, so a
 * handler that waits for its own children never meets it. Time spent
 * in the runner's tick does not count against the handler's deadline:
 * its answers wait in the pipe meanwhile. The handler's environment is
 * idem's without the store's password (handlerenv.c). */
#include "coproc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yajl/yajl_parse.h>

#include "handlerenv.h"
#include "jsonkey.h"

#define TICK_MS 50
#define EXTENDED 1  /* take_answer: a line that extends, not an answer */


static void kill_child(coproc *c);

/* In the watcher: keep nothing of idem's open but the pipe (an inherited
 * write end of the handler's stdin would hide its end of input, an
 * inherited stdout from a consumer), join the handler's group or leave,
 * and kill the group once idem is gone. Async-signal-safe calls only:
 * idem has threads. */
static void watch(int life, pid_t pgid)
{
    if ((life > 0 && close_range(0, (unsigned)life - 1, 0)) ||
        close_range((unsigned)life + 1, ~0U, 0))
        for (int fd = 0; fd < 65536; fd++)
            if (fd != life)
                close(fd);
    if (setpgid(0, pgid))
        _exit(0);  /* the group is gone already */
    char b;
    while (read(life, &b, 1) < 0 && errno == EINTR)
        ;
    kill(0, SIGKILL);
    _exit(0);
}

/* Start the watcher of the handler's group (see the top of this file). */
static int start_watcher(coproc *c)
{
    int life[2];
    if (pipe2(life, O_CLOEXEC))
        return -1;
    pid_t w = fork();
    if (w == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        watch(life[0], c->pid);
    }
    close(life[0]);
    if (w < 0) {
        close(life[1]);
        return -1;
    }
    c->watcher = w;
    c->life = life[1];
    return 0;
}

/* Both pipes or neither: a failed second pipe2 gives the first back. */
static int open_pipes(int in[2], int out[2])
{
    if (pipe2(in, O_CLOEXEC))
        return -1;
    if (pipe2(out, O_CLOEXEC) == 0)
        return 0;
    int e = errno;
    close(in[0]);
    close(in[1]);
    errno = e;
    return -1;
}

static int start(coproc *c)
{
    int in[2], out[2];
    char sh[] = "sh", dash_c[] = "-c";
    char *argv[] = {sh, dash_c, (char *)c->cmd, NULL};
    char **env = handler_env_new();  /* before fork: see handlerenv.c */
    if (!env) {
        snprintf(c->err, sizeof c->err, "out of memory");
        return IDEM_ENOMEM;
    }
    if (open_pipes(in, out)) {
        snprintf(c->err, sizeof c->err, "pipe: %s", strerror(errno));
        free(env);
        return IDEM_EIO;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(in[0], 0);
        dup2(out[1], 1);
        signal(SIGPIPE, SIG_DFL);
        sigset_t none;  /* the thread that forks blocks stop signals */
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve("/bin/sh", argv, env);
        _exit(127);
    }
    free(env);
    close(in[0]);
    close(out[1]);
    if (pid < 0) {
        close(in[1]);
        close(out[0]);
        snprintf(c->err, sizeof c->err, "fork: %s", strerror(errno));
        return IDEM_EIO;
    }
    setpgid(pid, pid);  /* also here: whichever runs first */
    c->pid = pid;
    c->to = in[1];
    c->from = out[0];
    if (start_watcher(c)) {
        snprintf(c->err, sizeof c->err, "starting the handler's watcher: "
                 "%s", strerror(errno));
        kill_child(c);
        return IDEM_EIO;
    }
    fcntl(c->to, F_SETFL, O_NONBLOCK);
    fcntl(c->from, F_SETFL, O_NONBLOCK);
    c->rb.len = c->rpos = c->scanned = 0;
    return 0;
}

/* Why the child ended (r: what waitpid returned, st its status), for
 * messages: "exited with status 3". Returns its exit status, or -1 when
 * it was killed. */
static int describe(const coproc *c, pid_t r, int st, char *why, size_t n)
{
    if (r != c->pid)
        snprintf(why, n, "ended");
    else if (WIFEXITED(st))
        snprintf(why, n, "exited with status %d%s", WEXITSTATUS(st),
                 WEXITSTATUS(st) == 127 ? " (command not found?)" : "");
    else
        snprintf(why, n, "was killed by signal %d", WTERMSIG(st));
    return r == c->pid && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int reap(coproc *c, char *why, size_t n)
{
    int st = 0;
    pid_t r = waitpid(c->pid, &st, 0);
    return describe(c, r, st, why, n);
}

/* Wait up to ms for the child to exit; then kill its group and reap it.
 * What waitpid returned: 0 when it had to be killed. */
static pid_t wait_or_kill(coproc *c, int64_t ms, int *st)
{
    int64_t end = cli_mono_ms() + ms;
    pid_t r;
    while ((r = waitpid(c->pid, st, WNOHANG)) == 0 && cli_mono_ms() < end)
        poll(NULL, 0, 10);
    if (r == 0) {
        kill(-c->pid, SIGKILL);
        waitpid(c->pid, st, 0);
    }
    return r;
}

/* The handler's output ended: it can answer no more. It has exited, or
 * is about to; one that runs on without its output (exec >&-; sleep
 * 999) must not hold idem in a wait where nothing renews the claims or
 * hears a stop, while its effects go on: it gets a third of a lease (at
 * most a second) to exit, then its group is killed. Its exit status, or
 * -1; why says what happened. */
static int reap_closed(coproc *c, char *why, size_t n)
{
    int st = 0;
    int64_t ms = c->lease_ms / 3 < 1000 ? c->lease_ms / 3 : 1000;
    pid_t r = wait_or_kill(c, ms, &st);
    if (r)
        return describe(c, r, st, why, n);
    snprintf(why, n, "closed its output but did not exit (killed it)");
    return -1;
}

/* End what is left of the handler's process group, once its leader has
 * been reaped, and wait (a second at most) until none of it runs
 * (zombies left to a PID 1 that does not reap do not count). The
 * watcher, in the group, is idem's child to reap; its pipe is closed
 * first, so that it ends even if it joined the group only after the
 * kill (a watcher slow to start, a group kept by such zombies): waiting
 * for it with the pipe open waited for ever. */
static void end_group(coproc *c)
{
    kill(-c->pid, SIGKILL);
    if (c->watcher) {
        close(c->life);
        waitpid(c->watcher, NULL, 0);
        c->watcher = 0;
    }
    for (int i = 0; i < 100 && cli_group_runs(c->pid); i++)
        poll(NULL, 0, 10);
}

static void kill_child(coproc *c)
{
    if (!c->pid)
        return;
    kill(-c->pid, SIGKILL);
    char why[96];
    reap(c, why, sizeof why);
    end_group(c);
    close(c->to);
    close(c->from);
    c->pid = 0;
}

/* Fail the call: kill the child, keep the reason. */
static int broke(coproc *c, int code, const char *fmt, ...)
    CLI_PRINTF(3, 4);
static int broke(coproc *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    kill_child(c);
    return code;
}

/* ------------------------------------------------------------------------
 * Envelopes */

static int envelope(coproc *c, const idem_task *t)
{
    cli_buf *w = &c->wb;
    int text = cli_utf8_valid(t->key, t->keylen);
    int rc = cli_buf_str(w, text ? "{\"key\":" : "{\"key_base64\":");
    rc = rc ? rc : text ? cli_buf_json_string(w, t->key, t->keylen)
                        : cli_buf_base64(w, t->key, t->keylen);
    rc = rc ? rc : cli_buf_fmt(w, ",\"token\":%llu,\"attempt\":%u,",
                               (unsigned long long)t->token, t->attempt);
    if (!c->line_mode)
        rc = rc ? rc : cli_buf_str(w, "\"message\":") ||
                       cli_buf_add(w, t->msg, t->msglen);
    else if (cli_utf8_valid(t->msg, t->msglen))
        rc = rc ? rc : cli_buf_str(w, "\"message\":") ||
                       cli_buf_json_string(w, t->msg, t->msglen);
    else
        rc = rc ? rc : cli_buf_str(w, "\"message_base64\":") ||
                       cli_buf_base64(w, t->msg, t->msglen);
    return rc ? rc : cli_buf_str(w, "}\n");
}

/* ------------------------------------------------------------------------
 * Answers. The grammar is exact, because a guess caches the wrong
 * outcome for good: a line is a JSON object whose top-level members
 * "ok", "error", "retryable" and "key" each appear at most once, with
 * exactly one of
 *
 *   "ok":true                        done (the whole line is the result)
 *   "error":STRING                   failed; "retryable":true|false may
 *                                    follow (default false)
 *
 * and "key", if there, a string equal to the envelope's key. Anything
 * else ("ok":false, "ok" beside "error", "error":null, a number for
 * "retryable", "retryable" without "error", a repeated member, neither
 * member) is a broken handler, handled like a line that is not JSON.
 * Other members are the handler's own and are kept in the result. */

enum { M_OTHER, M_OK, M_ERROR, M_RETRYABLE, M_KEY, M_EXTEND, M_COUNT };
enum { V_NONE, V_TRUE, V_FALSE, V_STRING, V_OTHER };

static const char *const member_names[M_COUNT] = {
    "", "ok", "error", "retryable", "key", "extend"};

typedef struct answer {
    int depth, member;      /* member: M_*, of the top-level value next */
    int value[M_COUNT];     /* V_* of each member seen at the top */
    int repeated;           /* a member that appeared twice, or 0 */
    const idem_task *task;
    int key_ok;
    int key_bad_escape;     /* "key" holds an escape of no character */
    char extend[32];        /* the value of "extend", cut short */
    int top_object;
    yajl_handle h;          /* for the raw bytes of "key" */
    const char *line;
} answer;

/* A value starts: record its kind if it is a top-level member's. */
static int a_value(answer *a, int kind)
{
    if (a->depth == 1 && a->member != M_OTHER)
        a->value[a->member] = kind;
    return 1;
}

static int a_null(void *ctx)
{
    return a_value(ctx, V_OTHER);
}

static int a_bool(void *ctx, int v)
{
    return a_value(ctx, v ? V_TRUE : V_FALSE);
}

static int a_number(void *ctx, const char *s, size_t n)
{
    (void)s;
    (void)n;
    return a_value(ctx, V_OTHER);
}

static int a_string(void *ctx, const unsigned char *s, size_t n)
{
    answer *a = ctx;
    if (a->depth == 1 && a->member == M_KEY) {
        /* YAJL decodes a lone surrogate to '?' or to another character,
         * which could match a real key: such a key is no key. */
        a->key_bad_escape = jk_bad_escape(
            a->line, yajl_get_bytes_consumed(a->h) - 1) != 0;
        a->key_ok = n == a->task->keylen && !memcmp(s, a->task->key, n);
    }
    if (a->depth == 1 && a->member == M_EXTEND)
        snprintf(a->extend, sizeof a->extend, "%.*s",
                 (int)(n < sizeof a->extend ? n : sizeof a->extend), s);
    return a_value(a, V_STRING);
}

static int a_open(void *ctx)
{
    answer *a = ctx;
    a_value(a, V_OTHER);
    if (a->depth == 0)
        a->top_object = 1;
    a->depth++;
    return 1;
}

static int a_open_array(void *ctx)
{
    answer *a = ctx;
    a_value(a, V_OTHER);
    a->depth++;
    return 1;
}

static int a_close(void *ctx)
{
    ((answer *)ctx)->depth--;
    return 1;
}

static int a_key(void *ctx, const unsigned char *s, size_t n)
{
    answer *a = ctx;
    if (a->depth != 1)
        return 1;
    a->member = M_OTHER;
    for (int m = M_OK; m < M_COUNT; m++)
        if (n == strlen(member_names[m]) && !memcmp(s, member_names[m], n))
            a->member = m;
    if (a->member != M_OTHER && a->value[a->member] != V_NONE &&
        !a->repeated)
        a->repeated = a->member;
    return 1;
}

static const yajl_callbacks answer_cb = {
    a_null, a_bool, NULL, NULL, a_number, a_string, a_open,
    a_key,  a_close, a_open_array, a_close};

/* How a well-formed object breaks the grammar, or NULL if it does not. */
static const char *grammar_error(const answer *a, char *buf, size_t n)
{
    const int *v = a->value;
    if (a->repeated) {
        snprintf(buf, n, "\"%s\" appears twice", member_names[a->repeated]);
        return buf;
    }
    if (v[M_EXTEND])
        return v[M_OK] || v[M_ERROR] || v[M_RETRYABLE]
                   ? "\"extend\" goes alone (with \"key\" at most)"
               : v[M_EXTEND] != V_STRING ? "\"extend\" must be a duration "
                                           "such as \"30s\""
               : v[M_KEY] && v[M_KEY] != V_STRING ? "\"key\" must be a string"
                                                 : NULL;
    if (v[M_OK] && v[M_ERROR])
        return "it has both \"ok\" and \"error\"";
    if (v[M_OK] && v[M_OK] != V_TRUE)
        return "\"ok\" must be true; a failure is {\"error\":\"why\"}";
    if (!v[M_OK] && !v[M_ERROR])
        return "it has neither \"ok\":true nor \"error\"";
    if (v[M_ERROR] && v[M_ERROR] != V_STRING)
        return "\"error\" must be a string";
    if (v[M_RETRYABLE] && !v[M_ERROR])
        return "\"retryable\" goes with \"error\" only";
    if (v[M_RETRYABLE] && v[M_RETRYABLE] != V_TRUE &&
        v[M_RETRYABLE] != V_FALSE)
        return "\"retryable\" must be true or false";
    if (v[M_KEY] && v[M_KEY] != V_STRING)
        return "\"key\" must be a string";
    return NULL;
}

/* {"extend":"30s"}: the handler works on t's message for that long
 * yet. Its claim is renewed for that time (at most the TTL), and the
 * handler counts as hung only once it is over. EXTENDED: no answer. */
static int extend(coproc *c, const idem_task *t, const char *value,
                  const char *shown)
{
    int64_t ms, granted = 0;
    if (cli_parse_duration(value, &ms))
        return broke(c, IDEM_EPROTO, "the handler asked for an extension "
                     "that is not a duration such as \"30s\": %s", shown);
    int rc = idem_runner_extend(c->runner, t->index, ms, &granted);
    if (rc) {
        c->store_failed = 1;
        return broke(c, rc, "the store failed while extending a lease; "
                     "stopped the handler");
    }
    c->extended_until = cli_mono_ms() + (granted > c->lease_ms ? granted
                                                           : c->lease_ms);
    return EXTENDED;
}

/* Judge one answer line; 0 and t->answer set, EXTENDED, or an error. */
static int take_answer(coproc *c, idem_task *t, const char *p, size_t n)
{
    answer a = {.task = t, .key_ok = 1, .line = p};
    yajl_handle h = yajl_alloc(&answer_cb, NULL, &a);
    a.h = h;
    int ok = h && yajl_parse(h, (const unsigned char *)p, n) ==
                      yajl_status_ok &&
             yajl_complete_parse(h) == yajl_status_ok && a.top_object;
    if (h)
        yajl_free(h);
    char shown[90];
    snprintf(shown, sizeof shown, "%.*s%s", (int)(n < 80 ? n : 80), p,
             n > 80 ? "..." : "");
    if (!ok)
        return broke(c, IDEM_EPROTO, "the handler wrote a line that is not "
                     "a JSON object: %s", shown);
    char buf[64];
    const char *why = grammar_error(&a, buf, sizeof buf);
    if (why)
        return broke(c, IDEM_EPROTO, "the handler wrote an answer that is "
                     "neither done nor failed (%s; see `idem run --help`): "
                     "%s", why, shown);
    if (a.key_bad_escape)
        return broke(c, IDEM_EPROTO, "the handler's \"key\" holds an escape "
                     "that denotes no character (half a surrogate pair): "
                     "%s", shown);
    if (!a.key_ok)
        return broke(c, IDEM_EPROTO, "the handler answered for another key "
                     "than it was given (out of step?): %s", shown);
    if (a.value[M_EXTEND])
        return extend(c, t, a.extend, shown);
    t->answer = a.value[M_OK]                 ? IDEM_TASK_DONE
                : a.value[M_RETRYABLE] == V_TRUE ? IDEM_TASK_RETRY
                                                 : IDEM_TASK_FAIL;
    t->data = (const void *)(uintptr_t)(p - c->rb.p);  /* fixed up later */
    t->len = n;
    c->answers++;
    return 0;
}

/* Consume complete lines from rb for tasks[*got..n). A line is searched
 * for its end once, however it arrives, and may not grow past
 * answer_max: a handler that writes without end (exec cat /dev/zero)
 * costs neither memory nor time beyond that. A line is an answer only
 * to an envelope written whole: one read before (a line too many after
 * the last batch) would otherwise pass for the next message's answer,
 * and that message would be recorded done without being sent at all. */
static int parse_answers(coproc *c, idem_task *tasks, size_t n, size_t *got)
{
    while (*got < n && c->rpos < c->rb.len) {
        char *s = c->rb.p + c->rpos;
        size_t from = c->scanned > c->rpos ? c->scanned : c->rpos;
        char *nl = memchr(c->rb.p + from, '\n', c->rb.len - from);
        c->scanned = c->rb.len;
        if ((nl ? (size_t)(nl - s) : c->rb.len - c->rpos) > c->answer_max)
            return broke(c, IDEM_EPROTO, "the handler's answer is over "
                         "%llu bytes (--answer-max); killed it",
                         (unsigned long long)c->answer_max);
        if (!nl)
            return 0;
        size_t len = (size_t)(nl - s);
        c->rpos += len + 1;
        c->scanned = c->rpos;
        len -= len && s[len - 1] == '\r';
        if (*got >= c->whole)
            return broke(c, IDEM_EPROTO, "the handler wrote a line before "
                         "it was sent the message it would answer (an "
                         "answer too many, or output of its own on stdout?): "
                         "%.*s%s", (int)(len < 80 ? len : 80), s,
                         len > 80 ? "..." : "");
        int rc = take_answer(c, &tasks[*got], s, len);
        if (rc < 0)
            return rc;
        if (rc != EXTENDED)
            c->extended_until = 0;  /* its message is answered */
        *got += rc != EXTENDED;
    }
    return 0;
}

/* Move bytes both ways once poll says they can; 0 or an error. */
static int pump(coproc *c, size_t *woff, const struct pollfd *pf)
{
    if (pf[0].revents & (POLLOUT | POLLERR | POLLHUP)) {
        ssize_t w = write(c->to, c->wb.p + *woff, c->wb.len - *woff);
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return IDEM_EIO;
        for (ssize_t k = 0; k < w; k++)  /* see parse_answers */
            c->whole += c->wb.p[*woff + (size_t)k] == '\n';
        *woff += w > 0 ? (size_t)w : 0;
    }
    if (pf[1].revents & (POLLIN | POLLERR | POLLHUP)) {
        if (cli_buf_reserve(&c->rb, 65536))
            return IDEM_ENOMEM;
        ssize_t r = read(c->from, c->rb.p + c->rb.len, c->rb.cap - c->rb.len);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            return IDEM_EIO;
        c->rb.len += r > 0 ? (size_t)r : 0;
    }
    return 0;
}

/* Keep only unread answer bytes; earlier ones were handed out. */
static void compact(coproc *c)
{
    if (c->rpos)
        memmove(c->rb.p, c->rb.p + c->rpos, c->rb.len - c->rpos);
    c->rb.len -= c->rpos;
    c->scanned -= c->scanned > c->rpos ? c->rpos : c->scanned;
    c->rpos = 0;
}

/* Answers [fixed, got) point into rb from now on. */
static void fix_answers(coproc *c, idem_task *tasks, size_t got)
{
    for (; c->fixed < got; c->fixed++)
        tasks[c->fixed].data = c->rb.p + (uintptr_t)tasks[c->fixed].data;
}

/* Let the runner renew leases and commit what is answered. */
static int tick(coproc *c, idem_task *tasks, size_t got)
{
    fix_answers(c, tasks, got);
    int rc = idem_runner_tick(c->runner);
    c->store_failed |= rc != 0;
    return rc ? broke(c, rc, "the store failed while the handler worked; "
                      "stopped it") : 0;
}

/* The envelopes in wb[0..woff), the bytes written, the last maybe in
 * part. */
static size_t envelopes_in(const coproc *c, size_t woff)
{
    return c->whole + (woff && c->wb.p[woff - 1] != '\n');
}

/* A stop was asked for: write no further than the end of the envelope
 * being written; how many envelopes the handler then has. */
static size_t last_envelope(coproc *c, size_t woff)
{
    if (woff && c->wb.p[woff - 1] != '\n')
        woff = (size_t)((char *)memchr(c->wb.p + woff, '\n',
                                       c->wb.len - woff) - c->wb.p) + 1;
    c->wb.len = woff;
    return envelopes_in(c, woff);
}

/* Write the envelopes in wb and read their answers; *woff: the bytes
 * of wb written. */
static int exchange(coproc *c, idem_task *tasks, size_t n, size_t *woff)
{
    size_t got = 0, want = n;
    int64_t deadline = cli_mono_ms() + c->lease_ms, grace_end = INT64_MAX;
    int rc = parse_answers(c, tasks, n, &got);
    while (!rc && got < want) {
        if (*c->stop && grace_end == INT64_MAX) {
            want = last_envelope(c, *woff);
            grace_end = cli_mono_ms() + c->grace_ms;
            c->stopped = 1;
            continue;
        }
        struct pollfd pf[2] = {
            {*woff < c->wb.len ? c->to : -1, POLLOUT, 0},
            {c->from, POLLIN, 0}};
        int64_t left = (deadline < grace_end ? deadline : grace_end) -
                       cli_mono_ms();
        if (left <= 0 && c->stopped)
            return broke(c, IDEM_ETIMEOUT, "the handler did not answer "
                         "within --grace %lld ms; killed it",
                         (long long)c->grace_ms);
        if (left <= 0) {
            char key[80];
            snprintf(key, sizeof key, "%.*s",
                     (int)(tasks[got].keylen < 60 ? tasks[got].keylen : 60),
                     (const char *)tasks[got].key);
            return broke(c, IDEM_ETIMEOUT, "the handler gave no answer for "
                         "key '%s' within the lease (--lease %lld ms); "
                         "killed it. Does it flush each answer, and answer "
                         "each line without waiting for the next? (mawk "
                         "needs -W interactive)",
                         key, (long long)c->lease_ms);
        }
        int k = poll(pf, 2, (int)(left < TICK_MS ? left : TICK_MS));
        if (k < 0 && errno != EINTR)
            return broke(c, IDEM_EIO, "poll: %s", strerror(errno));
        size_t before = got;
        rc = k > 0 ? pump(c, woff, pf) : 0;
        if (!rc)
            rc = parse_answers(c, tasks, n, &got);
        if (got > before)
            deadline = cli_mono_ms() + c->lease_ms;
        if (c->extended_until > deadline)
            deadline = c->extended_until;
        c->extended_until = 0;
        int64_t t0 = cli_mono_ms();
        if (!rc)
            rc = tick(c, tasks, got);
        deadline += cli_mono_ms() - t0;
    }
    return !rc && c->stopped ? IDEM_ETIMEOUT : rc;
}

int coproc_handle(void *ctx, idem_task *tasks, size_t n)
{
    coproc *c = ctx;
    c->err[0] = '\0';
    c->wb.len = 0;
    c->fixed = c->sent = c->whole = 0;
    c->fault = 0;
    c->extended_until = 0;
    c->stopped = *c->stop != 0;
    if (c->stopped)
        return IDEM_ETIMEOUT;  /* nothing more is sent */
    compact(c);
    for (size_t i = 0; i < n; i++)
        if (envelope(c, &tasks[i]))
            return broke(c, IDEM_ENOMEM, "out of memory");
    int rc = c->pid ? 0 : start(c);
    size_t woff = 0;
    if (!rc)
        rc = exchange(c, tasks, n, &woff);
    c->sent = envelopes_in(c, woff);
    c->stopped |= *c->stop != 0;  /* e.g. the handler died of the stop */
    int could_not_run = 0;
    if (rc == IDEM_EIO && c->pid) {
        char why[96];
        close(c->to);
        close(c->from);
        int st = reap_closed(c, why, sizeof why);
        could_not_run = st == 126 || st == 127;
        end_group(c);
        c->pid = 0;
        snprintf(c->err, sizeof c->err, "the handler %s before answering "
                 "every message", why);
    }
    c->fault = !c->stopped && !c->store_failed && !could_not_run &&
               (rc == IDEM_EPROTO || rc == IDEM_ETIMEOUT || rc == IDEM_EIO);
    size_t got = c->fixed;
    while (got < n && tasks[got].answer)
        got++;
    fix_answers(c, tasks, got);
    return rc;
}

int coproc_stop(coproc *c, const char *cmdname)
{
    cli_buf_free(&c->wb);
    cli_buf_free(&c->rb);
    if (!c->pid)
        return 0;
    close(c->to);
    int st = 0;
    pid_t r = wait_or_kill(c, *c->stop ? c->grace_ms : c->lease_ms, &st);
    end_group(c);
    close(c->from);
    c->pid = 0;
    if (r != 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    if (r == 0)
        return cli_fail(cmdname, "the handler did not exit within the "
                        "%s after its input ended; killed it",
                        *c->stop ? "grace" : "lease");
    return cli_fail(cmdname, "the handler failed after its input ended "
                    "(%s %d)", WIFEXITED(st) ? "exit status" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}
