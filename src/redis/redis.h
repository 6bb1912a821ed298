/* redis.h - what the Redis backend's files share.
 *
 * uri.c           turns a redis://, redis-cluster:// or redis-sentinel://
 *                 URI into settings
 * conn.c          one connection: connect, AUTH, SELECT, load scripts,
 *                 time limits, safe writes, reading error replies
 * cluster.c       the nodes and the slot map: where a key's command goes,
 *                 MOVED and ASK, refreshing the map from CLUSTER SLOTS
 * sentinel.c      redis-sentinel://: which node is the master, asked of
 *                 the sentinels again after each failure
 * pipe.c          batches of script calls: grouped, pipelined per node,
 *                 retried through redirects and failures within a budget
 * sweep.c         SCAN every master: sweep and stats
 * ckpt.c          checkpoints, and the writes queued to commit with them
 * scripts.c       the claim protocol in Lua, run inside Redis
 * redis.c         the backend: each operation as a batch, replies turned
 *                 into outcomes, open and close
 *
 * A single server is a cluster of one node that owns every slot and is
 * never asked for a map, so the same rounds serve both schemes. A
 * sentinel store is a single server whose one node is re-resolved: its
 * "map" is the sentinels' answer, refreshed where a cluster's would be. */
#ifndef IDEM_REDIS_H
#define IDEM_REDIS_H

#include <hiredis/hiredis.h>
#include <signal.h>

#include "crc16.h"
#include "scripts.h"
#include "store.h"

/* Settings from the URI. */
typedef struct idem__rcfg {
    int cluster;              /* redis-cluster:// */
    int sentinel;             /* redis-sentinel:// */
    char **hosts;             /* seeds (sentinel: the sentinels): host */
    int *ports;               /* and port pairs */
    size_t nseeds;
    char *user, *pass;        /* NULL: no AUTH */
    char *pass_file;          /* password_file=, read into pass */
    char *master;             /* sentinel: the master's name */
    char *sentinel_user;      /* sentinel: AUTH on the sentinels */
    char *sentinel_pass;
    char *sentinel_pass_file; /* read into sentinel_pass */
    int db;                   /* SELECT; single server only */
    int64_t timeout_ms;       /* budget of one call, retries included */
    int64_t connect_ms;       /* budget of one connection attempt */
    char *prefix;             /* key name prefix; "idempotency:" */
    size_t prefixlen;
    int pool;                 /* connections per node */
    int wait;                 /* WAIT for this many replicas after writes */
    int layout;               /* IDEM__LAYOUT_HASH or IDEM__LAYOUT_DAY */
    int days;                 /* day layout: a bucket's life after its day */
    int shards;               /* day layout: buckets per day */
    char (*tags)[12];         /* day layout: shard -> hash tag ... */
    unsigned *tag_slots;      /* ... and the slot it hashes to */
} idem__rcfg;

/* Bounds of the day layout's settings: a lookup reads days + 1 buckets,
 * and a call names days + 3 of them. */
#define IDEM__MAX_DAYS 90
#define IDEM__MAX_SHARDS 1024
#define IDEM__DAY_MS 86400000LL

/* The URI forms: redis://, redis-cluster://, redis-sentinel://. */
enum { IDEM__RK_SINGLE, IDEM__RK_CLUSTER, IDEM__RK_SENTINEL };

/* Parse rest (what follows the scheme's ':') of a URI of that kind. */
int idem__rcfg_parse(idem_store *s, int kind, const char *rest,
                     idem__rcfg *cfg);
void idem__rcfg_free(idem__rcfg *cfg);
/* The name of URI parameter i (0, 1, ...), or NULL past the last: what
 * tests compare with docs/uri.md. */
const char *idem__rparam_name(size_t i);

/* What a reply slot in a connection's pipeline stands for. */
enum { IDEM__IN_LOAD, IDEM__IN_ASKING, IDEM__IN_CMD, IDEM__IN_WAIT };

typedef struct idem__inflight {
    int kind;
    size_t cmd;               /* IDEM__IN_CMD: index of the command */
} idem__inflight;

/* One connection to one node. */
typedef struct idem__rconn {
    redisContext *c;          /* NULL: not connected */
    int loaded;               /* scripts were sent on this connection */
    int wrote;                /* this round sent writes (for WAIT) */
    uint64_t fail_round;      /* the round a connect failed in ... */
    int fail_code;            /* ... and why: not tried again in it */
    idem__inflight *in;       /* replies expected this round, in order */
    size_t nin, capin;
    int64_t limit_ms;         /* the last time limit set, for messages */
} idem__rconn;

