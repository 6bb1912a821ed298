/* connect.h - where dedup and run read and write: one small interface.
 *
 * A source hands out messages as lines, each with a position (l->end and
 * l->lineno, the source's own meaning: a file's offset and line number,
 * a stream entry's ID), and is told after each commit which lines the
 * commit covers (ack), so that a broker may forget them. A sink takes
 * the output lines of a batch with their keys (put), writes them
 * durably (flush), and says where it stands (pos), which the job's
 * checkpoint keeps; after a crash it reads back what follows that
 * position (read_back) and answers whether a key is already there (has).
 * A source or sink on the store's own server may instead join the store
 * (join): its writes (an output's entries, an input's acknowledgements)
 * are queued with the job's checkpoint and land in the same step as the
 * commit, which leaves read-back nothing of this run's to find.
 *
 * A broker that keeps no pending list per consumer (Kafka) says where
 * its reader stands instead: the loop tells the source which lines each
 * commit covers before the checkpoint is put (mark), keeps the source's
 * position in the job's checkpoint beside the sink's (pos, `from=`), and
 * hands it back on the next run (resume). A message may carry more than
 * its line, the broker's message key and headers: the source attaches
 * them as the line's meta (the records below), the loop carries them
 * beside the line to the sink (put), and --key @key or header:NAME reads
 * the key from them (meta_key).
 *
 * Files are the default source (ndjson.c behind source_files) and output
 * (job.c, which cuts a file back rather than reading it back: a file can
 * be cut, a stream cannot). Each broker adds one source and one sink
 * behind these tables: Redis Streams in rsource.c and rsink.c, NATS
 * JetStream in nsource.c and nsink.c. */
#ifndef IDEM_CONNECT_H
#define IDEM_CONNECT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "idem/idem.h"
#include "ndjson.h"

typedef struct source source;
typedef struct sink sink;

typedef struct source_ops {
    /* The next line, as nd_next(): ND_LINE, ND_IDLE (wait 0 and nothing
     * ready, or a stop asked for), ND_NEXT, ND_FULL, ND_END, ND_ERR. */
    int (*next)(source *s, nd_line *l, int wait);
    /* The lines handed out may be dropped. */
    void (*release)(source *s);
    /* Before a read that may block: wait for input or a stop; 1 if
     * stopping. */
    int (*wait)(source *s);
    const char *(*err)(const source *s);
    /* Where l is, for messages: "FILE:LINE", "STREAM entry ID". */
    void (*where)(const source *s, const nd_line *l, char *buf, size_t n);
    /* l is committed (queued), then all queued (flush): called from the
     * committing thread. NULL when there is nothing to acknowledge. */
    int (*ack)(source *s, const nd_line *l);
    int (*ack_flush)(source *s);
    /* From now on, queue ack_flush's acknowledgements with st's next
     * checkpoint (idem_checkpoint_write) instead of sending them, when
     * the source's server is st's: 1 if so, else 0 (as before). NULL:
     * never. */
    int (*join)(source *s, idem_store *st);
    /* Messages not yet delivered, or -1 (NULL: never known). */
    long long (*lag)(source *s);
    /* Messages gone before they could be read, since the last call
     * (NULL: none can be). */
    uint64_t (*lost)(source *s);
    /* The worker when many share the source (the stream, group and
     * consumer), which names its job; NULL when there is one reader. */
    const char *(*worker)(const source *s);
    void (*close)(source *s);
    /* A source that keeps its own position (NULL: none, as files and
     * Redis Streams, whose broker keeps it): l is covered by the commit
     * being written, called in input order from the committing thread
     * before the checkpoint is put; pos is then the position the
     * checkpoint keeps (text without spaces, "" for none yet); resume
     * hands a checkpoint's position back before the first next(). */
    void (*mark)(source *s, const nd_line *l);
    const char *(*pos)(source *s);
    int (*resume)(source *s, const char *pos);
    /* The source cannot tell which messages were handed out before (no
     * pending list): after a crash of the job, every first claim looks
     * for its key among what the sink read back. */
    int no_pending;
    /* Such a source: may messages that a dead run handed out still be
     * ahead (not yet committed by this run)? While they may, the sink's
     * position in the checkpoint stays where the read-back began, so that
     * a crash now reads their entries back again. NULL: never. */
    int (*in_doubt)(source *s);
} source_ops;

struct source {
    const source_ops *ops;
};

