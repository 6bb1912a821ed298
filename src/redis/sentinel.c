/* redis/sentinel.c - where a redis-sentinel:// store's master is.
 *
 * Redis Sentinel watches a master and its replicas, and when the master
 * dies promotes a replica in its place. A client learns the master's
 * address from the sentinels (SENTINEL get-master-addr-by-name NAME) and
 * asks again after a failover. idem does that and nothing more: a
 * sentinel store is a single-server store (redis://) whose one node,
 * r->single, is re-resolved. Its "map" is the sentinels' answer, and it
 * goes stale on the failures that make a cluster's slot map stale (a
 * refused, broken or timed-out connection, a READONLY reply), so pipe.c
 * re-resolves it between rounds as it reloads a cluster's map, within
 * the same budget (timeout_ms). A failover that completes within the
 * budget of a call is invisible to its caller, as on a cluster.
 *
 * A sentinel's answer can be stale: one cut off from the others, or one
 * that has not yet seen the failover, names the old master, which may
 * be back as a replica. Writing there would fail (READONLY), or worse on
 * a replica set writable, land where nobody reads it; so the node named
 * must say ROLE master before it becomes the single node, and an answer
 * that fails that check sends us on to the next sentinel. The sentinels
 * are asked in turn, the one that answered last first; a sentinel that
 * is down or hung costs a slice of the budget (as a cluster node does in
 * idem__map_refresh), never all of it.
 *
 * What a sentinel store does not do: subscribe to +switch-master. A
 * switch is found by the first call that fails on the old master: a dead
 * one at once; one deposed alive (a manual failover, a partition) once
 * the sentinels demote it and close its clients' connections, or on a
 * READONLY answer, or (with wait=N) on a WAIT that fails, since its
 * replicas went to the new master. Until then, without wait, claims it
 * acknowledges are lost with it: asynchronous replication's caveat,
 * which docs/redis.md states.
 *
 * Sentinels have credentials of their own (sentinel_user,
 * sentinel_password): conn.c gives a sentinel node those and no SELECT. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

int idem__sentinels_init(idem_store *s, idem__redis *r)
{
    size_t n = r->cfg.nseeds;
    r->sentinels = calloc(n, sizeof *r->sentinels);
    if (!r->sentinels)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        idem__rnode *sn = &r->sentinels[i];
        sn->host = idem__strdup(r->cfg.hosts[i]);
        sn->port = r->cfg.ports[i];
        sn->sentinel = 1;
        sn->conns = calloc(1, sizeof *sn->conns);
        if (!sn->host || !sn->conns)
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    return 0;
}

void idem__sentinels_free(idem__redis *r)
{
    for (size_t i = 0; r->sentinels && i < r->cfg.nseeds; i++) {
        idem__rnode *sn = &r->sentinels[i];
        if (sn->conns) {
            idem__rconn_close(&sn->conns[0]);
            free(sn->conns[0].in);
        }
        free(sn->conns);
        free(sn->host);
    }
    free(r->sentinels);
    r->sentinels = NULL;
}

/* The detail of the last failure, about node nd, as a reason to list
 * after nd's address: without the URI and the address it would repeat
 * ("cannot connect to H:P: why" becomes "cannot connect: why"). */
static const char *idem__reason(const idem_store *s, const idem__rnode *nd,
                                char *buf, size_t cap)
{
    size_t n = strlen(s->uri);
    const char *d = s->detail;
    if (strncmp(d, s->uri, n) == 0 && strncmp(d + n, ": ", 2) == 0)
        d += n + 2;
    char addr[300];
    int al = snprintf(addr, sizeof addr, "cannot connect to %s:%d: ",
                      nd->host, nd->port);
    if (al > 0 && (size_t)al < sizeof addr &&
        strncmp(d, addr, (size_t)al) == 0)
        snprintf(buf, cap, "cannot connect: %s", d + al);
    else
        snprintf(buf, cap, "%s", d);
    return buf;
}

/* conn (node's first connection) up within ms, reusing it if it is. */
static int idem__conn_up(idem_store *s, idem__redis *r, idem__rnode *node,
                         int64_t ms)
{
    idem__rconn *conn = &node->conns[0];
    int rc = conn->c ? 0 : idem__rconn_open(s, r, node, conn,
                                            ms < r->cfg.connect_ms
                                                ? ms : r->cfg.connect_ms);
    if (!rc)
        idem__rconn_deadline(conn, ms);
    return rc;
}

