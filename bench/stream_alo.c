/* bench/stream_alo.c - the at-least-once reference of the Streams
 * benchmark: what a consumer of a Redis Stream writes by hand when it
 * copies entries from one stream to another with no idempotency at all.
 *
 * usage: stream_alo PORT IN GROUP OUT BATCH [DEDUP]
 *
 * One connection to 127.0.0.1:PORT. The group GROUP of stream IN is made
 * if missing (from ID 0), then, until a read finds nothing new for 500 ms
 * (as `idem dedup --idle-exit 500ms`):
 *
 *   XREADGROUP GROUP GROUP alo COUNT BATCH BLOCK 500 STREAMS IN >
 *   XADD OUT * FIELDS...        one per entry, fields unchanged, pipelined
 *   XACK IN GROUP ID...         the batch, once every XADD has answered
 *
 * The acknowledgement waits for the XADD replies, as any at-least-once
 * consumer must: an entry is acknowledged only once its copy is written,
 * so a crash leaves it pending and it is copied again (a duplicate in
 * OUT, which is what idem removes). One process, one thread, one round
 * trip for the read, one for the batch of XADDs, one for the XACK.
 *
 * Prints system=stream-alo entries=N batches=B seconds=S
 * entries_per_sec=R, where S runs from the first read to the last XACK
 * (the final 500 ms wait not included); bench/streams.sh times the
 * process from outside as it times idem, so its ratios do not use S.
 *
 * DEDUP turns the same loop into the least any dedup on the same Redis
 * can do, the floor a store on that server is measured against (README,
 * #12): each entry's key (its field event_id) recorded as done with a
 * TTL, the entry copied only if its key was new, the batch acknowledged
 * and a checkpoint (the batch's last ID) written. No leases, no
 * attempts, no tokens, no responses: a key is done or absent, which is
 * all dedup needs of a record. The ways, from one connection each:
 *
 *   set    one script per batch: per entry SET PREFIX+KEY ID NX PX TTL
 *          (a plain string with its TTL) and, if it was set, XADD; then
 *          XACK the batch and SET the checkpoint. Atomic: no window.
 *   day    the same script with each key a field of one hash per day
 *          (HMGET of the batch's keys, one HSET of the new ones, the
 *          hash's TTL raised once a batch), the store's `day` layout
 *          reduced to its write.
 *   multi  the XADDs sent by the client: WATCH and MGET the batch's keys
 *          (one round trip), then MULTI, SET PX and XADD for each new
 *          key, XACK, the checkpoint, EXEC (a second). Atomic too: a
 *          key written meanwhile by another consumer fails the EXEC and
 *          the batch is tried again.
 *   day-multi  multi with the keys recorded as day does: WATCH the
 *          day's hash and HMGET the keys, then in the MULTI one HSET of
 *          the new ones (another consumer's write to the day fails the
 *          EXEC, so under contention batches are tried again).
 *   rb     the script records the keys and answers which were new; the
 *          client XADDs those, then XACKs and writes the checkpoint in
 *          the same pipeline. Not atomic: after a crash between the two,
 *          a key recorded (with its entry's ID as its value) but not
 *          copied must be looked for in OUT past the checkpoint (the
 *          read-back of docs/streams.md; this floor measures the normal
 *          path only, without that recovery).
 *   day-rb rb with the keys recorded as day does.
 *
 * Duplicates inside one batch are decided in order (the first
 * occurrence is copied), as idem does. An entry without the key field,
 * or trimmed while pending, stops a deduplicating run with an error:
 * the benchmark's input has neither, and a floor need not say what to
 * do with them. */
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_MS "500"
#define KEY_FIELD "event_id"
#define PREFIX "b:f:"    /* bench/streams.sh removes b:* between runs */
#define DAY_BUCKET "b:fd:day"
#define CHECKPOINT "b:fc:"
#define TTL_MS "86400000"

enum dedup { NONE, SET, DAY, MULTI, DAY_MULTI, RB, DAY_RB };
static const char *const dedup_name[] = {"",   "set",       "day",   "multi",
                                        "day-multi", "rb", "day-rb"};

/* One script for set, day, rb and day-rb. KEYS: IN OUT CHECKPOINT
 * BUCKET; ARGV: GROUP TTL PREFIX DAY(0/1) COPY(0/1) N, then per entry ID
 * KEY NF and its NF field names and values. The keys are recorded first:
 * a SET NX each, or for the day layout the whole batch in two calls (one
 * HMGET, one HSET of the new ones; a key met twice in the batch is new
 * once), because each redis.call costs the script more than the
 * command's own work. With COPY 1 it then copies the new entries,
 * acknowledges, checkpoints and answers N; with COPY 0 (rb) it only
 * answers 1 or 0 per entry. */