typedef struct sink_ops {
    /* Keep other runs of job (its checkpoint's name) out until close:
     * two would move its position past each other's uncommitted
     * entries. NULL: one writer is kept otherwise. 0, or an exit status
     * after saying why. */
    int (*lock)(sink *k, const char *job);
    /* Where a new job starts: the current end. 0 or -1. */
    int (*start)(sink *k);
    /* Remember the keys written after pos (a checkpoint's). 0 or -1. */
    int (*read_back)(sink *k, const char *pos);
    /* Before has() is asked of claims made until now: read what other
     * workers wrote since the last time (the recent entries), since one
     * that died may have written a key just before; and back to `from`
     * (ms, the source's clock; 0: none), the earliest `since` that has()
     * will be asked with. 0 or -1. */
    int (*catch_up)(sink *k, uint64_t from);
    /* Is key there already: read back, or with `recent` also among the
     * recent entries: those written since `since` (a message handed out
     * before: nd_line.since) or within the sink's window? Asked only for
     * a claim that may follow a write of a dead run (`recent`: of
     * another worker too). Its status ("done", "failed", "gave_up": a
     * run's entry) and result when it has them. 1, 0, or -1. */
    int (*has)(sink *k, const void *key, size_t keylen, int recent,
               uint64_t since, const char **status, const char **result,
               size_t *rlen);
    /* key's entry read back is committed now as this run's output: it
     * stops being found, so that the key, new again after its TTL, is
     * written again. */
    void (*forget)(sink *k, const void *key, size_t keylen);
    /* One output line of key, queued, with the input message's meta
     * (NULL, 0: none; a sink that reproduces messages takes their key
     * and headers from it); then the queue written. 0 or -1 after
     * saying why. */
    /* From now on, queue put's writes with st's next checkpoint
     * (idem_checkpoint_write: they land with the commit, in one step)
     * instead of writing them before it, when the sink's server is st's:
     * 1 if so, else 0 (as before). NULL: never. */
    int (*join)(sink *k, idem_store *st);
    /* One output line of key, queued, with the input message's meta
     * (NULL, 0: none; a sink that reproduces messages takes their key
     * and headers from it); then the queue written. 0 or -1 after
     * saying why. */
    int (*put)(sink *k, const char *text, size_t len, const void *key,
               size_t keylen, const char *meta, size_t metalen);
    int (*flush)(sink *k);
    /* The position after the last flush (text without spaces). */
    const char *(*pos)(const sink *k);
    /* The sink for messages and job names (no password). */
    const char *(*name)(const sink *k);
    /* Refuse a setting under which read-back cannot work with batches of
     * `batch` lines (an output trimmed to fewer entries than a crash
     * leaves uncommitted). NULL: nothing to check. 0, or 2 after saying
     * why. */
    int (*check)(sink *k, uint64_t batch);
    void (*close)(sink *k);
    /* Messages whose output could not be written as it is since the
     * last call (each said on stderr; a NATS sink's markers for messages
     * too large): not done here, exit status 3. NULL: none can be. */
    uint64_t (*undone)(sink *k);
} sink_ops;

struct sink {
    const sink_ops *ops;
};

/* What a source needs to know of the run. */
typedef struct source_opts {
    uint64_t batch;
    int64_t lease_ms;
    int64_t idle_exit_ms;              /* 0: a stream runs on */
    volatile const sig_atomic_t *stop; /* set by a stop signal */
    /* Wait until the batch being committed is done and acknowledged
     * (a broker taking partitions away calls it first); may be NULL. */
    void (*settle)(void *ctx);
    void *settle_ctx;
} source_opts;

/* Does uri name a stream (a source for --from, a sink for --to), rather
 * than a file? */
int connect_is_uri(const char *uri);
/* The broker uri names: 'r' Redis Streams, 'k' Kafka, 'n' NATS
 * JetStream; 0 for none (a file, NULL). */
int connect_kind(const char *uri);


/* The stream uri names, as the same text however it is reached (no
 * credentials, no parameters of the connection): what names the jobs
 * and the key space of an output, and tells that --from and --to are
 * one stream. as_sink: uri is a --to. Into buf (size bytes); 0, or 2
 * after saying what is wrong with uri. */
int connect_ident(const char *cmd, const char *uri, int as_sink, char *buf,
                  size_t size);

/* Open the stream uri names. NULL after saying why (*status: 1, or 2 for
 * a bad URI). */
source *source_open(const char *cmd, const char *uri,
                    const source_opts *o, int *status);
sink *sink_open(const char *cmd, const char *uri, int64_t lease_ms,
                int *status);

/* A message's meta: records of one type byte and length-prefixed
 * parts (4 bytes, little-endian): META_KEY value (the broker's message
 * key), META_HEADER name value (a value of length META_NULL has none),
 * META_FIELD name value.
 *
 * META_FIELD records are not beside the line but the line itself: the
 * fields of a Redis Stream entry as read, which the line is the JSON
 * object of. They save the work of going back from the JSON: a key that
 * names a top-level member is found among them without parsing the line
 * (stream.c), and a Redis sink writes them as they are when its output
 * is that very line (dedup), without parsing it into fields again
 * (rsink.c). meta_next() passes over them, so that a sink of another
 * kind sees what it saw before: no key, no headers. */
enum { META_KEY = 'K', META_HEADER = 'H', META_FIELD = 'F' };
#define META_NULL 0xffffffffu

typedef struct meta_rec {
    int type;
    const char *name, *value;  /* name: NULL for META_KEY; value: NULL
                                * when it has none */
    size_t namelen, valuelen;
} meta_rec;

/* Append a record to b (name NULL for META_KEY, value NULL: none). 0 or
 * -1 (out of memory). */
int meta_add(cli_buf *b, int type, const char *name, size_t namelen,
             const void *value, size_t valuelen);
/* The record at *at (start at 0), moving *at past it: 1, or 0 at the
 * end or on a broken record. META_FIELD records are passed over. */
int meta_next(const char *meta, size_t len, size_t *at, meta_rec *r);
/* The same for the META_FIELD records only. */
int meta_field_next(const char *meta, size_t len, size_t *at, meta_rec *r);
/* Does meta hold fields (a source puts them first)? */
int meta_has_fields(const char *meta, size_t len);
/* Does --key spec name the meta ("@key", "header:NAME")? */
int meta_key_spec(const char *spec);
/* The key spec names in meta: 1 found (*key, *klen), 0 not there. */
int meta_key(const char *meta, size_t len, const char *spec,
             const char **key, size_t *klen);

/* --kafka-config FILE: librdkafka properties for kafka:// URIs. */
void connect_kafka_config(const char *path);

/* What has() answers of a key found in a sink: 1, with *status "done",
 * "failed" or "gave_up" when st[0..stlen) names one (a run's entry; else
 * NULL: a dedup entry), and its result res[0..rlen). */
int connect_outcome(const char *st, size_t stlen, const char *res,
                    size_t reslen, const char **status, const char **result,
                    size_t *rlen);

/* Files as a source: rd, opened by the caller, stays the caller's. */
source *source_files(nd_reader *rd, const source_opts *o);

#endif
