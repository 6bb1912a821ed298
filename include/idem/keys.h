/* idem/keys.h - idempotency keys: how to make them, how to read them back.
 *
 * Included by idem/idem.h; do not include it on its own.
 *
 * A key names one logical operation. It must be the same on every
 * redelivery of a message and different for every other operation. There
 * are two ways to get one, and the choice matters:
 *
 *   MINTED where the operation starts (the producer), carried in the
 *   message, and read by every consumer. Any unique ID will do:
 *
 *     uuid4       122 random bits. No order, no clock, no coordination.
 *     uuid7       Unix milliseconds + a counter + random bits: sorts by
 *                 creation time, so stores and logs keep related keys
 *                 together. Strictly increasing within a process.
 *     snowflake   a 63-bit integer: milliseconds since an epoch, a 10-bit
 *                 node and a 12-bit sequence. Fits in a BIGINT column.
 *                 Needs a node number unique among running generators.
 *
 *   DERIVED from the message itself by every consumer, when the producer
 *   sends no key:
 *
 *     bizkey      "prefix:id:hash": a business prefix ("order"), the
 *                 business ID ("A-1001") and the first N hex digits of
 *                 SHA-256(payload) or HMAC-SHA256(secret, payload). The
 *                 same message always yields the same key.
 *
 * A fingerprint is not a key: it is a 128-bit digest of the payload stored
 * with a claim, so that a key reused for a different payload is caught
 * (IDEM_MISMATCH) instead of silently replaying the wrong response.
 *
 * THREADS AND FORK
 *
 * idem_uuid4(), idem_uuid7(), the uuid7 and snowflake generators and every
 * decoder are thread-safe. A bizkey generator may be used by one thread at
 * a time (make one per thread; they are cheap). Random bits are buffered
 * per thread; a child created by fork() discards the buffer it inherited,
 * so parent and child never hand out the same random bits. (A child made
 * by a raw clone(2) system call, bypassing fork(), is not detected.)
 *
 * NULL POINTERS
 *
 * As in idem.h: a NULL out-parameter, generator or text where a function
 * returns an int is IDEM_EINVAL, never a crash (idem_uuid7_gen_next()
 * takes a NULL generator for the process-wide one). The functions that
 * return nothing or a length (idem_uuid_format(), idem_uuid_version(),
 * idem_uuid7_unix_ms(), idem_snowflake_format(), idem_fingerprint(),
 * idem_fingerprint_hex()) have no way to report one: their pointers must
 * not be NULL. The free and close functions take NULL.
 *
 * TEXT FORMS
 *
 *     uuid4      0b6f3a2e-6d8c-4f5e-9a1b-2c3d4e5f6a7b   36 chars, lowercase
 *     uuid7      01936d2b-8c41-7a3f-8e2d-5b7c9a1e3f40   36 chars, lowercase
 *     snowflake  119587103542349824                     1..19 decimal digits
 *     bizkey     order:A-1001:9f86d081884c7d65          prefix:id:hash
 *
 * All of them are valid idem store keys (1..IDEM_KEY_MAX bytes) and valid
 * inside a Redis hash tag (no braces, no spaces). */
#ifndef IDEM_KEYS_H
#define IDEM_KEYS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* IDEM_ECLOCK (in idem.h's IDEM_ERRNO_MAP, with every other code): the
 * clock is outside what a generator can use: a snowflake clock that went
 * back further than max_wait_ms (or did not come back in time), a clock
 * before the snowflake epoch or past the end of the format's range (41
 * bits of ms: 69 years), a uuid7 clock before 1970 or past 10889. */

/* ------------------------------------------------------------------------
 * UUIDs (RFC 9562) */

#define IDEM_UUID_LEN 16      /* bytes in a binary UUID */
#define IDEM_UUID_STRLEN 36   /* chars in its text form, without the NUL */

/* A version 4 UUID (RFC 9562 section 5.4): 122 bits from getrandom(2),
 * the version nibble 4 and the variant bits 10.
 *
 * Entropy is fetched from the kernel in blocks and buffered per thread,
 * which makes a key cost a memcpy instead of a system call. A forked
 * child throws its inherited buffer away (pthread_atfork), so the two
 * processes never share a value.
 *
 * Returns 0, or IDEM_EIO if getrandom(2) failed (out is then unchanged).
 * Thread-safe. */
