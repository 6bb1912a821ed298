/* nstream.h - NATS JetStream as the source and the sink of dedup and run.
 *
 * The source reads a durable pull consumer (created if missing), hands
 * out each message's data as a line with its headers beside it
 * (nd_line.meta), tells the server the messages in hand are in progress
 * while they wait, and acknowledges each only after the commit that
 * covers it. The sink publishes one message per output line with
 * Nats-Msg-Id and idem-key set to its key, waits for the PubAcks, and
 * keeps the stream's sequence as its position; after a crash it reads
 * the stream back from there. docs/streams.md states the guarantee. */
#ifndef IDEM_NSTREAM_H
#define IDEM_NSTREAM_H

#include "connect.h"

/* Is uri one of ours ("nats://...")? */
int ns_is_uri(const char *uri);

/* As source_open() and sink_open() (connect.h), for nats://. */
source *ns_source_open(const char *cmd, const char *uri,
                       const source_opts *o, int *status);
sink *ns_sink_open(const char *cmd, const char *uri, int64_t lease_ms,
                   int *status);

/* As connect_ident() (connect.h), for nats://. */
int ns_ident(const char *cmd, const char *uri, int as_sink, char *buf,
             size_t size);

#endif
