/* protocol.c - what a claim answers, and who may finish a claim.
 *
 * Invariants kept by these rules:
 *  - a key has at most one holder: NEW is only given when there is no
 *    live record, or the PENDING holder's lease has run out or was given
 *    up, and then with a token greater than every earlier one of the key,
 *    even one whose record has expired or was forgotten since (the
 *    caller's min_token covers those);
 *  - only the current token can finish a claim, so a worker that lost its
 *    lease cannot overwrite the outcome of the one that took over;
 *  - DONE and FAILED are final until they expire or are forgotten;
 *  - a key reused with another payload is never silently accepted: if both
 *    the record and the claim carry a fingerprint and they differ, the
 *    answer is MISMATCH whatever the state. */
#include "protocol.h"

#include <string.h>

static int idem__fp_differs(const idem__rec *cur, const uint8_t *fp)
{
    return fp && cur->has_fp && memcmp(cur->fp, fp, IDEM_FP_LEN) != 0;
}

static void idem__new_record(const idem__rec *cur, const uint8_t *fp,
                             int64_t now, int64_t lease_ms, int64_t ttl_ms,
                             uint64_t min_token, idem__rec *next)
{
    memset(next, 0, sizeof *next);
    next->state = IDEM_STATE_PENDING;
    next->token = cur && cur->token >= min_token ? cur->token + 1
                                                 : min_token;
    next->attempts = cur ? cur->attempts + 1 : 1;
    next->created = cur ? cur->created : now;
    next->lease = now + lease_ms;
    next->expires = now + ttl_ms;
    /* A takeover must not shorten the life the first claim was given. */
    if (cur && cur->expires > next->expires)
        next->expires = cur->expires;
    /* Nor may the record die while its lease runs (as extend keeps it):
     * an absent record is NEW to anyone, a second holder. */
    if (next->expires < next->lease)
        next->expires = next->lease;
    if (fp) {
        next->has_fp = 1;
        memcpy(next->fp, fp, IDEM_FP_LEN);
    } else if (cur && cur->has_fp) {
        next->has_fp = 1;
        memcpy(next->fp, cur->fp, IDEM_FP_LEN);
    }
}

void idem__decide_claim(const idem__rec *cur, const uint8_t *fp, int64_t now,
                        int64_t lease_ms, int64_t ttl_ms, uint64_t min_token,
                        idem__rec *next, idem_outcome *out)
{
    out->data = NULL;
    out->len = 0;
    out->lease_until = 0;
    if (cur && idem__fp_differs(cur, fp)) {
        out->kind = IDEM_MISMATCH;
        out->token = cur->token;
        out->attempts = cur->attempts;
        return;
    }
    if (cur && cur->state == IDEM_STATE_DONE) {
        out->kind = IDEM_REPLAY;
    } else if (cur && cur->state == IDEM_STATE_FAILED) {
        out->kind = IDEM_FAILED;
    } else if (cur && !cur->released && now < cur->lease) {
        out->kind = IDEM_BUSY;
        out->lease_until = cur->lease;
    } else {
        idem__new_record(cur, fp, now, lease_ms, ttl_ms, min_token, next);
        out->kind = IDEM_NEW;
        out->token = next->token;
        out->attempts = next->attempts;
        out->lease_until = next->lease;
        return;
    }
    out->token = cur->token;
    out->attempts = cur->attempts;
}

int idem__may_finish(const idem__rec *cur, uint64_t token)
{
    if (!cur || cur->state != IDEM_STATE_PENDING || cur->released ||
        cur->token != token)
        return IDEM_ELOST;
    return 0;
}
