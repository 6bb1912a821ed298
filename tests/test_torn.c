/* tests/test_torn.c - torn and garbled writes, simulated at every byte.
 *
 * A store gets ten synced batches. Then its newest segment is cut at every
 * byte offset of its last three batches, and garbled at every byte of its
 * last batch: each time the store must open and hold exactly the batches
 * committed before the damage. Damage to committed data elsewhere must be
 * refused with a clear error, and repair must keep every valid record.
 * After a clean close nothing is a torn tail: garbage in the last group,
 * a zeroed or cut end, a deleted newest segment are all refused. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "common.h"
#include "local/record.h"

enum { BATCHES = 10, PER = 8 };

static char *dir;
static char seg_path[4300];
static unsigned char *orig;   /* the newest segment as written */
static size_t orig_len;
static size_t ends[BATCHES];  /* its length after each batch's commit */
static const char *query = "";  /* "?hot=0": the older segments go cold */

static const char *store_uri(void)
{
    static char uri[4400];
    snprintf(uri, sizeof uri, "%s%s", t_local_uri(dir), query);
    return uri;
}

static void key_of(char *buf, size_t n, int b, int i)
{
    snprintf(buf, n, "batch%d-key%d", b, i);
}

static void load_file(const char *path, unsigned char **p, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *p = malloc(*n);
    cr_assert(*p);
    cr_assert_eq(fread(*p, 1, *n, f), *n);
    fclose(f);
}

static void write_file(const char *path, const unsigned char *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_TRUNC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, p, n), (ssize_t)n);
    close(fd);
}

/* How build() leaves the store: closed, or as a kill -9 right after the
 * last sync would (its tail file not yet sealed by a close). */
enum { CLOSED, KILLED };

static void build(uint64_t segment_bytes, int how)
{
    dir = t_tmpdir();
    idem_opts o = t_options();
    /* Below what idem_opts takes, the URI's segment= sets the size. */
    char uri[4500];
    snprintf(uri, sizeof uri, "%s%ssegment=%llu", store_uri(),
             *query ? "&" : "?", (unsigned long long)segment_bytes);
    idem_store *s;
    cr_assert_eq(idem_open(uri, &o, &s), 0);
    for (int b = 0; b < BATCHES; b++) {
        for (int i = 0; i < PER; i++) {
            char key[32];
            key_of(key, sizeof key, b, i);
            idem_key k = {key, strlen(key), NULL};
            idem_outcome out;
            cr_assert_eq(idem_claim(s, &k, NULL, &out), 0);
            cr_assert_eq(idem_complete(s, key, strlen(key), out.token, key,
                                       strlen(key), 0),
                         0);
        }
        cr_assert_eq(idem_sync(s), 0);
        idem_stats st;
        idem_stats_get(s, &st);
        snprintf(seg_path, sizeof seg_path, "%s/seg-%08llu.log", dir,
                 (unsigned long long)(st.segments));
        struct stat sb;
        cr_assert_eq(stat(seg_path, &sb), 0);
        ends[b] = (size_t)sb.st_size;
    }
    char tail[4300];
    snprintf(tail, sizeof tail, "%s/TAIL", dir);
    size_t tail_len = 0;
    char *unsealed = how == KILLED ? t_read(tail, &tail_len) : NULL;
    cr_assert_eq(idem_close(s), 0);
    if (how == KILLED)
        t_write(tail, unsealed, tail_len);
    free(unsealed);
    load_file(seg_path, &orig, &orig_len);
}

/* Open, and check that batches [0, good) are DONE and the rest absent. */
static void expect_batches(int good, const char *what, size_t at)
{
    idem_store *s;
    idem_opts o = t_options();
    int rc = idem_open(store_uri(), &o, &s);
    cr_assert_eq(rc, 0, "%s at %zu: %s", what, at, idem_errdetail(s));
    for (int b = 0; b < BATCHES; b++) {
        for (int i = 0; i < PER; i++) {
            char key[32];
            key_of(key, sizeof key, b, i);
            idem_record r;
            rc = idem_get(s, key, strlen(key), &r);
            if (b < good)
                cr_assert(rc == 0 && r.state == IDEM_STATE_DONE &&
                              r.len == strlen(key),
                          "%s at %zu: %s lost", what, at, key);
            else
                cr_assert_eq(rc, IDEM_ENOTFOUND, "%s at %zu: %s survived",
                             what, at, key);
        }
    }
    idem_close(s);
}

/* Batches wholly committed in the first `len` bytes. */
static int committed_in(size_t len)
{
    int good = 0;
    while (good < BATCHES && ends[good] <= len)
        good++;
    return good;
}

static void cut_at_every_offset(void)
{
    for (size_t at = ends[BATCHES - 4]; at < orig_len; at++) {
        write_file(seg_path, orig, at);
        expect_batches(committed_in(at), "cut", at);
    }
    write_file(seg_path, orig, orig_len);
    expect_batches(BATCHES, "intact", orig_len);
}

