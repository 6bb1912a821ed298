/* tests/test_cli_dedup.c - `idem dedup` end to end: the JSON corpus, every
 * option, the policies with their file:line:column messages, reruns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "redis_harness.h"

TestSuite(cli_dedup, .init = t_dir_init, .fini = t_dir_fini, .timeout = 180);

Test(cli_dedup, first_occurrences_byte_for_byte)
{
    t_put("in", "{\"id\": \"a\", \"v\": 1}\n{\"id\":\"b\"}\n"
                "{ \"v\": 2, \"id\" : \"a\" }\n{\"id\":\"c\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet in > out"), 0);
    t_expect("out",
             "{\"id\": \"a\", \"v\": 1}\n{\"id\":\"b\"}\n{\"id\":\"c\"}\n");
}

/* --from FILE stands for one input file (dedup and run alike): it is
 * read as one, not a stream (it crashed: the input named by --from was
 * dropped once --from was found to be no stream). */
Test(cli_dedup, from_a_file_is_an_input)
{
    t_put("in", "{\"id\":\"a\"}\n{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet --from in --to out"),
                 0);
    t_expect("out", "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
}

Test(cli_dedup, json_corpus)
{
    char *big = malloc(1600000);
    cr_assert(big);
    int n = snprintf(big, 64, "{\"pad\":\"");
    memset(big + n, 'x', 1500000);
    snprintf(big + n + 1500000, 64, "\",\"id\":\"big\"}\n");
    t_put("in",
          /* escapes: the same key written three ways */
          "{\"id\":\"a\\\"b\"}\n"
          "{\"id\":\"a\\u0022b\"}\n"
          "{\"\\u0069d\":\"a\\\"b\"}\n"
          /* unicode values, raw and escaped */
          "{\"id\":\"\xc3\xbc\"}\n"
          "{\"id\":\"\\u00fc\"}\n"
          /* decoys: the name inside a string, at another depth */
          "{\"note\":\"\\\"id\\\": \\\"x\\\"\",\"id\":\"y\"}\n"
          "{\"x\":{\"id\":\"deep\"},\"id\":\"top\"}\n"
          "{\"id\":\"x\"}\n"
          /* numbers as written */
          "{\"id\":12}\n{\"id\":12.0}\n{\"id\":12}\n"
          /* blank lines, CRLF */
          "\n   \n{\"id\":\"crlf\"}\r\n\r\n"
          /* last wins for a repeated member */
          "{\"id\":\"first\",\"id\":\"last\"}\n{\"id\":\"last\"}\n");
    FILE *f = fopen(t_at("in"), "ab");
    fputs(big, f);
    fputs("{\"id\":\"big\"}\n{\"id\":\"end\"}", f);  /* no final newline:
                                                      * left unread */
    fclose(f);
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet --stats-json in > out "
                              "2> err"), 0);
    size_t len;
    char *out = t_read(t_at("out"), &len);
    const char *want =
          "{\"id\":\"a\\\"b\"}\n"
          "{\"id\":\"\xc3\xbc\"}\n"
          "{\"note\":\"\\\"id\\\": \\\"x\\\"\",\"id\":\"y\"}\n"
          "{\"x\":{\"id\":\"deep\"},\"id\":\"top\"}\n"
          "{\"id\":\"x\"}\n"
          "{\"id\":12}\n{\"id\":12.0}\n"
          "{\"id\":\"crlf\"}\r\n"
          "{\"id\":\"first\",\"id\":\"last\"}\n";
    cr_assert(!strncmp(out, want, strlen(want)), "got\n%.400s", out);
    cr_assert(!strcmp(out + strlen(want), big), "the big line once");
    cr_assert_eq(len, strlen(want) + strlen(big));
    cr_assert(t_grep(t_at("err"), "\"new\":10,\"duplicate\":6"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "\"blank\":3"));
    free(out);
    free(big);
}

