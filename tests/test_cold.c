/* test_cold.c - keys past the hot budget: key index files, Bloom filters,
 * reopen without replay, and indexes that do not check out.
 *
 * The stores here have no hot budget (hot=0) and a segment per commit
 * (segment=1), so that a key leaves RAM at the commit after its own. The
 * conformance suite runs the same way (conf_cold); these tests look at
 * what only a cold store has: its files, its counters, its reopen. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common.h"
#include "local/cold.h"

#define GROUPS 20
#define PER_GROUP 10

static char uri[4400];
static char *dir;

static void cold_init(void)
{
    dir = t_tmpdir();
    snprintf(uri, sizeof uri, "%s?hot=0&segment=1", t_local_uri(dir));
}

static void cold_fini(void)
{
    t_rmdir(dir);
    free(dir);
}

TestSuite(cold, .init = cold_init, .fini = cold_fini, .timeout = 120);

static void key_of(char *buf, size_t n, int i)
{
    snprintf(buf, n, "order-%d", i);
}

static int claim(idem_store *s, const char *k, idem_outcome *o)
{
    idem_key key = {k, strlen(k), NULL};
    return idem_claim(s, &key, NULL, o);
}

/* GROUPS commits of PER_GROUP keys, each claimed and completed with its
 * own response. */
static void fill(idem_store *s)
{
    for (int g = 0; g < GROUPS; g++) {
        for (int j = 0; j < PER_GROUP; j++) {
            char k[32];
            key_of(k, sizeof k, g * PER_GROUP + j);
            idem_outcome o;
            cr_assert_eq(claim(s, k, &o), 0);
            cr_assert_eq(o.kind, IDEM_NEW);
            cr_assert_eq(idem_complete(s, k, strlen(k), o.token, k,
                                       strlen(k), 0),
                         0);
        }
        cr_assert_eq(idem_sync(s), 0);
    }
}

/* Every key filled replays its own response. */
static void expect_all(idem_store *s)
{
    for (int i = 0; i < GROUPS * PER_GROUP; i++) {
        char k[32];
        key_of(k, sizeof k, i);
        idem_outcome o;
        cr_assert_eq(claim(s, k, &o), 0, "%s", k);
        cr_assert_eq(o.kind, IDEM_REPLAY, "%s: kind %d", k, o.kind);
        cr_assert_eq(o.len, strlen(k));
        cr_assert_eq(memcmp(o.data, k, o.len), 0);
    }
}

static idem_stats stats_of(idem_store *s)
{
    idem_stats st;
    cr_assert_eq(idem_stats_read(s, &st, sizeof st), 0);
    return st;
}

/* idem__cold_lower starts where a uniform hash would be and gallops from
 * there: whatever the values (uniform, bunched at one end, all equal,
 * duplicated), it answers as a scan does: the first entry not below. */
Test(cold, the_index_search_answers_as_a_scan_does)
{
    enum { MAX = 3000 };
    uint64_t *v = malloc(MAX * sizeof *v);
    cr_assert(v);
    uint64_t r = 0x9E3779B97F4A7C15ull;
    for (int shape = 0; shape < 5; shape++)
        for (uint64_t n = 0; n <= MAX; n += n < 20 ? 1 : 997) {
            for (uint64_t i = 0; i < n; i++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                v[i] = shape == 0   ? r
                       : shape == 1 ? r >> 40           /* all near 0 */
                       : shape == 2 ? ~(r >> 40)        /* all near 2^64 */
                       : shape == 3 ? 42                /* all equal */
                                    : (r >> 60) << 60; /* 16 values */
            }
            for (uint64_t i = 1; i < n; i++)  /* insertion sort */
                for (uint64_t j = i; j > 0 && v[j - 1] > v[j]; j--) {
                    uint64_t t = v[j];
                    v[j] = v[j - 1];
                    v[j - 1] = t;
                }
            idem__cold c = {.h0s = v, .nents = n};
            for (uint64_t q = 0; q < 2 * n + 8; q++) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                uint64_t x = q < n ? v[q] - (q & 1) : q & 1 ? r : ~0ull - q;
                uint64_t want = 0;
                while (want < n && v[want] < x)
                    want++;
                uint64_t h[2] = {x, 0};
                cr_assert_eq(idem__cold_lower(&c, h), want,
                             "shape %d n %llu x %llx", shape,
                             (unsigned long long)n, (unsigned long long)x);
            }
        }
    free(v);
}

Test(cold, keys_leave_ram_and_answer_from_disk)
{
    idem_store *s = t_open(uri);
    fill(s);
    idem_stats st = stats_of(s);
    cr_assert_geq(st.cold_segments, GROUPS - 2);
    cr_assert_leq(st.hot_keys, 2 * PER_GROUP, "hot %llu",
                  (unsigned long long)st.hot_keys);
    expect_all(s);
    st = stats_of(s);
    cr_assert_geq(st.cold_reads, (GROUPS - 2) * PER_GROUP);
    cr_assert_geq(st.filter_probes, st.cold_reads);
    T_REPORT("cold: %llu lookups, %llu filter probes, %llu reads, %llu "
             "false positives", (unsigned long long)st.cold_lookups,
             (unsigned long long)st.filter_probes,
             (unsigned long long)st.cold_reads,
             (unsigned long long)st.filter_false_positives);
    cr_assert_eq(idem_close(s), 0);
}

Test(cold, reopen_reads_indexes_not_frames)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(uri);
    idem_stats st = stats_of(s);
    /* A replay would have put every key back in RAM and read frames. */
    cr_assert_eq(st.cold_rebuilt, 0);
    cr_assert_leq(st.hot_keys, 2 * PER_GROUP);
    cr_assert_eq(st.cold_reads, 0);
    expect_all(s);
    cr_assert_eq(idem_close(s), 0);
}

static int exists(const char *name)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* Flip a byte of dir/name at offset at (from the end when negative). */
static void damage(const char *name, long at)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd = open(p, O_RDWR);
    cr_assert_geq(fd, 0, "%s", p);
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    off_t off = at >= 0 ? at : sb.st_size + at;
    unsigned char c;
    cr_assert_eq(pread(fd, &c, 1, off), 1);
    c ^= 0x5a;
    cr_assert_eq(pwrite(fd, &c, 1, off), 1);
    close(fd);
}

/* Zero dir/name from offset at to its end. */
static void zero_from(const char *name, off_t at)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0, "%s", p);
    cr_assert_lt(at, sb.st_size);
    cr_assert_eq(truncate(p, at), 0);
    cr_assert_eq(truncate(p, sb.st_size), 0);
}

static void cut(const char *name, off_t len)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(truncate(p, len), 0);
}

static void rm(const char *name)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(unlink(p), 0, "%s", p);
}

Test(cold, damaged_torn_or_missing_indexes_are_rebuilt)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    damage("seg-00000002.kix", -3);     /* an entry */
    damage("seg-00000003.kix", 200);    /* the filter */
    damage("seg-00000004.kix", 20);     /* the header */
    cut("seg-00000005.kix", 100);       /* torn */
    rm("seg-00000006.kix");             /* missing */
    s = t_open(uri);
    /* Open reads the headers only: a damaged body (an entry, the
     * filter) is found when the index is first used, and built again
     * before anything of it is believed. */
    idem_stats st = stats_of(s);
    cr_assert_eq(st.cold_rebuilt, 3, "rebuilt %llu at open",
                 (unsigned long long)st.cold_rebuilt);
    expect_all(s);
    st = stats_of(s);
    cr_assert_eq(st.cold_rebuilt, 5, "rebuilt %llu",
                 (unsigned long long)st.cold_rebuilt);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(uri);
    cr_assert_eq(stats_of(s).cold_rebuilt, 0, "the rebuilt files hold");
    expect_all(s);
    cr_assert_eq(idem_close(s), 0);
}

