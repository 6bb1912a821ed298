/* redis/cluster.c - which node a key's command goes to.
 *
 * Redis Cluster splits the keys into 16384 slots (crc16.c) and each slot
 * has one master. A client keeps a map slot -> master, taken from CLUSTER
 * SLOTS, and the servers correct it when it is out of date:
 *
 *  - MOVED slot host:port: the slot lives elsewhere for good (a
 *    resharding finished, or a failover promoted a replica). The client
 *    sends that one command again to the named node at once, and reloads
 *    the whole map before its next round, since one moved slot usually
 *    means many.
 *  - ASK slot host:port: the slot is being migrated and this key has
 *    already gone. Only this command goes to the named node, preceded by
 *    ASKING; the map stays as it is until the migration ends with MOVED.
 *
 * Nodes are kept by address for the life of the handle, each with its own
 * pool of connections; a node that dies keeps its entry (its connections
 * closed) and is simply no longer in the map after a refresh. The map is
 * refreshed from the first node that answers, trying those that own slots
 * and then the seeds of the URI, so the loss of any one node, seed or
 * not, leaves the client able to find the promoted replica. */
#include <stdlib.h>
#include <string.h>

#include "redis.h"

int idem__rnode_get(idem__redis *r, const char *host, size_t hostlen,
                    int port)
{
    for (size_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].port == port && strlen(r->nodes[i].host) == hostlen &&
            memcmp(r->nodes[i].host, host, hostlen) == 0)
            return (int)i;
    if (r->nnodes >= 65535)
        return -1;
    if (r->nnodes == r->capnodes) {
        size_t cap = r->capnodes ? r->capnodes * 2 : 8;
        idem__rnode *p = realloc(r->nodes, cap * sizeof *p);
        if (!p)
            return -1;
        r->nodes = p;
        uint64_t *c = realloc(r->scan_cursor, cap * sizeof *c);
        if (!c)
            return -1;
        r->scan_cursor = c;
        r->capnodes = cap;
    }
    idem__rnode *n = &r->nodes[r->nnodes];
    memset(n, 0, sizeof *n);
    n->host = malloc(hostlen + 1);
    n->conns = calloc((size_t)r->cfg.pool, sizeof *n->conns);
    if (!n->host || !n->conns) {
        free(n->host);
        free(n->conns);
        return -1;
    }
    memcpy(n->host, host, hostlen);
    n->host[hostlen] = '\0';
    n->port = port;
    r->scan_cursor[r->nnodes] = 0;
    return (int)r->nnodes++;
}

int idem__has_map(const idem__redis *r)
{
    return r->cfg.cluster || r->cfg.sentinel;
}

int idem__route(const idem__redis *r, unsigned slot)
{
    if (!r->cfg.cluster)
        return r->single;
    return (int)r->slots[slot] - 1;
}

int idem__redirect(idem__redis *r, const redisReply *err, int *is_ask)
{
    const char *p = err->str;
    if (strncmp(p, "MOVED ", 6) == 0) {
        *is_ask = 0;
        p += 6;
    } else if (strncmp(p, "ASK ", 4) == 0) {
        *is_ask = 1;
        p += 4;
    } else {
        return -1;
    }
    char *end;
    unsigned long slot = strtoul(p, &end, 10);
    if (end == p || *end != ' ' || slot >= IDEM__SLOTS)
        return -1;
    const char *addr = end + 1;
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return -1;
    long port = strtol(colon + 1, &end, 10);
    if (port <= 0 || port > 65535)
        return -1;
    int node = idem__rnode_get(r, addr, (size_t)(colon - addr), (int)port);
    if (node >= 0 && !*is_ask)
        r->slots[slot] = (uint16_t)(node + 1);
    return node;
}

/* Fill slots from a CLUSTER SLOTS reply got from node `from`. */
static int idem__map_parse(idem_store *s, idem__redis *r, size_t from,
                           const redisReply *rep, uint16_t *slots)
{
    if (rep->type != REDIS_REPLY_ARRAY)
        return idem__fail(s, IDEM_EPROTO, "%s: CLUSTER SLOTS: not an array",
                          s->uri);
    size_t covered = 0;
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            e->element[2]->type != REDIS_REPLY_ARRAY ||
            e->element[2]->elements < 2)
            return idem__fail(s, IDEM_EPROTO, "%s: CLUSTER SLOTS: bad "
                              "entry %zu", s->uri, i);
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        const redisReply *m = e->element[2];
        if (lo < 0 || hi >= IDEM__SLOTS || lo > hi ||
            m->element[0]->type != REDIS_REPLY_STRING ||
            m->element[1]->type != REDIS_REPLY_INTEGER)
            return idem__fail(s, IDEM_EPROTO, "%s: CLUSTER SLOTS: bad "
                              "entry %zu", s->uri, i);
        const char *host = m->element[0]->str;
        size_t hostlen = m->element[0]->len;
        if (hostlen == 1 && host[0] == '?')
            continue;  /* endpoint unknown to this node: leave unmapped */
        if (hostlen == 0) {
            /* "" means: the address you reached me at. The strdup'd
             * host of `from` may move when nodes grow, so copy it. */
            char *h = idem__strdup(r->nodes[from].host);
            if (!h)
                return idem__fail(s, IDEM_ENOMEM, "out of memory");
            int node = idem__rnode_get(r, h, strlen(h),
                                       (int)m->element[1]->integer);
            free(h);
            if (node < 0)
                return idem__fail(s, IDEM_ENOMEM, "out of memory");
            for (long long k = lo; k <= hi; k++)
                slots[k] = (uint16_t)(node + 1);
        } else {
            int node = idem__rnode_get(r, host, hostlen,
                                       (int)m->element[1]->integer);
            if (node < 0)
                return idem__fail(s, IDEM_ENOMEM, "out of memory");
            for (long long k = lo; k <= hi; k++)
                slots[k] = (uint16_t)(node + 1);
        }
        covered += (size_t)(hi - lo + 1);
    }
    if (covered == 0)
        return idem__fail(s, IDEM_EPROTO, "%s: the cluster has no slots "
                          "assigned", s->uri);
    return 0;
}