Test(cli_dedup, nested_paths_and_json_pointer)
{
    t_put("in", "{\"user\":{\"id\":1,\"a/b\":{\"c~d\":\"p\"}},"
                "\"items\":[{\"sku\":\"s1\"},{\"sku\":\"s2\"}]}\n"
                "{\"user\":{\"id\":\"1\"},\"items\":[{\"sku\":\"s2\"}]}\n"
                "{\"user\":{\"id\":2},"
                "\"items\":[{\"x\":1},{\"sku\":\"s1\"}]}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key user.id --quiet in > a"), 0);
    cr_assert_eq(t_sh("wc -l < '%s' | grep -qx 2", t_at("a")), 0,
                  "1 and \"1\" are one key");
    cr_assert_eq(t_cli(t_dir, "dedup --key /user/id --store mem: --quiet in "
                              "> b"), 0);
    cr_assert_eq(t_sh("cmp -s '%s' '%s'", t_at("a"), t_at("b")), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --key items.0.sku --store mem: "
                              "--on-missing-key skip --quiet in > c"), 0);
    cr_assert_eq(t_sh("wc -l < '%s' | grep -qx 2", t_at("c")), 0,
                  "s1 and s2; line 3 has no items.0.sku");
    cr_assert_eq(t_cli(t_dir, "dedup --key '/user/a~1b/c~0d' --store mem: "
                              "--on-missing-key skip --quiet in > d"), 0);
    cr_assert_eq(t_sh("wc -l < '%s' | grep -qx 1", t_at("d")), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --key 'user..id' in 2> e"), 2);
    cr_assert(t_grep(t_at("e"), "empty segment"));
}

Test(cli_dedup, unicode_key_names)
{
    t_put("in",
          "{\"ключ\":\"1\"}\n{\"ключ\":\"1\"}\n{\"ключ\":\"2\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key ключ --quiet in > out"), 0);
    t_expect("out", "{\"ключ\":\"1\"}\n{\"ключ\":\"2\"}\n");
}

Test(cli_dedup, bad_json_stops_with_file_line_column)
{
    t_put("in", "{\"id\":\"a\"}\n{\"id\": \"ü\", oops}\n{\"id\":\"b\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --output out in 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "in:2:13: invalid JSON"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "--on-bad-input skip"));
    t_expect("out", "{\"id\":\"a\"}\n");
    /* columns count characters, and a cut line points past its end */
    t_put("c", "{\"a\" 1}\n{\"a\":1\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --store mem: --on-bad-input "
                              "skip c 2> err"), 0);
    cr_assert(t_grep(t_at("err"), "c:1:6: invalid JSON: parse error"));
    cr_assert(t_grep(t_at("err"), "c:2:7: invalid JSON: parse error: "
                                  "premature EOF"));
    /* fixed input: the rerun resumes after line 1 */
    t_put("in", "{\"id\":\"a\"}\n{\"id\": \"c\"}\n{\"id\":\"b\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --output out in 2> err"), 0);
    cr_assert(t_grep(t_at("err"), "resuming"));
    t_expect("out", "{\"id\":\"a\"}\n{\"id\": \"c\"}\n{\"id\":\"b\"}\n");
}

Test(cli_dedup, bad_json_skip_counts)
{
    t_put("in", "{\"id\":\"a\"}\n[1,\n{\"id\":\"a\"} {}\n\"str\"\n"
                "{\"id\":\"b\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --on-bad-input skip "
                              "--on-missing-key skip --stats-json in > out "
                              "2> err"), 0);
    t_expect("out", "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    cr_assert(t_grep(t_at("err"), "\"skipped\":3"), "%s",
              t_read(t_at("err"), NULL));
}

