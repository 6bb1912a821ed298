/* rconn.c - the redis-stream:// URI and a connection to its server.
 *
 *   redis-stream://[USER:PASSWORD@]HOST[:PORT][/DB]/STREAM?PARAMS
 *
 * The store's redis:// URI has its own parser in the library; this one
 * names a stream and a consumer group, and the two share only the
 * password rules (in the URI, in password_file=, or in the environment
 * variable IDEM_REDIS_PASSWORD) and idem_uri_display() for messages, so
 * that the same password is hidden the same way. docs/streams.md lists
 * the parameters.
 *
 * A connection is made on first use and again after it broke. Reads are
 * sent again on a fresh connection once; a write is not, since it may
 * have been applied: the caller fails the batch, and the next run reads
 * the sink back (rsink.c). It is close-on-exec, as the store's are
 * (src/redis/conn.c says why): the handler must not inherit it. */
#include "rconn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "uriparam.h"

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Percent-decode p[0..n) into a new string; NULL on a bad escape or
 * ENOMEM (*bad tells which). */
char *rs_decode(const char *p, size_t n, size_t *outlen, int *bad)
{
    char *out = malloc(n + 1);
    size_t j = 0;
    *bad = 0;
    for (size_t i = 0; out && i < n; i++) {
        if (p[i] != '%') {
            out[j++] = p[i];
            continue;
        }
        if (i + 2 >= n || hexval(p[i + 1]) < 0 || hexval(p[i + 2]) < 0) {
            free(out);
            *bad = 1;
            return NULL;
        }
        out[j++] = (char)(hexval(p[i + 1]) * 16 + hexval(p[i + 2]));
        i += 2;
    }
    if (out)
        out[j] = 0;
    if (outlen)
        *outlen = j;
    return out;
}

static int bad(const rs_uri *u, const char *cmd, const char *what)
{
    return cli_usage_error(cmd, "%s: %s (redis-stream://[USER:PASSWORD@]"
                           "HOST[:PORT][/DB]/STREAM?group=G...)",
                           u->display, what);
}

/* HOST[:PORT], added to the list. */
static int parse_host(rs_uri *u, const char *cmd, const char *a, size_t n)
{
    const char *colon = memchr(a, ':', n);
    size_t hl = colon ? (size_t)(colon - a) : n;
    unsigned long port = u->sentinel ? 26379 : 6379;
    if (colon) {
        char num[16], *end;
        snprintf(num, sizeof num, "%.*s", (int)(n - hl - 1), colon + 1);
        errno = 0;
        port = strtoul(num, &end, 10);
        if (!*num || *end || errno || port == 0 || port > 65535 ||
            n - hl - 1 >= sizeof num)
            return bad(u, cmd, "a port is not a number from 1 to 65535");
    }
    if (!hl)
        return bad(u, cmd, "a host is empty");
    if (u->nhosts == RS_MAX_HOSTS)
        return bad(u, cmd, "more than 16 hosts");
    char *h = strndup(a, hl);
    if (!h)
        return bad(u, cmd, "out of memory");
    u->hosts[u->nhosts] = h;
    u->ports[u->nhosts++] = (int)port;
    return 0;
}

/* [USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...] */
static int parse_authority(rs_uri *u, const char *cmd, const char *a,
                           size_t n)
{
    const char *at = NULL;
    for (const char *p = a; p < a + n; p++)
        at = *p == '@' ? p : at;
    int badesc = 0;
    if (at) {
        const char *colon = memchr(a, ':', (size_t)(at - a));
        size_t ul = colon ? (size_t)(colon - a) : 0;
        if (ul && !(u->user = rs_decode(a, ul, NULL, &badesc)))
            return bad(u, cmd, badesc ? "bad %-escape in the user"
                                      : "out of memory");
        const char *pw = colon ? colon + 1 : a;
        if (at > pw && !(u->pass = rs_decode(pw, (size_t)(at - pw), NULL,
                                          &badesc)))
            return bad(u, cmd, badesc ? "bad %-escape in the password"
                                      : "out of memory");
        n -= (size_t)(at + 1 - a);
        a = at + 1;
    }
    while (n) {
        size_t one = strcspn(a, ",");
        one = one < n ? one : n;
        int rc = parse_host(u, cmd, a, one);
        if (rc)
            return rc;
        a += one + (one < n);
        n -= one + (one < n);
    }
    return u->nhosts ? 0 : bad(u, cmd, "no host");
}

