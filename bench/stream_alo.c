/* bench/stream_alo.c - the at-least-once reference of the Streams
 * benchmark: what a consumer of a Redis Stream writes by hand when it
 * copies entries from one stream to another with no idempotency at all.
 *
 * usage: stream_alo PORT IN GROUP OUT BATCH
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
 * process from outside as it times idem, so its ratios do not use S. */
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_MS "500"

/* The run: its connection, names, and room for one command's arguments
 * (the larger of an entry's XADD and the batch's XACK). */
typedef struct alo {
    redisContext *c;
    const char *in, *group, *out, *count;
    const char **argv;
    size_t *lens, room;
    uint64_t entries, batches;
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

/* Queue XADD OUT * with the fields of entry e ([id, [f, v, ...]]): 1
 * queued, 0 nothing to copy (trimmed while pending), -1 an error. */
static int queue_copy(alo *a, const redisReply *e)
{
    const redisReply *f = e->element[1];
    if (f->type != REDIS_REPLY_ARRAY)
        return 0;
    int n = 0;
    a->argv[n] = "XADD", a->lens[n++] = 4;
    a->argv[n] = a->out, a->lens[n++] = strlen(a->out);
    a->argv[n] = "*", a->lens[n++] = 1;
    for (size_t i = 0; i < f->elements; i++)
        a->argv[n] = f->element[i]->str, a->lens[n++] = f->element[i]->len;
    return redisAppendCommandArgv(a->c, n, a->argv, a->lens) == REDIS_OK
               ? 1 : -1;
}

/* Read the replies of `queued` XADDs; 0, or 1 after saying why. */
static int check_copies(const alo *a, size_t queued)
{
    for (size_t i = 0; i < queued; i++) {
        void *rv = NULL;
        if (redisGetReply(a->c, &rv) != REDIS_OK)
            return die(a, "XADD", NULL);
        redisReply *r = rv;
        int bad = r->type != REDIS_REPLY_STRING;
        if (bad)
            die(a, "XADD", r);
        freeReplyObject(r);
        if (bad)
            return 1;
    }
    return 0;
}

/* XACK IN GROUP with the IDs of the entries; 0 or 1. */
static int ack(alo *a, const redisReply *entries)
{
    int n = 0;
    a->argv[n] = "XACK", a->lens[n++] = 4;
    a->argv[n] = a->in, a->lens[n++] = strlen(a->in);
    a->argv[n] = a->group, a->lens[n++] = strlen(a->group);
    for (size_t i = 0; i < entries->elements; i++) {
        const redisReply *id = entries->element[i]->element[0];
        a->argv[n] = id->str, a->lens[n++] = id->len;
    }
    redisReply *r = redisCommandArgv(a->c, n, a->argv, a->lens);
    int bad = !r || r->type != REDIS_REPLY_INTEGER;
    if (bad)
        die(a, "XACK", r);
    freeReplyObject(r);
    return bad;
}

/* Copy one batch of entries, then acknowledge it; 0 or 1. */
static int copy_batch(alo *a, const redisReply *entries)
{
    size_t queued = 0;
    for (size_t i = 0; i < entries->elements; i++) {
        const redisReply *e = entries->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
            e->element[0]->type != REDIS_REPLY_STRING ||
            (e->element[1]->type == REDIS_REPLY_ARRAY &&
             e->element[1]->elements + 3 > a->room))
            return die(a, "an entry that is not a stream entry's", NULL);
        int rc = queue_copy(a, e);
        if (rc < 0)
            return die(a, "XADD", NULL);
        queued += (size_t)rc;
    }
    a->entries += entries->elements;
    a->batches++;
    return check_copies(a, queued) || ack(a, entries);
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

int main(int argc, char **argv)
{
    if (argc != 6 || !strtoul(argv[5], NULL, 10)) {
        fputs("usage: stream_alo PORT IN GROUP OUT BATCH\n", stderr);
        return 2;
    }
    size_t batch = strtoul(argv[5], NULL, 10);
    alo a = {.in = argv[2], .group = argv[3], .out = argv[4],
             .count = argv[5], .room = (batch > 64 ? batch : 64) + 3};
    a.c = redisConnect("127.0.0.1", (int)strtol(argv[1], NULL, 10));
    if (!a.c || a.c->err) {
        fprintf(stderr, "stream_alo: connect: %s\n",
                a.c ? a.c->errstr : "out of memory");
        return 1;
    }
    a.argv = malloc(a.room * sizeof *a.argv);
    a.lens = malloc(a.room * sizeof *a.lens);
    int rc = !a.argv || !a.lens || make_group(&a);
    double t0 = now_s(), t1 = t0;
    while (!rc && (rc = round_trip(&a)) == 0)
        t1 = now_s();
    if (rc < 0)
        printf("system=stream-alo entries=%" PRIu64 " batches=%" PRIu64
               " seconds=%.3f entries_per_sec=%.0f\n", a.entries,
               a.batches, t1 - t0,
               t1 > t0 ? (double)a.entries / (t1 - t0) : 0);
    free(a.argv);
    free(a.lens);
    redisFree(a.c);
    return rc > 0;
}