typedef struct idem__rnode {
    char *host;
    int port;
    int sentinel;             /* a sentinel: sentinel_user/_password, no
                               * SELECT, one connection */
    idem__rconn *conns;       /* cfg.pool of them (a sentinel: one) */
} idem__rnode;

/* A checkpoint queued by idem_checkpoint_put() until idem_sync(), with
 * the writes checked meanwhile, encoded as the intent they are stored as
 * (ckpt.c). name is NULL when nothing is queued. */
typedef struct idem__rckpt {
    char *name;
    idem__buf blob;
    idem__buf intent;
    idem__buf writes;             /* idem_checkpoint_write()'s, msgpack */
    size_t nwrites;
    idem__buf comps;              /* completions the put applies (ckpt.c,
                                   * one script): msgpack strings */
    size_t ncomps;
} idem__rckpt;

typedef struct idem__redis {
    idem__rcfg cfg;
    char shas[IDEM__S_COUNT][41];
    idem__rnode *nodes;
    size_t nnodes, capnodes;
    uint16_t *slots;          /* cluster: slot -> node index + 1; 0 unknown */
    int single;               /* not a cluster: the node that serves every
                               * slot (sentinel: the master last found) */
    idem__rnode *sentinels;   /* sentinel: cfg.nseeds of them */
    int map_stale;            /* refresh the slot map (sentinel: ask for
                               * the master) before the next round */
    int map_node;             /* the node that gave the map last (sentinel:
                               * the index of the sentinel); -1 */
    uint64_t rid_base, rid_next;  /* request ids: random base, counter */
    uint64_t round;           /* rounds run by this handle, from 1 */
    uint64_t *scan_cursor;    /* sweep/stats: SCAN cursor per node */
    uint64_t expired_total;
    idem__rckpt ck;           /* queued checkpoint, if any */
    idem__buf wreply;         /* the last sync's answers to its queued
                               * writes, each a size_t length, the
                               * bytes and a NUL */
    size_t nwreply;
} idem__redis;

/* ---- pipe.c */

/* ARGV of one key after the shared ones; keys per multi-key call. */
#define IDEM__RARGS 9   /* import takes the most: a whole record */
#define IDEM__GROUP 64

/* One key of a batch. */
typedef struct idem__ritem {
    size_t name_off, name_len;   /* its Redis key (day layout: its field
                                  * in a bucket), in the batch's names */
    unsigned slot;
    unsigned shard;              /* day layout: its buckets' shard */
    int nargs;
    const char *arg[IDEM__RARGS];
    size_t argl[IDEM__RARGS];
    char num[5][24];             /* storage for numeric arguments */
    const redisReply *reply;     /* its answer after idem__run(), or NULL */
    int status;                  /* ... or why it has none */
} idem__ritem;

/* One EVALSHA: one item, or up to IDEM__GROUP items of one slot. */
typedef struct idem__rcmd {
    size_t first, count;         /* its items: order[first..first+count) */
    unsigned slot;
    redisReply *reply;           /* once done with status 0 */
    int status;                  /* final error, or 0 */
    int done;
    int ask;                     /* node to send ASKING + command, or -1 */
    int lasterr;                 /* why the last try did not answer */
    int moved;                   /* status set by a redirect (b->stay) */
} idem__rcmd;

typedef struct idem__rbatch {
    int script;
    int multi;                   /* the script takes many keys */
    int raw;                     /* keys are named whole (checkpoints),
                                  * not records of the layout */
    int write;                   /* the script changes records */
    int whole;                   /* one answer per command, for all its
                                  * keys (scans), not one per key */
    int stay;                    /* keys belong to the node they were
                                  * found on: a redirect ends the command
                                  * (EPROTO, moved) instead of following */
    idem__ritem *items;
    size_t nitems;
    size_t *order;               /* items grouped by slot */
    idem__rcmd *cmds;
    size_t n;
    idem__buf names;
    char now[24];                /* ARGV[1]: "" for server time */
    const char *common[2];       /* ARGV shared by every key, after now */
    size_t commonl[2];
    int ncommon;
    char cnum[2][24];
    char firstmsg[512];          /* detail of the first final error */
    char lastmsg[512];           /* detail of the last transient error */
    int64_t day0;                /* day layout: the first bucket's day */
    idem__buf buckets;           /* day layout: one command's bucket names */
    const char *argv[12 + IDEM__MAX_DAYS + IDEM__GROUP * (IDEM__RARGS + 2)];
    size_t argl[12 + IDEM__MAX_DAYS + IDEM__GROUP * (IDEM__RARGS + 2)];
} idem__rbatch;

/* A batch of up to n keys for script. 0 or IDEM_ENOMEM. */
int idem__batch_init(idem_store *s, idem__rbatch *b, int script, size_t n);
void idem__batch_free(idem__rbatch *b);
/* Add key; fill its arguments with idem__arg*. NULL on ENOMEM. */
idem__ritem *idem__item_add(idem_store *s, idem__rbatch *b, const void *key,
                            size_t keylen);