/* [/DB]/STREAM */
static int parse_path(rs_uri *u, const char *cmd, const char *p, size_t n)
{
    size_t digits = strspn(p, "0123456789");
    if (digits && digits < n && p[digits] == '/') {
        if (digits > 4)
            return bad(u, cmd, "the database number is too large");
        u->db = (int)strtol(p, NULL, 10);
        p += digits + 1;
        n -= digits + 1;
    }
    int badesc;
    if (!n)
        return bad(u, cmd, "no stream name after the host");
    if (!(u->stream = rs_decode(p, n, &u->streamlen, &badesc)))
        return bad(u, cmd, badesc ? "bad %-escape in the stream name"
                                  : "out of memory");
    return 0;
}

static int number(const rs_uri *u, const char *cmd, const char *name,
                  const char *v, size_t n, uint64_t hi, uint64_t *out)
{
    char num[24], *end;
    snprintf(num, sizeof num, "%.*s", (int)n, v);
    errno = 0;
    unsigned long long x = strtoull(num, &end, 10);
    if (!n || n >= sizeof num || *end || errno || x > hi || *num == '-') {
        char what[128];
        snprintf(what, sizeof what, "%s wants a number from 0 to %llu",
                 name, (unsigned long long)hi);
        return bad(u, cmd, what);
    }
    *out = x;
    return 0;
}

char *rs_read_secret(const char *path)
{
    FILE *f = fopen(path, "r");
    char buf[1024];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (!f)
        return NULL;
    fclose(f);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    char *s = strndup(buf, n);
    if (!s)
        errno = ENOMEM;
    return s;
}

static int read_password_file(rs_uri *u, const char *cmd, const char *path)
{
    free(u->pass);
    if (!(u->pass = rs_read_secret(path)))
        return cli_usage_error(cmd, "%s: password_file %s: %s", u->display,
                               path, strerror(errno));
    return 0;
}

/* One NAME=VALUE of the query. */
static int parse_param(rs_uri *u, const char *cmd, int sink, const char *p,
                       size_t n, char **pwfile)
{
    uri_param q;
    uri_param_split(p, n, &q);
    const char *name = q.name, *v = q.v;
    size_t nl = q.namelen, vl = q.vl;
    uint64_t x;
    int rc = -2;
    if (!strcmp(name, "group") && !sink)
        rc = uri_param_take(&u->group, v, vl);
    else if (!strcmp(name, "consumer") && !sink)
        rc = uri_param_take(&u->consumer, v, vl);
    else if (!strcmp(name, "start") && !sink)
        rc = uri_param_take(&u->start, v, vl);
    else if (!strcmp(name, "password_file"))
        rc = uri_param_take(pwfile, v, vl);
    else if (!strcmp(name, "sentinel"))
        rc = uri_param_take(&u->sentinel, v, vl);
    else if (!strcmp(name, "maxlen") && sink)
        return number(u, cmd, name, v + (vl && *v == '~'),
                      vl - (vl && *v == '~'), UINT64_MAX / 2, &u->maxlen);
    else if (!strcmp(name, "wait") && sink)
        return number(u, cmd, name, v, vl, 100, &u->wait);
    else if (!strcmp(name, "one_script"))
        return number(u, cmd, name, v, vl, 1, &u->one_script);
    else if (!strcmp(name, "timeout_ms") || !strcmp(name, "readback_ms")) {
        int64_t *dst = *name == 't' ? &u->timeout_ms : &u->readback_ms;
        if (number(u, cmd, name, v, vl, 86400000, &x))
            return 2;
        if (!x)
            return bad(u, cmd, "timeout_ms and readback_ms are at least 1");
        *dst = (int64_t)x;
        return 0;
    }
    if (rc == -1)
        return bad(u, cmd, "bad %-escape in a parameter, or out of memory");
    if (rc == 0)
        return 0;
    char what[160];
    snprintf(what, sizeof what, "unknown parameter '%.*s' for a stream %s",
             (int)(nl < 60 ? nl : 60), p, sink ? "sink (--to)"
                                               : "source (--from)");
    return bad(u, cmd, what);
}

