/* idem/idem.h - exactly-once effects for stream processors.
 *
 * This header is the manual of libidem. Everything public is here; anything
 * named idem__ or living under src/ is private and may change.
 *
 * THE IDEA
 *
 * Brokers deliver at least once. A message carries an idempotency key. Before
 * the message's side effects run, its key is *claimed* in a durable store;
 * a redelivery of the same key finds the record and receives the first
 * outcome back instead of running again:
 *
 *     idem_claim(key)  -> NEW(token)        run the work, then
 *                         idem_complete(key, token, response)
 *                      -> REPLAY(response)  the work ran: return its result
 *                      -> FAILED(error)     it failed for good: return that
 *                      -> BUSY(lease_until) another worker holds it now
 *                      -> MISMATCH          the key came with another payload
 *
 * A claim holds a *lease*. A worker that dies stops renewing it; once it
 * runs out the next claim takes the key over with a greater token. The
 * token is a fencing token: idem_complete() with an old token fails with
 * IDEM_ELOST, so a worker that was presumed dead learns that its effects
 * may be doubled. A key's tokens only ever grow (see idem_complete()).
 *
 * DURABILITY
 *
 * A call's effect is durable once idem_sync() returns (group commit: any
 * number of calls, one fdatasync). Batch forms sync before they return
 * unless passed IDEM_NOSYNC. Acknowledge a message to its broker only after
 * the sync that covers its outcome.
 *
 * STORES, CHOSEN BY URI
 *
 *     local:PATH   the embedded log engine in directory PATH (the default,
 *                  "local:./idem-data"); one writer at a time, readers
 *                  beside it (IDEM_O_READONLY); private unless
 *                  "local:PATH?mode=group" (see idem_open())
 *     mem:         the same engine in memory only; nothing survives close
 *     redis://...  one Redis server, shared by any number of processes
 *     redis-cluster://...  a Redis Cluster
 *     redis-sentinel://...  the master Redis Sentinel watches (see
 *                  idem_open() for the three)
 *
 * THREADS
 *
 * A store handle may be used by one thread at a time. Different handles are
 * independent. Functions that take no handle are thread-safe, and so is
 * idem_metrics_get(), which any thread may call on an open handle. A
 * local: handle runs threads of its own, briefly, for work that needs
 * nothing of the caller's (an fdatasync, a key index built while claims
 * go on); they start with every signal blocked, so signals keep going
 * to the caller's threads, and idem_close() waits for them.
 *
 * FORK
 *
 * A handle belongs to the process that opened it. fork() copies it into
 * the child together with the parent's unsynced changes, and the child
 * shares the parent's files and connections; were the child to write or
 * sync through it, or close it (an atexit handler or a C++ destructor is
 * enough), it could undo what the parent synced. So in a fork child every
 * call on an inherited handle fails with IDEM_EINVAL ("handle opened by
 * pid N, used in pid M: fork children must open their own store"), and
 * idem_close() there frees the child's memory and writes, truncates,
 * deletes and unlocks nothing. A child that needs a store opens its own
 * (a local: store only once the parent has closed it: one process holds
 * it at a time).
 *
 * ERRORS
 *
 * Functions return 0 or a negative IDEM_E* code. idem_strerror() names the
 * code; idem_errdetail() says what exactly went wrong on a handle (which
 * file, which offset, which argument). The library never exits or aborts:
 * out of memory is IDEM_ENOMEM, and the handle stays usable.
 *
 * NULL POINTERS
 *
 * A NULL where a function needs a pointer is IDEM_EINVAL, never a crash:
 * a NULL handle, a NULL out-parameter (idem_open()'s out, idem_claim()'s
 * out, idem_get()'s out, ...), a NULL array with a count above 0. The
 * functions that return nothing do nothing with NULL
 * (idem_opts_init(), idem_runner_opts_init(), idem_close(),
 * idem_runner_free()). Pointers documented as "may be NULL" take NULL for
 * a default or for "not wanted": the uri and opts of idem_open(), the
 * opts of idem_claim(), expired of idem_sweep(), committed of
 * idem_runner_batch(), the report of idem_check() and idem_repair(), ctx
 * of idem_scan(). A key or value pointer may be NULL only with a length
 * of 0 (a key of length 0 is IDEM_EKEYSIZE).
 *
 * After an I/O error while writing (IDEM_EIO, IDEM_ENOSPC) a local store
 * refuses further writes with the same code: the in-memory state may be
 * ahead of the disk, and only a reopen, which recovers from the disk, can
 * make the two agree. Everything synced before the error is kept. */
#ifndef IDEM_H
#define IDEM_H

#include <stddef.h>
#include <stdint.h>

#include "idem/version.h"

/* IDEM_EXPORT marks the public API: libidem is built with
 * -fvisibility=hidden, so a function without it (every idem__ internal)
 * is not in libidem.so's dynamic symbol table and no program can come to
 * depend on it. */
#if defined(__GNUC__)
#define IDEM_EXPORT __attribute__((visibility("default")))
#else
#define IDEM_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Errors */

/* Every code, its value and its text, in one table: idem_strerror() is
 * made from it, and a program can make its own, e.g. a switch naming each
 * code:
 *
 *     #define NAME(name, value, text) case IDEM_##name: return #name;
 *         IDEM_ERRNO_MAP(NAME)
 *     #undef NAME
 *
 * The values are part of the ABI: a code keeps its value forever, and a
 * release may add codes (so a switch needs a default). IDEM_ECLOCK, the
 * key generators' code (idem/keys.h), sits far from the store's codes so
 * that both can grow. */
#define IDEM_ERRNO_MAP(XX)                                                 \
    XX(OK, 0, "success")                                                   \
    /* a bad argument: see idem_errdetail() */                             \
    XX(EINVAL, -1, "invalid argument")                                     \
    /* an allocation failed; nothing was changed */                        \
    XX(ENOMEM, -2, "out of memory")                                        \
    /* a read, write or sync failed */                                     \
    XX(EIO, -3, "input/output error")                                      \
    /* the disk is full */                                                 \
    XX(ENOSPC, -4, "no space left on device")                              \
    /* no live record for the key (get, forget) */                         \
    XX(ENOTFOUND, -5, "no such record")                                    \
    /* the token no longer holds the key: another worker took it over, or \
     * it was completed, failed, released, expired or forgotten */         \
    XX(ELOST, -6, "lease lost: the token no longer holds the key")         \
    /* another process holds the store */                                  \
    XX(ELOCKED, -7, "store is locked by another process")                  \
    /* stored data failed its checksum or format */                        \
    XX(ECORRUPT, -8, "stored data is damaged")                             \
    /* a key is empty or longer than IDEM_KEY_MAX */                       \
    XX(EKEYSIZE, -9, "key is empty or too long")                           \
    /* a response/error is over IDEM_VALUE_MAX */                          \
    XX(EVALSIZE, -10, "value is too long")                                 \
    /* data written by an unknown format version */                        \
    XX(EVERSION, -11, "unknown data format version")                       \
    /* two keys share an index hash (see "Odds") */                        \
    XX(ECOLLISION, -12, "two keys share an index hash")                    \
    /* a server could not be reached */                                    \
    XX(ECONN, -13, "cannot connect to server")                             \
    /* a server did not answer in time */                                  \
    XX(ETIMEOUT, -14, "server timed out")                                  \
    /* a server answered something unexpected */                           \
    XX(EPROTO, -15, "unexpected reply from server")                        \
    /* a server refused the credentials */                                 \
    XX(EAUTH, -16, "authentication failed")                                \
    /* the backend does not offer this operation */                        \
    XX(ENOTSUP, -17, "operation not supported by this store")              \
    /* the caller asked the runner to stop (idem_runner_opts.stop) */      \
    XX(ESTOPPED, -18, "stopped on request")                                \
    /* the clock is outside what a key generator can use (idem/keys.h) */  \
    XX(ECLOCK, -32, "the clock is outside what the generator can use")

