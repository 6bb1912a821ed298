/* nconn.c - the nats:// URI and a connection to its server.
 *
 * nats://[USER:PASSWORD@|TOKEN@]HOST[:PORT]/NAME?PARAMS, NAME the stream
 * of a source or the subject of a sink. Secrets come from the URI, from
 * password_file= (a password with a user, else a token), from
 * IDEM_NATS_PASSWORD or IDEM_NATS_TOKEN, or as files libnats reads
 * itself (creds=, nkey=); none of them is ever part of a message: the
 * URI is shown rebuilt from its host, port and name (display).
 *
 * The URI's parsing shares its %-decoding and secret files with
 * redis-stream:// (rconn.c); the parameters are NATS's own. */
#include "nconn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "uriparam.h"
#include "rconn.h"

int nu_is_uri(const char *uri)
{
    return uri && !strncmp(uri, "nats://", 7);
}

static int bad(const nats_uri *u, const char *cmd, const char *what)
{
    return cli_usage_error(cmd, "%s: %s (nats://[USER:PASSWORD@]HOST[:PORT]"
                           "/STREAM?durable=NAME for --from, nats://HOST"
                           "[:PORT]/SUBJECT for --to)", u->display, what);
}

/* USER:PASSWORD@ or TOKEN@, then HOST[:PORT]. */
static int parse_authority(nats_uri *u, const char *cmd, const char *a,
                           size_t n)
{
    const char *at = NULL;
    for (const char *p = a; p < a + n; p++)
        at = *p == '@' ? p : at;
    if (at) {
        const char *colon = memchr(a, ':', (size_t)(at - a));
        int rc = colon ? uri_param_take(&u->user, a, (size_t)(colon - a)) ||
                             uri_param_take(&u->pass, colon + 1,
                                            (size_t)(at - colon - 1))
                       : uri_param_take(&u->token, a, (size_t)(at - a));
        if (rc)
            return bad(u, cmd, "bad %-escape in the user, password or "
                       "token, or out of memory");
        n -= (size_t)(at + 1 - a);
        a = at + 1;
    }
    const char *colon = memchr(a, ':', n);
    size_t hl = colon ? (size_t)(colon - a) : n;
    unsigned long port = 4222;
    if (colon) {
        char num[16], *end;
        snprintf(num, sizeof num, "%.*s", (int)(n - hl - 1), colon + 1);
        errno = 0;
        port = strtoul(num, &end, 10);
        if (!*num || *end || errno || port == 0 || port > 65535 ||
            n - hl - 1 >= sizeof num)
            return bad(u, cmd, "the port is not a number from 1 to 65535");
    }
    if (!hl || !(u->host = strndup(a, hl)))
        return bad(u, cmd, hl ? "out of memory" : "no host");
    u->port = (int)port;
    return 0;
}

static int duration(const nats_uri *u, const char *cmd, const char *v,
                    size_t n, int64_t *out)
{
    char num[24], *end;
    snprintf(num, sizeof num, "%.*s", (int)n, v);
    errno = 0;
    long long x = strtoll(num, &end, 10);
    if (!n || n >= sizeof num || *end || errno || x < 1 || x > 86400000)
        return bad(u, cmd, "timeout_ms and ack_wait_ms are numbers of "
                   "milliseconds from 1 to 86400000");
    *out = x;
    return 0;
}

/* One NAME=VALUE of the query. */
static int parse_param(nats_uri *u, const char *cmd, int sink, const char *p,
                       size_t n)
{
    uri_param q;
    uri_param_split(p, n, &q);
    const char *name = q.name, *v = q.v;
    size_t nl = q.namelen, vl = q.vl;
    int rc = -2;
    if (!strcmp(name, "durable") && !sink)
        rc = uri_param_take(&u->durable, v, vl);
    else if (!strcmp(name, "subject") && !sink)
        rc = uri_param_take(&u->subject, v, vl);
    else if (!strcmp(name, "worker") && !sink)
        rc = uri_param_take(&u->worker, v, vl);
    else if (!strcmp(name, "stream") && sink)
        rc = uri_param_take(&u->stream, v, vl);
    else if (!strcmp(name, "creds"))
        rc = uri_param_take(&u->creds, v, vl);
    else if (!strcmp(name, "nkey"))
        rc = uri_param_take(&u->nkey, v, vl);
    else if (!strcmp(name, "nkey_pub"))
        rc = uri_param_take(&u->nkey_pub, v, vl);
    else if (!strcmp(name, "password_file"))
        rc = uri_param_take(&u->pwfile, v, vl);
    else if (!strcmp(name, "timeout_ms"))
        return duration(u, cmd, v, vl, &u->timeout_ms);
    else if (!strcmp(name, "ack_wait_ms") && !sink)
        return duration(u, cmd, v, vl, &u->ack_wait_ms);
    if (rc == -1)
        return bad(u, cmd, "bad %-escape in a parameter, or out of memory");
    if (rc == 0)
        return 0;
    char what[160];
    snprintf(what, sizeof what, "unknown parameter '%.*s' for a NATS %s",
             (int)(nl < 60 ? nl : 60), p, sink ? "sink (--to)"
                                               : "source (--from)");
    return bad(u, cmd, what);
}

/* The password or token: the URI's, or password_file=, or the
 * environment's. */
static int secrets(nats_uri *u, const char *cmd)
{
    char **to = u->user ? &u->pass : &u->token;
    if (u->pwfile && (u->pass || u->token))
        return bad(u, cmd, "a password or token in the URI and a "
                   "password_file: give one");
    if (u->pwfile && !(*to = rs_read_secret(u->pwfile)))
        return cli_usage_error(cmd, "%s: password_file %s: %s", u->display,
                               u->pwfile, strerror(errno));
    const char *env = getenv(u->user ? "IDEM_NATS_PASSWORD"
                                     : "IDEM_NATS_TOKEN");
    if (!*to && env && *env && !(*to = strdup(env)))
        return bad(u, cmd, "out of memory");
    return 0;
}