Test(cli_dedup, missing_key_policies)
{
    t_put("in", "{\"id\":\"a\"}\n{\"other\":1}\n{\"id\":{\"x\":1}}\n"
                "{\"id\":\"\"}\n{\"id\":\"b\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id in > out 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "in:2:1: no key field 'id'"));
    t_expect("out", "{\"id\":\"a\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --store mem: --on-missing-key "
                              "pass in > out 2> err"), 0);
    t_expect("out", "{\"id\":\"a\"}\n{\"other\":1}\n{\"id\":{\"x\":1}}\n"
                    "{\"id\":\"\"}\n{\"id\":\"b\"}\n");
    cr_assert(t_grep(t_at("err"), "is an object, not a string or number"));
    cr_assert(t_grep(t_at("err"), "the key is 0 bytes"));
    cr_assert(t_grep(t_at("err"), "3 passed through"));
    cr_assert_eq(t_cli(t_dir, "dedup --key id --store mem: --on-missing-key "
                              "skip --quiet in > out 2> err"), 0);
    t_expect("out", "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    t_expect("err", "");
}

Test(cli_dedup, line_mode_and_stdin)
{
    t_put("in", "x\ny\r\nx\r\nnot json {\n");
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet < in > out"), 0);
    t_expect("out", "x\ny\r\nnot json {\n");
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet - < in > out"), 0);
    t_expect("out", "");
}

Test(cli_dedup, persistent_store_and_ttl)
{
    t_put("a", "{\"id\":1}\n{\"id\":2}\n");
    t_put("b", "{\"id\":2}\n{\"id\":3}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet a > out"), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet b > out"), 0);
    t_expect("out", "{\"id\":3}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet --ttl 100ms "
                              "--store local:short a > out"), 0);
    t_sh("sleep 0.3");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet --store local:short a "
                              "> out"), 0);
    t_expect("out", "{\"id\":1}\n{\"id\":2}\n");
}

Test(cli_dedup, output_jobs_and_reruns)
{
    t_put("a", "{\"id\":1}\n{\"id\":2}\n{\"id\":1}\n");
    t_put("b", "{\"id\":2}\n{\"id\":3}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet --output o1 a"), 0);
    t_expect("o1", "{\"id\":1}\n{\"id\":2}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --output o1 a 2> err"), 0,
                 "a finished run repeated adds nothing and exits 0");
    t_expect("o1", "{\"id\":1}\n{\"id\":2}\n");
    cr_assert(t_grep(t_at("err"), "0 new"));
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet --output o1 b"), 0);
    t_expect("o1", "{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n");
    /* a job named apart keeps its own output and checkpoint */
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet --store local:s2 "
                              "--job j --output o2 a b"), 0);
    t_expect("o2", "{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n");
    /* an output file that lost committed bytes is refused */
    t_put("o1", "");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --output o1 a 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "changed or replaced"));
    /* a longer output is cut back to the committed length */
    t_put("o2", "{\"id\":1}\n{\"id\":2}\n{\"id\":3}\ngarbage\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet --store local:s2 "
                              "--job j --output o2 a b"), 0);
    t_expect("o2", "{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n");
}

Test(cli_dedup, small_batches_and_many_inputs)
{
    FILE *f = fopen(t_at("a"), "w");
    for (int i = 0; i < 5000; i++)
        fprintf(f, "{\"id\":%d}\n", i % 3000);
    fclose(f);
    t_put("b", "{\"id\":4000}\n{\"id\":1}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --batch 7 --quiet --output o a "
                              "b"), 0);
    cr_assert_eq(t_sh("wc -l < '%s' | grep -qx 3001", t_at("o")), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --key id --batch 0 a 2> err"), 2);
    cr_assert(t_grep(t_at("err"), "--batch wants a whole number"));
}

