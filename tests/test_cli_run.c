/* tests/test_cli_run.c - `idem run` end to end with tests/progs/handler:
 * results, duplicates and replays, failures, retries, and a handler that
 * exits, hangs, writes garbage or answers out of step. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common.h"

static void setup(void)
{
    t_dir_init();
    t_put("in", "{\"id\":\"a\"}\n{\"id\":\"b\"}\n{\"id\":\"a\"}\n"
                "{\"id\":\"c\"}\n{\"id\":\"d\"}\n");
}

/* idem run with the test handler and its actions. */
static int run(const char *opts, const char *actions)
{
    return t_cli(t_dir, "run --key id --backoff 1ms --exec "
                        "'\"$IDEM_PROGS/handler\" log %s' %s",
                 actions, opts);
}

static void put_answer(const char *line)
{
    char text[300];
    snprintf(text, sizeof text, "%s\n", line);
    t_write(t_at("ans"), text, strlen(text));
}

/* run() on store sN, output to out, stderr to err. */
static int run_store(int n, const char *actions)
{
    char opts[100];
    snprintf(opts, sizeof opts, "--store local:s%d --output out in 2> err",
             n);
    t_sh("rm -f '%s'", t_at("out"));
    return run(opts, actions);
}

/* The handler's log without its tokens: the key and attempt of each
 * run, in order. */
static void expect_runs(const char *text)
{
    cr_assert_eq(t_sh("cut -d' ' -f1,2 '%s' > '%s'", t_at("log"), t_at("runs")),
                 0);
    t_expect("runs", text);
}

#define R(k) "{\"key\":\"" k "\",\"status\":\"done\",\"result\":" \
             "{\"ok\":true,\"key\":\"" k "\",\"n\":22}}\n"

TestSuite(cli_run, .init = setup, .fini = t_dir_fini, .timeout = 300);

Test(cli_run, each_key_once_in_order)
{
    cr_assert_eq(run("--quiet --output out in", ""), 0);
    t_expect("out", R("a") R("b") R("c") R("d"));
    expect_runs("a 1\nb 1\nc 1\nd 1\n");
    cr_assert_eq(run("--quiet --output out in", ""), 0);
    t_expect("out", R("a") R("b") R("c") R("d"));
    expect_runs("a 1\nb 1\nc 1\nd 1\n");
}

Test(cli_run, replay_emit_gives_duplicates_the_cached_result)
{
    cr_assert_eq(run("--quiet --replay emit in > out", ""), 0);
    char *out = t_read(t_at("out"), NULL);
    cr_assert(strstr(out, "{\"key\":\"a\",\"status\":\"done\",\"replayed\""
                          ":true,\"result\":{\"ok\":true,\"key\":\"a\","));
    free(out);
    cr_assert_eq(run("--quiet --replay emit in > out", ""), 0);
    cr_assert_eq(t_sh("grep -c replayed '%s' | grep -qx 5", t_at("out")), 0);
    expect_runs("a 1\nb 1\nc 1\nd 1\n");
}

Test(cli_run, failures_are_cached_retries_give_up)
{
    cr_assert_eq(run("--max-attempts 2 --stats-json in > out 2> err",
                     "fail=b retry=c flaky=d"), 3, "c gave up: not done");
    char *out = t_read(t_at("out"), NULL);
    cr_assert(strstr(out, "{\"key\":\"b\",\"status\":\"failed\",\"result\":"
                          "{\"error\":\"no such card\"}}"), "%s", out);
    cr_assert(strstr(out, "{\"key\":\"c\",\"status\":\"gave_up\","), "%s",
              out);
    cr_assert(strstr(out, "{\"key\":\"d\",\"status\":\"done\","), "%s", out);
    free(out);
    cr_assert(t_grep(t_at("err"), "\"failed\":1,\"gave_up\":1"));
    cr_assert(t_grep(t_at("err"), "\"exit\":3}"));
    expect_runs("a 1\nb 1\nc 1\nd 1\nc 2\nd 2\n");
    /* b's failure is cached (a duplicate now); c was released and runs
     * again */
    cr_assert_eq(run("--stats-json in > out 2> err", "retry=c"), 3);
    cr_assert(t_grep(t_at("err"), "\"duplicate\":4,\"failed\":0,"),
              "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("log"), "c 3 "));
    cr_assert(!t_grep(t_at("log"), "b 2 "));
}

Test(cli_run, a_handler_that_exits_stops_the_run_and_commits_the_prefix)
{
    cr_assert_eq(run("--output out --stats-json in 2> err", "exit=3"), 1);
    cr_assert(t_grep(t_at("err"), "the handler exited with status 3 before "
                                  "answering every message"),
              "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "\"exit\":1,\"error\":\"the handler "
                                  "exited with status 3"),
              "%s", t_read(t_at("err"), NULL));
    t_expect("out", R("a") R("b"));
    cr_assert_eq(run("--quiet --output out in", ""), 0);
    t_expect("out", R("a") R("b") R("c") R("d"));
    /* d's envelope was sent but never read: its claim was released, and
     * the rerun gives it a new token */
    expect_runs("a 1\nb 1\nc 1\nc 2\nd 2\n");
}

