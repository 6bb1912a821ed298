/* redis/uri.c - redis://, redis-cluster:// and redis-sentinel:// URIs
 * into settings.
 *
 *   redis://[[user]:password@]host[:port][/db][?param=value&...]
 *   redis-cluster://[[user]:password@]host:port[,host:port...][?...]
 *   redis-sentinel://[[user]:password@]host:port[,host:port...]/master[?...]
 *
 * Parameters: timeout_ms, connect_timeout_ms, prefix, pool, wait, db,
 * password_file, the layout of the records: layout=hash (one hash per
 * key, the default) or layout=day with days and shards (buckets per day
 * and shard), and the sentinels' own credentials (sentinel_user,
 * sentinel_password, sentinel_password_file). Each is a row of one table
 * (idem__rparams), docs/uri.md the manual of all. The three forms share
 * the table and the parser: a sentinel URI differs only in what its
 * hosts are (the sentinels, default port 26379) and in its path (the
 * master's name instead of a database).
 *
 * The URI is the whole configuration of a Redis store, so that every
 * tool that takes --store reaches every setting without flags of its own.
 * User, password and prefix may be percent-encoded (a password with '@'
 * or ':' in it). Anything not understood is an error that names it: a
 * misspelt "timout_ms" silently ignored would be a store that hangs for
 * the default time instead of the one asked for.
 *
 * A password in the URI is visible to every local user through ps, so it
 * may come from a file (password_file=PATH, readable by its owner and
 * group only) or from $IDEM_REDIS_PASSWORD instead. Whatever the source,
 * it is never shown: idem_uri_display() renders a URI with its passwords
 * hidden (the userinfo's, and any parameter named *password), and that
 * rendering is all a handle keeps for its messages. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "redis.h"

#define IDEM__RDEFAULT_PORT 6379
#define IDEM__SDEFAULT_PORT 26379  /* a sentinel's */
#define IDEM__RDEFAULT_PREFIX "idempotency:"
#define IDEM__PASSWORD_MAX 65536  /* bytes read from a password_file */
#define IDEM__HIDDEN "***"        /* what a password is shown as */

/* Where the userinfo of a URI's authority auth[0..len) ends: its last
 * '@', so that passwords may hold a raw '@' too; NULL when there is
 * none. The parser and idem_uri_display() both ask this, so whatever
 * the parser takes for a password is what the display hides. */
static const char *idem__userinfo_end(const char *auth, size_t len)
{
    const char *at = NULL;
    for (const char *p = auth; p < auth + len; p++)
        if (*p == '@')
            at = p;
    return at;
}

/* The authority of uri: past "SCHEME:" and any '/' after it (so that a
 * malformed "redis:/:pw@host" hides its password too), up to the first
 * '?'; NULL for local: and mem:, whose text holds no password. */
static const char *idem__authority(const char *uri, size_t *len)
{
    size_t scheme = strspn(uri, "abcdefghijklmnopqrstuvwxyz"
                                "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.");
    if (uri[scheme] != ':' || (scheme == 5 && !strncmp(uri, "local", 5)) ||
        (scheme == 3 && !strncmp(uri, "mem", 3)))
        return NULL;
    const char *auth = uri + scheme + 1;
    auth += strspn(auth, "/");
    *len = strcspn(auth, "?");
    return auth;
}

/* A rendering into buf[0..size), cut short like snprintf; len counts
 * every byte, written or not. */
typedef struct idem__shown {
    char *buf;
    size_t size, len;
} idem__shown;

static void idem__show(idem__shown *o, const char *p, size_t n)
{
    if (o->size && o->len < o->size - 1) {
        size_t room = o->size - 1 - o->len;
        memcpy(o->buf + o->len, p, n < room ? n : room);
    }
    o->len += n;
}

/* The query q[0..n) with the value of every parameter whose name ends
 * in "password" (sentinel_password=) hidden, in any case: PASSWORD= is
 * refused as unknown, and the refusal showed the URI. A *_file
 * parameter names a path, which is no secret. */