/* A reader finds a damaged index body on first use too, and answers
 * from one it builds in memory (a reader writes nothing): never from the
 * damaged one. The file stays as it was for the writer to build again. */
Test(cold, a_reader_checks_an_index_when_first_used)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    damage("seg-00000003.kix", 200);    /* the filter */
    damage("seg-00000004.kix", -3);     /* an entry */
    idem_opts o = t_options();
    o.flags = IDEM_O_READONLY;
    cr_assert_eq(idem_open(uri, &o, &s), 0, "%s", idem_errdetail(s));
    cr_assert_eq(stats_of(s).cold_rebuilt, 0, "open read the headers only");
    for (int i = 0; i < GROUPS * PER_GROUP; i++) {
        char k[32];
        idem_record r;
        key_of(k, sizeof k, i);
        cr_assert_eq(idem_get(s, k, strlen(k), &r), 0, "%s", k);
        cr_assert_eq(r.len, strlen(k));
        cr_assert_eq(memcmp(r.data, k, r.len), 0);
    }
    cr_assert_eq(stats_of(s).cold_rebuilt, 2);
    cr_assert_eq(idem_close(s), 0);
    idem_check_report r = {0};
    cr_assert_eq(idem_check(uri, &r), IDEM_ECORRUPT);
    cr_assert_eq(r.damaged, 2);
    s = t_open(uri);
    expect_all(s);
    cr_assert_eq(stats_of(s).cold_rebuilt, 2);
    cr_assert_eq(idem_close(s), 0);
}

/* An index built from another version of its segment is stale: a
 * segment cut by a repair no longer matches it. */
Test(cold, an_index_of_another_segment_is_not_trusted)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    char a[4400], b[4400];
    snprintf(a, sizeof a, "%s/seg-00000003.kix", dir);
    snprintf(b, sizeof b, "%s/seg-00000004.kix", dir);
    cr_assert_eq(rename(a, b), 0);
    s = t_open(uri);
    cr_assert_eq(stats_of(s).cold_rebuilt, 2);
    expect_all(s);
    cr_assert_eq(idem_close(s), 0);
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Set every bit of the filter in dir/name, bytes [from, from + len) once
 * fields (below) say where, and make the file check out again: the body
 * hash at body_at covers [body_from, end), the header hash at hdr_at
 * covers [0, hdr_at). A filter that answers maybe to every key, yet is
 * whole: every lookup is a forced collision. */
typedef struct filter_at {
    size_t nblocks_at, nsegs_at, blocks_from, body_at, body_from, hdr_at;
} filter_at;

static void saturate(const char *name, const filter_at *fa)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    size_t len;
    unsigned char *img = (unsigned char *)t_read(p, &len);
    cr_assert(img && len > fa->body_from, "%s", p);
    uint64_t nsegs = fa->nsegs_at ? get64(img + fa->nsegs_at) : 0;
    size_t from = fa->blocks_from + nsegs * 32;
    if (fa->nsegs_at)   /* PATH/COLD's blocks start on 64 bytes */
        from = (from + 63) & ~(size_t)63;
    size_t n = get64(img + fa->nblocks_at) * 64;
    cr_assert_leq(from + n, len);
    memset(img + from, 0xff, n);
    uint64_t body = XXH3_64bits(img + fa->body_from, len - fa->body_from);
    memcpy(img + fa->body_at, &body, 8);
    uint64_t hdr = XXH3_64bits(img, fa->hdr_at);
    memcpy(img + fa->hdr_at, &hdr, 8);
    int fd = open(p, O_WRONLY | O_TRUNC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, img, len), (ssize_t)len);
    close(fd);
    free(img);
}

/* The layouts of cold.h and coldfilter.h. */
static const filter_at kix_filter = {40, 0, 128, 80, 128, 120};
/* PATH/COLD: the table of 64 partitions (32 bytes each) precedes the
 * segments. */
static const filter_at cold_filter = {24, 48, 72 + 64 * 32, 56, 72, 64};
/* PATH/grp-N.kgf (coldgroup.h): 16 segment identities precede the
 * blocks. */
static const filter_at group_filter = {24, 0, 64 + 16 * 32, 40, 64, 56};
#define GROUP0 "grp-00000000.kgf"

/* Every filter says maybe to every key: the filter in front and each
 * segment's own. A stranger then costs a search of every cold index and
 * is still new; a key in the oldest segment is searched for in every
 * newer one first and still replays its own response. */
Test(cold, a_filter_false_positive_costs_a_read_not_an_answer)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    for (int id = 1; id <= GROUPS; id++) {
        char k[32];
        snprintf(k, sizeof k, "seg-%08d.kix", id);
        if (exists(k))
            saturate(k, &kix_filter);
    }
    /* A group filter names its segments' indexes by their checksums:
     * the open that follows builds it again for the saturated ones. */
    s = t_open(uri);
    cr_assert_eq(idem_close(s), 0);
    saturate("COLD", &cold_filter);
    cr_assert(exists(GROUP0));
    saturate(GROUP0, &group_filter);
    s = t_open(uri);
    idem_stats st = stats_of(s);
    cr_assert_eq(st.cold_rebuilt, 0, "the saturated files were trusted");
    uint64_t ncold = st.cold_segments;
    cr_assert_geq(ncold, GROUPS - 2);
    idem_record r;
    cr_assert_eq(idem_get(s, "stranger", 8, &r), IDEM_ENOTFOUND);
    st = stats_of(s);
    cr_assert_eq(st.filter_false_positives, ncold + 1);
    cr_assert_eq(st.index_searches, ncold);
    expect_all(s);
    idem_outcome o;
    cr_assert_eq(claim(s, "stranger", &o), 0);
    cr_assert_eq(o.kind, IDEM_NEW);
    cr_assert_eq(idem_close(s), 0);
}

/* PATH/COLD from an earlier clean close lacks the segments that went
 * cold since (a crash kept the newer one from being written): open sets
 * their keys from their indexes. */
Test(cold, an_old_cold_filter_gets_the_newer_segments_keys)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    char p[4400];
    size_t len;
    snprintf(p, sizeof p, "%s/COLD", dir);
    char *old = t_read(p, &len);
    cr_assert(old);
    s = t_open(uri);
    for (int i = 0; i < 30; i++) {
        char k[32];
        snprintf(k, sizeof k, "late-%d", i);
        idem_outcome o;
        cr_assert_eq(claim(s, k, &o), 0);
        cr_assert_eq(idem_sync(s), 0);
    }
    cr_assert_eq(idem_close(s), 0);
    int fd = open(p, O_WRONLY | O_TRUNC);
    cr_assert_eq(write(fd, old, len), (ssize_t)len);
    close(fd);
    free(old);
    s = t_open(uri);
    expect_all(s);
    for (int i = 0; i < 30; i++) {
        char k[32];
        snprintf(k, sizeof k, "late-%d", i);
        idem_outcome o;
        cr_assert_eq(claim(s, k, &o), 0);
        cr_assert_eq(o.kind, IDEM_BUSY, "%s: kind %d", k, o.kind);
    }
    cr_assert_eq(idem_close(s), 0);
}

