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
 * run wrote but did not commit is not written twice. docs/streams.md
 * states the guarantee. */
#ifndef IDEM_RSTREAM_H
#define IDEM_RSTREAM_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "ndjson.h"

/* Is uri one of ours ("redis-stream://...")? */
int rs_is_uri(const char *uri);

typedef struct rs_source rs_source;
typedef struct rs_sink rs_sink;

/* ---- source */

/* Open the source uri for cmd: the group is made if missing (with the
 * stream). batch is the most entries read at a time, lease_ms the idle
 * time after which another consumer's pending entry is taken over,
 * idle_exit_ms (0: never) how long without a new entry ends the input.
 * stop is polled while a read blocks. NULL after saying why (*status: 1
 * or, for a bad URI, 2). */
rs_source *rs_source_open(const char *cmd, const char *uri, uint64_t batch,
                          int64_t lease_ms, int64_t idle_exit_ms,
                          volatile const sig_atomic_t *stop,
                          int *status);
void rs_source_close(rs_source *s);
/* The consumer's name (the URI's consumer=, else the host name). */
const char *rs_source_consumer(const rs_source *s);

/* The next entry as a JSON line (l->end and l->lineno hold its ID: ms
 * and sequence), as nd_next() does: ND_LINE, ND_IDLE (wait 0 and nothing
 * ready, or *stop set), ND_END (--idle-exit passed), ND_ERR
 * (rs_source_err says why). Lines stay valid until rs_source_release(). */
int rs_source_next(rs_source *s, nd_line *l, int wait);
void rs_source_release(rs_source *s);
const char *rs_source_err(const rs_source *s);
/* Where l came from, for messages: "STREAM entry ID". */
void rs_source_where(const rs_source *s, const nd_line *l, char *buf,
                     size_t n);
/* Acknowledge the entry of l (queued), then all queued (flush): called
 * by the committing thread, on a connection of its own, after the
 * commit. 0 or -1 after saying why. */
int rs_source_ack(rs_source *s, const nd_line *l);
int rs_source_ack_flush(rs_source *s);
/* Entries skipped since the last call because the stream no longer held
 * them (trimmed): they are acknowledged and counted, never waited for. */
uint64_t rs_source_trimmed(rs_source *s);

/* Entries of the stream not yet delivered to the group (XINFO GROUPS
 * "lag"), or -1 when the server does not say. For the progress line. */
long long rs_source_lag(rs_source *s);

/* ---- sink */

rs_sink *rs_sink_open(const char *cmd, const char *uri, int64_t lease_ms,
                      int *status);
void rs_sink_close(rs_sink *k);
/* The stream's last entry ID ("0-0" if empty) into pos (32 bytes): where
 * a new job starts. 0 or -1. */
int rs_sink_last(rs_sink *k, char pos[32]);
/* Read back every entry after pos: the keys found are those a run that
 * died after writing them may not have committed. 0 or -1. */
int rs_sink_read_back(rs_sink *k, const char *pos);
/* Is key in the sink already (read back at the start, or, when recent
 * is set, in the entries of the last few leases)? The entry's status and
 * result fields (for run), NULL if it has none. 1 yes, 0 no, -1 error. */
int rs_sink_has(rs_sink *k, const void *key, size_t keylen, int recent,
                const char **status, const char **result, size_t *rlen);
/* Add one entry for the JSON line text[0..len) with key; queued until
 * rs_sink_flush(), which writes them all and moves the position. 0 or
 * -1 after saying why. */
int rs_sink_put(rs_sink *k, const char *text, size_t len, const void *key,
                size_t keylen);
int rs_sink_flush(rs_sink *k);
/* The position after the last flush (32 bytes). */
const char *rs_sink_pos(const rs_sink *k);
/* The sink as messages name it (password hidden). */
const char *rs_sink_name(const rs_sink *k);

#endif
