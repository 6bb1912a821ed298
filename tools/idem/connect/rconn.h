/* rconn.h - a redis-stream:// URI, and one connection to its server. */
#ifndef IDEM_RCONN_H
#define IDEM_RCONN_H

#include <hiredis/hiredis.h>
#include <stdint.h>

#include "idem/idem.h"

#define RS_MAX_HOSTS 16

typedef struct rs_uri {
    char *hosts[RS_MAX_HOSTS];  /* tried in turn; with sentinel, these */
    int ports[RS_MAX_HOSTS];    /* are the sentinels */
    size_t nhosts;
    char *sentinel;         /* sentinel=MASTER: ask them for its address */
    char *user, *pass;      /* NULL: no AUTH */
    char *pwfile;           /* password_file= */
    int db;
    char *stream;           /* percent-decoded */
    size_t streamlen;
    char *group, *consumer; /* source */
    char *start;            /* source: where a new group starts */
    uint64_t maxlen;        /* sink: XADD MAXLEN ~ N; 0: none */
    uint64_t wait;          /* sink: WAIT for this many replicas */
    int64_t timeout_ms;     /* one call (a blocking read adds its block) */
    int64_t readback_ms;    /* sink: how far back a takeover looks; 0:
                             * twice the lease and 10 s */
    uint64_t one_script;    /* 0: never commit with the store's
                             * checkpoint, though on its server */
    char display[512];      /* the URI for messages, password hidden */
} rs_uri;

/* Parse uri; `sink` selects which parameters apply. 0, or 2 after saying
 * why (a usage error of cmd). */
int rs_uri_parse(const char *cmd, const char *uri, int sink, rs_uri *u);
void rs_uri_free(rs_uri *u);
/* The stream u names, for the names of jobs and key spaces (into buf,
 * size bytes, cut to fit): redis-stream://HOST:PORT[,...]/DB/STREAM,
 * with ?sentinel=, and with `worker` its group and consumer. No user,
 * password or parameter that only says how to reach or write it
 * (timeout_ms, maxlen, ...): changing those keeps the job, its position
 * in the sink and its keys. */
void rs_uri_ident(const rs_uri *u, int worker, char *buf, size_t size);

/* Replies built in blocks of memory that the next reply on the
 * connection reuses, instead of two allocations per element (hiredis's
 * own objects): a batch of entries is thousands of elements. The
 * connection's owner keeps it and frees it (rs_arena_free) after the
 * connection. */
typedef struct rs_arena {
    char **blk;             /* blocks, and their sizes */
    size_t *cap;
    size_t n;
    size_t at, used;        /* the block in use, and its bytes used */
} rs_arena;

void rs_arena_free(rs_arena *a);

typedef struct rs_conn {
    const rs_uri *u;
    rs_arena *arena;        /* set before connecting: replies live in it
                             * until the next reply is read, and are let
                             * go with rs_reply_free (never
                             * freeReplyObject); NULL: hiredis's own */
    redisContext *c;        /* NULL until connected */
    int64_t limit_ms;       /* the socket's time limit now; 0: unset */
    char host[256];         /* the node a cluster redirected us to; "" */
    int port;
    char err[1024];         /* why the last call failed */
} rs_conn;

/* One command; connects first if need be (AUTH, SELECT). extra_ms is
 * added to the time limit (a BLOCK). retry: after a lost connection,
 * connect again and send it once more (reads only: a write might have
 * been applied). On a Redis Cluster, a MOVED reply sends it to the node
 * named (which later calls keep using), a connection that fails after a
 * redirect goes back to the URI's node, and ASK or TRYAGAIN (a slot
 * being migrated) tries again shortly (50 times at most). Returns the
 * reply (an error reply too; the caller frees) or NULL with c->err
 * set. */
redisReply *rs_call(rs_conn *c, int argc, const char **argv,
                    const size_t *lens, int64_t extra_ms, int retry);
/* Let go of a reply read on c (NULL: nothing). */
void rs_reply_free(const rs_conn *c, redisReply *r);
void rs_conn_close(rs_conn *c);
/* Why the last read or write on c failed, for a message: the socket's
 * time limit passing is said as such, not as EAGAIN's text. */
const char *rs_conn_why(const rs_conn *c);
/* Connect if need be, with the URI's time limit set for what follows
 * (a pipeline). 0 or -1 with c->err set. */
int rs_conn_ready(rs_conn *c);

/* The server's clock (TIME) in ms into *ms: what stream IDs and
 * XPENDING's idle times are measured by. 0, or -1 with c->err set (an
 * error reply's text there too). */
int rs_server_ms(rs_conn *c, uint64_t *ms);
/* Percent-decode p[0..n) into a new string (*outlen: its length, when
 * not NULL); NULL with *bad set on a bad escape, or on ENOMEM. */
char *rs_decode(const char *p, size_t n, size_t *outlen, int *bad);
/* The first line of a file holding a secret (a password, a token),
 * without its line end; NULL with errno set. */
char *rs_read_secret(const char *path);

/* Is the stream u names on the one server of the Redis store s, so that
 * its writes can be queued with the store's checkpoint (rs_sink_join,
 * rs_source_join)? The same host name as written (letter case aside:
 * "localhost" and "127.0.0.1" are two), port and database; a stream
 * reached through sentinels or several hosts, or a store that is not one
 * redis:// server, is not. */
int rs_on_store(const rs_uri *u, idem_store *s);

/* Parse an entry ID "MS-SEQ". 0 or -1. */
int rs_id_parse(const char *s, size_t n, uint64_t *ms, uint64_t *seq);
/* Room for an entry ID, "MS-SEQ", and its NUL. */
#define RS_ID_MAX 42
/* Write the entry ID ms-seq and a NUL into buf; its length. Not printf:
 * every entry's ID is written back for its XACK. */
size_t rs_id_format(char buf[RS_ID_MAX], uint64_t ms, uint64_t seq);

#endif