static int parse_query(rs_uri *u, const char *cmd, int sink, const char *q)
{
    int rc = 0;
    while (!rc && q && *q) {
        size_t n = strcspn(q, "&");
        if (n)
            rc = parse_param(u, cmd, sink, q, n, &u->pwfile);
        q += n + (q[n] == '&');
    }
    return rc;
}

/* The password: in the URI, from password_file=, or from the
 * environment, as for redis:// stores. */
static int password(rs_uri *u, const char *cmd)
{
    if (u->pwfile && u->pass)
        return bad(u, cmd, "a password in the URI and a password_file: "
                   "give one");
    if (u->pwfile)
        return read_password_file(u, cmd, u->pwfile);
    const char *env = getenv("IDEM_REDIS_PASSWORD");
    if (!u->pass && env && *env && !(u->pass = strdup(env)))
        return bad(u, cmd, "out of memory");
    return 0;
}

static int defaults(rs_uri *u, const char *cmd, int sink)
{
    if (!sink && !u->group)
        return bad(u, cmd, "a source names its consumer group: ?group=NAME");
    if (!sink && !u->consumer) {
        char host[256];
        if (gethostname(host, sizeof host) != 0)
            snprintf(host, sizeof host, "idem");
        host[sizeof host - 1] = 0;
        if (!(u->consumer = strdup(host)))
            return bad(u, cmd, "out of memory");
    }
    if (!sink && !u->start && !(u->start = strdup("0")))
        return bad(u, cmd, "out of memory");
    if (!sink && strcmp(u->start, "0") && strcmp(u->start, "$") &&
        rs_id_parse(u->start, strlen(u->start), &(uint64_t){0},
                    &(uint64_t){0}))
        return bad(u, cmd, "start is 0 (the whole stream), $ (new entries "
                   "only) or an entry ID");
    if (!u->timeout_ms)
        u->timeout_ms = 5000;
    return 0;
}

int rs_uri_parse(const char *cmd, const char *uri, int sink, rs_uri *u)
{
    memset(u, 0, sizeof *u);
    u->one_script = 1;
    idem_uri_display(uri, u->display, sizeof u->display);
    if (strncmp(uri, "redis-stream://", 15))
        return bad(u, cmd, "not a redis-stream:// URI");
    const char *a = uri + 15, *q = strchr(a, '?');
    size_t upto = q ? (size_t)(q - a) : strlen(a);
    const char *slash = memchr(a, '/', upto);
    if (!slash)
        return bad(u, cmd, "no stream name after the host");
    int rc = parse_query(u, cmd, sink, q ? q + 1 : NULL);
    rc = rc ? rc : parse_authority(u, cmd, a, (size_t)(slash - a));
    rc = rc ? rc : parse_path(u, cmd, slash + 1,
                              upto - (size_t)(slash + 1 - a));
    rc = rc ? rc : password(u, cmd);
    return rc ? rc : defaults(u, cmd, sink);
}

void rs_uri_free(rs_uri *u)
{
    for (size_t i = 0; i < u->nhosts; i++)
        free(u->hosts[i]);
    free(u->sentinel);
    free(u->pwfile);
    free(u->user);
    free(u->pass);
    free(u->stream);
    free(u->group);
    free(u->consumer);
    free(u->start);
    memset(u, 0, sizeof *u);
}

/* Text appended to buf (size bytes) at *k; it stops at the end. */
static void append(char *buf, size_t size, size_t *k, const char *text)
{
    int n = *k < size ? snprintf(buf + *k, size - *k, "%s", text) : 0;
    *k += n > 0 ? (size_t)n : 0;
    *k = *k < size ? *k : size;
}