/* The order to ask nodes for the map in: the node that answered last
 * time, then nodes that own slots (the likeliest to be alive and to know
 * the newest map), then every other node, seeds included. */
static size_t idem__map_order(const idem__redis *r, size_t *order)
{
    size_t n = 0;
    if (r->map_node >= 0 && (size_t)r->map_node < r->nnodes)
        order[n++] = (size_t)r->map_node;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < r->nnodes; i++) {
            int owns = 0;
            for (size_t k = 0; k < IDEM__SLOTS && !owns; k++)
                owns = r->slots[k] == i + 1;
            if (owns == (pass == 0) && (int)i != r->map_node)
                order[n++] = i;
        }
    return n;
}

/* Ask node i for CLUSTER SLOTS within ms; 0 with the map in slots. */
static int idem__map_ask(idem_store *s, idem__redis *r, size_t i, int64_t ms,
                         uint16_t *slots)
{
    idem__rconn *conn = &r->nodes[i].conns[0];
    int rc = 0;
    if (!conn->c)
        rc = idem__rconn_open(s, r, &r->nodes[i], conn,
                              ms < r->cfg.connect_ms ? ms : r->cfg.connect_ms);
    if (rc)
        return rc;
    idem__rconn_deadline(conn, ms);
    const char *argv[] = {"CLUSTER", "SLOTS"};
    size_t lens[] = {7, 5};
    redisReply *rep = idem__rconn_command(s, conn, 2, argv, lens, &rc);
    if (!rep)
        return rc;
    if (rep->type == REDIS_REPLY_ERROR) {
        if (strstr(rep->str, "cluster support disabled"))
            rc = idem__fail(s, IDEM_EINVAL, "%s: %s:%d is not a cluster node "
                            "(cluster support disabled): use redis://",
                            s->uri, r->nodes[i].host, r->nodes[i].port);
        else
            rc = idem__fail(s, IDEM_EPROTO, "%s: CLUSTER SLOTS: %s", s->uri,
                            rep->str);
    } else {
        memset(slots, 0, IDEM__SLOTS * sizeof *slots);
        rc = idem__map_parse(s, r, i, rep, slots);
    }
    freeReplyObject(rep);
    return rc;
}

/* A node that accepts connections but never answers (stopped, hung in a
 * fork, behind a black hole) must not cost the whole budget, or the map
 * would never be refreshed past it: each node gets an equal share of
 * what is left, but no less than IDEM__MAP_SLICE_MS. */
#define IDEM__MAP_SLICE_MS 250

int64_t idem__slice_ms(int64_t deadline, size_t tries)
{
    int64_t left = deadline - idem__mono_ms();
    int64_t ms = left / (int64_t)(tries ? tries : 1);
    ms = ms < IDEM__MAP_SLICE_MS ? IDEM__MAP_SLICE_MS : ms;
    return ms < left ? ms : left;
}

int idem__map_refresh(idem_store *s, idem__redis *r, int64_t deadline)
{
    if (r->cfg.sentinel)
        return idem__sentinel_refresh(s, r, deadline);
    uint16_t *slots = calloc(IDEM__SLOTS, sizeof *slots);
    size_t *order = calloc(r->nnodes ? r->nnodes : 1, sizeof *order);
    int rc = slots && order ? IDEM_ECONN
                            : idem__fail(s, IDEM_ENOMEM, "out of memory");
    size_t n = rc == IDEM_ECONN ? idem__map_order(r, order) : 0;
    for (size_t j = 0; j < n && deadline - idem__mono_ms() > 0; j++) {
        rc = idem__map_ask(s, r, order[j], idem__slice_ms(deadline, n - j),
                           slots);
        if (rc == 0) {
            memcpy(r->slots, slots, IDEM__SLOTS * sizeof *slots);
            r->map_stale = 0;
            r->map_node = (int)order[j];
            break;
        }
        if ((int)order[j] == r->map_node)
            r->map_node = -1;
        if (rc == IDEM_EAUTH || rc == IDEM_ENOMEM || rc == IDEM_EINVAL)
            break;
    }
    free(order);
    free(slots);
    return rc;
}