static const char floor_lua[] =
    "local day, copy, n = ARGV[4] == '1', ARGV[5] == '1', tonumber(ARGV[6])\n"
    "local ids, ks, at, new, i = {}, {}, {}, {}, 7\n"
    "for e = 1, n do\n"
    "  ids[e], ks[e], at[e] = ARGV[i], ARGV[i + 1], i\n"
    "  i = i + 3 + tonumber(ARGV[i + 2])\n"
    "end\n"
    "if day then\n"
    "  local v, seen, hs = redis.call('HMGET', KEYS[4], unpack(ks)), {}, {}\n"
    "  for e = 1, n do\n"
    "    new[e] = not v[e] and not seen[ks[e]]\n"
    "    if new[e] then\n"
    "      seen[ks[e]] = true\n"
    "      hs[#hs + 1], hs[#hs + 2] = ks[e], ids[e]\n"
    "    end\n"
    "  end\n"
    "  if #hs > 0 then redis.call('HSET', KEYS[4], unpack(hs)) end\n"
    "  redis.call('PEXPIRE', KEYS[4], ARGV[2])\n"
    "else\n"
    "  for e = 1, n do\n"
    "    new[e] = redis.call('SET', ARGV[3] .. ks[e], ids[e], 'NX', 'PX',\n"
    "      ARGV[2]) ~= false\n"
    "  end\n"
    "end\n"
    "local flags = {}\n"
    "for e = 1, n do\n"
    "  flags[e] = new[e] and 1 or 0\n"
    "  if new[e] and copy then\n"
    "    local j = at[e]\n"
    "    redis.call('XADD', KEYS[2], '*',\n"
    "      unpack(ARGV, j + 3, j + 2 + tonumber(ARGV[j + 2])))\n"
    "  end\n"
    "end\n"
    "if not copy then return flags end\n"
    "redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))\n"
    "redis.call('SET', KEYS[3], ids[n])\n"
    "return n\n";

/* The run: its connection, names, and room for one command's arguments
 * (the larger of an entry's XADD and the batch's XACK). */
typedef struct alo {
    redisContext *c;
    const char *in, *group, *out, *count;
    const char **argv;
    size_t *lens, room;
    uint64_t entries, batches;
    enum dedup dedup;
    char sha[41];        /* floor_lua's, once loaded */
    char ckpt[128];      /* CHECKPOINT + GROUP */
    unsigned char *fresh; /* per entry of the batch: copy it */
} alo;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int die(const alo *a, const char *what, const redisReply *r)
{
    fprintf(stderr, "stream_alo: %s: %s\n", what,
            r && r->type == REDIS_REPLY_ERROR ? r->str
            : a->c->err                       ? a->c->errstr
                                              : "unexpected reply");
    return 1;
}

/* XGROUP CREATE IN GROUP 0 MKSTREAM; an existing group is fine. */
static int make_group(const alo *a)
{
    redisReply *r = redisCommand(a->c, "XGROUP CREATE %s %s 0 MKSTREAM",
                                 a->in, a->group);
    int bad = !r || (r->type == REDIS_REPLY_ERROR &&
                     strncmp(r->str, "BUSYGROUP", 9));
    if (bad)
        die(a, "XGROUP CREATE", r);
    freeReplyObject(r);
    return bad;
}

/* The value of entry fields f's KEY_FIELD, or NULL. */
static const redisReply *key_of(const redisReply *f)
{
    for (size_t i = 0; i + 1 < f->elements; i += 2)
        if (f->element[i]->len == sizeof KEY_FIELD - 1 &&
            !memcmp(f->element[i]->str, KEY_FIELD, sizeof KEY_FIELD - 1))
            return f->element[i + 1];
    return NULL;
}

/* Room for `need` arguments of one command; 0, or 1 out of memory. */
static int room_for(alo *a, size_t need)
{
    if (need <= a->room)
        return 0;
    const char **v = realloc(a->argv, need * sizeof *v);
    if (v)
        a->argv = v;
    size_t *l = v ? realloc(a->lens, need * sizeof *l) : NULL;
    if (l)
        a->lens = l, a->room = need;
    return !l;
}