/* A damaged PATH/COLD is never trusted: open builds it from the key
 * indexes; check reports it, repair deletes it. */
Test(cold, a_damaged_cold_filter_is_built_again)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    char p[4400];
    snprintf(p, sizeof p, "%s/COLD", dir);
    size_t len;
    free(t_read(p, &len));
    damage("COLD", (long)len - 3);   /* a bit of the filter */
    idem_check_report r = {0};
    cr_assert_eq(idem_check(uri, &r), IDEM_ECORRUPT);
    cr_assert_eq(r.damaged, 1);
    cr_assert(strstr(r.first_damage, "COLD"), "%s", r.first_damage);
    s = t_open(uri);
    expect_all(s);
    cr_assert_eq(idem_close(s), 0);
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_check(uri, &r), 0, "%s", r.first_damage);
    damage("COLD", 20);   /* the header */
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_repair(uri, &r), 0);
    cr_assert(!exists("COLD"));
    s = t_open(uri);
    expect_all(s);
    cr_assert_eq(idem_close(s), 0);
}

/* Once the 16 segments of a group are cold their keys' filter is written
 * beside them, and a lookup asks only the segments of the groups that
 * say maybe: the oldest keys no longer cost a probe of every newer
 * segment's filter. */
Test(cold, a_group_filter_spares_the_probes_of_its_segments)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    cr_assert(exists(GROUP0));
    cr_assert(!exists("grp-00000001.kgf"), "group 1 is not all cold");
    s = t_open(uri);
    idem_outcome o;
    for (int i = 0; i < 16; i++) {   /* 16 segments more */
        char k[32];
        snprintf(k, sizeof k, "more-%d", i);
        cr_assert_eq(claim(s, k, &o), 0);
        cr_assert_eq(idem_sync(s), 0);
    }
    cr_assert(exists("grp-00000001.kgf"), "group 1 went cold");
    idem_stats st = stats_of(s);
    uint64_t ncold = st.cold_segments, probes = st.filter_probes;
    char last[32];
    key_of(last, sizeof last, GROUPS * PER_GROUP - 1);
    cr_assert_eq(claim(s, last, &o), 0);   /* in group 1 */
    cr_assert_eq(o.kind, IDEM_REPLAY);
    st = stats_of(s);
    /* The filter in front, the newest segments (no group filter yet),
     * group 1's filter and its segments down to the key's: never group
     * 0's 15 segments. */
    cr_assert_leq(st.filter_probes - probes, ncold + 2 - 15,
                  "%llu of %llu", (unsigned long long)(st.filter_probes -
                                                       probes),
                  (unsigned long long)ncold);
    expect_all(s);
    cr_assert_eq(idem_close(s), 0);
}

/* Fill the store, close it, and read its group 0 filter (path in p). */
static char *group0_of_filled(char *p, size_t pn, size_t *len)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    snprintf(p, pn, "%s/%s", dir, GROUP0);
    char *img = t_read(p, len);
    cr_assert(img && *len > 64, "%s", p);
    return img;
}

/* Write img (len bytes) over the file at p. */
static void put_file(const char *p, const void *img, size_t len)
{
    int fd = open(p, O_WRONLY | O_TRUNC);
    cr_assert_geq(fd, 0, "%s", p);
    cr_assert_eq(write(fd, img, len), (ssize_t)len);
    close(fd);
}

/* A group filter that does not check out (a bit flipped, torn, emptied)
 * or that names other segments than those there (a stale one) is never
 * trusted: open builds it again from the key indexes, and every key is
 * answered; check reports it, repair deletes it. */
Test(cold, a_damaged_or_stale_group_filter_is_built_again)
{
    idem_store *s;
    char p[4400];
    size_t len;
    char *good = group0_of_filled(p, sizeof p, &len);
    /* Emptied blocks would say no to every key of group 0. */
    unsigned char *img = malloc(len);
    cr_assert(img);
    memcpy(img, good, len);
    memset(img + 64 + 16 * 32, 0, len - (64 + 16 * 32));
    for (int how = 0; how < 4; how++) {
        put_file(p, img, len);
        if (how == 1)
            cut(GROUP0, (off_t)len - 64);
        if (how == 2)
            damage(GROUP0, 20);
        if (how == 3) {
            /* Checks out whole, but names segment 1 at another size. */
            img[64 + 8] ^= 1;
            uint64_t body = XXH3_64bits(img + 64, len - 64);
            memcpy(img + 40, &body, 8);
            uint64_t hdr = XXH3_64bits(img, 56);
            memcpy(img + 56, &hdr, 8);
            put_file(p, img, len);
        }
        idem_check_report r = {0};
        if (how < 3) {
            cr_assert_eq(idem_check(uri, &r), IDEM_ECORRUPT, "how %d", how);
            cr_assert(strstr(r.first_damage, GROUP0), "%s", r.first_damage);
        }
        s = t_open(uri);
        expect_all(s);
        cr_assert_eq(idem_close(s), 0);
        size_t now;
        char *built = t_read(p, &now);
        cr_assert(built && now == len && memcmp(built, good, len) == 0,
                  "how %d: built again as it was", how);
        free(built);
    }
    damage(GROUP0, 100);
    idem_check_report r = {0};
    cr_assert_eq(idem_repair(uri, &r), 0);
    cr_assert(!exists(GROUP0));
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_check(uri, &r), 0, "%s", r.first_damage);
    free(img);
    free(good);
}

/* A group filter of an older layout (a store from before lanes) is no
 * damage: check passes it, and the first writer to open the store builds
 * it again in the layout of today. */
Test(cold, a_group_filter_of_an_older_layout_is_built_again_not_damage)
{
    char p[4400];
    size_t len;
    unsigned char *img = (unsigned char *)group0_of_filled(p, sizeof p, &len);
    unsigned char *good = malloc(len);
    cr_assert(good);
    memcpy(good, img, len);
    uint32_t v2 = 2;
    memcpy(img + 8, &v2, 4);
    uint64_t hdr = XXH3_64bits(img, 56);
    memcpy(img + 56, &hdr, 8);
    put_file(p, img, len);
    idem_check_report r = {0};
    idem_store *s;
    cr_assert_eq(idem_check(uri, &r), 0, "%s", r.first_damage);
    s = t_open(uri);
    expect_all(s);
    cr_assert_eq(idem_close(s), 0);
    size_t now;
    char *built = t_read(p, &now);
    cr_assert(built && now == len && memcmp(built, good, len) == 0);
    free(built);
    free(good);
    free(img);
}

/* Runs do for groups what groups do for segments: once the 256 segments
 * of a run are cold, a filter of their keys is written beside them, a
 * lane for each of its groups, and a key in the oldest run costs a probe
 * of each run's filter and of one group's, not of every group's. A run
 * filter that does not check out is built again; check reports it. */