static void garble_every_byte_of_last_batch(void)
{
    unsigned char *bad = malloc(orig_len);
    cr_assert(bad);
    for (size_t at = ends[BATCHES - 2]; at < orig_len; at++) {
        memcpy(bad, orig, orig_len);
        bad[at] ^= 0x5a;
        write_file(seg_path, bad, orig_len);
        expect_batches(BATCHES - 1, "garble", at);
    }
    free(bad);
}

Test(torn, cut_at_every_offset, .timeout = 300)
{
    build(64u << 20, KILLED);
    cut_at_every_offset();
    t_rmdir(dir);
}

Test(torn, garble_every_byte_of_last_batch, .timeout = 300)
{
    build(64u << 20, KILLED);
    garble_every_byte_of_last_batch();
    t_rmdir(dir);
}

/* A segment per batch and no hot budget: batches 0..8 are in cold
 * segments (key indexes, the filters in front of them, PATH/COLD written
 * at each close and adopted at each open), batch 9 in the newest. Cut or
 * garbled anywhere past its header, the newest loses batch 9 alone. */
Test(torn, cold_segments_and_a_torn_newest, .timeout = 600)
{
    query = "?hot=0";
    build(1, KILLED);
    cr_assert_eq(orig_len, ends[BATCHES - 1]);
    for (size_t at = 32; at <= orig_len; at++) {
        write_file(seg_path, orig, at);
        expect_batches(at == orig_len ? BATCHES : BATCHES - 1, "cut", at);
    }
    idem_store *s;
    idem_opts o = t_options();
    cr_assert_eq(idem_open(store_uri(), &o, &s), 0);
    idem_stats st;
    cr_assert_eq(idem_stats_read(s, &st, sizeof st), 0);
    cr_assert_geq(st.cold_segments, BATCHES - 1);
    idem_close(s);
    char cold[4400];
    snprintf(cold, sizeof cold, "%s/COLD", dir);
    cr_assert_eq(access(cold, F_OK), 0);
    t_rmdir(dir);
}

/* Frame f as version 2 wrote it (record.h), at dst; its length. A
 * COMMIT's created is where its group begins in the new bytes. */
static size_t put_version_2(unsigned char *dst, const idem__frame *f)
{
    size_t len = (80 + f->keylen + f->vallen + 7) & ~(size_t)7;
    memset(dst, 0, len);
    uint32_t l = (uint32_t)len, keylen = f->keylen, vallen = f->vallen;
    memcpy(dst + 8, &l, 4);
    dst[12] = 2;
    dst[13] = f->type;
    dst[14] = f->rec.state;
    dst[15] = (uint8_t)((f->rec.has_fp ? 1 : 0) | (f->rec.released ? 2 : 0));
    memcpy(dst + 16, &f->rec.attempts, 4);
    memcpy(dst + 20, &keylen, 4);
    memcpy(dst + 24, &f->rec.created, 8);
    memcpy(dst + 32, &f->rec.expires, 8);
    memcpy(dst + 40, &f->rec.lease, 8);
    memcpy(dst + 48, f->rec.fp, 16);
    memcpy(dst + 64, &vallen, 4);
    memcpy(dst + 72, &f->rec.token, 8);
    memcpy(dst + 80, f->key, f->keylen);
    memcpy(dst + 80 + f->keylen, f->val, f->vallen);
    uint64_t check = XXH3_64bits(dst + 8, len - 8);
    memcpy(dst, &check, 8);
    return len;
}

/* Frame f as version 3 wrote it (record.h), at dst; its length. */
static size_t put_version_3(unsigned char *dst, const idem__frame *f)
{
    const idem__rec *r = &f->rec;
    unsigned char opt[64];
    size_t n = 0;
    uint8_t flags = (uint8_t)((r->has_fp ? IDEM__RF_FP : 0) |
                              (r->released ? IDEM__RF_RELEASED : 0));
    int64_t ttl = r->expires - r->created;
    if (r->attempts > 0xffff) {
        memcpy(opt + n, &r->attempts, 4), n += 4;
        flags |= IDEM__RF_ATT32;
    }
    if (ttl != (int32_t)ttl) {
        memcpy(opt + n, &r->expires, 8), n += 8;
        flags |= IDEM__RF_EXP64;
    }
    if (r->lease) {  /* the test's leases fit 32 bits */
        int32_t d = (int32_t)(r->lease - r->created);
        memcpy(opt + n, &d, 4), n += 4;
        flags |= IDEM__RF_LEASE;
    }
    if (f->vallen) {
        memcpy(opt + n, &f->vallen, 4), n += 4;
        flags |= IDEM__RF_VAL;
    }
    if (r->has_fp)
        memcpy(opt + n, r->fp, 16), n += 16;
    size_t len = (40 + n + f->keylen + f->vallen + 7) & ~(size_t)7;
    memset(dst, 0, len);
    uint32_t l = (uint32_t)len;
    uint16_t keylen = (uint16_t)f->keylen, att = (uint16_t)r->attempts;
    int32_t t32 = flags & IDEM__RF_EXP64 ? 0 : (int32_t)ttl;
    memcpy(dst + 8, &l, 4);
    dst[12] = 3;
    dst[13] = f->type;
    dst[14] = r->state;
    dst[15] = flags;
    memcpy(dst + 16, &keylen, 2);
    memcpy(dst + 18, &att, 2);
    memcpy(dst + 20, &r->created, 8);
    memcpy(dst + 28, &t32, 4);
    memcpy(dst + 32, &r->token, 8);
    memcpy(dst + 40, opt, n);
    memcpy(dst + 40 + n, f->key, f->keylen);
    memcpy(dst + 40 + n + f->keylen, f->val, f->vallen);
    uint64_t check = XXH3_64bits(dst + 8, len - 8);
    memcpy(dst, &check, 8);
    return len;
}

