/* tests/test_cli_json.c - JSON at the CLI's edges: every output line of
 * `idem run` is valid JSON whatever the store holds, a key is exactly the
 * bytes its JSON string denotes (an escape that denotes no character is
 * bad input, never a '?'), and lines too long to be keys are keyed by
 * their SHA-256 (--line-hash). Output lines are checked with YAJL, the
 * parser the CLI itself uses, in its strict defaults. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

#include "common.h"

static int json_valid(const char *p, size_t n)
{
    yajl_handle h = yajl_alloc(NULL, NULL, NULL);
    cr_assert(h);
    int ok = yajl_parse(h, (const unsigned char *)p, n) == yajl_status_ok &&
             yajl_complete_parse(h) == yajl_status_ok;
    yajl_free(h);
    return ok;
}

/* Every line of the file is one valid JSON value; returns the count. */
static int expect_json_lines(const char *name)
{
    size_t n;
    char *text = t_read(t_at(name), &n);
    int lines = 0;
    for (char *p = text, *nl; p < text + n; p = nl + 1, lines++) {
        nl = memchr(p, '\n', (size_t)(text + n - p));
        cr_assert(nl, "%s: the last line has no newline", name);
        cr_assert(json_valid(p, (size_t)(nl - p)),
                  "%s: line %d is not JSON: %.*s", name, lines + 1,
                  (int)(nl - p), p);
    }
    free(text);
    return lines;
}

/* A DONE record of key space `run` (idem run's default) for key, whose
 * response is given as a JSON member ("response":... or
 * "response_base64":...). */
static void record(FILE *f, const char *key, const char *response)
{
    fprintf(f, "{\"key\":\"%s\",\"key_space\":\"run\",\"state\":\"done\","
            "\"token\":1,\"created_ms\":1,\"expires_ms\":4000000000000,%s}\n",
            key, response);
}

TestSuite(cli_json, .init = t_dir_init, .fini = t_dir_fini, .timeout = 120);

Test(cli_json, replayed_responses_that_are_not_json_stay_valid_json)
{
    FILE *f = fopen(t_at("recs"), "w");
    cr_assert(f);
    record(f, "text", "\"response\":\"ok\"");
    record(f, "byte", "\"response_base64\":\"/w==\"");
    record(f, "string", "\"response\":\"\\\"ok\\\"\"");
    record(f, "object", "\"response\":\"{\\\"ok\\\":true}\"");
    record(f, "lines", "\"response\":\"[1,\\n2]\"");
    record(f, "two", "\"response\":\"1 2\"");
    record(f, "utf8", "\"response\":\"\xc3\xbc\\u0000\"");
    fclose(f);
    cr_assert_eq(t_cli(t_dir, "load recs 2> err"), 0, "%s",
                 t_read(t_at("err"), NULL));
    t_put("in", "{\"id\":\"text\"}\n{\"id\":\"byte\"}\n{\"id\":\"string\"}\n"
                "{\"id\":\"object\"}\n{\"id\":\"lines\"}\n{\"id\":\"two\"}\n"
                "{\"id\":\"utf8\"}\n{\"id\":\"text\"}\n");
    cr_assert_eq(t_cli(t_dir, "run --key id --replay emit --quiet --exec "
                              "'\"$IDEM_PROGS/handler\" log' in > out"), 0);
    cr_assert_eq(expect_json_lines("out"), 8);
#define RP(k) "{\"key\":\"" k "\",\"status\":\"done\",\"replayed\":true,"
    t_expect("out", RP("text") "\"result_text\":\"ok\"}\n"
                    RP("byte") "\"result_base64\":\"/w==\"}\n"
                    RP("string") "\"result\":\"ok\"}\n"
                    RP("object") "\"result\":{\"ok\":true}}\n"
                    RP("lines") "\"result_text\":\"[1,\\n2]\"}\n"
                    RP("two") "\"result_text\":\"1 2\"}\n"
                    RP("utf8") "\"result_text\":\"\xc3\xbc\\u0000\"}\n"
                    RP("text") "\"result_text\":\"ok\"}\n");
#undef RP
    cr_assert_eq(t_sh("test ! -e '%s'", t_at("log")), 0,
                 "every message was a replay: the handler saw none");
}

