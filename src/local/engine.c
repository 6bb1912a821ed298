/* engine.c - the embedded store: log + index + protocol.
 *
 * This is the backend behind `local:PATH` and `mem:`. Every operation is
 * the same three steps: find the key's newest frame through the index,
 * let protocol.c decide, append the new full snapshot and point the index
 * at it. Nothing is ever updated in place, so a crash can only lose a
 * suffix of appends, which recovery cuts at the last commit.
 *
 * Invariants:
 *  - an index entry points at the newest frame of its key; a key with no
 *    live record has no entry or an expired one (treated as absent);
 *  - seg->live counts the entries pointing into seg; a segment that is the
 *    oldest, not active, and has no live entry or checkpoint holds nothing
 *    anybody can read, so it can be deleted whole;
 *  - a frame is only ever copied forward (compaction) and then synced
 *    before the segment it came from is deleted;
 *  - token_hw is at least every token this handle issued or imported and
 *    every token in a frame on disk when it opened, so a claim's token,
 *    above both token_hw and the clock in microseconds, repeats none that
 *    a record on disk holds, whatever expired or was forgotten, and even
 *    after the clock stepped back across a restart.
 *
 * Failure atomicity: before a frame is appended, index room is reserved;
 * the append reserves its buffer room; only then are both changed, with no
 * step left that can fail. So ENOMEM leaves no half-done operation. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "dir.h"
#include "index.h"
#include "log.h"
#include "protocol.h"
#include "record.h"
#include "recover.h"
#include "store.h"

typedef struct idem__ckpt {
    char *name;
    uint32_t seg, off;
} idem__ckpt;

typedef struct idem__engine {
    idem__log log;
    idem__index ix;
    int lockfd;
    unsigned char secret[IDEM__SECRET_LEN];
    idem__ckpt *ckpts;
    size_t nckpts;
    uint32_t sweep_cursor;   /* next entry id an incremental sweep visits */
    uint64_t token_hw;       /* the greatest token issued or found */
    uint64_t expired_total, dropped_total, copied_total;
    uint64_t hot_keys;       /* keys the RAM index may hold before the
                              * oldest hot sealed segment goes cold */
    int hot_limited;         /* hot_keys is a limit (local:, not mem:) */
    uint64_t cold_lookups, filter_probes, searches, bloom_fp, cold_reads;
    uint64_t asked;          /* segments' filters and lanes asked */
    uint64_t merged_fp;      /* maybes of the filter in front (coldfilter.h)
                              * that no cold segment held */
} idem__engine;

/* RAM an index entry costs, slot included (index.h): what hot=BYTES is
 * divided by. */
#define IDEM__HOT_KEY_BYTES 48u
/* The hot budget when the URI names none: 2 GiB of index, some 45
 * million keys, past any store whose figures the README gives as small. */
#define IDEM__HOT_DEFAULT (2ull << 30)

/* A key's current state, as found by idem__lookup(). */
typedef struct idem__found {
    uint64_t h[2];
    idem__ient *e;           /* the entry, live or expired, or NULL */
    int live;                /* e holds a live record: f is its frame */
    idem__frame f;
    uint32_t cold_seg;       /* no e: the cold segment holding the key's
                              * newest frame (0: none) */
    uint32_t cold_off;       /* and that frame's offset */
} idem__found;

static idem__engine *idem__eng(idem_store *s)
{
    return s->impl;
}

idem__log *idem__engine_log(idem_store *s)
{
    int ours = s->be == &idem__backend_local || s->be == &idem__backend_mem;
    return ours ? &idem__eng(s)->log : NULL;
}

static void idem__hash(const idem__engine *en, const void *key, size_t len,
                       uint64_t h[2])
{
    idem__key_hash(en->secret, key, len, h);
}

/* Decode the frame at (seg, off) into *f. 0; IDEM_ENOTFOUND if its
 * segment was dropped; else the error, with the detail set. A frame that
 * cannot be read is never taken for a missing one: for a key that is
 * DONE, "no record" would let a claim run the work a second time. */
static int idem__read_frame(idem_store *s, uint32_t seg, uint32_t off,
                            idem__frame *f)
{
    idem__log *lg = &idem__eng(s)->log;
    const unsigned char *p;
    size_t avail;
    int rc = idem__log_at(lg, seg, off, &p, &avail);
    /* A cold segment's frames were not verified when the store opened. */
    idem__seg *g = rc ? NULL : idem__log_seg(lg, seg);
    if (!rc && idem__frame_decode(p, avail, f, g && g->cold))
        rc = IDEM_ECORRUPT;
    if (rc == IDEM_ECORRUPT) {
        char name[32];
        idem__seg_name(name, sizeof name, seg);
        return idem__fail(s, rc, "%s%s%s: no valid record at offset %u",
                          lg->dir ? lg->dir : "", lg->dir ? "/" : "", name,
                          off);
    }
    return rc == IDEM_ENOMEM ? idem__fail(s, rc, "out of memory") : rc;
}

/* Is the key in cold segment g? 1 (fo->f, cold_seg, cold_off set), 0,
 * or why its frame could not be read. Entries share the first 64 bits
 * of a hash by chance: the full key tells them apart. */
static int idem__cold_find(idem_store *s, const idem__seg *g,
                           const void *key, size_t len, idem__found *fo)
{
    idem__engine *en = idem__eng(s);
    const idem__cold *c = g->cold;
    uint64_t j = idem__cold_lower(c, fo->h);
    for (; j < c->nents && c->h0s[j] == fo->h[0]; j++) {
        en->cold_reads++;
        int rc = idem__read_frame(s, g->id, c->offs[j], &fo->f);
        if (rc)
            return rc;
        if (fo->f.keylen == len && memcmp(fo->f.key, key, len) == 0) {
            fo->cold_seg = g->id;
            fo->cold_off = c->offs[j];
            return 1;
        }
    }
    return 0;
}

/* Search cold segment segs[i]'s key index for the key, whose filter (its
 * own, or its lane's) said maybe: 1 found (fo set), 0 not there (a false
 * positive), or why a frame could not be read. */
static int idem__search_seg(idem_store *s, size_t i, const void *key,
                            size_t len, idem__found *fo)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    int rc = idem__log_cold_sound(lg, &lg->segs[i]);
    if (rc)
        return rc;
    en->searches++;
    rc = idem__cold_find(s, &lg->segs[i], key, len, fo);
    en->bloom_fp += rc == 0;
    return rc;
}

/* Ask cold segments segs[lo, hi), newest first, for the key: 1 found
 * (fo set), 0 not there, or why a frame could not be read. A filter's
 * false positive costs a search of that segment's index, never an
 * answer. */
static int idem__ask_segs(idem_store *s, size_t lo, size_t hi,
                          const void *key, size_t len, idem__found *fo)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    idem__probe p;
    idem__probe_init(&p, fo->h);
    for (size_t i = hi; i-- > lo;) {
        int rc = idem__log_cold_sound(lg, &lg->segs[i]);
        if (rc)
            return rc;
        idem__cold_prefetch(lg->segs[i].cold, fo->h);
    }
    for (size_t i = hi; i-- > lo;) {
        en->filter_probes++;
        en->asked++;
        if (!idem__cold_has(lg->segs[i].cold, &p))
            continue;
        int rc = idem__search_seg(s, i, key, len, fo);
        if (rc)
            return rc;
    }
    return 0;
}

/* The cold segments of the group of level lv of segs[hi - 1] are
 * segs[lo, hi). Cold ids are consecutive (coldgroup.c), so lo follows
 * from the id alone, where a walk would read every cold segment's entry
 * for a key found in the oldest group (4,594 of them at 3e8 keys, most
 * of a lookup's time). The walk stays for a gap, which would only cost
 * time. */
