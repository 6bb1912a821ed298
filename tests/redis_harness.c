/* tests/redis_harness.c - see redis_harness.h. */
#include "redis_harness.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

static const char *th_scripts(void)
{
    const char *d = getenv("IDEM_SCRIPTS");
    return d ? d : "scripts";
}

static void th_mkdir(th_servers *sv)
{
    const char *root = getenv("IDEM_REDIS_ROOT");
    if (root) {
        snprintf(sv->dir, sizeof sv->dir, "%s/p%d-XXXXXX", root, getpid());
        cr_assert(mkdtemp(sv->dir), "mkdtemp %s", sv->dir);
    } else {
        char *d = t_tmpdir();
        snprintf(sv->dir, sizeof sv->dir, "%s", d);
        free(d);
    }
}

static void th_run(th_servers *sv, const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "sh '%s/redis-test.sh' %s", th_scripts(), args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    char line[512] = "";
    if (!fgets(line, sizeof line, p))
        line[0] = '\0';
    int st = pclose(p);
    cr_assert_eq(st, 0, "%s failed", cmd);
    sv->n = 0;
    for (char *q = line; *q && sv->n < TH_MAX_NODES;) {
        sv->ports[sv->n++] = (int)strtol(q, &q, 10);
        while (*q == ',' || *q == '\n')
            q++;
    }
    cr_assert(sv->n > 0, "%s printed no port", cmd);
}

void th_start_single(th_servers *sv)
{
    th_start_single_with(sv, "");
}

void th_start_single_with(th_servers *sv, const char *options)
{
    th_mkdir(sv);
    char args[1400];
    snprintf(args, sizeof args, "single '%s' %s", sv->dir, options);
    th_run(sv, args);
}

void th_start_cluster(th_servers *sv, int masters, int replicas)
{
    th_mkdir(sv);
    char args[1200];
    snprintf(args, sizeof args, "cluster '%s' %d %d", sv->dir, masters,
             replicas);
    th_run(sv, args);
}

void th_start_sentinel(th_servers *sv, const char *name)
{
    th_start_sentinel_auth(sv, name, "", "");
}

void th_start_sentinel_auth(th_servers *sv, const char *name, const char *pw,
                            const char *spw)
{
    th_mkdir(sv);
    char args[1400];
    snprintf(args, sizeof args, "sentinel '%s' '%s' '%s' '%s'", sv->dir, name,
             pw, spw);
    th_run(sv, args);
    cr_assert_eq(sv->n, 5, "sentinel setup printed %d ports", sv->n);
}

void th_stop(th_servers *sv)
{
    if (!sv->dir[0])
        return;
    t_sh("sh '%s/redis-test.sh' stop '%s'; rm -rf '%s'", th_scripts(),
         sv->dir, sv->dir);
    sv->dir[0] = '\0';
}

static th_servers th_own_single, th_own_cluster, th_own_sentinel;
static char th_single_addr[64], th_cl_addr[TH_MAX_NODES * 24];
static char th_sn_addr[128];

static void th_format(const th_servers *sv, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < sv->n && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s127.0.0.1:%d",
                              i ? "," : "", sv->ports[i]);
}

const char *th_redis_addr(void)
{
    const char *e = getenv("IDEM_TEST_REDIS");
    if (e)
        return e;
    if (!th_single_addr[0]) {
        th_start_single(&th_own_single);
        th_format(&th_own_single, th_single_addr, sizeof th_single_addr);
    }
    return th_single_addr;
}

const char *th_cluster_addr(void)
{
    const char *e = getenv("IDEM_TEST_CLUSTER");
    if (e)
        return e;
    if (!th_cl_addr[0]) {
        th_start_cluster(&th_own_cluster, 3, 1);
        th_format(&th_own_cluster, th_cl_addr, sizeof th_cl_addr);
    }
    return th_cl_addr;
}