/* p[0..n) appended with %XX for bytes that are not printable ASCII or
 * that separate the parts of an identity. */
static void append_encoded(char *buf, size_t size, size_t *k, const char *p,
                           size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char one[4] = {(char)c, 0};
        if (c <= 0x20 || c >= 0x7f || strchr("%?&#/,:", c))
            snprintf(one, sizeof one, "%%%02X", c);
        append(buf, size, k, one);
    }
}

void rs_uri_ident(const rs_uri *u, int worker, char *buf, size_t size)
{
    size_t k = 0;
    char num[16];
    append(buf, size, &k, "redis-stream://");
    for (size_t i = 0; i < u->nhosts; i++) {
        append(buf, size, &k, i ? "," : "");
        append_encoded(buf, size, &k, u->hosts[i], strlen(u->hosts[i]));
        snprintf(num, sizeof num, ":%d", u->ports[i]);
        append(buf, size, &k, num);
    }
    snprintf(num, sizeof num, "/%d/", u->db);
    append(buf, size, &k, num);
    append_encoded(buf, size, &k, u->stream, u->streamlen);
    if (u->sentinel) {
        append(buf, size, &k, "?sentinel=");
        append_encoded(buf, size, &k, u->sentinel, strlen(u->sentinel));
    }
    if (!worker)
        return;
    append(buf, size, &k, u->sentinel ? "&group=" : "?group=");
    append_encoded(buf, size, &k, u->group, strlen(u->group));
    append(buf, size, &k, "&consumer=");
    append_encoded(buf, size, &k, u->consumer, strlen(u->consumer));
}

int rs_on_store(const rs_uri *u, idem_store *s)
{
    char host[256];
    int port, db;
    if (!u->one_script || u->sentinel || u->nhosts != 1 ||
        idem_store_server(s, host, sizeof host, &port, &db) != 0)
        return 0;
    return strcasecmp(host, u->hosts[0]) == 0 && port == u->ports[0] &&
           db == u->db;
}

int rs_id_parse(const char *s, size_t n, uint64_t *ms, uint64_t *seq)
{
    char buf[48], *end;
    if (!n || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    if (!strchr("0123456789", buf[0]))
        return -1;
    errno = 0;
    *ms = strtoull(buf, &end, 10);
    *seq = 0;
    if (*end == '-' && strchr("0123456789", end[1]) && end[1])
        *seq = strtoull(end + 1, &end, 10);
    return *end || errno ? -1 : 0;
}

/* v's decimal digits at p; past them. */
static char *put_u64(char *p, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n)
        *p++ = tmp[--n];
    return p;
}

size_t rs_id_format(char buf[RS_ID_MAX], uint64_t ms, uint64_t seq)
{
    char *p = put_u64(buf, ms);
    *p++ = '-';
    p = put_u64(p, seq);
    *p = 0;
    return (size_t)(p - buf);
}

/* ---- replies in an arena (rs_arena) */

#define ARENA_BLOCK (256u << 10)

void rs_arena_free(rs_arena *a)
{
    for (size_t i = 0; a && i < a->n; i++)
        free(a->blk[i]);
    if (a) {
        free(a->blk);
        free(a->cap);
        *a = (rs_arena){0};
    }
}

/* Room for one more block of at least n bytes. 0 or -1. */
static int arena_grow(rs_arena *a, size_t n)
{
    size_t size = n > ARENA_BLOCK ? n : ARENA_BLOCK;
    char **b = realloc(a->blk, (a->n + 1) * sizeof *b);
    if (b)
        a->blk = b;
    size_t *c = b ? realloc(a->cap, (a->n + 1) * sizeof *c) : NULL;
    if (c)
        a->cap = c;
    char *p = c ? malloc(size) : NULL;
    if (!p)
        return -1;
    a->blk[a->n] = p;
    a->cap[a->n++] = size;
    return 0;
}