enum {
#define IDEM__ERRNO_ENUM(name, value, text) IDEM_##name = (value),
    IDEM_ERRNO_MAP(IDEM__ERRNO_ENUM)
#undef IDEM__ERRNO_ENUM
};

/* The name and meaning of an error code, e.g. "IDEM_ELOST: lease lost".
 * Never NULL; a static string. Thread-safe. */
IDEM_EXPORT const char *idem_strerror(int code);

/* ------------------------------------------------------------------------
 * Version */

/* The library's version string, e.g. "0.1.0". Compare with
 * IDEM_VERSION_STRING to tell headers and library apart. */
IDEM_EXPORT const char *idem_version(void);

/* ------------------------------------------------------------------------
 * Limits */

#define IDEM_KEY_MAX 1024u              /* bytes in a key (1..this) */
#define IDEM_VALUE_MAX (64u << 20)      /* bytes in a response/error */
#define IDEM_FP_LEN 16                  /* bytes in a payload fingerprint */
#define IDEM_TOKEN_MAX ((uint64_t)1 << 53) /* the greatest token
                                         * idem_import() takes: Redis
                                         * scripts count in doubles, exact
                                         * to 2^53; tokens issued stay
                                         * below it (a clock in
                                         * microseconds reaches it in
                                         * 2255) */
#define IDEM_CHECKPOINT_NAME_MAX 255u   /* bytes in a checkpoint name */
#define IDEM_MS_MAX (100LL * 365 * 24 * 3600 * 1000)
                                        /* the longest TTL or lease, in ms
                                         * (100 years) */

/* ------------------------------------------------------------------------
 * Opening a store */

typedef struct idem_store idem_store;

/* A clock in Unix milliseconds. Tests inject one to drive TTLs and leases
 * without sleeping. It must not go backwards for the results to make sense;
 * if it does, expiry simply waits. Redis stores use the server's clock
 * (TIME, inside their scripts) so that clients with skewed clocks agree; a
 * clock set in the options overrides server time for that handle: meant
 * for tests, since handles with different clocks disagree on leases. */
typedef int64_t (*idem_clock_fn)(void *ctx);

/* Options for idem_open(). Always initialise with idem_opts_init(), then
 * change what you need: new fields get defaults there, so code written for
 * this version keeps working when the struct grows. */
typedef struct idem_opts {
    unsigned version;          /* set by idem_opts_init(); do not touch */
    int64_t ttl_ms;            /* default record TTL; 24 h */
    int64_t lease_ms;          /* default claim lease; 30 s */
    int64_t failure_ttl_ms;    /* TTL of a cached permanent failure; 1 h */
    idem_clock_fn clock;       /* NULL: CLOCK_REALTIME */
    void *clock_ctx;           /* passed to clock */
    uint64_t segment_bytes;    /* local: roll to a new segment past this
                                * size; 64 MiB */
    int64_t segment_span_ms;   /* local: ... or when a segment has taken
                                * writes for this long (its time bucket);
                                * 1 h */
    unsigned flags;            /* IDEM_O_* */
    int64_t retention_ms;      /* redis: idem_sweep() deletes records that
                                * have no TTL once created this long ago;
                                * 7 days */
} idem_opts;

#define IDEM_O_READONLY 1u     /* open an existing store without writing:
                                * a torn tail is ignored, not cut; every
                                * write and idem_sweep fail with EINVAL.
                                * local: takes no lock, so it reads a
                                * store another process writes (what was
                                * committed when it opened; the group
                                * being written is left unread, and is no
                                * damage) and needs only read access */
#define IDEM_O_NOCREATE 2u     /* fail with IDEM_ENOTFOUND if absent */

/* Fill *opts with the defaults listed above (NULL: nothing to do). */
IDEM_EXPORT void idem_opts_init(idem_opts *opts);

/* Open the store that uri names (NULL: IDEM_DEFAULT_URI), creating it if
 * needed. opts may be NULL for the defaults; it is copied.
 *
 * On success returns 0 and *out is the handle. On failure returns the error
 * and *out is still a handle (in a closed state) whose idem_errdetail()
 * explains it, e.g. "./d: in use by another process (pid 4242); ...";
 * pass it to
 * idem_close(). *out is NULL only when even that could not be allocated
 * (IDEM_ENOMEM). out itself may not be NULL: that is IDEM_EINVAL, with no
 * handle to say more.
 *
 * A local: store is refused with IDEM_ECORRUPT, naming the file and the
 * offset, when anything is damaged or missing that a crash cannot explain:
 * a crash can tear only the group whose idem_sync() never returned, so
 * only that is cut. A clean idem_close() (and every new segment) records
 * in PATH/TAIL where the log ends; after it, garbage anywhere in the log,
 * a cut or zeroed end, a deleted segment are all damage. Stores written
 * before PATH/TAIL existed open as they did: until their first clean
 * close, their end is judged by the commits alone.
 *
 * A local: store is private: PATH is created 0700 and its files 0600,
 * whatever the umask, since they hold cached responses and the secret of
 * the index hash. "local:PATH?mode=group" creates PATH 0750 so that its
 * group may read the store; every file follows its directory (0640 when
 * the group may enter it). An existing store keeps its modes; one that
 * other users can read opens with idem_warning() saying so. A '?' in
 * PATH starts the parameters; unknown ones are IDEM_EINVAL.
 *
 * Errors: IDEM_EINVAL (bad URI or options), IDEM_ELOCKED, IDEM_ECORRUPT
 * (damage other than a torn tail: run idem_repair()), IDEM_EVERSION,
 * IDEM_EIO, IDEM_ENOSPC, IDEM_ENOMEM, IDEM_ENOTFOUND (IDEM_O_NOCREATE);
 * for Redis also IDEM_ECONN (no seed reachable), IDEM_ETIMEOUT, IDEM_EAUTH
 * (wrong user or password) and IDEM_EPROTO.
 *
 * REDIS URIS
 *
 *     redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?PARAM=VALUE&...]
 *     redis-cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...][?...]
 *     redis-sentinel://[[USER]:PASSWORD@]HOST[:PORT][,...]/MASTER[?...]
 *
 * PORT defaults to 6379, DB to 0 (a cluster has only 0); an IPv6 HOST goes
 * in brackets. USER, PASSWORD and prefix may be %-encoded ('?', '#' and
 * '&' in a password must be). "redis://pw@h" is a password without a
 * user (AUTH pw); with a user it is AUTH user pw (Redis 6 ACLs).
 * Since a URI shows in ps, the password may come instead from a file,
 * password_file=PATH (its content less one trailing newline; refused
 * when users other than its owner and group may read it), or else from
 * the environment variable IDEM_REDIS_PASSWORD. A URI with a password and
 * a password_file is refused; "redis://USER:@h" names a user whose
 * password comes from the file or the environment. No detail ever shows
 * a password: messages name the store as idem_uri_display() does. A
 * cluster URI lists one or more nodes to learn the cluster from; the
 * rest are found through CLUSTER SLOTS. A sentinel URI lists sentinels
 * (PORT defaults to 26379) and the name they watch the master as: the
 * master is asked of them in turn, must answer ROLE master, and is
 * asked again after a connection fails or a write meets READONLY, so a
 * failover within timeout_ms is invisible; USER and PASSWORD are the
 * master's, sentinel_user and sentinel_password (or
 * sentinel_password_file) the sentinels' own; the database is db=N.
 * Parameters (docs/uri.md lists every one, with its range, layout, days
 * and shards included):
 *
 *     timeout_ms=5000   the time one call may take, retries through
 *                       redirects, refused connections and failover
 *                       included; past it the call fails with IDEM_ECONN
 *                       or IDEM_ETIMEOUT. No call waits longer.
 *     connect_timeout_ms=N  one connection attempt (default timeout_ms)
 *     prefix=idempotency:   key names are PREFIX{KEY}: one hash per key
 *     pool=1            connections per node; a batch is spread over them
 *     password_file=PATH  the password, read from PATH (above)
 *     wait=0            after writes, WAIT for this many replicas: a call
 *                       succeeds only once its writes reached them, so a
 *                       master's death loses no acknowledged claim. If
 *                       fewer replicas confirm within the timeout, the
 *                       keys concerned fail with IDEM_ETIMEOUT (their
 *                       writes may still have been applied).
 *
 * A record is one hash PREFIX{KEY} with fields status (0 PENDING, 1 DONE,
 * 2 FAILED), response, created_ts, token, attempts, lease, expires, fp,
 * released, cid, fid, and always a TTL (PEXPIRE). Every change is one Lua
 * script, atomic on the server (IDEM_CLAIM_DONE included: claim and DONE
 * in one script). Writes are applied when a call returns (and replicated
 * with wait=N), so idem_sync() has nothing to do unless a checkpoint is
 * queued (see "Checkpoints"); a batch is one pipelined round trip per
 * node. A call retried after a broken
 * connection may run twice on the server; claims, completes and fails
 * carry request ids so that the second run answers like the first, but a
 * retried idem_forget() may answer IDEM_ENOTFOUND for the record it
 * deleted itself. Pointing redis:// at a cluster
 * node, or redis-cluster:// at a plain server, is IDEM_EINVAL.
 * Checkpoints are hashes PREFIXcheckpoint:{NAME} without a TTL, which
 * sweep, stats, dump and check leave alone. idem_sweep() SCANs every
 * master (max_work bounds the keys looked at per call) and deletes records
 * without a TTL older than retention_ms. docs/redis.md has the details. */
