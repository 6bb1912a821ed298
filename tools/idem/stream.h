/* stream.h - the loop dedup and run share: inputs -> batches -> runner. */
#ifndef IDEM_STREAM_H
#define IDEM_STREAM_H

#include <signal.h>

#include "job.h"
#include "jsonkey.h"
#include "keyspace.h"
#include "linehash.h"

enum { ON_ERROR, ON_SKIP, ON_PASS };

typedef struct stream_counts {
    /* counted while reading: */
    uint64_t read, blank, skipped, passed;
    /* counted while committing (another thread): */
    uint64_t fresh, dup, failed, gave_up, invalid, restarts;
    uint64_t problems;  /* messages not done exactly once here: lost to
                         * another worker, refused by the store, an
                         * answer too large, a stream sink's marker in
                         * place of an output too large (exit status 3) */
    uint64_t bytes;
    uint64_t released;  /* claims given back unrun at a graceful stop */
    uint64_t dead_letter;  /* poison messages set aside (exit status 3) */
    uint64_t read_back;    /* found in a stream sink after a crash: not
                            * written again */
    uint64_t trimmed;      /* stream entries gone before they were read */
} stream_counts;

typedef struct stream stream;

/* Append the output of one committed line to st->job.obuf. m is NULL for
 * a line passed through (--on-missing-key pass); m->first indexes
 * `msgs`, the array m is in. */
typedef int (*stream_emit_fn)(void *ctx, stream *st, const idem_msg *msgs,
                              const idem_msg *m, const nd_line *l);

typedef struct stream_cfg {
    const char *cmd;
    const char *uri, *key, *output, *job;
    const char *from, *to;       /* --from / --to URIs (a file: as an
                                  * input / --output) */
    char *from_file;             /* --from FILE: the one input */
    int64_t idle_exit_ms;        /* --idle-exit; 0: a stream runs on */
    char to_ident[512];          /* --to's stream (connect_ident) */
    char sink_space[KS_NAME_MAX + 1];  /* the key space a stream sink
                                        * names */
    const char *key_space_name;  /* --key-space */
    int shared_keys;             /* --shared-keys */
    key_space ks;                /* where the keys are stored */
    char job_space[KS_NAME_MAX + 1];  /* ks's name when --output names
                                       * the job */
    int line_mode;
    int line_hash;            /* --line-hash: line_mode, keyed by SHA-256 */
    int on_missing, on_bad;   /* ON_* */
    uint64_t batch;
    int64_t ttl_ms, lease_ms;
    int64_t commit_interval_ms;  /* -1: the runner's default */
    int64_t grace_ms;         /* after SIGTERM/SIGINT: how long the
                               * messages in flight may take */
    int quiet, stats_json;
    int overwrite;            /* an --output no checkpoint names may be
                               * cut to 0 bytes */
    char **inputs;
    size_t ninputs;
    idem_handler_fn handler;  /* NULL: deduplicate */
    void *hctx;
    void (*handler_end)(void *hctx);  /* called in the thread that ran the
                                       * handler, after the last batch */
    uint32_t max_attempts;
    int64_t backoff_ms;
    uint64_t restarts;        /* handler failures to restart after */
    const char *dead_letter;  /* --dead-letter FILE, or NULL */
    /* May be NULL: after the handler failed, was it a fault of the
     * handler (crashed, hung, broke the grammar) that a message may have
     * caused? Its error then, and in *sent how many of the call's tasks
     * it was given; else NULL. */
    const char *(*fault)(void *hctx, size_t *sent);
    idem_runner **runner_out; /* if set, receives the runner (to tick) */
    int (*store_failed)(void *hctx);  /* may be NULL: did the handler
                                       * stop because the store failed? */
    stream_emit_fn emit;
    void *ectx;
    const char *metrics_listen;  /* --metrics-listen HOST:PORT, or NULL */
} stream_cfg;

struct stream {
    const stream_cfg *cfg;
    job job;
    stream_counts n;
};

/* The first SIGTERM or SIGINT (its number), 0 before: from then on no
 * message is taken, the ones in flight get cfg->grace_ms to finish, and
 * what is done is committed. A second such signal ends idem at once. */
extern volatile sig_atomic_t stream_stop;

/* Run the whole job; returns the exit status. */
int stream_run(const stream_cfg *cfg);

