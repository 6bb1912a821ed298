/* kafka.h - Kafka topics as the source and the sink of dedup and run.
 *
 * The source is a consumer group (ksource.c) whose offsets are committed
 * by hand, after the idem commit that covers the messages; the offsets
 * the job's checkpoint keeps (from=) are the ones it resumes from. The
 * sink is an idempotent producer (ksink.c) read back after a crash,
 * behind a fence marker on each partition. kconn.c parses the URIs and
 * turns their parameters and --kafka-config into librdkafka properties.
 * docs/streams.md states what each guarantee rests on. */
#ifndef IDEM_KAFKA_H
#define IDEM_KAFKA_H

#include <librdkafka/rdkafka.h>

#include "connect.h"

#define KAFKA_MAX_TOPICS 16
#define KAFKA_FENCE_HEADER "idem-fence"

typedef struct kafka_uri {
    char *brokers;                  /* bootstrap.servers */
    char *topics[KAFKA_MAX_TOPICS];
    size_t ntopics;
    char *group, *consumer;         /* source */
    int64_t timeout_ms;             /* one call's limit */
    int64_t readback_ms;            /* sink: 0 default */
    char **props;                   /* name, value, name, value... */
    size_t nprops;
    char display[512];              /* for messages: no parameters */
} kafka_uri;

/* Is uri one of ours ("kafka://...")? */
int kafka_is_uri(const char *uri);

/* Parse uri (as_sink: a --to, one topic, no group). 0, or 2 after
 * saying what is wrong. */
int kafka_uri_parse(const char *cmd, const char *uri, int as_sink,
                    kafka_uri *u);
void kafka_uri_free(kafka_uri *u);

/* A librdkafka configuration: bootstrap.servers, then `base` (name,
 * value pairs, NULL-ended), then --kafka-config's file, then the URI's
 * dotted parameters, which win. NULL after saying why (values are never
 * printed: they may be secrets). */
rd_kafka_conf_t *kafka_conf(const char *cmd, const kafka_uri *u,
                            const char *const *base);

/* A line of librdkafka's (a log line, an error) on standard error,
 * each configured value replaced by ***. */
void kafka_say(const char *fac, const char *msg);

/* A client of type t on conf (which it takes); NULL after saying why. */
rd_kafka_t *kafka_client(const char *cmd, const kafka_uri *u,
                         rd_kafka_type_t t, rd_kafka_conf_t *conf);

/* As connect_ident(), for kafka://. */
int kafka_ident(const char *cmd, const char *uri, int as_sink, char *buf,
                size_t size);

/* As source_open() and sink_open() (connect.h). */
source *kafka_source_open(const char *cmd, const char *uri,
                          const source_opts *o, int *status);
sink *kafka_sink_open(const char *cmd, const char *uri, int64_t lease_ms,
                      int *status);

#endif