IDEM_EXPORT int idem_open(const char *uri, const idem_opts *opts,
                          idem_store **out);

/* Sync what is pending, release the store and free the handle. Returns the
 * result of that last sync (the handle is freed regardless). A local:
 * store also records where its log ends (PATH/TAIL), so that the next
 * open refuses any loss after it. In a fork child of the process that
 * opened s, only frees memory (see FORK) and returns 0. NULL is a no-op
 * returning 0. */
IDEM_EXPORT int idem_close(idem_store *s);

/* What went wrong in the last failed call on s, as one line of text, or ""
 * after a success. Owned by s; valid until the next call on s. */
IDEM_EXPORT const char *idem_errdetail(const idem_store *s);

/* What idem_open() found worth telling but not worth a refusal, as one
 * line of text, or "": today a local: store that other users can read
 * ("./d: other users can read this store (seg-00000001.log, mode 0644);
 * chmod o-rwx ./d"). Owned by s; valid until s is closed. A tool shows
 * it to whoever opened the store. */
IDEM_EXPORT const char *idem_warning(const idem_store *s);

/* uri as it may be shown in a message, a log or a metrics label: its
 * passwords, if it holds any ("redis://USER:PASSWORD@...",
 * "redis://PASSWORD@...", and the value of every parameter whose name
 * ends in "password", "?sentinel_password=..."), replaced by "***".
 * Writes at most size bytes to buf (NUL-terminated, cut short if need
 * be; buf may be NULL when size is 0) and returns the length of the
 * whole rendering, as snprintf() does. NULL or "" renders as the default
 * store. Every idem_errdetail() names the store this way. Thread-safe. */
IDEM_EXPORT size_t idem_uri_display(const char *uri, char *buf, size_t size);

/* The store that a NULL or "" uri names. */
#define IDEM_DEFAULT_URI "local:./idem-data"

/* What the backend that uri names can do (idem_uri_caps()). */
#define IDEM_CAP_SEGMENTS 1u   /* it keeps its records in log segments on
                                * this machine (local:, mem:): the
                                * segment, disk and index figures of
                                * idem_stats mean something, and
                                * idem_check_report counts segments and
                                * bytes; else (Redis) it counts keys */
#define IDEM_CAP_CHECK 2u      /* idem_check() and idem_repair() work */

/* The IDEM_CAP_* flags of the backend that uri's scheme names, 0 if none
 * does. Reads the scheme only: nothing is opened or checked, so a tool
 * can ask before it opens or checks a store. NULL or "" is
 * IDEM_DEFAULT_URI. Thread-safe. */
IDEM_EXPORT unsigned idem_uri_caps(const char *uri);

/* ------------------------------------------------------------------------
 * The claim protocol */

typedef enum idem_state {
    IDEM_STATE_PENDING = 0, /* claimed, work in progress */
    IDEM_STATE_DONE = 1,    /* completed with a cached response */
    IDEM_STATE_FAILED = 2   /* failed permanently with a cached error */
} idem_state;

typedef enum idem_outcome_kind {
    IDEM_NEW = 1,      /* yours: run the work, then complete or fail */
    IDEM_REPLAY,       /* done before: data/len hold the response */
    IDEM_FAILED,       /* failed for good before: data/len hold the error */
    IDEM_BUSY,         /* another worker holds it until lease_until */
    IDEM_MISMATCH      /* the key was used with a different payload */
} idem_outcome_kind;

/* A key with its payload fingerprint. fp may be NULL: no MISMATCH check
 * for this claim. A record stored without a fingerprint matches any. */
typedef struct idem_key {
    const void *key;
    size_t keylen;
    const uint8_t *fp;     /* IDEM_FP_LEN bytes, or NULL */
} idem_key;

/* The answer to one claim. data points into memory owned by the store,
 * valid until the next call on the same handle. */
typedef struct idem_outcome {
    int status;            /* 0, or why this key was not claimed (batch) */
    idem_outcome_kind kind;
    uint64_t token;        /* NEW: yours. REPLAY/FAILED: the finisher's.
                            * 64 bits: see idem_complete() */
    uint32_t attempts;     /* claims granted (NEW) on this record so far,
                            * counting from 1 since it was created (the
                            * token does not count them) */
    int64_t lease_until;   /* NEW, BUSY: when the lease runs out (ms) */
    const void *data;      /* REPLAY: response. FAILED: error. else NULL */
    size_t len;
} idem_outcome;

/* Per-call settings for claims. NULL means the store's defaults. A zero
 * field also means "the default". */
typedef struct idem_claim_opts {
    int64_t lease_ms;      /* how long the claim is yours */
    int64_t ttl_ms;        /* how long the record lives (PENDING: at
                            * least as long as its lease) */
} idem_claim_opts;

/* Claim one key. Does not sync. Returns 0 and fills *out, or an error:
 * IDEM_EKEYSIZE, IDEM_EINVAL, IDEM_ENOMEM, IDEM_EIO, IDEM_ENOSPC,
 * IDEM_ECOLLISION, IDEM_ECORRUPT (the key's record cannot be read back). */
IDEM_EXPORT int idem_claim(idem_store *s, const idem_key *key,
                           const idem_claim_opts *opts, idem_outcome *out);

