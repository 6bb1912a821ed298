/* tests/test_cli_operators.c - what an operator meets: reset of a job,
 * get --base64, messages that say what happened (a hung server, bad
 * JSON, a lost IDEM file, a repaired header, a released claim) and the
 * exit status rule (2 for every usage error, 3 for messages not done). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common.h"
#include "redis_harness.h"

static void setup(void)
{
    t_dir_init();
    t_sh("printf '{\"id\":1}\\n{\"id\":2}\\n' > '%s'", t_at("in"));
}

TestSuite(cli_operators, .init = setup, .fini = t_dir_fini, .timeout = 120);

static void has(const char *file, const char *text)
{
    char *got = t_read(t_at(file), NULL);
    cr_assert(strstr(got, text), "%s has no '%s':\n%s", file, text, got);
    free(got);
}

/* ------------------------------------------------------------------------
 * Exit status: 2 for every usage error */

Test(cli_operators, negative_counts_and_bad_stores_are_usage_errors)
{
    static const char *const bad[] = {
        "bench --store mem: -n -5",  "bench --store mem: -n ' -5'",
        "bench --store mem: --batch -1", "bench --store mem: -n 0",
        "bench --store mem: --value-size -16", "bench --keys sideways",
        "dedup --key id --batch -5 in", "run --key id --exec cat "
        "--max-attempts -1 in", "get ''", "get --store nosuch:x a",
        "stats --store 'redis://h:notaport'", "dump --store nosuch:",
        "dedup --key id --store nosuch: in", "reset",
        "reset --job a --output b", "get --base64 '!!'"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(t_cli(t_dir, "%s > out 2> err", bad[i]), 2, "%s: %s",
                     bad[i], t_read(t_at("err"), NULL));
    cr_assert_eq(t_cli(t_dir, "bench --store mem: -n -5 2> err"), 2);
    has("err", "-n wants a whole number from 1 to");
    cr_assert_eq(t_cli(t_dir, "bench --store mem: -n 10 --batch 3 > out"), 0);
    has("out", "n=10 batch=3");
}

/* ------------------------------------------------------------------------
 * reset */

static void reset_on(const char *uri)
{
    cr_assert_eq(t_cli(t_dir, "dedup --store '%s' --quiet --key id --job j "
                       "--output o in", uri), 0);
    cr_assert_eq(t_cli(t_dir, "reset --store '%s' --job j > out", uri), 0);
    has("out", "dropped checkpoint 'dedup:j': it was after line 2 of "
               "input 1, with 18 bytes of output committed");
    cr_assert_eq(t_cli(t_dir, "reset --store '%s' --job j 2> err", uri), 1,
                 "nothing left to drop");
    has("err", "no job 'j' in this store");
    cr_assert_eq(t_cli(t_dir, "reset --store '%s' --job nosuch 2> err", uri),
                 1);
    has("err", "no job 'nosuch' in this store: no checkpoint dedup:nosuch "
               "or run:nosuch");
    /* Without its checkpoint the output is not the job's any more, and
     * the keys stay: a rerun over it reads from the start, all dups. */
    cr_assert_eq(t_cli(t_dir, "dedup --store '%s' --key id --job j --output "
                       "o in 2> err", uri), 1);
    has("err", "no checkpoint of this store names it");
    cr_assert_eq(t_cli(t_dir, "dedup --store '%s' --key id --job j --output "
                       "o --overwrite --stats-json in 2> err", uri), 0);
    has("err", "\"read\":2,\"new\":0,\"duplicate\":2,");
}

/* Every command that takes --store names its default in --help as the
 * library defines it, IDEM_DEFAULT_URI, never a copy spelled by hand. */
Test(cli_operators, every_help_names_the_default_store)
{
    static const char *const cmds[] = {"dedup", "get", "forget", "stats",
                                       "sweep", "check", "repair", "dump",
                                       "load", "reset"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        cr_assert_eq(t_cli(t_dir, "%s --help > out", cmds[i]), 0, "%s",
                     cmds[i]);
        has("out", "$IDEM_STORE");
        has("out", IDEM_DEFAULT_URI);
    }
}

Test(cli_operators, reset_drops_a_local_jobs_checkpoint)
{
    char uri[4300];
    snprintf(uri, sizeof uri, "local:%s", t_at("store"));
    reset_on(uri);
    /* a job named by its output */
    cr_assert_eq(t_cli(t_dir, "dedup --quiet --key id --output p in"), 0);
    cr_assert_eq(t_cli(t_dir, "reset --output p > out"), 0);
    has("out", "dropped checkpoint 'dedup:/");
}

Test(cli_operators, reset_drops_a_redis_jobs_checkpoint)
{
    char uri[300];
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s", th_redis_addr(),
             th_prefix());
    reset_on(uri);
}

