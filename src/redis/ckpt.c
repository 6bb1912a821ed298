/* redis/ckpt.c - checkpoints on Redis, committed all or nothing with the
 * writes of their batch.
 *
 * local: makes a checkpoint durable in the same commit as the batch's
 * records. Redis has no commit that spans keys of different slots, so
 * the same promise is kept with an intent:
 *
 *   idem_checkpoint_put()  queues the blob in the handle; nothing is sent.
 *   complete, fail         while a checkpoint is queued, each is checked
 *                          at once by the extend script (the token still
 *                          holds the key; its lease is renewed to the
 *                          store's lease_ms, so that it does not run out
 *                          before the sync) and, if it holds, queued.
 *   idem_sync()            1. one script writes the checkpoint key with
 *                             the blob and the queued writes (the intent),
 *                             under WAIT like any write;
 *                          2. the writes are applied, pipelined, each with
 *                             the request id it was queued with;
 *                          3. the intent is dropped from the key.
 *
 * If 1 fails, nothing was applied and the queue is dropped: the records
 * are still PENDING under their leases, and the checkpoint is the old
 * one. Once 1 succeeded, the checkpoint and its writes stand together: a
 * crash before 3 leaves the intent in the key, and whoever reads the
 * checkpoint next (idem_checkpoint_get, any process) applies it first.
 * Applying a write twice answers like the first time (request ids: see
 * scripts.c), so 2 may be repeated any number of times. A queued
 * write that fails at 2 (IDEM_ELOST: its lease ran out and another worker
 * took the key between the check and the sync) is reported by sync with
 * its key; the rest is applied.
 *
 * A write whose key is taken over between 1 and 2 by another worker
 * after a crash is lost to the checkpoint: its lease was renewed at the
 * check, so that needs the crashed process's leases to run out before
 * anyone reads the checkpoint again.
 *
 * One checkpoint (one name) may be queued per sync: a single key in a
 * single slot is what makes step 1 atomic.
 *
 * Writes queued with the checkpoint (idem_checkpoint_write): commands
 * of the caller's own, an XADD of its output or an XACK of its input,
 * that step 1's script runs before it writes the key, so that they, the
 * checkpoint and its intent (the completions) land in one atomic step:
 * a caller whose output is on the store's server needs no read-back of
 * what it wrote before a commit that a crash cut off. They travel as one
 * argument, a msgpack array of arrays of strings (the script unpacks it
 * with cmsgpack), since a batch's commands have far more arguments than
 * a script call of this file takes; on a cluster each key must be in the
 * checkpoint key's slot, the one node that runs the script. Their
 * answers are kept (wreply) until the next sync that runs writes. Sent
 * again after a lost reply, step 1 must not run them twice (an XADD
 * would add a second entry): the script keeps their answers in the key
 * under the sync's id and answers those instead.
 *
 * An intent is a sequence of writes, each: op (1 byte: 'c' complete, 'f'
 * fail, 'r' retryable fail), token (8 bytes), ttl_ms (8), request id
 * length (1) and bytes, key length (4) and bytes, value length (4) and
 * bytes; integers little-endian.
 *
 * On one server with layout hash every record is reachable from step
 * 1's script (no slot to respect, a record named by its key alone), so
 * the completions are not put in the intent: the script applies them
 * itself (IDEM__LUA_CKPT_COMMIT), after the caller's writes and before
 * the key, each checked by its token in the same atomic step. Else the
 * check (the extend script) and the completion (the complete script)
 * read and write every record again in script calls of their own, and
 * the intent is written and removed; for a stream batch that was most
 * of the server's work per key. Their answers come
 * back with the writes' (and are kept under the sync's id with them), a
 * refused one as step 2 reports it. The runner's completions (claims it
 * keeps renewed itself, idem__complete_held) are not even checked
 * before: the script's check is the one that counts. Failures, rare in
 * a batch, still go through the intent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

static idem__redis *idem__r(idem_store *s)
{
    return s->impl;
}

int idem__ckpt_queued(idem_store *s)
{
    return idem__r(s)->ck.name != NULL;
}

int idem__ckpt_folds(const idem__redis *r)
{
    return !r->cfg.cluster && r->cfg.layout == IDEM__LAYOUT_HASH;
}

void idem__ckpt_free(idem__rckpt *ck)
{
    free(ck->name);
    idem__buf_free(&ck->blob);
    idem__buf_free(&ck->intent);
    idem__buf_free(&ck->writes);
    idem__buf_free(&ck->comps);
    memset(ck, 0, sizeof *ck);
}

void idem__ckpt_poison(idem_store *s, int code)
{
    (void)code;
    idem__ckpt_free(&idem__r(s)->ck);
}

/* PREFIX checkpoint:{NAME} into key. 0 or IDEM_ENOMEM. */
static int idem__ckpt_key(idem_store *s, idem__buf *key, const char *name)
{
    idem__redis *r = idem__r(s);
    return idem__buf_append(key, r->cfg.prefix, r->cfg.prefixlen) ||
                   idem__buf_append(key, "checkpoint:{", 12) ||
                   idem__buf_append(key, name, strlen(name)) ||
                   idem__buf_append(key, "}", 1)
               ? idem__fail(s, IDEM_ENOMEM, "out of memory")
               : 0;
}