/* The hash layout's name of key's record, PREFIX{KEY}, appended to out.
 * 0 or IDEM_ENOMEM. */
int idem__record_name(const idem__redis *r, idem__buf *out, const void *key,
                      size_t keylen);
void idem__arg(idem__ritem *it, const void *p, size_t n);
void idem__argnum(idem__ritem *it, int slot, long long v);
/* A request id unique to this handle and, by its random base, to every
 * other: lets a retried write recognise its own first run. */
void idem__argrid(idem_store *s, idem__ritem *it, int slot);
/* The next request id into buf (NUL-terminated); its length. */
size_t idem__rid(idem_store *s, char buf[24]);
/* An argument every key of the batch shares, after the time. */
void idem__batch_common(idem__rbatch *b, int slot, long long v);
/* Run the batch. Each item ends with a reply (b->whole: its command's,
 * shared with the command's other items) or a status. Returns 0 if
 * every item has a reply or an error of its own key (EPROTO); otherwise
 * the error (ECONN, ETIMEOUT, EAUTH, ENOMEM) that kept some from one. */
int idem__run(idem_store *s, idem__rbatch *b, int write);
/* Is e (an error reply) one after which the same command may succeed
 * later: TRYAGAIN, CLUSTERDOWN, LOADING, BUSY, MASTERDOWN, READONLY? */
int idem__transient(const char *e);

/* ---- redis.c */

/* One key, one script call: begin, add the arguments to it, run (0 with
 * it->reply set, or the error), end. */
typedef struct idem__one {
    idem__rbatch *b;
    idem__ritem *it;
} idem__one;
int idem__one_begin(idem_store *s, idem__one *one, int script,
                    const void *key, size_t keylen);
int idem__one_run(idem_store *s, idem__one *one, int write);
void idem__one_end(idem__one *one);

/* Apply completions / a failure now, with the given request ids (rids[i]
 * NUL-terminated; rids NULL or rid NULL: new ones), as the store ops do
 * without a queued checkpoint. */
int idem__redis_complete_run(idem_store *s, const idem_completion *items,
                             size_t n, int *st, const char *const *rids);
int idem__redis_fail_run(idem_store *s, const void *key, size_t keylen,
                         uint64_t token, const void *err, size_t len,
                         int retryable, int64_t ttl_ms, const char *rid);
/* A finishing script's answer rep for token: 0 or IDEM_ELOST, or
 * IDEM_EPROTO for an answer that is neither (the detail says which). */
int idem__finish_answer_of(idem_store *s, const redisReply *rep,
                        uint64_t token);
/* The extend_many op: renew each token's lease, per key 0 or
 * IDEM_ELOST. */
int idem__redis_extend_many(idem_store *s, const idem_completion *items,
                            size_t n, int64_t lease_ms, int *st);

/* ---- ckpt.c */

int idem__ckpt_put(idem_store *s, const char *name, const void *blob,
                   size_t len);
int idem__ckpt_get(idem_store *s, const char *name, const void **blob,
                   size_t *len);
/* Commit the queued checkpoint with its writes; 0 if none is queued. */
int idem__ckpt_sync(idem_store *s);
int idem__ckpt_write_cmd(idem_store *s, int argc, const char *const *argv,
                         const size_t *argvlen, int keyidx, size_t *index);
int idem__ckpt_reply(idem_store *s, size_t index, const char **text,
                     size_t *len);
int idem__ckpt_queued(idem_store *s);
/* Queue completions to be applied by the next sync; with check, each
 * is checked now first (the token holds the key; its lease is renewed),
 * else only by the sync (idem__ckpt_folds() must hold then). */
int idem__ckpt_hold_completes(idem_store *s, const idem_completion *items,
                              size_t n, int *st, int check);
/* Does the sync apply the queued completions in its one script (a single
 * server, layout hash), rather than after it? */
int idem__ckpt_folds(const idem__redis *r);
/* Check a failure now (as for completions) and queue it. */
int idem__ckpt_hold_fail(idem_store *s, const void *key, size_t keylen,
                         uint64_t token, const void *err, size_t len,
                         int retryable);
/* Drop what is queued (the poison op: it must never be committed). */
void idem__ckpt_poison(idem_store *s, int code);
void idem__ckpt_free(idem__rckpt *ck);
/* Append one write to an intent: op 'c' (complete), 'f' (fail) or 'r'
 * (retryable fail), with its request id. 0 or IDEM_ENOMEM. */
int idem__intent_add(idem__buf *b, char op, uint64_t token, int64_t ttl_ms,
                     const char *rid, const void *key, size_t keylen,
                     const void *val, size_t vallen);

