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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int die(redisContext *c, const char *what, const redisReply *r)
{
    fprintf(stderr, "stream_alo: %s: %s\n", what,
            r && r->type == REDIS_REPLY_ERROR ? r->str
            : c->err                          ? c->errstr
                                              : "unexpected reply");
    return 1;
}

/* XGROUP CREATE IN GROUP 0 MKSTREAM; an existing group is fine. */
static int make_group(redisContext *c, const char *in, const char *group)
{
    redisReply *r = redisCommand(c, "XGROUP CREATE %s %s 0 MKSTREAM", in,
                                 group);
    int bad = !r || (r->type == REDIS_REPLY_ERROR &&
                     strncmp(r->str, "BUSYGROUP", 9));
    if (bad)
        die(c, "XGROUP CREATE", r);
    freeReplyObject(r);
    return bad;
}

/* Queue XADD OUT * with the fields of entry e ([id, [f, v, ...]]). */
static int queue_copy(redisContext *c, const char *out, const redisReply *e,
                      const char **argv, size_t *lens)
{
    const redisReply *f = e->element[1];
    if (f->type != REDIS_REPLY_ARRAY)
        return 0;  /* trimmed while pending: nothing to copy */
    int n = 0;
    argv[n] = "XADD", lens[n++] = 4;
    argv[n] = out, lens[n++] = strlen(out);
    argv[n] = "*", lens[n++] = 1;
    for (size_t i = 0; i < f->elements; i++)
        argv[n] = f->element[i]->str, lens[n++] = f->element[i]->len;
    return redisAppendCommandArgv(c, n, argv, lens) == REDIS_OK ? 1 : -1;
}

/* Read the replies of `queued` XADDs; 0, or 1 after saying why. */
static int check_copies(redisContext *c, size_t queued)
{
    for (size_t i = 0; i < queued; i++) {
        void *rv = NULL;
        if (redisGetReply(c, &rv) != REDIS_OK)
            return die(c, "XADD", NULL);
        redisReply *r = rv;
        int bad = r->type != REDIS_REPLY_STRING;
        if (bad)
            die(c, "XADD", r);
        freeReplyObject(r);
        if (bad)
            return 1;
    }
    return 0;
}

/* XACK IN GROUP with the IDs of the entries; 0 or 1. */
static int ack(redisContext *c, const char *in, const char *group,
               const redisReply *entries, const char **argv, size_t *lens)
{
    int n = 0;
    argv[n] = "XACK", lens[n++] = 4;
    argv[n] = in, lens[n++] = strlen(in);
    argv[n] = group, lens[n++] = strlen(group);
    for (size_t i = 0; i < entries->elements; i++) {
        const redisReply *id = entries->element[i]->element[0];
        argv[n] = id->str, lens[n++] = id->len;
    }
    redisReply *r = redisCommandArgv(c, n, argv, lens);
    int bad = !r || r->type != REDIS_REPLY_INTEGER;
    if (bad)
        die(c, "XACK", r);
    freeReplyObject(r);
    return bad;
}

/* Copy one batch of entries and acknowledge it; 0 or 1. argv and lens
 * hold room for the larger of an entry's XADD and the batch's XACK. */
static int copy_batch(redisContext *c, const char *in, const char *group,
                      const char *out, const redisReply *entries,
                      const char **argv, size_t *lens, size_t room)
{
    size_t queued = 0;
    for (size_t i = 0; i < entries->elements; i++) {
        const redisReply *e = entries->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
            (e->element[1]->type == REDIS_REPLY_ARRAY &&
             e->element[1]->elements + 3 > room))
            return die(c, "an entry that is not a stream entry's", NULL);
        int rc = queue_copy(c, out, e, argv, lens);
        if (rc < 0)
            return die(c, "XADD", NULL);
        queued += (size_t)rc;
    }
    return check_copies(c, queued) ||
           ack(c, in, group, entries, argv, lens);
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fputs("usage: stream_alo PORT IN GROUP OUT BATCH\n", stderr);
        return 2;
    }
    const char *in = argv[2], *group = argv[3], *out = argv[4];
    size_t batch = strtoul(argv[5], NULL, 10);
    redisContext *c = redisConnect("127.0.0.1", (int)strtol(argv[1], NULL,
                                                             10));
    if (!c || c->err) {
        fprintf(stderr, "stream_alo: connect: %s\n",
                c ? c->errstr : "out of memory");
        return 1;
    }
    size_t room = (batch > 64 ? batch : 64) + 3;
    const char **av = malloc(room * sizeof *av);
    size_t *lens = malloc(room * sizeof *lens);
    int rc = !av || !lens || !batch || make_group(c, in, group);
    uint64_t entries = 0, batches = 0;
    double t0 = now_s(), t1 = t0;
    while (!rc) {
        redisReply *r = redisCommand(c, "XREADGROUP GROUP %s alo COUNT %s "
                                     "BLOCK " IDLE_MS " STREAMS %s >",
                                     group, argv[5], in);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            rc = die(c, "XREADGROUP", r);
        } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 1) {
            const redisReply *e = r->element[0]->element[1];
            rc = copy_batch(c, in, group, out, e, av, lens, room);
            entries += e->elements;
            batches++;
            t1 = now_s();
        } else {
            freeReplyObject(r);
            break;  /* nothing new for IDLE_MS */
        }
        freeReplyObject(r);
    }
    if (!rc)
        printf("system=stream-alo entries=%" PRIu64 " batches=%" PRIu64
               " seconds=%.3f entries_per_sec=%.0f\n", entries, batches,
               t1 - t0, t1 > t0 ? (double)entries / (t1 - t0) : 0);
    free(av);
    free(lens);
    redisFree(c);
    return rc;
}