/* Complete a claim: PENDING with this token becomes DONE holding response,
 * living ttl_ms (0: the store default) from now. Does not sync.
 * IDEM_ELOST if the token does not hold the key.
 *
 * Tokens only grow: a token issued for a key is greater than every token
 * issued before for that key in that store, whatever expired or was
 * forgotten in between. So a worker whose record expired or was taken
 * over under it gets IDEM_ELOST here, never the new holder's claim, and
 * a sink that keeps the greatest token it saw per key can refuse a late
 * write. A new token is the greater of the record's previous token + 1
 * and the store's clock in microseconds (the injected clock's ms times
 * 1000; on Redis the server's TIME, or the handle's clock when set).
 * local: and mem: also keep a store-wide high-water mark of the tokens
 * issued, which local: finds again in its log when it opens, so a clock
 * stepped back, even across a restart, repeats no token that a record on
 * disk still holds. What can still repeat a token: a clock stepped back
 * by more than the time the log keeps a key's frames (its records' TTLs,
 * until their segment is dropped) on local:, or, on Redis, which keeps
 * nothing of a record that expired or was forgotten, a server clock
 * stepped back by more than the time since then; and a claim that was
 * never synced before a crash, whose token a clock stepped back can give
 * again (sync before acting on a token, as the README's example does). */
IDEM_EXPORT int idem_complete(idem_store *s, const void *key, size_t keylen,
                              uint64_t token, const void *response, size_t len,
                              int64_t ttl_ms);

#define IDEM_RETRYABLE 1u  /* idem_fail(): release the key for a retry */

/* Fail a claim. With IDEM_RETRYABLE the key is released: the next claim is
 * NEW with a greater token. Without it, FAILED is cached with this error
 * for the store's failure TTL and every claim answers FAILED. Does not
 * sync.
 * IDEM_ELOST if the token does not hold the key. */
IDEM_EXPORT int idem_fail(idem_store *s, const void *key, size_t keylen,
                          uint64_t token, const void *error, size_t len,
                          unsigned flags);

/* Renew a lease: it now runs out lease_ms (0: default) from now, and the
 * record lives at least that long, past its TTL if need be (as a claim's
 * and a takeover's record does): an expired record would be NEW to
 * anyone while its holder still works. IDEM_ELOST if the token does not
 * hold the key. Does not sync. */
IDEM_EXPORT int idem_extend(idem_store *s, const void *key, size_t keylen,
                            uint64_t token, int64_t lease_ms);

/* A record as idem_get() reports it. data as in idem_outcome. */
typedef struct idem_record {
    idem_state state;
    uint64_t token;
    uint32_t attempts;
    int released;          /* PENDING after a retryable failure */
    int64_t created_ms;
    int64_t expires_ms;
    int64_t lease_until;   /* PENDING only */
    uint8_t fp[IDEM_FP_LEN];
    int has_fp;
    const void *data;      /* the response or error, or NULL */
    size_t len;
} idem_record;

/* Read a live record without changing it. IDEM_ENOTFOUND if none. */
IDEM_EXPORT int idem_get(idem_store *s, const void *key, size_t keylen,
                         idem_record *out);

/* Delete a key's record: the next claim is NEW, with attempts 1 and a
 * token greater than the forgotten one (see idem_complete()).
 * IDEM_ENOTFOUND if there was no live record. Does not sync. */
IDEM_EXPORT int idem_forget(idem_store *s, const void *key, size_t keylen);

/* Make every change made so far durable (one fdatasync on local:). */
IDEM_EXPORT int idem_sync(idem_store *s);

/* idem_sync() in two halves, so that the caller works on while the disk
 * syncs: idem_sync_start() commits every change made so far and returns
 * once it is written (on local: the fdatasync runs on a thread of the
 * handle's); the changes are durable once idem_sync_wait() returns 0, or
 * a later idem_sync(). Calls made in between are not part of that
 * commit: they are durable only with the next one, and the first of
 * them that must write waits for this one (at most one commit is ever in
 * flight). A failure of the fdatasync is returned by idem_sync_wait()
 * (or the next call that waits) and breaks the handle as a failed
 * idem_sync() does; on a broken (or poisoned) handle idem_sync_wait()
 * returns that error, so that nothing more is acknowledged.
 * idem_sync_wait() with no commit in flight returns 0 at once. Stores
 * without such a split (mem:, Redis) sync in idem_sync_start() and have
 * nothing to wait for. Same thread rules as every other call: one
 * thread at a time. */
IDEM_EXPORT int idem_sync_start(idem_store *s);
IDEM_EXPORT int idem_sync_wait(idem_store *s);

/* ------------------------------------------------------------------------
 * Batches: one commit (local) or one round trip (servers) for n keys. */

#define IDEM_NOSYNC 1u     /* batch forms: do not sync before returning */
#define IDEM_CLAIM_DONE 2u /* idem_claim_many(): a NEW claim is recorded
                            * as DONE at once, with an empty response and
                            * the claim's ttl. For plain deduplication,
                            * where no work runs between claim and
                            * complete: one record instead of two. The
                            * outcome is still IDEM_NEW; its token needs
                            * no completion. A key given twice in one
                            * batch: the second is IDEM_REPLAY (without
                            * the flag: IDEM_BUSY), on every backend. */

/* Claim n keys; outs[i] answers keys[i]. A key that could not be claimed
 * has outs[i].status < 0 (e.g. IDEM_EKEYSIZE) and the others proceed;
 * idem_errdetail() then describes the last key refused. The return value
 * is 0, or an error that stopped the batch part way (ENOMEM, EIO, ENOSPC):
 * then outs[i].status tells, per key, which claims were made. Syncs before
 * returning unless flags has IDEM_NOSYNC; if that sync fails, the return
 * value says so and the claims made (status 0) are not durable.
 * IDEM_EINVAL for invalid arguments (opts out of range, NULL arrays):
 * then outs is not touched. */
IDEM_EXPORT int idem_claim_many(idem_store *s, const idem_key *keys, size_t n,
                                const idem_claim_opts *opts, idem_outcome *outs,
                                unsigned flags);

/* One completion of idem_complete_many(). */
typedef struct idem_completion {
    const void *key;
    size_t keylen;
    uint64_t token;
    const void *response;
    size_t len;
    int64_t ttl_ms;        /* 0: the store default */
} idem_completion;

/* Complete n claims; statuses[i] is idem_complete()'s result for items[i].
 * Return value and flags as idem_claim_many(). */
IDEM_EXPORT int idem_complete_many(idem_store *s, const idem_completion *items,
                                   size_t n, int *statuses, unsigned flags);

/* ------------------------------------------------------------------------
 * Checkpoints: a runner's source position, committed with its batch.
 *
 * idem_checkpoint_put() stores an opaque blob under a name; it becomes
 * durable in the same commit as every other change made before the next
 * sync, all or nothing. After a crash the store holds the newest
 * checkpoint together with exactly the records committed with it.
 *
 * On Redis (redis://, redis-cluster://, both layouts), where each write is
 * applied as it is sent, the same rule is kept this way:
 *   - idem_checkpoint_put() queues the blob in the handle; nothing is
 *     sent. One name may be queued per sync (IDEM_EINVAL for a second).
 *   - While a checkpoint is queued, idem_complete(), idem_complete_many()
 *     and idem_fail() do not write: each is checked at once (the token
 *     still holds the key, else IDEM_ELOST as always) and the key's lease
 *     is renewed to the store's lease_ms from now, so that it does not
 *     run out before the sync; the write is queued. Until the sync the
 *     store shows those keys PENDING. idem_extend() and claims are
 *     applied at once, as always.
 *   - idem_sync() (and idem_close()) then writes, with one script, the
 *     checkpoint key holding the blob and the queued writes (the intent;
 *     with wait=N under WAIT), applies the writes, pipelined, each with a
 *     request id so that applying it twice answers like the first time,
 *     and rewrites the key without the intent. If the first step fails,
 *     nothing is applied: the queue is dropped and sync returns the error
 *     (with wait=N a WAIT that timed out may leave the key, with its
 *     intent, on the master). A queued write refused at apply time
 *     (IDEM_ELOST: its lease ran out and another worker took the key
 *     between the check and the sync) makes sync return IDEM_ELOST with
 *     the key in idem_errdetail(); the rest is applied.
 *   - After a crash between the first and the last step, the next
 *     idem_checkpoint_get() of that name, from any process, applies the
 *     intent first: a checkpoint is never seen without its writes.
 *   - Without a queued checkpoint nothing changes: writes apply when the
 *     call returns.
 * A checkpoint key that idem did not write is IDEM_EPROTO. */