/* ---- sweep.c */

int idem__redis_sweep(idem_store *s, size_t max_work, uint64_t *expired);
int idem__redis_stats(idem_store *s, idem_stats *out);
/* idem_server_metrics_get(): INFO of every master. */
int idem__redis_server_metrics(idem_store *s, idem_server_metrics *out,
                               size_t max, size_t *n);
/* idem_check() (repair 0) and idem_repair() (1) of a Redis store:
 * records idem cannot read, deleted by repair. segments gets the keys
 * looked at. 0, IDEM_ECORRUPT (check found some) or an error. */
int idem__redis_check(idem_store *s, int repair, idem_check_report *out);
/* idem_scan(): every live record, through fn. */
int idem__redis_scan(idem_store *s, idem_scan_fn fn, void *ctx);

/* ---- conn.c */

/* SIGPIPE blocked in this thread for the duration of a call's I/O. */
typedef struct idem__sigstate {
    sigset_t old;
    int was_pending;
} idem__sigstate;
void idem__nosigpipe_begin(idem__sigstate *st);
void idem__nosigpipe_end(idem__sigstate *st);

/* Connect conn to node within ms milliseconds and make it ready: AUTH,
 * SELECT. 0 or IDEM_ECONN / IDEM_EAUTH / IDEM_ETIMEOUT / IDEM_EPROTO with
 * the detail set. */
int idem__rconn_open(idem_store *s, idem__redis *r, idem__rnode *node,
                     idem__rconn *conn, int64_t ms);
void idem__rconn_close(idem__rconn *conn);
/* Read and write time limit for the next blocking step. */
void idem__rconn_deadline(idem__rconn *conn, int64_t ms);
/* Why the last I/O on conn failed, for a message: "no answer within N
 * ms" after a time-out (hiredis says "Resource temporarily
 * unavailable"), else hiredis's reason. In buf (n bytes). */
const char *idem__rconn_why(const idem__rconn *conn, char *buf, size_t n);
/* Write everything buffered, without SIGPIPE. 0 or -1 (conn->c->errstr). */
int idem__rconn_flush(idem__rconn *conn);
/* Queue an expected reply. 0 or IDEM_ENOMEM. */
int idem__rconn_expect(idem__rconn *conn, int kind, size_t cmd);
/* A blocking command on a connection (setup, SCAN, CLUSTER SLOTS).
 * Returns the reply (caller frees) or NULL with the detail set and *code
 * the error. */
redisReply *idem__rconn_command(idem_store *s, idem__rconn *conn, int argc,
                                const char **argv, const size_t *lens,
                                int *code);
/* Was the I/O error on conn a timeout? */
int idem__rconn_timed_out(const idem__rconn *conn);

/* ---- cluster.c */

/* Can the handle learn anew where keys live: a cluster's slot map, a
 * sentinel's master? Then a failure marks the map stale. */
int idem__has_map(const idem__redis *r);

/* Find or add the node host:port; its index, or -1 on ENOMEM. */
int idem__rnode_get(idem__redis *r, const char *host, size_t hostlen,
                    int port);
/* The node that owns slot, or -1 if the map does not say. */
int idem__route(const idem__redis *r, unsigned slot);
/* The time one of `tries` more nodes gets to answer, out of what is
 * left until deadline: an equal share, but at least 250 ms, so that a
 * node that hangs costs its share, never the whole budget. */
int64_t idem__slice_ms(int64_t deadline, size_t tries);
/* Rebuild the slot map from the first node that answers CLUSTER SLOTS,
 * connecting as needed (sentinel: idem__sentinel_refresh). 0, or the
 * error of the last node tried. */
int idem__map_refresh(idem_store *s, idem__redis *r, int64_t deadline);
/* An error reply "MOVED slot host:port" or "ASK slot host:port": the
 * node it names (added if new), or -1 if it is not one of those. */
int idem__redirect(idem__redis *r, const redisReply *err, int *is_ask);

/* ---- sentinel.c */

/* Make the sentinels' nodes from the URI's hosts. 0 or IDEM_ENOMEM. */
int idem__sentinels_init(idem_store *s, idem__redis *r);
void idem__sentinels_free(idem__redis *r);
/* Ask the sentinels in turn for the master, and make the first answer
 * whose node says ROLE master the single node. 0, or the error that
 * says most (named sentinels and master, in the detail). */
int idem__sentinel_refresh(idem_store *s, idem__redis *r, int64_t deadline);
/* idem__sentinel_refresh() again and again within timeout_ms while no
 * master can be reached (a failover under way): what open does. */
int idem__sentinel_locate(idem_store *s, idem__redis *r);

#endif