Test(cold, a_run_filter_spares_the_probes_of_its_groups)
{
    enum { N = 1100 };   /* a segment each: runs 0 to 3 all cold */
    idem_store *s = t_open(uri);
    idem_outcome o;
    for (int i = 0; i < N; i++) {
        char k[32];
        key_of(k, sizeof k, i);
        cr_assert_eq(claim(s, k, &o), 0);
        cr_assert_eq(idem_sync(s), 0);
    }
    cr_assert(exists("run-00000000.kgf") && exists("run-00000003.kgf"));
    cr_assert(!exists("run-00000004.kgf"), "run 4 is not all cold");
    idem_stats st = stats_of(s);
    uint64_t ncold = st.cold_segments, probes = st.filter_probes,
             searches = st.index_searches;
    cr_assert_eq(claim(s, "order-0", &o), 0);   /* in group 0, run 0 */
    cr_assert_eq(o.kind, IDEM_BUSY);
    st = stats_of(s);
    /* The filter in front, run 4's newest segments (15 at most, no group
     * yet) and groups (15 at most, no run yet), runs 3 to 0, then group
     * 0's stripe, which names the segment: run 0's 16 groups and group
     * 0's 16 segments are not asked one by one. */
    uint64_t took = st.filter_probes - probes;
    cr_assert_leq(took, 1 + 15 + 15 + ncold / 256 + 1,
                  "%llu probes, %llu cold segments", (unsigned long long)took,
                  (unsigned long long)ncold);
    cr_assert_eq(st.index_searches - searches, 1, "the lanes chose it");
    cr_assert_eq(idem_close(s), 0);

    /* Emptied blocks would say no to every key of run 0: open checks
     * only the header, the first lookup through it the whole file. A
     * reader passes it over, a writer builds it again. */
    zero_from("run-00000000.kgf", 64 + 256 * 32);
    idem_check_report r = {0};
    cr_assert_eq(idem_check(uri, &r), IDEM_ECORRUPT);
    cr_assert(strstr(r.first_damage, "run-00000000.kgf"), "%s",
              r.first_damage);
    idem_opts ro = t_options();
    ro.flags = IDEM_O_READONLY;
    cr_assert_eq(idem_open(uri, &ro, &s), 0, "%s", idem_errdetail(s));
    for (int i = 0; i < N; i += 7) {
        char k[32];
        idem_record rec;
        key_of(k, sizeof k, i);
        cr_assert_eq(idem_get(s, k, strlen(k), &rec), 0, "%s", k);
    }
    cr_assert_eq(idem_close(s), 0);
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_check(uri, &r), IDEM_ECORRUPT, "a reader writes none");
    s = t_open(uri);
    for (int i = 0; i < N; i++) {
        char k[32];
        key_of(k, sizeof k, i);
        cr_assert_eq(claim(s, k, &o), 0);
        cr_assert_eq(o.kind, IDEM_BUSY, "%s: kind %d", k, o.kind);
    }
    cr_assert_eq(idem_close(s), 0);
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_check(uri, &r), 0, "%s", r.first_damage);
}

/* Claims of keys order-FIRST.. (n of them), a segment each, all alike
 * with the clock still (keys of one length). */
static void alike_segments(const char *u, int first, int n)
{
    idem_opts o = t_options();
    idem_store *s;
    cr_assert_eq(idem_open(u, &o, &s), 0, "%s", idem_errdetail(s));
    for (int i = first; i < first + n; i++) {
        char k[32];
        idem_outcome out;
        key_of(k, sizeof k, i);
        cr_assert_eq(claim(s, k, &out), 0);
        cr_assert_eq(out.kind, IDEM_NEW);
        cr_assert_eq(idem_sync(s), 0);
    }
    cr_assert_eq(idem_close(s), 0);
}

/* Claim order-FIRST.. again: how many are new. */
static int new_again(const char *u, int first, int n)
{
    idem_opts o = t_options();
    idem_store *s;
    cr_assert_eq(idem_open(u, &o, &s), 0, "%s", idem_errdetail(s));
    int news = 0;
    for (int i = first; i < first + n; i++) {
        char k[32];
        idem_outcome out;
        key_of(k, sizeof k, i);
        cr_assert_eq(claim(s, k, &out), 0);
        news += out.kind == IDEM_NEW;
    }
    cr_assert_eq(idem_close(s), 0);
    return news;
}

static void lose(const char *name)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    cr_assert_eq(unlink(p), 0, "%s", p);
}

static void repair_and_check(const char *u)
{
    idem_check_report r = {0};
    cr_assert_eq(idem_repair(u, &r), 0, "%s", r.first_damage);
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_check(u, &r), 0, "%s", r.first_damage);
}

/* A segment file lost from the middle of the store: repair closes the
 * gap by renaming every later segment down one id. Their key indexes,
 * group and run filters and PATH/COLD named the segments that had those
 * ids; with the clock still, the renamed segments are as large and as
 * old as those, and kept indexes would pass for theirs: each lookup
 * would search its predecessor's index and answer a DONE key as new.
 * Only the lost segment's key may be new again. */
Test(cold, a_repair_that_closes_a_gap_drops_what_named_the_old_ids)
{
    alike_segments(uri, 10, 40);
    cr_assert(exists("seg-00000012.kix") && exists(GROUP0));
    lose("seg-00000010.log");
    repair_and_check(uri);
    cr_assert_eq(new_again(uri, 10, 40), 1);
}

/* The same repair, stopped at each of its unlinks in turn (a crash
 * there leaves what it did before), then run whole: a repair that
 * renamed a segment before the index of the id it took was gone left
 * that index beside it, and the next repair kept it. */
Test(cold, a_repair_stopped_at_any_unlink_then_run_whole_loses_one_key,
     .timeout = 300)
{
    for (long n = 0;; n++) {
        t_rmdir(dir);
        cr_assert_eq(mkdir(dir, 0700), 0);
        alike_segments(uri, 10, 20);
        lose("seg-00000008.log");
        idem_check_report r = {0};
        t_fail_errno = EIO;
        t_fail_unlink_after = n;
        int rc = idem_repair(uri, &r);
        int tripped = t_fail_unlink_after < 0;
        t_fail_unlink_after = -1;
        cr_assert(tripped ? rc != 0 : rc == 0, "unlink %ld: %d", n, rc);
        repair_and_check(uri);
        cr_assert_eq(new_again(uri, 10, 20), 1, "stopped at unlink %ld", n);
        if (!tripped)
            break;
    }
}

/* The race of a reader with a repair, stopped at three points (see the
 * test below). Phases only move forward; each party waits for the one
 * it needs and a step that finds the race elsewhere does nothing, so
 * whichever points are never reached, no party waits for ever. */
enum { RACE_IDLE, RACE_GO, RACE_PAUSED, RACE_RESUMED, RACE_DONE };

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase;
    char cut[32];     /* the segment both stop at, the first time */
    char newest[32];  /* the newest segment before the repair */
    int stops;        /* the three points the race stopped at */
    idem_store *reader;
    int rc;
} race = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static _Thread_local int race_is_reader;

/* Move the race from phase from to phase to, if it is there; a stop
 * counts in race.stops. */
static void race_step(int from, int to, int stop)
{
    pthread_mutex_lock(&race.mu);
    if (race.phase == from) {
        race.phase = to;
        race.stops += stop;
    }
    pthread_cond_broadcast(&race.cv);
    pthread_mutex_unlock(&race.mu);
}