const char *th_sentinel_addr(void)
{
    const char *e = getenv("IDEM_TEST_SENTINEL");
    if (e)
        return e;
    if (!th_sn_addr[0]) {
        th_start_sentinel(&th_own_sentinel, "idem-shared");
        snprintf(th_sn_addr, sizeof th_sn_addr, "127.0.0.1:%d,127.0.0.1:%d,"
                 "127.0.0.1:%d/idem-shared", th_own_sentinel.ports[2],
                 th_own_sentinel.ports[3], th_own_sentinel.ports[4]);
    }
    return th_sn_addr;
}

void th_shared_stop(void)
{
    th_stop(&th_own_single);
    th_stop(&th_own_cluster);
    th_stop(&th_own_sentinel);
    th_single_addr[0] = th_cl_addr[0] = th_sn_addr[0] = '\0';
}

const char *th_prefix(void)
{
    static char buf[64];
    static unsigned n;
    unsigned r = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&r, sizeof r, 1, f) != 1)
            r = 0;
        fclose(f);
    }
    snprintf(buf, sizeof buf, "t%d-%08x-%u:", getpid(), r, n++);
    return buf;
}

redisContext *th_connect(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    cr_assert(c && !c->err, "connect %d: %s", port, c ? c->errstr : "oom");
    return c;
}

redisReply *th_cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    cr_assert(r, "redis: %s", c->errstr);
    return r;
}

int th_first_port(const char *addrs)
{
    const char *colon = strchr(addrs, ':');
    return colon ? (int)strtol(colon + 1, NULL, 10) : 0;
}

void th_kill9(const th_servers *sv, int port)
{
    t_sh("kill -9 $(cat '%s/%d/pid') 2>/dev/null", sv->dir, port);
}

long th_pid(const th_servers *sv, int port)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%d/pid", sv->dir, port);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no pid file %s", path);
    long pid = 0;
    int got = fscanf(f, "%ld", &pid);
    fclose(f);
    cr_assert(got == 1 && pid > 0, "bad pid file %s", path);
    return pid;
}

void th_signal(const th_servers *sv, int port, int sig)
{
    long pid = th_pid(sv, port);
    cr_assert_eq(kill((pid_t)pid, sig), 0, "kill %ld (port %d): %s", pid,
                 port, strerror(errno));
}

void th_restart(const th_servers *sv, int port)
{
    int st = t_sh("sh '%s/redis-test.sh' restart '%s' %d", th_scripts(),
                  sv->dir, port);
    cr_assert_eq(st, 0, "restart %d", port);
}

void th_node_id(int port, char id[64])
{
    redisContext *c = th_connect(port);
    redisReply *r = th_cmd(c, "CLUSTER MYID");
    cr_assert(r->type == REDIS_REPLY_STRING && r->len < 64);
    memcpy(id, r->str, r->len + 1);
    freeReplyObject(r);
    redisFree(c);
}

int th_slot_owner(int port, unsigned slot)
{
    redisContext *c = th_connect(port);
    redisReply *r = th_cmd(c, "CLUSTER SLOTS");
    int owner = -1;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *e = r->element[i];
        if ((long long)slot >= e->element[0]->integer &&
            (long long)slot <= e->element[1]->integer)
            owner = (int)e->element[2]->element[1]->integer;
    }
    freeReplyObject(r);
    redisFree(c);
    return owner;
}

int th_replica_of(const th_servers *sv, int master_port)
{
    for (int i = 0; i < sv->n; i++) {
        if (sv->ports[i] == master_port)
            continue;
        redisContext *c = redisConnect("127.0.0.1", sv->ports[i]);
        if (!c || c->err) {
            redisFree(c);
            continue;
        }
        redisReply *r = redisCommand(c, "ROLE");
        int is = r && r->type == REDIS_REPLY_ARRAY && r->elements >= 3 &&
                 strcmp(r->element[0]->str, "slave") == 0 &&
                 r->element[2]->integer == master_port;
        freeReplyObject(r);
        redisFree(c);
        if (is)
            return sv->ports[i];
    }
    return -1;
}