IDEM_EXPORT int idem_uuid4(uint8_t out[IDEM_UUID_LEN]);

/* A version 7 UUID (RFC 9562 section 5.7) from the process-wide generator,
 * which reads CLOCK_REALTIME. Same as idem_uuid7_gen_next(NULL, out). */
IDEM_EXPORT int idem_uuid7(uint8_t out[IDEM_UUID_LEN]);

/* A uuid7 generator with its own clock and its own order. Most programs
 * want idem_uuid7(); a private generator is for an injected clock (tests,
 * simulations). */
typedef struct idem_uuid7_gen idem_uuid7_gen;

/* A clock in Unix milliseconds: idem_clock_fn from idem.h. */

/* Options for idem_uuid7_gen_new(). Initialise with idem_uuid7_opts_init(),
 * then change what you need; new fields will get defaults there. */
typedef struct idem_uuid7_opts {
    unsigned version;       /* set by idem_uuid7_opts_init(); do not touch */
    idem_clock_fn clock;    /* NULL: CLOCK_REALTIME */
    void *clock_ctx;        /* passed to clock */
} idem_uuid7_opts;

IDEM_EXPORT void idem_uuid7_opts_init(idem_uuid7_opts *opts);

/* Make a generator. opts may be NULL for the defaults; it is copied.
 * Returns 0 and *out, or IDEM_EINVAL (opts not initialised) or
 * IDEM_ENOMEM, with *out NULL. Free it with idem_uuid7_gen_free(). */
IDEM_EXPORT int idem_uuid7_gen_new(const idem_uuid7_opts *opts,
                                   idem_uuid7_gen **out);

/* Free a generator (NULL is a no-op). No call may be running on it. */
IDEM_EXPORT void idem_uuid7_gen_free(idem_uuid7_gen *g);

/* The next uuid7 of g (NULL: the process-wide generator).
 *
 * LAYOUT (big-endian, 128 bits):
 *
 *     48 bits  unix_ts_ms
 *      4 bits  version, 7
 *     12 bits  counter, high part       (RFC 9562 "rand_a")
 *      2 bits  variant, binary 10
 *      4 bits  counter, low part        (start of "rand_b")
 *     58 bits  random
 *
 * ORDER. Every UUID a generator returns is greater (as bytes, as text) than
 * every one it returned before, from any thread: the timestamp and the
 * 16-bit counter together form one 64-bit number that a compare-and-swap
 * only ever raises (RFC 9562 section 6.2, method 1, with the counter's
 * overflow carried into the timestamp). On a new millisecond the counter
 * starts at a random value below 1024, so at least 64,513 UUIDs fit in
 * each millisecond before the carry; past that rate, and while the wall
 * clock is behind the last timestamp issued (it was stepped back), the
 * timestamp runs ahead of the clock until the clock catches up. So the
 * embedded time is the generation time except under such a step, or a rate
 * over 64 M/s.
 *
 * UNIQUENESS across processes and machines rests on the 58 random bits:
 * two generators that issue the same timestamp and counter collide with
 * odds 2^-58 per pair of such UUIDs.
 *
 * Returns 0; IDEM_EIO if getrandom(2) failed; IDEM_ECLOCK if the clock
 * reads before 1970 or from the year 10889 on (past 48 bits of ms), or the
 * generator has issued its last possible UUID. On error out is unchanged.
 * Thread-safe. */
IDEM_EXPORT int idem_uuid7_gen_next(idem_uuid7_gen *g,
                                    uint8_t out[IDEM_UUID_LEN]);

/* Write u as 36 lowercase characters and a NUL into out. Thread-safe. */
IDEM_EXPORT void idem_uuid_format(const uint8_t u[IDEM_UUID_LEN],
                                  char out[IDEM_UUID_STRLEN + 1]);