static void race_wait(int phase)
{
    pthread_mutex_lock(&race.mu);
    while (race.phase < phase)
        pthread_cond_wait(&race.cv, &race.mu);
    pthread_mutex_unlock(&race.mu);
}

static int race_phase(void)
{
    pthread_mutex_lock(&race.mu);
    int now = race.phase;
    pthread_mutex_unlock(&race.mu);
    return now;
}

/* The repair's side: about to delete the segment it has just written
 * anew one id lower, it lets the reader list the store and read up to
 * that segment; about to delete the newest old segment, the last
 * renumbering done, it lets the reader read on and end its open. */
static void race_unlink(const char *name)
{
    if (strcmp(name, race.cut) == 0) {
        race_step(RACE_IDLE, RACE_GO, 1);
        race_wait(RACE_PAUSED);
    } else if (strcmp(name, race.newest) == 0) {
        race_step(RACE_PAUSED, RACE_RESUMED, 1);
        race_wait(RACE_DONE);
    }
}

/* The reader's side: it maps race.cut, and waits there (once). */
static void race_mmap(int fd)
{
    char link[64], path[4400];
    if (!race_is_reader || race_phase() != RACE_GO)
        return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    size_t len = strlen(race.cut);
    if (n <= (ssize_t)len)
        return;
    path[n] = '\0';
    if (path[n - (ssize_t)len - 1] == '/' &&
        strcmp(path + n - len, race.cut) == 0) {
        race_step(RACE_GO, RACE_PAUSED, 1);
        race_wait(RACE_RESUMED);
    }
}

static void *race_reader(void *unused)
{
    (void)unused;
    race_is_reader = 1;
    race_wait(RACE_GO);
    idem_opts o = t_options();
    o.flags = IDEM_O_READONLY;
    race.rc = idem_open(uri, &o, &race.reader);
    /* Only the reader moves the race on from GO or RESUMED. */
    race_step(race_phase(), RACE_DONE, 0);
    return NULL;
}

/* The greatest segment id in dir. */
static uint32_t newest_segment(void)
{
    DIR *d = opendir(dir);
    cr_assert(d);
    uint32_t newest = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char *end;
        if (strncmp(de->d_name, "seg-", 4) != 0)
            continue;
        unsigned long id = strtoul(de->d_name + 4, &end, 10);
        if (strcmp(end, ".log") == 0 && id > newest)
            newest = (uint32_t)id;
    }
    closedir(d);
    return newest;
}

/* The record of each filled key, as handle a and handle b read it, is
 * the same; *found counts those a has. */
static void same_answers(idem_store *a, idem_store *b, int *found)
{
    *found = 0;
    for (int i = 0; i < GROUPS * PER_GROUP; i++) {
        char k[32];
        idem_record ra, rb;
        key_of(k, sizeof k, i);
        int rca = idem_get(a, k, strlen(k), &ra);
        int rcb = idem_get(b, k, strlen(k), &rb);
        cr_assert_eq(rca, rcb, "%s: %d, but %d after the repair", k, rca,
                     rcb);
        cr_assert(rca == 0 || rca == IDEM_ENOTFOUND, "%s: %d", k, rca);
        if (rca == 0)
            cr_assert(ra.state == IDEM_STATE_DONE &&
                          rb.state == IDEM_STATE_DONE,
                      "%s", k);
        *found += rca == 0;
    }
}

/* A reader takes no lock, so it may open while a repair renumbers the
 * segments after a lost one: here at the one point where its walk is
 * cut through. The repair has written seg-5 anew from seg-6 and is
 * about to delete seg-6 when the reader lists the store, whose ids then
 * run without a gap; the reader reads up to seg-6 (still the old one)
 * and waits while the repair renumbers the rest, up to the delete of
 * the newest old segment, then reads on: its seg-7 then holds what was
 * seg-8. Taken as it is, that walk reads seg-6's records twice and
 * never seg-7's, and the reader answers their keys, all done, as
 * absent. It must answer every key as a reader opened after the repair
 * does. */
Test(cold, a_reader_opened_while_a_repair_renumbers_reads_every_segment)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    uint32_t newest = newest_segment();
    cr_assert_geq(newest, 10);
    lose("seg-00000005.log");
    snprintf(race.cut, sizeof race.cut, "seg-%08u.log", 6u);
    snprintf(race.newest, sizeof race.newest, "seg-%08u.log", newest);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, race_reader, NULL), 0);
    t_unlink_hook = race_unlink;
    t_mmap_hook = race_mmap;
    idem_check_report r = {0};
    int rc = idem_repair(uri, &r);
    race_step(RACE_IDLE, RACE_GO, 0);  /* points the repair never met */
    race_step(RACE_PAUSED, RACE_RESUMED, 0);
    pthread_join(t, NULL);
    t_unlink_hook = NULL;
    t_mmap_hook = NULL;
    cr_assert_eq(rc, 0, "%s", r.first_damage);
    cr_assert_eq(race.stops, 3, "the race stopped at %d points", race.stops);
    cr_assert_eq(race.rc, 0, "%s", idem_errdetail(race.reader));
    idem_opts o = t_options();
    o.flags = IDEM_O_READONLY;
    idem_store *after;
    cr_assert_eq(idem_open(uri, &o, &after), 0, "%s", idem_errdetail(after));
    int found;
    same_answers(race.reader, after, &found);
    cr_assert_eq(found, (GROUPS - 1) * PER_GROUP, "seg-5's keys only go");
    cr_assert_eq(idem_close(after), 0);
    cr_assert_eq(idem_close(race.reader), 0);
}

/* The gap a repair leaves for a moment as it renumbers: the old seg-6
 * is deleted (its records are seg-5's now), seg-7 not yet copied to
 * seg-6. A reader that lists the store then finds seg-6 missing. That
 * is no damage, and a reader must not call it so, nor send anyone to
 * `idem repair` while one runs: it says the store is busy. A writer is
 * told a repair holds the store. */
static struct {
    int armed;  /* 1: seg-6 is being deleted; 2: the reader has run */
    int rc, writer_rc;
    char detail[512], writer_detail[512];
} gap;

static void gap_unlink(const char *name)
{
    if (gap.armed == 1) {  /* the next unlink: seg-6 is gone */
        gap.armed = 2;
        idem_opts o = t_options();
        o.flags = IDEM_O_READONLY;
        idem_store *r;
        gap.rc = idem_open(uri, &o, &r);
        snprintf(gap.detail, sizeof gap.detail, "%s", idem_errdetail(r));
        idem_close(r);
        o.flags = 0;
        gap.writer_rc = idem_open(uri, &o, &r);
        snprintf(gap.writer_detail, sizeof gap.writer_detail, "%s",
                 idem_errdetail(r));
        idem_close(r);
    } else if (!gap.armed && strcmp(name, "seg-00000006.log") == 0) {
        gap.armed = 1;
    }
}