static size_t idem__group_lo(const idem__log *lg, size_t hi, unsigned lv)
{
    uint32_t id = lg->segs[hi - 1].id, num = idem__cg_num(id, lv);
    uint64_t past = id - (uint64_t)num * idem__cg_span(lv); /* < span */
    size_t lo = past < hi ? hi - 1 - (size_t)past : 0;
    if (idem__cg_num(lg->segs[lo].id, lv) == num &&
        (lo == 0 || idem__cg_num(lg->segs[lo - 1].id, lv) != num))
        return lo;
    for (lo = hi; lo > 0 && idem__cg_num(lg->segs[lo - 1].id, lv) == num;)
        lo--;
    return lo;
}

/* A key's probe of the group filters: its first hash word and its bits
 * in a lane's block (idem__cg_mask). */
typedef struct idem__gprobe {
    uint64_t h0;
    uint64_t m[2];
} idem__gprobe;

/* Start loading the stripes a probe reads in the filters of level lv's
 * groups numbered [first, last]: the loads overlap when started
 * together. A stripe is a few lines of one page. */
static void idem__groups_prefetch(const idem__cgroups *cg, uint32_t first,
                                  uint32_t last, uint64_t h0)
{
    for (size_t k = idem__cgroup_find(cg, last);
         k-- > 0 && cg->v[k].num >= first;) {
        const char *p = (const char *)idem__cg_stripe(&cg->v[k], h0);
        for (unsigned j = 0; j < IDEM__CG_STRIPE_LINES; j++)
            __builtin_prefetch(p + 64 * j);
    }
}

static int idem__ask_groups(idem_store *s, unsigned lv, size_t lo, size_t hi,
                            const void *key, size_t len,
                            const idem__gprobe *gp, idem__found *fo);

/* Ask the members of group q of level lv, whose cold segments are
 * segs[lo, hi), that its lanes say might hold the key, newest first: at
 * level 0 each such segment's key index is searched, at level 1 each
 * such group is asked. 1 found (fo set), 0 not there, or why a frame
 * could not be read. */
static int idem__ask_lanes(idem_store *s, unsigned lv, const idem__cgroup *q,
                           size_t lo, size_t hi, const void *key, size_t len,
                           const idem__gprobe *gp, idem__found *fo)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    unsigned maybe = idem__cgroup_lanes(q, gp->h0, gp->m);
    en->asked += lv ? 0 : hi - lo;  /* a run's lanes choose no index */
    for (size_t top = hi, bot; maybe && top > lo; top = bot) {
        unsigned j = idem__cg_lane(lg->segs[top - 1].id, lv);
        bot = lv ? idem__group_lo(lg, top, 0) : top - 1;
        bot = bot > lo ? bot : lo;
        if (!(maybe >> j & 1))
            continue;
        int rc = lv ? idem__ask_groups(s, 0, bot, top, key, len, gp, fo)
                    : idem__search_seg(s, top - 1, key, len, fo);
        if (rc)
            return rc;
    }
    return 0;
}

/* Ask the groups of level lv in segs[lo, hi), newest first: a group
 * with a filter has the members its lanes say maybe to asked; one
 * without (not all cold yet, or none to trust) has its groups of the
 * level below asked, or at level 0 its segments. 1 found (fo set), 0
 * not there, or why a frame could not be read. */
