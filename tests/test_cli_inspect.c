/* tests/test_cli_inspect.c - get, forget, stats, sweep, check, repair,
 * dump and load end to end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "common.h"
#include "redis_harness.h"

/* A store with done a, b (one not UTF-8), failed f and pending p. */
static void setup(void)
{
    t_dir_init();
    idem_store *s;  /* the real clock: the CLI will read these records */
    cr_assert_eq(idem_open(t_local_uri(t_at("store")), NULL, &s), 0);
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &(idem_key){"a", 1, NULL}, NULL, &o), 0);
    cr_assert_eq(idem_complete(s, "a", 1, o.token, "{\"ok\":1}", 8, 0), 0);
    cr_assert_eq(idem_sync(s), 0);  /* commits apart: damage is mid-file */
    cr_assert_eq(idem_claim(s, &(idem_key){"b\xff", 2, NULL}, NULL, &o), 0);
    cr_assert_eq(idem_complete(s, "b\xff", 2, o.token, "\x01\xfe", 2, 0), 0);
    cr_assert_eq(idem_sync(s), 0);
    cr_assert_eq(idem_claim(s, &(idem_key){"f", 1, NULL}, NULL, &o), 0);
    cr_assert_eq(idem_fail(s, "f", 1, o.token, "bad", 3, 0), 0);
    cr_assert_eq(idem_claim(s, &(idem_key){"p", 1, NULL}, NULL, &o), 0);
    cr_assert_eq(idem_close(s), 0);
}

TestSuite(cli_inspect, .init = setup, .fini = t_dir_fini, .timeout = 120);