static void arg(alo *a, int *n, const char *s, size_t len)
{
    a->argv[*n] = s, a->lens[(*n)++] = len;
}

static void arg_str(alo *a, int *n, const char *s)
{
    arg(a, n, s, strlen(s));
}

/* Queue XADD OUT * with the fields of entry e ([id, [f, v, ...]]): 1
 * queued, 0 nothing to copy (trimmed while pending), -1 an error. */
static int queue_copy(alo *a, const redisReply *e)
{
    const redisReply *f = e->element[1];
    if (f->type != REDIS_REPLY_ARRAY)
        return 0;
    int n = 0;
    arg_str(a, &n, "XADD"), arg_str(a, &n, a->out), arg_str(a, &n, "*");
    for (size_t i = 0; i < f->elements; i++)
        arg(a, &n, f->element[i]->str, f->element[i]->len);
    return redisAppendCommandArgv(a->c, n, a->argv, a->lens) == REDIS_OK
               ? 1 : -1;
}

/* Queue the XADDs of the batch's entries (only the fresh ones when
 * deduplicating); how many, or -1. */
static long queue_copies(alo *a, const redisReply *entries)
{
    long queued = 0;
    for (size_t i = 0; i < entries->elements; i++) {
        if (a->dedup != NONE && !a->fresh[i])
            continue;
        int rc = queue_copy(a, entries->element[i]);
        if (rc < 0)
            return -1;
        queued += rc;
    }
    return queued;
}

/* Read the replies of `queued` commands, none of which may fail; 0, or
 * 1 after saying why. */
static int check_replies(const alo *a, size_t queued, const char *what)
{
    for (size_t i = 0; i < queued; i++) {
        void *rv = NULL;
        if (redisGetReply(a->c, &rv) != REDIS_OK)
            return die(a, what, NULL);
        redisReply *r = rv;
        int bad = r->type == REDIS_REPLY_ERROR;
        if (bad)
            die(a, what, r);
        freeReplyObject(r);
        if (bad)
            return 1;
    }
    return 0;
}

/* Queue XACK IN GROUP with the IDs of the entries, and with dedup the
 * checkpoint SET after it; how many commands, or -1. */
static int queue_ack(alo *a, const redisReply *entries)
{
    int n = 0;
    arg_str(a, &n, "XACK"), arg_str(a, &n, a->in), arg_str(a, &n, a->group);
    for (size_t i = 0; i < entries->elements; i++) {
        const redisReply *id = entries->element[i]->element[0];
        arg(a, &n, id->str, id->len);
    }
    if (redisAppendCommandArgv(a->c, n, a->argv, a->lens) != REDIS_OK)
        return -1;
    if (a->dedup == NONE)
        return 1;
    const redisReply *last = entries->element[entries->elements - 1];
    n = 0;
    arg_str(a, &n, "SET"), arg_str(a, &n, a->ckpt);
    arg(a, &n, last->element[0]->str, last->element[0]->len);
    return redisAppendCommandArgv(a->c, n, a->argv, a->lens) == REDIS_OK
               ? 2 : -1;
}

/* The batch's keys: each entry's PREFIX + key in one buffer. */
typedef struct keys {
    char *buf;
    size_t cap, *at, *len, n;
} keys;
static keys K;

static int collect_keys(const redisReply *entries)
{
    size_t need = 0, n = entries->elements;
    for (size_t i = 0; i < n; i++)
        need += sizeof PREFIX + key_of(entries->element[i]->element[1])->len;
    if (need > K.cap) {
        char *b = realloc(K.buf, need);
        if (!b)
            return 1;
        K.buf = b, K.cap = need;
    }
    if (n > K.n) {
        size_t *at = realloc(K.at, n * sizeof *at);
        if (at)
            K.at = at;
        size_t *len = at ? realloc(K.len, n * sizeof *len) : NULL;
        if (!len)
            return 1;
        K.len = len, K.n = n;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const redisReply *k = key_of(entries->element[i]->element[1]);
        K.at[i] = off, K.len[i] = sizeof PREFIX - 1 + k->len;
        memcpy(K.buf + off, PREFIX, sizeof PREFIX - 1);
        memcpy(K.buf + off + sizeof PREFIX - 1, k->str, k->len);
        off += K.len[i];
    }
    return 0;
}

/* The batch's entry order sorted by key, ties by position: marks each
 * key's later occurrences in the batch not fresh. */