/* A sentinel's answer: {host, port}, nil for a name it does not know,
 * an error from a server that is no sentinel. *node gets the master's
 * node, added if new. */
static int idem__master_of(idem_store *s, idem__redis *r,
                           const redisReply *rep, int *node)
{
    if (rep->type == REDIS_REPLY_NIL)
        return idem__fail(s, IDEM_EINVAL, "knows no master named '%s'",
                          r->cfg.master);
    if (rep->type == REDIS_REPLY_ERROR)
        return idem__fail(s, IDEM_EINVAL, "is not a sentinel (it answers "
                          "'%.*s')", (int)strcspn(rep->str, ","), rep->str);
    char *end = NULL;
    long port = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
                        rep->element[0]->type == REDIS_REPLY_STRING &&
                        rep->element[1]->type == REDIS_REPLY_STRING
                    ? strtol(rep->element[1]->str, &end, 10)
                    : 0;
    if (port <= 0 || port > 65535 || !end || *end)
        return idem__fail(s, IDEM_EPROTO, "an answer to SENTINEL "
                          "get-master-addr-by-name that is no address");
    *node = idem__rnode_get(r, rep->element[0]->str, rep->element[0]->len,
                            (int)port);
    return *node < 0 ? idem__fail(s, IDEM_ENOMEM, "out of memory") : 0;
}

/* Ask sentinel i, within ms, where the master is: *node. */
static int idem__ask_sentinel(idem_store *s, idem__redis *r, size_t i,
                              int64_t ms, int *node)
{
    idem__rnode *sn = &r->sentinels[i];
    int rc = idem__conn_up(s, r, sn, ms);
    if (rc)
        return rc;
    const char *argv[3] = {"SENTINEL", "get-master-addr-by-name",
                           r->cfg.master};
    size_t lens[3] = {8, 23, strlen(r->cfg.master)};
    redisReply *rep = idem__rconn_command(s, &sn->conns[0], 3, argv, lens,
                                          &rc);
    if (!rep)
        return rc;
    rc = idem__master_of(s, r, rep, node);
    freeReplyObject(rep);
    return rc;
}

/* Does node, within ms, say ROLE master? 0, or why not: a replica (a
 * stale answer, or a promotion not finished) is IDEM_ECONN, a state a
 * later try may find changed. */
static int idem__check_master(idem_store *s, idem__redis *r, int node,
                              int64_t ms)
{
    idem__rnode *nd = &r->nodes[node];
    int rc = idem__conn_up(s, r, nd, ms);
    if (rc)
        return rc;
    const char *argv[1] = {"ROLE"};
    size_t lens[1] = {4};
    redisReply *rep = idem__rconn_command(s, &nd->conns[0], 1, argv, lens,
                                          &rc);
    if (!rep)
        return rc;
    const char *role = rep->type == REDIS_REPLY_ARRAY && rep->elements &&
                               rep->element[0]->type == REDIS_REPLY_STRING
                           ? rep->element[0]->str
                           : "?";
    if (strcmp(role, "master") != 0)
        rc = idem__fail(s, IDEM_ECONN, "%s:%d says ROLE %s, not master",
                        nd->host, nd->port,
                        rep->type == REDIS_REPLY_ERROR ? rep->str : role);
    freeReplyObject(rep);
    return rc;
}

/* node is the master now: the old one's connections go (the node is
 * dead or a replica; its entry stays, as a cluster's nodes do). */
static void idem__switch_master(idem__redis *r, int node)
{
    if (node != r->single)
        for (int k = 0; k < r->cfg.pool; k++)
            idem__rconn_close(&r->nodes[r->single].conns[k]);
    r->single = node;
    r->map_stale = 0;
}

/* Which failure says most about why no master was found, so that the
 * error is the one to act on: a master named but unreachable (a
 * failover under way: retry), credentials refused, a name unknown or
 * a server that is no sentinel, and last a sentinel unreachable. */
static int idem__rank(int rc, int named)
{
    return named ? 4 : rc == IDEM_EAUTH ? 3
                   : rc == IDEM_EINVAL || rc == IDEM_EPROTO ? 2 : 1;
}

/* Why no sentinel led to a master: "ADDR: what; ADDR, ADDR: what",
 * sentinels that failed alike sharing an entry. at: where the last
 * entry's "what" begins. */
