/* test_keygen_cli.c - `idem keygen` as a user runs it: the real binary
 * (env IDEM_CLI), its output, its messages and exit statuses. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "idem/idem.h"

extern char **environ;

struct run {
    int status; /* exit status, or -1 if killed */
    char *out, *err;
    size_t outlen;
};

static char *slurp_fd(int fd, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    lseek(fd, 0, SEEK_SET);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

static int temp_fd(void)
{
    char path[] = "/tmp/idem-cli-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    unlink(path);
    return fd;
}

/* Run argv (argv[0] is replaced by the CLI unless prefix is given: then
 * the command is prefix..., CLI, argv[1]...) with input on stdin. */
static struct run run_full(const char *const *prefix, const char *const *argv,
                           const char *input)
{
    const char *cli = getenv("IDEM_CLI");
    cr_assert(cli, "IDEM_CLI is not set (run through scripts/run-tests.sh)");
    const char *args[64];
    int n = 0;
    for (; prefix && prefix[n]; n++)
        args[n] = prefix[n];
    args[n++] = cli;
    for (int i = 1; argv[i]; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    int in = temp_fd(), out = temp_fd(), err = temp_fd();
    if (input) {
        size_t len = strlen(input);
        cr_assert_eq(write(in, input, len), (ssize_t)len);
        lseek(in, 0, SEEK_SET);
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in, 0);
    posix_spawn_file_actions_adddup2(&fa, out, 1);
    posix_spawn_file_actions_adddup2(&fa, err, 2);
    pid_t pid;
    int rc =
        posix_spawnp(&pid, args[0], &fa, NULL, (char *const *)args, environ);
    cr_assert_eq(rc, 0, "cannot run %s", args[0]);
    posix_spawn_file_actions_destroy(&fa);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    struct run r;
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = slurp_fd(out, &r.outlen);
    r.err = slurp_fd(err, NULL);
    close(in);
    close(out);
    close(err);
    return r;
}

static struct run run(const char *const *argv)
{
    return run_full(NULL, argv, NULL);
}

static void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
}

/* Split r->out into lines (modifies it); returns the count. */
static size_t lines(struct run *r, char **v, size_t max)
{
    size_t n = 0;
    char *p = r->out;
    while (*p && n < max) {
        char *e = strchr(p, '\n');
        v[n++] = p;
        if (!e)
            break;
        *e = '\0';
        p = e + 1;
    }
    return n;
}

/* The value of name=... among r's output lines, or NULL. */
static const char *field(const struct run *r, const char *name)
{
    static char val[256];
    size_t nl = strlen(name);
    for (const char *p = r->out; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
            snprintf(val, sizeof val, "%.*s", (int)(len - nl - 1), p + nl + 1);
            return val;
        }
        p = e ? e + 1 : NULL;
    }
    return NULL;
}

#define ARGS(...) ((const char *const[]){"idem", __VA_ARGS__, NULL})