Test(cli_run, garbage_and_wrong_keys_are_errors)
{
    cr_assert_eq(run("--output out in 2> err", "garbage=2"), 1);
    cr_assert(t_grep(t_at("err"), "not a JSON object: this is not json"));
    t_expect("out", R("a"));
    cr_assert_eq(run("--output out in 2> err", "wrongkey=1"), 1);
    cr_assert(t_grep(t_at("err"), "answered for another key"));
}

/* b's answer is the first line of the file "ans": judged by the grammar
 * of `idem run --help`, never guessed. */
static int run_answering_b(int n, const char *answer)
{
    put_answer(answer);
    return run_store(n, "reply=2:ans");
}

Test(cli_run, answers_outside_the_grammar_stop_the_run)
{
    struct {
        const char *answer, *says;
    } cases[] = {
        {"{\"ok\":false}", "\"ok\" must be true"},
        {"{\"ok\":1}", "\"ok\" must be true"},
        {"{\"ok\":\"yes\"}", "\"ok\" must be true"},
        {"{\"ok\":true,\"error\":null}", "both \"ok\" and \"error\""},
        {"{\"ok\":false,\"error\":\"x\"}", "both \"ok\" and \"error\""},
        {"{\"error\":null}", "\"error\" must be a string"},
        {"{\"error\":{\"code\":1}}", "\"error\" must be a string"},
        {"{\"error\":\"x\",\"retryable\":\"yes\"}", "true or false"},
        {"{\"error\":\"x\",\"retryable\":1}", "true or false"},
        {"{\"ok\":true,\"retryable\":false}", "with \"error\" only"},
        {"{}", "neither \"ok\":true nor \"error\""},
        {"{\"result\":{\"ok\":true}}", "neither \"ok\":true nor"},
        {"{\"ok\":true,\"ok\":false}", "\"ok\" appears twice"},
        {"{\"ok\":true,\"ok\":true}", "\"ok\" appears twice"},
        {"{\"error\":\"x\",\"error\":\"y\"}", "\"error\" appears twice"},
        {"{\"ok\":true,\"key\":\"b\",\"key\":\"b\"}", "\"key\" appears"},
        {"{\"ok\":true,\"key\":7}", "\"key\" must be a string"},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) {
        cr_assert_eq(run_answering_b(i, cases[i].answer), 1, "%s",
                     cases[i].answer);
        cr_assert(t_grep(t_at("err"), "neither done nor failed") &&
                  t_grep(t_at("err"), cases[i].says), "%s: %s",
                  cases[i].answer, t_read(t_at("err"), NULL));
        t_expect("out", R("a"));
    }
}

Test(cli_run, answers_in_the_grammar_are_taken_as_written)
{
    cr_assert_eq(run_answering_b(0, "{\"error\":\"no\",\"retryable\":false,"
                                    "\"ok_later\":true}"), 0);
    t_expect("out", R("a") "{\"key\":\"b\",\"status\":\"failed\",\"result\":"
                    "{\"error\":\"no\",\"retryable\":false,"
                    "\"ok_later\":true}}\n"
                    R("c") R("d"));
    cr_assert_eq(run_answering_b(1, "{\"detail\":{\"ok\":false,\"error\":"
                                    "null},\"ok\":true}"), 0);
    t_expect("out", R("a") "{\"key\":\"b\",\"status\":\"done\",\"result\":"
                    "{\"detail\":{\"ok\":false,\"error\":null},\"ok\":true}}\n"
                    R("c") R("d"));
}