/* Store blob (len bytes, may be 0) under name. Does not sync.
 * IDEM_ENOTSUP on backends without checkpoints (every backend of this
 * library has them). */
IDEM_EXPORT int idem_checkpoint_put(idem_store *s, const char *name,
                                    const void *blob, size_t len);

/* The newest blob stored under name: the one this handle queued if there
 * is one, else the last synced one. *blob is owned by s and valid until
 * the next call on s. IDEM_ENOTFOUND if none; on Redis it applies first
 * the writes a crashed sync left with the checkpoint. */
IDEM_EXPORT int idem_checkpoint_get(idem_store *s, const char *name,
                                    const void **blob, size_t *len);

/* Writes queued with the checkpoint (Redis stores on one server, or one
 * slot of a cluster): other commands committed in the same step as the
 * checkpoint and its completions.
 *
 * idem_checkpoint_write() queues one command (argv[0..argc), e.g. XADD
 * or XACK; argv[keyidx] is the one key it names) in the handle, to be run
 * by the script that writes the next synced checkpoint (step 1 above),
 * in the order queued, before the checkpoint itself: the commands, the
 * checkpoint and its intent land together or, if that script fails,
 * nothing but the commands run before the one that failed (a command the
 * server refuses, WRONGTYPE say, ends the script; the sync returns
 * IDEM_EPROTO and the old checkpoint stands). So a program that writes
 * its output this way has no window between its output and its commit
 * to read back after a crash. *index: the command's place in the queue
 * (0, 1, ...), for idem_checkpoint_reply() after the sync. Every queued
 * command goes with the next sync, which must carry a checkpoint
 * (IDEM_EINVAL otherwise; the commands are dropped); a failed or
 * poisoned sync drops them too. With wait=N the script's WAIT covers them.
 *
 * IDEM_ENOTSUP from stores that cannot (local:, mem:: their commit is
 * not Redis's); on redis-cluster:// IDEM_EINVAL when the key is not in
 * the checkpoint's slot (PREFIXcheckpoint:{NAME}: give both one hash
 * tag), or when no checkpoint is queued yet to say which slot that is
 * (put it first). Its answer is kept as text: a string as it is, an
 * integer as its decimal digits, a status as its text (SET's OK), a nil
 * or an array as empty. */
IDEM_EXPORT int idem_checkpoint_write(idem_store *s, int argc,
                                      const char *const *argv,
                                      const size_t *argvlen, int keyidx,
                                      size_t *index);

/* The answer of queued write `index` in the last sync that ran queued
 * writes, as text (see above), owned by s and valid until the next sync;
 * IDEM_ENOTFOUND if that sync failed or had fewer. */
IDEM_EXPORT int idem_checkpoint_reply(idem_store *s, size_t index,
                                      const char **text, size_t *len);

/* The one Redis server a redis:// store uses: its host as written in the
 * URI (not resolved), port and database, so that a caller can tell that
 * something else it writes lives on the same server.
 * IDEM_ENOTSUP for other stores (local:, mem:, cluster, sentinel) or a
 * redis:// URI naming several hosts. */
IDEM_EXPORT int idem_store_server(idem_store *s, char *host, size_t hostlen,
                                  int *port, int *db);

/* ------------------------------------------------------------------------
 * The stream runner: a batch of messages processed exactly once.
 *
 * A source hands the runner batches of messages in order; the runner
 * claims their keys, gives the NEW ones to a handler, records the outcomes
 * and commits them together with the caller's sink and source position.
 * A batch goes round these steps until every message is settled:
 *
 *     claim what needs a claim (up to the first key that another worker
 *         holds); sync (the fencing tokens are durable before any effect)
 *     handler(NEW tasks) -> done / retry / fail per task; meanwhile the
 *         leases of the batch's claims are renewed (every third of the
 *         lease) and the answered prefix is committed every
 *         commit_interval_ms, each time the handler calls
 *         idem_runner_tick()
 *     commit the settled prefix:
 *         check the claims are still ours (stores shared by processes),
 *         commit(prefix): the caller writes the outcomes to its sink,
 *             makes them durable and puts its checkpoint,
 *         complete / fail the claims, sync
 *     retryable failures: released, claimed again after a backoff (a
 *         greater token), run again, up to max_attempts; a key another
 *         worker holds is asked for again every 200 ms until it is
 *         settled or its lease runs out (then it is taken over), or
 *         until the caller's stop hook asks for a stop
 *
 * "The prefix" is the messages before the first one not settled. Their
 * outcomes are committed with the caller's checkpoint in one commit (on
 * Redis stores: applied at the sync together with the checkpoint, see
 * "Checkpoints"); the claims of the rest stay ours, or are released when
 * the batch stops (a handler error, a store error), so a later run gets
 * them NEW with a higher token and attempt. So after a crash anywhere,
 * the store, the checkpoint and a sink that was made durable in commit()
 * agree: each key's outcome is in them exactly once. A crash sends back
 * to the handler only the messages it was given and whose outcomes were
 * not yet committed: at most commit_interval_ms of finished work plus
 * what was in flight. The handler may see a key again after a crash or a
 * handler error, with a higher attempt and token: side effects that
 * cannot be undone should be fenced with the token. All of this holds
 * within the TTL: a record that expires while a crashed job is down is
 * gone, so a rerun finds its key new and runs and writes it again; keep
 * TTLs far above the longest a job may stay down.
 *
 * Two workers on one store and one input never run a key twice while
 * both live: a claim is renewed while its work is in flight, and a
 * worker waiting for a key that another holds gives back every claim
 * behind it first, so two workers that meet the same keys in different
 * orders cannot wait for each other. A claim that is lost all the same
 * (the worker stalled for longer than a lease and another took the key
 * over) is never reported done: its message ends IDEM_MSG_INVALID with
 * status IDEM_ELOST, and its output must not be written.
 *
 * Without a handler the runner deduplicates: on a store with group
 * commit (local:, mem:) NEW keys are recorded DONE at once
 * (IDEM_CLAIM_DONE) in the commit that carries the checkpoint; elsewhere
 * they are claimed, and completed after commit().
 *
 * A key that appears twice in one batch is claimed once; the later
 * message is IDEM_MSG_DUPLICATE of the first. On a store that one process
 * holds at a time (local:, mem:) a PENDING claim under a live lease
 * belongs to a process that is gone, and the runner takes it over at
 * once.
 *
 * After an error of the store or of commit(), idem_runner_batch() gives
 * back the claims it can and poisons the handle: every later write and
 * sync fails, so that nothing the batch buffered can be committed without
 * its checkpoint. Close the store and open it again to go on.
 *
 * A stop (SIGTERM, say) need not wait for another worker's key, whose
 * lease may have a long time to run: the stop hook (idem_runner_opts.stop)
 * is asked at least every 50 ms while the runner waits, for a key another
 * worker holds or before a retry. When it says stop, the wait ends at
 * once, the claims still held (not run, or run and not yet answered) are
 * given back so that any worker takes them at once, what was settled
 * before stays committed, and idem_runner_batch() returns IDEM_ESTOPPED.
 * The store is not poisoned: the next batch may go on. A handler at work
 * is not interrupted by the hook; it has its own way to stop (return an
 * error, answering what it can first). */

