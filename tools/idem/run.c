/* run.c - `idem run`: a handler in any language, run once per key.
 *
 * The stream loop (stream.c) and the library's runner do the exactly-once
 * work; coproc.c talks to the handler. This file is the command's face:
 * options, help, and the output line of each message:
 *
 *   {"key":"k1","status":"done","result":{...answer...}}
 *
 * status is done, failed (permanent, cached) or gave_up (retryable
 * failures up to --max-attempts; not cached, a later run tries again).
 * With --replay emit, duplicates get a line too, with "replayed":true and
 * the cached answer; by default (skip) the output holds each key once.
 * The line carries no attempt or token: those differ between a run that
 * was killed and resumed and one that was not, and the output must not. */
#include <inttypes.h>
#include <signal.h>
#include <string.h>

#include "coproc.h"
#include "handlerenv.h"
#include "stream.h"

static const char usage[] =
    "usage: idem run --exec 'CMD' (--key FIELD | --line | --line-hash)\n"
    "                [OPTIONS] [INPUT...]\n"
    "\n"
    "Run CMD once per key, exactly once, whatever the redeliveries and\n"
    "crashes. CMD (run by sh -c) is started once and kept. For each NEW\n"
    "message it reads one line on stdin:\n"
    "\n"
    "  {\"key\":\"k1\",\"token\":1764680000000000,\"attempt\":1,\n"
    "   \"message\":{...the input line...}}\n"
    "\n"
    "(\"key_base64\" for a key that is not UTF-8; with --line \"message\" is\n"
    "the line as a string, \"message_base64\" if it is not UTF-8)\n"
    "and writes one line on stdout, in order, each flushed:\n"
    "\n"
    "  {\"ok\":true,...}                     done: the line is the result, "
    "cached\n"
    "  {\"error\":\"...\",\"retryable\":true}    try again (with backoff, "
    "new token)\n"
    "  {\"error\":\"...\"}                     failed for good (cached)\n"
    "\n"
    "Exactly one of \"ok\":true (done) or \"error\":STRING (failed, with an\n"
    "optional \"retryable\":true|false, default false); \"key\", a string,\n"
    "may repeat the envelope's key and is then checked. ok, error,\n"
    "retryable and key appear at most once at the top level; other members\n"
    "are yours and stay in the result. Anything else is a broken handler,\n"
    "never a guess: \"ok\":false without an error, ok beside error,\n"
    "\"error\":null or a non-string error, a non-boolean ok or retryable,\n"
    "retryable without error, a repeated member, neither ok nor error.\n"
    "\n"
    "A long effect: before its answer the handler may write\n"
    "  {\"extend\":\"30s\"}                   (\"key\" may name the message)\n"
    "for the message it works on (the first not answered): it may take\n"
    "that long from now before it counts as hung, and its claim is\n"
    "renewed for that long (at most the TTL), even if idem dies.\n"
    "\n"
    "Duplicates are not sent: they get the cached result. Output, one line\n"
    "per message:\n"
    "  {\"key\":\"k1\",\"status\":\"done\",\"result\":{...}}\n"
    "with status done, failed or gave_up (and \"replayed\":true for\n"
    "duplicates under --replay emit). Every line is valid JSON: \"result\"\n"
    "is the cached answer as written when it is one JSON value on one line\n"
    "(a handler's answers are); a response stored otherwise (by a library\n"
    "program, idem load, or the note left for an answer too large to\n"
    "store) is \"result_text\":STRING if UTF-8, else \"result_base64\".\n"
    "\n"
    "  --exec CMD        the handler (required)\n"
    "  --key FIELD       the key: event_id, user.id or /user/id (see\n"
    "                    `idem dedup --help`); --line: the whole line, sent\n"
    "                    as a JSON string; --line-hash: the same, keyed by\n"
    "                    the line's SHA-256 in hex (lines of any length)\n"
    "  --output FILE     crash-proof output, as for dedup: after kill -9 run\n"
    "                    the same command again; FILE ends byte-identical\n"
    "                    to an uninterrupted run's. An existing FILE that\n"
    "                    no checkpoint of the store names is refused\n"
    "  --overwrite       ... unless this is given: it is cut to 0 bytes\n"
    STREAM_ENDS_HELP
    STREAM_METRICS_HELP
    "  --replay emit|skip  duplicates: print the cached result, or nothing\n"
    "                    (default skip)\n"
    "  --batch N         messages read and claimed at a time (default\n"
    "                    16384)\n"
    "  --commit-interval DURATION  while the handler works, commit its\n"
    "                    answers this often (default 200ms; 0: only when\n"
    "                    a batch is answered). After kill -9 only the\n"
    "                    messages in flight and this much finished work\n"
    "                    reach the handler again\n"
    "  --lease DURATION  how long a claim is held without renewal (idem\n"
    "                    renews every third of it while the handler\n"
    "                    works), and the longest wait for one answer\n"
    "                    before the handler counts as hung (default 30s)\n"
    "  --max-attempts N  runs of a message with retryable failures before\n"
    "                    it is reported gave_up (default 3); with\n"
    "                    --dead-letter also the handler faults on one\n"
    "                    message before it is set aside\n"
    "  --backoff DURATION  wait before the first retry, doubled after each\n"
    "                    (default 100ms)\n"
    "  --grace DURATION  after SIGTERM or SIGINT, how long the handler has\n"
    "                    to answer the messages it was sent (default 5s)\n"
    "  --answer-max BYTES  the longest answer line read (default 128 MiB,\n"
    "                    twice IDEM_VALUE_MAX); a longer one is a broken\n"
    "                    handler (\"answer over N bytes\"). An answer over\n"
    "                    IDEM_VALUE_MAX (64 MiB) but within it is recorded\n"
    "                    as a permanent failure, since its effect happened\n"
    "  --restart N       when the handler crashes, hangs or writes garbage,\n"
    "                    restart it up to N times (default 0: stop; with\n"
    "                    --dead-letter no limit). Restarts wait --backoff,\n"
    "                    doubled for each one without an answer between\n"
    "                    (up to 10s)\n"
    "  --dead-letter FILE  after --max-attempts faults (crash, hang,\n"
    "                    garbage) on one message, append it to FILE as a\n"
    "                    JSON line {\"key\",\"key_space\",\"attempts\",\n"
    "                    \"error\",\"message\"} (made durable first), record\n"
    "                    it as a permanent failure and go on. A fault counts\n"
    "                    for a message only when it was the one message in\n"
    "                    flight: after a fault with several, each runs alone.\n"
    "                    A key already in FILE is not run and gets no second\n"
    "                    line (see idem(1)). A handler that fails on 4\n"
    "                    messages in a row without answering any is broken,\n"
    "                    not the messages: the run stops (exit 1) instead of\n"
    "                    setting more aside. Refused, as --output is, when\n"
    "                    it is the output, an input or in a local store\n"
    "  --store, --ttl, --job, --key-space, --shared-keys, --on-missing-key,\n"
    "  --on-bad-input, --quiet, --stats-json  as for `idem dedup` (the\n"
    "                    default key space is the --job name, else the\n"
    "                    --output file's real path, else run). With\n"
    "                    --line, --on-missing-key pass is refused: the\n"
    "                    output's lines are JSON\n"
    "\n"
    "The handler gets idem's environment less the store's password\n"
    "($IDEM_REDIS_PASSWORD, or $IDEM_STORE when its URI holds one).\n"
    "\n"
    "Exactly once, and what the fencing token is for: a message's claim is\n"
    "committed before the handler sees it, and its result is committed\n"
    "with the output. If idem is killed in between (or the handler fails),\n"
    "the next run gives the same key to the handler again with a higher\n"
    "attempt and token. The store never records two results, but effects\n"
    "outside it may have happened: make them idempotent by key, or reject\n"
    "writes that carry a token lower than one already seen.\n"
    "\n"
    "When the handler exits, hangs past --lease or writes a line that is\n"
    "not an answer as above, idem kills it, commits the results before the\n"
    "first missing one and nothing after, and stops with exit status 1\n"
    "(or restarts it, see --restart).\n"
    "\n"
    "SIGTERM or SIGINT (Ctrl-C) stops gracefully: no more messages are\n"
    "read or sent to the handler; it gets --grace to answer those it has\n"
    "(then it is killed); the answered ones are committed, the claims of\n"
    "the others are released (a rerun takes them at once), stderr says\n"
    "how many, and idem exits 0 (SIGTERM) or 130 (SIGINT). A wait for a\n"
    "key that another worker holds ends at once. The handler runs in its\n"
    "own process group: Ctrl-C at a terminal reaches idem, not the\n"
    "handler (under systemd use KillMode=mixed so that SIGTERM goes to\n"
    "idem only). A second signal ends idem at once, as kill -9\n"
    "would, and the handler with it (with all it started: a watcher in its\n"
    "process group kills the group when idem dies): the rerun redoes what\n"
    "was not committed.\n"
    "\n"
    "Several workers of one job may run on one shared store (redis://),\n"
    "each with its own --output and the same --key-space NAME: a key is\n"
    "run by one of them; the others wait for it and skip it (its result\n"
    "line is in the output of the worker that ran it).\n"
    "\n"
    "Exit status: 0 done (or stopped by SIGTERM, see above); 1 stopped\n"
    "(handler, store or input error); 130 stopped by SIGINT; 2 bad\n"
    "usage; 3 read to the end, but some messages were not done here: a\n"
    "claim lost to another worker after a stall longer than --lease, a key\n"
    "the store refused, an answer too large to store, a message given up\n"
    "on or dead-lettered, a result too large for a NATS --to written as a\n"
    "marker (each is named on stderr).\n"
    "\n"
    "Example:\n"
    "  idem run --key order_id --output results.ndjson \\\n"
    "      --exec 'python3 charge.py' orders.ndjson\n";