/* n zeroed bytes that stay put until the arena starts over; NULL when
 * out of memory (hiredis then fails the read). */
static void *arena_get(rs_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    while (a->at < a->n && a->used + n > a->cap[a->at]) {
        a->at++;
        a->used = 0;
    }
    if (a->at == a->n && arena_grow(a, n))
        return NULL;
    void *p = a->blk[a->at] + a->used;
    a->used += n;
    return memset(p, 0, n);
}

/* A new element of that type, in its parent's array; a reply's first
 * element (no parent) starts the arena over: the reply before it is let
 * go by then. */
static redisReply *arena_reply(const redisReadTask *t, int type,
                               size_t extra)
{
    rs_arena *a = t->privdata;
    if (!t->parent)
        a->at = a->used = 0;
    redisReply *r = arena_get(a, sizeof *r + extra);
    if (!r)
        return NULL;
    r->type = type;
    if (t->parent)
        ((redisReply *)t->parent->obj)->element[t->idx] = r;
    return r;
}

static void *arena_string(const redisReadTask *t, char *str, size_t len)
{
    redisReply *r = arena_reply(t, t->type, len + 1);
    if (r) {
        r->str = (char *)(r + 1);
        memcpy(r->str, str, len);
        r->len = len;
    }
    return r;
}

static void *arena_array(const redisReadTask *t, int n)
{
    size_t count = n > 0 ? (size_t)n : 0;
    redisReply *r = arena_reply(t, t->type, count * sizeof(redisReply *));
    if (r) {
        r->element = count ? (redisReply **)(r + 1) : NULL;
        r->elements = count;
    }
    return r;
}

static void *arena_integer(const redisReadTask *t, long long v)
{
    redisReply *r = arena_reply(t, REDIS_REPLY_INTEGER, 0);
    if (r)
        r->integer = v;
    return r;
}

/* Of a nil bulk ($-1) or a nil array (*-1): t->type says which. */
static void *arena_nil(const redisReadTask *t)
{
    return arena_reply(t, REDIS_REPLY_NIL, 0);
}

static void arena_let_go(void *reply)
{
    (void)reply;  /* the arena's memory is reused by the next reply */
}

/* Not const: hiredis's reader holds a pointer that is not. */
static redisReplyObjectFunctions arena_fns = {
    arena_string, arena_array, arena_integer, arena_nil, arena_let_go};

void rs_reply_free(const rs_conn *c, redisReply *r)
{
    if (r && !c->arena)
        freeReplyObject(r);
}

void rs_conn_close(rs_conn *c)
{
    if (c->c)
        redisFree(c->c);
    c->c = NULL;
    c->limit_ms = 0;
}

/* The socket's time limit, set only when it changes: two system calls
 * per command otherwise, a quarter of a pipeline's CPU. */
static void set_limit(rs_conn *c, int64_t ms)
{
    if (c->limit_ms == ms)
        return;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    redisSetTimeout(c->c, tv);
    c->limit_ms = ms;
}

/* A setup command on a fresh connection: its failure is the
 * connection's. */