/* ------------------------------------------------------------------------
 * The intent's encoding */

static int idem__put_le(idem__buf *b, uint64_t v, int bytes)
{
    unsigned char x[8];
    for (int i = 0; i < bytes; i++)
        x[i] = (unsigned char)(v >> (8 * i));
    return idem__buf_append(b, x, (size_t)bytes);
}

int idem__intent_add(idem__buf *b, char op, uint64_t token, int64_t ttl_ms,
                     const char *rid, const void *key, size_t keylen,
                     const void *val, size_t vallen)
{
    size_t ridl = strlen(rid);
    return idem__buf_append(b, &op, 1) || idem__put_le(b, token, 8) ||
                   idem__put_le(b, (uint64_t)ttl_ms, 8) ||
                   idem__put_le(b, ridl, 1) ||
                   idem__buf_append(b, rid, ridl) ||
                   idem__put_le(b, keylen, 4) ||
                   idem__buf_append(b, key, keylen) ||
                   idem__put_le(b, vallen, 4) ||
                   idem__buf_append(b, val, vallen)
               ? IDEM_ENOMEM
               : 0;
}

/* msgpack's array32 or str32 header: tag, then n big-endian. */
static int idem__mp_head(idem__buf *b, unsigned char tag, size_t n)
{
    unsigned char h[5] = {tag, (unsigned char)(n >> 24),
                          (unsigned char)(n >> 16), (unsigned char)(n >> 8),
                          (unsigned char)n};
    return idem__buf_append(b, h, sizeof h);
}

/* One msgpack str32: header and bytes. */
static int idem__mp_str(idem__buf *b, const void *p, size_t n)
{
    return idem__mp_head(b, 0xdb, n) || idem__buf_append(b, p, n);
}