static int idem__ask_groups(idem_store *s, unsigned lv, size_t lo, size_t hi,
                            const void *key, size_t len,
                            const idem__gprobe *gp, idem__found *fo)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    idem__cgroups *cg = &lg->cg[lv];
    idem__groups_prefetch(cg, idem__cg_num(lg->segs[lo].id, lv),
                          idem__cg_num(lg->segs[hi - 1].id, lv), gp->h0);
    size_t k = cg->n;
    for (size_t top = hi, bot; top > lo; top = bot) {
        uint32_t num = idem__cg_num(lg->segs[top - 1].id, lv);
        bot = idem__group_lo(lg, top, lv);
        bot = bot > lo ? bot : lo;
        while (k > 0 && cg->v[k - 1].num > num)
            k--;
        int rc;
        if (k > 0 && cg->v[k - 1].num == num &&
            idem__cgroup_usable(lg, lv, &cg->v[k - 1], bot, top)) {
            en->filter_probes++;
            rc = idem__ask_lanes(s, lv, &cg->v[k - 1], bot, top, key, len, gp,
                                 fo);
        } else {
            rc = lv ? idem__ask_groups(s, lv - 1, bot, top, key, len, gp, fo)
                    : idem__ask_segs(s, bot, top, key, len, fo);
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* A key RAM does not hold: the cold segments, newest first, hold its
 * newest frame, if any. The filter in front says whether any might; a
 * run's filter whether one of its 16 groups might, a group's whether one
 * of its 16 segments might (coldgroup.h), so only the segments under
 * filters that say maybe, and of the newest groups that have no filter
 * yet, are asked. */
static int idem__lookup_cold(idem_store *s, const void *key, size_t len,
                             int64_t now, idem__found *fo)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    if (!lg->ncold)
        return 0;
    en->cold_lookups++;
    en->filter_probes++;
    if (!idem__cfilter_maybe(&lg->cf, fo->h))
        return 0;
    idem__gprobe gp = {.h0 = fo->h[0]};
    idem__cg_mask(fo->h[0], gp.m);
    int rc = idem__ask_groups(s, IDEM__CG_LEVELS - 1, 0, lg->ncold, key, len,
                              &gp, fo);
    if (rc < 0)
        return rc;
    if (rc) {
        fo->live = fo->f.type != IDEM__R_FORGET && now < fo->f.rec.expires;
        return 0;
    }
    en->merged_fp++;  /* the filter in front said maybe, no segment has it */
    return 0;
}

/* Find key's record, whose hash is in fo->h. Returns 0 (see *fo),
 * IDEM_ECOLLISION, or why the record could not be read. An entry whose
 * frame was dropped with its expired segment counts as absent. An entry
 * in RAM is the key's newest frame, live or not; without one, the cold
 * segments are asked. */
static int idem__lookup_hashed(idem_store *s, const void *key, size_t len,
                               int64_t now, idem__found *fo)
{
    idem__engine *en = idem__eng(s);
    fo->e = idem__index_find(&en->ix, fo->h);
    fo->live = 0;
    fo->cold_seg = 0;
    if (!fo->e)
        return idem__lookup_cold(s, key, len, now, fo);
    if (now >= fo->e->expires)
        return 0;
    int rc = idem__read_frame(s, fo->e->seg, fo->e->off, &fo->f);
    if (rc)
        return rc == IDEM_ENOTFOUND ? 0 : rc;
    if (fo->f.keylen != len || memcmp(fo->f.key, key, len) != 0)
        return idem__fail(s, IDEM_ECOLLISION,
                          "two keys share one 128-bit index hash");
    fo->live = 1;
    return 0;
}

static int idem__lookup(idem_store *s, const void *key, size_t len,
                        int64_t now, idem__found *fo)
{
    idem__hash(idem__eng(s), key, len, fo->h);
    return idem__lookup_hashed(s, key, len, now, fo);
}

/* The key's newest frame, which fo found, is about to be superseded: its
 * segment loses a live reference. */
static void idem__seg_unref(idem__engine *en, const idem__found *fo)
{
    /* A tombstone holds no reference; a cold frame counted in its
     * segment's live ones only while live (see idem__cold_out). */
    int ref = fo->e ? fo->e->expires != INT64_MIN : fo->cold_seg && fo->live;
    idem__seg *old =
        ref ? idem__log_seg(&en->log, fo->e ? fo->e->seg : fo->cold_seg)
            : NULL;
    if (old && old->live)
        old->live--;
}

/* Might a frame of the key whose hash is h, older than segment seg, be
 * found by a cold lookup, now or once its segment goes cold? Then the
 * key's entry must stay in RAM (expired, or a tombstone) to hide it. A
 * segment whose records have all expired hides nothing worth hiding. */
static int idem__may_shadow(idem__engine *en, const uint64_t h[2],
                            uint32_t seg, int64_t now)
{
    idem__log *lg = &en->log;
    if (!en->hot_limited && !lg->ncold)
        return 0;
    int cold = lg->ncold && idem__cfilter_maybe(&lg->cf, h);
    for (size_t i = 0; i < lg->nsegs && lg->segs[i].id < seg; i++) {
        idem__seg *g = &lg->segs[i];
        if (g->max_expires <= now)
            continue;
        /* An index that cannot be checked might hold it. */
        if (g->cold ? cold && (idem__log_cold_sound(lg, g) ||
                               idem__cold_maybe(g->cold, h))
                    : en->hot_limited)
            return 1;
    }
    return 0;
}

/* The key of entry e has no live record any more (expired, forgotten):
 * drop e, or keep it as a tombstone when an older frame could show. */
static void idem__bury(idem__engine *en, idem__ient *e, int64_t now)
{
    if (idem__may_shadow(en, e->h, e->seg, now))
        e->expires = INT64_MIN;
    else
        idem__index_remove(&en->ix, e);
}

/* Append frame (type, r, key, val) and point the key's entry at it. */
static int idem__put(idem_store *s, idem__found *fo, uint8_t type,
                     const idem__rec *r, const void *key, size_t keylen,
                     const void *val, size_t vallen, int64_t now)
{
    idem__engine *en = idem__eng(s);
    if (!fo->e && idem__index_reserve(&en->ix, 1))
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    unsigned char *dst;
    uint32_t seg, off;
    idem__fplan fp;
    size_t n = idem__frame_plan(&fp, type, r, key, keylen, val, vallen);
    int rc = idem__log_append(&en->log, now, n, &dst, &seg, &off);
    if (rc)
        return rc;
    idem__frame_write(dst, &fp);
    idem__seg_unref(en, fo);
    if (!fo->e)
        fo->e = idem__index_insert(&en->ix, fo->h);
    idem__seg *g = idem__log_seg(&en->log, seg);
    fo->e->seg = seg;
    fo->e->off = off;
    fo->e->expires = r->expires;
    g->live++;
    g->records++;
    if (r->expires > g->max_expires)
        g->max_expires = r->expires;
    return 0;
}

/* ------------------------------------------------------------------------
 * The protocol operations */

/* Raise the high-water mark of tokens to token. */
static void idem__token_seen(idem__engine *en, uint64_t token)
{
    if (token > en->token_hw)
        en->token_hw = token;
}

/* The least token a claim at now_us (the clock in microseconds) may
 * issue: above every token known, and no less than the clock, so that it
 * stays above the tokens of earlier runs whose frames are gone. */
static uint64_t idem__token_floor(const idem__engine *en, int64_t now_us)
{
    uint64_t next = en->token_hw + 1;
    return now_us > 0 && (uint64_t)now_us > next ? (uint64_t)now_us : next;
}

static int idem__claim_one(idem_store *s, const idem_key *k,
                           const uint64_t h[2], const idem__claim_args *a,
                           int64_t now_us, idem_outcome *out)
{
    idem__engine *en = idem__eng(s);
    int64_t now = now_us / 1000;
    idem__found fo = {.h = {h[0], h[1]}};
    int rc = idem__lookup_hashed(s, k->key, k->keylen, now, &fo);
    if (rc)
        return rc;
    idem__rec next;
    idem__decide_claim(fo.live ? &fo.f.rec : NULL, k->fp, now, a->lease_ms,
                       a->ttl_ms, idem__token_floor(en, now_us), &next, out);
    if (out->kind == IDEM_NEW)
        idem__token_seen(en, next.token);
    if (out->kind == IDEM_NEW && fo.live &&
        fo.f.rec.state == IDEM_STATE_PENDING && !fo.f.rec.released)
        idem__ctr_add(&s->m.takeovers, 1);  /* its holder's lease ran out */
    if (out->kind == IDEM_NEW && a->done) {
        next.state = IDEM_STATE_DONE;
        next.lease = 0;
        next.expires = now + a->ttl_ms;  /* as a completion sets it */
        return idem__put(s, &fo, IDEM__R_COMPLETE, &next, k->key, k->keylen,
                         NULL, 0, now);
    }
    if (out->kind == IDEM_NEW)
        return idem__put(s, &fo, IDEM__R_CLAIM, &next, k->key, k->keylen, NULL,
                         0, now);
    if (out->kind == IDEM_REPLAY || out->kind == IDEM_FAILED) {
        out->data = idem__out_keep(s, fo.f.val, fo.f.vallen);
        out->len = fo.f.vallen;
        if (!out->data)
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    return 0;
}

/* Keys hashed and prefetched ahead of the one being claimed. */
#define IDEM__WINDOW 16

static int idem__eng_claim_many(idem_store *s, const idem_key *keys,
                                size_t n, const idem__claim_args *a,
                                idem_outcome *outs)
{
    idem__engine *en = idem__eng(s);
    int64_t now_us = idem__now_us(s);
    uint64_t h[IDEM__WINDOW][2];
    for (size_t i = 0; i < n; i++) {
        size_t w = i % IDEM__WINDOW;
        if (w == 0) {
            size_t m = n - i < IDEM__WINDOW ? n - i : IDEM__WINDOW;
            for (size_t j = 0; j < m; j++) {
                if (!outs[i + j].status)
                    idem__hash(en, keys[i + j].key, keys[i + j].keylen, h[j]);
                else
                    h[j][0] = h[j][1] = 0;
                idem__index_prefetch(&en->ix, h[j], 0);
            }
            for (size_t j = 0; j < m; j++) {
                idem__index_prefetch(&en->ix, h[j], 1);
                /* RAM will lack most keys of a claim: the filter in
                 * front of the cold segments is asked next. */
                if (en->log.ncold)
                    idem__cfilter_prefetch(&en->log.cf, h[j]);
            }
        }
        if (outs[i].status)
            continue;
        int rc = idem__claim_one(s, &keys[i], h[w], a, now_us, &outs[i]);
        if (rc == IDEM_ECOLLISION || rc == IDEM_ECORRUPT) {
            outs[i].status = rc;
        } else if (rc) {
            for (size_t j = i; j < n; j++)
                outs[j].status = outs[j].status ? outs[j].status : rc;
            return rc;
        }
    }
    return 0;
}

/* Look up key and check that token may finish it; fills *fo. */
static int idem__holder(idem_store *s, const void *key, size_t len,
                        uint64_t token, int64_t now, idem__found *fo)
{
    int rc = idem__lookup(s, key, len, now, fo);
    if (rc)
        return rc;
    if (idem__may_finish(fo->live ? &fo->f.rec : NULL, token))
        return idem__fail(s, IDEM_ELOST,
                          "token %llu does not hold the key (%s)",
                          (unsigned long long)token,
                          !fo->live ? "no live record"
                          : fo->f.rec.state != IDEM_STATE_PENDING
                              ? "already finished"
                          : fo->f.rec.released ? "it was released"
                                               : "another worker took it over");
    return 0;
}

static int idem__complete_one(idem_store *s, const idem_completion *c,
                              int64_t now)
{
    idem__found fo;
    int rc = idem__holder(s, c->key, c->keylen, c->token, now, &fo);
    if (rc)
        return rc;
    idem__rec r = fo.f.rec;
    r.state = IDEM_STATE_DONE;
    r.lease = 0;
    r.expires = now + (c->ttl_ms ? c->ttl_ms : s->opts.ttl_ms);
    return idem__put(s, &fo, IDEM__R_COMPLETE, &r, c->key, c->keylen,
                     c->response, c->len, now);
}

static int idem__eng_complete_many(idem_store *s, const idem_completion *it,
                                   size_t n, int *st)
{
    int64_t now = idem__now(s);
    for (size_t i = 0; i < n; i++) {
        if (st[i])
            continue;
        st[i] = idem__complete_one(s, &it[i], now);
        if (st[i] && st[i] != IDEM_ELOST && st[i] != IDEM_ECOLLISION &&
            st[i] != IDEM_ECORRUPT) {
            int rc = st[i];
            for (size_t j = i + 1; j < n; j++)
                st[j] = st[j] ? st[j] : rc;
            return rc;
        }
    }
    return 0;
}

static int idem__eng_fail(idem_store *s, const void *key, size_t keylen,
                          uint64_t token, const void *err, size_t len,
                          int retryable)
{
    int64_t now = idem__now(s);
    idem__found fo;
    int rc = idem__holder(s, key, keylen, token, now, &fo);
    if (rc)
        return rc;
    idem__rec r = fo.f.rec;
    if (retryable) {
        r.released = 1;
        r.lease = 0;
    } else {
        r.state = IDEM_STATE_FAILED;
        r.lease = 0;
        r.expires = now + s->opts.failure_ttl_ms;
    }
    return idem__put(s, &fo, retryable ? IDEM__R_RELEASE : IDEM__R_FAIL, &r,
                     key, keylen, err, len, now);
}

static int idem__eng_extend(idem_store *s, const void *key, size_t keylen,
                            uint64_t token, int64_t lease_ms)
{
    int64_t now = idem__now(s);
    idem__found fo;
    int rc = idem__holder(s, key, keylen, token, now, &fo);
    if (rc)
        return rc;
    idem__rec r = fo.f.rec;
    r.lease = now + lease_ms;
    if (r.expires < r.lease)
        r.expires = r.lease;
    return idem__put(s, &fo, IDEM__R_EXTEND, &r, key, keylen, NULL, 0, now);
}

/* The public view of a stored record; data points into the frame. */
static void idem__to_record(const idem__frame *f, idem_record *out)
{
    const idem__rec *r = &f->rec;
    out->state = (idem_state)r->state;
    out->token = r->token;
    out->attempts = r->attempts;
    out->released = r->released;
    out->created_ms = r->created;
    out->expires_ms = r->expires;
    out->lease_until = r->state == IDEM_STATE_PENDING ? r->lease : 0;
    out->has_fp = r->has_fp;
    memcpy(out->fp, r->fp, IDEM_FP_LEN);
    out->data = f->vallen ? f->val : NULL;
    out->len = f->vallen;
}

static int idem__eng_get(idem_store *s, const void *key, size_t keylen,
                         idem_record *out)
{
    idem__found fo;
    int rc = idem__lookup(s, key, keylen, idem__now(s), &fo);
    if (rc)
        return rc;
    if (!fo.live)
        return idem__fail(s, IDEM_ENOTFOUND, "no live record for the key");
    idem__to_record(&fo.f, out);
    if (out->len) {
        out->data = idem__out_keep(s, fo.f.val, fo.f.vallen);
        if (!out->data)
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
    }
    return 0;
}

/* Is the key's newest frame, as fo found it, at (seg, off)? */
static int idem__found_at(const idem__found *fo, uint32_t seg, uint32_t off)
{
    return fo->e ? fo->e->seg == seg && fo->e->off == off
                 : fo->cold_seg == seg && fo->cold_off == off;
}

/* The live keys of cold segment g whose newest frame it holds (a lookup
 * of each says so: a newer segment or RAM may hold a newer one). */
static int idem__scan_cold(idem_store *s, idem__seg *g, int64_t now,
                           idem_scan_fn fn, void *ctx)
{
    int sound = idem__log_cold_sound(&idem__eng(s)->log, g);
    if (sound)
        return sound;
    for (uint64_t j = 0; j < g->cold->nents; j++) {
        uint32_t off = g->cold->offs[j];
        idem__frame f;
        idem__found fo;
        int rc = idem__read_frame(s, g->id, off, &f);
        if (!rc && (f.type == IDEM__R_FORGET || now >= f.rec.expires))
            continue;
        if (!rc)
            rc = idem__lookup(s, f.key, f.keylen, now, &fo);
        if (rc)
            return rc;
        if (!fo.live || !idem__found_at(&fo, g->id, off))
            continue;
        idem_record r;
        idem__to_record(&fo.f, &r);
        if ((rc = fn(ctx, fo.f.key, fo.f.keylen, &r)))
            return rc;
    }
    return 0;
}

/* Every live record, whatever its hash: the cold ones, then RAM's. */
static int idem__eng_scan(idem_store *s, idem_scan_fn fn, void *ctx)
{
    idem__engine *en = idem__eng(s);
    int64_t now = idem__now(s);
    for (size_t i = en->log.ncold; i-- > 0;) {
        int rc = idem__scan_cold(s, &en->log.segs[i], now, fn, ctx);
        if (rc)
            return rc;
    }
    for (uint32_t id = 0; id < en->ix.hw; id++) {
        idem__ient *e = idem__index_at(&en->ix, id);
        idem__frame f;
        if (e->seg == IDEM__IENT_FREE || now >= e->expires)
            continue;
        int rc = idem__read_frame(s, e->seg, e->off, &f);
        if (rc == IDEM_ENOTFOUND)
            continue;  /* dropped with its expired segment */
        if (rc)
            return rc;
        idem_record r;
        idem__to_record(&f, &r);
        rc = fn(ctx, f.key, f.keylen, &r);
        if (rc)
            return rc;
    }
    return 0;
}

static int idem__eng_import(idem_store *s, const void *key, size_t keylen,
                            const idem_record *in)
{
    int64_t now = idem__now(s);
    idem__found fo;
    int rc = idem__lookup(s, key, keylen, now, &fo);
    if (rc)
        return rc;
    idem__rec r = {.state = (uint8_t)in->state,
                   .has_fp = in->has_fp != 0,
                   .released = in->state == IDEM_STATE_PENDING && in->released,
                   .attempts = in->attempts ? in->attempts : 1,
                   .token = in->token,
                   .created = in->created_ms,
                   .expires = in->expires_ms,
                   .lease = in->state == IDEM_STATE_PENDING ? in->lease_until
                                                            : 0};
    memcpy(r.fp, in->fp, IDEM_FP_LEN);
    uint8_t type = in->state == IDEM_STATE_DONE           ? IDEM__R_COMPLETE
                   : in->state == IDEM_STATE_FAILED ? IDEM__R_FAIL
                   : r.released                     ? IDEM__R_RELEASE
                                                    : IDEM__R_CLAIM;
    idem__token_seen(idem__eng(s), r.token);
    return idem__put(s, &fo, type, &r, key, keylen, in->data, in->len, now);
}

static int idem__eng_forget(idem_store *s, const void *key, size_t keylen)
{
    idem__engine *en = idem__eng(s);
    int64_t now = idem__now(s);
    idem__found fo;
    int rc = idem__lookup(s, key, keylen, now, &fo);
    if (rc)
        return rc;
    if (!fo.live)
        return idem__fail(s, IDEM_ENOTFOUND, "no live record for the key");
    if (!fo.e && idem__index_reserve(&en->ix, 1))
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    unsigned char *dst;
    uint32_t seg, off;
    idem__fplan fp;
    rc = idem__log_append(&en->log, now,
                          idem__frame_plan(&fp, IDEM__R_FORGET, &fo.f.rec,
                                           key, keylen, NULL, 0),
                          &dst, &seg, &off);
    if (rc)
        return rc;
    idem__frame_write(dst, &fp);
    /* The tombstone's entry points at the FORGET frame, which is what a
     * cold index will name once its segment goes cold. */
    idem__seg_unref(en, &fo);
    if (!fo.e)
        fo.e = idem__index_insert(&en->ix, fo.h);
    fo.e->seg = seg;
    fo.e->off = off;
    idem__bury(en, fo.e, now);
    return 0;
}

static void idem__eng_poison(idem_store *s, int code)
{
    idem__log *lg = &idem__eng(s)->log;
    if (!lg->broken)
        lg->broken = code;
}

static int idem__evict(idem_store *s);

static int idem__eng_sync(idem_store *s)
{
    idem__log *lg = &idem__eng(s)->log;
    int rc = idem__log_sync_wait(lg);
    rc = rc ? rc : idem__log_commit(lg);
    return rc ? rc : idem__evict(s);
}

/* idem_sync_start(): the group written, its fdatasync on a thread of
 * the log's (log.h); the keys going cold meanwhile are of sealed
 * segments, durable already. */
static int idem__eng_sync_start(idem_store *s)
{
    int rc = idem__log_commit_start(&idem__eng(s)->log);
    return rc ? rc : idem__evict(s);
}

/* After any failure (the fdatasync's, or a poison) nothing counts as
 * synced: the caller acknowledges nothing more. */
static int idem__eng_sync_wait(idem_store *s)
{
    idem__log *lg = &idem__eng(s)->log;
    int rc = idem__log_sync_wait(lg);
    return rc ? rc : lg->broken;
}

/* ------------------------------------------------------------------------
 * Checkpoints: a handful of names, each pointing at its newest frame. */

static idem__ckpt *idem__ckpt_find(idem__engine *en, const void *name,
                                   size_t len)
{
    for (size_t i = 0; i < en->nckpts; i++)
        if (strlen(en->ckpts[i].name) == len &&
            memcmp(en->ckpts[i].name, name, len) == 0)
            return &en->ckpts[i];
    return NULL;
}

/* Point checkpoint `name` at (seg, off), adding it if new. */
static int idem__ckpt_set(idem__engine *en, const void *name, size_t len,
                          uint32_t seg, uint32_t off)
{
    idem__ckpt *c = idem__ckpt_find(en, name, len);
    if (!c) {
        char *copy = malloc(len + 1);
        idem__ckpt *p = copy ? realloc(en->ckpts, (en->nckpts + 1) *
                                                      sizeof *en->ckpts)
                             : NULL;
        if (!p) {
            free(copy);
            return IDEM_ENOMEM;
        }
        memcpy(copy, name, len);
        copy[len] = '\0';
        en->ckpts = p;
        c = &en->ckpts[en->nckpts++];
        c->name = copy;
    }
    c->seg = seg;
    c->off = off;
    return 0;
}

static int idem__eng_ckpt_put(idem_store *s, const char *name,
                              const void *blob, size_t len)
{
    idem__engine *en = idem__eng(s);
    size_t nlen = strlen(name);
    /* Reserve the table entry first so the append cannot be orphaned. */
    if (!idem__ckpt_find(en, name, nlen) &&
        idem__ckpt_set(en, name, nlen, 0, 0))
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    unsigned char *dst;
    uint32_t seg, off;
    idem__rec r = {.expires = INT64_MAX};
    idem__fplan fp;
    int rc = idem__log_append(&en->log, idem__now(s),
                              idem__frame_plan(&fp, IDEM__R_CHECKPOINT, &r,
                                               name, nlen, blob, len),
                              &dst, &seg, &off);
    if (rc)
        return rc;
    idem__frame_write(dst, &fp);
    return idem__ckpt_set(en, name, nlen, seg, off);
}

static int idem__eng_ckpt_get(idem_store *s, const char *name,
                              const void **blob, size_t *len)
{
    idem__engine *en = idem__eng(s);
    idem__ckpt *c = idem__ckpt_find(en, name, strlen(name));
    idem__frame f;
    int rc = c && c->seg ? idem__read_frame(s, c->seg, c->off, &f)
                         : IDEM_ENOTFOUND;
    if (rc == IDEM_ENOTFOUND)
        return idem__fail(s, rc, "no checkpoint named '%s'", name);
    if (rc)
        return rc;
    *blob = idem__out_keep(s, f.val, f.vallen);
    *len = f.vallen;
    return *blob ? 0 : idem__fail(s, IDEM_ENOMEM, "out of memory");
}

/* ------------------------------------------------------------------------
 * Expiry: the index sweep, whole-segment drops, compaction. */

static uint64_t idem__ckpt_pins(const idem__engine *en, uint32_t seg)
{
    uint64_t n = 0;
    for (size_t i = 0; i < en->nckpts; i++)
        n += en->ckpts[i].seg == seg;
    return n;
}

/* Copy every live record and checkpoint out of the oldest segment into
 * the active one. The copies must be committed before the segment goes. */
static int idem__copy_forward(idem_store *s, idem__seg *g, int64_t now)
{
    idem__engine *en = idem__eng(s);
    uint32_t id = g->id;
    uint64_t size = g->size;
    idem__frame f;
    for (uint64_t at = IDEM__SEG_HDR; at < size; at += f.len) {
        int rc = idem__read_frame(s, id, (uint32_t)at, &f);
        if (rc)
            return rc;
        idem__ckpt *c = f.type == IDEM__R_CHECKPOINT
                            ? idem__ckpt_find(en, f.key, f.keylen)
                            : NULL;
        if (c && c->seg == id && c->off == at) {
            rc = idem__eng_ckpt_put(s, c->name, f.val, f.vallen);
            if (rc)
                return rc;
            en->copied_total++;
            continue;
        }
        if (f.type == IDEM__R_COMMIT || f.type == IDEM__R_FORGET ||
            f.type == IDEM__R_CHECKPOINT || now >= f.rec.expires)
            continue;
        idem__found fo;
        rc = idem__lookup(s, f.key, f.keylen, now, &fo);
        if (rc)
            return rc;
        if (!fo.live || !idem__found_at(&fo, id, (uint32_t)at))
            continue;
        rc = idem__read_frame(s, id, (uint32_t)at, &f);
        if (rc)
            return rc;
        /* f points into the log; copy what put needs before appending. */
        idem__rec r = f.rec;
        uint8_t type = f.type;
        idem__buf kv = {0};
        if (idem__buf_append(&kv, f.key, f.keylen + f.vallen))
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
        rc = idem__put(s, &fo, type, &r, kv.data, f.keylen,
                     kv.data + f.keylen, f.vallen, now);
        idem__buf_free(&kv);
        if (rc)
            return rc;
        en->copied_total++;
    }
    return idem__log_commit(&en->log);
}

/* Survivors few enough to copy out of the oldest segment in any case. */
#define IDEM__FEW 8

/* Drop (or empty, then drop) the oldest segments while that is cheap.
 * Only segments sealed before the call: the copies land in the active
 * segment and, when records are few to a segment (large responses, a
 * small segment size), roll it into new ones whose survivors are as few;
 * a loop that went on into those would copy the same live keys forward
 * for ever, and the sweep would never return. */
static int idem__retire_oldest(idem_store *s, int64_t now)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    const uint32_t stop = lg->nsegs ? lg->segs[lg->nsegs - 1].id : 0;
    while (lg->nsegs > 1 && !lg->in_group && lg->segs[0].id < stop) {
        idem__seg *g = &lg->segs[0];
        uint64_t pins = idem__ckpt_pins(en, g->id);
        int dead = (g->live == 0 || g->max_expires <= now) && pins == 0;
        if (!dead) {
            /* Mostly dead: move the few survivors, then drop. A handful
             * of survivors is cheap to move whatever the ratio; waiting
             * for them instead would let a small segment holding, say, a
             * checkpoint nobody updates any more keep itself, and every
             * segment after it, forever. */
            uint64_t keep = g->live + pins;
            if (keep > IDEM__FEW && keep * 4 > g->records + 1)
                return 0;
            int rc = idem__copy_forward(s, g, now);
            if (rc)
                return rc;
            g = &lg->segs[0];
        }
        int rc = idem__log_drop_oldest(lg);
        if (rc)
            return rc;
        en->dropped_total++;
    }
    return 0;
}

/* Then the filter in front of the cold segments may be far larger than
 * what is left needs; without memory to build it again it is gone, and
 * lookups ask each segment's own filter: slower, never wrong. */
static int idem__retire_segments(idem_store *s, int64_t now)
{
    int rc = idem__retire_oldest(s, now);
    (void)idem__cfilter_fit(&idem__eng(s)->log);
    return rc;
}

static int idem__eng_sweep(idem_store *s, size_t max_work,
                           uint64_t *expired)
{
    idem__engine *en = idem__eng(s);
    int64_t now = idem__now(s);
    *expired = 0;
    if (en->log.readonly)
        return idem__fail(s, IDEM_EINVAL, "the store was opened read-only");
    uint32_t hw = en->ix.hw;
    size_t todo = max_work ? max_work : hw;
    for (size_t k = 0; k < todo && hw; k++) {
        if (en->sweep_cursor >= hw)
            en->sweep_cursor = 0;
        idem__ient *e = idem__index_at(&en->ix, en->sweep_cursor++);
        if (e->seg != IDEM__IENT_FREE && now >= e->expires) {
            *expired += e->expires != INT64_MIN;
            idem__seg *g = e->expires != INT64_MIN
                               ? idem__log_seg(&en->log, e->seg)
                               : NULL;
            if (g && g->live)
                g->live--;
            idem__bury(en, e, now);
        }
    }
    en->expired_total += *expired;
    int rc = idem__log_commit(&en->log);
    return rc ? rc : idem__retire_segments(s, now);
}

/* The figures of idem_stats the metrics keep, after each sync: O(1) in
 * keys (a loop over the segments). */
static void idem__eng_gauges(idem_store *s)
{
    idem__engine *en = idem__eng(s);
    const idem__log *lg = &en->log;
    uint64_t bytes = lg->wbuf.len, keys = en->ix.count;
    for (size_t i = 0; i < lg->nsegs; i++)
        bytes += lg->segs[i].size;
    for (size_t i = 0; i < lg->ncold; i++) {  /* as idem_stats counts */
        bytes += lg->segs[i].cold->len;
        keys += lg->segs[i].live;
    }
    idem__gauge_set(&s->m.live_keys, (int64_t)keys);
    idem__gauge_set(&s->m.store_bytes, (int64_t)bytes);
    idem__gauge_set(&s->m.segments, (int64_t)lg->nsegs);
}

/* ------------------------------------------------------------------------
 * The hot budget: sealed segments going cold, oldest first. */

/* Drop from RAM the entries that point into g, which just went cold:
 * each is its key's newest frame, so g's key index names it (hash and
 * offset), and a walk over that list finds them all at a cost of g's
 * keys, not of every hot key. Slots are loaded a few entries ahead, then
 * the entries they name. */
static void idem__forget_hot(idem__engine *en, const idem__seg *g)
{
    const uint64_t *h0s = g->cold->h0s;
    const uint32_t *offs = g->cold->offs;
    uint64_t n = g->cold->nents;
    enum { AHEAD = 8 };
    for (uint64_t i = 0; i < n; i++) {
        if (i + 2 * AHEAD < n)
            idem__index_prefetch(&en->ix,
                                 (uint64_t[2]){h0s[i + 2 * AHEAD], 0}, 0);
        if (i + AHEAD < n)
            idem__index_prefetch(&en->ix, (uint64_t[2]){h0s[i + AHEAD], 0},
                                 1);
        (void)idem__index_remove_at(&en->ix, h0s[i], g->id, offs[i]);
    }
}

/* g goes cold with c, its key index (written): drop from RAM the
 * entries that point into g; the index names each of those keys'
 * newest frame. g->live keeps counting them (a cold lookup that finds
 * one live and supersedes it counts it down). */
static void idem__cold_in(idem__engine *en, idem__seg *g, idem__cold *c)
{
    idem__log *lg = &en->log;
    g->cold = c;
    lg->ncold++;
    /* Without the filter in front, lookups ask every segment's own:
     * slower, never wrong, so the segment goes cold all the same. */
    (void)idem__cfilter_add(lg, lg->ncold - 1);
    idem__cgroup_went_cold(lg);
    idem__forget_hot(en, g);
}

/* Start the job that indexes g, the oldest hot segment (coldjob.h). */
static int idem__cold_start(idem_store *s, idem__seg *g)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    int rc = idem__log_map(lg, g, (size_t)g->size);
    if (rc)
        return rc;
    idem__segid sg = {g->id, g->size, g->created, g->base};
    idem__cfbuild *b;
    size_t n;
    /* A plan that fails plans nothing: the partitions stay due. */
    (void)idem__cfilter_plan(lg, &b, &n);
    idem__coldjob_start(&lg->job, lg->dirfd, &sg, en->secret, b, n);
    return 0;
}