/* An answer line is read up to --answer-max bytes and no further: a
 * handler that writes without end (exec cat /dev/zero) is stopped with
 * a message, not buffered until memory or the lease runs out. */
Test(cli_run, an_answer_over_answer_max_is_a_broken_handler)
{
    cr_assert_eq(t_cli(t_dir, "run --key id --store local:s0 --answer-max "
                              "100000 --exec 'exec cat /dev/zero' --output "
                              "out in 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "answer is over 100000 bytes"), "%s",
              t_read(t_at("err"), NULL));
    static const char ans[] = "{\"ok\":true,\"pad\":\"0123456789\"}";
    char opt[100];
    snprintf(opt, sizeof opt, "--answer-max %zu --store local:s1 --output "
             "out1 in", sizeof ans - 1);
    put_answer(ans);
    cr_assert_eq(run(opt, "reply=2:ans"), 0,
                 "an answer of exactly --answer-max bytes is taken");
    snprintf(opt, sizeof opt, "--answer-max %zu --store local:s2 --output "
             "out2 in 2> err", sizeof ans - 2);
    cr_assert_eq(run(opt, "reply=2:ans"), 1);
    cr_assert(t_grep(t_at("err"), "answer is over"));
}

Test(cli_run, a_hung_handler_is_killed_after_the_lease)
{
    cr_assert_eq(run("--lease 300ms --output out in 2> err", "hang=2"), 1);
    cr_assert(t_grep(t_at("err"), "gave no answer for key 'b' within the "
                                  "lease"));
    t_expect("out", R("a"));
}

Test(cli_run, restart_continues_after_a_crash_with_new_tokens)
{
    cr_assert_eq(run("--restart 1 --quiet --output out in", "exit=1"), 1,
                 "the restarted handler exits at its first message too");
    cr_assert_eq(run("--restart 5 --quiet --output out in", "exit=2"), 0);
    t_expect("out", R("a") R("b") R("c") R("d"));
}

Test(cli_run, line_mode_sends_text)
{
    t_sh("printf 'x y\\nx y\\n' > '%s'", t_at("t"));
    cr_assert_eq(t_cli(t_dir, "run --line --quiet --exec 'while read -r l; "
                              "do echo \"$l\" >> seen; echo {\\\"ok\\\":true}; "
                              "done' t > out"), 0);
    cr_assert(t_grep(t_at("seen"), "\"message\":\"x y\"}"));
    t_expect("out", "{\"key\":\"x y\",\"status\":\"done\",\"result\":"
                    "{\"ok\":true}}\n");
}

Test(cli_run, usage)
{
    cr_assert_eq(t_cli(t_dir, "run --key id in 2> err"), 2);
    cr_assert(t_grep(t_at("err"), "--exec 'CMD'"));
    cr_assert_eq(t_cli(t_dir, "run --help > out"), 0);
    cr_assert(t_grep(t_at("out"), "fencing token"));
    cr_assert_eq(t_cli(t_dir, "run --key id --exec x --replay twice in "
                              "2> err"), 2);
    cr_assert(t_grep(t_at("err"), "skip|emit"));
    cr_assert_eq(t_cli(t_dir, "run --key id --exec cat --dead-letter - in "
                              "2> err"), 2);
    cr_assert(t_grep(t_at("err"), "--dead-letter -: the dead-letter file"));
    cr_assert_eq(t_sh("test ! -e '%s'", t_at("-")), 0);
}

Test(cli_run, policies_and_a_missing_handler)
{
    t_sh("printf '{\"id\":\"a\"}\\n{\"no\":1}\\n{\"id\":\"b\"}\\n' > '%s'",
         t_at("m"));
    cr_assert_eq(t_cli(t_dir, "run --key id --on-missing-key pass --quiet "
                              "--exec '\"$IDEM_PROGS/handler\"' m > out"), 0);
    char *out = t_read(t_at("out"), NULL);
    cr_assert(strstr(out, "\"status\":\"done\"") &&
              strstr(out, "\n{\"no\":1}\n"), "%s", out);
    free(out);
    cr_assert_eq(t_cli(t_dir, "run --key id --store local:s2 --exec "
                              "no-such-handler-here in 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "status 127 (command not found?)"), "%s",
              t_read(t_at("err"), NULL));
}

/* ------------------------------------------------------------------------
 * Poison messages (--dead-letter) and restarts */

#define DL_C(n, why) "{\"key\":\"c\",\"key_space\":\"poison\",\"attempts\":" \
    #n ",\"error\":\"" why "\",\"message\":{\"id\":\"c\"}}\n"
#define DEAD_C(why) "{\"key\":\"c\",\"status\":\"failed\",\"result\":" \
    "{\"error\":\"" why "\",\"dead_letter\":true}}\n"
#define CRASHED "the handler exited with status 3 before answering every " \
    "message"

static int run_poison(const char *opts, const char *actions)
{
    char o[300];
    snprintf(o, sizeof o, "--job poison --dead-letter dl --max-attempts 2 "
             "--output out %s in", opts);
    return run(o, actions);
}

/* c crashes the handler every time: after --max-attempts faults charged
 * to it (when it was the only message in flight) it is written to the
 * dead-letter file, recorded as a permanent failure, and d still runs;
 * exit status 3 says so. */
Test(cli_run, a_poison_message_is_dead_lettered_and_the_stream_goes_on)
{
    cr_assert_eq(run_poison("--stats-json 2> err", "crash=c"), 3, "%s",
                 t_read(t_at("err"), NULL));
    t_expect("out", R("a") R("b") DEAD_C(CRASHED) R("d"));
    t_expect("dl", DL_C(2, CRASHED));
    cr_assert(t_grep(t_at("err"), "\"dead_letter\":1,"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "key 'c': the handler failed on it 2 times"));
    /* the first fault had c and d in flight: counted for neither, each
     * ran alone after it */
    expect_runs("a 1\nb 1\nc 1\nc 2\nc 3\nd 2\n");
    /* a rerun replays the failure: c is not run, no second line */
    t_sh("rm -f '%s'", t_at("out"));
    cr_assert_eq(t_cli(t_dir, "run --key id --job again --key-space poison "
                              "--dead-letter dl --replay emit --exec false "
                              "--quiet in > out"), 0);
    cr_assert(t_grep(t_at("out"), "\"key\":\"c\",\"status\":\"failed\","
                                  "\"replayed\":true"));
    t_expect("dl", DL_C(2, CRASHED));
}

/* A handler that answers nothing at all (it cannot start: a missing
 * module, a database down) is broken, not the messages: after three set
 * aside in a row the run stops rather than recording the whole stream as
 * failed, and a rerun with a working handler runs the rest. */
Test(cli_run, a_handler_that_fails_on_everything_stops_the_run)
{
    cr_assert_eq(t_cli(t_dir, "run --key id --job broken --dead-letter dl "
                              "--max-attempts 1 --backoff 1ms --exec 'exit 3' "
                              "--output out in 2> err"), 1, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "failed on 4 messages in a row without "
                                  "answering any"), "%s",
              t_read(t_at("err"), NULL));
    cr_assert_eq(t_sh("test $(wc -l < '%s') -eq 3", t_at("dl")), 0, "%s",
                 t_read(t_at("dl"), NULL));
    cr_assert_eq(t_cli(t_dir, "run --key id --job broken --dead-letter dl "
                              "--exec '\"$IDEM_PROGS/handler\"' --quiet "
                              "--output out in 2> err"), 0, "%s",
                 t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("out"), R("d")), "%s", t_read(t_at("out"), NULL));
}

