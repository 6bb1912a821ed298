/* cli.h - the subcommands of the idem tool and the pieces they share.
 *
 * Each subcommand lives in its own file and exposes one function with the
 * shape of main(): argv[0] is the subcommand's name, and the return value
 * is the process exit status (below). main.c maps names to these
 * functions. Every message starts with "idem CMD: " so that a script
 * running several commands can tell who spoke. */
#ifndef IDEM_CLI_H
#define IDEM_CLI_H

#include <getopt.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "idem/idem.h"

/* Exit statuses, the same for every subcommand. */
enum {
    CLI_EXIT_OK = 0,   /* done */
    CLI_EXIT_FAIL = 1, /* the work failed: I/O, a store error, bad input
                         * under --on-bad-input error, damage found, ... */
    CLI_EXIT_USAGE = 2, /* the command line was wrong; nothing was done */
    CLI_EXIT_PARTIAL = 3 /* run, dedup: the input was read to its end,
                           * but some messages were not done here (their
                           * key was lost to another worker, or refused
                           * by the store, or run gave up on them after
                           * --max-attempts retryable failures, or a
                           * marker took their output's place): each
                           * was named or counted on stderr */
};

int cli_cmd_bench(int argc, char **argv);
int cli_cmd_keygen(int argc, char **argv);
int cli_cmd_dedup(int argc, char **argv);
int cli_cmd_run(int argc, char **argv);
int cli_cmd_get(int argc, char **argv);
int cli_cmd_forget(int argc, char **argv);
int cli_cmd_stats(int argc, char **argv);
int cli_cmd_sweep(int argc, char **argv);
int cli_cmd_check(int argc, char **argv);
int cli_cmd_repair(int argc, char **argv);
int cli_cmd_dump(int argc, char **argv);
int cli_cmd_load(int argc, char **argv);
int cli_cmd_reset(int argc, char **argv);

/* ------------------------------------------------------------------------
 * opts.c: option parsing with messages that say what to type instead. */

#define CLI_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* Print "idem CMD: MESSAGE" and "try `idem CMD --help`" on stderr;
 * returns 2, the exit status of bad usage. */
int cli_usage_error(const char *cmd, const char *fmt, ...) CLI_PRINTF(2, 3);

/* Print "idem CMD: MESSAGE" on stderr; returns 1. */
int cli_fail(const char *cmd, const char *fmt, ...) CLI_PRINTF(2, 3);
/* The MESSAGE of the last cli_fail() ("" before any; up to 511 bytes). */
const char *cli_last_error(void);

/* getopt_long with our own messages: an unknown option is named with the
 * closest known one ("did you mean --key?"), a missing argument says
 * which. Returns the option's value, -1 at the end of the options, or
 * '?' after printing the message (the caller returns 2). */
int cli_getopt(const char *cmd, int argc, char **argv,
               const struct option *opts);
/* The same with short options besides -h: shorts as getopt's optstring,
 * starting with ':' (":n:h"). */
int cli_getopt_short(const char *cmd, int argc, char **argv,
                     const char *shorts, const struct option *opts);

/* "30s", "5m", "24h", "7d", "250ms"; a bare number is seconds. > 0.
 * cli_parse_duration says nothing and returns -1 for a bad one. */
int cli_parse_duration(const char *arg, int64_t *ms);
int cli_duration(const char *cmd, const char *opt, const char *arg,
                 int64_t *ms);

/* Unix milliseconds (1704067200000) or an ISO 8601 date (2024-01-01, UTC)
 * or time with its zone (2024-01-01T09:00:00+09:00, ...Z), from 1970 on.
 * A time without a zone is refused: guessing one is how times end up an
 * hour off. */
int cli_time(const char *cmd, const char *opt, const char *arg,
             int64_t *ms);

/* A whole number in [lo, hi]. */
int cli_number(const char *cmd, const char *opt, const char *arg,
               uint64_t lo, uint64_t hi, uint64_t *out);

/* One of the NULL-terminated choices; *out is its index. */
int cli_choice(const char *cmd, const char *opt, const char *arg,
               const char *const *choices, int *out);

/* The options of the small commands (get, forget, stats, ...): --store,
 * --help, and as `flags` say, --json (CLI_JSON), --format NAME
 * (CLI_FORMAT: the caller checks NAME), --job NAME or
 * --key-space NAME (CLI_KEY_SPACE; both give the key space) and
 * --key-spaces (CLI_PER_SPACE: count per key space), --base64
 * (CLI_BASE64: bytes shown in base64). Positional
 * arguments must number from min to max; `args` names them for messages
 * ("KEY"). Returns 0 (then *first is the index of the first positional),
 * -1 after --help (exit 0), or 2. */
enum { CLI_JSON = 1, CLI_KEY_SPACE = 2, CLI_PER_SPACE = 4, CLI_BASE64 = 8,
       CLI_FORMAT = 16 };

