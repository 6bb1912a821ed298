/* keygen.c - `idem keygen`: make keys in scripts, read them back.
 *
 * Producers written in shell, tests that need a pile of keys, an operator
 * staring at a key in a log and wondering when and where it was made: the
 * library's generators and decoders, one key per line, fields as
 * name=value lines that grep and awk take apart.
 *
 * Every way to get the command line wrong gets its own message saying
 * what was wrong and what to type instead, and exit status 2, before any
 * key is printed. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "idem/idem.h"

#define KG "keygen" /* the name in messages */
#define KG_PAYLOAD_MAX (256u << 20)

static const char kg_keygen_help[] =
    "usage: idem keygen KIND [options]\n"
    "       idem keygen --decode KEY [--epoch E]\n"
    "\n"
    "Print idempotency keys, one per line, or the fields of a key.\n"
    "\n"
    "KIND\n"
    "  uuid4       random UUID (RFC 9562 5.4), 36 lowercase chars:\n"
    "                0b6f3a2e-6d8c-4f5e-9a1b-2c3d4e5f6a7b\n"
    "  uuid7       time-ordered UUID (RFC 9562 5.7): Unix ms, a counter, 58\n"
    "              random bits; each key sorts after the previous one\n"
    "                01936d2b-8c41-7a3f-8e2d-5b7c9a1e3f40\n"
    "  snowflake   63-bit decimal ID: 41 bits of ms since the epoch, 10 bits\n"
    "              of node, 12 bits of sequence (4,096 per ms per node)\n"
    "                119587103542349824\n"
    "  bizkey      prefix:id:hash, derived from a payload; the same payload\n"
    "              always gives the same key\n"
    "                order:A-1001:9f86d081884c7d65\n"
    "  fingerprint 32 hex digits of XXH3-128(payload), as stored with claims\n"
    "              to detect a key reused for another payload\n"
    "\n"
    "OPTIONS\n"
    "  -n, --count N         how many keys (uuid4, uuid7, snowflake); 1\n"
    "  --node N              snowflake node, 0..1023; 0. Every generator that\n"
    "                        runs at the same time needs its own node.\n"
    "  --epoch E             snowflake epoch: Unix ms, or ISO 8601 in UTC or\n"
    "                        with an offset (2024-01-01, "
    "2024-01-01T00:00:00Z,\n"
    "                        2024-01-01T09:00:00+09:00); "
    "2024-01-01T00:00:00Z.\n"
    "                        Decoding needs the epoch the IDs were made with.\n"
    "  --state-file F        snowflake high-water mark: a later run whose "
    "clock\n"
    "                        is behind this one's waits or fails instead of\n"
    "                        repeating IDs. Locked while in use.\n"
    "  --max-wait MS         snowflake: the longest clock step back to wait\n"
    "                        out before failing; 1000\n"
    "  --prefix P --id ID    bizkey parts. prefix: 1..64 of A-Z a-z 0-9 . _ -\n"
    "                        starting with a letter or digit; id: 1..256 of\n"
    "                        A-Z a-z 0-9 . _ - ~ @ + = /\n"
    "  --payload STR         the payload (bizkey, fingerprint) ...\n"
    "  --payload-file F      ... or the bytes of file F ...\n"
    "  -                     ... or standard input\n"
    "  --hmac-key-file F     bizkey: hash with HMAC-SHA256 keyed by the bytes\n"
    "                        of F, all of them: write it with printf '%s',\n"
    "                        not echo, or the newline becomes part of the key\n"
    "  --hash-len N          bizkey: hex digits of the hash, 8..64; 16\n"
    "  --decode KEY          print the fields of KEY as name=value lines; the\n"
    "                        kind is recognised, or give it first\n"
    "  -h, --help            this text\n"
    "\n"
    "BIZKEY COLLISION ODDS\n"
    "  Two different payloads under the same prefix:id get the same key with\n"
    "  odds 16^-N for N hex digits; among k payloads under one prefix:id,\n"
    "  any two collide with odds about k^2/2/16^N.\n"
    "     N  bits  one pair   k for odds 1e-6   k for odds 1%\n"
    "     8    32   2.3e-10                93           9,300\n"
    "    12    48   3.6e-15            23,700           2.4e6\n"
    "    16    64   5.4e-20             6.1e6           6.1e8\n"
    "    24    96   1.3e-29            4.0e11          4.0e13\n"
    "    32   128   2.9e-39            2.6e16          2.6e18\n"
    "    64   256   8.6e-78            4.8e35          4.8e37\n"
    "\n"
    "EXIT STATUS\n"
    "  0  keys printed or decoded\n"
    "  1  failed: a clock behind the state file by more than --max-wait, a\n"
    "     locked or damaged state file, an unreadable file, a KEY that is no\n"
    "     key idem knows, an output error\n"
    "  2  bad command line: nothing was printed\n"
    "\n"
    "EXAMPLES\n"
    "  idem keygen uuid7 -n 3\n"
    "  idem keygen snowflake --node 12 --state-file /var/lib/app/sf.state\n"
    "  idem keygen bizkey --prefix order --id A-1001 --payload-file msg.json\n"
    "  jq -c .body msg.json | idem keygen bizkey --prefix order --id A-1001 "
    "\\\n"
    "      --hmac-key-file /etc/app/key -\n"
    "  idem keygen --decode 01936d2b-8c41-7a3f-8e2d-5b7c9a1e3f40\n"
    "  idem keygen --decode 119587103542349824 --epoch 2024-01-01\n";