typedef struct run_ctx {
    coproc co;
    int replay_emit;
    int end_rc;
    int restart_given;  /* --restart */
} run_ctx;

static void handler_end(void *ctx)
{
    run_ctx *r = ctx;
    r->end_rc = coproc_stop(&r->co, "run");
}

static int store_failed(void *ctx)
{
    return ((run_ctx *)ctx)->co.store_failed;
}

static const char *fault(void *ctx, size_t *sent)
{
    run_ctx *r = ctx;
    *sent = r->co.sent;
    return r->co.fault ? r->co.err : NULL;
}

static int handle(void *ctx, idem_task *tasks, size_t n)
{
    run_ctx *r = ctx;
    int rc = coproc_handle(&r->co, tasks, n);
    if (rc && r->co.stopped && r->co.err[0])
        fprintf(stderr, "idem run: stopping: %s\n", r->co.err);
    else if (rc && !r->co.stopped)
        cli_fail("run", "%s; nothing was committed for the messages from "
                 "there on", r->co.err);
    return rc;
}

static const char *status_of(idem_msg_result r, int *replayed)
{
    *replayed = r == IDEM_MSG_REPLAY || r == IDEM_MSG_REPLAY_FAILED;
    return stream_status(r);
}

static int emit_result(void *ctx, stream *st, const idem_msg *msgs,
                       const idem_msg *m, const nd_line *l)
{
    run_ctx *r = ctx;
    cli_buf *b = &st->job.obuf;
    if (!m)
        return cli_buf_add(b, l->p, l->len) || cli_buf_add(b, "\n", 1);
    const idem_msg *src = m->result == IDEM_MSG_DUPLICATE ? &msgs[m->first]
                                                          : m;
    int dup = src != m;
    if (src->result == IDEM_MSG_INVALID || src->result == IDEM_MSG_UNDONE)
        return 0;
    int replayed;
    const char *status = status_of(src->result, &replayed);
    replayed |= dup;
    if (replayed && !r->replay_emit)
        return 0;
    int rc = cli_buf_str(b, "{") ||
             cli_buf_bytes_member(b, "key", "key_base64", m->key, m->keylen);
    rc = rc ? rc : cli_buf_fmt(b, ",\"status\":\"%s\",", status);
    if (replayed)
        rc = rc ? rc : cli_buf_str(b, "\"replayed\":true,");
    rc = rc ? rc : src->len ? cli_buf_json_member(b, "result", src->data,
                                                  src->len)
                            : cli_buf_str(b, "\"result\":null");
    return rc ? rc : cli_buf_str(b, "}\n");
}