static void idem__show_query(idem__shown *o, const char *q, size_t n)
{
    static const char word[] = "password";
    const size_t wl = sizeof word - 1;
    for (const char *p = q; p < q + n;) {
        const char *amp = memchr(p, '&', (size_t)(q + n - p));
        size_t len = amp ? (size_t)(amp + 1 - p) : (size_t)(q + n - p);
        const char *eq = memchr(p, '=', len);
        size_t klen = eq ? (size_t)(eq - p) : 0;
        if (eq && klen >= wl && strncasecmp(eq - wl, word, wl) == 0) {
            idem__show(o, p, klen + 1);
            idem__show(o, IDEM__HIDDEN, strlen(IDEM__HIDDEN));
            if (amp)
                idem__show(o, "&", 1);
        } else {
            idem__show(o, p, len);
        }
        p += len;
    }
}

size_t idem_uri_display(const char *uri, char *buf, size_t size)
{
    idem__shown o = {buf, size, 0};
    size_t len = 0;
    uri = uri && *uri ? uri : IDEM_DEFAULT_URI;
    const char *auth = idem__authority(uri, &len);
    const char *at = auth ? idem__userinfo_end(auth, len) : NULL;
    if (auth && !at) {
        /* A password with a raw '?' ends the authority early, and the
         * parser refuses the URI: "USER:PA?SS@HOST" before the first '/'
         * is still hidden as a password, not shown in the refusal. An
         * '@' after "NAME=" is a parameter's ("?prefix=a@b"). */
        at = idem__userinfo_end(auth, strcspn(auth, "/"));
        at = at && strcspn(auth, "=&") > (size_t)(at - auth) ? at : NULL;
        len = at ? (size_t)(at - auth) + strcspn(at, "?") : len;
    }
    const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    /* "USER:PASSWORD@" keeps USER, "PASSWORD@" is a password alone; an
     * empty password ("USER:@") hides nothing. */
    const char *secret = colon ? colon + 1 : auth;
    if (at && secret < at) {
        idem__show(&o, uri, (size_t)(secret - uri));
        idem__show(&o, IDEM__HIDDEN, strlen(IDEM__HIDDEN));
        idem__show(&o, at, (size_t)(auth + len - at));
    } else {
        idem__show(&o, uri, auth ? (size_t)(auth + len - uri) : strlen(uri));
    }
    if (auth && auth[len] == '?')
        idem__show_query(&o, auth + len, strlen(auth + len));
    if (size)
        buf[o.len < size ? o.len : size - 1] = '\0';
    return o.len;
}

/* Percent-decode p[0..n) into a new NUL-terminated string; *outlen gets
 * its length (it may hold NULs). NULL on ENOMEM or a bad escape
 * (*bad set). */
static char *idem__pct_decode(const char *p, size_t n, size_t *outlen,
                              int *bad)
{
    char *out = malloc(n + 1);
    size_t j = 0;
    *bad = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '%') {
            if (i + 2 >= n || idem__hexval(p[i + 1]) < 0 ||
                idem__hexval(p[i + 2]) < 0) {
                free(out);
                *bad = 1;
                return NULL;
            }
            out[j++] = (char)(idem__hexval(p[i + 1]) * 16 +
                              idem__hexval(p[i + 2]));
            i += 2;
        } else {
            out[j++] = p[i];
        }
    }
    out[j] = '\0';
    if (outlen)
        *outlen = j;
    return out;
}

