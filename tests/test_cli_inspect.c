/* tests/test_cli_inspect.c - get, forget, stats, sweep, check, repair,
 * dump and load end to end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static char *dir;

static const char *at(const char *name)
{
    static char buf[4][4200];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", dir, name);
    return buf[i];
}

/* A store with done a, b (one not UTF-8), failed f and pending p. */
static void setup(void)
{
    dir = t_tmpdir();
    idem_store *s;  /* the real clock: the CLI will read these records */
    cr_assert_eq(idem_open(t_local_uri(at("store")), NULL, &s), 0);
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

static void teardown(void)
{
    t_rmdir(dir);
    free(dir);
}

TestSuite(cli_inspect, .init = setup, .fini = teardown);

Test(cli_inspect, get_and_forget)
{
    cr_assert_eq(t_cli(dir, "get a > out"), 0);
    cr_assert(t_grep(at("out"), "state      done"));
    cr_assert(t_grep(at("out"), "response   {\"ok\":1}"));
    cr_assert_eq(t_cli(dir, "get --json f > out"), 0);
    cr_assert(t_grep(at("out"), "\"state\":\"failed\",\"token\":"));
    cr_assert(t_grep(at("out"), ",\"attempts\":1,\"created_ms\":"));
    cr_assert(t_grep(at("out"), "\"response\":\"bad\"}"));
    cr_assert_eq(t_cli(dir, "get p > out"), 0);
    cr_assert(t_grep(at("out"), "state      pending"));
    cr_assert(t_grep(at("out"), "attempts   1\n"));
    cr_assert(t_grep(at("out"), "lease"));
    cr_assert_eq(t_cli(dir, "forget a"), 0);
    cr_assert_eq(t_cli(dir, "get a 2> err"), 1);
    cr_assert(t_grep(at("err"), "no live record for key 'a'"));
    cr_assert_eq(t_cli(dir, "forget a 2> err"), 1);
    cr_assert_eq(t_cli(dir, "get a b 2> err"), 2);
    cr_assert(t_grep(at("err"), "one key at a time"));
    cr_assert_eq(t_cli(dir, "get x --store local:absent 2> err"), 1);
    cr_assert(t_grep(at("err"), "no store there yet"));
}

Test(cli_inspect, stats_and_sweep)
{
    cr_assert_eq(t_cli(dir, "stats > out"), 0);
    cr_assert(t_grep(at("out"), "1 pending, 2 done, 1 failed"));
    cr_assert(t_grep(at("out"), "RAM (index)"));
    cr_assert_eq(t_cli(dir, "stats --json > out"), 0);
    cr_assert(t_grep(at("out"), "\"pending\":1,\"done\":2,\"failed\":1,"));
    cr_assert_eq(t_cli(dir, "sweep > out"), 0);
    cr_assert(t_grep(at("out"), "removed 0 expired records"));
    cr_assert_eq(t_cli(dir, "stats --bogus 2> err"), 2);
}

Test(cli_inspect, dump_and_load_keep_every_byte)
{
    cr_assert_eq(t_cli(dir, "dump --output d 2> err"), 0);
    cr_assert(t_grep(at("err"), "4 records"));
    cr_assert(t_grep(at("d"), "\"key_base64\":\"Yv8=\""));
    cr_assert(t_grep(at("d"), "\"response_base64\":\"Af4=\""));
    cr_assert(t_grep(at("d"), "\"state\":\"pending\""));
    cr_assert_eq(t_cli(dir, "load --store local:copy d 2> err"), 0);
    cr_assert(t_grep(at("err"), "4 records loaded"));
    cr_assert_eq(t_cli(dir, "dump --store local:copy > d2"), 0);
    cr_assert_eq(t_sh("cd '%s' && sort d > s1 && sort d2 > s2 && cmp s1 s2",
                      dir), 0);
    /* a key the target has keeps its record unless --replace */
    cr_assert_eq(t_cli(dir, "forget a --store local:copy"), 0);
    t_sh("cd '%s' && grep '\"key\":\"a\"' d | sed 's/:1}/:2}/' > one", dir);
    cr_assert_eq(t_cli(dir, "load one 2> err"), 0);
    cr_assert(t_grep(at("err"), "1 kept"));
    cr_assert_eq(t_cli(dir, "load --replace one 2> err"), 0, "%s",
                 t_read(at("err"), NULL));
    cr_assert_eq(t_cli(dir, "get a > out"), 0);
    cr_assert(t_grep(at("out"), "{\"ok\":2}"));
    t_sh("printf '{\"key\":\"z\",\"state\":\"done\",\"token\":1,"
         "\"created_ms\":1,\"expires_ms\":99999999999999}\\nnope\\n' > '%s'",
         at("bad"));
    cr_assert_eq(t_cli(dir, "load bad 2> err"), 1);
    cr_assert(t_grep(at("err"), "bad:2: not a JSON object"));
    cr_assert_eq(t_cli(dir, "get --json z > out"), 0,
                 "lines before the bad one are committed");
    cr_assert(t_grep(at("out"), "\"token\":1,\"attempts\":1,"),
              "a dump without attempts: its token counted the claims");
}

Test(cli_inspect, check_and_repair)
{
    cr_assert_eq(t_cli(dir, "check > out"), 0);
    cr_assert(t_grep(at("out"), "no damage"));
    /* flip a byte inside the first record */
    t_sh("cd '%s/store' && printf 'X' | dd of=seg-00000001.log bs=1 "
         "seek=100 conv=notrunc 2>/dev/null", dir);
    cr_assert_eq(t_cli(dir, "check > out"), 1);
    cr_assert(t_grep(at("out"), "damaged"));
    cr_assert(t_grep(at("out"), "idem repair --store"));
    cr_assert_eq(t_cli(dir, "repair > out"), 0);
    cr_assert(t_grep(at("out"), "bytes lost"));
    cr_assert_eq(t_cli(dir, "check > out"), 0);
    cr_assert_eq(t_cli(dir, "get f > /dev/null"), 0, "the rest survived");
}

Test(cli_inspect, expired_records_are_gone)
{
    t_sh("printf '{\"id\":1}\\n{\"id\":2}\\n' > '%s'", at("in"));
    cr_assert_eq(t_cli(dir, "dedup --key id --ttl 100ms --quiet "
                            "--store local:short in > /dev/null"), 0);
    t_sh("sleep 0.3");
    /* opening the store leaves expired records out of memory already */
    cr_assert_eq(t_cli(dir, "stats --store local:short > out"), 0);
    cr_assert(t_grep(at("out"), "index entries  0"));
    cr_assert_eq(t_cli(dir, "sweep --store local:short > out"), 0);
    cr_assert(t_grep(at("out"), "removed 0 expired records; segments 1 -> "
                                "1"), "%s", t_read(at("out"), NULL));
    cr_assert_eq(t_cli(dir, "get 1 --store local:short 2> /dev/null"), 1);
}