/* Parse the 36-character text form (hex digits of either case, hyphens at
 * 8, 13, 18, 23) from text[0..len). Returns 0 and fills out, or
 * IDEM_EINVAL (out unchanged). Any version and variant are accepted: check
 * them with idem_uuid_version(). */
IDEM_EXPORT int idem_uuid_parse(const char *text, size_t len,
                                uint8_t out[IDEM_UUID_LEN]);

/* The version number (0..15) of u if its variant bits are RFC 9562's (10),
 * else -1. */
IDEM_EXPORT int idem_uuid_version(const uint8_t u[IDEM_UUID_LEN]);

/* The Unix milliseconds in a uuid7 (its first 48 bits), or -1 if u is not
 * a version 7, RFC-variant UUID. */
IDEM_EXPORT int64_t idem_uuid7_unix_ms(const uint8_t u[IDEM_UUID_LEN]);

/* ------------------------------------------------------------------------
 * Snowflake IDs
 *
 *     bit 63      0 (so the ID is a positive int64)
 *     bits 62..22 milliseconds since the epoch (41 bits: 69.7 years)
 *     bits 21..12 node (10 bits: 0..1023)
 *     bits 11..0  sequence within the millisecond (12 bits: 0..4095)
 *
 * One generator issues at most 4,096 IDs per millisecond; the 4,097th call
 * in a millisecond waits for the next one. IDs of one generator are
 * strictly increasing. Two generators never collide if their nodes
 * differ; giving every running generator its own node is the caller's job
 * (a host or pod ordinal, a lease in a coordination service).
 *
 * A clock step back of up to max_wait_ms is waited out; a larger one is
 * refused with IDEM_ECLOCK. Never is an ID repeated. Across restarts the
 * same holds only with a state file (a high-water mark, below): without
 * one, a process restarted with a clock behind the last one's can repeat
 * the last one's IDs. */

#define IDEM_SNOWFLAKE_EPOCH_MS 1704067200000LL  /* 2024-01-01T00:00:00Z */
#define IDEM_SNOWFLAKE_NODE_MAX 1023u
#define IDEM_SNOWFLAKE_SEQ_MAX 4095u
#define IDEM_SNOWFLAKE_STRLEN 19   /* most decimal digits, without NUL */

typedef struct idem_snowflake idem_snowflake;

/* Block until the clock reads at least until_ms (Unix ms), or return
 * early: the generator reads the clock again and calls back if need be. A
 * test that injects a clock injects a sleep that moves that clock. */
typedef void (*idem_sleep_fn)(void *ctx, int64_t until_ms);

/* Options for idem_snowflake_new(). Initialise with
 * idem_snowflake_opts_init() (which sets the defaults below), then change
 * what you need. */
typedef struct idem_snowflake_opts {
    unsigned version;       /* set by idem_snowflake_opts_init() */
    unsigned node;          /* 0..1023; default 0 */
    int64_t epoch_ms;       /* Unix ms of ID time 0; default 2024-01-01Z.
                             * Must be >= 0. The decoder needs the same. */
    int64_t max_wait_ms;    /* longest clock step back waited out; beyond
                             * it next() fails with IDEM_ECLOCK. Default
                             * 1000; 0 refuses any step back at once. */
    idem_clock_fn clock;    /* NULL: CLOCK_REALTIME */
    void *clock_ctx;
    idem_sleep_fn sleep;    /* NULL: nanosleep(2) against CLOCK_REALTIME
                             * (with a custom clock: in steps of 1 ms) */
    void *sleep_ctx;
    const char *state_file; /* NULL: none. Else a file holding the high-
                             * water mark; created if absent; copied. */
    int64_t reserve_ms;     /* state file: how far ahead of the issued
                             * time the mark is written, so that a write
                             * (and fdatasync) happens at most once per
                             * this span. Default 200. */
} idem_snowflake_opts;

IDEM_EXPORT void idem_snowflake_opts_init(idem_snowflake_opts *opts);

