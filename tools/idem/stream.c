/* stream.c - the loop behind `idem dedup` and `idem run`.
 *
 * Both commands are the same pipeline with a different middle: read a
 * batch of lines, find each line's key, hand the keyed lines to the
 * library's runner (idem.h, "The stream runner"), and in the runner's
 * commit step write the committed lines' output and the checkpoint
 * (job.c). dedup has no handler and writes the line itself; run has the
 * co-process handler and writes a result line. Keeping one loop keeps one
 * set of rules for input policies, positions and counting.
 *
 * Lines that are not messages still move the position: blank lines,
 * lines skipped by a policy, and lines passed through (their output is
 * the line, in input order). A line that a policy says is an error ends
 * the batch just before it; the batch commits, then the run stops with
 * the line's file:line:column, so a rerun after fixing the input resumes
 * exactly there.
 *
 * Pipelining: while a second thread (the worker) commits batch k (the
 * runner: claims, handler, output written and synced, store synced),
 * this one reads and parses the next ones into the other batch buffers,
 * up to QUEUED - 1 batches ahead, and hands each over through a queue
 * (hand_over, next_batch): the worker goes from one batch to the next
 * without waiting for this thread to wake, and a stream's next read is
 * on the server while the worker commits. Parsing is the largest cost
 * and the disk the next, so overlapping them is most of the speed. Only
 * the worker touches the store and the output (the store is used by one
 * thread at a time as idem.h asks), and batches are committed in the
 * order read. A batch copies its lines out of the reader, so the reader
 * is free to move on; its buffer is the reader's again once the worker
 * has finished it (batch_done). From a stream to a stream of the same
 * broker on a local store, a batch's sync also runs while the next
 * batch's entries are written (sync_overlaps says why that keeps
 * exactly once).
 *
 * Stopping (SIGTERM from systemd or Kubernetes, SIGINT from Ctrl-C): the
 * first signal only sets stream_stop. The reader takes no more lines
 * (the batches read ahead and not started are dropped: nothing of them
 * was claimed), the
 * handler is sent no more envelopes and gets --grace to answer those it
 * has (coproc.c), and the batch in the worker ends as after a handler
 * error: the answered prefix is committed (output, store, checkpoint),
 * the other claims are released, so the next run gives them to its
 * handler at once. A batch that waits for a key another worker holds
 * ends the same way: the runner asks stop_asked() while it waits. The
 * signals are taken by the reading thread only (the worker blocks them),
 * and the handler is in its own process group, so Ctrl-C at a terminal
 * reaches idem and not the handler. A second signal
 * kills idem as kill -9 would, which the store and output survive by
 * design; the handler goes with it (PR_SET_PDEATHSIG, coproc.c). */
#include "stream.h"

#include <inttypes.h>
#ifdef __linux__
#include <malloc.h>
#endif
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "connect.h"
#include "deadletter.h"
#include "metricsrv.h"

#define MAX_WARNINGS 10
#define QUEUED 3  /* batch buffers: one committing, two read ahead */
#define RESTART_WAIT_MAX_MS 10000

enum { IT_MSG, IT_PASS, IT_DROP };

typedef struct item {
    nd_line l;       /* l.p is an offset into text until the batch is read */
    int kind;
    size_t msg;      /* IT_MSG: index in msgs */
} item;

typedef struct batch {
    item *items;
    size_t nitems, input;
    idem_msg *msgs;
    size_t nmsgs;
    unsigned char *again;  /* per message: its line's `again` (ndjson.h) */
    uint64_t *since;       /* ... and `since` */
    cli_buf text;    /* copies of the lines */
    cli_buf keys;    /* the keys */
    size_t emitted;  /* items already written out */
    size_t acks;     /* items [0, acks) are committed: to acknowledge */
    int done;        /* the inputs end with this batch */
    int stop;        /* exit status that ends the run after this batch */
} batch;

typedef struct loop {
    stream st;
    nd_reader rd;
    source *src;     /* files (rd) or a stream (--from) */
    int key_is_id;   /* --key @id: a stream entry's ID is its key */
    int key_in_meta; /* --key @key or header:NAME (connect.h) */
    int sweeps;      /* the store wants sweeping between batches */
    jk_path path;
    jk *jk;
    idem_bizkey_gen *line_hash;  /* --line-hash */
    idem_store *s;
    idem_runner *runner;
    batch b[QUEUED];
    batch *committing;
    pthread_t worker;     /* one thread for the whole run: the handler it
                           * starts dies with the thread (PDEATHSIG) */
    int threaded;
    /* The queue between the threads (see "Pipelining"): batch k is
     * b[k % QUEUED]; the reader has handed over batches [0, handed), the
     * worker has finished [0, finished). */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    uint64_t handed, finished;
    int reading_over;  /* the reader hands over no more */
    int commit_over;   /* a batch ended the run: the worker takes no more */
    int result;        /* ... and the exit status it ended it with */
    uint64_t shown_fresh, shown_dup;  /* for the progress line */
    /* Stream to stream of one broker on a local store (sync_overlaps):
     * each commit's sync is started, not awaited, and the batch is owed
     * its acknowledgements until the next commit has waited for it, or
     * the worker finds no batch waiting, or the run ends (settle_owed). */
    int overlap;
    batch *owed;
    uint64_t owed_k;
    int rc;          /* of the last commit */
    size_t base;     /* msgs before this were committed by earlier runs of
                      * the runner over this batch (handler restarts) */
    size_t committed;
    int handler_rc;  /* what the handler returned in the last batch */
    int src_joined;  /* the source's acknowledgements go with the store's
                      * checkpoint (join_store) */
    int reread;      /* files into a stream, read again from their start
                      * after a crash: any line may be one the dead run
                      * wrote (a local store need not have kept its
                      * claims of the batch in doubt) */
    /* Poison messages (--dead-letter): per message of the batch being
     * committed, the handler faults charged to it and the last one's
     * error; messages before alone_end run one at a time, so that a
     * fault is charged to the one message that caused it. */
    dead_letters dl;
    uint32_t *faults;
    char **fault_err;
    int any_fault;   /* faults and fault_err hold something */
    size_t alone_end;
    size_t suspects, suspects_end;  /* the last fault: the messages sent
                                     * and unanswered, [suspects,
                                     * suspects_end) */
    int fault;       /* the last failure was a fault of the handler */
    char fault_why[512];  /* its error */
    cli_buf dl_result;
    char **kept;     /* answers found in the sink, valid for the batch */
    size_t nkept, capkept;
    /* Restarts back off: each waits twice the one before, from --backoff
     * up to RESTART_WAIT_MAX_MS, and the first after an answer waits
     * --backoff again. */
    int64_t restart_wait_ms;
    uint64_t answered;  /* answers of the handler since the last restart */
    uint64_t dead_in_a_row;  /* set aside with no answer in between */
    int stopped;     /* a stop signal ended the run before its input */
    atomic_uint warnings;  /* both threads warn */
    double t0, last_progress;
    int tty;
    int ran;         /* the input was opened and read */
    metrics_srv *msrv;   /* --metrics-listen */
    uint64_t todo;   /* bytes of the input files left at the start; 0 when
                      * unknown (standard input, a pipe, a stream) */
} loop;

volatile sig_atomic_t stream_stop;


/* ------------------------------------------------------------------------
 * Options */

int stream_opt(stream_cfg *c, int ch, const char *arg)
{
    static const char *const missing[] = {"error", "skip", "pass", NULL};
    static const char *const bad[] = {"error", "skip", NULL};
    uint64_t v;
    int rc;
    switch (ch) {
    case 's': c->uri = arg; return 0;
    case 'k': c->key = arg; return 0;
    case 'L': c->line_mode = 1; return 0;
    case 'H': c->line_mode = c->line_hash = 1; return 0;
    case 'o': c->output = arg; return 0;
    case 'j': c->job = arg; return 0;
    case 'K': c->key_space_name = arg; return 0;
    case 'S': c->shared_keys = 1; return 0;
    case 'q': c->quiet = 1; return 0;
    case 'J': c->stats_json = 1; return 0;
    case 'O': c->overwrite = 1; return 0;
    case 't': return cli_duration(c->cmd, "--ttl", arg, &c->ttl_ms);
    case 'l': return cli_duration(c->cmd, "--lease", arg, &c->lease_ms);
    case 'G': return cli_duration(c->cmd, "--grace", arg, &c->grace_ms);
    case 'F': c->from = arg; return 0;
    case 'T': c->to = arg; return 0;
    case 'P': c->metrics_listen = arg; return 0;
    case 'I': return cli_duration(c->cmd, "--idle-exit", arg,
                                  &c->idle_exit_ms);
    case STREAM_OPT_KAFKA_CONFIG: connect_kafka_config(arg); return 0;
    case 'C':
        if (!strcmp(arg, "0")) {
            c->commit_interval_ms = 0;
            return 0;
        }
        return cli_duration(c->cmd, "--commit-interval", arg,
                            &c->commit_interval_ms);
    case 'M': return cli_choice(c->cmd, "--on-missing-key", arg, missing,
                                &c->on_missing);
    case 'B': return cli_choice(c->cmd, "--on-bad-input", arg, bad,
                                &c->on_bad);
    case 'b':
        rc = cli_number(c->cmd, "--batch", arg, 1, 1000000, &v);
        c->batch = v;
        return rc;
    default: return 1;
    }
}

/* A file named like a URI ("SCHEME://...") is a mistake (redis:// for
 * redis-stream://, a stream given to --output), and the messages about
 * the file would repeat its password: refused, shown as URIs are. Where
 * a stream may stand (streams: --from, --to), its URIs are not files.
 * 0 or 2. */
static int not_a_uri(const char *cmd, const char *opt, const char *path,
                     int streams)
{
    size_t scheme = path ? strspn(path, "abcdefghijklmnopqrstuvwxyz"
                                        "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789+-.")
                         : 0;
    if (!scheme || strncmp(path + scheme, "://", 3) ||
        (streams && connect_is_uri(path)))
        return 0;
    return cli_usage_error(cmd, "%s %s: a URI where a file is meant (a "
                           "stream is read with --from and written with "
                           "--to redis-stream://...)", opt,
                           cli_shown_uri(path));
}