/* Take the job's index of g and the partitions it built, waiting for
 * it if need be. */
static int idem__cold_finish(idem_store *s, idem__seg *g)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    idem__cold *c;
    idem__cfbuild *b;
    size_t n;
    int werr;
    idem__segid sg = lg->job.sg;
    int rc = idem__coldjob_join(&lg->job, &c, &werr, &b, &n);
    /* Before g's keys are set: the builds hold those of the segments
     * cold when they were planned, which g was not. */
    idem__cfilter_take(lg, b, n);
    if (rc)
        return idem__cold_explain(s, lg->dir, g->id, rc, werr);
    idem__cold_adopt(lg->dirfd, &sg, c);
    idem__cold_in(en, g, c);
    return 0;
}

/* Is the RAM index over its budget, with a sealed segment to spare? Only
 * between groups does it settle, and only a writer's. */
static int idem__over_budget(const idem__engine *en)
{
    const idem__log *lg = &en->log;
    return en->hot_limited && !lg->readonly && !lg->in_group &&
           !lg->broken && en->ix.count > en->hot_keys &&
           lg->ncold + 1 < lg->nsegs;
}

/* While the RAM index holds more keys than the budget, the oldest hot
 * sealed segment goes cold. Its index is built by a job, which the
 * writer waits for only when it is behind: when even the job's segment
 * gone would leave the index over budget. Sealed segments are durable.
 * A failure (a full disk) leaves the segment hot, which is always
 * correct: the next commit tries again. */
