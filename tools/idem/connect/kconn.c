/* kconn.c - what a kafka:// URI says, and the librdkafka configuration.
 *
 *   kafka://BOOTSTRAP[,BOOTSTRAP...]/TOPIC[,TOPIC...][?PARAM=VALUE&...]
 *
 * A parameter with a dot in its name is a librdkafka property, passed
 * as it is (session.timeout.ms=6000, security.protocol=SASL_SSL); the
 * others are idem's own (group, consumer, timeout_ms, readback_ms).
 * --kafka-config FILE reads properties as kcat's -F does (NAME=VALUE
 * lines, # comments); the URI's win over the file's. Values are never
 * printed, since sasl.password and ssl.key.password are among them: a
 * property librdkafka refuses is named, and its error shown only when it
 * does not quote the value. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "uriparam.h"
#include "kafka.h"

static const char *config_path;  /* --kafka-config */

/* The values of every property set from the file or a URI: librdkafka's
 * own log lines may quote them (a CONFWARN does), so they are hidden
 * there too. Written while configuring, before any client thread. */
static char *hidden[64];
static size_t nhidden;

static void hide(const char *value)
{
    for (size_t i = 0; i < nhidden; i++)
        if (!strcmp(hidden[i], value))
            return;
    if (nhidden < sizeof hidden / sizeof *hidden && strlen(value) >= 3 &&
        (hidden[nhidden] = strdup(value)) != NULL)
        nhidden++;
}

void kafka_say(const char *fac, const char *msg)
{
    char line[1024];
    snprintf(line, sizeof line, "%s", msg);
    for (size_t i = 0; i < nhidden; i++) {
        size_t n = strlen(hidden[i]);
        for (char *p = strstr(line, hidden[i]); p;
             p = strstr(p + 3, hidden[i])) {
            memmove(p + 3, p + n, strlen(p + n) + 1);
            memcpy(p, "***", 3);
        }
    }
    fprintf(stderr, "idem: kafka: %s: %s\n", fac, line);
}

/* librdkafka's warnings and errors. */
static void on_log(const rd_kafka_t *rk, int level, const char *fac,
                   const char *msg)
{
    kafka_say(fac, msg);
}

void connect_kafka_config(const char *path)
{
    config_path = path;
}

int kafka_is_uri(const char *uri)
{
    return uri && !strncmp(uri, "kafka://", 8);
}

void kafka_uri_free(kafka_uri *u)
{
    free(u->brokers);
    for (size_t i = 0; i < u->ntopics; i++)
        free(u->topics[i]);
    free(u->group);
    free(u->consumer);
    for (size_t i = 0; i < 2 * u->nprops; i++)
        free(u->props[i]);
    free(u->props);
    memset(u, 0, sizeof *u);
}

static int add_prop(kafka_uri *u, const char *name, size_t nlen,
                    const char *value, size_t vlen)
{
    char **v = realloc(u->props, (2 * u->nprops + 2) * sizeof *v);
    if (!v)
        return -1;
    u->props = v;
    v[2 * u->nprops] = strndup(name, nlen);
    v[2 * u->nprops + 1] = strndup(value, vlen);
    u->nprops++;
    return v[2 * u->nprops - 2] && v[2 * u->nprops - 1] ? 0 : -1;
}

/* A topic name: 1 to 249 of [A-Za-z0-9._-]. */
static int good_topic(const char *p, size_t n)
{
    if (!n || n > 249)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)p[i]) && !strchr("._-", p[i]))
            return 0;
    return 1;
}