/* LEB128, and its zigzag form, as record.h states them. */
static size_t put_varint(unsigned char *q, uint64_t v)
{
    size_t n = 0;
    for (; v >= 0x80; v >>= 7)
        q[n++] = (unsigned char)(v | 0x80);
    q[n++] = (unsigned char)v;
    return n;
}

static size_t put_zigzag(unsigned char *q, uint64_t v)
{
    return put_varint(q, (v << 1) ^ (uint64_t)((int64_t)v >> 63));
}

/* A difference in ms as version 4 wrote it: in the largest of ms, s,
 * min, h that divides it, whose code goes into *flags at bit `at`. */
static size_t put_diff(unsigned char *q, uint64_t d, unsigned *flags,
                       unsigned at)
{
    static const int64_t units[] = {3600000, 60000, 1000};
    int64_t v = (int64_t)d;
    for (unsigned u = 0; u < 3; u++)
        if (v % units[u] == 0) {
            *flags |= (3 - u) << at;
            return put_zigzag(q, (uint64_t)(v / units[u]));
        }
    return put_zigzag(q, d);
}

/* Frame f as version 4 wrote it (record.h), at dst; its length. */
static size_t put_version_4(unsigned char *dst, const idem__frame *f)
{
    const idem__rec *r = &f->rec;
    uint64_t created = (uint64_t)r->created, d = r->token / 1000 - created;
    unsigned char st[128];
    size_t n = 2;
    st[0] = (unsigned char)(f->type | r->state << 4 |
                            (r->attempts == 1 ? IDEM__K4_ATT1 : 0) |
                            (d == 0 ? IDEM__K4_NODIFF : 0));
    unsigned flags = (r->has_fp ? IDEM__R4_FP : 0) |
                     (r->released ? IDEM__R4_RELEASED : 0) |
                     (r->lease ? IDEM__R4_LEASE : 0) |
                     (f->vallen ? IDEM__R4_VAL : 0);
    n += put_varint(st + n, f->keylen);
    if (r->attempts != 1)
        n += put_varint(st + n, r->attempts);
    n += put_varint(st + n, r->token);
    if (d)
        n += put_zigzag(st + n, d);
    n += put_diff(st + n, (uint64_t)r->expires - created, &flags,
                  IDEM__R4_TTL_UNIT);
    if (r->lease)
        n += put_diff(st + n, (uint64_t)r->lease - created, &flags,
                      IDEM__R4_LEASE_UNIT);
    st[1] = (unsigned char)flags;
    if (f->vallen)
        n += put_varint(st + n, f->vallen);
    if (r->has_fp)
        memcpy(st + n, r->fp, 16), n += 16;
    for (; n < 8; n++)
        st[n] = 0;
    size_t len = (5 + n + f->keylen + f->vallen + 3) & ~(size_t)3;
    memset(dst, 0, len);
    memcpy(dst + 4, st, 8);
    dst[12] = 4;
    memcpy(dst + 13, st + 8, n - 8);
    memcpy(dst + 5 + n, f->key, f->keylen);
    memcpy(dst + 5 + n + f->keylen, f->val, f->vallen);
    uint32_t check = (uint32_t)XXH3_64bits(dst + 4, len - 4);
    memcpy(dst, &check, 4);
    return len;
}

/* Rewrite the newest segment (orig) in frames of an older version, as
 * an idem before version 5 wrote it (put), and move ends[] with it. */
static void make_version(size_t (*put)(unsigned char *, const idem__frame *))
{
    unsigned char *out = calloc(1, orig_len * 4 + 64);
    cr_assert(out);
    memcpy(out, orig, 32);
    size_t at = 32, to = 32, group = 32;
    int b = 0;
    while (at < orig_len) {
        idem__frame f;
        cr_assert_eq(idem__frame_decode(orig + at, orig_len - at, &f, 1), 0);
        if (f.type == IDEM__R_COMMIT)
            f.rec.created = (int64_t)group;
        to += put(out + to, &f);
        at += f.len;
        if (f.type == IDEM__R_COMMIT) {
            group = to;
            if (b < BATCHES && ends[b] == at)
                ends[b++] = to;
        }
    }
    cr_assert_eq(b, BATCHES);
    free(orig);
    orig = out;
    orig_len = to;
    write_file(seg_path, orig, orig_len);
}

/* Frames of an older version are still read, and torn ones are cut as
 * before. */