Test(cold, a_reader_in_the_gap_of_a_repair_says_the_store_is_busy)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    lose("seg-00000005.log");
    t_unlink_hook = gap_unlink;
    idem_check_report r = {0};
    int rc = idem_repair(uri, &r);
    t_unlink_hook = NULL;
    cr_assert_eq(rc, 0, "%s", r.first_damage);
    cr_assert_eq(gap.armed, 2, "the repair never deleted seg-6");
    cr_assert_eq(gap.rc, IDEM_ELOCKED, "%d: %s", gap.rc, gap.detail);
    cr_assert(strstr(gap.detail, "seg-00000006.log") &&
                  !strstr(gap.detail, "idem repair --store"),
              "%s", gap.detail);
    cr_assert_eq(gap.writer_rc, IDEM_ELOCKED);
    cr_assert(strstr(gap.writer_detail, "being repaired"), "%s",
              gap.writer_detail);
}

/* Under a writer, which never leaves a gap, a segment gone is damage:
 * a reader says so at once, not that the store is busy. */
Test(cold, a_segment_lost_under_a_writer_is_damage_to_a_reader)
{
    idem_store *s = t_open(uri);
    fill(s);
    lose("seg-00000005.log");
    idem_opts o = t_options();
    o.flags = IDEM_O_READONLY;
    idem_store *r;
    cr_assert_eq(idem_open(uri, &o, &r), IDEM_ECORRUPT, "%s",
                 idem_errdetail(r));
    cr_assert(strstr(idem_errdetail(r), "seg-00000005.log is missing"), "%s",
              idem_errdetail(r));
    idem_close(r);
    idem_close(s);
}

/* A lost identity file: repair writes a new secret for the keys' hash,
 * and the key indexes and filters, which hold hashes under the old one,
 * go with it: no key is new again. */
Test(cold, a_repair_of_a_lost_identity_builds_the_indexes_again)
{
    alike_segments(uri, 10, 40);
    lose("IDEM");
    repair_and_check(uri);
    cr_assert_eq(new_again(uri, 10, 40), 0);
}

/* The two newest segment files lost, the older of them cold: repair
 * ends the store at the one before, and its key index must go, for the
 * next segment made takes its id and, with the clock still, its size
 * and time: loaded as that segment's, it would hide the new keys. */
Test(cold, a_repair_that_cuts_the_newest_segments_drops_their_indexes)
{
    alike_segments(uri, 10, 40);
    cr_assert(exists("seg-00000040.kix"));
    lose("seg-00000040.log");
    lose("seg-00000041.log");
    repair_and_check(uri);
    char warm[4500];
    snprintf(warm, sizeof warm, "%s?segment=1", t_local_uri(dir));
    alike_segments(warm, 50, 2);   /* segments 40 and 41 again */
    cr_assert_eq(new_again(warm, 50, 2), 0);
}

Test(cold, forget_and_expiry_hide_cold_records_across_reopen)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_forget(s, "order-3", 7), 0);
    cr_assert_eq(idem_sync(s), 0);
    /* Seal the forget's segment too. */
    idem_outcome o;
    cr_assert_eq(claim(s, "later", &o), 0);
    cr_assert_eq(idem_sync(s), 0);
    idem_record r;
    cr_assert_eq(idem_get(s, "order-3", 7, &r), IDEM_ENOTFOUND);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(uri);
    cr_assert_eq(idem_get(s, "order-3", 7, &r), IDEM_ENOTFOUND);
    cr_assert_eq(idem_get(s, "order-4", 7, &r), 0);
    cr_assert_eq(claim(s, "order-3", &o), 0);
    cr_assert_eq(o.kind, IDEM_NEW);
    cr_assert_eq(idem_close(s), 0);
}

Test(cold, check_reports_a_bad_index_and_repair_has_it_rebuilt)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    idem_check_report r = {0};
    cr_assert_eq(idem_check(uri, &r), 0, "%s", r.first_damage);
    damage("seg-00000003.kix", 300);
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_check(uri, &r), IDEM_ECORRUPT);
    cr_assert_eq(r.damaged, 1);
    cr_assert(strstr(r.first_damage, "seg-00000003.kix"), "%s",
              r.first_damage);
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_repair(uri, &r), 0);
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_check(uri, &r), 0, "%s", r.first_damage);
    s = t_open(uri);
    cr_assert_eq(stats_of(s).cold_rebuilt, 1);
    expect_all(s);
    cr_assert_eq(idem_close(s), 0);
    memset(&r, 0, sizeof r);
    cr_assert_eq(idem_check(uri, &r), 0, "%s", r.first_damage);
}

static int count_key(void *ctx, const void *key, size_t keylen,
                     const idem_record *rec)
{
    int *seen = ctx;
    int i = -1;
    cr_assert_eq(sscanf((const char *)key, "order-%d", &i), 1);
    cr_assert(i >= 0 && i < GROUPS * PER_GROUP);
    cr_assert_eq(rec->len, keylen);
    seen[i]++;
    return 0;
}

/* A scan (idem dump, stats --key-spaces) sees every live key once, the
 * cold ones included, and not a key forgotten or superseded. */
Test(cold, scan_sees_every_live_key_once)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert_eq(idem_forget(s, "order-7", 7), 0);
    cr_assert_eq(idem_sync(s), 0);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(uri);
    int seen[GROUPS * PER_GROUP] = {0};
    cr_assert_eq(idem_scan(s, count_key, seen), 0);
    for (int i = 0; i < GROUPS * PER_GROUP; i++)
        cr_assert_eq(seen[i], i != 7, "order-%d seen %d times", i, seen[i]);
    cr_assert_eq(idem_close(s), 0);
}

Test(cold, size_parameters_are_checked)
{
    static const char *const bad[] = {"hot=", "hot=x", "hot=1x", "hot=1kk",
                                      "segment=0", "segment=3G",
                                      "hot=99999999999999999999", "hots=1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char u[4500];
        snprintf(u, sizeof u, "%s?%s", t_local_uri(dir), bad[i]);
        idem_store *s;
        idem_opts o = t_options();
        cr_assert_eq(idem_open(u, &o, &s), IDEM_EINVAL, "%s", u);
        cr_assert(strstr(idem_errdetail(s), bad[i]), "%s: %s", u,
                  idem_errdetail(s));
        idem_close(s);
    }
    char u[4500];
    snprintf(u, sizeof u, "%s?hot=1k&segment=2G&mode=private",
             t_local_uri(dir));
    idem_close(t_open(u));
}

/* idem stats shows the cold keys and what their lookups cost; it opens
 * the store read-only, so it reads the key indexes as they are. */
Test(cold, cli_stats_shows_the_cold_keys)
{
    idem_store *s;  /* the real clock: the CLI will read these records */
    cr_assert_eq(idem_open(uri, NULL, &s), 0);
    fill(s);
    cr_assert_eq(idem_close(s), 0);
    cr_assert_eq(t_cli(dir, "stats --store '%s' > out", uri), 0);
    char out[4500];
    snprintf(out, sizeof out, "%s/out", dir);
    cr_assert(t_grep(out, "hot keys       10\n"), "%s", t_read(out, NULL));
    cr_assert(t_grep(out, "cold keys      190 (at most) in 20 segments"));
    cr_assert(t_grep(out, "RAM (filter)   "));
    cr_assert(t_grep(out, "the segments' own: page cache"));
    cr_assert_eq(t_cli(dir, "stats --json --store '%s' > out", uri), 0);
    cr_assert(t_grep(out, "\"cold_segments\":20,"));
    idem_stats st;
    cr_assert_eq(idem_open(uri, NULL, &s), 0);
    cr_assert_eq(idem_stats_read(s, &st, sizeof st), 0);
    cr_assert_gt(st.cold_front_bytes, 0);
    cr_assert_lt(st.cold_front_bytes, st.cold_index_bytes);
    cr_assert_eq(idem_close(s), 0);
    char want[64];
    snprintf(want, sizeof want, "\"cold_front_bytes\":%llu",
             (unsigned long long)st.cold_front_bytes);
    cr_assert(t_grep(out, want), "%s", t_read(out, NULL));
    cr_assert_eq(t_cli(dir, "get order-5 --store '%s' > out", uri), 0);
    cr_assert(t_grep(out, "response   order-5"));
}