/* Make a generator.
 *
 * With a state file: the file is opened (created, and its directory
 * synced, if absent) and locked with flock(2) for the generator's life, so
 * that two processes cannot share it. Its mark M (Unix ms) says that IDs
 * up to time M may have been issued: this generator issues only later
 * ones, waiting out a clock behind M as above. While running it keeps the
 * mark reserve_ms ahead of what it issues; idem_snowflake_free() writes
 * the exact last time. A crash therefore costs the next start a wait of at
 * most reserve_ms, which must not exceed max_wait_ms. The file holds two
 * checksummed 64-byte slots written in turn (the mark is their maximum),
 * so a write torn by a crash leaves the other intact.
 *
 * Returns 0 and *out. On failure returns the error and, as idem_open()
 * does, *out is a handle in a closed state whose idem_snowflake_errdetail()
 * says what went wrong (e.g. "state file /x: locked by another process");
 * pass it to idem_snowflake_free(). *out is NULL only on IDEM_ENOMEM.
 *
 * Errors: IDEM_EINVAL (node, epoch, max_wait_ms, reserve_ms, or opts not
 * initialised), IDEM_ELOCKED (the state file is in use), IDEM_ECORRUPT
 * (the state file is not one idem wrote: no valid slot), IDEM_EIO,
 * IDEM_ENOMEM. */
IDEM_EXPORT int idem_snowflake_new(const idem_snowflake_opts *opts,
                                   idem_snowflake **out);

/* The next ID into *id.
 *
 * Waits for the next millisecond after 4,096 IDs in one, and for the clock
 * to catch up after a step back of at most max_wait_ms. Holds the
 * generator's mutex while waiting: other threads queue behind it.
 *
 * Returns 0; IDEM_ECLOCK if the clock is behind the last issued time by
 * more than max_wait_ms, before the epoch, or past the 41-bit range;
 * IDEM_EIO if the state file could not be written (no ID is issued then);
 * IDEM_EINVAL if the handle is in a closed state. The detail says which.
 * After an error the generator stays usable. Thread-safe. */
IDEM_EXPORT int idem_snowflake_next(idem_snowflake *g, uint64_t *id);

/* What went wrong in the last failed call on g, or "". Owned by g. With
 * several threads the text may come from another thread's call. */
IDEM_EXPORT const char *idem_snowflake_errdetail(const idem_snowflake *g);

/* Write the exact high-water mark (if there is a state file), release the
 * file and free g. Returns 0 or IDEM_EIO (g is freed regardless; the mark
 * left in the file is then the reserved one, still safe). NULL: 0. */
IDEM_EXPORT int idem_snowflake_free(idem_snowflake *g);

/* The fields of a snowflake ID. */
typedef struct idem_snowflake_parts {
    int64_t unix_ms;        /* epoch_ms + since_epoch_ms */
    int64_t since_epoch_ms; /* bits 62..22 */
    unsigned node;          /* bits 21..12 */
    unsigned seq;           /* bits 11..0 */
} idem_snowflake_parts;

/* Split id; epoch_ms must be the generator's (the ID does not hold it).
 * Returns 0, or IDEM_EINVAL if bit 63 is set or epoch_ms < 0.
 * Thread-safe. */
IDEM_EXPORT int idem_snowflake_decode(uint64_t id, int64_t epoch_ms,
                                      idem_snowflake_parts *out);

/* Write id in decimal with a NUL; returns the number of digits. An id
 * with bit 63 set is no snowflake ID: out is "" and the result 0. */
IDEM_EXPORT size_t idem_snowflake_format(uint64_t id,
                                         char out[IDEM_SNOWFLAKE_STRLEN + 1]);

/* Parse 1..19 decimal digits (no sign, no spaces; "0" alone is allowed,
 * other leading zeros are not) from text[0..len) into *id, which must fit
 * in 63 bits. Returns 0 or IDEM_EINVAL. */
IDEM_EXPORT int idem_snowflake_parse(const char *text, size_t len,
                                     uint64_t *id);