int idem__ckpt_write_cmd(idem_store *s, int argc, const char *const *argv,
                         const size_t *argvlen, int keyidx, size_t *index)
{
    idem__redis *r = idem__r(s);
    idem__rckpt *ck = &r->ck;
    if (s->opts.flags & IDEM_O_READONLY)
        return idem__fail(s, IDEM_EINVAL, "the store was opened read-only");
    if (r->cfg.cluster && ck->name) {
        idem__buf key = {0};
        int rc = idem__ckpt_key(s, &key, ck->name);
        unsigned want = rc ? 0 : idem__key_slot(key.data, key.len);
        idem__buf_free(&key);
        if (rc)
            return rc;
        if (idem__key_slot(argv[keyidx], argvlen[keyidx]) != want)
            return idem__fail(s, IDEM_EINVAL, "%s: key '%.*s' is not in the "
                              "slot of checkpoint '%s': give both one hash "
                              "tag", s->uri,
                              (int)(argvlen[keyidx] > 200 ? 200
                                                          : argvlen[keyidx]),
                              argv[keyidx], ck->name);
    } else if (r->cfg.cluster) {
        return idem__fail(s, IDEM_EINVAL, "%s: on a cluster, put the "
                          "checkpoint before its writes (their slot is its)",
                          s->uri);
    }
    size_t was = ck->writes.len;
    int bad = idem__mp_head(&ck->writes, 0xdd, (size_t)argc);
    for (int i = 0; !bad && i < argc; i++)
        bad = idem__mp_str(&ck->writes, argv[i], argvlen[i]);
    if (bad) {
        ck->writes.len = was;
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    *index = ck->nwrites++;
    return 0;
}

int idem__ckpt_reply(idem_store *s, size_t index, const char **text,
                     size_t *len)
{
    idem__redis *r = idem__r(s);
    if (index >= r->nwreply)
        return idem__fail(s, IDEM_ENOTFOUND, "no answer to queued write %zu "
                          "in the last sync", index);
    const unsigned char *p = r->wreply.data;
    for (size_t i = 0;; i++) {
        size_t n;
        memcpy(&n, p, sizeof n);
        if (i == index) {
            *text = (const char *)p + sizeof n;
            *len = n;
            return 0;
        }
        p += sizeof n + n + 1;
    }
}

/* Keep the answers of step 1's n writes (v: {1, answer...}). */
static int idem__keep_replies(idem_store *s, const redisReply *v,
                              size_t count)
{
    idem__redis *r = idem__r(s);
    for (size_t i = 1; i <= count; i++) {
        const redisReply *e = v->element[i];
        size_t n = e->type == REDIS_REPLY_STRING ? e->len : 0;
        if (idem__buf_append(&r->wreply, &n, sizeof n) ||
            idem__buf_append(&r->wreply, n ? e->str : "", n) ||
            idem__buf_append(&r->wreply, "", 1))
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
        r->nwreply++;
    }
    return 0;
}

/* One decoded write; key and val point into the intent. */
typedef struct idem__iwrite {
    char op;
    uint64_t token;
    int64_t ttl_ms;
    char rid[24];
    const void *key, *val;
    size_t keylen, vallen;
} idem__iwrite;

typedef struct idem__reader {
    const unsigned char *p, *end;
    int bad;
} idem__reader;

static uint64_t idem__get_le(idem__reader *rd, int bytes)
{
    uint64_t v = 0;
    if (rd->end - rd->p < bytes) {
        rd->bad = 1;
        return 0;
    }
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)rd->p[i] << (8 * i);
    rd->p += bytes;
    return v;
}

static const void *idem__get_bytes(idem__reader *rd, size_t n)
{
    const void *p = rd->p;
    if ((size_t)(rd->end - rd->p) < n) {
        rd->bad = 1;
        return NULL;
    }
    rd->p += n;
    return p;
}

/* The next write; 0, or -1 if the intent is not one idem wrote. */
static int idem__intent_next(idem__reader *rd, idem__iwrite *w)
{
    w->op = (char)idem__get_le(rd, 1);
    w->token = idem__get_le(rd, 8);
    w->ttl_ms = (int64_t)idem__get_le(rd, 8);
    size_t ridl = (size_t)idem__get_le(rd, 1);
    const void *rid = idem__get_bytes(rd, ridl);
    w->keylen = (size_t)idem__get_le(rd, 4);
    w->key = idem__get_bytes(rd, w->keylen);
    w->vallen = (size_t)idem__get_le(rd, 4);
    w->val = idem__get_bytes(rd, w->vallen);
    if (rd->bad || ridl == 0 || ridl >= sizeof w->rid || w->token == 0 ||
        w->keylen == 0 || w->keylen > IDEM_KEY_MAX ||
        w->vallen > IDEM_VALUE_MAX || w->ttl_ms <= 0 ||
        (w->op != 'c' && w->op != 'f' && w->op != 'r'))
        return -1;
    memcpy(w->rid, rid, ridl);
    w->rid[ridl] = '\0';
    return 0;
}

/* ------------------------------------------------------------------------
 * Applying an intent (step 2) */

/* The first key whose write was refused, as the detail. */
static void idem__refused(idem_store *s, const void *key, size_t keylen,
                          int code)
{
    char why[sizeof s->detail];
    idem__scopy(why, sizeof why, s->detail);
    idem__fail(s, code, "the write of key '%.*s' queued with the "
               "checkpoint was not applied: %s",
               (int)(keylen > 200 ? 200 : keylen), (const char *)key, why);
}

/* Apply the n writes of an intent (already checked by decoding): the
 * completions in one pipelined batch, then the failures. Returns the
 * error that kept writes unanswered (ECONN, ...), else the first key's
 * own refusal (IDEM_ELOST, IDEM_EPROTO) with its key in the detail, else
 * 0. */