static int setup_call(rs_conn *c, int argc, const char **argv)
{
    redisReply *r = redisCommandArgv(c->c, argc, argv, NULL);
    int ok = r && r->type != REDIS_REPLY_ERROR;
    snprintf(c->err, sizeof c->err, "%.400s: %.100s: %.400s",
             c->u->display, argv[0], r ? r->str : c->c->errstr);
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

/* Connect to host:port, AUTH and SELECT. 0 or -1 with c->err set. */
static int open_node(rs_conn *c, const char *host, int port)
{
    const rs_uri *u = c->u;
    struct timeval tv = {(time_t)(u->timeout_ms / 1000),
                         (suseconds_t)(u->timeout_ms % 1000) * 1000};
    c->c = redisConnectWithTimeout(host, port, tv);
    if (c->c && !c->c->err && fcntl(c->c->fd, F_SETFD, FD_CLOEXEC)) {
        c->c->err = REDIS_ERR_IO;
        snprintf(c->c->errstr, sizeof c->c->errstr, "fcntl: %s",
                 strerror(errno));
    }
    if (!c->c || c->c->err) {
        snprintf(c->err, sizeof c->err, "%.400s: cannot connect to "
                 "%.256s:%d: %.300s", u->display, host, port,
                 c->c ? c->c->errstr : "out of memory");
        rs_conn_close(c);
        return -1;
    }
    set_limit(c, u->timeout_ms);
    /* The reader keeps its buffer between replies (hiredis frees one past
     * 16 KiB when emptied): a batch's reply is grown again from nothing
     * otherwise, every batch. It stays as large as the largest reply. */
    c->c->reader->maxbuf = 0;
    char db[16];
    snprintf(db, sizeof db, "%d", u->db);
    const char *auth[3] = {"AUTH", u->user ? u->user : u->pass, u->pass};
    const char *sel[2] = {"SELECT", db};
    if ((u->pass && setup_call(c, u->user ? 3 : 2, auth)) ||
        (u->db && setup_call(c, 2, sel))) {
        rs_conn_close(c);
        return -1;
    }
    return 0;
}

/* The master's address, from the first sentinel that knows it. */
static int ask_sentinels(rs_conn *c, char host[256], int *port)
{
    const rs_uri *u = c->u;
    struct timeval tv = {(time_t)(u->timeout_ms / 1000),
                         (suseconds_t)(u->timeout_ms % 1000) * 1000};
    const char *argv[] = {"SENTINEL", "get-master-addr-by-name",
                          u->sentinel};
    snprintf(c->err, sizeof c->err, "%.400s: no sentinel answered",
             u->display);
    for (size_t i = 0; i < u->nhosts; i++) {
        redisContext *sc = redisConnectWithTimeout(u->hosts[i], u->ports[i],
                                                   tv);
        redisReply *r = sc && !sc->err
                            ? redisCommandArgv(sc, 3, argv, NULL) : NULL;
        int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2;
        if (ok) {
            snprintf(host, 256, "%s", r->element[0]->str);
            *port = (int)strtol(r->element[1]->str, NULL, 10);
        } else if (r) {
            snprintf(c->err, sizeof c->err, "%.400s: sentinel %.256s:%d "
                     "does not know master '%.100s'", u->display,
                     u->hosts[i], u->ports[i], u->sentinel);
        }
        if (r)
            freeReplyObject(r);
        if (sc)
            redisFree(sc);
        if (ok)
            return 0;
    }
    return -1;
}

/* Is the node a master (ROLE)? A sentinel's answer may be stale. */
static int is_master(rs_conn *c)
{
    const char *argv[] = {"ROLE"};
    redisReply *r = redisCommandArgv(c->c, 1, argv, NULL);
    int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements &&
             r->element[0]->type == REDIS_REPLY_STRING &&
             !strcmp(r->element[0]->str, "master");
    if (r)
        freeReplyObject(r);
    if (!ok)
        snprintf(c->err, sizeof c->err, "%.400s: the node the sentinels "
                 "name for '%.100s' is not a master (yet)", c->u->display,
                 c->u->sentinel);
    return ok;
}

/* Connect: to the node a redirect named, else the master the sentinels
 * name, else the URI's hosts in turn. 0 or -1 with c->err set. */
static int connect_node(rs_conn *c)
{
    const rs_uri *u = c->u;
    if (c->host[0] && !open_node(c, c->host, c->port))
        return 0;
    c->host[0] = 0;  /* a redirect's node is gone: back to the URI's */
    if (u->sentinel) {
        char host[256];
        int port;
        if (ask_sentinels(c, host, &port) || open_node(c, host, port))
            return -1;
        if (is_master(c))
            return 0;
        rs_conn_close(c);
        return -1;
    }
    for (size_t i = 0; i < u->nhosts; i++)
        if (!open_node(c, u->hosts[i], u->ports[i]))
            return 0;
    return -1;
}

/* Connect as connect_node(); then the replies go to c's arena, if it
 * has one (the calls made while connecting free theirs as hiredis's). */
static int connect_now(rs_conn *c)
{
    if (connect_node(c))
        return -1;
    if (c->arena) {
        c->c->reader->fn = &arena_fns;
        c->c->reader->privdata = c->arena;
    }
    return 0;
}

int rs_server_ms(rs_conn *c, uint64_t *ms)
{
    const char *argv[] = {"TIME"};
    redisReply *r = rs_call(c, 1, argv, NULL, 0, 1);
    int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
             r->element[0]->type == REDIS_REPLY_STRING &&
             r->element[1]->type == REDIS_REPLY_STRING;
    if (ok)
        *ms = strtoull(r->element[0]->str, NULL, 10) * 1000 +
              strtoull(r->element[1]->str, NULL, 10) / 1000;
    else if (r)
        snprintf(c->err, sizeof c->err, "TIME: %s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    rs_reply_free(c, r);
    return ok ? 0 : -1;
}

int rs_conn_ready(rs_conn *c)
{
    if (!c->c && connect_now(c))
        return -1;
    set_limit(c, c->u->timeout_ms);
    return 0;
}

/* A cluster's "MOVED SLOT HOST:PORT": remember the node. 1 if it was. */
static int moved(rs_conn *c, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ERROR || strncmp(r->str, "MOVED ", 6))
        return 0;
    const char *addr = strchr(r->str + 6, ' ');
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || colon - addr - 1 >= (long)sizeof c->host)
        return 0;
    snprintf(c->host, sizeof c->host, "%.*s", (int)(colon - addr - 1),
             addr + 1);
    c->port = (int)strtol(colon + 1, NULL, 10);
    rs_conn_close(c);
    return 1;
}