/* Expired segments go whole, their key index first. */
Test(cold, expired_segments_drop_with_their_index)
{
    idem_store *s = t_open(uri);
    fill(s);
    cr_assert(exists("seg-00000002.kix"));
    idem_stats st = stats_of(s);
    cr_assert_geq(st.cold_segments, GROUPS - 2);
    t_clock_ms += 30LL * 24 * 3600 * 1000;
    uint64_t expired;
    cr_assert_eq(idem_sweep(s, 0, &expired), 0);
    st = stats_of(s);
    cr_assert_eq(st.cold_segments, 0, "%llu",
                 (unsigned long long)st.cold_segments);
    cr_assert(!exists("seg-00000002.kix"));
    cr_assert(!exists("seg-00000002.log"));
    idem_record r;
    cr_assert_eq(idem_get(s, "order-5", 7, &r), IDEM_ENOTFOUND);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(uri);
    cr_assert_eq(stats_of(s).cold_segments, 0);
    cr_assert_eq(idem_close(s), 0);
}

/* A program built when idem_stats ended at records_copied passes a
 * struct that ends there: idem_stats_get() writes nothing past it. */
Test(cold, stats_get_fills_only_the_first_fields)
{
    idem_store *s = t_open(uri);
    fill(s);
    idem_stats st;
    memset(&st, 0xa5, sizeof st);
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_eq(st.live_keys, GROUPS * PER_GROUP);
    cr_assert_eq(st.hot_keys, 0xa5a5a5a5a5a5a5a5ull);
    cr_assert_eq(st.cold_rebuilt, 0xa5a5a5a5a5a5a5a5ull);
    cr_assert_eq(idem_stats_read(s, &st, 8), IDEM_EINVAL);
    cr_assert_eq(idem_stats_read(s, &st, sizeof st), 0);
    cr_assert_eq(st.hot_keys + st.cold_keys, GROUPS * PER_GROUP);
    cr_assert_eq(idem_close(s), 0);
}

/* idem bench --workload seed: repeats arriving within the hour and
 * within the TTL, on an injected clock, past the hot budget and across
 * segment drops, and not one of them let through as NEW. */
Test(cold, seed_workload_lets_no_repeat_through, .timeout = 300)
{
    cr_assert_eq(t_cli(dir, "bench --workload seed --rate 50 --simulate "
                            "7300 --ttl 3600 --repeats 20 --batch 50 "
                            "--store '%s?hot=64k&segment=64k' > out",
                       t_local_uri(dir)),
                 0);
    char out[4500];
    snprintf(out, sizeof out, "%s/out", dir);
    char *o = t_read(out, NULL);
    cr_assert(strstr(o, " duplicates_through=0 ") &&
                  strstr(o, " new_not_new=0 "), "%s", o);
    unsigned long long rep = 0, replayed = 0, cold = 0;
    cr_assert(sscanf(strstr(o, " repeats="), " repeats=%llu replayed=%llu",
                     &rep, &replayed) == 2, "%s", o);
    cr_assert_gt(replayed, 1000, "%s", o);
    cr_assert_gt(rep, replayed / 2, "%s", o);
    cr_assert(strstr(o, " cold_segments="), "%s", o);
    sscanf(strstr(o, " cold_segments="), " cold_segments=%llu", &cold);
    cr_assert_gt(cold, 0, "%s", o);
    free(o);
}

/* idem bench --overlap syncs each batch while it claims the next: every
 * batch is still claimed, and all of them are durable once it ends. */
Test(cold, bench_overlap_syncs_every_batch)
{
    char u[4400];
    snprintf(u, sizeof u, "%s?hot=64k&segment=64k", t_local_uri(dir));
    cr_assert_eq(t_cli(dir, "bench --overlap -n 5000 --batch 700 --store "
                            "'%s' > out", u),
                 0);
    char out[4500];
    snprintf(out, sizeof out, "%s/out", dir);
    char *o = t_read(out, NULL);
    cr_assert(strstr(o, " new=5000 "), "%s", o);
    free(o);
    idem_store *s = t_open(u);
    idem_stats st = stats_of(s);
    cr_assert_eq(st.hot_keys + st.cold_keys, 5000);
    cr_assert_gt(st.cold_keys, 0);
    cr_assert_eq(idem_close(s), 0);
}

/* Claim keys [from, to) of prefix in one batch, recorded DONE at once;
 * each answers kind (NEW the first time, REPLAY after). */
static void claim_range(idem_store *s, const char *prefix, int from, int to,
                        idem_outcome_kind kind)
{
    size_t n = (size_t)(to - from);
    idem_key *keys = calloc(n, sizeof *keys);
    idem_outcome *outs = calloc(n, sizeof *outs);
    char (*names)[32] = calloc(n, sizeof *names);
    cr_assert(keys && outs && names);
    for (size_t i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "%s-%d", prefix, from + (int)i);
        keys[i] = (idem_key){names[i], strlen(names[i]), NULL};
    }
    cr_assert_eq(idem_claim_many(s, keys, n, NULL, outs, IDEM_CLAIM_DONE), 0);
    for (size_t i = 0; i < n; i++)
        cr_assert(outs[i].status == 0 && outs[i].kind == kind,
                  "%s: status %d kind %d", names[i], outs[i].status,
                  outs[i].kind);
    free(names);
    free(outs);
    free(keys);
}

/* Far more cold keys than the filter in front was first sized for: its
 * partitions fill, run over and are built again, a few at each segment
 * that goes cold, while claims go on. No key claimed before is ever
 * taken for new, on the way or after a reopen, and strangers still get
 * past the filter with few false positives. */
Test(cold, a_filter_grown_while_claims_go_on_answers_exactly,
     .timeout = 600)
{
    enum { BATCHES = 60, PER = 2000, STRANGERS = 20000 };
    idem_store *s = t_open(uri);
    for (int b = 0; b < BATCHES; b++) {
        claim_range(s, "grow", b * PER, (b + 1) * PER, IDEM_NEW);
        if (b > 0)   /* the batch before, cold since this commit */
            claim_range(s, "grow", (b - 1) * PER, b * PER, IDEM_REPLAY);
        int at = (b * 7919) % ((b + 1) * PER);
        claim_range(s, "grow", at, at + 1, IDEM_REPLAY);
    }
    idem_stats st = stats_of(s);
    cr_assert_geq(st.cold_segments, BATCHES - 2);
    for (int i = 0; i < STRANGERS; i++) {
        char k[32];
        snprintf(k, sizeof k, "stranger-%d", i);
        idem_record r;
        cr_assert_eq(idem_get(s, k, strlen(k), &r), IDEM_ENOTFOUND);
    }
    uint64_t fp =
        stats_of(s).filter_false_positives - st.filter_false_positives;
    cr_assert_leq(fp, STRANGERS / 100, "%llu false positives",
                  (unsigned long long)fp);
    cr_assert_eq(idem_close(s), 0);
    /* Built again larger than the first size of a partition (12 blocks,
     * room for 256 keys: 16,384 keys in all). */
    char p[4400];
    snprintf(p, sizeof p, "%s/COLD", dir);
    size_t len;
    free(t_read(p, &len));
    cr_assert_gt(len, 72 + 64 * 32 + BATCHES * 32 + 64 * 12 * 64,
                 "COLD is %zu bytes", len);
    s = t_open(uri);
    cr_assert_eq(stats_of(s).cold_rebuilt, 0);
    claim_range(s, "grow", 0, BATCHES * PER, IDEM_REPLAY);
    T_REPORT("grown filter: %llu false positives in %d strangers, COLD %zu "
             "bytes", (unsigned long long)fp, STRANGERS, len);
    cr_assert_eq(idem_close(s), 0);
}

