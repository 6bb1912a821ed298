/* get.c - `idem get KEY`: one key's record, for a human or a script. */
#include <time.h>

#include "keyspace.h"
#include "recjson.h"

static const char usage[] =
    "usage: idem get [--store URI] [--json] [--key-space NAME] KEY\n"
    "\n"
    "Show the live record of KEY: its state (pending, done, failed), token\n"
    "(also the number of claims made), when it was created and expires, and\n"
    "the cached response or error. Exit status 1 if the key has no live\n"
    "record (never seen, expired or forgotten).\n"
    "\n"
    "  --key-space NAME, --job NAME\n"
    "               the key of a dedup/run job: its key space is its\n"
    "               --key-space, else its --job name, else `dedup` or `run`\n"
    "               (`idem dump` shows each record's). Without: KEY in the\n"
    "               shared key space (--shared-keys jobs, the library, and\n"
    "               versions of idem before key spaces)\n"
    "  --json       one JSON line, as `idem dump` writes it\n"
    "  --store URI  default $IDEM_STORE, else local:./idem-data\n";

static void show_time(const char *name, int64_t ms)
{
    char when[64] = "";
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    printf("%-10s %s.%03dZ\n", name, when, (int)(ms % 1000));
}

static void show(const char *space, const char *key, const idem_record *r)
{
    static const char *const states[] = {"pending", "done", "failed"};
    if (space)
        printf("key space  %s\n", space);
    printf("key        %s\nstate      %s%s\ntoken      %llu\n"
           "attempts   %u\n", key, states[r->state],
           r->released ? " (released for a retry)" : "",
           (unsigned long long)r->token, r->attempts);
    show_time("created", r->created_ms);
    show_time("expires", r->expires_ms);
    if (r->state == IDEM_PENDING)
        show_time("lease", r->lease_until);
    if (r->len && utf8_valid(r->data, r->len))
        printf("%-10s %.*s\n", r->state == IDEM_DONE ? "response" : "error",
               (int)r->len, (const char *)r->data);
    else if (r->len)
        printf("%-10s (%zu bytes, not text; see --json)\n",
               r->state == IDEM_DONE ? "response" : "error", r->len);
}

int idem_cmd_get(int argc, char **argv)
{
    cli_simple o;
    int rc = cli_simple_parse("get", argc, argv, usage,
                              CLI_JSON | CLI_KEY_SPACE, 1, 1, "KEY", &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    const char *key = argv[o.first];
    cli_buf k = {0}, b = {0};
    rc = ks_key_arg("get", o.key_space, key, &k);
    idem_store *s = rc ? NULL : cli_open("get", cli_store_uri(o.uri),
                                         IDEM_O_READONLY, 0, 0);
    idem_record r;
    if (!rc && !s)
        rc = 1;
    else if (!rc)
        rc = idem_get(s, k.p, k.len, &r);
    if (rc == IDEM_ENOTFOUND)
        rc = ks_not_found("get", o.key_space, key);
    else if (rc < 0)
        rc = cli_store_fail("get", s, rc, key);
    else if (!rc && o.json)
        rc = rec_to_json(&b, k.p, k.len, &r) ||
             fwrite(b.p, 1, b.len, stdout) != b.len;
    else if (!rc)
        show(o.key_space, key, &r);
    buf_free(&k);
    buf_free(&b);
    idem_close(s);
    return rc;
}
