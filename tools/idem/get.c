/* get.c - `idem get KEY`: one key's record, for a human or a script. */
#include <string.h>
#include <time.h>

#include "keyspace.h"
#include "recjson.h"

static const char usage[] =
    "usage: idem get [--store URI] [--json] [--base64] [--key-space NAME] "
    "KEY\n"
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
    "  --base64     KEY is given in base64 (as dump's \"key_base64\": keys\n"
    "               of any bytes), and the key and response are shown in\n"
    "               base64\n"
    "  --store URI  default $IDEM_STORE, else " IDEM_DEFAULT_URI "\n";

static void show_time(const char *name, int64_t ms)
{
    char when[64] = "";
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    if (gmtime_r(&t, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    printf("%-10s %s.%03dZ\n", name, when, (int)(ms % 1000));
}

/* "name  BASE64" (no quotes); 0 or -1 when out of memory. */
static int show_base64(const char *name, const void *p, size_t n)
{
    cli_buf b = {0};
    int rc = cli_buf_base64(&b, p, n);
    if (!rc)
        printf("%-10s %.*s\n", name, (int)b.len - 2, b.p + 1);
    cli_buf_free(&b);
    return rc;
}

static int show(const char *space, const cli_buf *key, int base64,
                const idem_record *r)
{
    static const char *const states[] = {"pending", "done", "failed"};
    const char *what = r->state == IDEM_STATE_DONE ? "response" : "error";
    if (space)
        printf("key space  %s\n", space);
    if (base64 && show_base64("key", key->p, key->len))
        return -1;
    if (!base64)
        printf("key        %.*s\n", (int)key->len, key->p);
    printf("state      %s%s\ntoken      %llu\n"
           "attempts   %u\n", states[r->state],
           r->released ? " (released for a retry)" : "",
           (unsigned long long)r->token, r->attempts);
    show_time("created", r->created_ms);
    show_time("expires", r->expires_ms);
    /* A released claim holds no lease: the next claim takes it at once. */
    if (r->state == IDEM_STATE_PENDING && !r->released)
        show_time("lease", r->lease_until);
    if (r->len && base64)
        return show_base64(what, r->data, r->len);
    if (r->len && cli_utf8_valid(r->data, r->len))
        printf("%-10s %.*s\n", what, (int)r->len, (const char *)r->data);
    else if (r->len)
        printf("%-10s (%zu bytes, not text; see --base64)\n", what,
               r->len);
    return 0;
}

/* KEY as typed, or decoded from base64, into raw. 0 or an exit status. */
static int key_arg(const char *key, int base64, cli_buf *raw)
{
    size_t n = strlen(key);
    if (!base64)
        return cli_buf_add(raw, key, n) ? cli_fail("get", "out of memory") : 0;
    if (cli_buf_reserve(raw, n))
        return cli_fail("get", "out of memory");
    long got = cli_base64_decode(key, n, (unsigned char *)raw->p);
    if (got < 0)
        return cli_usage_error("get", "--base64: '%s' is not base64", key);
    raw->len = (size_t)got;
    return 0;
}

int cli_cmd_get(int argc, char **argv)
{
    cli_simple o;
    int rc = cli_simple_parse("get", argc, argv, usage,
                              CLI_JSON | CLI_KEY_SPACE | CLI_BASE64, 1, 1,
                              "KEY", &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    const char *key = argv[o.first];
    cli_buf raw = {0}, k = {0}, b = {0};
    rc = key_arg(key, o.base64, &raw);
    rc = rc ? rc : ks_key_arg("get", o.key_space, raw.p, raw.len, &k);
    idem_store *s = rc ? NULL : cli_open("get", cli_store_uri(o.uri),
                                         IDEM_O_READONLY, 0, 0);
    idem_record r;
    if (!rc && !s)
        rc = cli_open_status();
    else if (!rc)
        rc = idem_get(s, k.p, k.len, &r);
    if (rc == IDEM_ENOTFOUND)
        rc = ks_not_found("get", o.key_space, key);
    else if (rc < 0)
        rc = cli_store_fail("get", s, rc, key);
    else if (!rc && o.json)
        rc = rec_to_json(&b, k.p, k.len, &r) ||
             fwrite(b.p, 1, b.len, stdout) != b.len;
    else if (!rc && show(o.key_space, &raw, o.base64, &r))
        rc = cli_fail("get", "out of memory");
    cli_buf_free(&raw);
    cli_buf_free(&k);
    cli_buf_free(&b);
    idem_close(s);
    return rc;
}