/* ------------------------------------------------------------------------
 * get */

Test(cli_operators, get_base64_and_a_released_claim)
{
    idem_store *s;
    cr_assert_eq(idem_open(t_local_uri(t_at("store")), NULL, &s), 0);
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &(idem_key){"b\0\xff", 3, NULL}, NULL, &o), 0);
    cr_assert_eq(idem_complete(s, "b\0\xff", 3, o.token, "\x01\xfe", 2, 0),
                 0);
    cr_assert_eq(idem_claim(s, &(idem_key){"r", 1, NULL}, NULL, &o), 0);
    cr_assert_eq(idem_fail(s, "r", 1, o.token, "again", 5, IDEM_RETRYABLE),
                 0);
    cr_assert_eq(idem_close(s), 0);
    cr_assert_eq(t_cli(t_dir, "get --base64 YgD/ > out"), 0);
    has("out", "key        YgD/\n");
    has("out", "response   Af4=\n");
    cr_assert_eq(t_cli(t_dir, "get r > out"), 0);
    has("out", "pending (released for a retry)");
    char *got = t_read(t_at("out"), NULL);
    cr_assert(!strstr(got, "\nlease "), "a released claim has none:\n%s", got);
    free(got);
}

/* ------------------------------------------------------------------------
 * Messages */

Test(cli_operators, a_hung_server_says_how_long_it_was_given)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
              !listen(fd, 8) &&
              !getsockname(fd, (struct sockaddr *)&a, &len));
    /* The kernel accepts the connection; nobody ever answers. */
    cr_assert_eq(t_cli(t_dir, "stats --store 'redis://127.0.0.1:%d"
                       "?timeout_ms=300' 2> err", ntohs(a.sin_port)), 1);
    has("err", "no answer within 300 ms");
    char *got = t_read(t_at("err"), NULL);
    cr_assert(!strstr(got, "temporarily unavailable"), "%s", got);
    free(got);
    close(fd);
}

Test(cli_operators, load_names_file_line_and_column_on_one_line)
{
    t_sh("printf '{\"key\":\"a\",\"state\":\"done\"' > '%s'", t_at("bad"));
    cr_assert_eq(t_cli(t_dir, "load bad 2> err"), 1);
    char *got = t_read(t_at("err"), NULL);
    cr_assert(!strcmp(got, "idem load: bad:1:26: not a JSON object: parse "
                           "error: premature EOF\n"), "%s", got);
    free(got);
}

Test(cli_operators, a_lost_idem_file_is_damage_everywhere)
{
    cr_assert_eq(t_cli(t_dir, "dedup --quiet --key id in > /dev/null"), 0);
    t_sh("rm '%s'", t_at("store/IDEM"));
    cr_assert_eq(t_cli(t_dir, "check > out"), 1);
    has("out", "IDEM is missing");
    cr_assert_eq(t_cli(t_dir, "stats 2> err"), 1);
    has("err", "IDEM is missing");
    has("err", "idem repair");
    cr_assert_eq(t_cli(t_dir, "dedup --key id in 2> err"), 1,
                 "no writer takes it as a new store either");
    cr_assert_eq(t_cli(t_dir, "repair > out"), 0);
    has("out", "1 damaged regions");
    has("out", "IDEM is missing");
    cr_assert_eq(t_cli(t_dir, "check > out"), 0);
    has("out", "no damage");
    cr_assert_eq(t_cli(t_dir, "stats > out"), 0);
    has("out", "2 done");
}

Test(cli_operators, stats_after_a_header_repair)
{
    cr_assert_eq(t_cli(t_dir, "dedup --quiet --key id in > /dev/null"), 0);
    t_sh("printf 'XXXX' | dd of='%s' bs=1 seek=4 conv=notrunc 2>/dev/null",
         t_at("store/seg-00000001.log"));
    cr_assert_eq(t_cli(t_dir, "repair > out"), 0);
    cr_assert_eq(t_cli(t_dir, "stats > out"), 0);
    has("out", "newest         unknown (header rewritten by repair)\n");
}
