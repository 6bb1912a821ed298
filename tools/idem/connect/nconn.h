/* nconn.h - a nats:// URI, and one connection to its JetStream. */
#ifndef IDEM_NCONN_H
#define IDEM_NCONN_H

#include <nats/nats.h>
#include <stdint.h>

typedef struct nats_uri {
    char *host;
    int port;
    char *user, *pass;   /* user:pass@ (or IDEM_NATS_PASSWORD) */
    char *token;         /* TOKEN@ (or IDEM_NATS_TOKEN) */
    char *pwfile;        /* password_file=: the password, or the token */
    char *creds;         /* creds=FILE */
    char *nkey, *nkey_pub;  /* nkey=FILE (a seed), nkey_pub=ITS KEY */
    char *name;          /* source: the stream; sink: the subject */
    char *durable;       /* source: the consumer */
    char *subject;       /* source: its filter; sink: NULL */
    char *worker;        /* source: this worker's name, for its job (its
                          * checkpoint): default the host name */
    char *stream;        /* sink: the stream holding the subject (NULL:
                          * asked of the server) */
    int64_t timeout_ms;  /* one request */
    int64_t ack_wait_ms; /* source: the consumer's AckWait (0: from the
                          * lease) */
    char display[512];   /* for messages: no password, token or file */
} nats_uri;

/* Is uri one of ours ("nats://...")? */
int nu_is_uri(const char *uri);
/* Parse uri; `sink` selects which parameters apply. 0, or 2 after saying
 * why (a usage error of cmd). */
int nu_parse(const char *cmd, const char *uri, int sink, nats_uri *u);
void nu_free(nats_uri *u);
/* What names jobs and key spaces: nats://HOST:PORT/NAME, with `worker`
 * the durable, filter and worker too (into buf, size bytes). */
void nu_ident(const nats_uri *u, int worker, char *buf, size_t size);

typedef struct nats_link {
    natsConnection *nc;
    jsCtx *js;
} nats_link;

/* Connect (credentials as the URI says; reconnecting on its own after a
 * lost connection) and take its JetStream context, whose asynchronous
 * publishes report to on_ack(closure) when it is not NULL. 0, or 1 after
 * saying why. */
int nl_open(const char *cmd, const nats_uri *u, nats_link *l,
            jsPubAckHandler on_ack, void *closure);
void nl_close(nats_link *l);
/* Why the last call of this thread failed (s its status), for a
 * message. */
const char *nl_why(natsStatus s);

#endif