static void old_frames_cut_and_garbled(
    size_t (*put)(unsigned char *, const idem__frame *))
{
    build(64u << 20, KILLED);
    make_version(put);
    /* Each open seals the tail: the second run starts from the kill's. */
    char tail[4300];
    snprintf(tail, sizeof tail, "%s/TAIL", dir);
    size_t tail_len;
    char *killed = t_read(tail, &tail_len);
    cut_at_every_offset();
    t_write(tail, killed, tail_len);
    free(killed);
    garble_every_byte_of_last_batch();
    t_rmdir(dir);
}

Test(torn, version_2_frames_cut_and_garbled, .timeout = 600)
{
    old_frames_cut_and_garbled(put_version_2);
}

Test(torn, version_3_frames_cut_and_garbled, .timeout = 600)
{
    old_frames_cut_and_garbled(put_version_3);
}

Test(torn, version_4_frames_cut_and_garbled, .timeout = 600)
{
    old_frames_cut_and_garbled(put_version_4);
}

/* Frame buf of len bytes, its version byte made v and its check
 * recomputed, into out. */
static void as_version(unsigned char *out, const unsigned char *buf,
                       size_t len, unsigned char v)
{
    memcpy(out, buf, len);
    out[12] = v;
    uint32_t check = (uint32_t)XXH3_64bits(out + 4, len - 4);
    memcpy(out, &check, 4);
}

/* A version 5 frame as a build that reads up to version 4 sees it: of
 * the same length, so refused as newer, not as damage; and one of a
 * later version is refused so here. */
static void measured_by_older_builds(const unsigned char *buf, size_t len)
{
    unsigned char *old = malloc(len + 64);
    cr_assert(old);
    idem__frame f;
    as_version(old, buf, len, 4);
    cr_assert_eq(idem__frame_decode(old, len, &f, 1), 0);
    cr_assert_eq(f.len, len);
    as_version(old, buf, len, IDEM__REC_VERSION + 1);
    cr_assert_eq(idem__frame_decode(old, len, &f, 1), IDEM_EVERSION);
    free(old);
}

/* Records of every shape the writer makes, as version 5 frames: each
 * decodes to what was encoded; cut at any length short of whole, or with
 * any one byte garbled (three ways), it does not decode at all. A claim
 * of a 36-byte key takes 56 bytes, with its token at the clock or 100 s
 * ahead of it (version 4: 60). */
Test(torn, version_5_frame_cut_and_garbled_at_every_byte, .timeout = 60)
{
    static const unsigned char fp[16] = "0123456789abcdef";
    const int64_t now = 1767225600123LL;
    idem__rec recs[] = {
        {.state = IDEM_STATE_PENDING, .attempts = 1,
         .token = (uint64_t)now * 1000 + 7, .created = now,
         .expires = now + 86400000, .lease = now + 30000},
        {.state = IDEM_STATE_DONE, .attempts = 70000, .token = 5,
         .created = now - 12345, .expires = now + 3, .has_fp = 1,
         .lease = now - 12345 + 120000},  /* minutes */
        {.state = IDEM_STATE_PENDING, .released = 1, .attempts = 2,
         .token = IDEM_TOKEN_MAX, .created = -5, .expires = INT64_MAX,
         .lease = INT64_MIN},
        {.created = 4096},  /* a COMMIT: created is an offset */
        {.state = IDEM_STATE_PENDING, .attempts = 1,
         .token = (uint64_t)now * 1000 + 100000000, .created = now,
         .expires = now + 86400000, .lease = now + 30000},
    };
    memcpy(recs[1].fp, fp, 16);
    const uint8_t types[] = {IDEM__R_CLAIM, IDEM__R_COMPLETE, IDEM__R_RELEASE,
                             IDEM__R_COMMIT, IDEM__R_CLAIM};
    const char *key36 = "0123456789abcdef0123456789abcdef0123";
    const char *keys[] = {key36, "k", "", "", key36};
    const char *vals[] = {"", "response", "", "", ""};
    for (size_t i = 0; i < sizeof recs / sizeof *recs; i++) {
        size_t kl = strlen(keys[i]), vl = strlen(vals[i]);
        idem__fplan plan;
        size_t len = idem__frame_plan(&plan, types[i], &recs[i], keys[i], kl,
                                      vals[i], vl);
        unsigned char *buf = malloc(len + 64), *bad = malloc(len + 64);
        cr_assert(buf && bad);
        memset(buf, 0xa5, len + 64);  /* what follows is not zero */
        idem__frame_write(buf, &plan);
        cr_assert_eq(len % IDEM__REC_ALIGN, 0);
        cr_assert_eq(buf[12], IDEM__REC_VERSION);
        idem__frame f;
        cr_assert_eq(idem__frame_decode(buf, len + 64, &f, 1), 0, "%zu", i);
        cr_assert_eq(f.len, len);
        cr_assert_eq(f.type, types[i]);
        cr_assert(f.keylen == kl && !memcmp(f.key, keys[i], kl));
        cr_assert(f.vallen == vl && !memcmp(f.val, vals[i], vl));
        const idem__rec *r = &f.rec;
        cr_assert(r->state == recs[i].state &&
                      r->attempts == recs[i].attempts &&
                      r->token == recs[i].token &&
                      r->created == recs[i].created &&
                      r->expires == recs[i].expires &&
                      r->lease == recs[i].lease &&
                      r->has_fp == recs[i].has_fp &&
                      r->released == recs[i].released &&
                      !memcmp(r->fp, recs[i].fp, 16),
                  "frame %zu does not read back", i);
        measured_by_older_builds(buf, len);
        if (keys[i] == key36) {
            unsigned char v4[128];
            cr_assert_eq(len, 56, "a claim of a 36-byte key");
            cr_assert_eq(put_version_4(v4, &f), i ? 60u : 56u);
        }
        for (size_t cut = 0; cut < len; cut++)
            cr_assert_neq(idem__frame_decode(buf, cut, &f, 1), 0,
                          "frame %zu cut at %zu decodes", i, cut);
        static const unsigned char how[] = {0x01, 0x80, 0xff};
        for (size_t at = 0; at < len; at++)
            for (size_t h = 0; h < sizeof how; h++) {
                memcpy(bad, buf, len + 64);
                bad[at] ^= how[h];
                cr_assert_neq(idem__frame_decode(bad, len + 64, &f, 1), 0,
                              "frame %zu garbled at %zu (^%#x) decodes", i,
                              at, how[h]);
            }
        free(buf);
        free(bad);
    }
}