static int idem__intent_apply(idem_store *s, const idem__buf *in, size_t n)
{
    idem__iwrite *w = malloc((n ? n : 1) * sizeof *w);
    idem_completion *c = malloc((n ? n : 1) * sizeof *c);
    const char **rids = malloc((n ? n : 1) * sizeof *rids);
    int *st = calloc(n ? n : 1, sizeof *st);
    int rc = w && c && rids && st ? 0
                                  : idem__fail(s, IDEM_ENOMEM,
                                               "out of memory");
    idem__reader rd = {in->data, in->data + in->len, 0};
    size_t nc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        (void)idem__intent_next(&rd, &w[i]);
        if (w[i].op == 'c') {
            c[nc] = (idem_completion){w[i].key, w[i].keylen, w[i].token,
                                      w[i].val, w[i].vallen, w[i].ttl_ms};
            rids[nc++] = w[i].rid;
        }
    }
    if (!rc && nc)
        rc = idem__redis_complete_run(s, c, nc, st, rids);
    int refused = 0;
    for (size_t i = 0, k = 0; !rc && i < n; i++) {
        int one = w[i].op == 'c'
                      ? st[k++]
                      : idem__redis_fail_run(s, w[i].key, w[i].keylen,
                                             w[i].token, w[i].val,
                                             w[i].vallen, w[i].op == 'r',
                                             w[i].ttl_ms, w[i].rid);
        if (one == IDEM_ELOST || one == IDEM_EPROTO) {
            if (!refused)
                idem__refused(s, w[i].key, w[i].keylen, one);
            refused = refused ? refused : one;
        } else if (one) {
            rc = one;
        }
    }
    free(w);
    free(c);
    free(rids);
    free(st);
    return rc ? rc : refused;
}

/* ------------------------------------------------------------------------
 * The checkpoint key */

/* One script on PREFIX checkpoint:{NAME}: begin it. */
static int idem__ckpt_begin(idem_store *s, idem__one *one, int script,
                            const char *name)
{
    idem__buf key = {0};
    int rc = idem__ckpt_key(s, &key, name);
    if (!rc)
        rc = idem__one_begin(s, one, script, key.data, key.len);
    idem__buf_free(&key);
    return rc;
}

/* The checkpoint as the server has it: ENOTFOUND, EPROTO (not what idem
 * writes), or 0 with *rep (its reply) owned by one. */
static int idem__ckpt_read(idem_store *s, idem__one *one, const char *name,
                           const redisReply **rep)
{
    int rc = idem__ckpt_begin(s, one, IDEM__S_CKPT_GET, name);
    if (rc) {
        one->b = NULL;
        return rc;
    }
    rc = idem__one_run(s, one, 0);
    const redisReply *v = rc ? NULL : one->it->reply;
    if (!rc && v->type == REDIS_REPLY_NIL)
        rc = idem__fail(s, IDEM_ENOTFOUND, "no checkpoint named '%s'", name);
    else if (!rc && (v->type != REDIS_REPLY_ARRAY || v->elements < 2 ||
                     v->element[0]->type != REDIS_REPLY_STRING ||
                     v->element[1]->type != REDIS_REPLY_STRING))
        rc = idem__fail(s, IDEM_EPROTO, "%s: unexpected reply to a "
                        "checkpoint read", s->uri);
    else if (!rc && strcmp(v->element[0]->str, "ok") != 0)
        rc = idem__fail(s, IDEM_EPROTO, "%s: checkpoint '%s' is %s: not a "
                        "checkpoint idem wrote; delete %.*s or use another "
                        "name", s->uri, name, v->element[1]->str,
                        (int)one->it->name_len,
                        (const char *)one->b->names.data);
    else if (!rc && (v->elements != 4 ||
                     v->element[2]->type != REDIS_REPLY_STRING ||
                     v->element[3]->type != REDIS_REPLY_STRING))
        rc = idem__fail(s, IDEM_EPROTO, "%s: unexpected reply to a "
                        "checkpoint read", s->uri);
    *rep = v;
    return rc;
}

/* Count the writes of an intent; -1 if it is not one idem wrote. */
static long idem__intent_count(const idem__buf *in)
{
    idem__reader rd = {in->data, in->data + in->len, 0};
    idem__iwrite w;
    long n = 0;
    while (rd.p < rd.end) {
        if (idem__intent_next(&rd, &w))
            return -1;
        n++;
    }
    return n;
}

/* Step 3: the intent is applied; drop it unless replaced meanwhile. A
 * failure here is harmless (the next reader applies it again, and the
 * writes answer as before), so it is not reported. */