/* Every file the job is given is named by a path. 0 or 2. */
static int paths_not_uris(const stream_cfg *c)
{
    int rc = not_a_uri(c->cmd, "--from", c->from, 1);
    rc = rc ? rc : not_a_uri(c->cmd, "--to", c->to, 1);
    rc = rc ? rc : not_a_uri(c->cmd, "--output", c->output, 0);
    rc = rc ? rc : not_a_uri(c->cmd, "--dead-letter", c->dead_letter, 0);
    if (!rc && c->dead_letter && !strcmp(c->dead_letter, "-"))
        rc = cli_usage_error(c->cmd, "--dead-letter -: the dead-letter file "
                             "is read at the start and made durable line "
                             "by line, which standard output cannot be; "
                             "name a file (--dead-letter ./- if that is "
                             "its name)");
    for (size_t i = 0; !rc && i < c->ninputs; i++)
        rc = not_a_uri(c->cmd, "input", c->inputs[i], 0);
    return rc;
}

/* --from and --to: a stream URI, or a file that stands for an input
 * and --output. 0 or 2. */
static int check_ends(stream_cfg *c, int argc, char **argv, int optind_)
{
    c->inputs = argv + optind_;
    c->ninputs = (size_t)(argc - optind_);
    if (c->from && c->ninputs)
        return cli_usage_error(c->cmd, "--from and input files exclude each "
                               "other: give the input one way");
    int rc = paths_not_uris(c);
    if (rc)
        return rc;
    if (c->from && !connect_is_uri(c->from)) {
        c->from_file = (char *)c->from;  /* c->from is NULL from below */
        c->inputs = &c->from_file;
        c->ninputs = 1;
    }
    if (c->to && c->output)
        return cli_usage_error(c->cmd, "--to and --output exclude each "
                               "other: give the output one way");
    if (c->to && !connect_is_uri(c->to)) {
        c->output = c->to;
        c->to = NULL;
    }
    if (c->idle_exit_ms && !connect_is_uri(c->from))
        return cli_usage_error(c->cmd, "--idle-exit is for a stream source "
                               "(--from redis-stream://...): files end by "
                               "themselves");
    if (c->from && !connect_is_uri(c->from))
        c->from = NULL;
    if (c->key && !strcmp(c->key, "@id") && c->from &&
        !strncmp(c->from, "nats://", 7))
        return cli_usage_error(c->cmd, "--key @id is a Redis entry ID; key "
                               "a NATS message by a header instead: --key "
                               "header:Nats-Msg-Id");
    if (meta_key_spec(c->key) && !c->from)
        return cli_usage_error(c->cmd, "--key %s (the message's key or a "
                               "header) is for a stream source (--from "
                               "kafka://... or nats://...); to key a field "
                               "so named, write --key /%s", c->key, c->key);
    if (c->key && !strcmp(c->key, "@id") && !c->from)
        return cli_usage_error(c->cmd, "--key @id (the entry's ID) is for "
                               "a stream source (--from redis-stream://"
                               "...); to key a field named @id, write "
                               "--key /@id");
    return 0;
}

/* A stream output is known by the stream it names (connect_ident),
 * not by its URI's text: a parameter added to the URI (timeout_ms,
 * maxlen), another user or host list order... must not make it another
 * job with other keys, which would write every key again. And it must
 * not be the stream read: each entry written would be read again, and
 * under --key @id written again, without end. 0 or 2. */
static int stream_ends(stream_cfg *c)
{
    char from[sizeof c->to_ident];
    int rc = c->to ? connect_ident(c->cmd, c->to, 1, c->to_ident,
                                   sizeof c->to_ident) : 0;
    rc = !rc && c->to && c->from ? connect_ident(c->cmd, c->from, 0, from,
                                                 sizeof from) : rc;
    if (!rc && c->to && c->from && !strcmp(from, c->to_ident))
        rc = cli_usage_error(c->cmd, "--from and --to name one stream "
                             "(%s): every entry written would be read "
                             "again. Write to another stream", from);
    return rc;
}

/* The key space a job names by default: its --job, else its stream
 * sink (every worker writing to one stream shares it), else its
 * --output file, else the command. */
static const char *own_space(stream_cfg *c)
{
    if (c->job)
        return c->job;
    if (c->to) {
        job_text_name(c->to_ident, c->sink_space, sizeof c->sink_space);
        return c->sink_space;
    }
    return job_output_name(c->output, c->job_space, sizeof c->job_space)
               ? c->job_space
               : c->cmd;
}

int stream_check(stream_cfg *c, int argc, char **argv, int optind_)
{
    int rc = check_ends(c, argc, argv, optind_);
    rc = rc ? rc : stream_ends(c);
    if (rc)
        return rc;
    if (c->key && c->line_mode)
        return cli_usage_error(c->cmd, "--key and --line (or --line-hash) "
                               "exclude each other: the key is a field, or "
                               "the line");
    if (!c->key && !c->line_mode)
        return cli_usage_error(c->cmd, "say where the key is: --key FIELD "
                               "(e.g. --key event_id, --key user.id, --key "
                               "/user/id) or --line for the whole line");
    if (c->job && (!*c->job || strlen(c->job) > 200))
        return cli_usage_error(c->cmd, "--job wants a name of 1 to 200 "
                               "bytes");
    if (c->shared_keys && c->key_space_name)
        return cli_usage_error(c->cmd, "--key-space and --shared-keys "
                               "exclude each other");
    const char *own = own_space(c);
    if (ks_set(&c->ks, c->shared_keys ? NULL : c->key_space_name
                       ? c->key_space_name : own))
        return cli_usage_error(c->cmd, "a key space (--key-space, else "
                               "--job) is named by 1 to %u bytes of text, "
                               "no control characters", KS_NAME_MAX);
    if (!c->grace_ms)
        c->grace_ms = 5000;
    const char *uri = cli_store_uri(c->uri);
    return job_check_files(c->cmd, c->output, c->dead_letter, c->inputs,
                           c->ninputs,
                           strncmp(uri, "local:", 6) ? NULL : uri + 6);
}

/* ------------------------------------------------------------------------
 * Reading a batch */

/* Where l is, for messages: FILE:LINE, or the stream entry. */
static void src_where(const loop *lp, const nd_line *l, char *buf, size_t n)
{
    lp->src->ops->where(lp->src, l, buf, n);
}

static int is_blank(const nd_line *l)
{
    for (size_t i = 0; i < l->len; i++)
        if (!strchr(" \t\r", l->p[i]))
            return 0;
    return 1;
}

static void warn_line(loop *lp, const nd_line *l, size_t col,
                      const char *what, const char *policy)
{
    unsigned shown = atomic_fetch_add(&lp->warnings, 1) + 1;
    if (lp->st.cfg->quiet || shown > MAX_WARNINGS)
        return;
    char where[700];
    src_where(lp, l, where, sizeof where);
    fprintf(stderr, "%s%s:%zu: %s (%s)\n", lp->tty ? "\r\033[K" : "",
            where, col, what, policy);
    if (shown == MAX_WARNINGS)
        fprintf(stderr, "idem %s: further such lines are counted, not "
                        "shown\n", lp->st.cfg->cmd);
}

/* A line whose key could not be had: apply the policy. Returns the item
 * kind, or -1 when the policy says to stop. */
static int key_problem(loop *lp, batch *b, const nd_line *l, size_t col,
                       const char *what, int bad_json)
{
    const stream_cfg *c = lp->st.cfg;
    int policy = bad_json ? c->on_bad : c->on_missing;
    const char *opt = bad_json ? "--on-bad-input" : "--on-missing-key";
    if (policy == ON_ERROR) {
        char where[700];
        src_where(lp, l, where, sizeof where);
        fprintf(stderr, "%s%s:%zu: %s\n", lp->tty ? "\r\033[K" : "",
                where, col, what);
        fprintf(stderr, "idem %s: stopped there (%s error); everything "
                        "before it is committed. Fix the line and run the "
                        "same command again, or choose %s skip%s\n",
                c->cmd, opt, opt, bad_json ? "" : " or pass");
        b->stop = 1;
        return -1;
    }
    char pol[64];
    snprintf(pol, sizeof pol, "%s %s", opt, policy == ON_SKIP ? "skip"
                                                              : "pass");
    warn_line(lp, l, col, what, pol);
    lp->st.n.skipped += policy == ON_SKIP;
    lp->st.n.passed += policy == ON_PASS;
    return policy == ON_SKIP ? IT_DROP : IT_PASS;
}

/* --key naming a top-level member, of a line whose source handed out
 * its fields (a Redis entry: META_FIELD records, connect.h): the field's
 * value, found without parsing the JSON that the fields make (well
 * formed: its source made it, and classify() checked its UTF-8). The
 * last of two fields so named counts, as with jk_extract(). 1 found, 0
 * not there, -1 not such a key or line (the line is parsed). */
static int field_key(const loop *lp, const nd_line *l, const char **key,
                     size_t *klen)
{
    if (lp->path.n != 1 || !meta_has_fields(l->meta, l->metalen))
        return -1;
    size_t at = 0;
    meta_rec r;
    int found = 0;
    while (meta_field_next(l->meta, l->metalen, &at, &r))
        if (r.namelen == lp->path.len[0] &&
            !memcmp(r.name, lp->path.seg[0], r.namelen)) {
            *key = r.value;
            *klen = r.valuelen;
            found = 1;
        }
    return found;
}

/* The key --key names in l (a member of its JSON): IT_MSG with *key,
 * else as key_problem(). */