static int idem__evict(idem_store *s)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    while (idem__over_budget(en)) {
        idem__seg *g = &lg->segs[lg->ncold];
        if (!lg->job.running && idem__cold_start(s, g))
            return 0;
        int behind = en->ix.count - g->live > en->hot_keys;
        if (!behind && !idem__coldjob_finished(&lg->job))
            return 0;
        if (idem__cold_finish(s, g))
            return 0;
    }
    return 0;
}

/* After open: what cold segments hold that RAM must know, the greatest
 * token and checkpoints no newer frame replaced, newest first. */
static int idem__cold_import(idem_store *s)
{
    idem__engine *en = idem__eng(s);
    idem__log *lg = &en->log;
    for (size_t i = lg->ncold; i-- > 0;) {
        idem__seg *g = &lg->segs[i];
        idem__token_seen(en, g->cold->max_token);
        int sound = g->cold->nckpts ? idem__log_cold_sound(lg, g) : 0;
        if (sound)
            return sound;
        for (uint32_t j = g->cold->nckpts; j-- > 0;) {
            idem__frame f;
            uint32_t off = g->cold->ckpts[j];
            int rc = idem__read_frame(s, g->id, off, &f);
            if (rc)
                return rc;
            if (!idem__ckpt_find(en, f.key, f.keylen) &&
                idem__ckpt_set(en, f.key, f.keylen, g->id, off))
                return idem__fail(s, IDEM_ENOMEM, "out of memory");
        }
    }
    return 0;
}