static int split_topics(const char *cmd, kafka_uri *u, const char *p,
                        size_t n)
{
    while (n) {
        size_t k = strcspn(p, ",");
        k = k < n ? k : n;
        if (!good_topic(p, k))
            return cli_usage_error(cmd, "%s: topic names are 1 to 249 of "
                                   "A-Z a-z 0-9 . _ -", u->display);
        if (u->ntopics == KAFKA_MAX_TOPICS)
            return cli_usage_error(cmd, "%s: at most %d topics",
                                   u->display, KAFKA_MAX_TOPICS);
        if (!(u->topics[u->ntopics++] = strndup(p, k)))
            return cli_fail(cmd, "out of memory");
        p += k + (k < n);
        n -= k + (k < n);
    }
    return u->ntopics ? 0 : cli_usage_error(cmd, "%s: no topic (kafka://"
                                            "HOST:PORT/TOPIC)", u->display);
}

static int number(const char *cmd, const kafka_uri *u, const char *name,
                  const char *v, size_t n, int64_t *out)
{
    char buf[24];
    char *end;
    snprintf(buf, sizeof buf, "%.*s", (int)(n < 23 ? n : 23), v);
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (!n || n > 12 || *end || errno || x <= 0)
        return cli_usage_error(cmd, "%s: %s wants a positive number of "
                               "milliseconds", u->display, name);
    *out = x;
    return 0;
}

/* One PARAM=VALUE of the query. 0 or 2. */
static int param(const char *cmd, kafka_uri *u, int as_sink, const char *p,
                 size_t n)
{
    uri_param q;
    uri_param_split(p, n, &q);
    const char *name = q.name, *v = q.v;
    size_t k = q.namelen, vn = q.vl;
    if (memchr(p, '.', k))
        return add_prop(u, p, k, v, vn) ? cli_fail(cmd, "out of memory") : 0;
    if (!as_sink && (!strcmp(name, "group") || !strcmp(name, "consumer"))) {
        char **to = name[0] == 'g' ? &u->group : &u->consumer;
        free(*to);
        if (!vn || !(*to = strndup(v, vn)))
            return vn ? cli_fail(cmd, "out of memory")
                      : cli_usage_error(cmd, "%s: %s wants a name",
                                        u->display, name);
        return 0;
    }
    if (!strcmp(name, "timeout_ms"))
        return number(cmd, u, name, v, vn, &u->timeout_ms);
    if (as_sink && !strcmp(name, "readback_ms"))
        return number(cmd, u, name, v, vn, &u->readback_ms);
    return cli_usage_error(cmd, "%s: unknown parameter '%.*s' (librdkafka "
                           "properties have a dot in their name)",
                           u->display, (int)(k < 100 ? k : 100), p);
}

static int default_consumer(const char *cmd, kafka_uri *u)
{
    char host[256];
    if (u->consumer)
        return 0;
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "idem");
    host[sizeof host - 1] = 0;
    return (u->consumer = strdup(host)) ? 0 : cli_fail(cmd, "out of memory");
}

int kafka_uri_parse(const char *cmd, const char *uri, int as_sink,
                    kafka_uri *u)
{
    memset(u, 0, sizeof *u);
    u->timeout_ms = 10000;
    const char *p = uri + 8, *q = strchr(p, '?');
    size_t all = q ? (size_t)(q - uri) : strlen(uri);
    snprintf(u->display, sizeof u->display, "%.*s",
             (int)(all < 400 ? all : 400), uri);
    const char *slash = memchr(p, '/', all - 8);
    if (!slash || slash == p)
        return cli_usage_error(cmd, "%s: want kafka://HOST:PORT[,HOST:PORT"
                               "...]/TOPIC", u->display);
    if (!(u->brokers = strndup(p, (size_t)(slash - p))))
        return cli_fail(cmd, "out of memory");
    int rc = split_topics(cmd, u, slash + 1,
                          all - (size_t)(slash + 1 - uri));
    while (!rc && q && *q) {
        q++;
        size_t n = strcspn(q, "&");
        rc = n ? param(cmd, u, as_sink, q, n) : 0;
        q += n;
    }
    if (!rc && as_sink && u->ntopics != 1)
        rc = cli_usage_error(cmd, "%s: a sink writes one topic",
                             u->display);
    if (!rc && !as_sink && !u->group)
        rc = cli_usage_error(cmd, "%s: a source needs ?group=NAME (the "
                             "consumer group)", u->display);
    return rc ? rc : as_sink ? 0 : default_consumer(cmd, u);
}