static int member_key(loop *lp, batch *b, const nd_line *l,
                      const char **key, size_t *klen)
{
    char what[300];
    int got = field_key(lp, l, key, klen);
    jk_result r = got > 0   ? JK_OK
                  : got == 0 ? JK_MISSING
                             : jk_extract(lp->jk, l->p, l->len, key, klen);
    if (r == JK_BAD_JSON) {
        snprintf(what, sizeof what, "invalid JSON: %s", jk_error(lp->jk));
        return key_problem(lp, b, l, jk_column(lp->jk), what, 1);
    }
    if (r != JK_OK) {
        snprintf(what, sizeof what, r == JK_MISSING
                 ? "no key field '%s'" : "key field '%s' is %s, not a "
                 "string or number", lp->st.cfg->key, jk_error(lp->jk));
        return key_problem(lp, b, l, 1, what, 0);
    }
    return IT_MSG;
}

/* Find l's key and append it to b->keys. Returns the item kind or -1. */
static int classify(loop *lp, batch *b, const nd_line *l)
{
    const char *key = l->p;
    size_t klen = l->len, col = 1;
    char what[300];
    if (is_blank(l)) {
        lp->st.n.blank++;
        return IT_DROP;
    }
    /* A stream entry's line is JSON text its source made: one whose
     * fields are not UTF-8 is bad input, whether or not the key needs
     * the line parsed (--key @id, --line, a field found among those the
     * source handed out beside the line); a sink would not get its
     * fields back from it. */
    if (lp->st.cfg->from && (lp->key_is_id || lp->st.cfg->line_mode ||
                             meta_has_fields(l->meta, l->metalen)) &&
        !cli_utf8_valid(l->p, l->len))
        return key_problem(lp, b, l, col, "a field name or value is not "
                           "UTF-8", 1);
    char hash[LH_KEY_LEN], id[48];
    if (lp->key_in_meta) {  /* the broker's message key or a header */
        if (!meta_key(l->meta, l->metalen, lp->st.cfg->key, &key, &klen)) {
            snprintf(what, sizeof what, "no %s", lp->st.cfg->key[0] == '@'
                     ? "message key" : lp->st.cfg->key);
            return key_problem(lp, b, l, col, what, 0);
        }
    } else if (lp->key_is_id) {  /* --key @id: the entry's ID, MS-SEQ */
        klen = (size_t)snprintf(id, sizeof id, "%" PRIu64 "-%" PRIu64,
                                l->end, l->lineno);
        key = id;
    } else if (lp->st.cfg->line_mode) {
        klen -= klen && key[klen - 1] == '\r';
        if (lp->line_hash) {
            if (lh_key(lp->line_hash, lp->st.cfg->cmd, key, klen, hash))
                return b->stop = 1, -1;
            key = hash;
            klen = LH_KEY_LEN;
        }
    } else {
        int kind = member_key(lp, b, l, &key, &klen);
        if (kind != IT_MSG)
            return kind;
    }
    if (ks_bad_size(&lp->st.cfg->ks, klen, what, sizeof what)) {
        size_t n = strlen(what);
        if (lp->st.cfg->line_mode)
            snprintf(what + n, sizeof what - n, "; --line-hash keys each "
                     "line by its SHA-256 instead");
        return key_problem(lp, b, l, col, what, 0);
    }
    return ks_add(&b->keys, &lp->st.cfg->ks, key, klen) ? -2 : IT_MSG;
}

static int add_item(loop *lp, batch *b, const nd_line *l)
{
    lp->st.n.read++;
    lp->st.n.bytes += l->len + (size_t)l->has_nl;
    size_t koff = b->keys.len, toff = b->text.len;
    int kind = classify(lp, b, l);
    if (kind == -1)
        return -1;
    size_t moff = b->text.len + l->len + (size_t)l->has_nl;
    if (kind < 0 || cli_buf_add(&b->text, l->p, l->len + (size_t)l->has_nl) ||
        (l->metalen && cli_buf_add(&b->text, l->meta, l->metalen))) {
        b->stop = cli_fail(lp->st.cfg->cmd, "out of memory");
        return -1;
    }
    item *it = &b->items[b->nitems++];
    *it = (item){*l, kind, b->nmsgs};
    it->l.p = (const char *)(uintptr_t)toff;
    it->l.meta = (const char *)(uintptr_t)moff;
    if (kind == IT_MSG) {
        size_t mlen = l->len - (l->len && l->p[l->len - 1] == '\r');
        b->again[b->nmsgs] = l->again != 0;
        b->since[b->nmsgs] = l->since;
        b->msgs[b->nmsgs++] = (idem_msg){
            .key = (const void *)(uintptr_t)koff,
            .keylen = b->keys.len - koff, .msg = (const void *)(uintptr_t)toff,
            .msglen = mlen};
    }
    return 0;
}

/* Offsets into the batch's buffers become pointers, now they stay put. */
static void fix_pointers(batch *b)
{
    for (size_t i = 0; i < b->nitems; i++) {
        nd_line *l = &b->items[i].l;
        l->p = b->text.p + (uintptr_t)l->p;
        l->meta = l->metalen ? b->text.p + (uintptr_t)l->meta : NULL;
    }
    for (size_t i = 0; i < b->nmsgs; i++) {
        b->msgs[i].key = b->keys.p + (uintptr_t)b->msgs[i].key;
        b->msgs[i].msg = b->text.p + (uintptr_t)b->msgs[i].msg;
    }
}

/* Read up to one batch into b; b->done when the inputs are done. After a
 * stop signal, whatever b holds is not committed. */
static void read_batch(loop *lp, batch *b)
{
    source *src = lp->src;
    b->nitems = b->nmsgs = 0;
    b->keys.len = b->text.len = 0;
    b->input = lp->rd.cur;
    b->done = b->stop = 0;
    b->acks = 0;  /* nothing of it is committed yet */
    while (b->nitems < lp->st.cfg->batch && !b->stop) {
        nd_line l = {0};  /* a file's line sets no meta */
        if (b->nitems == 0 && src->ops->wait(src))
            break;
        int rc = src->ops->next(src, &l, b->nitems == 0);
        if (rc == ND_LINE) {
            if (add_item(lp, b, &l))
                break;
            continue;
        }
        src->ops->release(src);
        if (rc == ND_AGAIN) {  /* nothing of it was claimed */
            b->nitems = b->nmsgs = 0;
            b->keys.len = b->text.len = 0;
            continue;
        }
        if (rc == ND_NEXT && b->nitems == 0) {
            b->input = lp->rd.cur;
            continue;
        }
        if (rc == ND_ERR)
            b->stop = cli_fail(lp->st.cfg->cmd, "%s", src->ops->err(src));
        b->done = rc == ND_END;
        if (rc != ND_FULL || b->nitems)
            break;
    }
    src->ops->release(src);
    fix_pointers(b);
}

/* ------------------------------------------------------------------------
 * Committing a batch (in the worker thread) */

/* A message that was not done exactly once here: always said, whatever
 * --quiet, since the exit status alone cannot tell which. */
static void problem(loop *lp, const idem_msg *m)
{
    const char *why =
        m->status == IDEM_ELOST
            ? "its claim was lost to another worker (stalled longer than "
              "--lease?); not reported done here"
        : m->status == IDEM_EVALSIZE
            ? "the handler's answer is too large to store; recorded as a "
              "permanent failure"
        : m->result == IDEM_MSG_INVALID
            ? "the store refused its key; nothing was run"
            : "its result line was written but the store did not record "
              "it; it was released";
    uint64_t k = ++lp->st.n.problems;
    if (k > MAX_WARNINGS)
        return;
    int text = cli_utf8_valid(m->key, m->keylen);
    fprintf(stderr, "%sidem %s: key %s%.*s%s: %s (%s)\n",
            lp->tty ? "\r\033[K" : "", lp->st.cfg->cmd, text ? "'" : "",
            text ? (int)(m->keylen < 200 ? m->keylen : 200) : 0,
            (const char *)m->key, text ? "'" : "(binary)", why,
            idem_strerror(m->status));
    if (k == MAX_WARNINGS)
        fprintf(stderr, "idem %s: further such messages are counted, not "
                        "shown\n", lp->st.cfg->cmd);
}

static void count(stream_counts *n, const idem_msg *m)
{
    switch (m->result) {
    case IDEM_MSG_DONE: n->fresh++; break;
    case IDEM_MSG_FAILED: n->failed++; break;  /* a cached failure
                                                 * replayed is a duplicate */
    case IDEM_MSG_GAVE_UP: n->gave_up++; break;
    case IDEM_MSG_INVALID: n->invalid++; break;
    default: n->dup++;
    }
}

/* May the sink hold the key of message i (of the batch being
 * committed) already, written by a run of this job or another worker
 * that did not commit it? Only if its claim is not the key's first, or
 * its entry was handed out before (another worker's store does not
 * count this one's claims). A first claim's key was never written here,
 * or its record expired and it is new again: an entry of that key in
 * the sink, committed by another job long ago, must not hide it. */
static int retried(const loop *lp, size_t i, uint32_t attempt)
{
    return attempt > 1 || lp->committing->again[i];
}

/* Since when message i's output may be in the sink (nd_line.since):
 * known for an entry handed out before; 0 for a first delivery (the
 * sink's window then). */
static uint64_t since_of(const loop *lp, size_t i)
{
    return lp->committing->again[i] ? lp->committing->since[i] : 0;
}

/* Message i (attempt: its claim's) will be asked about: the earliest
 * time its lookup goes back to joins *from (0: none yet). */
static void note_retried(const loop *lp, size_t i, uint32_t attempt,
                         int *any, uint64_t *from)
{
    if (!retried(lp, i, attempt))
        return;
    uint64_t t = since_of(lp, i);
    *any = 1;
    if (t && (!*from || t < *from))
        *from = t;
}

/* Before the sink is asked about claims made until now, it reads what
 * other workers wrote since (`any`: one of them will be asked), back to
 * `from`. 0 or IDEM_EIO. */
static int sink_catch_up(loop *lp, int any, uint64_t from)
{
    sink *k = lp->st.job.sink;
    return k && any && k->ops->catch_up(k, from) ? IDEM_EIO : 0;
}

