/* rstream.h - Redis Streams as the source and the sink of dedup and run.
 *
 * The source reads a consumer group: its own pending entries first (what
 * a killed run of the same consumer left unacknowledged), then entries
 * idle past the lease in other consumers' lists (XAUTOCLAIM), then new
 * ones. Each entry is handed out as one JSON line (its fields, values as
 * strings); it is acknowledged only after the commit that covers it.
 *
 * The sink appends one entry per output line (XADD): the line's members
 * as fields, and the message's key as the field idem-key. Its position is
 * the ID of the last entry it added, kept in the job's checkpoint; on a
 * restart the entries after it are read back, so that a message the dead
 * run wrote but did not commit is not written twice. On the store's own
 * server both join the store instead: the XADDs and XACKs run in the
 * script that writes the checkpoint and its completions. docs/streams.md
 * states the guarantee. */
#ifndef IDEM_RSTREAM_H
#define IDEM_RSTREAM_H

#include "connect.h"

/* Is uri one of ours ("redis-stream://...")? */
int rs_is_uri(const char *uri);

/* As source_open() and sink_open() (connect.h), for redis-stream://. */
source *rs_source_open(const char *cmd, const char *uri,
                       const source_opts *o, int *status);
sink *rs_sink_open(const char *cmd, const char *uri, int64_t lease_ms,
                   int *status);

/* As connect_ident() (connect.h), for redis-stream://. */
int rs_ident(const char *cmd, const char *uri, int as_sink, char *buf,
             size_t size);

#endif