Test(cli_dedup, usage_errors_say_what_to_type)
{
    struct {
        const char *args, *says;
    } cases[] = {
        {"dedup --keys id", "did you mean --key?"},
        {"dedup", "--key FIELD"},
        {"dedup --key id --line", "exclude each other"},
        {"dedup --key id --ttl 3y", "30s, 5m, 24h or 7d"},
        {"dedup --key id --on-missing-key drop", "error|skip|pass"},
        {"dedup --key id --on-bad-input pass", "error|skip"},
        {"dedup --key", "needs a value"},
        {"dedup --key id --store nope:x", "unknown store URI"},
        {"nosuch", "unknown command"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = t_cli(t_dir, "%s < /dev/null > out 2> err", cases[i].args);
        cr_assert_eq(rc, 2, "%s: %d", cases[i].args, rc);
        cr_assert(t_grep(t_at("err"), cases[i].says), "%s: %s", cases[i].args,
                  t_read(t_at("err"), NULL));
    }
    cr_assert_eq(t_cli(t_dir, "dedup --help > out"), 0);
    cr_assert(t_grep(t_at("out"), "--on-missing-key"));
    cr_assert_eq(t_cli(t_dir, "--help > out"), 0);
    cr_assert(t_grep(t_at("out"), "dedup"));
}

Test(cli_dedup, second_process_gets_a_clear_lock_error)
{
    t_sh("mkfifo '%s'", t_at("fifo"));
    t_sh("cd '%s' && (\"$IDEM_CLI\" dedup --line --store local:held "
         "--quiet < fifo > /dev/null &) && exec 3> fifo && "
         "while [ ! -s held/LOCK ]; do sleep 0.01; done && "
         "\"$IDEM_CLI\" forget x --store local:held 2> err; "
         "echo $? > rc; exec 3>&-", t_dir);
    t_expect("rc", "1\n");
    cr_assert(t_grep(t_at("err"), "in use by another process (pid"),
              "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "give this one its own --store"));
}

/* On Redis the output is kept by checkpoint as on a local store: no
 * notice, and a second run with other inputs appends its new keys. */
Test(cli_dedup, on_a_redis_store_the_output_is_checkpointed)
{
    char uri[2048];
    snprintf(uri, sizeof uri, "redis://%s?prefix=%s", th_redis_addr(),
             th_prefix());
    t_put("a", "{\"id\":1}\n{\"id\":2}\n");
    t_put("b", "{\"id\":2}\n{\"id\":3}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --store '%s' --output o "
                              "a 2> err", uri), 0);
    cr_assert(!t_grep(t_at("err"), "keeps no checkpoints"));
    cr_assert_eq(t_cli(t_dir, "dedup --key id --store '%s' --output o "
                              "b 2> err", uri), 0);
    t_expect("o", "{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n");
    /* The same command again: resumed at its checkpoint, nothing new. */
    cr_assert_eq(t_cli(t_dir, "dedup --key id --store '%s' --output o "
                              "b 2> err", uri), 0);
    t_expect("o", "{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n");
    th_shared_stop();
}

Test(cli_dedup, jobs_keep_their_keys_apart)
{
    t_put("e", "{\"event_id\":\"42\"}\n");
    t_put("o", "{\"order_id\":\"42\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --job events --key event_id --quiet e "
                              "> out"), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --job orders --key order_id --quiet o "
                              "> out"), 0);
    t_expect("out", "{\"order_id\":\"42\"}\n");
    /* each job's key is its own, and shows as such */
    cr_assert_eq(t_cli(t_dir, "get --job events 42 > out"), 0);
    cr_assert(t_grep(t_at("out"), "key space  events\nkey        42\n"));
    cr_assert_eq(t_cli(t_dir, "get 42 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "in the shared key space"));
    cr_assert_eq(t_cli(t_dir, "dump > out"), 0);
    cr_assert(t_grep(t_at("out"), "{\"key\":\"42\",\"key_space\":\"events\","));
    cr_assert(t_grep(t_at("out"), "{\"key\":\"42\",\"key_space\":\"orders\","));
    cr_assert_eq(t_cli(t_dir, "stats --key-spaces > st"), 0);
    cr_assert(t_grep(t_at("st"), "key space      events: 1 keys\n"
                                  "key space      orders: 1 keys\n"));
    cr_assert_eq(t_cli(t_dir, "stats --key-spaces --json > st"), 0);
    cr_assert(t_grep(t_at("st"), ",\"key_spaces\":{\"events\":1,"
                                  "\"orders\":1}}\n"));
    /* dump | load keeps them apart */
    cr_assert_eq(t_cli(t_dir, "load --store local:copy out 2> err"), 0);
    cr_assert_eq(t_cli(t_dir, "get --key-space orders --store local:copy 42 "
                              "> out"), 0);
    cr_assert_eq(t_cli(t_dir, "forget --job events 42"), 0);
    cr_assert_eq(t_cli(t_dir, "get --job orders 42 > out"), 0);
    t_put("e2", "{\"event_id\":\"42\"}\n");  /* the job resumes after e */
    cr_assert_eq(t_cli(t_dir, "dedup --job events --key event_id --quiet e2 "
                              "> out"), 0);
    t_expect("out", "{\"event_id\":\"42\"}\n");
}

Test(cli_dedup, jobs_that_mean_to_share_keys_say_so)
{
    t_put("e", "{\"event_id\":\"42\"}\n");
    t_put("o", "{\"order_id\":\"42\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --job a --key-space common --key "
                              "event_id --quiet e > out"), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --job b --key-space common --key "
                              "order_id --quiet o > out"), 0);
    t_expect("out", "");
    /* the shared key space holds the library's keys */
    idem_store *s;
    char uri[4300];
    snprintf(uri, sizeof uri, "local:%s", t_at("store"));
    cr_assert_eq(idem_open(uri, NULL, &s), 0);
    idem_outcome oc;
    cr_assert_eq(idem_claim(s, &(idem_key){"42", 2, NULL}, NULL, &oc), 0);
    cr_assert_eq(idem_complete(s, "42", 2, oc.token, "", 0, 0), 0);
    cr_assert_eq(idem_close(s), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --shared-keys --key event_id --quiet e "
                              "> out"), 0);
    t_expect("out", "");
    cr_assert_eq(t_cli(t_dir, "dedup --shared-keys --key-space x --key id e "
                              "2> err"), 2);
    cr_assert(t_grep(t_at("err"), "exclude each other"));
}