const char *stream_status(idem_msg_result r)
{
    return r == IDEM_MSG_DONE || r == IDEM_MSG_REPLAY          ? "done"
           : r == IDEM_MSG_FAILED || r == IDEM_MSG_REPLAY_FAILED ? "failed"
                                                                : "gave_up";
}

/* Does the stream sink hold the output of m (item it's message)? Only
 * an outcome of this run is looked for, and only when retried() or the
 * files are read again. An entry that tells another outcome is not m's:
 * the key gave up before, was released, and is done now. An entry found
 * is m's output from now on (forget). 1, 0, or -1 (an error). */
static int in_sink(loop *lp, const idem_msg *m, const item *it)
{
    const char *st, *res;
    size_t rlen;
    int again = retried(lp, it->msg, m->attempt);
    if (!lp->st.job.sink || (m->result != IDEM_MSG_DONE &&
                             m->result != IDEM_MSG_FAILED &&
                             m->result != IDEM_MSG_GAVE_UP) ||
        !(again || lp->reread))
        return 0;
    sink *k = lp->st.job.sink;
    int rc = k->ops->has(k, m->key, m->keylen, again, since_of(lp, it->msg),
                         &st, &res, &rlen);
    if (rc == 1 && st && strcmp(st, stream_status(m->result)))
        return 0;
    if (rc == 1)
        k->ops->forget(k, m->key, m->keylen);
    return rc;
}

/* The meta that goes to the sink with the output obuf[from..) of item
 * it: the line's, but fields (META_FIELD, connect.h) only with the line
 * they make: dedup's output is the line itself, run's a result line that
 * the input's fields must not stand for. */
static size_t sink_meta(const job *j, size_t from, const item *it)
{
    const nd_line *l = &it->l;
    size_t n = j->obuf.len - from;
    if (!meta_has_fields(l->meta, l->metalen))
        return l->metalen;
    return n == l->len + 1 && j->obuf.p[from + l->len] == '\n' &&
                   !memcmp(j->obuf.p + from, l->p, l->len)
               ? l->metalen
               : 0;
}

/* Append item it's output (m: its outcome, NULL for a line passed
 * through) unless the sink has it. 0 or an IDEM_E* code. */
static int emit_item(loop *lp, const idem_msg *msgs, const idem_msg *m,
                     const item *it)
{
    job *j = &lp->st.job;
    int found = m ? in_sink(lp, m, it) : 0;
    if (found < 0)
        return IDEM_EIO;
    if (found) {
        lp->st.n.read_back++;
        return 0;
    }
    size_t from = j->obuf.len;
    if (lp->st.cfg->emit(lp->st.cfg->ectx, &lp->st, msgs, m, &it->l) ||
        job_mark(j, from, m ? m->key : "", m ? m->keylen : 0, it->l.meta,
                 j->sink ? sink_meta(j, from, it) : 0))
        return IDEM_ENOMEM;
    return 0;
}

/* The sink catches up for the retried messages of items [from, upto).
 * msgs: the runner's. 0 or IDEM_EIO. */
static int catch_up_items(loop *lp, const idem_msg *msgs, size_t from,
                          size_t upto)
{
    const batch *b = lp->committing;
    int any = 0;
    uint64_t since = 0;
    for (size_t i = from; i < upto; i++)
        if (b->items[i].kind == IT_MSG)
            note_retried(lp, b->items[i].msg,
                         msgs[b->items[i].msg - lp->base].attempt, &any,
                         &since);
    return sink_catch_up(lp, any, since);
}

/* A source that keeps its own position is told which lines the commit
 * covers, and the checkpoint keeps where that leaves it. 0 or an
 * IDEM_E* code. */
static int mark_source(loop *lp, size_t from, size_t upto)
{
    source *src = lp->src;
    if (!src->ops->mark)
        return 0;
    for (size_t i = from; i < upto; i++)
        src->ops->mark(src, &lp->committing->items[i].l);
    if (job_from(&lp->st.job, src->ops->pos(src)) == 0)
        return 0;
    cli_fail(lp->st.cfg->cmd, "the source's position is too long for a "
             "checkpoint (too many partitions)");
    return IDEM_EIO;
}

/* A source without a pending list, after a crash: the messages the dead
 * run handed out and wrote may lie anywhere ahead on its partitions, not
 * only in the first batch. Until they are all behind (committed here),
 * the checkpoint keeps the sink's position where the read-back began, so
 * that another crash reads their entries back again. Once released, the
 * position moves with the commits. */
static void pin_sink(loop *lp)
{
    job *j = &lp->st.job;
    source *src = lp->src;
    j->sink_pinned = j->sink_pinned && src->ops->in_doubt(src);
}

/* Joined (join_store): the source's entries of items [from, upto) are
 * acknowledged with the checkpoint just put, in its script. */
static int ack_joined(loop *lp, size_t from, size_t upto)
{
    const batch *b = lp->committing;
    for (size_t i = from; i < upto; i++)
        if (lp->src->ops->ack(lp->src, &b->items[i].l))
            return IDEM_ENOMEM;
    return lp->src->ops->ack_flush(lp->src) ? IDEM_EIO : 0;
}

/* A stream source's entries of the committed prefix are acknowledged:
 * only now may the stream forget them. Lines before the first message
 * not committed are committed (passed, dropped or done). */
static void ack_prefix(loop *lp, batch *b)
{
    for (size_t i = 0; i < b->acks; i++)
        if (lp->src->ops->ack(lp->src, &b->items[i].l))
            return;
    lp->src->ops->ack_flush(lp->src);
}

/* The committed prefix of the batch just committed: its lines up to the
 * first message not committed. */
static void note_acks(loop *lp)
{
    batch *b = lp->committing;
    size_t upto = 0;
    while (upto < b->emitted && !(b->items[upto].kind == IT_MSG &&
                                  b->items[upto].msg >= lp->base))
        upto++;
    b->acks = upto;
}

/* Batch k is finished; its buffer is the reader's again. */
static void batch_done(loop *lp, uint64_t k, int over)
{
    pthread_mutex_lock(&lp->q_mu);
    lp->finished = k + 1;
    lp->commit_over = over;
    lp->shown_fresh = lp->st.n.fresh;
    lp->shown_dup = lp->st.n.dup;
    pthread_cond_broadcast(&lp->q_cv);
    pthread_mutex_unlock(&lp->q_mu);
}

/* The batch owed its acknowledgements (overlap) gets them once its
 * sync is known done, and is finished then (its lines are what the
 * acknowledgements name, so the reader may not reuse it before): from
 * the next batch's commit(), after its entries are written, or at the
 * end. A sync that failed acknowledges nothing: the entries stay
 * pending and come again, read back. 0 or the store's error. */
static int settle_owed(loop *lp, int over)
{
    batch *b = lp->owed;
    if (!b)
        return 0;
    lp->owed = NULL;
    int rc = idem_sync_wait(lp->s);
    if (!rc)
        ack_prefix(lp, b);
    batch_done(lp, lp->owed_k, over);
    return rc;
}

/* The runner's commit step: output of every line before the first
 * message not committed, then the checkpoint. msgs is b->msgs + base. */
static int commit(void *ctx, const idem_msg *msgs, size_t p)
{
    loop *lp = ctx;
    batch *b = lp->committing;
    size_t upto = b->emitted;
    while (upto < b->nitems && !(b->items[upto].kind == IT_MSG &&
                                 b->items[upto].msg >= lp->base + p))
        upto++;
    int rc = catch_up_items(lp, msgs, b->emitted, upto);
    for (size_t i = b->emitted; !rc && i < upto; i++) {
        item *it = &b->items[i];
        idem_msg user;  /* the key as the job found it */
        const idem_msg *m =
            it->kind == IT_MSG ? &msgs[it->msg - lp->base] : NULL;
        if (m) {
            user = ks_user_msg(&lp->st.cfg->ks, m);
            m = &user;
        }
        if (m && m->result == IDEM_MSG_INVALID)
            problem(lp, m);
        if (m)
            count(&lp->st.n, m);
        rc = it->kind == IT_DROP ? 0 : emit_item(lp, msgs, m, it);
    }
    if (rc)
        return rc;
    rc = mark_source(lp, b->emitted, upto);
    if (rc)
        return rc;
    pin_sink(lp);
    size_t from = b->emitted;
    b->emitted = upto;
    rc = job_commit(&lp->st.job, b->input,
                    upto ? &b->items[upto - 1].l : NULL);
    /* The batch before's sync ran while these entries were written. */
    rc = rc ? rc : settle_owed(lp, 0);
    return rc || !lp->src_joined ? rc : ack_joined(lp, from, upto);
}

/* Did the handler end the batch (not the store)? Restart it only then,
 * and when restarts are left: after a store error (which the runner met
 * itself, or the handler's tick did) the store is poisoned, and a rerun
 * must start from the last checkpoint, not go on. */
static int handler_stopped_it(const loop *lp)
{
    const stream_cfg *c = lp->st.cfg;
    return c->handler && lp->rc && lp->rc == lp->handler_rc &&
           !(c->store_failed && c->store_failed(c->hctx));
}

/* With --dead-letter only a fault of the handler restarts it: a command
 * that cannot be run would otherwise be restarted without end. */
static int restartable(const loop *lp)
{
    return lp->st.n.restarts < lp->st.cfg->restarts && !stream_stop &&
           handler_stopped_it(lp) && (!lp->dl.path || lp->fault);
}

static void forget_faults(loop *lp)
{
    if (!lp->any_fault)
        return;
    for (size_t i = 0; i < lp->st.cfg->batch; i++) {
        free(lp->fault_err[i]);
        lp->fault_err[i] = NULL;
    }
    memset(lp->faults, 0, lp->st.cfg->batch * sizeof *lp->faults);
    lp->any_fault = 0;
}

/* After a handler fault with --dead-letter: charge it to the message
 * that was the only one sent and unanswered, and run every message that
 * was (the suspects) alone from now on, so that each later fault is
 * charged to the message that caused it. */
