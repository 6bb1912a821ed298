/* keys.c - how fast keys are made, beside what they are measured against.
 *
 * Each generator runs for a fixed time on one core (the process pins
 * itself to the CPU it starts on), right after its reference measured in
 * the same run, on the same machine:
 *
 *   uuid4        vs libuuid uuid_generate_random()
 *   uuid7        vs libuuid uuid_generate_time()
 *   snowflake    vs the format's own cap: 4,096 IDs/ms = 4,096,000/s
 *   bizkey       vs OpenSSL EVP SHA-256 over the same 200-byte payloads,
 *                one reused context, as `openssl speed -evp sha256` does
 *   bizkey hmac  vs OpenSSL EVP_MAC HMAC-SHA256, the same way
 *   fingerprint  vs the same EVP SHA-256 (what a cryptographic digest
 *                would cost instead)
 *
 * Each rate is the best of three runs of a third of the time. Output:
 * name=value lines; rates are per second, ratios are ours divided by the
 * reference. Usage: keys [SECONDS per measurement, default 1]. */
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uuid/uuid.h>

#include "idem/idem.h"

static double seconds = 1.0;
static volatile unsigned sink;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs fn(ctx, batch) in batches for `secs`; returns calls/s. */
static double rate_once(void (*fn)(void *ctx, unsigned n), void *ctx,
                        double secs)
{
    unsigned batch = 1000;
    fn(ctx, batch); /* warm up: page faults, lazy init, first refill */
    double t0 = now_s(), t;
    unsigned long long calls = 0;
    do {
        fn(ctx, batch);
        calls += batch;
        t = now_s();
    } while (t - t0 < secs);
    return (double)calls / (t - t0);
}

/* The best of three runs of a third of `seconds` each: other load on the
 * machine only ever slows a run down, so the fastest is the truest. */
static double rate(void (*fn)(void *ctx, unsigned n), void *ctx)
{
    double best = 0;
    for (int i = 0; i < 3; i++) {
        double r = rate_once(fn, ctx, seconds / 3);
        if (r > best)
            best = r;
    }
    return best;
}

static void die(const char *what)
{
    fprintf(stderr, "keys: %s failed\n", what);
    exit(1);
}

/* ---- UUIDs ------------------------------------------------------------ */

static void run_uuid4(void *ctx, unsigned n)
{
    uint8_t u[16];
    for (unsigned i = 0; i < n; i++) {
        if (idem_uuid4(u))
            die("idem_uuid4");
        sink ^= u[15];
    }
}

static void run_libuuid_random(void *ctx, unsigned n)
{
    uuid_t u;
    for (unsigned i = 0; i < n; i++) {
        uuid_generate_random(u);
        sink ^= u[15];
    }
}

static void run_uuid7(void *ctx, unsigned n)
{
    uint8_t u[16];
    for (unsigned i = 0; i < n; i++) {
        if (idem_uuid7(u))
            die("idem_uuid7");
        sink ^= u[15];
    }
}

static void run_uuid7_text(void *ctx, unsigned n)
{
    uint8_t u[16];
    char s[IDEM_UUID_STRLEN + 1];
    for (unsigned i = 0; i < n; i++) {
        if (idem_uuid7(u))
            die("idem_uuid7");
        idem_uuid_format(u, s);
        sink ^= (unsigned)s[35];
    }
}

static void run_libuuid_time(void *ctx, unsigned n)
{
    uuid_t u;
    for (unsigned i = 0; i < n; i++) {
        uuid_generate_time(u);
        sink ^= u[15];
    }
}

/* ---- snowflake -------------------------------------------------------- */

static void run_snowflake(void *ctx, unsigned n)
{
    idem_snowflake *g = ctx;
    for (unsigned i = 0; i < n; i++) {
        uint64_t id;
        if (idem_snowflake_next(g, &id))
            die("idem_snowflake_next");
        sink ^= (unsigned)id;
    }
}

/* ---- digests over 200-byte payloads ----------------------------------- */

struct payloads {
    unsigned char p[256][200];
    unsigned i;
};

static const unsigned char *next_payload(struct payloads *ps)
{
    return ps->p[ps->i++ & 255];
}

struct bizctx {
    struct payloads *ps;
    idem_bizkey_gen *g;
};

static void run_bizkey(void *ctx, unsigned n)
{
    struct bizctx *b = ctx;
    char out[IDEM_BIZKEY_MAX + 1];
    for (unsigned i = 0; i < n; i++) {
        if (idem_bizkey_gen_make(b->g, "order", "A-1001",
                                 next_payload(b->ps), 200, out, sizeof out,
                                 NULL))
            die("idem_bizkey_gen_make");
        sink ^= (unsigned)out[20];
    }
}

struct evpctx {
    struct payloads *ps;
    EVP_MD_CTX *md;
    const EVP_MD *type;
    EVP_MAC_CTX *mac;
};