/* ------------------------------------------------------------------------
 * Business keys: prefix:id:hash
 *
 * prefix  1..64 bytes of  A-Z a-z 0-9 . _ -   starting with a letter or
 *         digit. Names the kind of operation: "order", "refund.v2".
 * id      1..256 bytes of A-Z a-z 0-9 . _ - ~ @ + = /   The business
 *         identifier: an order number, an account, a date.
 * hash    8..64 lowercase hex digits (default 16) of SHA-256(payload), or
 *         of HMAC-SHA256(secret, payload) when a secret is given.
 *
 * No ':' in prefix or id keeps the key splittable; no '{' '}' keeps it
 * usable inside a Redis Cluster hash tag; no spaces or control characters
 * keeps it printable and shell-safe.
 *
 * WHICH HASH. Plain SHA-256 lets anyone who sees a payload compute its
 * key, and anyone who sees a key test guesses of a payload against it.
 * HMAC-SHA256 with a secret shared by the services that derive keys makes
 * keys unpredictable and unforgeable from outside.
 *
 * COLLISION ODDS. Two different payloads under the same prefix:id share a
 * key with probability 16^-N for N hex digits. Among k distinct payloads
 * under one prefix:id, the chance that any two collide is about
 * k^2 / 2 / 16^N:
 *
 *     N (hex)  bits  one pair   k for odds 1e-6   k for odds 1%
 *         8     32   2.3e-10                93           9,300
 *        12     48   3.6e-15            23,700           2.4e6
 *        16     64   5.4e-20             6.1e6           6.1e8
 *        24     96   1.3e-29            4.0e11          4.0e13
 *        32    128   2.9e-39            2.6e16          2.6e18
 *        64    256   8.6e-78            4.8e35          4.8e37
 *
 * The id takes part in the key, not the hash: payloads under different
 * ids never collide. */

#define IDEM_BIZKEY_PREFIX_MAX 64u
#define IDEM_BIZKEY_ID_MAX 256u
#define IDEM_BIZKEY_HASH_MIN 8u
#define IDEM_BIZKEY_HASH_MAX 64u
#define IDEM_BIZKEY_HASH_DEFAULT 16u
/* The longest key, without its NUL: 386 bytes. */
#define IDEM_BIZKEY_MAX                                                   \
    (IDEM_BIZKEY_PREFIX_MAX + 1 + IDEM_BIZKEY_ID_MAX + 1 +                \
     IDEM_BIZKEY_HASH_MAX)

typedef struct idem_bizkey_gen idem_bizkey_gen;

/* Options for idem_bizkey_gen_new(). Initialise with
 * idem_bizkey_opts_init(). */
typedef struct idem_bizkey_opts {
    unsigned version;       /* set by idem_bizkey_opts_init() */
    unsigned hash_len;      /* hex digits, 8..64; default 16 */
    const void *hmac_key;   /* NULL: plain SHA-256. Else the HMAC secret, */
    size_t hmac_key_len;    /* 1.. bytes; copied by idem_bizkey_gen_new() */
} idem_bizkey_opts;

IDEM_EXPORT void idem_bizkey_opts_init(idem_bizkey_opts *opts);

/* Make a bizkey generator: it keeps the OpenSSL digest (and, with a
 * secret, the keyed HMAC state) ready, so each key costs one hash of the
 * payload. Returns 0 and *out; or the error with *out a handle in a closed
 * state whose idem_bizkey_gen_errdetail() says what went wrong (free it with
 * idem_bizkey_gen_free()), NULL only on IDEM_ENOMEM.
 *
 * Errors: IDEM_EINVAL (hash_len outside 8..64, an empty secret, opts not
 * initialised), IDEM_ENOMEM, IDEM_EIO (OpenSSL could not provide SHA-256
 * or HMAC, e.g. a FIPS provider configuration that refuses them). */
IDEM_EXPORT int idem_bizkey_gen_new(const idem_bizkey_opts *opts,
                                    idem_bizkey_gen **out);

/* Free g and wipe its secret (NULL is a no-op). */
IDEM_EXPORT void idem_bizkey_gen_free(idem_bizkey_gen *g);

/* Write "prefix:id:hash" and a NUL into out (outsz bytes; a buffer of
 * IDEM_BIZKEY_MAX + 1 always fits) and its length, without the NUL, into
 * *outlen (may be NULL). payload may be NULL when len is 0.
 *
 * Returns 0; IDEM_EINVAL for an invalid prefix or id (the detail names the
 * first bad character) or an out too small (then *outlen, if given, is
 * the length needed and out is untouched); IDEM_EIO if OpenSSL failed.
 * One thread at a time per generator. */