static void note_fault(loop *lp)
{
    if (!lp->dl.path || !lp->fault || lp->suspects_end <= lp->suspects)
        return;
    if (lp->suspects_end - lp->suspects == 1) {
        size_t i = lp->suspects;
        lp->faults[i]++;
        free(lp->fault_err[i]);
        lp->fault_err[i] = strdup(lp->fault_why);
        lp->any_fault = 1;
    }
    if (lp->alone_end < lp->suspects_end)
        lp->alone_end = lp->suspects_end;
}

/* Wait before a restart, so that a handler that dies at once does not
 * spin: --backoff after an answer, else twice the last wait (bounded).
 * A stop signal ends the wait. */
static void back_off(loop *lp)
{
    int64_t first = lp->st.cfg->backoff_ms > 0 ? lp->st.cfg->backoff_ms : 1;
    int64_t w = lp->answered || !lp->restart_wait_ms
                    ? first : 2 * lp->restart_wait_ms;
    lp->restart_wait_ms = w < RESTART_WAIT_MAX_MS ? w : RESTART_WAIT_MAX_MS;
    lp->answered = 0;
    for (int64_t left = lp->restart_wait_ms; left > 0 && !stream_stop;
         left -= 50)
        poll(NULL, 0, left < 50 ? (int)left : 50);
}

static void say_restart(const loop *lp)
{
    const stream_cfg *c = lp->st.cfg;
    if (c->quiet)
        return;
    fprintf(stderr, "idem %s: restarting the handler (%" PRIu64, c->cmd,
            lp->st.n.restarts);
    if (c->restarts != UINT64_MAX)
        fprintf(stderr, " of %" PRIu64, c->restarts);
    fputs(")\n", stderr);
}

/* Commit the batch; after a handler failure, again over the messages not
 * committed (their claims were released: they get new tokens), as long
 * as restarts are left. Suspects of a fault (note_fault) are committed
 * one message at a time. */
static void commit_runs(loop *lp)
{
    batch *b = lp->committing;
    lp->base = lp->alone_end = 0;
    b->emitted = 0;
    forget_faults(lp);
    for (;;) {
        idem_msg *msgs = b->msgs + lp->base;
        size_t n = lp->base < lp->alone_end ? 1 : b->nmsgs - lp->base;
        lp->handler_rc = lp->fault = 0;
        lp->rc = idem_runner_batch(lp->runner, msgs, n, &lp->committed);
        /* Problems met after a message's line was committed. */
        for (size_t i = 0; i < lp->committed; i++)
            if (msgs[i].status && msgs[i].result != IDEM_MSG_INVALID) {
                idem_msg user = ks_user_msg(&lp->st.cfg->ks, &msgs[i]);
                problem(lp, &user);
            }
        lp->base += lp->committed;
        if (!lp->rc && lp->base < b->nmsgs)
            continue;  /* a suspect committed alone: on to the next */
        /* Expire a little between batches: bounded work. The batch is
         * committed whatever the sweep says; a later one tries again.
         * Redis expires its records itself (each has a TTL), so there a
         * sweep would only cost the server a scan per batch. */
        if (!lp->rc && lp->sweeps &&
            idem_sweep(lp->s, 4 * lp->st.cfg->batch, NULL) &&
            !lp->st.cfg->quiet)
            fprintf(stderr, "idem %s: a sweep between batches failed (%s); "
                    "going on\n", lp->st.cfg->cmd, idem_errdetail(lp->s));
        if (!lp->rc || lp->base == b->nmsgs || !restartable(lp))
            return;
        note_fault(lp);
        back_off(lp);
        lp->st.n.restarts++;
        say_restart(lp);
    }
}

/* Answers the sink gave (from_sink) live until the batch is done. */
static void forget_kept(loop *lp)
{
    for (size_t i = 0; i < lp->nkept; i++)
        free(lp->kept[i]);
    lp->nkept = 0;
}

static void commit_batch(loop *lp)
{
    forget_kept(lp);
    commit_runs(lp);
    note_acks(lp);
    if (lp->src->ops->ack && !lp->src_joined && !lp->overlap)
        ack_prefix(lp, lp->committing);
}

/* The source's settle hook (source_opts), in the reading thread: a
 * broker about to take partitions away first waits for the batches
 * handed over to be committed, so that their offsets are acknowledged
 * while they are still this reader's. */
static void settle(void *ctx)
{
    loop *lp = ctx;
    pthread_mutex_lock(&lp->q_mu);
    while (lp->finished < lp->handed && !lp->commit_over)
        pthread_cond_wait(&lp->q_cv, &lp->q_mu);
    pthread_mutex_unlock(&lp->q_mu);
}

/* How the batch just committed ends: 0, or the run's exit status. */
static int finish_commit(loop *lp)
{
    batch *b = lp->committing;
    if (stream_stop && (lp->rc == IDEM_ESTOPPED || handler_stopped_it(lp))) {
        lp->st.n.released += b->nmsgs - lp->base;
        return 0;  /* stopped by a signal; its prefix is committed */
    }
    if (lp->rc && lp->base < b->nmsgs && lp->st.cfg->handler)
        return 1;  /* the handler said why; its prefix is committed */
    if (lp->rc)
        return cli_store_fail(lp->st.cfg->cmd, lp->s, lp->rc,
                              "committing a batch");
    return 0;
}

/* What the metrics endpoint cannot ask the store: the failures and
 * dead letters, by the worker after each batch (its own counts). */
static void note_dead_letters(loop *lp)
{
    msrv_note_failures(lp->msrv, lp->st.n.failed, lp->st.n.dead_letter);
}

/* Commit batch b (in the worker). 1 when it ends the run (an error, the
 * end of the inputs, a line that stops it, a stop signal), with the
 * exit status in lp->result. A batch read ahead that a stop signal
 * finds not started is dropped: nothing of it was claimed. */
static int commit_one(loop *lp, batch *b)
{
    if (stream_stop) {
        lp->stopped = 1;
        return 1;
    }
    lp->committing = b;
    commit_batch(lp);
    int rc = finish_commit(lp);
    note_dead_letters(lp);
    lp->stopped = !rc && !b->done && !b->stop && stream_stop;
    lp->result = rc ? rc : b->stop;
    return rc || b->done || b->stop || stream_stop;
}

/* Has the reader handed batch k over? */
static int batch_ready(loop *lp, uint64_t k)
{
    pthread_mutex_lock(&lp->q_mu);
    int ready = lp->handed > k;
    pthread_mutex_unlock(&lp->q_mu);
    return ready;
}

/* Batch k as the worker's to commit, once the reader has handed it
 * over; NULL when it hands over no more. */
static batch *next_batch(loop *lp, uint64_t k)
{
    pthread_mutex_lock(&lp->q_mu);
    while (lp->handed <= k && !lp->reading_over)
        pthread_cond_wait(&lp->q_cv, &lp->q_mu);
    batch *b = lp->handed > k ? &lp->b[k % QUEUED] : NULL;
    pthread_mutex_unlock(&lp->q_mu);
    return b;
}

/* Batch k is read: the worker's from now on. */
static void hand_over(loop *lp, uint64_t k)
{
    pthread_mutex_lock(&lp->q_mu);
    lp->handed = k + 1;
    pthread_cond_broadcast(&lp->q_cv);
    pthread_mutex_unlock(&lp->q_mu);
}

/* The reader hands over no more, and waits for the worker to be done
 * with what it has. */
static void drain(loop *lp)
{
    pthread_mutex_lock(&lp->q_mu);
    lp->reading_over = 1;
    pthread_cond_broadcast(&lp->q_cv);
    while (lp->finished < lp->handed && !lp->commit_over)
        pthread_cond_wait(&lp->q_cv, &lp->q_mu);
    pthread_mutex_unlock(&lp->q_mu);
}

/* The buffer of batch k, once the worker is done with batch k -
 * QUEUED; NULL when the run is over. */
static batch *free_batch(loop *lp, uint64_t k)
{
    pthread_mutex_lock(&lp->q_mu);
    while (k - lp->finished >= QUEUED && !lp->commit_over)
        pthread_cond_wait(&lp->q_cv, &lp->q_mu);
    batch *b = lp->commit_over ? NULL : &lp->b[k % QUEUED];
    pthread_mutex_unlock(&lp->q_mu);
    return b;
}

/* Commit batch k; 1 when it ended the run. With overlap it is owed its
 * acknowledgements until the next commit has waited for its sync
 * (settle_owed), or now when it ends the run. */
static int commit_step(loop *lp, batch *b, uint64_t k)
{
    int over = commit_one(lp, b);
    if (!lp->overlap) {
        batch_done(lp, k, over);
        return over;
    }
    if (b->nmsgs)
        cli_kill_point("sync-started");  /* its acknowledgements owed */
    settle_owed(lp, 0);  /* if no commit() of b did */
    lp->owed = b;
    lp->owed_k = k;
    if (over)
        settle_owed(lp, 1);
    return over;
}

/* The worker: the batches in the order read, until one ends the run or
 * the reader hands over no more. */
static void commit_all(loop *lp)
{
    batch *b;
    for (uint64_t k = 0;; k++) {
        if (lp->owed && !batch_ready(lp, k))
            settle_owed(lp, 0);  /* a quiet stream: acknowledge it now */
        if ((b = next_batch(lp, k)) == NULL || commit_step(lp, b, k))
            break;
    }
    settle_owed(lp, 1);
}

static void *worker(void *arg)
{
    loop *lp = arg;
    sigset_t stops;
    sigemptyset(&stops);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stops, NULL);  /* the reader takes them */
    commit_all(lp);
    if (lp->st.cfg->handler_end)
        lp->st.cfg->handler_end(lp->st.cfg->hctx);
    return NULL;
}

static void start_worker(loop *lp)
{
    lp->threaded = pthread_create(&lp->worker, NULL, worker, lp) == 0;
}

static void stop_worker(loop *lp)
{
    if (!lp->threaded && lp->st.cfg->handler_end)
        lp->st.cfg->handler_end(lp->st.cfg->hctx);
    if (lp->threaded)
        pthread_join(lp->worker, NULL);
}