/* Replies after which the same command succeeds soon: a slot in
 * migration (ASK, TRYAGAIN), a failover (READONLY from a demoted master,
 * MASTERDOWN, CLUSTERDOWN), a restart (LOADING). The command was not
 * applied, so sending it again is safe, a write too. */
static int transient(const redisReply *r)
{
    static const char *const codes[] = {"ASK ", "TRYAGAIN", "READONLY",
                                        "MASTERDOWN", "CLUSTERDOWN",
                                        "LOADING", NULL};
    for (int i = 0; r->type == REDIS_REPLY_ERROR && codes[i]; i++)
        if (!strncmp(r->str, codes[i], strlen(codes[i])))
            return 1;
    return 0;
}


static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

const char *rs_conn_why(const rs_conn *c)
{
    if (!c->c)
        return "connection lost";
    return c->c->err == REDIS_ERR_IO && (errno == EAGAIN ||
                                         errno == EWOULDBLOCK)
               ? "no answer within timeout_ms"
           : c->c->errstr[0] ? c->c->errstr
                             : "connection lost";
}

redisReply *rs_call(rs_conn *c, int argc, const char **argv,
                    const size_t *lens, int64_t extra_ms, int retry)
{
    int64_t until = cli_mono_ms() + c->u->timeout_ms;
    int lost = 0;
    for (;;) {
        if (!c->c && connect_now(c)) {
            if (cli_mono_ms() >= until)
                return NULL;  /* nothing was sent: safe to go on trying */
            pause_ms(200);
            continue;
        }
        set_limit(c, c->u->timeout_ms + extra_ms);
        redisReply *r = redisCommandArgv(c->c, argc, argv, lens);
        if (!r) {
            snprintf(c->err, sizeof c->err, "%.400s: %.100s: %.400s",
                     c->u->display, argv[0], rs_conn_why(c));
            rs_conn_close(c);
            if (!retry || lost++)
                return NULL;
            continue;
        }
        int redirect = moved(c, r), again = !redirect && transient(r);
        if ((!redirect && !again) || cli_mono_ms() >= until)
            return r;  /* an answer, or the error of the last try */
        rs_reply_free(c, r);
        if (again) {
            rs_conn_close(c);  /* a failover may have moved the master */
            pause_ms(100);
        }
    }
}