typedef struct idem_runner idem_runner;

/* One message given to the handler. */
typedef struct idem_task {
    const void *key;       /* the message's key and bytes */
    size_t keylen;
    const void *msg;
    size_t msglen;
    uint64_t token;        /* the claim's fencing token */
    uint32_t attempt;      /* 1 the first time this key runs */
    size_t index;          /* its position in the batch */
    /* The handler's answer. data/len must stay valid until
     * idem_runner_batch() returns. */
    int answer;            /* 0 (none yet) or IDEM_TASK_* */
    const void *data;      /* DONE: the response; RETRY/FAIL: the error */
    size_t len;
} idem_task;

#define IDEM_TASK_DONE 1   /* the effect happened: complete with data */
#define IDEM_TASK_RETRY 2  /* a transient failure: run it again later */
#define IDEM_TASK_FAIL 3   /* a permanent failure: cache data as the error */

/* Run the effects of n NEW tasks and set each task's answer, in any order.
 * Return 0, or a negative code when the handler broke: then the tasks
 * without an answer, and every message after the first of them, are not
 * committed. A handler that may take longer than a third of the lease,
 * or longer than commit_interval_ms, calls idem_runner_tick() as often
 * as it can (it is cheap when nothing is due); an answer set before a
 * tick must keep its data valid until idem_runner_batch() returns. */
typedef int (*idem_handler_fn)(void *ctx, idem_task *tasks, size_t n);

/* What became of a message. */
typedef enum idem_msg_result {
    IDEM_MSG_UNDONE = 0,   /* not committed (after a handler error) */
    IDEM_MSG_DONE,         /* ran now and completed; data = response */
    IDEM_MSG_FAILED,       /* ran now, failed for good; data = error */
    IDEM_MSG_GAVE_UP,      /* retryable failures up to max_attempts; the
                            * key was released; data = the last error */
    IDEM_MSG_REPLAY,       /* completed before; data = cached response */
    IDEM_MSG_REPLAY_FAILED,/* failed for good before; data = cached error */
    IDEM_MSG_DUPLICATE,    /* its key came earlier in this batch: see
                            * `first` */
    IDEM_MSG_INVALID       /* not done here: status says why. Its key could
                            * not be claimed (IDEM_EKEYSIZE,
                            * IDEM_ECOLLISION, IDEM_EPROTO, ...), or the
                            * claim was lost to another worker while the
                            * handler ran (IDEM_ELOST): write no output */
} idem_msg_result;

/* One message of a batch. The caller fills key/keylen and msg/msglen;
 * idem_runner_batch() fills the rest. data stays valid until the next
 * idem_runner_batch() or idem_runner_free() on the runner. */
typedef struct idem_msg {
    const void *key;
    size_t keylen;
    const void *msg;
    size_t msglen;
    idem_msg_result result;
    int status;            /* INVALID: the error code. Also set on a
                            * settled message that met a problem the
                            * caller must report: IDEM_EVALSIZE (FAILED:
                            * the answer was too large to store; data
                            * says so), or an error of its completion
                            * after its output was committed (ELOST,
                            * EPROTO: the record may not say DONE) */
    uint64_t token;        /* the token that ran it (DONE, FAILED,
                            * GAVE_UP) or finished it (REPLAY*) */
    uint32_t attempt;
    size_t first;          /* DUPLICATE: index of the first message */
    const void *data;
    size_t len;
} idem_msg;

/* Called at least once per batch (empty ones too), before the store
 * commits, with msgs and n: the first n messages of the batch (a prefix,
 * maybe none) are about to be committed. n grows from call to call
 * within a batch (a commit every commit_interval_ms, and one per round):
 * write the messages not written by an earlier call to the sink, make
 * that durable, and put the source checkpoint with idem_checkpoint_put().
 * Return 0, or an error to commit nothing more of the batch (its claims
 * are released and the store is poisoned). */
typedef int (*idem_commit_fn)(void *ctx, const idem_msg *msgs, size_t n);

/* Asked, with the runner's ctx, while the runner waits (see "A stop"
 * above): nonzero to end the batch with IDEM_ESTOPPED. Called from the
 * thread that runs idem_runner_batch(); it must not call the runner or
 * the store. A flag set by a signal handler is the usual answer (read
 * it as a sig_atomic_t, or an atomic when another thread sets it). */
typedef int (*idem_stop_fn)(void *ctx);

typedef struct idem_runner_opts {
    unsigned version;       /* set by idem_runner_opts_init() */
    idem_handler_fn handler;/* NULL: deduplicate only */
    idem_commit_fn commit;  /* may be NULL */
    void *ctx;              /* passed to handler, commit and stop */
    int64_t lease_ms;       /* claim lease; 0: the store default */
    int64_t ttl_ms;         /* record TTL; 0: the store default */
    uint32_t max_attempts;  /* runs of a key per batch before GAVE_UP; 3 */
    int64_t backoff_ms;     /* wait before the first retry, doubled for
                             * each further one; 100 */
    int64_t commit_interval_ms; /* while the handler works, commit the
                             * answered prefix this often (at the handler's
                             * idem_runner_tick()); 200. 0: only at the
                             * end of each round */
    idem_stop_fn stop;      /* may be NULL: waits end only when their
                             * reason does */
    unsigned flags;         /* IDEM_RUNNER_* (version 4 on) */
} idem_runner_opts;

/* flags: a commit ends with idem_sync_start(), not idem_sync(): the
 * batch's outcomes are durable once the caller's idem_sync_wait()
 * returns 0 (or the next commit's writes, which wait for it), and only
 * then may it acknowledge the committed messages. The next batch's
 * claims and commit() run meanwhile. The runner's other syncs (the
 * claims before a handler runs, releases) stay whole. */
#define IDEM_RUNNER_SYNC_START 1u

IDEM_EXPORT void idem_runner_opts_init(idem_runner_opts *o);

/* A runner over store s (which must outlive it). IDEM_EINVAL for bad
 * options, IDEM_ENOMEM. */
IDEM_EXPORT int idem_runner_new(idem_store *s, const idem_runner_opts *o,
                                idem_runner **out);

/* Process msgs[0..n) as described above. *committed (may be NULL) is
 * the number of messages whose outcome was committed: n on success.
 * Returns 0, the handler's or commit()'s error, IDEM_ESTOPPED (the stop
 * hook asked for it), or a store error (then see idem_errdetail() of the
 * store). */
IDEM_EXPORT int idem_runner_batch(idem_runner *r, idem_msg *msgs, size_t n,
                                  size_t *committed);

/* Called by a handler while it works (see idem_handler_fn), from the
 * thread that runs idem_runner_batch(): records the answers given so
 * far, renews the leases of the batch's claims when a third of the lease
 * has passed, and commits the answered prefix (calling commit()) when
 * commit_interval_ms has passed since the last commit. Returns 0, or a
 * store or commit() error: the handler should then stop and return it.
 * Outside a handler call, and from commit(), it does nothing and returns
 * 0. */