/* Forgotten, claimed again, completed: keys whose newest frames go cold
 * one segment after another. Each segment going cold takes out of RAM
 * exactly the entries pointing into it, tombstones included (its key
 * index names their frames), and every key still answers as it
 * should, before and after a reopen. */
static void expect_churned(idem_store *s, int groups)
{
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < PER_GROUP; j++) {
            char k[32];
            snprintf(k, sizeof k, "churn-%d-%d", g, j);
            idem_record r;
            int rc = idem_get(s, k, strlen(k), &r);
            if (j == 0 && g == groups - 1) {   /* forgotten, not again */
                cr_assert_eq(rc, IDEM_ENOTFOUND, "%s", k);
                continue;
            }
            cr_assert_eq(rc, 0, "%s", k);
            const char *want = j == 0 ? "again" : k;
            cr_assert_eq(r.state, IDEM_STATE_DONE, "%s", k);
            cr_assert(r.len == strlen(want) &&
                          memcmp(r.data, want, r.len) == 0,
                      "%s", k);
        }
}

Test(cold, an_eviction_leaves_no_stale_entry_in_ram)
{
    enum { CHURN = 30 };
    idem_store *s = t_open(uri);
    for (int g = 0; g < CHURN + 1; g++) {
        for (int j = 0; j < PER_GROUP && g < CHURN; j++) {
            char k[32];
            snprintf(k, sizeof k, "churn-%d-%d", g, j);
            idem_outcome o;
            cr_assert_eq(claim(s, k, &o), 0);
            cr_assert_eq(idem_complete(s, k, strlen(k), o.token, k,
                                       strlen(k), 0), 0);
        }
        char k[32];
        if (g >= 1) {   /* the group before's first key, now cold */
            snprintf(k, sizeof k, "churn-%d-0", g - 1);
            cr_assert_eq(idem_forget(s, k, strlen(k)), 0, "%s", k);
        }
        if (g >= 2) {   /* forgotten a commit ago: claimed anew */
            snprintf(k, sizeof k, "churn-%d-0", g - 2);
            idem_outcome o;
            cr_assert_eq(claim(s, k, &o), 0);
            cr_assert_eq(o.kind, IDEM_NEW, "%s", k);
            cr_assert_eq(idem_complete(s, k, strlen(k), o.token, "again", 5,
                                       0), 0);
        }
        cr_assert_eq(idem_sync(s), 0);
        /* Only the newest segment is hot: what this commit wrote. */
        idem_stats st = stats_of(s);
        cr_assert_leq(st.hot_keys, PER_GROUP + 2, "hot %llu at %d",
                      (unsigned long long)st.hot_keys, g);
    }
    /* The last round forgot churn-(CHURN-1)-0 and brought back -2's. */
    expect_churned(s, CHURN);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(uri);
    cr_assert_leq(stats_of(s).hot_keys, PER_GROUP + 2);
    expect_churned(s, CHURN);
    cr_assert_eq(idem_close(s), 0);
}

/* With one record a segment, every sealed segment is mostly dead to a
 * sweep (a survivor or two are cheap to move), and its copies roll into
 * new segments that are the same. A sweep moves each segment there was
 * when it began, once: one that chased its own copies never returned. */
Test(cold, a_sweep_does_not_chase_its_own_copies, .timeout = 30)
{
    idem_store *s = t_open(uri);
    enum { KEYS = 12 };
    for (int i = 0; i < KEYS; i++) {
        char k[32];
        key_of(k, sizeof k, i);
        idem_outcome o;
        cr_assert_eq(claim(s, k, &o), 0);
        cr_assert_eq(idem_complete(s, k, strlen(k), o.token, k, strlen(k),
                                   0), 0);
        cr_assert_eq(idem_sync(s), 0);
    }
    uint64_t expired, before = stats_of(s).records_copied;
    cr_assert_eq(idem_sweep(s, 0, &expired), 0);
    cr_assert_leq(stats_of(s).records_copied - before, KEYS);
    cr_assert_eq(idem_sweep(s, 0, &expired), 0);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(uri);
    for (int i = 0; i < KEYS; i++) {
        char k[32];
        key_of(k, sizeof k, i);
        idem_outcome o;
        cr_assert_eq(claim(s, k, &o), 0);
        cr_assert_eq(o.kind, IDEM_REPLAY, "%s", k);
        cr_assert_eq(o.len, strlen(k));
        cr_assert_eq(memcmp(o.data, k, o.len), 0);
    }
    cr_assert_eq(idem_close(s), 0);
}

/* A segment may pass the roll size by more than the 1 MiB slack of its
 * map (one value of a few MiB): once cold, reopened, its fd is closed
 * after its header was mapped, and a read past that window must still
 * work (it failed with "mmap: Bad file descriptor", IDEM_EIO). */
Test(cold, a_cold_segment_past_its_map_window_reads_after_reopen)
{
    char u[4500];
    snprintf(u, sizeof u, "%s?hot=0&segment=4M", t_local_uri(dir));
    size_t vl = 6u << 20;
    unsigned char *v = malloc(vl);
    cr_assert(v);
    memset(v, 0x5a, vl);
    idem_store *s;
    cr_assert_eq(idem_open(u, NULL, &s), 0);
    idem_outcome o;
    cr_assert_eq(claim(s, "a", &o), 0);
    cr_assert_eq(idem_complete(s, "a", 1, o.token, v, vl, 0), 0);
    cr_assert_eq(idem_sync(s), 0);
    cr_assert_eq(claim(s, "b", &o), 0);  /* a's segment rolls, goes cold */
    cr_assert_eq(idem_sync(s), 0);
    cr_assert_eq(idem_close(s), 0);
    cr_assert_eq(idem_open(u, NULL, &s), 0);
    idem_record r;
    int rc = idem_get(s, "a", 1, &r);
    cr_assert_eq(rc, 0, "get: %d %s", rc, idem_errdetail(s));
    cr_assert_eq(r.len, vl);
    cr_assert_eq(memcmp(r.data, v, vl), 0);
    rc = claim(s, "a", &o);
    cr_assert_eq(rc, 0, "claim: %d %s", rc, idem_errdetail(s));
    cr_assert_eq(o.kind, IDEM_REPLAY);
    idem_close(s);
    free(v);
}