static int by_key(const void *x, const void *y)
{
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    size_t l = K.len[i] < K.len[j] ? K.len[i] : K.len[j];
    int c = memcmp(K.buf + K.at[i], K.buf + K.at[j], l);
    if (c || K.len[i] != K.len[j])
        return c ? c : K.len[i] < K.len[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

static int same_key(size_t i, size_t j)
{
    return K.len[i] == K.len[j] &&
           !memcmp(K.buf + K.at[i], K.buf + K.at[j], K.len[i]);
}

static int first_in_batch(alo *a, size_t n)
{
    size_t *ord = malloc(n * sizeof *ord);
    if (!ord)
        return 1;
    for (size_t i = 0; i < n; i++)
        ord[i] = i;
    qsort(ord, n, sizeof *ord, by_key);
    for (size_t i = 1; i < n; i++)
        if (same_key(ord[i - 1], ord[i]))
            a->fresh[ord[i]] = 0;
    free(ord);
    return 0;
}

/* The batch's key i as multi (PREFIX + key) or day-multi (the key, a
 * field of DAY_BUCKET) names it. */
static void arg_key(alo *a, int *n, size_t i)
{
    size_t skip = a->dedup == DAY_MULTI ? sizeof PREFIX - 1 : 0;
    arg(a, n, K.buf + K.at[i] + skip, K.len[i] - skip);
}

/* multi, day-multi: WATCH what the batch's keys are recorded in and
 * read them, in one round trip; marks the new ones fresh. 0 or 1. */
static int watch_keys(alo *a, size_t n)
{
    int day = a->dedup == DAY_MULTI, m = 0;
    arg_str(a, &m, "WATCH");
    if (day)
        arg_str(a, &m, DAY_BUCKET);
    for (size_t i = 0; !day && i < n; i++)
        arg_key(a, &m, i);
    redisAppendCommandArgv(a->c, m, a->argv, a->lens);
    m = 0;
    arg_str(a, &m, day ? "HMGET" : "MGET");
    if (day)
        arg_str(a, &m, DAY_BUCKET);
    for (size_t i = 0; i < n; i++)
        arg_key(a, &m, i);
    redisAppendCommandArgv(a->c, m, a->argv, a->lens);
    void *rv = NULL;
    if (check_replies(a, 1, "WATCH") || redisGetReply(a->c, &rv) != REDIS_OK)
        return die(a, "MGET", NULL);
    redisReply *r = rv;
    int bad = r->type != REDIS_REPLY_ARRAY || r->elements != n;
    for (size_t i = 0; !bad && i < n; i++)
        a->fresh[i] = r->element[i]->type == REDIS_REPLY_NIL;
    freeReplyObject(r);
    if (bad || first_in_batch(a, n))
        return die(a, "MGET", NULL);
    return 0;
}

/* Queue the records of the fresh keys: a SET PX each, or one HSET of
 * them all and the bucket's PEXPIRE. How many commands. */
static size_t queue_records(alo *a, const redisReply *entries)
{
    int day = a->dedup == DAY_MULTI, m = 0;
    size_t queued = 0;
    if (day)
        arg_str(a, &m, "HSET"), arg_str(a, &m, DAY_BUCKET);
    for (size_t i = 0; i < entries->elements; i++) {
        if (!a->fresh[i])
            continue;
        const redisReply *id = entries->element[i]->element[0];
        if (!day)
            m = 0, arg_str(a, &m, "SET");
        arg_key(a, &m, i), arg(a, &m, id->str, id->len);
        if (day)
            continue;
        arg_str(a, &m, "PX"), arg_str(a, &m, TTL_MS);
        redisAppendCommandArgv(a->c, m, a->argv, a->lens);
        queued++;
    }
    if (day && m > 2) {
        redisAppendCommandArgv(a->c, m, a->argv, a->lens);
        redisAppendCommand(a->c, "PEXPIRE %s %s", DAY_BUCKET, TTL_MS);
        queued += 2;
    }
    return queued;
}

/* multi, day-multi: one batch; 0 done, 1 an error, -1 a watched key
 * changed (the EXEC did nothing: try the batch again). */
static int multi_batch(alo *a, const redisReply *entries)
{
    if (watch_keys(a, entries->elements))
        return 1;
    redisAppendCommand(a->c, "MULTI");
    size_t records = queue_records(a, entries);
    long q = queue_copies(a, entries);
    int acks = queue_ack(a, entries);
    void *rv = NULL;
    if (q < 0 || acks < 0 || redisAppendCommand(a->c, "EXEC") != REDIS_OK ||
        check_replies(a, 1 + records + (size_t)q + (size_t)acks, "MULTI") ||
        redisGetReply(a->c, &rv) != REDIS_OK)
        return die(a, "EXEC", NULL);
    redisReply *r = rv;
    int rc = r->type == REDIS_REPLY_NIL ? -1 : r->type != REDIS_REPLY_ARRAY;
    for (size_t i = 0; rc == 0 && i < r->elements; i++)
        rc = r->element[i]->type == REDIS_REPLY_ERROR;
    if (rc > 0)
        die(a, "EXEC", r);
    freeReplyObject(r);
    return rc;
}

/* The script records the keys, the client copies the entries. */
static int rb(const alo *a)
{
    return a->dedup == RB || a->dedup == DAY_RB;
}

/* set, day, rb, day-rb: the batch through floor_lua; 0 or 1. */
static int script_batch(alo *a, const redisReply *entries)
{
    size_t n = entries->elements;
    char (*nf)[8] = malloc((n + 1) * sizeof *nf);
    if (!nf)
        return die(a, "out of memory", NULL);
    int m = 0;
    arg_str(a, &m, "EVALSHA"), arg_str(a, &m, a->sha), arg_str(a, &m, "4");
    arg_str(a, &m, a->in), arg_str(a, &m, a->out), arg_str(a, &m, a->ckpt);
    arg_str(a, &m, DAY_BUCKET), arg_str(a, &m, a->group);
    arg_str(a, &m, TTL_MS), arg_str(a, &m, PREFIX);
    arg_str(a, &m, a->dedup == DAY || a->dedup == DAY_RB ? "1" : "0");
    arg_str(a, &m, rb(a) ? "0" : "1");
    snprintf(nf[n], sizeof nf[n], "%zu", n);
    arg_str(a, &m, nf[n]);
    for (size_t i = 0; i < n; i++) {
        const redisReply *e = entries->element[i], *f = e->element[1];
        arg(a, &m, e->element[0]->str, e->element[0]->len);
        arg(a, &m, K.buf + K.at[i] + sizeof PREFIX - 1,
            K.len[i] - (sizeof PREFIX - 1));
        /* rb copies from the client: the fields stay there */
        size_t fields = rb(a) ? 0 : f->elements;
        snprintf(nf[i], sizeof nf[i], "%zu", fields);
        arg_str(a, &m, nf[i]);
        for (size_t j = 0; j < fields; j++)
            arg(a, &m, f->element[j]->str, f->element[j]->len);
    }
    redisReply *r = redisCommandArgv(a->c, m, a->argv, a->lens);
    free(nf);
    int bad = !r || (rb(a) ? r->type != REDIS_REPLY_ARRAY ||
                                          r->elements != n
                                    : r->type != REDIS_REPLY_INTEGER);
    for (size_t i = 0; !bad && rb(a) && i < n; i++)
        a->fresh[i] = r->element[i]->integer == 1;
    if (bad)
        die(a, "EVALSHA", r);
    freeReplyObject(r);
    if (bad || !rb(a))
        return bad;
    long q = queue_copies(a, entries);
    if (q < 0 || check_replies(a, (size_t)q, "XADD"))
        return 1;
    int acks = queue_ack(a, entries);
    return acks < 0 || check_replies(a, (size_t)acks, "XACK");
}

/* Room for the batch's largest command, or 0 if an entry is not a
 * stream entry (or, deduplicating, has no key field). */
static size_t batch_room(const alo *a, const redisReply *entries)
{
    size_t need = 16 + entries->elements;
    for (size_t i = 0; i < entries->elements; i++) {
        const redisReply *e = entries->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
            e->element[0]->type != REDIS_REPLY_STRING)
            return 0;
        const redisReply *f = e->element[1];
        if (f->type != REDIS_REPLY_ARRAY) {
            if (a->dedup != NONE)
                return 0;
            continue;
        }
        if (a->dedup != NONE && !key_of(f))
            return 0;
        need += 3 + f->elements;
    }
    return need;
}

/* Copy one batch of entries, then acknowledge it; 0 or 1. */
static int copy_batch(alo *a, const redisReply *entries)
{
    size_t need = batch_room(a, entries);
    if (!need)
        return die(a, "an entry that is not a stream entry with "
                      KEY_FIELD, NULL);
    if (!entries->elements)
        return 0;
    if (room_for(a, need))
        return die(a, "out of memory", NULL);
    a->entries += entries->elements;
    a->batches++;
    if (a->dedup == NONE) {
        long q = queue_copies(a, entries);
        int acks = q < 0 ? -1 : check_replies(a, (size_t)q, "XADD")
                                   ? -1 : queue_ack(a, entries);
        return acks < 0 || check_replies(a, (size_t)acks, "XACK");
    }
    memset(a->fresh, 1, entries->elements);
    if (collect_keys(entries))
        return die(a, "out of memory", NULL);
    if (a->dedup != MULTI && a->dedup != DAY_MULTI)
        return script_batch(a, entries);
    int rc;
    while ((rc = multi_batch(a, entries)) < 0)
        ;
    return rc;
}

/* The entries array of an XREADGROUP reply, NULL if it is not one. */
static const redisReply *entries_of(const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 1 ||
        r->element[0]->type != REDIS_REPLY_ARRAY ||
        r->element[0]->elements != 2 ||
        r->element[0]->element[1]->type != REDIS_REPLY_ARRAY)
        return NULL;
    return r->element[0]->element[1];
}