static int run_opt(stream_cfg *c, run_ctx *r, int ch, const char *arg)
{
    static const char *const replay[] = {"skip", "emit", NULL};
    uint64_t v;
    int rc = 0;
    switch (ch) {
    case 'x': r->co.cmd = arg; return 0;
    case 'g': return cli_duration(c->cmd, "--backoff", arg, &c->backoff_ms);
    case 'r': return cli_choice(c->cmd, "--replay", arg, replay,
                                &r->replay_emit);
    case 'a':
        rc = cli_number(c->cmd, "--max-attempts", arg, 1, 1000, &v);
        c->max_attempts = (uint32_t)v;
        return rc;
    case 'R':
        r->restart_given = 1;
        return cli_number(c->cmd, "--restart", arg, 0, 1000000,
                          &c->restarts);
    case 'D': c->dead_letter = arg; return 0;
    case 'A': return cli_number(c->cmd, "--answer-max", arg, 2,
                                (uint64_t)1 << 40, &r->co.answer_max);
    default: return stream_opt(c, ch, arg);
    }
}

int cli_cmd_run(int argc, char **argv)
{
    static const struct option opts[] = {
        STREAM_LONGOPTS,         {"exec", 1, 0, 'x'},
        {"replay", 1, 0, 'r'},
        {"max-attempts", 1, 0, 'a'}, {"backoff", 1, 0, 'g'},
        {"restart", 1, 0, 'R'},  {"answer-max", 1, 0, 'A'},
        {"dead-letter", 1, 0, 'D'}, {0, 0, 0, 0}};
    run_ctx r = {.co.answer_max = 2 * (uint64_t)IDEM_VALUE_MAX};
    stream_cfg c = {.cmd = "run", .batch = 16384, .backoff_ms = 100,
                    .commit_interval_ms = -1, .runner_out = &r.co.runner,
                    .store_failed = store_failed, .fault = fault,
                    .handler = handle, .hctx = &r,
                    .handler_end = handler_end, .emit = emit_result,
                    .ectx = &r};
    if (handler_env_hide())
        return cli_fail(c.cmd, "out of memory");
    int ch;
    while ((ch = cli_getopt(c.cmd, argc, argv, opts)) != -1) {
        if (ch == 'h') {
            fputs(usage, stdout);
            return 0;
        }
        int rc = ch == '?' ? 2 : run_opt(&c, &r, ch, optarg);
        if (rc)
            return rc == 1 ? cli_usage_error(c.cmd, "unexpected option")
                           : rc;
    }
    int rc = stream_check(&c, argc, argv, optind);
    if (!rc && c.line_mode && c.on_missing == ON_PASS)
        rc = cli_usage_error(c.cmd, "--on-missing-key pass with --line "
                             "would put lines that need not be JSON into "
                             "the output, whose lines are JSON; key long "
                             "lines with --line-hash instead");
    if (!rc && !r.co.cmd)
        rc = cli_usage_error(c.cmd, "say which handler to run: --exec "
                             "'CMD', e.g. --exec 'python3 handler.py'");
    if (rc)
        return rc;
    if (c.dead_letter && !r.restart_given)
        c.restarts = UINT64_MAX;  /* each message's faults are bounded */
    r.co.line_mode = c.line_mode;
    r.co.lease_ms = c.lease_ms ? c.lease_ms : 30000;
    r.co.stop = &stream_stop;
    r.co.grace_ms = c.grace_ms;
    signal(SIGPIPE, SIG_IGN);
    rc = stream_run(&c);
    return rc ? rc : r.end_rc;
}