/* ------------------------------------------------------------------------
 * Progress and summary */

static void progress(loop *lp, int final)
{
    double t = cli_mono_s();
    if (!lp->tty || lp->st.cfg->quiet ||
        (!final && t - lp->last_progress < 0.5))
        return;
    lp->last_progress = t;
    const stream_counts *n = &lp->st.n;
    if (final) {
        fputs("\r\033[K", stderr);
        return;
    }
    double secs = t - lp->t0;
    pthread_mutex_lock(&lp->q_mu);  /* the worker's counts */
    uint64_t fresh = lp->shown_fresh, dup = lp->shown_dup;
    pthread_mutex_unlock(&lp->q_mu);
    fprintf(stderr, "\r\033[Kidem %s: %" PRIu64 " lines, %.0f lines/s, "
            "%" PRIu64 " new, %" PRIu64 " duplicate, %.1f MB",
            lp->st.cfg->cmd, n->read, secs > 0 ? (double)n->read / secs : 0,
            fresh, dup, (double)n->bytes / 1e6);
    long long lag = lp->src->ops->lag ? lp->src->ops->lag(lp->src) : -1;
    if (lag >= 0)
        fprintf(stderr, ", lag %lld", lag);
    if (lp->todo && n->bytes && n->bytes <= lp->todo) {
        double done = (double)n->bytes / (double)lp->todo;
        long long left = (long long)(secs / done - secs);
        fprintf(stderr, ", %.0f%%, ETA %lldm%02llds", 100.0 * done,
                left / 60, left % 60);
    }
}

/* --stats-json of a run that failed (rc 1) says why. */
static void json_error(int rc)
{
    cli_buf b = {0};
    const char *e = *cli_last_error() ? cli_last_error() : "failed";
    if (rc == CLI_EXIT_FAIL && !cli_buf_json_string(&b, e, strlen(e)))
        fprintf(stderr, ",\"error\":%.*s", (int)b.len, b.p);
    cli_buf_free(&b);
}

static void summary(loop *lp, int rc)
{
    const stream_counts *n = &lp->st.n;
    const stream_cfg *c = lp->st.cfg;
    double secs = cli_mono_s() - lp->t0;
    double rate = secs > 0 ? (double)n->read / secs : 0;
    if (c->stats_json) {
        fprintf(stderr,
                "{\"command\":\"%s\",\"read\":%" PRIu64 ",\"new\":%" PRIu64
                ",\"duplicate\":%" PRIu64 ",\"failed\":%" PRIu64
                ",\"gave_up\":%" PRIu64 ",\"dead_letter\":%" PRIu64
                ",\"skipped\":%" PRIu64
                ",\"passed\":%" PRIu64 ",\"blank\":%" PRIu64
                ",\"read_back\":%" PRIu64
                ",\"bytes\":%" PRIu64 ",\"seconds\":%.3f,\"lines_per_sec\":"
                "%.0f,\"resumed\":%s,\"exit\":%d",
                c->cmd, n->read, n->fresh, n->dup, n->failed, n->gave_up,
                n->dead_letter, n->skipped + n->invalid, n->passed, n->blank,
                n->read_back, n->bytes, secs, rate,
                lp->st.job.resumed ? "true" : "false", rc);
        json_error(rc);
        fputs("}\n", stderr);
        return;
    }
    if (c->quiet)
        return;
    fprintf(stderr, "idem %s: %" PRIu64 " lines read, %" PRIu64 " new, %"
            PRIu64 " duplicate", c->cmd, n->read, n->fresh, n->dup);
    if (c->handler)
        fprintf(stderr, ", %" PRIu64 " failed, %" PRIu64 " gave up",
                n->failed, n->gave_up);
    if (c->dead_letter)
        fprintf(stderr, ", %" PRIu64 " dead-lettered", n->dead_letter);
    fprintf(stderr, ", %" PRIu64 " skipped", n->skipped + n->invalid);
    if (n->passed)
        fprintf(stderr, ", %" PRIu64 " passed through", n->passed);
    if (n->read_back)
        fprintf(stderr, ", %" PRIu64 " found already written (read back)",
                n->read_back);
    fprintf(stderr, " in %.2f s (%.0f lines/s)\n", secs, rate);
}

/* ------------------------------------------------------------------------
 * The run */

/* Run the handler over tasks[0..n); after a failure, keep what a restart
 * needs: was it a fault, and which messages were in flight. */
static int run_handler(loop *lp, idem_task *tasks, size_t n)
{
    const stream_cfg *c = lp->st.cfg;
    lp->handler_rc = ks_handle(&c->ks, c->handler, c->hctx, tasks, n);
    size_t got = 0, sent = 0;
    while (got < n && tasks[got].answer)
        got++;
    lp->answered += got;
    if (got)
        lp->dead_in_a_row = 0;
    if (!lp->handler_rc)
        return 0;
    const char *why = c->fault ? c->fault(c->hctx, &sent) : NULL;
    lp->fault = why != NULL;
    snprintf(lp->fault_why, sizeof lp->fault_why, "%s", why ? why : "");
    sent = sent < n ? sent : n;
    lp->suspects = lp->suspects_end = 0;
    if (why && got < sent) {
        lp->suspects = lp->base + tasks[got].index;
        lp->suspects_end = lp->base + tasks[sent - 1].index + 1;
    }
    return lp->handler_rc;
}

static uint32_t max_faults(const stream_cfg *c)
{
    return c->max_attempts ? c->max_attempts : 3;
}

/* Is t's message poison: faults up to --max-attempts, or already in the
 * dead-letter file (a run killed after writing its line)? */
static int is_poison(const loop *lp, const idem_task *t)
{
    const key_space *ks = &lp->st.cfg->ks;
    size_t len;
    return lp->dl.path &&
           (lp->faults[lp->base + t->index] >= max_faults(lp->st.cfg) ||
            dl_find(&lp->dl, (const char *)t->key + ks->len,
                    t->keylen - ks->len, &len));
}

static void say_set_aside(const loop *lp, const char *key, size_t keylen,
                          int known, uint32_t faults)
{
    int text = cli_utf8_valid(key, keylen);
    fprintf(stderr, "%sidem %s: key %s%.*s%s: ", lp->tty ? "\r\033[K" : "",
            lp->st.cfg->cmd, text ? "'" : "",
            text ? (int)(keylen < 200 ? keylen : 200) : 0, key,
            text ? "'" : "(binary)");
    if (known)
        fprintf(stderr, "already in the dead-letter file %s; recorded as "
                "failed\n", lp->dl.path);
    else
        fprintf(stderr, "the handler failed on it %u times; written to "
                "the dead-letter file %s and recorded as failed\n", faults,
                lp->dl.path);
}

/* A handler that fails on DEAD_IN_A_ROW_MAX messages in a row without
 * answering any between them is broken, not the messages (it cannot
 * start, its database is down): setting the whole stream aside would
 * record every message as failed for good. The run stops instead, the
 * message's claim released; a rerun goes on once the handler is fixed. */
enum { DEAD_IN_A_ROW_MAX = 3 };

static int broken_handler(loop *lp)
{
    if (++lp->dead_in_a_row <= DEAD_IN_A_ROW_MAX)
        return 0;
    fprintf(stderr, "%sidem %s: the handler failed on %d messages in a row "
            "without answering any (the last: %s): it looks broken, not "
            "the messages; stopping before setting more aside\n",
            lp->tty ? "\r\033[K" : "", lp->st.cfg->cmd,
            DEAD_IN_A_ROW_MAX + 1, lp->fault_why);
    return IDEM_EIO;
}

/* Set t's message aside: its line in the dead-letter file (made durable
 * first, unless the file has it), and as its answer a permanent failure
 * that says so, recorded by a tick at once (dl_result is reused). */
static int set_aside(loop *lp, idem_task *t)
{
    const stream_cfg *c = lp->st.cfg;
    size_t i = lp->base + t->index, len;
    const char *key = (const char *)t->key + c->ks.len;
    size_t keylen = t->keylen - c->ks.len;
    const char *err = dl_find(&lp->dl, key, keylen, &len);
    int known = err != NULL;
    if (!known && broken_handler(lp))
        return IDEM_EIO;
    if (!known && dl_add(&lp->dl, c->cmd, key, keylen, t->msg, t->msglen,
                         lp->faults[i], lp->fault_err[i] ? lp->fault_err[i]
                                                         : "out of memory"))
        return IDEM_EIO;
    err = known ? err : dl_find(&lp->dl, key, keylen, &len);
    cli_buf *b = &lp->dl_result;
    b->len = 0;
    if (cli_buf_str(b, "{\"error\":") || cli_buf_json_string(b, err, len) ||
        cli_buf_str(b, ",\"dead_letter\":true}"))
        return IDEM_ENOMEM;
    t->answer = IDEM_TASK_FAIL;
    t->data = b->p;
    t->len = b->len;
    lp->st.n.dead_letter++;
    say_set_aside(lp, key, keylen, known, lp->faults[i]);
    return idem_runner_tick(lp->runner);
}

/* A copy of p[0..n) that lives until the batch is done; NULL on ENOMEM. */
static char *keep(loop *lp, const char *p, size_t n)
{
    if (lp->nkept == lp->capkept) {
        size_t cap = lp->capkept ? 2 * lp->capkept : 64;
        char **v = realloc(lp->kept, cap * sizeof *v);
        if (!v)
            return NULL;
        lp->kept = v;
        lp->capkept = cap;
    }
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, p, n);
        c[n] = 0;
        lp->kept[lp->nkept++] = c;
    }
    return c;
}

/* A task whose key the stream sink holds with an outcome (a run that
 * died after writing it, before committing): answered with it, not run
 * again. gave_up is none: that key was released to run again. 1
 * answered, 0 not, -1 an error. */