static void idem__ckpt_clear(idem_store *s, const char *name,
                             const char *iid, size_t iidlen)
{
    idem__one one;
    char keep[sizeof s->detail];
    idem__scopy(keep, sizeof keep, s->detail);
    if (!idem__ckpt_begin(s, &one, IDEM__S_CKPT_CLEAR, name)) {
        idem__arg(one.it, iid, iidlen);
        (void)idem__one_run(s, &one, 1);
        idem__one_end(&one);
    }
    idem__scopy(s->detail, sizeof s->detail, keep);
}

/* Apply the intent of a checkpoint read from the server, then drop it.
 * Writes refused by their keys (lost leases) stay refused whoever
 * applies them, so only errors that kept writes unanswered count. */
static int idem__ckpt_settle(idem_store *s, const char *name,
                             const redisReply *rep)
{
    const redisReply *in = rep->element[2], *iid = rep->element[3];
    if (in->len == 0)
        return 0;
    idem__buf b = {(unsigned char *)in->str, in->len, in->len};
    long n = idem__intent_count(&b);
    if (n < 0)
        return idem__fail(s, IDEM_EPROTO, "%s: checkpoint '%s' holds writes "
                          "idem did not write", s->uri, name);
    int rc = idem__intent_apply(s, &b, (size_t)n);
    if (rc && rc != IDEM_ELOST && rc != IDEM_EPROTO)
        return rc;
    idem__ckpt_clear(s, name, iid->str, iid->len);
    return 0;
}