Test(keygen_cli, uuid7_lines_increase, .timeout = 30)
{
    struct run r = run(ARGS("keygen", "uuid7", "-n", "1000"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(r.outlen, 1000u * 37);
    char *v[1001];
    cr_assert_eq(lines(&r, v, 1001), 1000u);
    for (int i = 0; i < 1000; i++) {
        uint8_t u[16];
        cr_assert_eq(strlen(v[i]), 36u);
        cr_assert_eq(idem_uuid_parse(v[i], 36, u), 0);
        cr_assert_eq(idem_uuid_version(u), 7);
        if (i)
            cr_assert_lt(strcmp(v[i - 1], v[i]), 0);
    }
    run_free(&r);
}

Test(keygen_cli, uuid4_and_snowflake, .timeout = 30)
{
    struct run r = run(ARGS("keygen", "uuid4", "--count", "100"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    char *v[200];
    cr_assert_eq(lines(&r, v, 200), 100u);
    for (int i = 0; i < 100; i++) {
        uint8_t u[16];
        cr_assert_eq(idem_uuid_parse(v[i], strlen(v[i]), u), 0);
        cr_assert_eq(idem_uuid_version(u), 4);
    }
    run_free(&r);

    r = run(ARGS("keygen", "snowflake", "-n", "5000", "--node", "9", "--epoch",
                 "2020-01-01T00:00:00Z"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    char *s[6000];
    cr_assert_eq(lines(&r, s, 6000), 5000u);
    uint64_t prev = 0;
    for (int i = 0; i < 5000; i++) {
        uint64_t id;
        idem_snowflake_parts p;
        cr_assert_eq(idem_snowflake_parse(s[i], strlen(s[i]), &id), 0);
        cr_assert_eq(idem_snowflake_decode(id, 1577836800000, &p), 0);
        cr_assert_eq(p.node, 9u);
        cr_assert_gt(id, prev);
        prev = id;
    }
    run_free(&r);
}

Test(keygen_cli, bizkey_payload_sources_agree, .timeout = 30)
{
    const char *sha_abc =
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    char want[128];
    snprintf(want, sizeof want, "order:A-1001:%s\n", sha_abc);
    struct run r = run(ARGS("keygen", "bizkey", "--prefix", "order", "--id",
                            "A-1001", "--payload", "abc", "--hash-len", "64"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_eq(r.out, want);
    run_free(&r);

    r = run_full(NULL,
                 ARGS("keygen", "bizkey", "--prefix", "order", "--id", "A-1001",
                      "--hash-len", "64", "-"),
                 "abc");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_eq(r.out, want, "stdin");
    run_free(&r);

    char file[] = "/tmp/idem-payload-XXXXXX";
    int fd = mkstemp(file);
    cr_assert_eq(write(fd, "abc", 3), 3);
    close(fd);
    r = run(ARGS("keygen", "bizkey", "--prefix", "order", "--id", "A-1001",
                 "--payload-file", file, "--hash-len", "64"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_eq(r.out, want, "file");
    run_free(&r);

    /* Default length 16. */
    r = run(ARGS("keygen", "bizkey", "--prefix", "order", "--id", "A-1001",
                 "--payload", "abc"));
    cr_assert_str_eq(r.out, "order:A-1001:ba7816bf8f01cfea\n");
    run_free(&r);

    /* RFC 4231 case 2 through a key file: "Jefe", no newline. */
    char key[] = "/tmp/idem-key-XXXXXX";
    fd = mkstemp(key);
    cr_assert_eq(write(fd, "Jefe", 4), 4);
    close(fd);
    r = run(ARGS("keygen", "bizkey", "--prefix", "p", "--id", "i", "--payload",
                 "what do ya want for nothing?", "--hmac-key-file", key,
                 "--hash-len", "64"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_eq(r.out, "p:i:5bdcc146bf60754e6a042426089575c75a003f089d2"
                            "739839dec58b964ec3843\n");
    run_free(&r);

    /* An empty key file is refused (status 1: the file, not the line). */
    fd = open(key, O_WRONLY | O_TRUNC);
    close(fd);
    r = run(ARGS("keygen", "bizkey", "--prefix", "p", "--id", "i", "--payload",
                 "x", "--hmac-key-file", key));
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "empty"), "%s", r.err);
    cr_assert_str_eq(r.out, "");
    run_free(&r);
    unlink(key);
    unlink(file);

    r = run(ARGS("keygen", "fingerprint", "--payload", ""));
    cr_assert_str_eq(r.out, "99aa06d3014798d86001c324468d497f\n");
    run_free(&r);
}

Test(keygen_cli, decode, .timeout = 30)
{
    /* 2024-06-01T12:00:00.123Z = 1717243200123 ms, node 5, seq 7,
     * default epoch. */
    uint64_t id = (uint64_t)(1717243200123 - IDEM_SNOWFLAKE_EPOCH_MS) << 22 |
                  5u << 12 | 7u;
    char ids[32];
    snprintf(ids, sizeof ids, "%llu", (unsigned long long)id);
    struct run r = run(ARGS("keygen", "--decode", ids));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_eq(field(&r, "kind"), "snowflake");
    cr_assert_str_eq(field(&r, "unix_ms"), "1717243200123");
    cr_assert_str_eq(field(&r, "time"), "2024-06-01T12:00:00.123Z");
    cr_assert_str_eq(field(&r, "node"), "5");
    cr_assert_str_eq(field(&r, "seq"), "7");
    run_free(&r);

    /* The same ID read with another epoch (given as ISO 8601 with an
     * offset) moves by the difference of the epochs. */
    r = run(ARGS("keygen", "--decode", ids, "--epoch",
                 "2024-01-02T09:00:00+09:00"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_eq(field(&r, "unix_ms"), "1717329600123");
    cr_assert_str_eq(field(&r, "epoch_ms"), "1704153600000");
    cr_assert_str_eq(field(&r, "node"), "5");
    run_free(&r);
    r = run(ARGS("keygen", "--decode", ids, "--epoch", "1704153600000"));
    cr_assert_str_eq(field(&r, "unix_ms"), "1717329600123");
    run_free(&r);

    r = run(ARGS("keygen", "--decode", "01936d2b-8c41-7a3f-8e2d-5b7c9a1e3f40"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_eq(field(&r, "kind"), "uuid7");
    cr_assert_str_eq(field(&r, "version"), "7");
    cr_assert_str_eq(field(&r, "unix_ms"), "1732703390785");
    cr_assert_str_eq(field(&r, "time"), "2024-11-27T10:29:50.785Z");
    run_free(&r);

    r = run(ARGS("keygen", "--decode", "0B6F3A2E-6D8C-4F5E-9A1B-2C3D4E5F6A7B"));
    cr_assert_str_eq(field(&r, "kind"), "uuid4");
    cr_assert_str_eq(field(&r, "uuid"), "0b6f3a2e-6d8c-4f5e-9a1b-2c3d4e5f6a7b");
    run_free(&r);

    r = run(ARGS("keygen", "--decode", "order:A-1001:9f86d081884c7d65"));
    cr_assert_str_eq(field(&r, "kind"), "bizkey");
    cr_assert_str_eq(field(&r, "prefix"), "order");
    cr_assert_str_eq(field(&r, "id"), "A-1001");
    cr_assert_str_eq(field(&r, "hash"), "9f86d081884c7d65");
    cr_assert_str_eq(field(&r, "hash_bits"), "64");
    run_free(&r);

    /* A generated key decodes back to the time it was made. */
    struct run g = run(ARGS("keygen", "uuid7"));
    g.out[36] = '\0';
    r = run(ARGS("keygen", "uuid7", "--decode", g.out));
    cr_assert_eq(r.status, 0);
    long long ms = strtoll(field(&r, "unix_ms"), NULL, 10);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long now = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    cr_assert(ms <= now && ms > now - 60000, "%lld vs %lld", ms, now);
    run_free(&r);
    run_free(&g);

    r = run(ARGS("keygen", "--decode", "not-a-key"));
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "cannot decode 'not-a-key'"), "%s", r.err);
    run_free(&r);
    r = run(ARGS("keygen", "uuid7", "--decode",
                 "0b6f3a2e-6d8c-4f5e-9a1b-2c3d4e5f6a7b"));
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "version 4"), "%s", r.err);
    run_free(&r);
}

/* Every wrong command line: status 2, nothing on stdout, and a message
 * that names the problem. */
Test(keygen_cli, bad_options_exit_2, .timeout = 60)
{
    struct {
        const char *const *argv;
        const char *says;
    } cases[] = {
        {ARGS("keygen"), "say which kind of key"},
        {ARGS("keygen", "uuid5"), "unknown key kind 'uuid5'"},
        {ARGS("keygen", "uuid4", "uuid7"), "give one kind"},
        {ARGS("keygen", "uuid4", "-n", "0"), "-n wants a whole number from 1"},
        {ARGS("keygen", "uuid4", "-n", "-5"), "-n wants a whole number"},
        {ARGS("keygen", "uuid4", "-n", "12x"), "not '12x'"},
        {ARGS("keygen", "uuid4", "-n", "99999999999999999999999"),
         "-n wants a whole number"},
        {ARGS("keygen", "uuid4", "-n"), "-n needs a value"},
        {ARGS("keygen", "uuid4", "--frobnicate"),
         "unknown option '--frobnicate'"},
        {ARGS("keygen", "uuid4", "-q"), "unknown option '-q'"},
        {ARGS("keygen", "snowflake", "--nodes", "3"), "did you mean --node?"},
        {ARGS("keygen", "bizkey", "--hash-lne", "8"),
         "did you mean --hash-len?"},
        {ARGS("keygen", "snowflake", "--node", "1024"), "--node wants"},
        {ARGS("keygen", "snowflake", "--node", "x"), "--node wants"},
        {ARGS("keygen", "snowflake", "--node"), "--node needs a value"},
        {ARGS("keygen", "snowflake", "--epoch", "2024-01-01T00:00:00"),
         "no time zone"},
        {ARGS("keygen", "snowflake", "--epoch", "2024-02-30"), "--epoch wants"},
        {ARGS("keygen", "snowflake", "--epoch", "yesterday"), "--epoch wants"},
        {ARGS("keygen", "snowflake", "--max-wait", "-1"), "--max-wait wants"},
        {ARGS("keygen", "uuid4", "--node", "3"),
         "--node applies to snowflake only"},
        {ARGS("keygen", "uuid7", "--state-file", "/tmp/x"),
         "--state-file applies to snowflake only"},
        {ARGS("keygen", "uuid4", "--payload", "x"), "take no payload"},
        {ARGS("keygen", "snowflake", "--prefix", "a"),
         "--prefix applies to bizkey only"},
        {ARGS("keygen", "bizkey", "--prefix", "a", "--id", "b"),
         "needs a payload"},
        {ARGS("keygen", "bizkey", "--id", "b", "--payload", "x"),
         "needs --prefix and --id"},
        {ARGS("keygen", "bizkey", "--prefix", "a", "--id", "b", "--payload",
              "x", "--payload-file", "/etc/hostname"),
         "give one payload"},
        {ARGS("keygen", "bizkey", "--prefix", "a", "--id", "b", "--payload",
              "x", "-n", "5"),
         "-n does not apply to bizkey"},
        {ARGS("keygen", "bizkey", "--prefix", "a:b", "--id", "b", "--payload",
              "x"),
         "character ':' at offset 1"},
        {ARGS("keygen", "bizkey", "--prefix", "a", "--id", "b c", "--payload",
              "x"),
         "byte 0x20 at offset 1"},
        {ARGS("keygen", "bizkey", "--prefix", "a", "--id", "b", "--payload",
              "x", "--hash-len", "7"),
         "--hash-len wants a whole number from 8 to 64"},
        {ARGS("keygen", "bizkey", "--prefix", "a", "--id", "b", "--payload",
              "x", "--hash-len", "65"),
         "--hash-len wants a whole number from 8 to 64"},
        {ARGS("keygen", "--decode", "1", "-n", "3"),
         "--decode takes only a key"},
        {ARGS("keygen", "fingerprint", "--decode", "abc"), "cannot be decoded"},
        {ARGS("bench", "--kyes", "ordered"), "did you mean --keys?"},
        {ARGS("bench", "--workload", "claims"),
         "--workload is one of claim|claim-complete|replay|seed, not 'claims'"},
        {ARGS("bench", "-n", "0"), "-n wants a whole number from 1"},
        {ARGS("bench", "extra"), "unexpected argument 'extra'"},
        {ARGS("get", "KEY", "--jsn"), "did you mean --json?"},
        {ARGS("get", "KEY", "--store"), "--store needs a value"},
        {ARGS("frobnicate"), "unknown command 'frobnicate'"},
        {ARGS("--frobnicate"), "is not a command"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct run r = run(cases[i].argv);
        cr_assert_eq(r.status, 2, "case %zu (%s): status %d, err %s", i,
                     cases[i].says, r.status, r.err);
        cr_assert_str_eq(r.out, "", "case %zu printed on stdout", i);
        cr_assert(strstr(r.err, cases[i].says), "case %zu: want '%s' in: %s", i,
                  cases[i].says, r.err);
        run_free(&r);
    }
    struct run r = run((const char *const[]){"idem", NULL});
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "usage: idem"));
    run_free(&r);
}

Test(keygen_cli, help_and_version, .timeout = 30)
{
    struct run r = run(ARGS("keygen", "--help"));
    cr_assert_eq(r.status, 0);
    const char *must[] = {"uuid4",       "uuid7",          "snowflake",
                          "bizkey",      "--state-file",   "--hmac-key-file",
                          "EXIT STATUS", "COLLISION ODDS", "EXAMPLES",
                          "5.4e-20"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        cr_assert(strstr(r.out, must[i]), "help lacks %s", must[i]);
    run_free(&r);
    r = run(ARGS("help", "keygen"));
    cr_assert_eq(r.status, 0);
    cr_assert(strstr(r.out, "COLLISION ODDS"));
    run_free(&r);
    r = run(ARGS("--help"));
    cr_assert_eq(r.status, 0);
    cr_assert(strstr(r.out, "keygen"));
    run_free(&r);
    r = run(ARGS("--version"));
    cr_assert_eq(r.status, 0);
    char want[64];
    snprintf(want, sizeof want, "idem %s\n", IDEM_VERSION_STRING);
    cr_assert_str_eq(r.out, want);
    run_free(&r);
}

/* The largest ID in r's lines. */
static uint64_t max_id(struct run *r, size_t *count)
{
    char *v[4096];
    size_t n = lines(r, v, 4096);
    uint64_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t id;
        cr_assert_eq(idem_snowflake_parse(v[i], strlen(v[i]), &id), 0);
        if (id > m)
            m = id;
    }
    if (count)
        *count = n;
    return m;
}

/* The high-water file across a restart whose clock was set back, with
 * faketime(1) moving the wall clock of the second process. */
Test(keygen_cli, snowflake_state_file_across_restart, .timeout = 60)
{
    if (access("/usr/bin/faketime", X_OK) != 0)
        cr_assert_fail("faketime is not installed: apt-get install faketime");
    /* An ASan-built CLI must tolerate libfaketime preloaded before it. */
    setenv("ASAN_OPTIONS", "verify_asan_link_order=0", 1);
    char dir[] = "/tmp/idem-sfcli-XXXXXX";
    cr_assert(mkdtemp(dir));
    char state[128];
    snprintf(state, sizeof state, "%s/node.state", dir);

    struct run r =
        run(ARGS("keygen", "snowflake", "--state-file", state, "-n", "2000"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    size_t n;
    uint64_t first_max = max_id(&r, &n);
    cr_assert_eq(n, 2000u);
    run_free(&r);

    const char *back10[] = {"faketime", "-f", "-10", NULL};
    /* 10 s behind the mark: refused, nothing printed. */
    r = run_full(back10, ARGS("keygen", "snowflake", "--state-file", state),
                 NULL);
    cr_assert_eq(r.status, 1, "status %d: %s", r.status, r.err);
    cr_assert_str_eq(r.out, "");
    cr_assert(strstr(r.err, "behind"), "%s", r.err);
    cr_assert(strstr(r.err, "state file"), "%s", r.err);
    run_free(&r);

    /* The same clock without the file would reissue old times: the
     * danger the file exists for (and proof that faketime took hold). */
    r = run_full(back10, ARGS("keygen", "snowflake", "-n", "10"), NULL);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_lt(max_id(&r, NULL), first_max);
    run_free(&r);

    /* 0.3 s behind, within --max-wait: waited out, every ID newer. */
    const char *back03[] = {"faketime", "-f", "-0.3", NULL};
    r = run_full(back03,
                 ARGS("keygen", "snowflake", "--state-file", state, "-n", "100",
                      "--max-wait", "5000"),
                 NULL);
    cr_assert_eq(r.status, 0, "%s", r.err);
    char *v[200];
    size_t k = lines(&r, v, 200);
    cr_assert_eq(k, 100u);
    for (size_t i = 0; i < k; i++) {
        uint64_t id;
        cr_assert_eq(idem_snowflake_parse(v[i], strlen(v[i]), &id), 0);
        cr_assert_gt(id, first_max, "repeated time after restart");
    }
    run_free(&r);
    unlink(state);
    rmdir(dir);
}