static int from_sink(loop *lp, idem_task *t)
{
    const key_space *ks = &lp->st.cfg->ks;
    const char *st, *res;
    size_t rlen;
    sink *k = lp->st.job.sink;
    int again = retried(lp, lp->base + t->index, t->attempt);
    if (!again && !lp->reread)
        return 0;
    int rc = k->ops->has(k, (const char *)t->key + ks->len,
                         t->keylen - ks->len, again,
                         since_of(lp, lp->base + t->index), &st, &res,
                         &rlen);
    if (rc <= 0 || !st || !strcmp(st, "gave_up"))
        return rc < 0 ? -1 : 0;
    const char *copy = keep(lp, res ? res : "", rlen);
    if (!copy)
        return -1;
    t->answer = !strcmp(st, "done") ? IDEM_TASK_DONE : IDEM_TASK_FAIL;
    t->data = copy;
    t->len = rlen;
    return 1;
}

/* Is t settled without the handler: 1 by the sink, 2 as poison, 0 not,
 * -1 an error. */
static int settled(loop *lp, idem_task *t)
{
    int rc = lp->st.job.sink ? from_sink(lp, t) : 0;
    return rc ? rc : is_poison(lp, t) ? 2 : 0;
}

/* The runner has one context for both callbacks: ours. Messages the
 * sink has and poison messages are answered here; the handler gets the
 * runs of messages between them. */
static int handle_tasks(void *ctx, idem_task *tasks, size_t n)
{
    loop *lp = ctx;
    int any = 0;
    uint64_t since = 0;
    for (size_t i = 0; i < n; i++)
        note_retried(lp, lp->base + tasks[i].index, tasks[i].attempt, &any,
                     &since);
    int rc = sink_catch_up(lp, any, since);
    for (size_t i = 0; !rc && i < n;) {
        size_t j = i;
        int kind = 0;
        while (j < n && !(kind = settled(lp, &tasks[j])))
            j++;
        rc = j > i ? run_handler(lp, tasks + i, j - i) : 0;
        if (!rc && kind < 0)
            rc = IDEM_EIO;
        if (!rc && kind == 2)
            rc = set_aside(lp, &tasks[j]);
        i = j + 1;
    }
    return rc;
}

/* The runner's stop hook: a stop signal ends its waits. */
static int stop_asked(void *ctx)
{
    (void)ctx;
    return stream_stop != 0;
}

/* dedup from a stream to a stream of the same broker (Redis Streams,
 * Kafka, NATS JetStream) on a local store: a batch's sync runs while the
 * next batch's entries are written (IDEM_RUNNER_SYNC_START), and the
 * batch is acknowledged after both. What exactly-once needs of it: an
 * entry is acknowledged (a Redis XACK, a Kafka offset commit, a NATS
 * ack) only after the sync that covers its key; the next batch's
 * claims, which may be of its keys, see them done in memory, and a
 * crash before the sync loses both batches' records but none of their
 * entries: both are still pending (past the group's offsets, unacked),
 * come again (handed out before: `again`, or after a resume: reread),
 * and are read back from the sink after the last durable checkpoint's
 * position, which precedes both batches' entries. Every sink reads back
 * from that position to its end (Kafka: to a fence), however many
 * batches lie there, and every source resumes at or before it (a Kafka
 * source at the later of the checkpoint's offsets and the group's,
 * which only acknowledgements move). So a crash leaves up to two
 * batches of entries past the job's position, which a trimmed output
 * must keep (rsink.c's maxlen rule). A handler's effects (run) need
 * their claims synced first, which this would not change. */
static int sync_overlaps(const stream_cfg *c)
{
    int kind = connect_kind(c->from);
    return !c->handler && kind && kind == connect_kind(c->to) &&
           (idem_uri_caps(cli_store_uri(c->uri)) & IDEM_CAP_SEGMENTS);
}

static int setup(loop *lp, const stream_cfg *c)
{
    char err[256];
    lp->st.cfg = c;
    lp->tty = isatty(2);
    lp->t0 = lp->last_progress = cli_mono_s();
    lp->key_is_id = c->key && !strcmp(c->key, "@id");
    lp->key_in_meta = meta_key_spec(c->key);
    if (!c->line_mode && !lp->key_is_id && !lp->key_in_meta) {
        if (jk_path_parse(c->key, &lp->path, err, sizeof err))
            return cli_usage_error(c->cmd, "--key %s: %s", c->key, err);
        if (!(lp->jk = jk_new(&lp->path)))
            return cli_fail(c->cmd, "out of memory");
    }
    if (c->line_hash && !(lp->line_hash = lh_new(c->cmd)))
        return 1;
    lp->dl.path = c->dead_letter;
    lp->dl.line_mode = c->line_mode;
    if (dl_open(&lp->dl, c->cmd, &c->ks))
        return 1;
    if (c->dead_letter &&
        (!(lp->faults = calloc(c->batch, sizeof *lp->faults)) ||
         !(lp->fault_err = calloc(c->batch, sizeof *lp->fault_err))))
        return cli_fail(c->cmd, "out of memory");
    for (int i = 0; i < QUEUED; i++) {
        lp->b[i].items = malloc(c->batch * sizeof *lp->b[i].items);
        lp->b[i].msgs = malloc(c->batch * sizeof *lp->b[i].msgs);
        lp->b[i].again = malloc(c->batch);
        lp->b[i].since = malloc(c->batch * sizeof *lp->b[i].since);
        if (!lp->b[i].items || !lp->b[i].msgs || !lp->b[i].again ||
            !lp->b[i].since)
            return cli_fail(c->cmd, "out of memory");
    }
    lp->s = cli_open(c->cmd, cli_store_uri(c->uri), 0, c->ttl_ms,
                     c->lease_ms);
    if (!lp->s)
        return cli_open_status();
    lp->sweeps =
        (idem_uri_caps(cli_store_uri(c->uri)) & IDEM_CAP_SEGMENTS) != 0;
    idem_runner_opts ro;
    idem_runner_opts_init(&ro);
    ro.handler = c->handler ? handle_tasks : NULL;
    ro.commit = commit;
    ro.stop = stop_asked;
    ro.ctx = lp;
    ro.ttl_ms = c->ttl_ms;
    ro.lease_ms = c->lease_ms;
    if (c->max_attempts)
        ro.max_attempts = c->max_attempts;
    ro.backoff_ms = c->backoff_ms;
    if (c->commit_interval_ms >= 0)
        ro.commit_interval_ms = c->commit_interval_ms;
    lp->overlap = sync_overlaps(c);
    ro.flags = lp->overlap ? IDEM_RUNNER_SYNC_START : 0;
    if (idem_runner_new(lp->s, &ro, &lp->runner))
        return cli_fail(c->cmd, "out of memory");
    if (c->runner_out)
        *c->runner_out = lp->runner;
    return 0;
}

static void announce_resume(const loop *lp)
{
    const job *j = &lp->st.job;
    if (!j->resumed || lp->st.cfg->quiet)
        return;
    if (j->sink) {
        fprintf(stderr, "idem %s: resuming job '%s'; what its last run "
                "wrote to the stream after entry %s is read back, not "
                "written again\n", lp->st.cfg->cmd, j->name, j->sink_pos);
        return;
    }
    fprintf(stderr, "idem %s: resuming job '%s' after line %" PRIu64
            " of %s; output kept at its committed %" PRIu64 " bytes\n",
            lp->st.cfg->cmd, j->name, j->pos.lineno, nd_name(&lp->rd),
            j->pos.out_len);
}

/* What the endpoint cannot ask the store: the source's lag, after each
 * read (the source is the reading thread's); the worker notes the
 * failures (note_dead_letters). */
static void note_lag(loop *lp)
{
    if (lp->msrv && lp->src->ops->lag)
        msrv_note_lag(lp->msrv, lp->src->ops->lag(lp->src));
}

/* The endpoint, from before the store opens (a busy port is bad usage,
 * said before anything is done) to after the last batch. */
static int start_metrics(loop *lp, const stream_cfg *c)
{
    int rc = 0;
    if (c->metrics_listen)
        lp->msrv = msrv_start(c->cmd, c->metrics_listen,
                              cli_store_uri(c->uri), &rc);
    return rc;
}

static void attach_metrics(loop *lp)
{
    const stream_cfg *c = lp->st.cfg;
    const char *name = c->job ? c->job
                       : lp->st.job.name[0] ? lp->st.job.name : c->cmd;
    msrv_attach(lp->msrv, lp->s, name);
}

/* Read batches and hand them to the worker, which commits them in the
 * order read while this reads on, up to QUEUED - 1 batches ahead. The
 * worker says when a batch ended the run (commit_one); the reader stops
 * after a batch that ends the inputs or a stop signal. */
static int run_batches(loop *lp)
{
    batch *b;
    for (uint64_t k = 0; (b = free_batch(lp, k)) != NULL; k++) {
        read_batch(lp, b);
        note_lag(lp);
        int last = b->done || b->stop || stream_stop;
        hand_over(lp, k);
        if (!lp->threaded)
            commit_step(lp, b, k);
        if (last)
            break;
        progress(lp, 0);
    }
    if (!lp->threaded)
        settle_owed(lp, 1);
    drain(lp);
    return lp->result;
}

/* The first stop signal asks for a graceful stop; a second one ends
 * idem at once (it is blocked while this runs, and acts on return). */