typedef struct idem__why {
    char list[512];
    size_t at;
} idem__why;

static void idem__why_add(idem__why *w, const char *addr, const char *what)
{
    size_t n = strlen(w->list), cap = sizeof w->list;
    size_t al = strlen(addr) + 2;
    if (n && strcmp(w->list + w->at, what) == 0) {
        if (n + al < cap) {
            memmove(w->list + w->at + al, w->list + w->at, n - w->at + 1);
            memcpy(w->list + w->at, ", ", 2);
            memcpy(w->list + w->at + 2, addr, al - 2);
            w->at += al;
        }
        return;
    }
    int k = snprintf(w->list + n, cap - n, "%s%s", n ? "; " : "", addr);
    if (k > 0 && (size_t)k < cap - n) {
        w->at = n + (size_t)k;
        snprintf(w->list + w->at, cap - w->at, "%s", what);
    }
}

/* Try sentinel i: 0 with the master switched to, or the error, noted in
 * w, with *named set if the sentinel named a master. */
static int idem__try_sentinel(idem_store *s, idem__redis *r, size_t i,
                              int64_t deadline, size_t tries, int *named,
                              idem__why *w)
{
    const idem__rnode *sn = &r->sentinels[i];
    int node = -1;
    int rc = idem__ask_sentinel(s, r, i, idem__slice_ms(deadline, tries),
                                &node);
    *named = rc == 0;
    if (!rc && deadline - idem__mono_ms() <= 0)
        rc = idem__fail(s, IDEM_ETIMEOUT, "no time left to reach it");
    if (!rc)
        rc = idem__check_master(s, r, node, idem__slice_ms(deadline, tries));
    if (!rc) {
        idem__switch_master(r, node);
        r->map_node = (int)i;
        return 0;
    }
    char addr[300], what[sizeof s->detail + 300], reason[sizeof s->detail];
    const idem__rnode *about = *named ? &r->nodes[node] : sn;
    snprintf(addr, sizeof addr, "%s:%d", sn->host, sn->port);
    if (*named)
        snprintf(what, sizeof what, " named %s:%d: %s", about->host,
                 about->port, idem__reason(s, about, reason, sizeof reason));
    else
        snprintf(what, sizeof what, ": %s",
                 idem__reason(s, about, reason, sizeof reason));
    idem__why_add(w, addr, what);
    return rc;
}

int idem__sentinel_refresh(idem_store *s, idem__redis *r, int64_t deadline)
{
    size_t n = r->cfg.nseeds;
    size_t first = r->map_node >= 0 ? (size_t)r->map_node : 0;
    idem__why w = {"", 0};
    char before[sizeof s->detail];
    int rc = IDEM_ETIMEOUT, best = 0;
    /* A sentinel skipped on the way to an answer is no failure. */
    idem__scopy(before, sizeof before, s->detail);
    for (size_t j = 0; j < n && deadline - idem__mono_ms() > 0; j++) {
        int named = 0;
        int one = idem__try_sentinel(s, r, (first + j) % n, deadline,
                                     n - j, &named, &w);
        if (one == 0)
            idem__scopy(s->detail, sizeof s->detail, before);
        if (one == 0 || one == IDEM_ENOMEM)
            return one;
        if (idem__rank(one, named) >= best) {
            best = idem__rank(one, named);
            rc = one;
        }
    }
    r->map_node = -1;
    return idem__fail(s, rc, "%s: no master '%s' found through the "
                      "sentinels: %s", s->uri, r->cfg.master,
                      w.list[0] ? w.list : "no time left to ask them");
}

int idem__sentinel_locate(idem_store *s, idem__redis *r)
{
    int64_t deadline = idem__mono_ms() + r->cfg.timeout_ms;
    int64_t backoff = 10;
    for (;;) {
        int rc = idem__sentinel_refresh(s, r, deadline);
        int64_t left = deadline - idem__mono_ms();
        if ((rc != IDEM_ECONN && rc != IDEM_ETIMEOUT) || left <= 0)
            return rc;
        idem__sleep_ms(backoff < left ? backoff : left);
        backoff = backoff * 2 > 500 ? 500 : backoff * 2;
        /* No time left to ask anyone: this answer says why. */
        if (deadline - idem__mono_ms() <= 0)
            return rc;
    }
}