static int idem__eng_stats(idem_store *s, idem_stats *out)
{
    idem__engine *en = idem__eng(s);
    int64_t now = idem__now(s);
    out->live_keys = en->ix.count;
    for (uint32_t id = 0; id < en->ix.hw; id++) {
        idem__ient *e = idem__index_at(&en->ix, id);
        const unsigned char *p;
        size_t avail;
        idem__frame f;
        if (e->seg == IDEM__IENT_FREE || now >= e->expires ||
            idem__log_at(&en->log, e->seg, e->off, &p, &avail) ||
            idem__frame_decode(p, avail, &f, 0))
            continue;
        out->pending += f.rec.state == IDEM_STATE_PENDING;
        out->done += f.rec.state == IDEM_STATE_DONE;
        out->failed += f.rec.state == IDEM_STATE_FAILED;
    }
    const idem__log *lg = &en->log;
    out->segments = lg->nsegs;
    for (size_t i = 0; i < lg->ncold; i++)
        out->disk_bytes += lg->segs[i].cold->len;
    for (size_t i = 0; i < lg->nsegs; i++)
        out->disk_bytes += lg->segs[i].size;
    out->disk_bytes += lg->wbuf.len;
    out->index_bytes = idem__index_bytes(&en->ix);
    out->hot_keys = en->ix.count;
    for (size_t i = 0; i < lg->ncold; i++) {
        out->cold_keys += lg->segs[i].live;
        out->cold_index_bytes += idem__cold_bytes(lg->segs[i].cold);
        out->cold_segments++;
    }
    out->cold_front_bytes = idem__cfilter_bytes(&lg->cf);
    out->cold_index_bytes += out->cold_front_bytes;
    out->live_keys += out->cold_keys;
    out->cold_lookups = en->cold_lookups;
    out->filter_probes = en->filter_probes;
    out->index_searches = en->searches;
    out->filter_false_positives = en->bloom_fp + en->merged_fp;
    out->front_false_positives = en->merged_fp;
    out->filters_asked = en->asked;
    out->cold_reads = en->cold_reads;
    out->cold_rebuilt = lg->kix_rebuilt;
    out->oldest_ms = lg->nsegs ? lg->segs[0].created : 0;
    out->newest_ms = lg->nsegs ? lg->segs[lg->nsegs - 1].created : 0;
    out->expired_total = en->expired_total;
    out->segments_dropped = en->dropped_total;
    out->records_copied = en->copied_total;
    return 0;
}

