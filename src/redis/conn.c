/* redis/conn.c - one connection to one Redis node.
 *
 * hiredis does the protocol; this file adds what a library needs around
 * it: every blocking step has a time limit (a dead server must turn into
 * an error, never a hang), credentials and database are applied on every
 * (re)connect (a sentinel gets its own credentials and no database),
 * and a write to a socket the server closed cannot kill the process.
 * hiredis writes with write(2), which raises SIGPIPE on a closed socket;
 * a library may not change the process's signal dispositions, so the
 * caller blocks SIGPIPE in its own thread around the I/O and drops a
 * SIGPIPE that the I/O itself raised (idem__nosigpipe_begin/end).
 *
 * A connection is close-on-exec: it is authenticated, and a program the
 * caller starts (the handler of `idem run`) must not inherit it: it
 * could send any command as us (CONFIG GET requirepass tells the
 * password) and its bytes would break our replies' order. hiredis 0.14
 * cannot ask socket(2) for SOCK_CLOEXEC, so the flag is set right after
 * the connect, before any credentials are sent. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redis.h"

static struct timeval idem__tv(int64_t ms)
{
    if (ms < 1)
        ms = 1;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

void idem__nosigpipe_begin(idem__sigstate *st)
{
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigemptyset(&pending);
    sigpending(&pending);
    st->was_pending = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &st->old);
}

void idem__nosigpipe_end(idem__sigstate *st)
{
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigemptyset(&pending);
    sigpending(&pending);
    if (!st->was_pending && sigismember(&pending, SIGPIPE) == 1) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &st->old, NULL);
}

void idem__rconn_close(idem__rconn *conn)
{
    if (conn->c)
        redisFree(conn->c);
    conn->c = NULL;
    conn->loaded = 0;
    conn->wrote = 0;
    conn->nin = 0;
}

void idem__rconn_deadline(idem__rconn *conn, int64_t ms)
{
    conn->limit_ms = ms < 1 ? 1 : ms;
    if (conn->c)
        redisSetTimeout(conn->c, idem__tv(ms));
}

int idem__rconn_timed_out(const idem__rconn *conn)
{
    return conn->c && conn->c->err == REDIS_ERR_IO &&
           (strstr(conn->c->errstr, "temporarily unavailable") ||
            strstr(conn->c->errstr, "timed out"));
}

const char *idem__rconn_why(const idem__rconn *conn, char *buf, size_t n)
{
    if (idem__rconn_timed_out(conn))
        snprintf(buf, n, "no answer within %lld ms (timeout_ms)",
                 (long long)conn->limit_ms);
    else
        snprintf(buf, n, "%s", conn->c && conn->c->errstr[0]
                                   ? conn->c->errstr : "connection lost");
    return buf;
}

int idem__rconn_flush(idem__rconn *conn)
{
    int done = 0;
    do {
        if (redisBufferWrite(conn->c, &done) != REDIS_OK)
            return -1;
    } while (!done);
    return 0;
}

int idem__rconn_expect(idem__rconn *conn, int kind, size_t cmd)
{
    idem__inflight *in = idem__grow(conn->in, conn->nin, &conn->capin,
                                    sizeof *in, 64);
    if (!in)
        return IDEM_ENOMEM;
    conn->in = in;
    conn->in[conn->nin].kind = kind;
    conn->in[conn->nin].cmd = cmd;
    conn->nin++;
    return 0;
}

/* Is this error reply a refusal of the credentials? */
static int idem__is_auth_error(const redisReply *rep)
{
    return rep->type == REDIS_REPLY_ERROR &&
           (strncmp(rep->str, "WRONGPASS", 9) == 0 ||
            strncmp(rep->str, "NOAUTH", 6) == 0 ||
            strstr(rep->str, "invalid password") ||
            strstr(rep->str, "without any password") ||
            strstr(rep->str, "invalid username"));
}