Test(cli_dedup, a_key_space_leaves_the_rest_of_the_key_limit)
{
    char *line = malloc(1100);
    cr_assert(line);
    memset(line, 'k', 1024);
    memcpy(line + 1024, "\n", 2);
    t_put("long", line);
    free(line);
    cr_assert_eq(t_cli(t_dir, "dedup --line --job j long > out 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "the key is 1024 bytes; keys in key space "
                                  "'j' are 1 to 1021 bytes (1024 with the key "
                                  "space's name)"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert_eq(t_cli(t_dir, "dedup --line --shared-keys --quiet long "
                              "> out"), 0);
    cr_assert_eq(t_sh("wc -c < '%s' | grep -qx 1025", t_at("out")), 0);
}

/* A job committed before key spaces has a version 1 checkpoint and its
 * keys in the shared key space: it is not silently run again elsewhere. */
Test(cli_dedup, jobs_from_before_key_spaces_keep_their_history)
{
    static const char v1[] = "idem-job 1 out=9 inputs=0 input=0 offset=0 "
                             "line=0 tail=0/0";
    t_put("o", "{\"id\":1}\n");
    t_put("in", "{\"id\":1}\n{\"id\":2}\n");
    idem_store *s;
    char uri[4300];
    snprintf(uri, sizeof uri, "local:%s", t_at("store"));
    cr_assert_eq(idem_open(uri, NULL, &s), 0);
    idem_outcome oc;
    cr_assert_eq(idem_claim(s, &(idem_key){"1", 1, NULL}, NULL, &oc), 0);
    cr_assert_eq(idem_complete(s, "1", 1, oc.token, "", 0, 0), 0);
    cr_assert_eq(idem_checkpoint_put(s, "dedup:old", v1, strlen(v1)), 0);
    cr_assert_eq(idem_close(s), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --job old --key id --output o in "
                              "2> err"), 1);
    cr_assert(t_grep(t_at("err"), "committed by an idem without key spaces"),
              "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "Add --shared-keys to keep them"));
    t_expect("o", "{\"id\":1}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --job old --shared-keys --key id "
                              "--quiet --output o in"), 0);
    t_expect("o", "{\"id\":1}\n{\"id\":2}\n");
    /* now written with its key space, which a rerun must name again */
    cr_assert_eq(t_cli(t_dir, "dedup --job old --key-space x --key id "
                              "--output o in 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "keeps its keys in the shared key space; "
                                  "run it with --shared-keys"));
    cr_assert_eq(t_cli(t_dir, "dedup --job new --key id --output o2 in "
                              "2> err"), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --job new --shared-keys --key id "
                              "--output o2 in 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "keeps its keys in key space 'new'; run it "
                                  "with --key-space 'new'"));
}

/* A job keyed --line stops at a line too long to be a key, and the
 * message says that --line-hash keys every line: a rerun of the job that
 * takes the advice would find none of its keys (they were the lines, now
 * they are digests), and "a", committed before, would come out again. It
 * is refused with what to type; a checkpoint of version 2, which does not
 * say how its keys were made, is taken as it is. */