/* ------------------------------------------------------------------------
 * Open and close */

/* Recovery: make the index agree with one committed frame. */
static int idem__apply_one(idem_store *s, idem__seg *g, uint32_t off,
                           const idem__frame *f, const uint64_t h[2],
                           int64_t now)
{
    idem__engine *en = idem__eng(s);
    idem__token_seen(en, f->rec.token);
    if (f->type == IDEM__R_CHECKPOINT)
        return idem__ckpt_set(en, f->key, f->keylen, g->id, off)
                   ? idem__fail(s, IDEM_ENOMEM, "out of memory")
                   : 0;
    idem__ient *e = idem__index_find(&en->ix, h);
    if (e && e->expires != INT64_MIN) {
        /* Older frame of the key: in g itself (not yet in the log) or in
         * an earlier segment. */
        idem__seg *old = idem__log_seg(&en->log, e->seg);
        (old ? old : g)->live--;
    }
    if (f->type == IDEM__R_FORGET || f->rec.expires <= now) {
        if (!e && idem__may_shadow(en, h, g->id, now)) {
            if (idem__index_reserve(&en->ix, 1))
                return idem__fail(s, IDEM_ENOMEM, "out of memory");
            e = idem__index_insert(&en->ix, h);
        }
        if (e) {
            e->seg = g->id;
            e->off = off;
            idem__bury(en, e, now);
        }
    } else {
        if (!e && idem__index_reserve(&en->ix, 1))
            return idem__fail(s, IDEM_ENOMEM, "out of memory");
        e = e ? e : idem__index_insert(&en->ix, h);
        e->seg = g->id;
        e->off = off;
        e->expires = f->rec.expires;
        g->live++;
    }
    if (f->type != IDEM__R_FORGET && f->rec.expires > g->max_expires)
        g->max_expires = f->rec.expires;
    return 0;
}

static int idem__apply(void *ctx, idem__seg *g, const uint32_t *off,
                       const idem__frame *f, size_t n)
{
    idem_store *s = ctx;
    idem__engine *en = idem__eng(s);
    int64_t now = idem__now(s);
    uint64_t h[IDEM__APPLY_WINDOW][2];
    for (size_t i = 0; i < n; i++) {
        idem__hash(en, f[i].key, f[i].keylen, h[i]);
        idem__index_prefetch(&en->ix, h[i], 0);
    }
    for (size_t i = 0; i < n; i++)
        idem__index_prefetch(&en->ix, h[i], 1);
    for (size_t i = 0; i < n; i++) {
        int rc = idem__apply_one(s, g, off[i], &f[i], h[i], now);
        if (rc)
            return rc;
    }
    return 0;
}

static int idem__reserve(void *ctx, uint64_t records)
{
    idem_store *s = ctx;
    if (records > SIZE_MAX / 2 ||
        idem__index_presize(&idem__eng(s)->ix, (size_t)records))
        return idem__fail(s, IDEM_ENOMEM, "out of memory for %llu records",
                          (unsigned long long)records);
    return 0;
}

static void idem__engine_free(idem__engine *en)
{
    idem__log_close(&en->log);
    idem__index_free(&en->ix);
    for (size_t i = 0; i < en->nckpts; i++)
        free(en->ckpts[i].name);
    free(en->ckpts);
    if (en->lockfd >= 0)
        close(en->lockfd);
    free(en);
}

static int idem__engine_new(idem_store *s, int memory)
{
    idem__engine *en = calloc(1, sizeof *en);
    if (!en)
        return idem__fail(s, IDEM_ENOMEM, "out of memory");
    en->lockfd = -1;
    en->log.s = s;
    en->log.memory = memory;
    en->log.dirfd = -1;
    en->log.segment_bytes = s->opts.segment_bytes;
    en->log.segment_span_ms = s->opts.segment_span_ms;
    en->log.secret = en->secret;
    idem__index_init(&en->ix);
    s->impl = en;
    return 0;
}

