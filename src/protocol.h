/* protocol.h - the claim protocol as pure functions over a record.
 *
 * The decision table of the claim protocol (README, "The protocol") lives
 * here and nowhere else for the embedded engine: given the current record
 * of a key (or none), the time, and the request, it says what to answer
 * and what the record becomes. No I/O, no allocation: easy to test
 * exhaustively, and a server backend's scripts can mirror it line by
 * line. */
#ifndef IDEM_PROTOCOL_H
#define IDEM_PROTOCOL_H

#include <stdint.h>

#include "idem/idem.h"

/* A record without its key and value bytes. */
typedef struct idem__rec {
    uint8_t state;        /* idem_state */
    uint8_t has_fp;
    uint8_t released;     /* PENDING given up by a retryable failure */
    uint32_t attempts;    /* claims granted since the record was made */
    uint64_t token;       /* the holder's fencing token (see below) */
    int64_t created;      /* ms of the claim that created the record */
    int64_t expires;      /* ms; at and after this the record is absent */
    int64_t lease;        /* ms; PENDING: the holder's lease runs out */
    uint8_t fp[IDEM_FP_LEN];
} idem__rec;

/* Is the record alive at `now`? Expired records are absent to every call. */
static inline int idem__rec_live(const idem__rec *r, int64_t now)
{
    return now < r->expires;
}

/* Decide a claim. cur is the key's live record or NULL. On NEW, *next is
 * the record to write, with token max(cur's + 1, min_token); otherwise
 * the record stays as it is. out->kind, token, attempts and lease_until
 * are set; data is the caller's job.
 *
 * min_token is the caller's floor: at least the clock in microseconds,
 * and above every token the store issued (as far as it knows). That is
 * what keeps a key's tokens growing when its record is gone (expired,
 * forgotten): cur + 1 alone would start again at 1. */
void idem__decide_claim(const idem__rec *cur, const uint8_t *fp, int64_t now,
                        int64_t lease_ms, int64_t ttl_ms, uint64_t min_token,
                        idem__rec *next, idem_outcome *out);

/* May `token` finish (complete, fail, extend) the live record cur (or
 * NULL)? 0 or IDEM_ELOST. */
int idem__may_finish(const idem__rec *cur, uint64_t token);

#endif
