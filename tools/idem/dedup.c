/* dedup.c - `idem dedup`: each key's first occurrence, exactly once.
 *
 * The stream loop (stream.c) does the work; this file is the command's
 * face: its options, its help, and what a committed line becomes in the
 * output (the input line itself, byte for byte, with a newline added only
 * where an input that another one follows ended without one). */
#include <string.h>

#include "stream.h"

static const char usage[] =
    "usage: idem dedup (--key FIELD | --line | --line-hash) [OPTIONS] "
    "[INPUT...]\n"
    "\n"
    "Print each key's first occurrence: every input line whose key was not\n"
    "seen before, byte for byte, in input order. Keys seen before are\n"
    "duplicates, including keys stored by earlier runs (within their TTL):\n"
    "the store is persistent. INPUTs are NDJSON files; none or '-' reads\n"
    "standard input.\n"
    "\n"
    "  --key FIELD       the key: a field name (event_id), a dotted path\n"
    "                    (user.id, items.0.sku) or a JSON Pointer (/user/id).\n"
    "                    A string's value (escapes decoded) or a number as\n"
    "                    written (1.0 and 1 differ). Every line is parsed in\n"
    "                    full: a name inside a string value never matches.\n"
    "                    An escape that denotes no character (\"\\ud800\"\n"
    "                    alone) in the key or a name on its path: bad input\n"
    "  --line            the whole line is the key (a final \\r is ignored)\n"
    "  --line-hash       the key is the line's SHA-256 (without a final \\r)\n"
    "                    in 64 lowercase hex digits, as sha256sum prints\n"
    "                    it: for lines of any length (--line takes up to\n"
    "                    1024 bytes)\n"
    "  --output FILE     write here instead of standard output. Crash-proof:\n"
    "                    after kill -9, run the same command again and FILE\n"
    "                    ends byte-identical to an uninterrupted run. FILE\n"
    "                    belongs to the job: it is cut back to what the last\n"
    "                    commit recorded, and later runs append to it.\n"
    "                    FILE must not be an INPUT (by device and inode,\n"
    "                    so links count too). An existing FILE with bytes\n"
    "                    that no checkpoint of the store names is not this\n"
    "                    job's: it is refused, not cut\n"
    "  --overwrite       cut such a FILE to 0 bytes and start it over\n"
    STREAM_ENDS_HELP
    STREAM_METRICS_HELP
    "  --job NAME        name of the checkpoint (default: from --output), so\n"
    "                    that several jobs can share one store\n"
    "  --key-space NAME  where the job's keys are kept (default: the --job\n"
    "                    name, else the --output file's real path, else\n"
    "                    dedup): keys belong to their job, and jobs (or\n"
    "                    workers of one job) giving the same NAME share them\n"
    "  --shared-keys     keep the keys in the shared key space: the keys of\n"
    "                    the library and of idem before key spaces. Add it\n"
    "                    to a job started by an older idem to keep its\n"
    "                    history; a job with a checkpoint says so itself\n"
    "  --store URI       local:DIR, mem:, redis://..., redis-cluster://...\n"
    "                    or redis-sentinel://... (default $IDEM_STORE, else\n"
    "                    " IDEM_DEFAULT_URI ")\n"
    "  --ttl DURATION    how long a key is remembered: 30s, 5m, 24h, 7d\n"
    "                    (default 24h)\n"
    "  --on-missing-key error|skip|pass\n"
    "                    a line without the key field (or whose key is not\n"
    "                    a string/number, or is empty or over 1024 bytes\n"
    "                    less its key space's name and 2):\n"
    "                    stop with FILE:LINE:COL (default), skip it, or pass\n"
    "                    it to the output unchanged. Skips are counted\n"
    "  --on-bad-input error|skip\n"
    "                    a line that is not valid JSON, or whose key holds\n"
    "                    an escape that denotes no character: stop\n"
    "                    (default) or skip it\n"
    "  --batch N         lines per commit (default 65536). A pipe that goes\n"
    "                    quiet commits at once, whatever N\n"
    "  --lease DURATION  on Redis: how long a batch's claims are held\n"
    "                    before its lines are written; after a crash they\n"
    "                    hold up a rerun, or another worker, this long\n"
    "                    (default 30s)\n"
    "  --grace DURATION  accepted as for run; dedup has no handler to wait\n"
    "                    for: the batch being committed always finishes\n"
    "  --quiet           no progress, warnings or summary\n"
    "  --stats-json      the summary as one JSON object on stderr\n"
    "\n"
    "Blank lines are skipped. A line counts once its newline is there: an\n"
    "unterminated last line of the last INPUT is left unread (with a\n"
    "notice), as a writer may still be adding to it; a later run reads it\n"
    "once it ends with a newline. Exit status: 0 done, 1 stopped by an\n"
    "error (everything before it is committed: rerun to resume), 2 bad\n"
    "usage, 3 read to the end, but some keys were refused by the store or\n"
    "lost to another worker, or a message too large for a NATS --to was\n"
    "written as a marker (each is named on stderr).\n"
    "\n"
    "SIGTERM or SIGINT (Ctrl-C) stops gracefully: no more lines are taken\n"
    "(a wait for input ends), what was read is committed, and idem exits\n"
    "0 (SIGTERM) or 130 (SIGINT); the same command goes on from there. A\n"
    "second signal ends idem at once, as kill -9 would: nothing committed\n"
    "is lost, and the next run redoes the rest.\n"
    "\n"
    "Examples:\n"
    "  idem dedup --key event_id --output unique.ndjson events.ndjson\n"
    "  kafkacat -C -t orders | idem dedup --key /order/id > fresh.ndjson\n"
    "  idem dedup --line --ttl 7d --store local:/var/lib/idem seen.txt\n";

static int emit_line(void *ctx, stream *st, const idem_msg *msgs,
                     const idem_msg *m, const nd_line *l)
{
    (void)ctx;
    (void)msgs;
    if (m && m->result != IDEM_MSG_DONE)
        return 0;
    cli_buf *b = &st->job.obuf;
    return cli_buf_add(b, l->p, l->len) || cli_buf_add(b, "\n", 1);
}

int cli_cmd_dedup(int argc, char **argv)
{
    static const struct option opts[] = {STREAM_LONGOPTS, {0, 0, 0, 0}};
    stream_cfg c = {.cmd = "dedup", .batch = 65536, .emit = emit_line,
                    .commit_interval_ms = -1};
    int ch;
    while ((ch = cli_getopt(c.cmd, argc, argv, opts)) != -1) {
        if (ch == 'h') {
            fputs(usage, stdout);
            return 0;
        }
        int rc = ch == '?' ? 2 : stream_opt(&c, ch, optarg);
        if (rc)
            return rc == 1 ? cli_usage_error(c.cmd, "unexpected option")
                           : rc;
    }
    int rc = stream_check(&c, argc, argv, optind);
    return rc ? rc : stream_run(&c);
}