Test(cli_run, a_message_that_hangs_the_handler_is_dead_lettered)
{
    cr_assert_eq(run_poison("--lease 300ms --quiet 2> err", "hangon=c"), 3,
                 "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("dl"), "\"key\":\"c\",\"key_space\":\"poison\","
                                 "\"attempts\":2,\"error\":\"the handler "
                                 "gave no answer for key 'c' within the "
                                 "lease"), "%s", t_read(t_at("dl"), NULL));
    cr_assert(t_grep(t_at("out"), R("d")));
}

/* A kill -9 after the line is durable and before the store records the
 * failure: the rerun neither loses c nor writes its line again, and
 * does not run it again; its output is the uninterrupted run's. */
Test(cli_run, kill9_between_the_dead_letter_line_and_the_store)
{
    setenv("IDEM_TEST_KILL_AT", "dead-letter", 1);
    int st = run_poison("--quiet 2> err", "crash=c");
    unsetenv("IDEM_TEST_KILL_AT");
    cr_assert_eq(st, 128 + 9, "killed at the hook: %d", st);
    t_expect("dl", DL_C(2, CRASHED));
    t_expect("out", R("a") R("b"));
    cr_assert_eq(run_poison("2> err", "crash=c"), 3);
    cr_assert(t_grep(t_at("err"), "key 'c': already in the dead-letter file"),
              "%s", t_read(t_at("err"), NULL));
    t_expect("dl", DL_C(2, CRASHED));
    t_expect("out", R("a") R("b") DEAD_C(CRASHED) R("d"));
    expect_runs("a 1\nb 1\nc 1\nc 2\nc 3\nd 2\n");
}