IDEM_EXPORT int idem_runner_tick(idem_runner *r);

/* Called by a handler, like idem_runner_tick(), for a long effect: the
 * claim of task `index` (idem_task.index) is renewed for ms from now
 * (at most the record TTL; *granted, may be NULL, receives the time
 * given), and the renewals every third of the lease leave it alone until
 * a lease is left of it. So a worker that dies meanwhile keeps the key
 * from others for that long. A claim lost meanwhile is dropped as in a
 * renewal. 0, IDEM_EINVAL outside a handler call, or a store error. */
IDEM_EXPORT int idem_runner_extend(idem_runner *r, size_t index, int64_t ms,
                                   int64_t *granted);

IDEM_EXPORT void idem_runner_free(idem_runner *r);

/* ------------------------------------------------------------------------
 * Export and import: every live record out, and back in. */

/* Called by idem_scan() for each live record. key and rec (and rec->data)
 * are valid during the call only. Return 0 to go on; anything else stops
 * the scan, and idem_scan() returns it. */
typedef int (*idem_scan_fn)(void *ctx, const void *key, size_t keylen,
                            const idem_record *rec);

/* Visit every live (unexpired) record once, in no particular order.
 * fn must not call functions on s. Returns 0, fn's nonzero answer, or an
 * error. Checkpoints are not records and are not visited. */
IDEM_EXPORT int idem_scan(idem_store *s, idem_scan_fn fn, void *ctx);

/* Write *rec as key's record, replacing any live one: what a restore of
 * an idem_scan() export needs, since the protocol calls would renumber
 * tokens and restart clocks. Uses state, token (1 to IDEM_TOKEN_MAX),
 * attempts (0 is taken as 1), released, created_ms, expires_ms,
 * lease_until, fp/has_fp and data/len. Later claims of any key give
 * tokens above an imported one on local: and mem:, and of this key on
 * Redis. A record already expired is not written and the call returns 0.
 * Does not sync. IDEM_EINVAL for an impossible record (token 0 or above
 * IDEM_TOKEN_MAX, a state out of range). */
IDEM_EXPORT int idem_import(idem_store *s, const void *key, size_t keylen,
                            const idem_record *rec);

/* ------------------------------------------------------------------------
 * Upkeep */

/* Expire records: look at no more than max_work index entries (0: all),
 * remove the expired ones, drop whole segments whose records are all dead
 * and copy the few live records out of the oldest mostly-dead segment.
 * The index walk is bounded by max_work, so a runner can call it between
 * batches; dropping a segment is one unlink, and copying survivors out
 * costs at most a segment's worth of reads. Commits (syncs) whatever was
 * pending first. *expired (may be NULL) receives how many records were
 * removed. IDEM_EINVAL on a store opened with IDEM_O_READONLY. */
IDEM_EXPORT int idem_sweep(idem_store *s, size_t max_work, uint64_t *expired);

/* Counters and gauges of a store. */
typedef struct idem_stats {
    uint64_t live_keys;        /* records in the index, incl. expired ones
                                * no sweep has removed yet, plus
                                * cold_keys */
    uint64_t pending, done, failed;  /* live (unexpired) records by state
                                * (local:, mem:: of the hot keys) */
    uint64_t segments;         /* log segments (files for local:) */
    uint64_t disk_bytes;       /* bytes in segments, incl. buffered */
    uint64_t index_bytes;      /* RAM held by the index */
    int64_t oldest_ms, newest_ms;    /* times of oldest/newest segment */
    uint64_t expired_total;    /* records removed by sweeps */
    uint64_t segments_dropped; /* whole segments dropped */
    uint64_t records_copied;   /* records moved by compaction */
    /* Fields are only ever added here, at the end, and only
     * idem_stats_read() fills them: a program built before they were
     * added passes idem_stats_get() a struct that ends here. The rest is
     * the local: engine's hot budget (docs/internals.md, "Cold
     * segments"). */
    uint64_t hot_keys;         /* keys in the RAM index */
    uint64_t cold_keys;        /* keys in cold segments (at most) */
    uint64_t cold_segments;    /* segments whose keys left RAM */
    uint64_t cold_index_bytes; /* their Bloom filters (file pages) and
                                * the one in front of them all (RAM) */
    uint64_t cold_lookups;     /* lookups RAM did not answer */
    uint64_t filter_probes;    /* filter blocks read by those: the one
                                * in front, then on a maybe those of
                                * runs and groups (a stripe answers for
                                * their 16 members at once) and of cold
                                * segments with no group */
    uint64_t index_searches;   /* filter hits: key indexes searched */
    uint64_t filter_false_positives;  /* filter hits the index denied (or,
                                       * for the one in front, that no
                                       * cold segment held) */
    uint64_t cold_reads;       /* frames read from cold segments */
    uint64_t cold_rebuilt;     /* key indexes built again at open */
    uint64_t cold_front_bytes; /* of cold_index_bytes, the filter in
                                * front: the RAM a cold key costs (a
                                * reader maps it from PATH/COLD) */
    uint64_t filters_asked;    /* filters asked whether a segment holds
                                * a key: each cold segment's own, and
                                * each segment a group's stripe answers
                                * for (the filter in front is asked once
                                * a cold lookup) */
    uint64_t front_false_positives; /* of filter_false_positives, the
                                * filter in front's */
} idem_stats;

/* Fill *out up to records_copied, the fields idem_stats had when this
 * function came (the rest is left as it was). Counting by state visits
 * every entry: O(keys). */
IDEM_EXPORT int idem_stats_get(idem_store *s, idem_stats *out);

/* Fill the first size bytes of *out, every field up to there, so that
 * the struct can grow: call it with sizeof *out. IDEM_EINVAL if size is
 * less than idem_stats_get() fills. */
IDEM_EXPORT int idem_stats_read(idem_store *s, idem_stats *out,
                                size_t size);

/* ------------------------------------------------------------------------
 * Metrics: what a handle has done, for Prometheus or any monitor.
 *
 * Every handle keeps counters and histograms of its calls from the moment
 * it opens: claims by outcome, completions, failures, lost leases, errors
 * by code, how long syncs and claim batches took, and, for a runner over
 * it, messages by result and how long the handler took. They cost a few
 * plain loads and stores per call (no lock, no atomic read-modify-write):
 * a handle has one writer at a time, so each counter is kept with relaxed
 * atomic loads and stores that another thread may read whole at any
 * moment. The gauges (live keys, bytes, segments) are refreshed, in O(1),
 * when the handle opens and at every sync of a local: or mem: store.
 *
 * idem_metrics_get() is the one call on a handle that is thread-safe: a
 * monitoring thread may read a handle that another thread is using. The
 * values it reads are each exact but not one instant's: a claim counted
 * may not be in a histogram yet. idem_metrics_format() turns the figures
 * into the Prometheus text format (names in docs/monitoring.md), so that
 * a program can serve them from its own endpoint. */

#define IDEM_METRICS_BUCKETS 16  /* finite histogram buckets */
/* Their upper bounds in seconds, the same for every histogram. */
#define IDEM_METRICS_BOUNDS                                                \
    {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,     \
     0.1, 0.25, 0.5, 1, 2.5, 5, 10}
#define IDEM_METRICS_CODES 33    /* errors[-code]: IDEM_E* codes 0..-32 */

/* A histogram of durations, cumulative as Prometheus has it: le[i] counts
 * the observations <= bound i (IDEM_METRICS_BOUNDS); count all of them
 * (the +Inf bucket); sum is their total in seconds. */
typedef struct idem_histogram {
    uint64_t le[IDEM_METRICS_BUCKETS];
    uint64_t count;
    double sum;
} idem_histogram;