static int idem__eng_close(idem_store *s)
{
    idem__engine *en = idem__eng(s);
    /* A broken log keeps its unsynced changes from the disk: say so. In a
     * fork child the buffer is a stale copy of the parent's, the files
     * and the lock are the parent's: free the memory, write nothing (the
     * descriptors closed here are the child's own; the lock stays with
     * the parent's). */
    /* A fork child has no such threads (threads do not survive fork). */
    if (idem__forked(s))
        idem__coldjob_abandon(&en->log.job);
    int synced = idem__forked(s) ? 0 : idem__log_sync_wait(&en->log);
    int rc = idem__forked(s)     ? 0
             : en->log.broken ? en->log.broken
             : synced         ? synced
                              : idem__log_seal(&en->log);
    /* The filter in front of the cold segments is derived data: open
     * builds it again from the key indexes when its file is missing,
     * old or damaged, so a failure to save it is no failure of close
     * (every record is durable by now). */
    if (!rc && !idem__forked(s))
        (void)idem__cfilter_save(&en->log);
    idem__engine_free(en);
    s->impl = NULL;
    return rc;
}

/* When PATH/TAIL was last replaced (it is replaced whole, by rename), or
 * zeros when there is none. */
static void idem__tail_stamp(int dirfd, struct stat *st)
{
    if (fstatat(dirfd, IDEM__TAIL, st, 0) != 0)
        memset(st, 0, sizeof *st);
}

static int idem__tail_moved(int dirfd, const struct stat *was)
{
    struct stat now;
    idem__tail_stamp(dirfd, &now);
    return now.st_ino != was->st_ino ||
           now.st_ctim.tv_sec != was->st_ctim.tv_sec ||
           now.st_ctim.tv_nsec != was->st_ctim.tv_nsec;
}

/* The URI's hot= and segment= (docs/uri.md); a segment size there may
 * be below what idem_opts allows, down to 1 byte (a segment per commit),
 * which is how the tests send every key through cold segments. */
static void idem__knobs_apply(idem__engine *en, const idem__dir_knobs *k)
{
    uint64_t hot = k->hot_set ? k->hot : IDEM__HOT_DEFAULT;
    en->hot_limited = 1;
    en->hot_keys = hot / IDEM__HOT_KEY_BYTES;
    if (k->segment)
        en->log.segment_bytes = k->segment;
}

/* A reader's load is over, with rc: did it meet a writer or a repair
 * half way (see idem__open_local)? *moved says so; a load that
 * succeeded on a walk that a repair cut through fails. */
static int idem__reader_settle(idem_store *s, int rc, const struct stat *tail,
                               int *moved)
{
    idem__log *lg = &idem__eng(s)->log;
    int cut = idem__log_renumbered(lg);
    *moved = cut || (rc && idem__tail_moved(lg->dirfd, tail));
    return rc || !cut ? rc
                      : idem__fail(s, IDEM_ELOCKED,
                                   "%s: a repair renumbered the segments "
                                   "while they were read; open the store "
                                   "again once it is over", lg->dir);
}

/* Open the store at rest once; *moved (readers only) says whether it
 * must be read again (idem__reader_settle). */
static int idem__load_local(idem_store *s, const char *rest, int *moved)
{
    struct stat tail;
    int rc = idem__engine_new(s, 0);
    if (rc)
        return rc;
    idem__engine *en = idem__eng(s);
    int readonly = (s->opts.flags & IDEM_O_READONLY) != 0;
    unsigned how = readonly ? IDEM__DIR_NOCREATE | IDEM__DIR_NOLOCK
                   : s->opts.flags & IDEM_O_NOCREATE ? IDEM__DIR_NOCREATE
                                                     : 0;
    en->log.readonly = readonly;
    idem__dir_knobs k;
    rc = idem__dir_uri(s, rest, &en->log.dir, &how, &k);
    idem__knobs_apply(en, &k);
    const char *path = en->log.dir;
    if (!rc)
        rc = idem__dir_open(s, path, how, &en->log.dirfd, &en->lockfd);
    if (!rc && readonly)
        idem__tail_stamp(en->log.dirfd, &tail);
    if (!rc)
        rc = idem__dir_secret(s, en->log.dirfd, path,
                              (how & IDEM__DIR_NOCREATE) != 0, en->secret);
    if (!rc)
        rc = idem__recover(&en->log, idem__now(s), idem__apply,
                           idem__reserve, s);
    if (!rc)
        rc = idem__cold_import(s);
    if (!rc)
        rc = idem__evict(s);
    if (!rc)
        idem__dir_warn_open(s, en->log.dirfd, path);
    if (readonly && en->log.dirfd >= 0)
        rc = idem__reader_settle(s, rc, &tail, moved);
    if (rc) {
        idem__engine_free(en);
        s->impl = NULL;
    }
    return rc;
}

/* A reader (IDEM_O_READONLY) takes no lock, so the store's writer may
 * start a segment or drop one while the reader lists and reads them.
 * Each such step replaces PATH/TAIL, after a new segment's header and
 * before an old segment's unlink, so a read that fails while PATH/TAIL
 * changed under it may have met the writer half way, and is done again.
 * A writer's torn group past its last commit is no failure: a reader
 * leaves it unread, as a torn tail (see idem__recover()). A repair, which
 * holds the lock as a writer does, renumbers segments under the names a
 * reader listed; a read that it cut through, failed or not, is done
 * again too (see idem__log_renumbered), and one still cut on the last
 * try fails: a repair is finite, a writer's steps cut nothing, so the
 * tries run out only while repairs follow one another. */
static int idem__open_local(idem_store *s, const char *rest)
{
    int rc, moved = 0;
    for (int tries = 0; tries < 16; tries++)
        if (!(rc = idem__load_local(s, rest, &moved)) || !moved)
            break;
    return rc;
}

static int idem__open_mem(idem_store *s, const char *rest)
{
    if (*rest)
        return idem__fail(s, IDEM_EINVAL, "mem: takes no path ('%s')", rest);
    int rc = idem__engine_new(s, 1);
    idem__engine *en = idem__eng(s);
    if (!rc && idem__random_bytes(en->secret, sizeof en->secret))
        rc = idem__fail(s, IDEM_EIO, "getrandom failed");
    if (!rc)
        rc = idem__log_new_segment(&en->log, idem__now(s));
    if (rc && s->impl) {
        idem__engine_free(en);
        s->impl = NULL;
    }
    return rc;
}

#define IDEM__ENGINE_OPS                                                   \
    .close = idem__eng_close, .claim_many = idem__eng_claim_many,          \
    .complete_many = idem__eng_complete_many, .fail = idem__eng_fail,      \
    .extend = idem__eng_extend, .get = idem__eng_get,                      \
    .forget = idem__eng_forget, .sync = idem__eng_sync,                    \
    .sync_start = idem__eng_sync_start,                                    \
    .sync_wait = idem__eng_sync_wait,                                      \
    .checkpoint_put = idem__eng_ckpt_put,                                  \
    .checkpoint_get = idem__eng_ckpt_get, .sweep = idem__eng_sweep,        \
    .stats = idem__eng_stats, .gauges = idem__eng_gauges,                  \
    .scan = idem__eng_scan,                                                \
    .import = idem__eng_import, .poison = idem__eng_poison,                \
    .caps = IDEM__CAP_CLAIM_DONE | IDEM__CAP_EXCLUSIVE |                   \
            IDEM__CAP_GROUP_COMMIT | IDEM__CAP_SEGMENTS

const struct idem__backend idem__backend_local = {
    .scheme = "local", .open = idem__open_local,
    .check = idem__local_check, IDEM__ENGINE_OPS};
const struct idem__backend idem__backend_mem = {
    .scheme = "mem", .open = idem__open_mem, IDEM__ENGINE_OPS};
