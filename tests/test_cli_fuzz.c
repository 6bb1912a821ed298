/* tests/test_cli_fuzz.c - garbage through the CLI's parsers.
 *
 * Mutated JSON lines (flipped, inserted and deleted bytes, cut lines, NUL
 * and invalid UTF-8) go through `idem dedup` with the skip policies, and
 * mutated dump lines through `idem load`, and mutated answers from a
 * handler through `idem run`. Whatever the bytes, the commands
 * must neither crash nor hang (the ASan run checks memory too); dedup
 * must exit 0 and print only lines it was given, and load must stop at
 * a bad line with exit status 1 or load it. The seed is printed so a
 * failure can be replayed (IDEM_FUZZ_SEED). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"

static const char *const seeds[] = {
    "{\"id\":\"a\\\"b\",\"user\":{\"id\":12,\"tags\":[1,2.5e3,true,null]}}",
    "{\"id\":\"\\u00fc\\ud83d\\ude00\",\"n\":-0.5,\"x\":{}}",
    "{\"note\":\"\\\"id\\\": 1\",\"id\":[{\"id\":\"deep\"}],\"id\":\"k\"}",
    "{\"key\":\"k1\",\"state\":\"done\",\"token\":1,\"created_ms\":1,"
    "\"expires_ms\":99999999999999,\"response_base64\":\"Af4=\"}",
    "{\"key_base64\":\"Yv8=\",\"state\":\"pending\",\"token\":3,\"created_ms\""
    ":1,\"expires_ms\":99999999999999,\"lease_until_ms\":5,\"released\":true,"
    "\"fingerprint\":\"000102030405060708090a0b0c0d0e0f\"}",
};

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

/* One mutation of a seed line, without newlines, into out. */
static size_t mutate(unsigned *s, char *out, size_t cap)
{
    const char *src = seeds[rnd(s) % (sizeof seeds / sizeof seeds[0])];
    size_t n = strlen(src);
    memcpy(out, src, n);
    static const char junk[] = "{}[]\",:\\0ue-.\xff\xc3\x80 \t\r";
    for (int k = 1 + (int)(rnd(s) % 4); k > 0 && n + 2 < cap; k--) {
        size_t at = rnd(s) % (n + 1);
        switch (rnd(s) % 4) {
        case 0: if (at < n) out[at] = junk[rnd(s) % (sizeof junk - 1)];
            break;
        case 1:
            memmove(out + at + 1, out + at, n - at);
            out[at] = junk[rnd(s) % (sizeof junk - 1)];
            n++;
            break;
        case 2: if (at < n) { memmove(out + at, out + at + 1, n - at - 1);
                n--; }
            break;
        default: n = at; break;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (out[i] == '\n')
            out[i] = ' ';
    return n;
}

Test(cli_fuzz, parsers_survive_garbage, .timeout = 600)
{
    char *dir = t_tmpdir();
    const char *e = getenv("IDEM_FUZZ_SEED");
    unsigned seed = e ? (unsigned)strtoul(e, NULL, 10) : (unsigned)time(NULL);
    unsigned s = seed;
    cr_log_info("fuzz seed %u", seed);
    char path[4200], line[512];
    snprintf(path, sizeof path, "%s/in", dir);
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 3000; i++) {
        size_t n = mutate(&s, line, sizeof line);
        fwrite(line, 1, n, f);
        fputc('\n', f);
    }
    fclose(f);
    cr_assert_eq(t_cli(dir, "dedup --key id --on-bad-input skip "
                            "--on-missing-key skip --quiet --store mem: in "
                            "> out"), 0, "seed %u", seed);
    cr_assert_eq(t_cli(dir, "dedup --key /user/id --on-bad-input skip "
                            "--on-missing-key pass --quiet --store mem: in "
                            "> out2"), 0, "seed %u", seed);
    cr_assert_eq(t_sh("cd '%s' && sort -u in > all && sort -u out > got && "
                      "comm -13 all got | grep -q . && exit 1; exit 0", dir),
                 0, "dedup printed a line it was not given (seed %u)", seed);
    for (int i = 0; i < 40; i++) {
        size_t n = mutate(&s, line, sizeof line);
        snprintf(path, sizeof path, "%s/rec", dir);
        t_write(path, line, n);
        int rc = t_cli(dir, "load --store local:st rec 2> /dev/null");
        cr_assert(rc == 0 || rc == 1, "load exited %d on %.*s (seed %u)", rc,
                  (int)n, line, seed);
    }
    /* garbage answers from a handler that ignores its input */
    for (int i = 0; i < 10; i++) {
        snprintf(path, sizeof path, "%s/answers", dir);
        f = fopen(path, "wb");
        for (int k = 0; k < 50; k++) {
            size_t n = mutate(&s, line, sizeof line);
            fwrite(line, 1, n, f);
            fputc('\n', f);
        }
        fclose(f);
        int rc = t_cli(dir, "run --key id --on-bad-input skip "
                            "--on-missing-key skip --store mem: --lease 5s "
                            "--exec 'cat answers' in > /dev/null "
                            "2> /dev/null");
        cr_assert(rc == 0 || rc == 1, "run exited %d (seed %u)", rc, seed);
    }
    t_rmdir(dir);
    free(dir);
}