/* A decimal number in [lo, hi] spelled by p[0..n). */
static int idem__parse_num(const char *p, size_t n, long long lo,
                           long long hi, long long *out)
{
    char buf[32];
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (buf[i] < '0' || buf[i] > '9')
            return -1;
    errno = 0;
    long long v = strtoll(buf, NULL, 10);
    if (errno || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int idem__oom(idem_store *s)
{
    return idem__fail(s, IDEM_ENOMEM, "out of memory");
}

/* Split host[:port] p[0..n) (IPv6 in brackets) into *host, *hostlen and
 * *port, which keeps its default when no port is given. */
static int idem__split_host(idem_store *s, const char *p, size_t n,
                            const char **host, size_t *hostlen,
                            long long *port)
{
    const char *colon = NULL;
    *host = p;
    if (n && p[0] == '[') {
        const char *close = memchr(p, ']', n);
        if (!close)
            return idem__fail(s, IDEM_EINVAL, "%s: unclosed '[' in host",
                              s->uri);
        *host = p + 1;
        *hostlen = (size_t)(close - *host);
        if (close + 1 < p + n && close[1] != ':')
            return idem__fail(s, IDEM_EINVAL, "%s: expected ':' after ']'",
                              s->uri);
        colon = close + 1 < p + n ? close + 1 : NULL;
    } else {
        colon = memchr(p, ':', n);
        *hostlen = colon ? (size_t)(colon - p) : n;
    }
    if (*hostlen == 0)
        return idem__fail(s, IDEM_EINVAL, "%s: empty host", s->uri);
    /* The port is not quoted: in "u:pa?ss@host" ('?' ends the
     * authority early) the text taken for host:port is a password's. */
    if (colon && idem__parse_num(colon + 1, (size_t)(p + n - colon - 1), 1,
                                 65535, port))
        return idem__fail(s, IDEM_EINVAL, "%s: bad port (a number from 1 "
                          "to 65535)", s->uri);
    return 0;
}

/* One host[:port] of p[0..n) appended to the seeds. */
static int idem__add_host(idem_store *s, idem__rcfg *cfg, const char *p,
                          size_t n)
{
    const char *host = NULL;
    size_t hostlen = 0;
    long long port = cfg->sentinel ? IDEM__SDEFAULT_PORT
                                   : IDEM__RDEFAULT_PORT;
    int rc = idem__split_host(s, p, n, &host, &hostlen, &port);
    if (rc)
        return rc;
    char **hosts = realloc(cfg->hosts, (cfg->nseeds + 1) * sizeof *hosts);
    if (hosts)
        cfg->hosts = hosts;
    int *ports = hosts ? realloc(cfg->ports, (cfg->nseeds + 1) *
                                                 sizeof *ports)
                       : NULL;
    if (ports)
        cfg->ports = ports;
    char *h = ports ? malloc(hostlen + 1) : NULL;
    if (!h)
        return idem__oom(s);
    memcpy(h, host, hostlen);
    h[hostlen] = '\0';
    cfg->hosts[cfg->nseeds] = h;
    cfg->ports[cfg->nseeds] = (int)port;
    cfg->nseeds++;
    return 0;
}

/* One ?name=value parameter: where it goes in idem__rcfg and how its
 * value is read. docs/uri.md documents each; a test checks that it
 * names the same ones as this table. */
typedef struct idem__rparam idem__rparam;
struct idem__rparam {
    const char *name;
    int (*set)(idem_store *s, idem__rcfg *cfg, const idem__rparam *pm,
               const char *v, size_t vlen);
    size_t off;              /* the field, offsetof(idem__rcfg, ...) */
    size_t size;             /* numbers: sizeof the field (int, int64_t) */
    long long lo, hi;        /* numbers: the range allowed */
};

static int idem__set_num(idem_store *s, idem__rcfg *cfg,
                         const idem__rparam *pm, const char *v, size_t vlen)
{
    long long num;
    if (idem__parse_num(v, vlen, pm->lo, pm->hi, &num))
        return idem__fail(s, IDEM_EINVAL, "%s: %s must be a number in "
                          "%lld..%lld", s->uri, pm->name, pm->lo, pm->hi);
    char *field = (char *)cfg + pm->off;
    if (pm->size == sizeof(int64_t)) {
        int64_t x = num;
        memcpy(field, &x, sizeof x);
    } else {
        int x = (int)num;
        memcpy(field, &x, sizeof x);
    }
    return 0;
}

/* A %-decoded string parameter into *field (its length into *len if
 * len is not NULL), replacing what was there. */
static int idem__set_decoded(idem_store *s, const idem__rparam *pm,
                             const char *v, size_t vlen, char **field,
                             size_t *len)
{
    int bad;
    char *d = idem__pct_decode(v, vlen, len, &bad);
    if (!d)
        return bad ? idem__fail(s, IDEM_EINVAL, "%s: bad %% escape in %s",
                                s->uri, pm->name)
                   : idem__fail(s, IDEM_ENOMEM, "out of memory");
    if (*field)
        explicit_bzero(*field, strlen(*field));  /* it may be a password */
    free(*field);
    *field = d;
    return 0;
}

static int idem__set_prefix(idem_store *s, idem__rcfg *cfg,
                            const idem__rparam *pm, const char *v,
                            size_t vlen)
{
    return idem__set_decoded(s, pm, v, vlen, &cfg->prefix, &cfg->prefixlen);
}

/* A %-decoded string into the char * field at pm->off. */
static int idem__set_str(idem_store *s, idem__rcfg *cfg,
                         const idem__rparam *pm, const char *v, size_t vlen)
{
    char *field;
    memcpy(&field, (char *)cfg + pm->off, sizeof field);
    int rc = idem__set_decoded(s, pm, v, vlen, &field, NULL);
    memcpy((char *)cfg + pm->off, &field, sizeof field);
    return rc;
}

static int idem__set_layout(idem_store *s, idem__rcfg *cfg,
                            const idem__rparam *pm, const char *v,
                            size_t vlen)
{
    if (vlen == 4 && memcmp(v, "hash", 4) == 0)
        cfg->layout = IDEM__LAYOUT_HASH;
    else if (vlen == 3 && memcmp(v, "day", 3) == 0)
        cfg->layout = IDEM__LAYOUT_DAY;
    else
        return idem__fail(s, IDEM_EINVAL, "%s: layout must be hash or "
                          "day, not '%.*s'", s->uri, (int)vlen, v);
    return 0;
}

#define IDEM__NUM(name, field, lo, hi)                                     \
    {name, idem__set_num, offsetof(idem__rcfg, field),                     \
     sizeof(((idem__rcfg *)0)->field), lo, hi}

#define IDEM__STR(name, field)                                             \
    {name, idem__set_str, offsetof(idem__rcfg, field), 0, 0, 0}

static const idem__rparam idem__rparams[] = {
    IDEM__NUM("timeout_ms", timeout_ms, 1, 3600000),
    IDEM__NUM("connect_timeout_ms", connect_ms, 1, 3600000),
    {"prefix", idem__set_prefix, 0, 0, 0, 0},
    IDEM__NUM("pool", pool, 1, 64),
    IDEM__NUM("wait", wait, 0, 64),
    IDEM__NUM("db", db, 0, 1000000),
    {"layout", idem__set_layout, 0, 0, 0, 0},
    IDEM__NUM("days", days, 1, IDEM__MAX_DAYS),
    IDEM__NUM("shards", shards, 1, IDEM__MAX_SHARDS),
    IDEM__STR("password_file", pass_file),
    IDEM__STR("sentinel_user", sentinel_user),
    IDEM__STR("sentinel_password", sentinel_pass),
    IDEM__STR("sentinel_password_file", sentinel_pass_file),
};

#undef IDEM__NUM
#undef IDEM__STR

#define IDEM__NPARAMS (sizeof idem__rparams / sizeof idem__rparams[0])

const char *idem__rparam_name(size_t i)
{
    return i < IDEM__NPARAMS ? idem__rparams[i].name : NULL;
}

/* An unknown parameter: the error names it and lists the known ones. */
static int idem__unknown_param(idem_store *s, const char *p, size_t klen)
{
    char known[400];
    size_t n = 0;
    known[0] = '\0';
    for (size_t i = 0; i < IDEM__NPARAMS && n < sizeof known; i++)
        n += (size_t)snprintf(known + n, sizeof known - n, "%s%s",
                              i ? ", " : "", idem__rparams[i].name);
    return idem__fail(s, IDEM_EINVAL, "%s: unknown parameter '%.*s' "
                      "(known: %s)", s->uri, (int)klen, p, known);
}

static int idem__parse_param(idem_store *s, idem__rcfg *cfg, const char *p,
                             size_t n)
{
    const char *eq = memchr(p, '=', n);
    if (!eq)
        return idem__fail(s, IDEM_EINVAL, "%s: parameter '%.*s' has no "
                          "value", s->uri, (int)n, p);
    size_t klen = (size_t)(eq - p);
    for (size_t i = 0; i < IDEM__NPARAMS; i++) {
        const idem__rparam *pm = &idem__rparams[i];
        if (klen == strlen(pm->name) && memcmp(p, pm->name, klen) == 0)
            return pm->set(s, cfg, pm, eq + 1, n - klen - 1);
    }
    return idem__unknown_param(s, p, klen);
}

/* The password in path: the whole file but one trailing newline (as
 * `echo pw > file` leaves it). Refused when other users may read the
 * file, since then it keeps nothing secret; its owner and group may. */
static int idem__read_password(idem_store *s, const char *param,
                               const char *path, char **out)
{
    struct stat st;
    char *pw = NULL;
    ssize_t n = 0, got = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0 || fstat(fd, &st) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return idem__fail(s, IDEM_EINVAL, "%s: %s %s: %s", s->uri, param,
                          path, strerror(err));
    }
    if (st.st_mode & S_IROTH) {
        close(fd);
        return idem__fail(s, IDEM_EINVAL, "%s: %s %s can be read by other "
                          "users (mode %04o): chmod o-rwx it", s->uri, param,
                          path, (unsigned)(st.st_mode & 07777));
    }
    if (!(pw = malloc(IDEM__PASSWORD_MAX + 1))) {
        close(fd);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    while (got <= IDEM__PASSWORD_MAX &&
           (n = read(fd, pw + got, IDEM__PASSWORD_MAX + 1 - (size_t)got)) > 0)
        got += n;
    int err = errno;
    close(fd);
    if (got && pw[got - 1] == '\n')
        got--;
    pw[got] = '\0';
    const char *why = n < 0                       ? strerror(err)
                      : got > IDEM__PASSWORD_MAX  ? "longer than 64 KiB"
                      : got == 0                  ? "empty"
                      : strlen(pw) != (size_t)got ? "holds a NUL byte"
                                                  : NULL;
    if (why) {
        explicit_bzero(pw, IDEM__PASSWORD_MAX + 1);
        free(pw);
        return idem__fail(s, IDEM_EINVAL, "%s: %s %s: %s", s->uri, param,
                          path, why);
    }
    *out = pw;
    return 0;
}

/* A password from its sources in turn: *pass (from the URI; `what`
 * names it in messages), else the file of parameter `param`, else the
 * environment variable env (NULL: none), else none. An empty one in the
 * URI ("redis://USER:@host") is none, so that a user can be named there
 * with the password kept elsewhere. */
static int idem__resolve_secret(idem_store *s, char **pass, const char *what,
                                const char *file, const char *param,
                                const char *env)
{
    if (*pass && !**pass) {
        free(*pass);
        *pass = NULL;
    }
    if (file && *pass)
        return idem__fail(s, IDEM_EINVAL, "%s: a %s and a %s: give one",
                          s->uri, what, param);
    if (file)
        return idem__read_password(s, param, file, pass);
    const char *e = env ? secure_getenv(env) : NULL;
    if (!*pass && e && *e && !(*pass = idem__strdup(e)))
        return idem__oom(s);
    return 0;
}

/* The servers' password, and the sentinels' (which is their own: a
 * sentinel is not one of the servers it watches). */
static int idem__resolve_passwords(idem_store *s, idem__rcfg *cfg)
{
    int rc = idem__resolve_secret(s, &cfg->pass, "password in the URI",
                                  cfg->pass_file, "password_file",
                                  "IDEM_REDIS_PASSWORD");
    return rc ? rc : idem__resolve_secret(s, &cfg->sentinel_pass,
                                          "sentinel_password",
                                          cfg->sentinel_pass_file,
                                          "sentinel_password_file", NULL);
}

/* The day layout's bucket names end in :{TAG}, TAG chosen per shard so
 * that shard i's buckets hash to slot i * 16384 / shards: distinct
 * shards never share a slot (a script call's buckets are one shard's),
 * and the shards spread evenly over the masters of a cluster. TAG is the
 * first decimal number that hashes there; the names are part of the
 * data's format, so this search must never change. */
static int idem__shard_tags(idem_store *s, idem__rcfg *cfg)
{
    unsigned n = (unsigned)cfg->shards;
    int *shard_of = malloc(IDEM__SLOTS * sizeof *shard_of);
    cfg->tags = calloc(n, sizeof *cfg->tags);
    cfg->tag_slots = calloc(n, sizeof *cfg->tag_slots);
    if (!shard_of || !cfg->tags || !cfg->tag_slots) {
        free(shard_of);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    for (unsigned k = 0; k < IDEM__SLOTS; k++)
        shard_of[k] = -1;
    for (unsigned i = 0; i < n; i++) {
        cfg->tag_slots[i] = i * IDEM__SLOTS / n;
        shard_of[cfg->tag_slots[i]] = (int)i;
    }
    unsigned found = 0;
    for (unsigned long v = 0; found < n; v++) {
        char t[12];
        int len = snprintf(t, sizeof t, "%lu", v);
        int i = shard_of[idem__crc16(t, (size_t)len) % IDEM__SLOTS];
        if (i >= 0 && !cfg->tags[i][0]) {
            memcpy(cfg->tags[i], t, (size_t)len + 1);
            found++;
        }
    }
    free(shard_of);
    return 0;
}

/* Check and complete the day layout's settings. */
static int idem__day_layout(idem_store *s, idem__rcfg *cfg)
{
    if (cfg->layout != IDEM__LAYOUT_DAY) {
        if (cfg->days || cfg->shards)
            return idem__fail(s, IDEM_EINVAL, "%s: days and shards belong "
                              "to layout=day", s->uri);
        return 0;
    }
    if (memchr(cfg->prefix, '{', cfg->prefixlen))
        return idem__fail(s, IDEM_EINVAL, "%s: layout=day needs a prefix "
                          "without '{': the buckets' hash tags are idem's",
                          s->uri);
    if (!cfg->days)
        cfg->days = 7;
    if (!cfg->shards)
        cfg->shards = 16;
    return idem__shard_tags(s, cfg);
}

/* Settings before the URI's: the defaults. */
static int idem__rcfg_init(idem_store *s, int kind, idem__rcfg *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->cluster = kind == IDEM__RK_CLUSTER;
    cfg->sentinel = kind == IDEM__RK_SENTINEL;
    cfg->timeout_ms = 5000;
    cfg->pool = 1;
    cfg->prefix = idem__strdup(IDEM__RDEFAULT_PREFIX);
    if (!cfg->prefix)
        return idem__oom(s);
    cfg->prefixlen = strlen(cfg->prefix);
    return 0;
}

/* "USER:PASSWORD@", "PASSWORD@" or nothing at the start of the
 * authority auth[0..*len); *auth and *len move past it. */
static int idem__parse_userinfo(idem_store *s, idem__rcfg *cfg,
                                const char **auth, size_t *len)
{
    const char *p = *auth;
    const char *at = idem__userinfo_end(p, *len);
    if (!at)
        return 0;
    const char *colon = memchr(p, ':', (size_t)(at - p));
    size_t ulen = colon ? (size_t)(colon - p) : (size_t)(at - p);
    int bad = 0;
    if (ulen && !(cfg->user = idem__pct_decode(p, ulen, NULL, &bad)))
        goto failed;
    if (colon && !(cfg->pass = idem__pct_decode(colon + 1,
                                                (size_t)(at - colon - 1),
                                                NULL, &bad)))
        goto failed;
    if (!colon && cfg->user) {
        /* "redis://secret@host": a password alone, as redis-cli reads
         * it. */
        cfg->pass = cfg->user;
        cfg->user = NULL;
    }
    *len -= (size_t)(at + 1 - p);
    *auth = at + 1;
    return 0;
failed:
    return bad ? idem__fail(s, IDEM_EINVAL, "%s: bad %% escape in user or "
                            "password", s->uri)
               : idem__oom(s);
}

/* The comma-separated host[:port] list p[0..n). */
static int idem__parse_hosts(idem_store *s, idem__rcfg *cfg, const char *p,
                             size_t n)
{
    for (const char *end = p + n; p < end;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        size_t len = comma ? (size_t)(comma - p) : (size_t)(end - p);
        int rc = idem__add_host(s, cfg, p, len);
        if (rc)
            return rc;
        p += len + (comma != NULL);
    }
    if (cfg->nseeds == 0)
        return idem__fail(s, IDEM_EINVAL, "%s: no host", s->uri);
    if (!cfg->cluster && !cfg->sentinel && cfg->nseeds > 1)
        return idem__fail(s, IDEM_EINVAL, "%s: several hosts: use "
                          "redis-cluster:// for a cluster", s->uri);
    return 0;
}

/* What follows the hosts' '/', p[0..n): the database of redis:// and
 * redis-cluster://, the master's name of redis-sentinel://. */
static int idem__parse_path(idem_store *s, idem__rcfg *cfg, const char *p,
                            size_t n)
{
    if (cfg->sentinel) {
        int bad = 0;
        if (n == 0 || memchr(p, '/', n))
            return idem__fail(s, IDEM_EINVAL, "%s: expected "
                              "redis-sentinel://HOST:PORT[,...]/MASTER (a "
                              "database is db=N)", s->uri);
        cfg->master = idem__pct_decode(p, n, NULL, &bad);
        return cfg->master ? 0
               : bad ? idem__fail(s, IDEM_EINVAL, "%s: bad %% escape in "
                                  "the master's name", s->uri)
                     : idem__oom(s);
    }
    long long db;
    if (n == 0)
        return 0;
    if (idem__parse_num(p, n, 0, 1000000, &db))
        return idem__fail(s, IDEM_EINVAL, "%s: bad database number", s->uri);
    cfg->db = (int)db;
    return 0;
}

/* The &-separated name=value list q (after the '?'). */
static int idem__parse_query(idem_store *s, idem__rcfg *cfg, const char *q)
{
    for (const char *p = q; *p;) {
        const char *amp = strchr(p, '&');
        size_t n = amp ? (size_t)(amp - p) : strlen(p);
        int rc = n ? idem__parse_param(s, cfg, p, n) : 0;
        if (rc)
            return rc;
        p += n + (amp != NULL);
    }
    return 0;
}

/* Checks across settings, and what the others decide: the connect
 * time, the passwords, the day layout. */
static int idem__rcfg_finish(idem_store *s, idem__rcfg *cfg)
{
    if (cfg->cluster && cfg->db != 0)
        return idem__fail(s, IDEM_EINVAL, "%s: a cluster has only "
                          "database 0", s->uri);
    if (!cfg->sentinel && (cfg->sentinel_user || cfg->sentinel_pass ||
                           cfg->sentinel_pass_file))
        return idem__fail(s, IDEM_EINVAL, "%s: sentinel_user, "
                          "sentinel_password and sentinel_password_file "
                          "belong to redis-sentinel://", s->uri);
    if (!cfg->connect_ms)
        cfg->connect_ms = cfg->timeout_ms;
    int rc = idem__resolve_passwords(s, cfg);
    return rc ? rc : idem__day_layout(s, cfg);
}

static const char *const idem__rschemes[] = {"redis", "redis-cluster",
                                             "redis-sentinel"};

int idem__rcfg_parse(idem_store *s, int kind, const char *rest,
                     idem__rcfg *cfg)
{
    int rc = idem__rcfg_init(s, kind, cfg);
    if (rc)
        return rc;
    if (strncmp(rest, "//", 2) != 0)
        return idem__fail(s, IDEM_EINVAL, "%s: expected %s://host:port",
                          s->uri, idem__rschemes[kind]);
    rest += 2;
    const char *q = strchr(rest, '?');
    size_t authlen = q ? (size_t)(q - rest) : strlen(rest);
    rc = idem__parse_userinfo(s, cfg, &rest, &authlen);
    if (rc)
        return rc;
    const char *slash = memchr(rest, '/', authlen);
    rc = idem__parse_hosts(s, cfg, rest,
                           slash ? (size_t)(slash - rest) : authlen);
    if (!rc && (slash || cfg->sentinel))
        rc = idem__parse_path(s, cfg, slash ? slash + 1 : rest + authlen,
                              slash ? (size_t)(rest + authlen - slash - 1)
                                    : 0);
    if (!rc && q)
        rc = idem__parse_query(s, cfg, q + 1);
    return rc ? rc : idem__rcfg_finish(s, cfg);
}

void idem__rcfg_free(idem__rcfg *cfg)
{
    for (size_t i = 0; i < cfg->nseeds; i++)
        free(cfg->hosts[i]);
    free(cfg->hosts);
    free(cfg->ports);
    free(cfg->user);
    if (cfg->pass)
        explicit_bzero(cfg->pass, strlen(cfg->pass));
    free(cfg->pass);
    free(cfg->pass_file);
    free(cfg->master);
    free(cfg->sentinel_user);
    if (cfg->sentinel_pass)
        explicit_bzero(cfg->sentinel_pass, strlen(cfg->sentinel_pass));
    free(cfg->sentinel_pass);
    free(cfg->sentinel_pass_file);
    free(cfg->prefix);
    free(cfg->tags);
    free(cfg->tag_slots);
    memset(cfg, 0, sizeof *cfg);
}