redisReply *idem__rconn_command(idem_store *s, idem__rconn *conn, int argc,
                                const char **argv, const size_t *lens,
                                int *code)
{
    redisReply *rep = redisCommandArgv(conn->c, argc, argv, lens);
    if (!rep) {
        char why[96];
        *code = idem__rconn_timed_out(conn) ? IDEM_ETIMEOUT : IDEM_ECONN;
        idem__fail(s, *code, "%s: %s: %s", s->uri, argv[0],
                   idem__rconn_why(conn, why, sizeof why));
        idem__rconn_close(conn);
        return NULL;
    }
    if (idem__is_auth_error(rep)) {
        *code = IDEM_EAUTH;
        idem__fail(s, IDEM_EAUTH, "%s: the server refused the credentials: "
                   "%s", s->uri, rep->str);
        freeReplyObject(rep);
        return NULL;
    }
    *code = 0;
    return rep;
}

/* AUTH with the node's credentials (a sentinel's are its own). */
static int idem__rconn_auth(idem_store *s, const idem__redis *r,
                            const idem__rnode *node, idem__rconn *conn)
{
    const char *user = node->sentinel ? r->cfg.sentinel_user : r->cfg.user;
    const char *pass = node->sentinel ? r->cfg.sentinel_pass : r->cfg.pass;
    if (!pass)
        return 0;
    const char *argv[3] = {"AUTH"};
    size_t lens[3] = {4};
    int argc = 1, code = 0;
    if (user) {
        argv[argc] = user;
        lens[argc++] = strlen(user);
    }
    argv[argc] = pass;
    lens[argc++] = strlen(pass);
    redisReply *rep = idem__rconn_command(s, conn, argc, argv, lens, &code);
    if (rep && rep->type == REDIS_REPLY_ERROR) {
        code = IDEM_EAUTH;
        idem__fail(s, code, "%s: AUTH failed: %s", s->uri, rep->str);
    }
    freeReplyObject(rep);
    return code;
}

/* SELECT the URI's database (a sentinel has none). */
static int idem__rconn_select(idem_store *s, const idem__redis *r,
                              const idem__rnode *node, idem__rconn *conn)
{
    if (!r->cfg.db || node->sentinel)
        return 0;
    char db[16];
    size_t n = (size_t)snprintf(db, sizeof db, "%d", r->cfg.db);
    const char *argv[2] = {"SELECT", db};
    size_t lens[2] = {6, n};
    int code = 0;
    redisReply *rep = idem__rconn_command(s, conn, 2, argv, lens, &code);
    if (rep && rep->type == REDIS_REPLY_ERROR) {
        code = IDEM_EINVAL;
        idem__fail(s, code, "%s: SELECT %s: %s", s->uri, db, rep->str);
    }
    freeReplyObject(rep);
    return code;
}

int idem__rconn_open(idem_store *s, idem__redis *r, idem__rnode *node,
                     idem__rconn *conn, int64_t ms)
{
    idem__rconn_close(conn);
    redisContext *c = redisConnectWithTimeout(node->host, node->port,
                                              idem__tv(ms));
    if (!c)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    if (c->err) {
        int code = strstr(c->errstr, "timed out") ? IDEM_ETIMEOUT
                                                  : IDEM_ECONN;
        idem__fail(s, code, "%s: cannot connect to %s:%d: %s", s->uri,
                   node->host, node->port, c->errstr);
        redisFree(c);
        return code;
    }
    conn->c = c;
    idem__rconn_deadline(conn, ms);
    int code = fcntl(c->fd, F_SETFD, FD_CLOEXEC)
                   ? idem__fail(s, IDEM_ECONN, "%s: fcntl: %s", s->uri,
                                strerror(errno))
                   : idem__rconn_auth(s, r, node, conn);
    if (!code)
        code = idem__rconn_select(s, r, node, conn);
    if (code)
        idem__rconn_close(conn);
    return code;
}