int kafka_ident(const char *cmd, const char *uri, int as_sink, char *buf,
                size_t size)
{
    kafka_uri u;
    int rc = kafka_uri_parse(cmd, uri, as_sink, &u);
    if (!rc)
        snprintf(buf, size, "%s", u.display);
    kafka_uri_free(&u);
    return rc;
}

/* Set one property; on refusal name it, and show librdkafka's reason
 * only when it does not quote the value. 0 or 1. */
static int set(const char *cmd, rd_kafka_conf_t *c, const char *name,
               const char *value)
{
    char err[512];
    if (rd_kafka_conf_set(c, name, value, err, sizeof err) ==
        RD_KAFKA_CONF_OK)
        return 0;
    return cli_fail(cmd, "Kafka property %s: %s", name,
                    *value && strstr(err, value) ? "invalid value" : err);
}

/* --kafka-config's NAME=VALUE lines into c. 0 or 1. */
static int set_from_file(const char *cmd, rd_kafka_conf_t *c)
{
    FILE *f = config_path ? fopen(config_path, "r") : NULL;
    if (config_path && !f)
        return cli_fail(cmd, "--kafka-config %s: %s", config_path,
                        strerror(errno));
    char line[4096];
    int rc = 0;
    for (unsigned n = 1; !rc && f && fgets(line, sizeof line, f); n++) {
        line[strcspn(line, "\r\n")] = 0;
        char *p = line + strspn(line, " \t"), *eq = strchr(p, '=');
        if (!*p || *p == '#')
            continue;
        if (!eq) {
            rc = cli_fail(cmd, "--kafka-config %s:%u: not NAME=VALUE",
                          config_path, n);
            break;
        }
        *eq = 0;
        hide(eq + 1);
        rc = set(cmd, c, p, eq + 1);
    }
    if (f)
        fclose(f);
    return rc;
}

rd_kafka_conf_t *kafka_conf(const char *cmd, const kafka_uri *u,
                            const char *const *base)
{
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set_log_cb(c, on_log);
    int rc = set(cmd, c, "bootstrap.servers", u->brokers);
    rc = rc ? rc : set(cmd, c, "log_level", "4");
    for (size_t i = 0; !rc && base[i]; i += 2)
        rc = set(cmd, c, base[i], base[i + 1]);
    rc = rc ? rc : set_from_file(cmd, c);
    for (size_t i = 0; i < u->nprops; i++)
        hide(u->props[2 * i + 1]);
    for (size_t i = 0; !rc && i < u->nprops; i++)
        rc = set(cmd, c, u->props[2 * i], u->props[2 * i + 1]);
    if (!rc)
        return c;
    rd_kafka_conf_destroy(c);
    return NULL;
}

/* Do the brokers answer, within timeout_ms? A cluster that is not
 * there is said at once, not waited for. 0 or 1. */
static int reach(const char *cmd, const kafka_uri *u, rd_kafka_t *rk)
{
    const struct rd_kafka_metadata *md = NULL;
    rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, NULL, &md,
                                              (int)u->timeout_ms);
    if (md)
        rd_kafka_metadata_destroy(md);
    if (!e)
        return 0;
    return cli_fail(cmd, "%s: no broker answered within timeout_ms (%"
                    PRId64 " ms): %s", u->display, u->timeout_ms,
                    rd_kafka_err2str(e));
}

rd_kafka_t *kafka_client(const char *cmd, const kafka_uri *u,
                         rd_kafka_type_t t, rd_kafka_conf_t *conf)
{
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(t, conf, err, sizeof err);
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        cli_fail(cmd, "%s: %s", u->display, err);
        return NULL;
    }
    if (!reach(cmd, u, rk))
        return rk;
    rd_kafka_destroy(rk);
    return NULL;
}
