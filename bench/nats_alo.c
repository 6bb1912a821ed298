/* bench/nats_alo.c - the at-least-once reference of the NATS benchmark,
 * and its loader.
 *
 * usage: nats_alo stream PORT NAME SUBJECT
 *        nats_alo load PORT SUBJECT        < events.ndjson
 *        nats_alo copy PORT STREAM DURABLE SUBJECT BATCH
 *
 *        nats_alo count PORT STREAM
 *
 * stream makes the stream NAME of SUBJECT (file storage, defaults);
 * count prints how many messages STREAM holds.
 * load publishes each line of standard input as one JetStream message
 * to SUBJECT (asynchronously, all PubAcks awaited at the end), with
 * Nats-Msg-Id its line number: the input of bench/nats.sh.
 *
 * copy is what a consumer of a JetStream stream writes by hand when it
 * copies messages to another subject with no idempotency at all: a
 * durable pull consumer DURABLE (made if missing, explicit acks), then,
 * until a fetch finds nothing for 500 ms (as `idem dedup --idle-exit
 * 500ms`):
 *
 *   fetch up to BATCH messages
 *   publish each to SUBJECT, data and headers unchanged, asynchronously
 *   wait for every PubAck of the batch
 *   ack each message, and flush the connection
 *
 * An ack waits for the copy's PubAck, as any at-least-once consumer must:
 * a crash leaves the message unacknowledged and it is copied again (a
 * duplicate, which is what idem removes). bench/nats.sh times the
 * process from outside as it times idem. */
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int die(const char *what, natsStatus s)
{
    const char *t = nats_GetLastError(NULL);
    fprintf(stderr, "nats_alo: %s: %s\n", what,
            t && *t ? t : natsStatus_GetText(s));
    return 1;
}

static natsStatus connect_to(const char *port, natsConnection **nc,
                             jsCtx **js)
{
    char url[64];
    snprintf(url, sizeof url, "nats://127.0.0.1:%s", port);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.PublishAsync.MaxPending = 4096;
    jo.PublishAsync.StallWait = 30000;  /* a loaded machine */
    jo.Wait = 30000;
    natsStatus s = natsConnection_ConnectTo(nc, url);
    return s ? s : natsConnection_JetStream(js, *nc, &jo);
}

static int add_stream(jsCtx *js, const char *name, const char *subject)
{
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = name;
    sc.Subjects = &subject;
    sc.SubjectsLen = 1;
    natsStatus s = js_AddStream(NULL, js, &sc, NULL, NULL);
    return s ? die("making the stream", s) : 0;
}

static int count(jsCtx *js, const char *name)
{
    jsStreamInfo *si = NULL;
    natsStatus s = js_GetStreamInfo(&si, js, name, NULL, NULL);
    if (s)
        return die("reading the stream", s);
    printf("%llu\n", (unsigned long long)si->State.Msgs);
    jsStreamInfo_Destroy(si);
    return 0;
}

static int load(jsCtx *js, const char *subject)
{
    char line[4096], id[32];
    unsigned long n = 0;
    while (fgets(line, sizeof line, stdin)) {
        size_t len = strcspn(line, "\n");
        natsMsg *m = NULL;
        snprintf(id, sizeof id, "%lu", ++n);
        natsStatus s = natsMsg_Create(&m, subject, NULL, line, (int)len);
        s = s ? s : natsMsgHeader_Set(m, "Nats-Msg-Id", id);
        s = s ? s : js_PublishMsgAsync(js, &m, NULL);
        natsMsg_Destroy(m);
        if (s)
            return die("publishing", s);
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 60000;
    natsStatus s = js_PublishAsyncComplete(js, &po);
    return s ? die("waiting for the PubAcks", s) : 0;
}

/* One batch: copy, wait for the copies, ack. */
static natsStatus copy_batch(natsConnection *nc, jsCtx *js,
                             natsMsgList *l, const char *subject)
{
    natsStatus s = NATS_OK;
    for (int i = 0; !s && i < l->Count; i++) {
        natsMsg *in = l->Msgs[i], *m = NULL;
        const char **keys = NULL;
        int nk = 0;
        s = natsMsg_Create(&m, subject, NULL, natsMsg_GetData(in),
                           natsMsg_GetDataLength(in));
        if (!s && natsMsgHeader_Keys(in, &keys, &nk) == NATS_OK) {
            for (int k = 0; !s && k < nk; k++) {
                const char *v = NULL;
                natsMsgHeader_Get(in, keys[k], &v);
                s = natsMsgHeader_Add(m, keys[k], v ? v : "");
            }
            free((void *)keys);
        }
        s = s ? s : js_PublishMsgAsync(js, &m, NULL);
        natsMsg_Destroy(m);
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = 30000;
    s = s ? s : js_PublishAsyncComplete(js, &po);
    for (int i = 0; !s && i < l->Count; i++)
        s = natsMsg_Ack(l->Msgs[i], NULL);
    return s ? s : natsConnection_Flush(nc);
}

static int copy(natsConnection *nc, jsCtx *js, char **argv)
{
    const char *stream = argv[0], *durable = argv[1], *subject = argv[2];
    int batch = (int)strtol(argv[3], NULL, 10);
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Config.AckPolicy = js_AckExplicit;
    so.Config.MaxAckPending = 3 * batch;
    natsSubscription *sub = NULL;
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = durable;
    cc.AckPolicy = js_AckExplicit;
    cc.MaxAckPending = 3 * batch;
    natsStatus s = js_AddConsumer(NULL, js, stream, &cc, NULL, NULL);
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Consumer = durable;
    s = s ? s : js_PullSubscribe(&sub, js, NULL, durable, NULL, &so, NULL);
    unsigned long n = 0;
    while (!s) {
        natsMsgList l = {0};
        natsStatus f = natsSubscription_Fetch(&l, sub, batch, 500, NULL);
        if (l.Count == 0 && (f == NATS_TIMEOUT || f == NATS_OK))
            break;
        n += (unsigned long)l.Count;
        s = l.Count ? copy_batch(nc, js, &l, subject) : f;
        natsMsgList_Destroy(&l);
    }
    natsSubscription_Destroy(sub);
    if (s)
        return die("copying", s);
    fprintf(stderr, "nats_alo: %lu messages copied\n", n);
    return 0;
}

int main(int argc, char **argv)
{
    int mode = argc < 4 ? -1 : !strcmp(argv[1], "stream") ? 0
                             : !strcmp(argv[1], "load")   ? 1
                             : !strcmp(argv[1], "copy")   ? 2
                             : !strcmp(argv[1], "count")  ? 3
                                                          : -1;
    if (mode < 0 || argc != (int[]){5, 4, 7, 4}[mode]) {
        fprintf(stderr, "usage: nats_alo stream PORT NAME SUBJECT\n"
                        "       nats_alo load PORT SUBJECT < lines\n"
                        "       nats_alo copy PORT STREAM DURABLE SUBJECT "
                        "BATCH\n"
                        "       nats_alo count PORT STREAM\n");
        return 2;
    }
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    natsStatus s = connect_to(argv[2], &nc, &js);
    int rc = s           ? die("connecting", s)
             : mode == 0 ? add_stream(js, argv[3], argv[4])
             : mode == 1 ? load(js, argv[3])
             : mode == 2 ? copy(nc, js, argv + 3)
                         : count(js, argv[3]);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return rc;
}