static void run_evp_sha256(void *ctx, unsigned n)
{
    struct evpctx *e = ctx;
    unsigned char md[32];
    unsigned int len;
    for (unsigned i = 0; i < n; i++) {
        if (!EVP_DigestInit_ex2(e->md, e->type, NULL) ||
            !EVP_DigestUpdate(e->md, next_payload(e->ps), 200) ||
            !EVP_DigestFinal_ex(e->md, md, &len))
            die("EVP SHA-256");
        sink ^= md[0];
    }
}

static void run_evp_hmac(void *ctx, unsigned n)
{
    struct evpctx *e = ctx;
    unsigned char md[32];
    size_t len;
    for (unsigned i = 0; i < n; i++) {
        if (!EVP_MAC_init(e->mac, NULL, 0, NULL) ||
            !EVP_MAC_update(e->mac, next_payload(e->ps), 200) ||
            !EVP_MAC_final(e->mac, md, &len, sizeof md))
            die("EVP HMAC-SHA256");
        sink ^= md[0];
    }
}

static void run_fingerprint(void *ctx, unsigned n)
{
    struct payloads *ps = ctx;
    uint8_t fp[IDEM_FP_LEN];
    for (unsigned i = 0; i < n; i++) {
        idem_fingerprint(next_payload(ps), 200, fp);
        sink ^= fp[0];
    }
}

static void pair(const char *name, double ours, const char *refname, double ref)
{
    printf("%s_per_s=%.0f\n%s_per_s=%.0f\n%s_vs_%s=%.2f\n", name, ours, refname,
           ref, name, refname, ours / ref);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        char *end;
        seconds = strtod(argv[1], &end);
        if (*end || !(seconds > 0 && seconds <= 60)) {
            fprintf(stderr, "usage: keys [SECONDS per measurement, 0..60]\n");
            return 2;
        }
    }
    int cpu = sched_getcpu();
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
    }
    printf("seconds_per_measurement=%.2f\n", seconds);

    double ref = rate(run_libuuid_random, NULL);
    pair("uuid4", rate(run_uuid4, NULL), "libuuid_random", ref);

    ref = rate(run_libuuid_time, NULL);
    pair("uuid7", rate(run_uuid7, NULL), "libuuid_time", ref);
    printf("uuid7_text_per_s=%.0f\n", rate(run_uuid7_text, NULL));

    idem_snowflake *sf;
    if (idem_snowflake_new(NULL, &sf))
        die("idem_snowflake_new");
    double sfr = rate(run_snowflake, sf);
    idem_snowflake_free(sf);
    printf("snowflake_per_s=%.0f\nsnowflake_cap_per_s=4096000\n"
           "snowflake_vs_cap=%.3f\n",
           sfr, sfr / 4096000.0);

    static struct payloads ps;
    for (unsigned i = 0; i < 256; i++)
        for (unsigned j = 0; j < 200; j++)
            ps.p[i][j] = (unsigned char)(i * 7 + j * 13);

    /* Fetched once, as a careful OpenSSL 3 program does: the legacy
     * EVP_sha256() pointer would fetch on every init and flatter us. */
    EVP_MD *sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    struct evpctx e = {&ps, EVP_MD_CTX_new(), sha256, NULL};
    if (!e.md || !sha256)
        die("EVP_MD_CTX_new");
    idem_bizkey_opts bo;
    idem_bizkey_opts_init(&bo);
    struct bizctx b = {&ps, NULL};
    if (idem_bizkey_gen_new(&bo, &b.g))
        die("idem_bizkey_gen_new");
    ref = rate(run_evp_sha256, &e);
    pair("bizkey_sha256_200b", rate(run_bizkey, &b), "evp_sha256_200b", ref);
    idem_bizkey_gen_free(b.g);

    static const char secret[] = "a 32-byte secret for the bench!!";
    bo.hmac_key = secret;
    bo.hmac_key_len = sizeof secret - 1;
    if (idem_bizkey_gen_new(&bo, &b.g))
        die("idem_bizkey_gen_new (hmac)");
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    e.mac = mac ? EVP_MAC_CTX_new(mac) : NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    if (!e.mac || !EVP_MAC_init(e.mac, (const unsigned char *)secret,
                                sizeof secret - 1, params))
        die("EVP_MAC HMAC");
    ref = rate(run_evp_hmac, &e);
    pair("bizkey_hmac_200b", rate(run_bizkey, &b), "evp_hmac_sha256_200b", ref);
    idem_bizkey_gen_free(b.g);

    ref = rate(run_evp_sha256, &e);
    pair("fingerprint_200b", rate(run_fingerprint, &ps), "evp_sha256_200b",
         ref);

    EVP_MAC_CTX_free(e.mac);
    EVP_MAC_free(mac);
    EVP_MD_CTX_free(e.md);
    EVP_MD_free(sha256);
    return 0;
}