Test(cli_inspect, get_and_forget)
{
    cr_assert_eq(t_cli(t_dir, "get a > out"), 0);
    cr_assert(t_grep(t_at("out"), "state      done"));
    cr_assert(t_grep(t_at("out"), "response   {\"ok\":1}"));
    cr_assert_eq(t_cli(t_dir, "get --json f > out"), 0);
    cr_assert(t_grep(t_at("out"), "\"state\":\"failed\",\"token\":"));
    cr_assert(t_grep(t_at("out"), ",\"attempts\":1,\"created_ms\":"));
    cr_assert(t_grep(t_at("out"), "\"response\":\"bad\"}"));
    cr_assert_eq(t_cli(t_dir, "get p > out"), 0);
    cr_assert(t_grep(t_at("out"), "state      pending"));
    cr_assert(t_grep(t_at("out"), "attempts   1\n"));
    cr_assert(t_grep(t_at("out"), "lease"));
    cr_assert_eq(t_cli(t_dir, "forget a"), 0);
    cr_assert_eq(t_cli(t_dir, "get a 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "no live record for key 'a'"));
    cr_assert_eq(t_cli(t_dir, "forget a 2> err"), 1);
    cr_assert_eq(t_cli(t_dir, "get a b 2> err"), 2);
    cr_assert(t_grep(t_at("err"), "one key at a time"));
    cr_assert_eq(t_cli(t_dir, "get x --store local:absent 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "no store there yet"));
}

Test(cli_inspect, stats_and_sweep)
{
    cr_assert_eq(t_cli(t_dir, "stats > out"), 0);
    cr_assert(t_grep(t_at("out"), "1 pending, 2 done, 1 failed"));
    cr_assert(t_grep(t_at("out"), "RAM (index)"));
    cr_assert_eq(t_cli(t_dir, "stats --json > out"), 0);
    cr_assert(t_grep(t_at("out"), "\"pending\":1,\"done\":2,\"failed\":1,"));
    cr_assert_eq(t_cli(t_dir, "sweep > out"), 0);
    cr_assert(t_grep(t_at("out"), "removed 0 expired records"));
    cr_assert_eq(t_cli(t_dir, "stats --bogus 2> err"), 2);
}

Test(cli_inspect, dump_and_load_keep_every_byte)
{
    cr_assert_eq(t_cli(t_dir, "dump --output d 2> err"), 0);
    cr_assert(t_grep(t_at("err"), "4 records"));
    cr_assert(t_grep(t_at("d"), "\"key_base64\":\"Yv8=\""));
    cr_assert(t_grep(t_at("d"), "\"response_base64\":\"Af4=\""));
    cr_assert(t_grep(t_at("d"), "\"state\":\"pending\""));
    cr_assert_eq(t_cli(t_dir, "load --store local:copy d 2> err"), 0);
    cr_assert(t_grep(t_at("err"), "4 records loaded"));
    cr_assert_eq(t_cli(t_dir, "dump --store local:copy > d2"), 0);
    cr_assert_eq(t_sh("cd '%s' && sort d > s1 && sort d2 > s2 && cmp s1 s2",
                      t_dir), 0);
    /* a key the target has keeps its record unless --replace */
    cr_assert_eq(t_cli(t_dir, "forget a --store local:copy"), 0);
    t_sh("cd '%s' && grep '\"key\":\"a\"' d | sed 's/:1}/:2}/' > one", t_dir);
    cr_assert_eq(t_cli(t_dir, "load one 2> err"), 0);
    cr_assert(t_grep(t_at("err"), "1 kept"));
    cr_assert_eq(t_cli(t_dir, "load --replace one 2> err"), 0, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert_eq(t_cli(t_dir, "get a > out"), 0);
    cr_assert(t_grep(t_at("out"), "{\"ok\":2}"));
    t_sh("printf '{\"key\":\"z\",\"state\":\"done\",\"token\":1,"
         "\"created_ms\":1,\"expires_ms\":4000000000000}\\nnope\\n' > '%s'",
         t_at("bad"));
    cr_assert_eq(t_cli(t_dir, "load bad 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "bad:2:2: not a JSON object"));
    cr_assert_eq(t_cli(t_dir, "get --json z > out"), 0,
                 "lines before the bad one are committed");
    cr_assert(t_grep(t_at("out"), "\"token\":1,\"attempts\":1,"),
              "a dump without attempts: its token counted the claims");
}

Test(cli_inspect, check_and_repair)
{
    cr_assert_eq(t_cli(t_dir, "check > out"), 0);
    cr_assert(t_grep(t_at("out"), "no damage"));
    /* flip a byte inside the first record */
    t_sh("cd '%s/store' && printf 'X' | dd of=seg-00000001.log bs=1 "
         "seek=100 conv=notrunc 2>/dev/null", t_dir);
    cr_assert_eq(t_cli(t_dir, "check > out"), 1);
    cr_assert(t_grep(t_at("out"), "damaged"));
    cr_assert(t_grep(t_at("out"), "idem repair --store"));
    cr_assert_eq(t_cli(t_dir, "repair > out"), 0);
    cr_assert(t_grep(t_at("out"), "bytes lost"));
    cr_assert_eq(t_cli(t_dir, "check > out"), 0);
    cr_assert_eq(t_cli(t_dir, "get f > /dev/null"), 0, "the rest survived");
}

/* A store a newer idem wrote to: check and repair say so, send nobody
 * to repair, and change nothing. */
Test(cli_inspect, check_and_repair_of_a_store_a_newer_idem_wrote)
{
    size_t n;
    char *seg = t_read(t_at("store/seg-00000001.log"), &n);
    cr_assert(seg && n >= 32);
    uint32_t version;
    memcpy(&version, seg + 8, 4);
    version += 1;
    memcpy(seg + 8, &version, 4);
    uint64_t check = XXH3_64bits(seg, 24);
    memcpy(seg + 24, &check, 8);
    t_write(t_at("store/seg-00000001.log"), seg, n);
    cr_assert_eq(t_cli(t_dir, "check > out 2>&1"), 1);
    cr_assert(t_grep(t_at("out"), "a newer idem wrote it"));
    cr_assert(!t_grep(t_at("out"), "idem repair --store"));
    cr_assert_eq(t_cli(t_dir, "repair > out 2>&1"), 1);
    cr_assert(t_grep(t_at("out"), "a newer idem wrote it"));
    size_t n1;
    char *after = t_read(t_at("store/seg-00000001.log"), &n1);
    cr_assert(n1 == n && !memcmp(after, seg, n), "repair changed it");
    free(after);
    free(seg);
}

Test(cli_inspect, expired_records_are_gone)
{
    t_sh("printf '{\"id\":1}\\n{\"id\":2}\\n' > '%s'", t_at("in"));
    cr_assert_eq(t_cli(t_dir, "dedup --key id --ttl 100ms --quiet "
                              "--store local:short in > /dev/null"), 0);
    t_sh("sleep 0.3");
    /* opening the store leaves expired records out of memory already */
    cr_assert_eq(t_cli(t_dir, "stats --store local:short > out"), 0);
    cr_assert(t_grep(t_at("out"), "index entries  0"));
    cr_assert_eq(t_cli(t_dir, "sweep --store local:short > out"), 0);
    cr_assert(t_grep(t_at("out"), "removed 0 expired records; segments 1 -> "
                                  "1"), "%s", t_read(t_at("out"), NULL));
    cr_assert_eq(t_cli(t_dir, "get 1 --store local:short 2> /dev/null"), 1);
}

/* ------------------------------------------------------------------------
 * dump | load with keys that are any bytes */

#define NKEYS (2 * 256 + 400 + 4)

typedef struct key_set {
    char k[NKEYS][IDEM_KEY_MAX];
    size_t len[NKEYS];
} key_set;

static unsigned next_rand(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

/* Every byte value alone and after "k", random binary keys (some of the
 * longest length), and UTF-8 that is not valid: an overlong NUL, a
 * surrogate, a lone continuation byte, a cut sequence. */
static void make_keys(key_set *ks)
{
    static const char *const bad_utf8[] = {"\xc0\x80", "\xed\xa0\x80",
                                           "a\x80" "b", "a\xe2\x82"};
    size_t n = 0;
    for (int b = 0; b < 256; b++) {
        ks->k[n][0] = (char)b;
        ks->len[n++] = 1;
        ks->k[n][0] = 'k';
        ks->k[n][1] = (char)b;
        ks->len[n++] = 2;
    }
    unsigned seed = 2024;
    for (int i = 0; i < 400; i++, n++) {
        ks->len[n] = i % 50 == 0 ? IDEM_KEY_MAX
                                 : 3 + next_rand(&seed) % 62;
        for (size_t j = 0; j < ks->len[n]; j++)
            ks->k[n][j] = (char)next_rand(&seed);
        ks->k[n][0] = (char)i;  /* distinct from each other */
        ks->k[n][1] = (char)(i >> 8);
        ks->k[n][2] = 'r';  /* and from the shorter keys */
    }
    for (int i = 0; i < 4; i++, n++) {
        ks->len[n] = strlen(bad_utf8[i]);
        memcpy(ks->k[n], bad_utf8[i], ks->len[n]);
    }
}

/* Each key done with its own bytes as response (odd ones with a
 * fingerprint), so that a key cut short or changed shows. */
static void fill_store(const char *uri, const key_set *ks)
{
    idem_store *s;
    cr_assert_eq(idem_open(uri, NULL, &s), 0);
    for (size_t i = 0; i < NKEYS; i++) {
        uint8_t fp[IDEM_FP_LEN];
        memset(fp, (int)i, sizeof fp);
        idem_key k = {ks->k[i], ks->len[i], i % 2 ? fp : NULL};
        idem_outcome o;
        cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
        cr_assert_eq(o.kind, IDEM_NEW, "key %zu", i);
        cr_assert_eq(idem_complete(s, ks->k[i], ks->len[i], o.token,
                                   ks->k[i], ks->len[i], 0), 0);
    }
    cr_assert_eq(idem_close(s), 0);
}

static void same_records(const char *from, const char *to,
                         const key_set *ks)
{
    idem_store *a, *b;
    cr_assert_eq(idem_open(from, NULL, &a), 0);
    cr_assert_eq(idem_open(to, NULL, &b), 0);
    for (size_t i = 0; i < NKEYS; i++) {
        idem_record ra, rb;
        cr_assert_eq(idem_get(a, ks->k[i], ks->len[i], &ra), 0);
        cr_assert_eq(idem_get(b, ks->k[i], ks->len[i], &rb), 0,
                     "%s: key %zu (%zu bytes) is missing", to, i,
                     ks->len[i]);
        cr_assert(ra.state == rb.state && ra.token == rb.token &&
                  ra.created_ms == rb.created_ms &&
                  ra.expires_ms == rb.expires_ms &&
                  ra.has_fp == rb.has_fp &&
                  !memcmp(ra.fp, rb.fp, sizeof ra.fp), "%s: key %zu", to, i);
        cr_assert(rb.len == ks->len[i] &&
                  !memcmp(rb.data, ks->k[i], rb.len), "%s: key %zu", to, i);
    }
    idem_stats st;
    cr_assert_eq(idem_stats_get(b, &st), 0);
    cr_assert_eq(st.done, NKEYS, "%s: no other records", to);
    idem_close(a);
    idem_close(b);
}

Test(cli_inspect, dump_load_keeps_keys_of_any_bytes, .timeout = 120)
{
    static key_set ks;
    make_keys(&ks);
    char src[4300], dst[4300], redis[2048];
    snprintf(src, sizeof src, "local:%s", t_at("src"));
    snprintf(dst, sizeof dst, "local:%s", t_at("dst"));
    snprintf(redis, sizeof redis, "redis://%s?prefix=%s", th_redis_addr(),
             th_prefix());
    fill_store(src, &ks);
    cr_assert_eq(t_cli(t_dir, "dump --store local:src --output d 2> err"), 0);
    cr_assert_eq(t_cli(t_dir, "load --store local:dst d 2> err"), 0, "%s",
                 t_read(t_at("err"), NULL));
    same_records(src, dst, &ks);
    cr_assert_eq(t_cli(t_dir, "load --store '%s' < d 2> err", redis), 0, "%s",
                 t_read(t_at("err"), NULL));
    same_records(src, redis, &ks);
    th_shared_stop();
}

/* ------------------------------------------------------------------------
 * load validates what it reads */

/* text with '@' replaced by now and '#' by an hour later, in ms. */
static void at_now(char *out, size_t cap, const char *text, long long now)
{
    size_t n = 0;
    for (; *text && n + 24 < cap; text++) {
        int k = *text == '@' || *text == '#'
                    ? snprintf(out + n, cap - n, "%lld",
                               now + (*text == '#') * 3600000)
                    : snprintf(out + n, cap - n, "%c", *text);
        n += (size_t)k;
    }
    out[n] = '\0';
}

Test(cli_inspect, load_says_which_line_and_field_is_wrong)
{
#define T "\"state\":\"done\",\"token\":1,"
#define TIMES "\"created_ms\":@,\"expires_ms\":#"
    static const struct {
        const char *body, *field;
    } cases[] = {
        {T TIMES ",\"fingerprint\":\"000102030405060708090a0b0cabcdeg\"",
         "fingerprint"},
        {T TIMES ",\"fingerprint\":\"00\"", "fingerprint"},
        {T "\"created_ms\":#,\"expires_ms\":@", "created_ms"},
        {T "\"created_ms\":@,\"expires_ms\":4102444800000000", "expires_ms"},
        {T "\"created_ms\":-1,\"expires_ms\":#", "created_ms"},
        {T TIMES ",\"token\":2", "token"},
        {"\"state\":\"done\",\"token\":0," TIMES, "token"},
        {"\"state\":\"done\",\"token\":\"1\"," TIMES, "token"},
        {"\"state\":\"done\",\"token\":1.5," TIMES, "token"},
        {"\"state\":\"done\"," TIMES, "token"},
        {"\"state\":\"maybe\",\"token\":1," TIMES, "state"},
        {T TIMES ",\"key_base64\":\"a=b=\"", "key_base64"},
        {T TIMES ",\"expires\":1", "expires"},
        {T TIMES ",\"lease_until_ms\":1", "lease_until_ms"},
        {"\"state\":\"pending\",\"token\":1,\"created_ms\":@,"
         "\"expires_ms\":@,\"lease_until_ms\":#", "lease_until_ms"},
        {"\"state\":\"done\",\"token\":9007199254740993," TIMES, "token"},
        {T TIMES ",\"response\":{}", "response"},
        {T TIMES ",\"response\":\"a\",\"response_base64\":\"YQ==\"",
         "response_base64"},
    };
#undef T
#undef TIMES
    long long now = (long long)time(NULL) * 1000;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[800], body[600];
        at_now(body, sizeof body, cases[i].body, now);
        at_now(text, sizeof text, "{\"key\":\"good\",\"state\":\"done\","
               "\"token\":1,\"created_ms\":@,\"expires_ms\":#}\n", now);
        size_t n = strlen(text);
        snprintf(text + n, sizeof text - n, "{\"key\":\"bad\",%s}\n", body);
        t_write(t_at("bad"), text, strlen(text));
        cr_assert_eq(t_cli(t_dir, "load --store local:v bad 2> err"), 1,
                     "%s", text);
        char *err = t_read(t_at("err"), NULL);
        char want[200];
        snprintf(want, sizeof want, "idem load: bad:2: field \"%s\": ",
                 cases[i].field);
        cr_assert(!strncmp(err, want, strlen(want)), "%s\ngot: %s", text,
                  err);
        cr_assert(strchr(err, '\n') == err + strlen(err) - 1,
                  "one line: %s", err);
        free(err);
    }
}