Test(cli_dedup, a_job_keeps_the_way_it_made_its_keys)
{
    char line[1600];
    memset(line, 'x', 1500);
    snprintf(line + 1500, sizeof line - 1500, "\na\nc\n");
    t_put("in", "a\nb\n");
    FILE *f = fopen(t_at("in"), "a");
    cr_assert(f);
    fputs(line, f);
    fclose(f);
    cr_assert_eq(t_cli(t_dir, "dedup --line --output out in 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "--line-hash keys each line"));
    t_expect("out", "a\nb\n");
    cr_assert_eq(t_cli(t_dir, "dedup --line-hash --output out in 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "keyed its messages with --line, this run "
                                  "with --line-hash"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "Run it with --line (or name a new --job"));
    cr_assert_eq(t_cli(t_dir, "dedup --key id --output out in 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "this run with --key"));
    t_expect("out", "a\nb\n");
    cr_assert_eq(t_cli(t_dir, "dedup --line --on-missing-key skip --quiet "
                              "--output out in"), 0);
    t_expect("out", "a\nb\nc\n");
    /* version 2: no word on the keys, so none is asked for */
    static const char v2[] = "idem-job 2 out=0 inputs=0 input=0 offset=0 "
                             "line=0 tail=0/0 space=old";
    idem_store *s;
    char uri[4300];
    snprintf(uri, sizeof uri, "local:%s", t_at("store"));
    cr_assert_eq(idem_open(uri, NULL, &s), 0);
    cr_assert_eq(idem_checkpoint_put(s, "dedup:old", v2, strlen(v2)), 0);
    cr_assert_eq(idem_close(s), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --job old --line-hash --quiet "
                              "--output o2 in"), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --job old --line --output o2 in "
                              "2> err"), 1);
    cr_assert(t_grep(t_at("err"), "keyed its messages with --line-hash"));
}

Test(cli_dedup, an_unterminated_last_line_waits_for_its_newline)
{
    t_put("in", "a1\na2");
    cr_assert_eq(t_cli(t_dir, "dedup --line --output out in 2> err"), 0);
    t_expect("out", "a1\n");
    cr_assert(t_grep(t_at("err"), "in:2: no newline at the end"), "%s",
              t_read(t_at("err"), NULL));
    /* a writer completes the line and adds more: a rerun reads "a2x" as
     * one line, as reading the file from the start does */
    t_sh("printf 'x\\na3\\n' >> '%s'", t_at("in"));
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet --output out in"), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet --store mem: in > ref"), 0);
    t_expect("ref", "a1\na2x\na3\n");
    t_expect("out", "a1\na2x\na3\n");
    /* the same from a pipe, which a rerun reads from the start */
    t_put("in", "b1\nb2");
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet < in > out"), 0);
    t_expect("out", "b1\n");
    /* the last line of an input that another input follows ends there */
    t_put("in2", "c2\n");
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet --store mem: in in2 "
                              "> out"), 0);
    t_expect("out", "b1\nb2\nc2\n");
    /* a checkpoint right after such a line (the run stopped on in2's key
     * of 1100 bytes) is not resumed from once bytes follow it there */
    char *long_key = malloc(1200);
    memset(long_key, 'z', 1100);
    snprintf(long_key + 1100, 100, "\nc3\n");
    t_put("in2", long_key);
    free(long_key);
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet --store local:s3 "
                              "--output o2 in in2 2> err"), 1);
    t_sh("printf 'x\n' >> '%s'", t_at("in"));
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet --store local:s3 "
                              "--output o2 in in2 2> err"), 1);
    t_expect("o2", "b1\nb2\nb2x\n");
}