/* One round: read a batch, copy it, acknowledge it. 0 a batch done, 1
 * an error, -1 nothing new for IDLE_MS. */
static int round_trip(alo *a)
{
    redisReply *r = redisCommand(a->c, "XREADGROUP GROUP %s alo COUNT %s "
                                 "BLOCK " IDLE_MS " STREAMS %s >",
                                 a->group, a->count, a->in);
    const redisReply *e = r ? entries_of(r) : NULL;
    int rc = r && r->type == REDIS_REPLY_NIL ? -1
             : e                             ? copy_batch(a, e)
                                             : die(a, "XREADGROUP", r);
    freeReplyObject(r);
    return rc;
}

/* DEDUP's name to its mode (-1 unknown); with a script, load it. */
static int setup_dedup(alo *a, const char *name, size_t batch)
{
    int d = NONE;
    while (d <= DAY_RB && strcmp(dedup_name[d], name))
        d++;
    if (d > DAY_RB)
        return -1;
    a->dedup = (enum dedup)d;
    snprintf(a->ckpt, sizeof a->ckpt, CHECKPOINT "%s", a->group);
    a->fresh = malloc(batch);
    if (!a->fresh)
        return 1;
    if (d == NONE || d == MULTI || d == DAY_MULTI)
        return 0;
    redisReply *r = redisCommand(a->c, "SCRIPT LOAD %s", floor_lua);
    int bad = !r || r->type != REDIS_REPLY_STRING || r->len != 40;
    if (bad)
        die(a, "SCRIPT LOAD", r);
    else
        memcpy(a->sha, r->str, 41);
    freeReplyObject(r);
    return bad;
}