Test(cli_json, an_answer_too_large_to_store_is_reported_as_json)
{
    t_put("in", "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    cr_assert_eq(t_cli(t_dir, "run --key id --quiet --exec "
                              "'\"$IDEM_PROGS/handler\" big=a' in > out"), 3);
    cr_assert_eq(expect_json_lines("out"), 2);
    cr_assert(t_grep(t_at("out"), "{\"key\":\"a\",\"status\":\"failed\","
                                  "\"result_text\":\"the handler's answer "),
              "%s", t_read(t_at("out"), NULL));
    cr_assert_eq(t_cli(t_dir, "run --key id --replay emit --quiet --exec "
                              "'\"$IDEM_PROGS/handler\"' in > out"), 0);
    cr_assert_eq(expect_json_lines("out"), 2);
}

/* Keys that YAJL alone would decode to '?' or to some other character. */
static const char *const lone[] = {
    "\\ud800",          /* a high surrogate at the end */
    "\\udbff",          /* another one: it was the same key as the first */
    "\\udc00",          /* a low surrogate alone */
    "\\ud800x",         /* a high one followed by a character */
    "\\ud800\\u0041",   /* ... by an escape that is no low surrogate */
    "a\\udfffb",        /* a low one inside */
    "\\ud800\\ud800",   /* two high ones */
};

Test(cli_json, an_escape_that_denotes_no_character_is_bad_input)
{
    for (size_t i = 0; i < sizeof lone / sizeof *lone; i++) {
        char line[100];
        snprintf(line, sizeof line, "{\"n\":1, \"id\":\"%s\"}\n", lone[i]);
        t_put("in", line);
        cr_assert_eq(t_cli(t_dir, "dedup --key id in > out 2> err"), 1,
                     "%s", lone[i]);
        char where[32];  /* the column of the escape at fault */
        snprintf(where, sizeof where, "in:1:%d: ", 15 + (lone[i][0] == 'a'));
        cr_assert(t_grep(t_at("err"), where), "%s: %s", lone[i],
                  t_read(t_at("err"), NULL));
        cr_assert(t_grep(t_at("err"), "the key field 'id'"), "%s", lone[i]);
        cr_assert(t_grep(t_at("err"), "--on-bad-input"), "%s", lone[i]);
    }
    /* skipped, all of them: none is a key, so none is a duplicate */
    FILE *f = fopen(t_at("in"), "w");
    cr_assert(f);
    for (size_t i = 0; i < sizeof lone / sizeof *lone; i++)
        fprintf(f, "{\"id\":\"%s\"}\n", lone[i]);
    fputs("{\"id\":\"\\ud83d\\ude00\"}\n{\"id\":\"\xf0\x9f\x98\x80\"}\n"
          "{\"id\":\"?\"}\n{\"note\":\"\\ud800\",\"id\":\"x\"}\n", f);
    fclose(f);
    cr_assert_eq(t_cli(t_dir, "dedup --key id --on-bad-input skip --quiet "
                              "--stats-json in > out 2> err"), 0);
    t_expect("out", "{\"id\":\"\\ud83d\\ude00\"}\n{\"id\":\"?\"}\n"
                    "{\"note\":\"\\ud800\",\"id\":\"x\"}\n");
    cr_assert(t_grep(t_at("err"), "\"skipped\":7"), "%s",
              t_read(t_at("err"), NULL));
}

Test(cli_json, a_member_name_on_the_path_must_denote_characters)
{
    t_put("in", "{\"a\":{\"i\\ud800\":\"k1\"}}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key 'a.i?' in > out 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "in:1:9: "), "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "a name on the key's path 'a.i?'"), "%s",
              t_read(t_at("err"), NULL));
    /* off the path, or not the segment: only the key matters */
    t_put("in", "{\"b\":{\"i\\ud800\":1},"
                "\"a\":{\"j\\ud800\":2,\"i?\":\"k\"}}\n");
    cr_assert_eq(t_cli(t_dir, "dedup --key 'a.i?' --quiet in > out"), 0);
    t_expect("out", "{\"b\":{\"i\\ud800\":1},\"a\":{\"j\\ud800\":2,"
                    "\"i?\":\"k\"}}\n");
}