static void on_stop_signal(int sig)
{
    if (!stream_stop) {
        stream_stop = sig;
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void catch_stop_signals(void)
{
    struct sigaction sa = {.sa_handler = on_stop_signal,
                           .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);  /* one at a time, in the order sent */
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* Say what a stop signal left undone; the exit status it calls for. */
static int report_stop(const loop *lp)
{
    uint64_t k = lp->st.n.released;
    fprintf(stderr, "idem %s: stopped by %s: what was done is committed; "
            "%" PRIu64 " message%s in flight %s left unrun (any claims "
            "on them given back); the same command goes on from there\n",
            lp->st.cfg->cmd, stream_stop == SIGINT ? "SIGINT" : "SIGTERM",
            k, k == 1 ? "" : "s", k == 1 ? "was" : "were");
    return stream_stop == SIGINT ? 130 : 0;
}

/* A stream sink, and the job's checkpoint in it. A stream source's
 * worker (stream, group and consumer) is part of the job's name: two
 * consumers of one group are two jobs, each with its own position in the
 * sink, and so are two pipelines into one sink whose consumers are both
 * named after the host: one checkpoint moved by both would pass over
 * entries one of them wrote and did not commit. */
static int start_sink(loop *lp, const char *keyed, int64_t lease_ms)
{
    const stream_cfg *c = lp->st.cfg;
    int rc;
    sink *k = sink_open(c->cmd, c->to, lease_ms, &rc);
    if (!k)
        return rc;
    if (k->ops->check && (rc = k->ops->check(k, c->batch)) != 0) {
        k->ops->close(k);
        return rc;
    }
    const char *worker = lp->src && lp->src->ops->worker
                             ? lp->src->ops->worker(lp->src) : NULL;
    char name[1200];
    snprintf(name, sizeof name, "%s%s%s", c->job ? c->job : c->to_ident,
             worker ? "#" : "", worker ? worker : "");
    return job_start_sink(&lp->st.job, c->cmd, lp->s, name, &c->ks, keyed,
                          k);
}

/* A stream on the store's own server commits with it, in one script
 * (connect.h's join): its entries, or its acknowledgements, land with
 * the batch's completions, and read-back has no window left to close.
 * Said once (unless --quiet), so that a run shows which way it
 * commits. */
static void join_store(loop *lp)
{
    sink *k = lp->st.job.sink;
    int out = k && k->ops->join && k->ops->join(k, lp->s);
    lp->src_joined = lp->src && lp->src->ops->join &&
                     lp->src->ops->join(lp->src, lp->s);
    const char *acks = !lp->src_joined ? ""
                       : out ? " and the input's acknowledgements"
                             : "the input's acknowledgements";
    if ((out || lp->src_joined) && !lp->st.cfg->quiet)
        fprintf(stderr, "idem %s: one-script commit: the store's records "
                "with %s%s%s\n", lp->st.cfg->cmd,
                out ? "the entries written to " : "",
                out ? k->ops->name(k) : "", acks);
}

/* The bytes of the input files from input `at`, offset off, to their
 * ends, for the progress line; 0 if one is not a regular file. */
static uint64_t input_bytes(const stream_cfg *c, size_t at, uint64_t off)
{
    uint64_t sum = 0;
    struct stat st;
    for (size_t i = at; i < c->ninputs; i++) {
        if (!strcmp(c->inputs[i], "-") || stat(c->inputs[i], &st) ||
            !S_ISREG(st.st_mode))
            return 0;
        sum += (uint64_t)st.st_size;
    }
    return c->ninputs && sum > off ? sum - off : 0;
}

/* The input files as the source, from input `at`, offset off. */
static int open_files(loop *lp, const source_opts *o, size_t at,
                      uint64_t off, uint64_t lineno)
{
    const stream_cfg *c = lp->st.cfg;
    lp->todo = lp->tty ? input_bytes(c, at, off) : 0;
    if (nd_open(&lp->rd, c->inputs, c->ninputs, at, off, lineno))
        return cli_fail(c->cmd, "%s", lp->rd.err);
    if (!(lp->src = source_files(&lp->rd, o)))
        return cli_fail(c->cmd, "out of memory");
    return 0;
}

/* A source that keeps its own position starts where the job's
 * checkpoint says. 0 or 1. */
static int resume_source(loop *lp)
{
    source *src = lp->src;
    const char *pos = lp->st.job.src_pos;
    if (!src || !src->ops->resume || !*pos || !src->ops->resume(src, pos))
        return 0;
    return cli_fail(lp->st.cfg->cmd, "%s", src->ops->err(src));
}

/* The source and the output, streams or files, and where to start.
 * Files into a stream are read from their start: the sink's checkpoint
 * holds no input position, and every key committed before is a
 * duplicate again (as standard input resumes). */
static int open_ends(loop *lp)
{
    const stream_cfg *c = lp->st.cfg;
    const char *keyed = c->line_hash   ? "--line-hash"
                        : c->line_mode ? "--line"
                                       : "--key";
    int64_t lease = c->lease_ms ? c->lease_ms : 30000;
    source_opts o = {c->batch, lease, c->idle_exit_ms, &stream_stop,
                     settle, lp};
    int rc = 0;
    if (c->from && !(lp->src = source_open(c->cmd, c->from, &o, &rc)))
        return rc;
    if (c->from && !c->to)
        join_store(lp);
    if (c->to) {
        rc = start_sink(lp, keyed, lease);
        lp->reread = (!lp->src || lp->src->ops->no_pending) &&
                     lp->st.job.resumed;
        lp->st.job.sink_pinned = lp->reread && lp->src &&
                                 lp->src->ops->in_doubt;
        rc = rc ? rc : resume_source(lp);
        if (!rc)
            join_store(lp);
        return rc || lp->src ? rc : open_files(lp, &o, 0, 0, 0);
    }
    size_t at = 0;
    uint64_t off = 0, lineno = 0;
    rc = job_start(&lp->st.job, c->cmd, lp->s, c->job, &c->ks, keyed,
                   c->output, c->overwrite, c->inputs, c->ninputs, &at, &off,
                   &lineno);
    rc = rc ? rc : resume_source(lp);
    return rc || lp->src ? rc : open_files(lp, &o, at, off, lineno);
}

/* Entries a stream lost (trimmed while pending) are said, not hidden. */
static void report_trimmed(loop *lp)
{
    uint64_t n = lp->src->ops->lost ? lp->src->ops->lost(lp->src) : 0;
    lp->st.n.trimmed += n;
    lp->st.n.skipped += n;
    if (n)
        fprintf(stderr, "idem %s: %" PRIu64 " entr%s of %s had been deleted "
                "from the stream (trimmed) before %s could be processed; "
                "acknowledged and skipped\n", lp->st.cfg->cmd, n,
                n == 1 ? "y" : "ies", "the source",
                n == 1 ? "it" : "they");
}

/* Messages a stream sink wrote otherwise than as they are (said as it
 * wrote them) are not done here: exit status 3. */
static void count_undone(loop *lp)
{
    sink *k = lp->st.job.sink;
    if (k && k->ops->undone)
        lp->st.n.problems += k->ops->undone(k);
}

/* A batch commits through blocks of a few hundred KB that live for one
 * commit (on Redis: the batch's entries as one script argument, hiredis's
 * copy of the command, its output buffer). glibc gives blocks that size
 * mappings of their own, or trims a thread's heap once they are free, so
 * every batch faulted their pages in anew: half the client's CPU with
 * the store on Redis. Blocks up to 4 MB stay in the heap, and up to 32 MB
 * of it stays when free. */
static void keep_batch_memory(void)
{
#if defined(M_MMAP_THRESHOLD) && defined(M_TRIM_THRESHOLD)
    mallopt(M_MMAP_THRESHOLD, 4 << 20);
    mallopt(M_TRIM_THRESHOLD, 32 << 20);
#endif
}

int stream_run(const stream_cfg *c)
{
    keep_batch_memory();
    loop lp = {0};
    lp.rd.fd = -1;
    lp.dl.fd = -1;
    pthread_mutex_init(&lp.q_mu, NULL);
    pthread_cond_init(&lp.q_cv, NULL);
    int rc = start_metrics(&lp, c);
    if (!rc)
        rc = setup(&lp, c);
    if (!rc)
        rc = open_ends(&lp);
    if (!rc)
        attach_metrics(&lp);
    if (!rc) {
        lp.rd.leave_partial = 1;  /* see ndjson.c */
        announce_resume(&lp);
        lp.ran = 1;
        catch_stop_signals();
        start_worker(&lp);
        rc = run_batches(&lp);
        stop_worker(&lp);
        progress(&lp, 1);
        report_trimmed(&lp);
        count_undone(&lp);
        if (!rc && lp.rd.partial_len && !c->quiet)
            fprintf(stderr, "idem %s: %s:%" PRIu64 ": no newline at the "
                    "end: this line is left unread until it has one\n",
                    c->cmd, nd_name(&lp.rd), lp.rd.partial_lineno);
        uint64_t undone = lp.st.n.problems + lp.st.n.gave_up +
                          lp.st.n.dead_letter;
        if (!rc && undone) {
            fprintf(stderr, "idem %s: %" PRIu64 " message%s not done here "
                    "(see above); exit status 3\n", c->cmd, undone,
                    undone == 1 ? " was" : "s were");
            rc = CLI_EXIT_PARTIAL;
        }
        if (lp.stopped) {
            int st = report_stop(&lp);
            rc = rc ? rc : st;
        }
    }
    /* A script reading --stats-json gets its line whatever happened but
     * bad usage: a failed run says why. */
    if (rc != CLI_EXIT_USAGE && (lp.ran || c->stats_json))
        summary(&lp, rc);
    int rc2 = job_end(&lp.st.job);
    msrv_stop(lp.msrv);
    if (lp.s && idem_close(lp.s) && !rc)
        rc = cli_fail(c->cmd, "closing the store failed");
    idem_runner_free(lp.runner);
    nd_close(&lp.rd);
    if (lp.src)
        lp.src->ops->close(lp.src);
    forget_kept(&lp);
    free(lp.kept);
    jk_free(lp.jk);
    jk_path_free(&lp.path);
    idem_bizkey_gen_free(lp.line_hash);
    forget_faults(&lp);
    free(lp.faults);
    free(lp.fault_err);
    dl_close(&lp.dl);
    cli_buf_free(&lp.dl_result);
    pthread_mutex_destroy(&lp.q_mu);
    pthread_cond_destroy(&lp.q_cv);
    for (int i = 0; i < QUEUED; i++) {
        cli_buf_free(&lp.b[i].keys);
        cli_buf_free(&lp.b[i].text);
        free(lp.b[i].items);
        free(lp.b[i].msgs);
        free(lp.b[i].again);
        free(lp.b[i].since);
    }
    return rc ? rc : rc2;
}