int main(int argc, char **argv)
{
    if ((argc != 6 && argc != 7) || !strtoul(argv[5], NULL, 10)) {
        fputs("usage: stream_alo PORT IN GROUP OUT BATCH "
              "[set|day|multi|day-multi|rb|day-rb]\n", stderr);
        return 2;
    }
    size_t batch = strtoul(argv[5], NULL, 10);
    alo a = {.in = argv[2], .group = argv[3], .out = argv[4],
             .count = argv[5], .room = 64};
    a.c = redisConnect("127.0.0.1", (int)strtol(argv[1], NULL, 10));
    if (!a.c || a.c->err) {
        fprintf(stderr, "stream_alo: connect: %s\n",
                a.c ? a.c->errstr : "out of memory");
        return 1;
    }
    a.argv = malloc(a.room * sizeof *a.argv);
    a.lens = malloc(a.room * sizeof *a.lens);
    int rc = !a.argv || !a.lens ||
             setup_dedup(&a, argc == 7 ? argv[6] : "", batch) ||
             make_group(&a);
    double t0 = now_s(), t1 = t0;
    while (!rc && (rc = round_trip(&a)) == 0)
        t1 = now_s();
    if (rc < 0)
        printf("system=stream-%s%s entries=%" PRIu64 " batches=%" PRIu64
               " seconds=%.3f entries_per_sec=%.0f\n",
               a.dedup ? "floor-" : "alo", dedup_name[a.dedup], a.entries,
               a.batches, t1 - t0,
               t1 > t0 ? (double)a.entries / (t1 - t0) : 0);
    free(a.argv);
    free(a.lens);
    free(a.fresh);
    free(K.buf), free(K.at), free(K.len);
    redisFree(a.c);
    return rc > 0;
}