typedef struct cli_simple {
    const char *uri;
    int json;
    const char *key_space;  /* NULL: the shared key space */
    int per_space;          /* --key-spaces */
    int base64;             /* --base64 */
    const char *format;     /* --format NAME (CLI_FORMAT), or NULL */
    int first;
} cli_simple;

int cli_simple_parse(const char *cmd, int argc, char **argv,
                     const char *usage, unsigned flags, int min, int max,
                     const char *args, cli_simple *out);

/* The store URI: --store, else $IDEM_STORE, else IDEM_DEFAULT_URI. */
const char *cli_store_uri(const char *given);

/* uri as messages and reports show it: its password hidden
 * (idem_uri_display()). Valid until the next call. */
const char *cli_shown_uri(const char *uri);

/* Does uri hold a password or token, i.e. does its display differ from
 * it? "" (the default store) holds none; 1 when out of memory (unsure:
 * treated as a secret). */
int cli_uri_has_secret(const char *uri);

/* Before anything reads argv: for each argument that holds a URI with a
 * password (alone or after "--OPTION="), point argv[i] at a heap copy
 * and overwrite the original bytes, which `ps` shows, with the URI as
 * messages show it (argvhide.c). -1 when out of memory. */
int cli_argv_hide(int argc, char **argv);

/* Open a store, or print why not (with what to do about it) and return
 * NULL; print what idem_warning() has to say. flags as
 * idem_opts.flags; ttl_ms/lease_ms 0 for defaults. */
idem_store *cli_open(const char *cmd, const char *uri, unsigned flags,
                     int64_t ttl_ms, int64_t lease_ms);
/* The same with every option given. */
idem_store *cli_open_with(const char *cmd, const char *uri,
                          const idem_opts *o);
/* The exit status after cli_open() or cli_open_with() returned NULL:
 * 2 when the --store URI itself was wrong (a usage error), else 1. */
int cli_open_status(void);

/* Print "idem CMD: what: detail of s" and return 1. */
int cli_store_fail(const char *cmd, idem_store *s, int rc, const char *what);

/* ------------------------------------------------------------------------
 * jsonout.c: JSON text out, base64 for bytes that are not text. */

/* A growable buffer. Appends return 0, or -1 when out of memory. */
typedef struct cli_buf {
    char *p;
    size_t len, cap;
} cli_buf;

/* Make room for n more bytes past len. */
int cli_buf_reserve(cli_buf *b, size_t n);
/* Append p[0..n). Inline because a stream entry's line, its fields and
 * its output are built from dozens of appends of a few bytes each
 * (quotes, separators, names, values), where a call per append cost
 * more than the copying: the room check is all most of them need. */
static inline int cli_buf_add(cli_buf *b, const void *p, size_t n)
{
    if (n > b->cap - b->len && cli_buf_reserve(b, n))
        return -1;
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}
int cli_buf_str(cli_buf *b, const char *s);
int cli_buf_fmt(cli_buf *b, const char *fmt, ...) CLI_PRINTF(2, 3);
/* s[0..n), valid UTF-8, as a quoted JSON string. */
int cli_buf_json_string(cli_buf *b, const void *s, size_t n);
/* s[0..n) in base64 (RFC 4648, with padding), quoted. */
int cli_buf_base64(cli_buf *b, const void *s, size_t n);
/* The member "text_name":"s as a string" when s[0..n) is valid UTF-8,
 * else "b64_name":"s in base64". */
int cli_buf_bytes_member(cli_buf *b, const char *text_name,
                         const char *b64_name, const void *s, size_t n);
/* The member "name":s when s[0..n) is one JSON value without a line
 * break (as YAJL checks it: RFC 8259, UTF-8 included); else the bytes as
 * "name_text" or "name_base64" (cli_buf_bytes_member). */
int cli_buf_json_member(cli_buf *b, const char *name, const void *s, size_t n);
/* 1 if s[0..n) is one JSON value without a line break, 0 if not, -1
 * when out of memory. */
int cli_json_one_line(const void *s, size_t n);
void cli_buf_free(cli_buf *b);

/* Monotonic time (clock.c): for intervals, never for dates. */
int64_t cli_mono_ms(void);
double cli_mono_s(void);

/* The test suite's hook (killpoint.c): with IDEM_TEST_KILL_AT=NAME[:N],
 * SIGKILL the Nth time the point NAME is passed. */
void cli_kill_point(const char *name);

/* Does a member of process group pgid still run (zombies do not count)?
 * (procgroup.c) */
int cli_group_runs(pid_t pgid);

/* Is s[0..n) valid UTF-8 (so JSON can carry it as a string)? */
int cli_utf8_valid(const void *s, size_t n);

/* Decode base64 s[0..n) into out (room for n * 3 / 4 bytes); the decoded
 * length, or -1 if s is not base64. */
long cli_base64_decode(const char *s, size_t n, unsigned char *out);

#endif