/* A key that is not UTF-8 goes to the file in base64, with its message;
 * every message of a handler that always crashes is set aside, each
 * after running alone. */
Test(cli_run, a_binary_key_is_dead_lettered_in_base64)
{
    t_sh("printf 'x\\377\\nok\\n' > '%s'", t_at("bin"));
    cr_assert_eq(t_cli(t_dir, "run --line --quiet --backoff 1ms --job bin "
                              "--dead-letter dl --max-attempts 1 --exec "
                              "'read l; exit 3' bin > out"), 3);
    cr_assert(t_grep(t_at("dl"), "{\"key_base64\":\"eP8=\",\"key_space\":"
                                 "\"bin\",\"attempts\":1,"), "%s",
              t_read(t_at("dl"), NULL));
    cr_assert(t_grep(t_at("dl"), "\"message_base64\":\"eP8=\"}"));
    cr_assert(t_grep(t_at("dl"), "{\"key\":\"ok\","));
}

/* A handler that exits at once is restarted with growing gaps (from
 * --backoff, doubled), not in a tight loop: within a second of its first
 * restart a loop would restart it hundreds of times. SIGTERM comes once
 * idem has restarted it (its signal handlers are set by then). */
Test(cli_run, restarts_back_off)
{
    pid_t p = t_cli_start(t_dir, "run --key id --store local:b --restart "
                          "100000 --exec 'exit 3' --output out in 2> err");
    for (int i = 0; i < 3000 && (access(t_at("err"), F_OK) != 0 ||
                                 !t_grep(t_at("err"), "restarting the "
                                         "handler")); i++)
        t_sleep_ms(10);
    t_sleep_ms(1000);
    kill(p, SIGTERM);
    cr_assert_eq(t_wait(p), 0, "%s", t_read(t_at("err"), NULL));
    cr_assert_eq(t_sh("test $(grep -c 'restarting the handler' '%s') -ge 1 "
                      "&& test $(grep -c 'restarting the handler' '%s') "
                      "-lt 15", t_at("err"), t_at("err")), 0, "%s",
                 t_read(t_at("err"), NULL));
}

/* A line the handler writes beyond its answers (here a's, then one
 * more) is no answer to the next message, which is in the next batch
 * and not sent yet: b was recorded done without ever reaching the
 * handler. The handler is stopped; b is not done and runs in a rerun. */
Test(cli_run, a_line_too_many_answers_no_message)
{
    cr_assert_eq(run("--batch 1 --store local:s --output out in 2> err",
                     "twice=1"), 1, "%s", t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "before it was sent the message"), "%s",
              t_read(t_at("err"), NULL));
    t_expect("out", R("a"));
    expect_runs("a 1\n");
    cr_assert_eq(run("--batch 1 --store local:s --output out in 2> err", ""),
                 0, "%s", t_read(t_at("err"), NULL));
    t_expect("out", R("a") R("b") R("c") R("d"));
    cr_assert(t_grep(t_at("log"), "b 2 "), "b runs in the rerun");
}