Test(cli_json, run_takes_the_same_keys)
{
    t_put("in", "{\"id\":\"\\udbff\"}\n{\"id\":\"ok\"}\n");
    cr_assert_eq(t_cli(t_dir, "run --key id --on-bad-input skip --quiet "
                              "--exec '\"$IDEM_PROGS/handler\" log' in > out"),
                 0);
    cr_assert_eq(t_sh("cut -d' ' -f1 '%s' | grep -qx ok", t_at("log")), 0);
}

Test(cli_json, load_refuses_a_key_that_denotes_no_character)
{
    t_put("recs", "{\"key\":\"a\\ud800\",\"state\":\"done\",\"token\":1,"
                  "\"created_ms\":1,\"expires_ms\":4000000000000}\n");
    cr_assert_eq(t_cli(t_dir, "load recs 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "recs:1: field \"key\": "), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "\\ud800"));
    t_put("recs", "{\"key\":\"b\",\"state\":\"done\",\"token\":1,"
                  "\"created_ms\":1,\"expires_ms\":4000000000000,"
                  "\"response\":\"\\udc00\"}\n");
    cr_assert_eq(t_cli(t_dir, "load recs 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "recs:1: field \"response\": "), "%s",
              t_read(t_at("err"), NULL));
}

/* A line of n bytes of 'x' and a newline, into name. */
static void long_line(const char *name, size_t n, const char *tail)
{
    char *p = malloc(n + 2 + strlen(tail));
    cr_assert(p);
    memset(p, 'x', n);
    snprintf(p + n, 2 + strlen(tail), "\n%s", tail);
    t_put(name, p);
    free(p);
}

Test(cli_json, line_hash_keys_long_lines)
{
    long_line("in", 5000, "");
    cr_assert_eq(t_cli(t_dir, "dedup --line in > out 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "in:1:1: the key is 5000 bytes"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "--line-hash"), "%s",
              t_read(t_at("err"), NULL));
    /* keyed by the SHA-256 of the line, in hex, as sha256sum gives it */
    t_sh("cd '%s' && cat in in > in2 && printf 'short\\r\\nshort\\n' >> in2"
         " && head -c 5000 in | sha256sum | cut -c1-64 > h && "
         "printf short | sha256sum | cut -c1-64 >> h", t_dir);
    cr_assert_eq(t_cli(t_dir, "dedup --line-hash --quiet in2 > out"), 0);
    cr_assert_eq(t_sh("cd '%s' && cat in > want && "
                      "printf 'short\\r\\n' >> want && cmp out want", t_dir),
                 0, "each line once");
    cr_assert_eq(t_cli(t_dir, "dump --output d"), 0);
    cr_assert_eq(t_sh("cd '%s' && grep -o '\"key\":\"[0-9a-f]*\"' d | "
                      "cut -d'\"' -f4 | sort > got && sort h | cmp - got",
                      t_dir), 0, "the keys are the lines' SHA-256 in hex");
    cr_assert_eq(t_cli(t_dir, "dedup --line-hash --key id in 2> err"), 2);
    cr_assert(t_grep(t_at("err"), "exclude each other"));
    /* run's output lines are JSON: a long line cannot pass through */
    cr_assert_eq(t_cli(t_dir, "run --line --on-missing-key pass --exec cat "
                              "in 2> err"), 2);
    cr_assert(t_grep(t_at("err"), "--line-hash instead"));
    /* run: the handler gets the hash as the key, the line as the message */
    cr_assert_eq(t_cli(t_dir, "run --line-hash --quiet --store local:r "
                              "--exec '\"$IDEM_PROGS/handler\" log' in2 > out"),
                 0);
    cr_assert_eq(t_sh("cd '%s' && cut -d' ' -f1 log | sort | cmp - got",
                      t_dir), 0);
    cr_assert_eq(expect_json_lines("out"), 2);
    cr_assert(t_grep(t_at("out"), "\"status\":\"done\",\"result\":{\"ok\":"
                                  "true,\"key\":\""));
}

Test(cli_json, help_says_how_results_and_long_lines_come_out)
{
    cr_assert_eq(t_cli(t_dir, "run --help > out"), 0);
    cr_assert(t_grep(t_at("out"), "result_text"));
    cr_assert(t_grep(t_at("out"), "result_base64"));
    cr_assert(t_grep(t_at("out"), "--line-hash"));
    cr_assert_eq(t_cli(t_dir, "dedup --help > out"), 0);
    cr_assert(t_grep(t_at("out"), "--line-hash"));
}