Test(torn, lost_sectors_of_last_batch, .timeout = 120)
{
    /* The disk kept the end of the last write but not a middle part. */
    build(64u << 20, KILLED);
    unsigned char *bad = malloc(orig_len);
    cr_assert(bad);
    for (size_t at = ends[BATCHES - 2]; at + 512 <= orig_len; at += 64) {
        memcpy(bad, orig, orig_len);
        memset(bad + at, 0, 512);
        write_file(seg_path, bad, orig_len);
        expect_batches(BATCHES - 1, "lost sector", at);
    }
    free(bad);
    t_rmdir(dir);
}

Test(torn, damage_in_committed_data_is_refused, .timeout = 60)
{
    build(64u << 20, CLOSED);
    unsigned char *bad = malloc(orig_len);
    cr_assert(bad);
    memcpy(bad, orig, orig_len);
    size_t at = ends[3] + 100;  /* inside batch 4, long since synced */
    bad[at] ^= 1;
    write_file(seg_path, bad, orig_len);
    idem_store *s;
    idem_opts o = t_options();
    cr_assert_eq(idem_open(t_local_uri(dir), &o, &s), IDEM_ECORRUPT);
    cr_assert(strstr(idem_errdetail(s), "seg-00000001.log"), "%s",
              idem_errdetail(s));
    cr_assert(strstr(idem_errdetail(s), "idem repair"), "%s",
              idem_errdetail(s));
    idem_close(s);
    free(bad);
    t_rmdir(dir);
}

static const char *offset_text(size_t at)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "at offset %zu", at);
    return buf;
}

Test(torn, older_segment_damage_then_repair, .timeout = 60)
{
    build(4096, CLOSED);
    char first[4300];
    snprintf(first, sizeof first, "%s/seg-00000001.log", dir);
    unsigned char *p;
    size_t n;
    load_file(first, &p, &n);
    cr_assert_gt(n, 400);
    /* Frame 1 claims batch0-key0 at offset 32; frame 2 completes it.
     * Damage frame 2. */
    idem__frame f;
    cr_assert_eq(idem__frame_decode(p + 32, n - 32, &f, 1), 0);
    size_t at2 = 32 + f.len;
    p[at2 + 20] ^= 0xff;
    write_file(first, p, n);
    free(p);
    idem_store *s;
    idem_opts o = t_options();
    cr_assert_eq(idem_open(t_local_uri(dir), &o, &s), IDEM_ECORRUPT);
    cr_assert(strstr(idem_errdetail(s), "seg-00000001.log: damaged record"),
              "%s", idem_errdetail(s));
    cr_assert(strstr(idem_errdetail(s), offset_text(at2)), "%s",
              idem_errdetail(s));
    idem_close(s);
    idem_check_report rep;
    cr_assert_eq(idem_check(t_local_uri(dir), &rep), IDEM_ECORRUPT);
    cr_assert_eq(rep.damaged, 1);
    cr_assert(strstr(rep.first_damage, offset_text(at2)), "%s",
              rep.first_damage);
    cr_assert_eq(idem_repair(t_local_uri(dir), &rep), 0, "%s",
                 rep.first_damage);
    cr_assert_eq(rep.damaged, 1);
    cr_assert_eq(idem_check(t_local_uri(dir), &rep), 0, "%s",
                 rep.first_damage);
    /* Every record but the damaged one is back: batch0-key0 is left as
     * its claim record had it, PENDING. */
    cr_assert_eq(idem_open(t_local_uri(dir), &o, &s), 0, "%s",
                 idem_errdetail(s));
    int pending = 0;
    for (int b = 0; b < BATCHES; b++) {
        for (int i = 0; i < PER; i++) {
            char key[32];
            key_of(key, sizeof key, b, i);
            idem_record r;
            int rc = idem_get(s, key, strlen(key), &r);
            cr_assert_eq(rc, 0, "%s lost by repair", key);
            if (r.state == IDEM_STATE_PENDING) {
                pending++;
                cr_assert(b == 0 && i == 0, "%s is PENDING", key);
            } else {
                cr_assert_eq(r.state, IDEM_STATE_DONE, "%s", key);
            }
        }
    }
    cr_assert_eq(pending, 1);
    idem_close(s);
    t_rmdir(dir);
}