Test(cli_dedup, the_output_cannot_be_an_input)
{
    const char *how[] = {"--output x x", "--output y x", "--output z x",
                         "--output x - < x", "x >> x", "- < x >> x"};
    t_put("x", "{\"k\":1}\n");
    t_sh("cd '%s' && ln x y && ln -s x z", t_dir);
    for (size_t i = 0; i < sizeof how / sizeof how[0]; i++) {
        cr_assert_eq(t_cli(t_dir, "dedup --key k %s 2> err", how[i]), 2,
                     "%s", how[i]);
        cr_assert(t_grep(t_at("err"), "is also an input"), "%s: %s", how[i],
                  t_read(t_at("err"), NULL));
        t_expect("x", "{\"k\":1}\n");
    }
    cr_assert_eq(t_sh("test -e '%s'", t_at("store")), 1,
                 "the store was not touched");
}

Test(cli_dedup, an_output_no_job_wrote_is_not_cut)
{
    t_put("in", "{\"k\":1}\n");
    t_put("out", "precious\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key k --output out in 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "--overwrite"), "%s",
              t_read(t_at("err"), NULL));
    t_expect("out", "precious\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key k --quiet --output out "
                              "--overwrite in"), 0);
    t_expect("out", "{\"k\":1}\n");
    /* the job's own output is cut back to its checkpoint, as before */
    cr_assert_eq(t_cli(t_dir, "dedup --key k --quiet --output out in"), 0);
    t_expect("out", "{\"k\":1}\n");
    /* a store without this job's checkpoint (mem: forgets it) */
    cr_assert_eq(t_cli(t_dir, "dedup --key k --store mem: --output out in "
                              "2> err"), 1);
    t_expect("out", "{\"k\":1}\n");
    /* an empty output is free to take */
    t_put("empty", "");
    cr_assert_eq(t_cli(t_dir, "dedup --key k --quiet --store mem: "
                              "--output empty in"), 0);
    t_expect("empty", "{\"k\":1}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --help > out2"), 0);
    cr_assert(t_grep(t_at("out2"), "--overwrite"));
}

/* Two jobs told apart by their --output alone are two jobs: their keys
 * are apart too. */
Test(cli_dedup, jobs_named_by_their_output_keep_their_keys_apart)
{
    t_put("e", "{\"event_id\":\"42\"}\n");
    t_put("o", "{\"order_id\":\"42\"}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key event_id --quiet --output ev e"),
                 0);
    cr_assert_eq(t_cli(t_dir, "dedup --key order_id --quiet --output or o"),
                 0);
    t_expect("or", "{\"order_id\":\"42\"}\n");
}

/* --output /dev/stdout names the file behind it: a run whose standard
 * output is another file is another job, and that file, which no
 * checkpoint names, is not cut. */
Test(cli_dedup, an_output_through_dev_stdout_is_the_file_behind_it)
{
    t_put("a", "{\"id\":1}\n");
    t_put("b", "{\"id\":2}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --quiet --output /dev/stdout a "
                              ">> out1"), 0);
    t_put("log", "precious\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key id --output /dev/stdout b >> log "
                              "2> err"), 1);
    cr_assert(t_grep(t_at("err"), "--overwrite"));
    t_expect("log", "precious\n");
    t_expect("out1", "{\"id\":1}\n");
}

/* Lines appended to an input that a job had read to its end, before the
 * one it stopped in, are read by the next run: it reads from the start
 * instead of resuming past them. */
Test(cli_dedup, lines_appended_to_an_earlier_input_are_read)
{
    t_put("a", "a1\na2\n");
    t_put("b", "b1\n");
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet --output out a b"), 0);
    t_sh("printf 'a3\\n' >> '%s' && printf 'b2\\n' >> '%s'", t_at("a"),
         t_at("b"));
    cr_assert_eq(t_cli(t_dir, "dedup --line --quiet --output out a b"), 0);
    t_expect("out", "a1\na2\nb1\na3\nb2\n");
}

/* An output among a local store's own files is refused before anything
 * is touched: it would be a segment, or be replaced by one of them. */
Test(cli_dedup, an_output_inside_the_store_is_refused)
{
    t_put("in", "{\"k\":1}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key k --quiet in > out"), 0);
    cr_assert_eq(t_cli(t_dir, "dedup --key k --output store/TAIL.tmp in "
                              "2> err"), 2);
    cr_assert(t_grep(t_at("err"), "inside the store's directory"));
    cr_assert_eq(t_cli(t_dir, "check > /dev/null"), 0);
}