/* A handler that closes its output and runs on can answer no more: it
 * is killed, not waited for (idem sat in waitpid until it exited, with
 * no renewal of the claims and deaf to SIGTERM, while its effect went on
 * and the lease ran out). */
Test(cli_run, a_handler_that_closes_its_output_and_runs_on_is_killed)
{
    cr_assert_eq(t_cli(t_dir, "run --key id --lease 3s --store local:s "
                              "--exec 'exec >&-; sleep 25; touch after' in "
                              "2> err"), 1);
    cr_assert(t_grep(t_at("err"), "closed its output but did not exit"),
              "%s", t_read(t_at("err"), NULL));
    cr_assert_neq(t_sh("test -e '%s'", t_at("after")), 0);
}

/* A handler's group outlives the handler as zombies where nobody reaps
 * them (a container's PID 1 that never reaps; here this test process, a
 * subreaper that does not), and the watcher may join the group only
 * after idem has killed it (strace holds the watcher, the only caller of
 * close_range, at its start): idem then waited for the watcher, which
 * waited for idem's end of its pipe, for ever. */
Test(cli_run, a_watcher_that_joins_a_dead_group_late_ends)
{
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    int rc = t_sh("cd '%s' && timeout -s KILL 25 strace -f -qq -o /dev/null "
                  "-e trace=close_range -e inject=close_range:delay_enter="
                  "2000000 \"$IDEM_CLI\" run --key id --store local:s "
                  "--exec '/bin/true & exit 3' in 2> err", t_dir);
    cr_assert_eq(rc, 1, "idem hung (%d): %s", rc, t_read(t_at("err"), NULL));
    cr_assert(t_grep(t_at("err"), "exited with status 3"), "%s",
              t_read(t_at("err"), NULL));
}

/* YAJL decodes the lone surrogate of "\udbff\u0041" to '?', so without
 * a check of the escapes the answer would pass for key "?A". */
Test(cli_run, an_answer_key_with_a_lone_surrogate_matches_no_key)
{
    t_sh("printf '{\"id\":\"?A\"}\\n' > '%s'", t_at("q"));
    put_answer("{\"ok\":true,\"key\":\"\\udbff\\u0041\"}");
    cr_assert_eq(t_cli(t_dir, "run --key id --exec '\"$IDEM_PROGS/handler\" "
                              "reply=1:ans' --output out q 2> err"), 1);
    cr_assert(t_grep(t_at("err"), "escape that denotes no character"), "%s",
              t_read(t_at("err"), NULL));
}

/* --dead-letter is checked as --output is, before anything is touched:
 * the same file as the output (by name or through a link, before either
 * exists or after), one of the inputs, or a file among a local store's
 * own is refused with exit status 2, and saying why. */
Test(cli_run, a_dead_letter_file_that_would_destroy_another_is_refused)
{
    static const struct {
        const char *opts, *said;
    } cases[] = {
        {"--output out --dead-letter out", "is the same file as"},
        {"--output out --dead-letter ./out", "is the same file as"},
        {"--output out --dead-letter sub/../out",
         "is the same file as"},
        {"--output old --dead-letter link", "is the same file as"},
        {"--dead-letter old >> old", "is the same file as"},
        {"--dead-letter in", "is also an input"},
        {"--dead-letter store/TAIL.tmp", "inside the store's directory"},
    };
    cr_assert_eq(t_sh("cd '%s' && mkdir sub store && echo kept > old && "
                      "ln -s old link", t_dir), 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(t_cli(t_dir, "run --key id --exec false %s in 2> err",
                           cases[i].opts), 2, "%s: %s", cases[i].opts,
                     t_read(t_at("err"), NULL));
        cr_assert(t_grep(t_at("err"), cases[i].said), "%s: %s",
                  cases[i].opts, t_read(t_at("err"), NULL));
    }
    cr_assert_eq(t_sh("cd '%s' && test ! -e out && test ! -e "
                      "store/TAIL.tmp && test \"$(cat old)\" = kept && "
                      "test -z \"$(ls store)\"", t_dir), 0,
                 "a refused run touched a file");
}