Test(torn, check_and_repair_headers_gaps_and_identity, .timeout = 60)
{
    build(1024, CLOSED);  /* five segments or more: 4.. hold batch 9 */
    char path[4300];
    /* A garbled segment header, a lost segment file, a damaged IDEM. */
    snprintf(path, sizeof path, "%s/seg-00000002.log", dir);
    cr_assert_eq(t_sh("printf 'XXXX' | dd of='%s' bs=1 seek=0 conv=notrunc "
                      "2>/dev/null", path), 0);
    snprintf(path, sizeof path, "%s/seg-00000003.log", dir);
    cr_assert_eq(unlink(path), 0);
    snprintf(path, sizeof path, "%s/IDEM", dir);
    cr_assert_eq(t_sh("printf 'junk' | dd of='%s' bs=1 seek=20 conv=notrunc "
                      "2>/dev/null", path), 0);
    idem_check_report rep;
    cr_assert_eq(idem_check(t_local_uri(dir), &rep), IDEM_ECORRUPT);
    cr_assert(strstr(rep.first_damage, "IDEM"), "%s", rep.first_damage);
    cr_assert_geq(rep.damaged, 3);
    idem_store *s;
    idem_opts o = t_options();
    cr_assert_neq(idem_open(t_local_uri(dir), &o, &s), 0);
    idem_close(s);
    cr_assert_eq(idem_repair(t_local_uri(dir), &rep), 0, "%s",
                 rep.first_damage);
    cr_assert_eq(idem_check(t_local_uri(dir), &rep), 0, "%s",
                 rep.first_damage);
    cr_assert_eq(idem_open(t_local_uri(dir), &o, &s), 0, "%s",
                 idem_errdetail(s));
    /* The records of segments 1, 2 (its frames were intact) and 4.. are
     * there; those of the lost file are not. */
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_gt(st.done, BATCHES * PER / 2);
    cr_assert_lt(st.done, BATCHES * PER);
    idem_record r;
    cr_assert_eq(idem_get(s, "batch9-key7", 11, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    idem_close(s);
    t_rmdir(dir);
}

/* A new segment file as a crash during rotation can leave it: created but
 * empty, part of its header written, or (power loss before its fdatasync)
 * its size durable but its header bytes not. */
static void make_fresh_segment(const unsigned char *p, size_t n)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/seg-00000002.log", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    if (n)
        cr_assert_eq(write(fd, p, n), (ssize_t)n);
    close(fd);
}

Test(torn, fresh_segment_with_lost_header_opens, .timeout = 60)
{
    build(64u << 20, CLOSED);
    unsigned char zeros[32] = {0};
    make_fresh_segment(zeros, sizeof zeros);
    expect_batches(BATCHES, "zeroed header", 0);
    /* The store goes on writing after it. */
    idem_store *s = t_open(t_local_uri(dir));
    idem_key k = {"after", 5, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    cr_assert_eq(o.kind, IDEM_NEW);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(t_local_uri(dir));
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    cr_assert_eq(o.kind, IDEM_BUSY);
    idem_close(s);
    t_rmdir(dir);
}
Test(torn, check_and_repair_after_crash_in_rotation, .timeout = 60)
{
    build(64u << 20, CLOSED);
    size_t lens[] = {0, 7, 32};
    unsigned char zeros[32] = {0};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        make_fresh_segment(zeros, lens[i]);
        idem_check_report rep;
        cr_assert_eq(idem_check(t_local_uri(dir), &rep), 0, "%zu: %s",
                     lens[i], rep.first_damage);
        cr_assert_eq(idem_repair(t_local_uri(dir), &rep), 0, "%zu: %s",
                     lens[i], rep.first_damage);
        cr_assert_eq(rep.damaged, 0);
        expect_batches(BATCHES, "repaired fresh segment", lens[i]);
    }
    t_rmdir(dir);
}

Test(torn, bad_header_is_checked_and_repaired, .timeout = 60)
{
    build(4096, CLOSED);
    char first[4300];
    snprintf(first, sizeof first, "%s/seg-00000001.log", dir);
    unsigned char *p;
    size_t n;
    load_file(first, &p, &n);
    p[3] ^= 0xff;  /* inside the magic */
    write_file(first, p, n);
    free(p);
    idem_store *s;
    idem_opts o = t_options();
    cr_assert_eq(idem_open(t_local_uri(dir), &o, &s), IDEM_ECORRUPT);
    cr_assert(strstr(idem_errdetail(s), "idem repair"), "%s",
              idem_errdetail(s));
    idem_close(s);
    idem_check_report rep;
    cr_assert_eq(idem_check(t_local_uri(dir), &rep), IDEM_ECORRUPT);
    cr_assert(strstr(rep.first_damage, "seg-00000001.log"), "%s",
              rep.first_damage);
    cr_assert_eq(idem_repair(t_local_uri(dir), &rep), 0, "%s",
                 rep.first_damage);
    cr_assert_eq(idem_check(t_local_uri(dir), &rep), 0, "%s",
                 rep.first_damage);
    expect_batches(BATCHES, "repaired header", 0);
    t_rmdir(dir);
}

Test(torn, damaged_commit_of_a_synced_group_is_refused, .timeout = 60)
{
    /* The COMMIT that ends batch 8 is damaged; batch 9 follows it whole.
     * No crash does that (batch 8 was synced before batch 9 was written),
     * so it must not pass for a torn batch 9, silently dropping both. */
    build(64u << 20, CLOSED);
    unsigned char *bad = malloc(orig_len);
    cr_assert(bad);
    for (size_t at = ends[BATCHES - 2] - 80; at < ends[BATCHES - 2];
         at += 8) {
        memcpy(bad, orig, orig_len);
        bad[at] ^= 0x5a;
        write_file(seg_path, bad, orig_len);
        idem_store *s;
        idem_opts o = t_options();
        cr_assert_eq(idem_open(t_local_uri(dir), &o, &s), IDEM_ECORRUPT,
                     "damage at %zu: %s", at, idem_errdetail(s));
        idem_close(s);
    }
    /* Repair keeps both batches. */
    cr_assert_eq(idem_repair(t_local_uri(dir), NULL), 0);
    expect_batches(BATCHES, "repaired commit", 0);
    free(bad);
    t_rmdir(dir);
}

/* Open and idem_check() both refuse the store, naming file and where;
 * idem_repair() then leaves a store that checks clean. */
static void expect_refused_then_repaired(const char *file, const char *where)
{
    idem_store *s;
    idem_opts o = t_options();
    cr_assert_eq(idem_open(t_local_uri(dir), &o, &s), IDEM_ECORRUPT,
                 "open: %s", idem_errdetail(s));
    cr_assert(strstr(idem_errdetail(s), file) &&
                  strstr(idem_errdetail(s), where),
              "open: %s", idem_errdetail(s));
    idem_close(s);
    idem_check_report rep;
    cr_assert_eq(idem_check(t_local_uri(dir), &rep), IDEM_ECORRUPT,
                 "check: %s", rep.first_damage);
    cr_assert(strstr(rep.first_damage, file) &&
                  strstr(rep.first_damage, where),
              "check: %s", rep.first_damage);
    cr_assert_eq(idem_repair(t_local_uri(dir), &rep), 0, "%s",
                 rep.first_damage);
    cr_assert_eq(idem_check(t_local_uri(dir), &rep), 0, "%s",
                 rep.first_damage);
}

Test(torn, garbage_in_last_group_after_clean_close, .timeout = 60)
{
    build(64u << 20, CLOSED);
    unsigned char *bad = malloc(orig_len);
    cr_assert(bad);
    memcpy(bad, orig, orig_len);
    srand(9);
    for (size_t i = 0; i < 200; i++)
        bad[ends[BATCHES - 2] + 8 + i] = (unsigned char)rand();
    write_file(seg_path, bad, orig_len);
    free(bad);
    expect_refused_then_repaired("seg-00000001.log: damaged record",
                                 offset_text(ends[BATCHES - 2]));
    /* Repair kept the frames of the last batch the garbage missed. */
    idem_store *s = t_open(t_local_uri(dir));
    idem_record r;
    for (int b = 0; b < BATCHES - 1; b++)
        for (int i = 0; i < PER; i++) {
            char key[32];
            key_of(key, sizeof key, b, i);
            cr_assert_eq(idem_get(s, key, strlen(key), &r), 0, "%s", key);
        }
    cr_assert_eq(idem_get(s, "batch9-key7", 11, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    idem_close(s);
    t_rmdir(dir);
}

Test(torn, zeroed_tail_over_two_groups_after_clean_close, .timeout = 60)
{
    build(64u << 20, CLOSED);
    size_t from = ends[BATCHES - 3] + 20;  /* inside batch 8, then 9 */
    unsigned char *bad = malloc(orig_len);
    cr_assert(bad);
    memcpy(bad, orig, orig_len);
    memset(bad + from, 0, orig_len - from);
    write_file(seg_path, bad, orig_len);
    free(bad);
    expect_refused_then_repaired("seg-00000001.log: damaged record",
                                 offset_text(ends[BATCHES - 3]));
    expect_batches(BATCHES - 2, "repaired zeroed tail", from);
    t_rmdir(dir);
}

Test(torn, newest_segment_cut_at_a_commit_after_clean_close, .timeout = 60)
{
    build(64u << 20, CLOSED);
    write_file(seg_path, orig, ends[BATCHES - 2]);
    expect_refused_then_repaired("seg-00000001.log: truncated",
                                 offset_text(ends[BATCHES - 2]));
    expect_batches(BATCHES - 1, "repaired cut", ends[BATCHES - 2]);
    t_rmdir(dir);
}

Test(torn, newest_segment_deleted, .timeout = 60)
{
    build(4096, CLOSED);
    char name[32];
    snprintf(name, sizeof name, "%s", strrchr(seg_path, '/') + 1);
    cr_assert_neq(strcmp(name, "seg-00000001.log"), 0);
    cr_assert_eq(unlink(seg_path), 0);
    expect_refused_then_repaired(name, "is missing");
    /* Every record of the other segments is there, and the store goes
     * on from the segment that is now the newest. */
    idem_store *s = t_open(t_local_uri(dir));
    idem_record r;
    cr_assert_eq(idem_get(s, "batch0-key0", 11, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(idem_close(s), 0);
    cr_assert_eq(idem_check(t_local_uri(dir), NULL), 0);
    t_rmdir(dir);
}

Test(torn, only_segment_deleted, .timeout = 60)
{
    build(64u << 20, CLOSED);
    cr_assert_eq(unlink(seg_path), 0);
    expect_refused_then_repaired("seg-00000001.log", "is missing");
    expect_batches(0, "repaired empty store", 0);
    t_rmdir(dir);
}

/* Make the segment at path look written by an idem that kept no tail
 * file: header version 1, its checksum recomputed. */
static void make_version_1(const char *path)
{
    size_t len;
    unsigned char *p = (unsigned char *)t_read(path, &len);
    cr_assert(p && len >= 32);
    uint32_t one = 1;
    memcpy(p + 8, &one, 4);
    uint64_t check = XXH3_64bits(p, 24);
    memcpy(p + 24, &check, 8);
    write_file(path, p, len);
    free(p);
}

static void remove_tail_file(void)
{
    char tail[4300];
    snprintf(tail, sizeof tail, "%s/TAIL", dir);
    cr_assert_eq(unlink(tail), 0);
}

Test(torn, store_without_tail_file_opens_as_before, .timeout = 60)
{
    /* A store written before the tail file existed: its newest segment
     * is read by the commits alone, so a torn last batch is cut. */
    build(64u << 20, CLOSED);
    remove_tail_file();
    make_version_1(seg_path);
    free(orig);
    load_file(seg_path, &orig, &orig_len);
    write_file(seg_path, orig, ends[BATCHES - 2] + 100);
    expect_batches(BATCHES - 1, "no tail file", ends[BATCHES - 2] + 100);
    t_rmdir(dir);
}

Test(torn, damaged_tail_file_is_refused_then_repaired, .timeout = 60)
{
    build(64u << 20, CLOSED);
    char tail[4300];
    snprintf(tail, sizeof tail, "%s/TAIL", dir);
    cr_assert_eq(t_sh("printf 'junk' | dd of='%s' bs=1 seek=12 "
                      "conv=notrunc 2>/dev/null", tail), 0);
    expect_refused_then_repaired("TAIL", "damaged");
    expect_batches(BATCHES, "repaired tail file", 0);
    t_rmdir(dir);
}

Test(torn, deleted_tail_file_is_refused_then_repaired, .timeout = 60)
{
    /* Without its tail file, garbage in the last group of a cleanly
     * closed store would pass for a torn group and drop it silently. */
    build(64u << 20, CLOSED);
    remove_tail_file();
    unsigned char *bad = malloc(orig_len);
    cr_assert(bad);
    memcpy(bad, orig, orig_len);
    for (size_t i = 0; i < 200; i++)  /* the last COMMIT too */
        bad[orig_len - 200 + i] ^= 0x5a;
    write_file(seg_path, bad, orig_len);
    free(bad);
    expect_refused_then_repaired("seg-00000001.log: TAIL is missing",
                                 offset_text(32));
    expect_batches(BATCHES - 1, "repaired after the tail file went", 0);
    t_rmdir(dir);
}

Test(torn, deleted_tail_file_of_sound_store_is_repaired_whole, .timeout = 60)
{
    build(4096, CLOSED);
    remove_tail_file();
    expect_refused_then_repaired("TAIL is missing", "at offset 32");
    expect_batches(BATCHES, "repaired tail file", 0);
    t_rmdir(dir);
}

Test(torn, crash_before_the_first_tail_file_is_no_damage, .timeout = 60)
{
    /* A crash between creating the first segment and writing the tail
     * file leaves a header-only segment and no tail file. The next
     * process writes frames there: it must write the tail file first,
     * or the process after it would find frames and no tail file. */
    build(64u << 20, CLOSED);
    remove_tail_file();
    write_file(seg_path, orig, 32);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        idem_store *s;
        idem_opts o = t_options();
        if (idem_open(t_local_uri(dir), &o, &s) != 0)
            _exit(2);
        idem_key k = {"after", 5, NULL};
        idem_outcome out;
        int rc = idem_claim(s, &k, NULL, &out) ||
                 idem_complete(s, "after", 5, out.token, "x", 1, 0) ||
                 idem_sync(s);
        _exit(rc ? 3 : 0);  /* dies without closing, as a kill would */
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: %d", st);
    idem_store *s = t_open(t_local_uri(dir));
    idem_record r;
    cr_assert_eq(idem_get(s, "after", 5, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(idem_close(s), 0);
    cr_assert_eq(idem_check(t_local_uri(dir), NULL), 0);
    t_rmdir(dir);
}