/* The option table entries and parsing both commands share. */
#define STREAM_LONGOPTS                                                    \
    {"store", 1, 0, 's'}, {"key", 1, 0, 'k'}, {"line", 0, 0, 'L'},        \
        {"output", 1, 0, 'o'}, {"ttl", 1, 0, 't'}, {"job", 1, 0, 'j'},    \
        {"on-missing-key", 1, 0, 'M'}, {"on-bad-input", 1, 0, 'B'},       \
        {"batch", 1, 0, 'b'}, {"quiet", 0, 0, 'q'},                       \
        {"stats-json", 0, 0, 'J'}, {"lease", 1, 0, 'l'},                  \
        {"commit-interval", 1, 0, 'C'},                                   \
        {"key-space", 1, 0, 'K'}, {"shared-keys", 0, 0, 'S'},             \
        {"overwrite", 0, 0, 'O'}, {"line-hash", 0, 0, 'H'},               \
        {"grace", 1, 0, 'G'}, {"from", 1, 0, 'F'}, {"to", 1, 0, 'T'},     \
        {"idle-exit", 1, 0, 'I'},                                         \
        {"metrics-listen", 1, 0, 'P'},                                    \
        {"kafka-config", 1, 0, STREAM_OPT_KAFKA_CONFIG},                  \
        {"help", 0, 0, 'h'}

/* getopt's value of --kafka-config (no short option). */
#define STREAM_OPT_KAFKA_CONFIG 0x100

/* The help of the options that name a stream, for both commands. */
#define STREAM_ENDS_HELP \
    "  --from URI        read a stream instead of files (a path here is an\n" \
    "                    INPUT): redis-stream://[USER:PASSWORD@]HOST[:PORT]\n" \
    "                    [/DB]/STREAM?group=G[&consumer=C][&start=0|$]: a\n" \
    "                    consumer group, made if missing; C defaults to\n" \
    "                    the host name (give each worker its own). Each\n" \
    "                    entry is a JSON object of its fields; it is acked\n" \
    "                    once committed, and a dead consumer's entries are\n" \
    "                    taken over after --lease. Or kafka://BOOTSTRAP\n" \
    "                    [,...]/TOPIC[,...]?group=G[&consumer=C][&A.B=V]:\n" \
    "                    a consumer group, offsets committed after the\n" \
    "                    idem commit; dotted parameters are librdkafka\n" \
    "                    properties. --key @key or header:NAME keys by the\n" \
    "                    message key or a header\n" \
    "  --kafka-config FILE  librdkafka properties (NAME=VALUE lines, as\n" \
    "                    kcat -F); never printed\n" \
    "  --to URI          write a stream instead of --output:\n" \
    "                    redis-stream://.../STREAM[?maxlen=~N]: an entry\n" \
    "                    per output line, its members as fields, plus\n" \
    "                    idem-key. Or kafka://BOOTSTRAP[,...]/TOPIC: an\n" \
    "                    idempotent producer; each message reproduced\n" \
    "                    (value, key, headers) plus header idem-key.\n" \
    "                    Exactly once across kill -9: what a dead run wrote\n" \
    "                    and did not commit is read back, not written again\n" \
    "                    (docs/streams.md)\n" \
    "                    NATS JetStream: --from nats://[USER:PASSWORD@]\n" \
    "                    HOST:PORT/STREAM?durable=D[&subject=F] (a pull\n" \
    "                    consumer), --to nats://HOST:PORT/SUBJECT (one\n" \
    "                    message per line, Nats-Msg-Id = the key; dedup\n" \
    "                    keeps data and headers); --key header:NAME keys\n" \
    "                    by a header\n" \
    "  --idle-exit DURATION  a stream source runs until SIGTERM or SIGINT;\n" \
    "                    with this, also until nothing new came for\n" \
    "                    DURATION (Kafka: while assigned and read to the\n" \
    "                    end)\n"

/* The help of --metrics-listen, for both commands. */
#define STREAM_METRICS_HELP \
    "  --metrics-listen HOST:PORT  serve Prometheus metrics at\n" \
    "                    http://HOST:PORT/metrics while the job runs\n" \
    "                    (docs/monitoring.md); a port in use is an error\n"

/* Handle one of the shared options: 0 handled, 2 bad value, 1 not one
 * of them. */
int stream_opt(stream_cfg *c, int ch, const char *arg);

/* After the options: check the combination; 0 or 2. */
int stream_check(stream_cfg *c, int argc, char **argv, int optind_);

/* The status a stream's output gives an outcome: "done" (also a replay
 * of one), "failed" (also a replay), "gave_up". */
const char *stream_status(idem_msg_result r);

#endif