enum kg_kind {
    KG_NONE,
    KG_UUID4,
    KG_UUID7,
    KG_SNOWFLAKE,
    KG_BIZKEY,
    KG_FINGERPRINT
};

static const char *const kg_kind_names[] = {
    "", "uuid4", "uuid7", "snowflake", "bizkey", "fingerprint",
};

struct kg_opts {
    enum kg_kind kind;
    uint64_t count;
    int count_set;
    unsigned node;
    int node_set;
    int64_t epoch_ms;
    int epoch_set;
    const char *state_file;
    int64_t max_wait_ms;
    int max_wait_set;
    const char *prefix, *id;
    const char *payload, *payload_file;
    int payload_stdin;
    const char *hmac_key_file;
    unsigned hash_len;
    int hash_len_set;
    const char *decode;
};

/* YYYY-MM-DDTHH:MM:SS.mmmZ */
static void kg_format_time(int64_t ms, char *out, size_t n)
{
    time_t secs = (time_t)(ms / 1000);
    struct tm tm;
    if (ms < 0 || !gmtime_r(&secs, &tm)) {
        snprintf(out, n, "?");
        return;
    }
    snprintf(out, n, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(ms % 1000));
}

/* The whole of fd (a file or stdin), at most KG_PAYLOAD_MAX bytes. */
static int kg_slurp(int fd, const char *name, unsigned char **data, size_t *len)
{
    size_t cap = 4096, n = 0;
    unsigned char *buf = malloc(cap);
    if (!buf)
        return cli_fail(KG, "out of memory");
    for (;;) {
        if (n == cap) {
            if (cap >= KG_PAYLOAD_MAX) {
                free(buf);
                return cli_fail(KG, "%s: larger than %u MiB", name,
                                KG_PAYLOAD_MAX >> 20);
            }
            unsigned char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return cli_fail(KG, "out of memory reading %s", name);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            return cli_fail(KG, "reading %s: %s", name, strerror(e));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    *data = buf;
    *len = n;
    return 0;
}

static int kg_read_file(const char *path, unsigned char **data, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cli_fail(KG, "cannot open %s: %s", path, strerror(errno));
    int rc = kg_slurp(fd, path, data, len);
    close(fd);
    return rc;
}

/* ---- generating ----------------------------------------------------- */

static int kg_out_error(void)
{
    return cli_fail(KG, "writing the keys failed: %s", strerror(errno));
}

static int kg_gen_uuids(const struct kg_opts *o)
{
    char line[IDEM_UUID_STRLEN + 2];
    uint8_t u[IDEM_UUID_LEN];
    for (uint64_t i = 0; i < o->count; i++) {
        int rc = o->kind == KG_UUID4 ? idem_uuid4(u) : idem_uuid7(u);
        if (rc)
            return cli_fail(KG, "%s", idem_strerror(rc));
        idem_uuid_format(u, line);
        line[IDEM_UUID_STRLEN] = '\n';
        if (fwrite(line, 1, IDEM_UUID_STRLEN + 1, stdout) !=
            IDEM_UUID_STRLEN + 1)
            return kg_out_error();
    }
    return 0;
}

static int kg_gen_snowflakes(const struct kg_opts *o)
{
    idem_snowflake_opts so;
    idem_snowflake_opts_init(&so);
    so.node = o->node;
    if (o->epoch_set)
        so.epoch_ms = o->epoch_ms;
    if (o->max_wait_set) {
        so.max_wait_ms = o->max_wait_ms;
        if (so.reserve_ms > so.max_wait_ms)
            so.reserve_ms = so.max_wait_ms;
    }
    so.state_file = o->state_file;
    idem_snowflake *g;
    int rc = idem_snowflake_new(&so, &g);
    if (rc) {
        int ex = cli_fail(KG, "%s: %s", idem_strerror(rc),
                          idem_snowflake_errdetail(g));
        idem_snowflake_free(g);
        return ex;
    }
    char line[IDEM_SNOWFLAKE_STRLEN + 2];
    int ex = 0;
    for (uint64_t i = 0; i < o->count && !ex; i++) {
        uint64_t id;
        rc = idem_snowflake_next(g, &id);
        if (rc) {
            ex = cli_fail(KG, "%s: %s", idem_strerror(rc),
                          idem_snowflake_errdetail(g));
            break;
        }
        size_t n = idem_snowflake_format(id, line);
        line[n++] = '\n';
        if (fwrite(line, 1, n, stdout) != n)
            ex = kg_out_error();
    }
    rc = idem_snowflake_free(g);
    if (rc && !ex)
        ex = cli_fail(KG, "closing the state file: %s", idem_strerror(rc));
    return ex;
}

static int kg_load_payload(const struct kg_opts *o, unsigned char **data,
                           size_t *len)
{
    if (o->payload) {
        *len = strlen(o->payload);
        *data = malloc(*len + 1);
        if (!*data)
            return cli_fail(KG, "out of memory");
        memcpy(*data, o->payload, *len + 1);
        return 0;
    }
    if (o->payload_file)
        return kg_read_file(o->payload_file, data, len);
    return kg_slurp(STDIN_FILENO, "standard input", data, len);
}

static int kg_gen_bizkey(const struct kg_opts *o)
{
    unsigned char *payload = NULL, *secret = NULL;
    size_t plen = 0, slen = 0;
    int ex = kg_load_payload(o, &payload, &plen);
    if (ex)
        return ex;
    if (o->hmac_key_file) {
        ex = kg_read_file(o->hmac_key_file, &secret, &slen);
        if (ex) {
            free(payload);
            return ex;
        }
        if (slen == 0) {
            free(payload);
            free(secret);
            return cli_fail(KG, "the HMAC key file %s is empty",
                            o->hmac_key_file);
        }
    }
    idem_bizkey_opts bo;
    idem_bizkey_opts_init(&bo);
    if (o->hash_len_set)
        bo.hash_len = o->hash_len;
    bo.hmac_key = secret;
    bo.hmac_key_len = slen;
    idem_bizkey_gen *g;
    int rc = idem_bizkey_gen_new(&bo, &g);
    char key[IDEM_BIZKEY_MAX + 2];
    size_t klen = 0;
    if (!rc)
        rc = idem_bizkey_gen_make(g, o->prefix, o->id, payload, plen, key,
                                  sizeof key, &klen);
    if (rc) {
        ex = cli_fail(KG, "%s: %s", idem_strerror(rc),
                      idem_bizkey_gen_errdetail(g));
    } else {
        key[klen++] = '\n';
        if (fwrite(key, 1, klen, stdout) != klen)
            ex = kg_out_error();
    }
    idem_bizkey_gen_free(g);
    if (secret)
        explicit_bzero(secret, slen);
    free(secret);
    free(payload);
    return ex;
}

static int kg_gen_fingerprint(const struct kg_opts *o)
{
    unsigned char *payload = NULL;
    size_t plen = 0;
    int ex = kg_load_payload(o, &payload, &plen);
    if (ex)
        return ex;
    uint8_t fp[IDEM_FP_LEN];
    char hex[2 * IDEM_FP_LEN + 1];
    idem_fingerprint(payload, plen, fp);
    idem_fingerprint_hex(fp, hex);
    free(payload);
    if (printf("%s\n", hex) < 0)
        return kg_out_error();
    return 0;
}

/* ---- decoding ----------------------------------------------------------- */

static int kg_decode_uuid(const char *key, int strict_kind)
{
    uint8_t u[IDEM_UUID_LEN];
    if (idem_uuid_parse(key, strlen(key), u))
        return -1;
    char canon[IDEM_UUID_STRLEN + 1];
    idem_uuid_format(u, canon);
    int v = idem_uuid_version(u);
    if (strict_kind && v != strict_kind)
        return cli_fail(KG, "%s is a UUID of version %d, not a uuid%d", key, v,
                        strict_kind);
    if (v == 4 || v == 7)
        printf("kind=uuid%d\n", v);
    else
        printf("kind=uuid\n");
    printf("uuid=%s\n", canon);
    if (v < 0) {
        printf("variant=other\n");
        return 0;
    }
    printf("version=%d\nvariant=rfc9562\n", v);
    if (v == 7) {
        int64_t ms = idem_uuid7_unix_ms(u);
        char t[80];
        kg_format_time(ms, t, sizeof t);
        printf("unix_ms=%" PRId64 "\ntime=%s\n", ms, t);
    }
    return 0;
}

static int kg_decode_snowflake(const char *key, const struct kg_opts *o)
{
    uint64_t id;
    if (idem_snowflake_parse(key, strlen(key), &id))
        return -1;
    int64_t epoch = o->epoch_set ? o->epoch_ms : IDEM_SNOWFLAKE_EPOCH_MS;
    idem_snowflake_parts p;
    if (idem_snowflake_decode(id, epoch, &p))
        return -1;
    char t[80], e[80];
    kg_format_time(p.unix_ms, t, sizeof t);
    kg_format_time(epoch, e, sizeof e);
    printf("kind=snowflake\nid=%" PRIu64 "\nunix_ms=%" PRId64 "\ntime=%s\n"
           "since_epoch_ms=%" PRId64 "\nepoch_ms=%" PRId64 "\nepoch=%s\n"
           "node=%u\nseq=%u\n",
           id, p.unix_ms, t, p.since_epoch_ms, epoch, e, p.node, p.seq);
    return 0;
}

static int kg_decode_bizkey(const char *key)
{
    idem_bizkey_parts p;
    if (idem_bizkey_parse(key, strlen(key), &p))
        return -1;
    printf("kind=bizkey\nprefix=%.*s\nid=%.*s\nhash=%.*s\nhash_len=%zu\n"
           "hash_bits=%zu\n",
           (int)p.prefix_len, p.prefix, (int)p.id_len, p.id, (int)p.hash_len,
           p.hash, p.hash_len, p.hash_len * 4);
    return 0;
}

static int kg_decode(const struct kg_opts *o)
{
    const char *k = o->decode;
    int rc;
    switch (o->kind) {
    case KG_UUID4:
    case KG_UUID7:
        rc = kg_decode_uuid(k, o->kind == KG_UUID4 ? 4 : 7);
        break;
    case KG_SNOWFLAKE:
        rc = kg_decode_snowflake(k, o);
        break;
    case KG_BIZKEY:
        rc = kg_decode_bizkey(k);
        break;
    default:
        if (strchr(k, ':'))
            rc = kg_decode_bizkey(k);
        else if (strlen(k) == IDEM_UUID_STRLEN)
            rc = kg_decode_uuid(k, 0);
        else
            rc = kg_decode_snowflake(k, o);
        break;
    }
    if (rc < 0)
        return cli_fail(
            KG, "cannot decode '%s': %s", k,
            o->kind == KG_SNOWFLAKE
                ? "not a snowflake ID (1..19 decimal digits, below 2^63)"
            : o->kind == KG_BIZKEY
                ? "not a bizkey (prefix:id:hash, 8..64 lowercase hex "
                  "digits of hash)"
            : o->kind != KG_NONE
                ? "not a UUID (8-4-4-4-12 hex digits)"
                : "not a UUID (8-4-4-4-12 hex digits), a snowflake ID "
                  "(decimal, below 2^63) or a bizkey (prefix:id:hash)");
    return rc;
}

/* ---- the command line ------------------------------------------------- */

enum {
    OPT_NODE = 256,
    OPT_EPOCH,
    OPT_STATE_FILE,
    OPT_MAX_WAIT,
    OPT_PREFIX,
    OPT_ID,
    OPT_PAYLOAD,
    OPT_PAYLOAD_FILE,
    OPT_HMAC_KEY_FILE,
    OPT_HASH_LEN,
    OPT_DECODE
};

static const struct option kg_long_opts[] = {
    {"count", required_argument, NULL, 'n'},
    {"node", required_argument, NULL, OPT_NODE},
    {"epoch", required_argument, NULL, OPT_EPOCH},
    {"state-file", required_argument, NULL, OPT_STATE_FILE},
    {"max-wait", required_argument, NULL, OPT_MAX_WAIT},
    {"prefix", required_argument, NULL, OPT_PREFIX},
    {"id", required_argument, NULL, OPT_ID},
    {"payload", required_argument, NULL, OPT_PAYLOAD},
    {"payload-file", required_argument, NULL, OPT_PAYLOAD_FILE},
    {"hmac-key-file", required_argument, NULL, OPT_HMAC_KEY_FILE},
    {"hash-len", required_argument, NULL, OPT_HASH_LEN},
    {"decode", required_argument, NULL, OPT_DECODE},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* An option given with a kind it does not apply to. */
static int kg_not_for(const char *opt, const char *kinds, enum kg_kind kind)
{
    return cli_usage_error(KG, "--%s applies to %s only, not to %s", opt, kinds,
                           kg_kind_names[kind]);
}

static int kg_check_combination(const struct kg_opts *o)
{
    enum kg_kind k = o->kind;
    if (o->decode) {
        if (o->count_set || o->node_set || o->state_file || o->max_wait_set ||
            o->prefix || o->id || o->payload || o->payload_file ||
            o->payload_stdin || o->hmac_key_file || o->hash_len_set)
            return cli_usage_error(KG, "--decode takes only a key (and --epoch "
                                   "for a snowflake); drop the other options");
        if (k == KG_FINGERPRINT)
            return cli_usage_error(KG, "a fingerprint cannot be decoded: it "
                                   "is a digest; compute it again and "
                                   "compare");
        return 0;
    }
    if (k == KG_NONE)
        return cli_usage_error(KG, "say which kind of key: idem keygen "
                               "uuid4, uuid7, snowflake, bizkey or "
                               "fingerprint (or --decode KEY)");
    int snow = k == KG_SNOWFLAKE, biz = k == KG_BIZKEY;
    int takes_payload = biz || k == KG_FINGERPRINT;
    if (o->node_set && !snow)
        return kg_not_for("node", "snowflake", k);
    if (o->epoch_set && !snow)
        return kg_not_for("epoch", "snowflake (and --decode)", k);
    if (o->state_file && !snow)
        return kg_not_for("state-file", "snowflake", k);
    if (o->max_wait_set && !snow)
        return kg_not_for("max-wait", "snowflake", k);
    if (o->prefix && !biz)
        return kg_not_for("prefix", "bizkey", k);
    if (o->id && !biz)
        return kg_not_for("id", "bizkey", k);
    if (o->hmac_key_file && !biz)
        return kg_not_for("hmac-key-file", "bizkey", k);
    if (o->hash_len_set && !biz)
        return kg_not_for("hash-len", "bizkey", k);
    int sources = !!o->payload + !!o->payload_file + o->payload_stdin;
    if (sources && !takes_payload)
        return cli_usage_error(KG, "%s keys take no payload; --payload, "
                               "--payload-file and - apply to bizkey and "
                               "fingerprint",
                               kg_kind_names[k]);
    if (takes_payload) {
        if (o->count_set)
            return cli_usage_error(KG, "-n does not apply to %s: the same "
                                   "payload always gives the same %s; run "
                                   "once per payload",
                                   kg_kind_names[k],
                                   biz ? "key" : "fingerprint");
        if (sources == 0)
            return cli_usage_error(KG, "%s needs a payload: --payload STR, "
                                   "--payload-file FILE, or - for standard "
                                   "input",
                                   kg_kind_names[k]);
        if (sources > 1)
            return cli_usage_error(KG, "give one payload: --payload, "
                                   "--payload-file or -, not several");
    }
    if (biz) {
        char why[256];
        if (!o->prefix || !o->id)
            return cli_usage_error(KG, "bizkey needs --prefix and --id, e.g. "
                                   "idem keygen bizkey --prefix order --id "
                                   "A-1001 --payload-file msg.json");
        if (idem_bizkey_check_prefix(o->prefix, why, sizeof why) ||
            idem_bizkey_check_id(o->id, why, sizeof why))
            return cli_usage_error(KG, "%s", why);
    }
    return 0;
}

/* A word that is not an option: the kind, or "-" for standard input. */
static int kg_positional(struct kg_opts *o, const char *a)
{
    if (strcmp(a, "-") == 0) {
        o->payload_stdin = 1;
        return 0;
    }
    enum kg_kind k = KG_NONE;
    for (int i = 1; i <= KG_FINGERPRINT; i++)
        if (strcmp(a, kg_kind_names[i]) == 0)
            k = (enum kg_kind)i;
    if (k == KG_NONE)
        return cli_usage_error(KG, "unknown key kind '%s': use uuid4, uuid7, "
                               "snowflake, bizkey or fingerprint",
                               a);
    if (o->kind != KG_NONE)
        return cli_usage_error(KG, "give one kind, not '%s' and '%s'",
                               kg_kind_names[o->kind], a);
    o->kind = k;
    return 0;
}

/* The value of option c into o: 0, or the exit status of bad usage. */
static int kg_option(struct kg_opts *o, int c)
{
    uint64_t v = 0;
    int ex = 0;
    switch (c) {
    case 'n':
        ex = cli_number(KG, "-n", optarg, 1, UINT64_MAX / 2, &o->count);
        o->count_set = 1;
        break;
    case OPT_NODE:
        ex = cli_number(KG, "--node", optarg, 0, IDEM_SNOWFLAKE_NODE_MAX, &v);
        o->node = (unsigned)v;
        o->node_set = 1;
        break;
    case OPT_EPOCH:
        ex = cli_time(KG, "--epoch", optarg, &o->epoch_ms);
        o->epoch_set = 1;
        break;
    case OPT_STATE_FILE:
        if (!optarg[0])
            ex = cli_usage_error(KG, "--state-file wants a file name");
        o->state_file = optarg;
        break;
    case OPT_MAX_WAIT:
        ex = cli_number(KG, "--max-wait", optarg, 0, 24u * 3600 * 1000, &v);
        o->max_wait_ms = (int64_t)v;
        o->max_wait_set = 1;
        break;
    case OPT_PREFIX:
        o->prefix = optarg;
        break;
    case OPT_ID:
        o->id = optarg;
        break;
    case OPT_PAYLOAD:
        o->payload = optarg;
        break;
    case OPT_PAYLOAD_FILE:
        o->payload_file = optarg;
        break;
    case OPT_HMAC_KEY_FILE:
        o->hmac_key_file = optarg;
        break;
    case OPT_HASH_LEN:
        ex = cli_number(KG, "--hash-len", optarg, IDEM_BIZKEY_HASH_MIN,
                        IDEM_BIZKEY_HASH_MAX, &v);
        o->hash_len = (unsigned)v;
        o->hash_len_set = 1;
        break;
    case OPT_DECODE:
        o->decode = optarg;
        break;
    }
    return ex;
}

/* The options, then the words that are not options (getopt moves them
 * last): 0 or the exit status of bad usage; -1 after --help. */
static int kg_parse(int argc, char **argv, struct kg_opts *o)
{
    int c, ex = 0;
    while (!ex &&
           (c = cli_getopt_short(KG, argc, argv, ":n:h", kg_long_opts)) != -1) {
        if (c == '?')
            return CLI_EXIT_USAGE;
        if (c == 'h') {
            fputs(kg_keygen_help, stdout);
            return -1;
        }
        ex = kg_option(o, c);
    }
    for (int i = optind; !ex && i < argc; i++)
        ex = kg_positional(o, argv[i]);
    return ex ? ex : kg_check_combination(o);
}

int cli_cmd_keygen(int argc, char **argv)
{
    struct kg_opts o = {.count = 1};
    int ex = kg_parse(argc, argv, &o);
    if (ex)
        return ex < 0 ? CLI_EXIT_OK : ex;
    if (o.decode)
        ex = kg_decode(&o);
    else if (o.kind == KG_SNOWFLAKE)
        ex = kg_gen_snowflakes(&o);
    else if (o.kind == KG_BIZKEY)
        ex = kg_gen_bizkey(&o);
    else if (o.kind == KG_FINGERPRINT)
        ex = kg_gen_fingerprint(&o);
    else
        ex = kg_gen_uuids(&o);
    if (fflush(stdout) != 0 || ferror(stdout))
        return ex ? ex : kg_out_error();
    return ex;
}