int idem__ckpt_get(idem_store *s, const char *name, const void **blob,
                   size_t *len)
{
    idem__rckpt *ck = &idem__r(s)->ck;
    if (ck->name && strcmp(ck->name, name) == 0) {
        *blob = idem__out_keep(s, ck->blob.data, ck->blob.len);
        *len = ck->blob.len;
        return *blob ? 0 : idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    idem__one one;
    const redisReply *rep = NULL;
    int rc = idem__ckpt_read(s, &one, name, &rep);
    if (!rc)
        rc = idem__ckpt_settle(s, name, rep);
    if (!rc) {
        *blob = idem__out_keep(s, rep->element[1]->str, rep->element[1]->len);
        *len = rep->element[1]->len;
        if (!*blob)
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    if (one.b)
        idem__one_end(&one);
    return rc;
}

int idem__ckpt_put(idem_store *s, const char *name, const void *blob,
                   size_t len)
{
    idem__rckpt *ck = &idem__r(s)->ck;
    if (s->opts.flags & IDEM_O_READONLY)
        return idem__fail(s, IDEM_EINVAL, "the store was opened read-only");
    if (ck->name && strcmp(ck->name, name) != 0)
        return idem__fail(s, IDEM_EINVAL, "%s: checkpoint '%s' is queued "
                          "already: a Redis store commits one checkpoint "
                          "per sync", s->uri, ck->name);
    if (!ck->name && !(ck->name = idem__strdup(name)))
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    ck->blob.len = 0;
    if (idem__buf_append(&ck->blob, blob, len)) {
        idem__ckpt_free(ck);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Checks (while a checkpoint is queued) */

/* A completion for the one script to apply: its record, token,
 * response, TTL and request id, as IDEM__LUA_CKPT_COMMIT reads them. */
static int idem__comp_add(idem__redis *r, idem__buf *b, uint64_t token,
                          int64_t ttl_ms, const char *rid,
                          const idem_completion *c)
{
    char tok[24], ttl[24];
    int nt = snprintf(tok, sizeof tok, "%llu", (unsigned long long)token);
    int nl = snprintf(ttl, sizeof ttl, "%lld", (long long)ttl_ms);
    size_t was = b->len;
    int bad = idem__mp_head(b, 0xdb, r->cfg.prefixlen + c->keylen + 2) ||
              idem__record_name(r, b, c->key, c->keylen) ||
              idem__mp_str(b, tok, (size_t)nt) ||
              idem__mp_str(b, c->response, c->len) ||
              idem__mp_str(b, ttl, (size_t)nl) ||
              idem__mp_str(b, rid, strlen(rid));
    if (bad)
        b->len = was;
    return bad ? IDEM_ENOMEM : 0;
}

int idem__ckpt_hold_completes(idem_store *s, const idem_completion *items,
                              size_t n, int *st, int check)
{
    idem__redis *r = idem__r(s);
    idem__rckpt *ck = &r->ck;
    int fold = idem__ckpt_folds(r);
    int rc = check ? idem__redis_extend_many(s, items, n, s->opts.lease_ms,
                                             st)
                   : 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (st[i])
            continue;
        char rid[24];
        idem__rid(s, rid);
        const idem_completion *c = &items[i];
        int64_t ttl = c->ttl_ms ? c->ttl_ms : s->opts.ttl_ms;
        if (fold ? idem__comp_add(r, &ck->comps, c->token, ttl, rid, c)
                 : idem__intent_add(&ck->intent, 'c', c->token, ttl, rid,
                                    c->key, c->keylen, c->response, c->len))
            rc = idem__fail(s, IDEM_ENOMEM, "out of memory");
        ck->ncomps += fold && !rc;
    }
    return rc;
}

int idem__ckpt_hold_fail(idem_store *s, const void *key, size_t keylen,
                         uint64_t token, const void *err, size_t len,
                         int retryable)
{
    idem_completion one = {key, keylen, token, NULL, 0, 0};
    int st = 0;
    int rc = idem__redis_extend_many(s, &one, 1, s->opts.lease_ms, &st);
    if (rc || st)
        return rc ? rc : st;
    char rid[24];
    idem__rid(s, rid);
    if (idem__intent_add(&idem__r(s)->ck.intent, retryable ? 'r' : 'f',
                         token, s->opts.failure_ttl_ms, rid, key, keylen,
                         err, len))
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    return 0;
}

/* ------------------------------------------------------------------------
 * Sync */

/* The msgpack str32 at *p: its bytes and length; *p moves past it. */
static const unsigned char *idem__mp_next(const unsigned char **p, size_t *n)
{
    const unsigned char *q = *p;
    *n = (size_t)q[1] << 24 | (size_t)q[2] << 16 | (size_t)q[3] << 8 | q[4];
    *p = q + 5 + *n;
    return q + 5;
}

/* The completions' answers, after the writes' in v: 0, or IDEM_ELOST
 * for the first refused with its key in the detail (the rest are
 * applied), or IDEM_EPROTO. Walks comps (see idem__comp_add): the key
 * is its record's name without PREFIX{ and }. */
static int idem__comps_answers(idem_store *s, const idem__rckpt *ck,
                               const redisReply *v)
{
    size_t pl = idem__r(s)->cfg.prefixlen;
    const unsigned char *p = ck->comps.data + 5;   /* past the array head */
    int lost = 0;
    for (size_t i = 0; i < ck->ncomps; i++) {
        size_t namel, tokl, skip;
        const unsigned char *name = idem__mp_next(&p, &namel);
        const unsigned char *tok = idem__mp_next(&p, &tokl);
        for (int f = 0; f < 3; f++)
            (void)idem__mp_next(&p, &skip);
        char num[24] = "";
        memcpy(num, tok, tokl < sizeof num ? tokl : sizeof num - 1);
        int one = idem__finish_answer_of(s, v->element[ck->nwrites + 1 + i],
                                      strtoull(num, NULL, 10));
        if (one == IDEM_EPROTO)
            return one;
        if (one && !lost) {
            idem__refused(s, name + pl + 1, namel - pl - 2, one);
            lost = one;
        }
    }
    return lost;
}

/* Step 1, with the completions when the script applies them (comps).
 * *refused: the key holds another sync's intent, not applied. *lost:
 * completions refused by their keys (the detail names the first); the
 * rest stands. */
static int idem__ckpt_write(idem_store *s, const idem__rckpt *ck,
                            const char *iid, int *refused, int *lost)
{
    idem__one one;
    int rc = idem__ckpt_begin(s, &one, ck->ncomps ? IDEM__S_CKPT_COMMIT
                                                  : IDEM__S_CKPT_PUT,
                              ck->name);
    if (rc)
        return rc;
    idem__arg(one.it, ck->blob.data, ck->blob.len);
    idem__arg(one.it, ck->intent.data, ck->intent.len);
    idem__arg(one.it, iid, strlen(iid));
    idem__arg(one.it, ck->writes.data, ck->writes.len);
    if (ck->ncomps)
        idem__arg(one.it, ck->comps.data, ck->comps.len);
    rc = idem__one_run(s, &one, 1);
    const redisReply *v = rc ? NULL : one.it->reply;
    int written = v && v->type == REDIS_REPLY_ARRAY &&
                  v->elements == ck->nwrites + ck->ncomps + 1;
    if (v && v->type == REDIS_REPLY_ERROR)
        rc = idem__fail(s, IDEM_EPROTO, "%s: a write queued with checkpoint "
                        "'%s' failed: %s", s->uri, ck->name, v->str);
    else if (v && !written && v->type != REDIS_REPLY_INTEGER)
        rc = idem__fail(s, IDEM_EPROTO, "%s: unexpected reply to a "
                        "checkpoint write", s->uri);
    *refused = v && !rc && !written && v->integer == 0;
    if (written)
        rc = idem__keep_replies(s, v, ck->nwrites);
    if (written && !rc)
        *lost = idem__comps_answers(s, ck, v);
    if (*lost == IDEM_EPROTO)
        rc = idem__fail(s, IDEM_EPROTO, "%s: unexpected reply to a "
                        "checkpoint write", s->uri);
    idem__one_end(&one);
    return rc;
}

/* Step 1, after applying an intent left by a process that crashed
 * between its steps 1 and 3 if the key holds one: its writes belong to
 * the checkpoint it wrote, which this one replaces. */
static int idem__ckpt_write_over(idem_store *s, const idem__rckpt *ck,
                                 const char *iid, int *lost)
{
    int refused = 0;
    int rc = idem__ckpt_write(s, ck, iid, &refused, lost);
    for (int tries = 0; !rc && refused && tries < 3; tries++) {
        idem__one one;
        const redisReply *rep = NULL;
        rc = idem__ckpt_read(s, &one, ck->name, &rep);
        if (!rc)
            rc = idem__ckpt_settle(s, ck->name, rep);
        if (one.b)
            idem__one_end(&one);
        if (rc == IDEM_ENOTFOUND)
            rc = 0;
        if (!rc)
            rc = idem__ckpt_write(s, ck, iid, &refused, lost);
    }
    if (!rc && refused)
        rc = idem__fail(s, IDEM_ETIMEOUT, "%s: checkpoint '%s' keeps being "
                        "written by other processes", s->uri, ck->name);
    return rc;
}

/* n queued items (writes, or completions' strings) in b as one msgpack
 * array, as step 1 sends them. */
static int idem__mp_array(idem_store *s, idem__buf *b, size_t n)
{
    idem__buf all = {0};
    if (idem__mp_head(&all, 0xdd, n) ||
        idem__buf_append(&all, b->data, b->len)) {
        idem__buf_free(&all);
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    idem__buf_free(b);
    *b = all;
    return 0;
}

int idem__ckpt_sync(idem_store *s)
{
    idem__redis *r = idem__r(s);
    if (!r || (!r->ck.name && !r->ck.nwrites))
        return 0;
    /* The queue is spent whatever happens: after a failed step 1 its
     * writes must not be applied later, after step 1 the key has them. */
    idem__rckpt ck = r->ck;
    memset(&r->ck, 0, sizeof r->ck);
    if (ck.nwrites) {
        r->wreply.len = 0;
        r->nwreply = 0;
    }
    if (!ck.name) {
        idem__ckpt_free(&ck);
        return idem__fail(s, IDEM_EINVAL, "%s: writes were queued with no "
                          "checkpoint to carry them; they are dropped",
                          s->uri);
    }
    if ((ck.nwrites && idem__mp_array(s, &ck.writes, ck.nwrites)) ||
        (ck.ncomps && idem__mp_array(s, &ck.comps, 5 * ck.ncomps))) {
        idem__ckpt_free(&ck);
        return IDEM_ENOMEM;
    }
    long n = idem__intent_count(&ck.intent);
    char iid[24];
    idem__rid(s, iid);
    /* The id also tells a resent step 1 (a lost reply) that its writes
     * ran: see IDEM__LUA_CKPT_PUT. */
    int lost = 0;
    int rc = idem__ckpt_write_over(s, &ck, n || ck.nwrites || ck.ncomps
                                               ? iid : "", &lost);
    char why[sizeof s->detail];
    idem__scopy(why, sizeof why, s->detail);
    if (!rc && n > 0) {
        rc = idem__intent_apply(s, &ck.intent, (size_t)n);
        if (!rc || rc == IDEM_ELOST || rc == IDEM_EPROTO)
            idem__ckpt_clear(s, ck.name, iid, strlen(iid));
    }
    if (!rc && lost)
        rc = idem__fail(s, lost, "%s", why);
    idem__ckpt_free(&ck);
    return rc;
}