int nu_parse(const char *cmd, const char *uri, int sink, nats_uri *u)
{
    memset(u, 0, sizeof *u);
    snprintf(u->display, sizeof u->display, "nats://...");
    if (!nu_is_uri(uri))
        return bad(u, cmd, "not a nats:// URI");
    const char *a = uri + 7, *q = strchr(a, '?');
    size_t upto = q ? (size_t)(q - a) : strlen(a);
    const char *slash = memchr(a, '/', upto);
    if (!slash || slash + 1 == a + upto)
        return bad(u, cmd, sink ? "no subject after the host"
                                : "no stream name after the host");
    int rc = parse_authority(u, cmd, a, (size_t)(slash - a));
    size_t namelen = upto - (size_t)(slash + 1 - a);
    if (!rc && uri_param_take(&u->name, slash + 1, namelen))
        rc = bad(u, cmd, "bad %-escape in the name, or out of memory");
    if (!rc)
        snprintf(u->display, sizeof u->display, "nats://%s:%d/%s", u->host,
                 u->port, u->name);
    for (const char *p = q ? q + 1 : ""; !rc && *p;) {
        size_t n = strcspn(p, "&");
        rc = n ? parse_param(u, cmd, sink, p, n) : 0;
        p += n + (p[n] == '&');
    }
    rc = rc ? rc : secrets(u, cmd);
    if (!rc && !u->nkey != !u->nkey_pub)
        rc = bad(u, cmd, "nkey=SEED_FILE goes with nkey_pub=PUBLIC_KEY");
    if (!rc && !sink && !u->durable)
        rc = bad(u, cmd, "a source names its durable consumer: "
                 "?durable=NAME");
    if (!rc && !sink && strpbrk(u->durable, ". *>"))
        rc = bad(u, cmd, "a durable name has no '.', '*', '>' or space");
    if (!rc && !sink && !u->worker) {
        char host[256];
        if (gethostname(host, sizeof host) != 0)
            snprintf(host, sizeof host, "idem");
        host[sizeof host - 1] = 0;
        if (!(u->worker = strdup(host)))
            rc = bad(u, cmd, "out of memory");
    }
    if (!u->timeout_ms)
        u->timeout_ms = 5000;
    return rc;
}

void nu_free(nats_uri *u)
{
    free(u->host);
    free(u->user);
    free(u->pass);
    free(u->token);
    free(u->pwfile);
    free(u->creds);
    free(u->nkey);
    free(u->nkey_pub);
    free(u->name);
    free(u->durable);
    free(u->subject);
    free(u->worker);
    free(u->stream);
    memset(u, 0, sizeof *u);
}

void nu_ident(const nats_uri *u, int worker, char *buf, size_t size)
{
    snprintf(buf, size, "nats://%s:%d/%s%s%s%s%s%s%s", u->host, u->port,
             u->name, worker ? "?durable=" : "", worker ? u->durable : "",
             worker && u->subject ? "&subject=" : "",
             worker && u->subject ? u->subject : "",
             worker ? "&worker=" : "", worker ? u->worker : "");
}

const char *nl_why(natsStatus s)
{
    const char *t = nats_GetLastError(NULL);
    return t && *t ? t : natsStatus_GetText(s);
}

/* The options of u: its server, its credentials, and reconnecting for
 * ever (a restarted server is found again; the calls made meanwhile
 * fail after timeout_ms, which fails the batch, not the run's state). */
static natsStatus options(const nats_uri *u, natsOptions **o)
{
    char url[600];
    snprintf(url, sizeof url, "nats://%s:%d", u->host, u->port);
    natsStatus s = natsOptions_Create(o);
    s = s ? s : natsOptions_SetURL(*o, url);
    s = s ? s : natsOptions_SetTimeout(*o, u->timeout_ms);
    s = s ? s : natsOptions_SetMaxReconnect(*o, -1);
    s = s ? s : natsOptions_SetReconnectWait(*o, 100);
    if (!s && u->user)
        s = natsOptions_SetUserInfo(*o, u->user, u->pass ? u->pass : "");
    if (!s && u->token)
        s = natsOptions_SetToken(*o, u->token);
    if (!s && u->creds)
        s = natsOptions_SetUserCredentialsFromFiles(*o, u->creds, NULL);
    if (!s && u->nkey)
        s = natsOptions_SetNKeyFromSeed(*o, u->nkey_pub, u->nkey);
    return s;
}

int nl_open(const char *cmd, const nats_uri *u, nats_link *l,
            jsPubAckHandler on_ack, void *closure)
{
    natsOptions *o = NULL;
    memset(l, 0, sizeof *l);
    natsStatus s = options(u, &o);
    s = s ? s : natsConnection_Connect(&l->nc, o);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = u->timeout_ms;
    jo.PublishAsync.AckHandler = on_ack;
    jo.PublishAsync.AckHandlerClosure = closure;
    jo.PublishAsync.MaxPending = 4096;
    jo.PublishAsync.StallWait = u->timeout_ms;
    s = s ? s : natsConnection_JetStream(&l->js, l->nc, &jo);
    natsOptions_Destroy(o);
    if (!s)
        return 0;
    cli_fail(cmd, "%s: connecting: %s", u->display, nl_why(s));
    nl_close(l);
    return 1;
}

void nl_close(nats_link *l)
{
    jsCtx_Destroy(l->js);
    natsConnection_Destroy(l->nc);
    memset(l, 0, sizeof *l);
}