/* Results of the runner's messages (idem_metrics.messages), as the label
 * result of idem_messages_total names them. */
enum {
    IDEM_MR_DONE,        /* IDEM_MSG_DONE */
    IDEM_MR_FAILED,      /* IDEM_MSG_FAILED */
    IDEM_MR_GAVE_UP,     /* IDEM_MSG_GAVE_UP */
    IDEM_MR_REPLAY,      /* IDEM_MSG_REPLAY and IDEM_MSG_REPLAY_FAILED */
    IDEM_MR_DUPLICATE,   /* IDEM_MSG_DUPLICATE */
    IDEM_MR_INVALID,     /* IDEM_MSG_INVALID */
    IDEM_MR_DEAD_LETTER, /* never counted by the library: a program that
                          * sets poison messages aside moves them here
                          * (from failed) before it formats */
    IDEM_MR_COUNT
};

/* What a Redis server reports of itself (INFO), per master node; -1 for
 * a figure the server did not report. */
typedef struct idem_server_metrics {
    char node[128];             /* "host:port" */
    int64_t evicted_keys;       /* keys evicted for maxmemory */
    int64_t used_memory_bytes;
    int64_t keyspace_hits, keyspace_misses;
} idem_server_metrics;

/* A handle's figures. Initialise with idem_metrics_init(): the struct may
 * grow, and the library fills only the fields of the version the caller
 * was built with. */
typedef struct idem_metrics {
    unsigned version;          /* set by idem_metrics_init() */
    uint64_t claims[5];        /* claims by outcome: [kind - 1] of
                                * IDEM_NEW .. IDEM_MISMATCH */
    uint64_t completions;      /* records completed (DONE), IDEM_CLAIM_DONE
                                * claims included */
    uint64_t failures_permanent, failures_retryable;  /* idem_fail() */
    uint64_t takeovers;        /* NEW claims of a key whose holder's lease
                                * ran out (local: and mem:; 0 on Redis,
                                * whose scripts do not tell) */
    uint64_t lost;             /* IDEM_ELOST answers: leases lost */
    uint64_t errors[IDEM_METRICS_CODES]; /* calls and keys that failed,
                                * by code: errors[-IDEM_EIO], ...
                                * (IDEM_ENOTFOUND of a lookup is an
                                * answer, not counted) */
    idem_histogram sync_duration;        /* idem_sync() and batch syncs;
                                          * a started sync from its start
                                          * to its idem_sync_wait() */
    idem_histogram claim_batch_duration; /* idem_claim_many() calls */
    int64_t live_keys;         /* index entries (idem_stats.live_keys), */
    int64_t store_bytes;       /* bytes in segments, */
    int64_t segments;          /* segments: -1 where not known (Redis) */
    uint64_t expired_total;    /* records removed by sweeps */
    /* Of idem_runner_batch() over this handle, per committed message: */
    uint64_t messages[IDEM_MR_COUNT];
    idem_histogram handler_duration;     /* one per handler call */
    /* Filled by the caller, never by the library: */
    int64_t source_lag;        /* messages the source holds unread; -1
                                * (idem_metrics_init()): unknown */
    const idem_server_metrics *servers;  /* idem_server_metrics_get() */
    size_t nservers;
} idem_metrics;

/* Fill *m with zeros and the version (NULL: nothing to do). */
IDEM_EXPORT void idem_metrics_init(idem_metrics *m);

/* Copy s's figures into *m (initialised by idem_metrics_init(); its
 * source_lag, servers and nservers are left as they are). Thread-safe,
 * even against calls on s in another thread; s must stay open during the
 * call. Returns 0, or IDEM_EINVAL (s or m NULL, m not initialised). */
IDEM_EXPORT int idem_metrics_get(const idem_store *s, idem_metrics *m);

/* Ask each master node of a Redis store for its INFO figures: up to max
 * of them into out, *n set to how many nodes there are (more than max:
 * the rest are left out). A local: or mem: store has none (*n = 0). Not
 * on any hot path: one round trip per node, within the store's
 * timeout_ms. A call on s like any other (one thread at a time): a
 * monitoring thread opens a handle of its own (IDEM_O_READONLY) for it.
 * Returns 0, IDEM_EINVAL, or a store error (ECONN, ETIMEOUT, ...). */
IDEM_EXPORT int idem_server_metrics_get(idem_store *s,
                                        idem_server_metrics *out, size_t max,
                                        size_t *n);

/* Render m in the Prometheus text exposition format (version 0.0.4):
 * each family once, with # HELP and # TYPE, every sample labelled
 * job="JOB" (left out when job is NULL) and store="STORE", the URI
 * with its passwords hidden (idem_uri_display(); NULL is the default
 * store), never a key; idem_build_info{version="..."} 1 first, the Redis
 * server gauges per node last. Writes at most size bytes to buf
 * (NUL-terminated, cut short if need be; buf may be NULL when size is
 * 0) and returns the length of the whole rendering, as snprintf() does:
 * call again with a buffer of that length + 1 when it did not fit.
 * Thread-safe. */
IDEM_EXPORT size_t idem_metrics_format(const idem_metrics *m,
                                       const char *job, const char *store,
                                       char *buf, size_t size);

/* A report of idem_check()/idem_repair(). */
typedef struct idem_check_report {
    uint64_t segments;         /* segment files looked at (Redis: keys) */
    uint64_t records;          /* valid records found */
    uint64_t damaged;          /* damaged regions found (Redis: records
                                * idem cannot read; repair deletes them) */
    uint64_t bytes_lost;       /* repair: bytes not salvaged */
    char first_damage[256];    /* where the first damage is, or "" */
} idem_check_report;

/* Verify every checksum of the local store at uri without changing it.
 * Returns 0 if clean, IDEM_ECORRUPT if damaged (see report),
 * IDEM_EVERSION if a newer idem wrote a segment or record (not damage;
 * report's first_damage names it), or another error. The store must
 * not be open elsewhere. It reports exactly what idem_open() refuses:
 * damage before the end PATH/TAIL records, a missing or cut segment,
 * damage in a sealed segment or followed by committed data; a torn tail
 * past the recorded end is no damage.
 *
 * A redis://, redis-cluster:// or redis-sentinel:// uri is read through
 * a read-only handle while others use it, and counts in damaged the
 * records that make every claim of their key fail: a key under the
 * prefix that is not a hash, a token that is not a positive integer, a
 * day-layout bucket field that is not a packed record. idem_repair()
 * deletes those, and only those. mem: gives IDEM_ENOTSUP; NULL or "" is
 * local:./idem-data. */
IDEM_EXPORT int idem_check(const char *uri, idem_check_report *report);

/* Rewrite each damaged segment of the store at uri keeping every valid
 * record; the damaged bytes are lost. A torn tail is cut, a bad segment
 * header rewritten, a gap left by a lost segment file closed, a damaged
 * identity file replaced, and PATH/TAIL written anew for the segments
 * that are left, so that the store opens. Returns 0 and fills report, or
 * IDEM_ENOTSUP (mem:), IDEM_ENOTFOUND, IDEM_ELOCKED, IDEM_EIO,
 * IDEM_ENOSPC, IDEM_ENOMEM, or IDEM_EVERSION for a segment or record of a
 * newer format (a newer idem wrote it: that is not damage; a segment of a
 * newer header version is refused before anything changes). The store
 * must not be open elsewhere. */
IDEM_EXPORT int idem_repair(const char *uri, idem_check_report *report);

#include "idem/keys.h"

#ifdef __cplusplus
}
#endif
#endif