IDEM_EXPORT int idem_bizkey_gen_make(idem_bizkey_gen *g, const char *prefix,
                                     const char *id, const void *payload,
                                     size_t len, char *out, size_t outsz,
                                     size_t *outlen);

/* What went wrong in the last failed call on g, or "". Owned by g. */
IDEM_EXPORT const char *idem_bizkey_gen_errdetail(const idem_bizkey_gen *g);

/* One key without a generator: idem_bizkey_gen_new(), _make(), _free(). Slower
 * (OpenSSL setup per call) and with no detail; for one-off use. opts may
 * be NULL for SHA-256 with 16 hex digits. Thread-safe. */
IDEM_EXPORT int idem_bizkey(const char *prefix, const char *id,
                            const void *payload, size_t len,
                            const idem_bizkey_opts *opts, char *out,
                            size_t outsz, size_t *outlen);

/* Check a prefix or an id against the rules above without making a key.
 * Returns 0 or IDEM_EINVAL; on IDEM_EINVAL, if why is not NULL, writes a
 * sentence saying what is wrong into why (whysz bytes, NUL-terminated). */
IDEM_EXPORT int idem_bizkey_check_prefix(const char *prefix, char *why,
                                         size_t whysz);
IDEM_EXPORT int idem_bizkey_check_id(const char *id, char *why, size_t whysz);

/* The parts of a bizkey, pointing into the key that was parsed. */
typedef struct idem_bizkey_parts {
    const char *prefix;
    size_t prefix_len;
    const char *id;
    size_t id_len;
    const char *hash;
    size_t hash_len;
} idem_bizkey_parts;

/* Split key[0..len) into its parts, checking each against the rules above
 * (the hash must be 8..64 lowercase hex digits). Returns 0 or IDEM_EINVAL.
 * Whether the hash matches a payload is not checked here: make the key
 * again and compare. Thread-safe. */
IDEM_EXPORT int idem_bizkey_parse(const char *key, size_t len,
                                  idem_bizkey_parts *out);

/* ------------------------------------------------------------------------
 * Payload fingerprints (IDEM_FP_LEN = 16 bytes) */

/* XXH3-128 of payload[0..len), in xxHash's canonical (big-endian) byte
 * order, so that every platform stores the same bytes.
 *
 * Why XXH3 and not SHA-256: a fingerprint is computed for every message,
 * in the hot path of every claim, and guards against *accidents* (a
 * producer that reuses a key for another payload). XXH3 runs at memory
 * speed, tens of GB/s against SHA-256's one or two, and two different
 * payloads share a 128-bit fingerprint with odds 2^-128: a billion reused
 * keys a second for a billion years would not show one. It is not
 * collision-resistant against someone crafting payloads on purpose; where
 * producers are not trusted, use idem_fingerprint_sha256(). The two kinds
 * must not be mixed within one store.
 *
 * Thread-safe; never fails; payload may be NULL when len is 0. */
IDEM_EXPORT void idem_fingerprint(const void *payload, size_t len,
                                  uint8_t out[IDEM_FP_LEN]);

/* SHA-256 of payload[0..len) truncated to its first 16 bytes:
 * collision-resistant (2^64 work to find any pair), at SHA-256's speed.
 * Returns 0, IDEM_EINVAL for a NULL out (or payload NULL with len > 0),
 * or IDEM_EIO if OpenSSL failed (out is then unchanged). Thread-safe. */
IDEM_EXPORT int idem_fingerprint_sha256(const void *payload, size_t len,
                                        uint8_t out[IDEM_FP_LEN]);

/* Write fp as 32 lowercase hex digits and a NUL into out. */
IDEM_EXPORT void idem_fingerprint_hex(const uint8_t fp[IDEM_FP_LEN],
                                      char out[2 * IDEM_FP_LEN + 1]);

#ifdef __cplusplus
}
#endif
#endif
