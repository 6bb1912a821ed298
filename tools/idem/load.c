/* load.c - `idem load`: records written by `idem dump` back into a store.
 *
 * Records are written as they were (token, times, state, response) with
 * idem_import(), not replayed through claims, which would renumber tokens
 * and restart every TTL. A record already expired is skipped. By default
 * a key that already has a live record in the target keeps it: a store in
 * use knows better than an old dump. */
#include <inttypes.h>
#include <string.h>

#include "ndjson.h"
#include "recjson.h"

static const char usage[] =
    "usage: idem load [--store URI] [--replace] [INPUT...]\n"
    "\n"
    "Import records from NDJSON files written by `idem dump` (none or '-':\n"
    "standard input), with their tokens, times and responses. Expired\n"
    "records are skipped. A key that already has a live record keeps it,\n"
    "unless --replace. Keys and responses are bytes: every one comes back\n"
    "as dumped, NUL and bytes that are not UTF-8 included. A line that is\n"
    "not a record stops the load with FILE:LINE and the field at fault\n"
    "(FILE:LINE: field \"fingerprint\": ...), or FILE:LINE:COLUMN of bad\n"
    "JSON, on one line: an unknown or repeated\n"
    "field, a value of the wrong type, a fingerprint that is not 32 hex\n"
    "digits, a token of 0, created_ms after expires_ms, an expiry or lease\n"
    "further from now than the longest TTL (100 years). What came before\n"
    "it is committed.\n"
    "\n"
    "  --replace    overwrite live records of the same keys\n"
    "  --store URI  default $IDEM_STORE, else " IDEM_DEFAULT_URI "\n";

typedef struct load_ctx {
    idem_store *s;
    int replace;
    uint64_t loaded, kept;
    cli_buf scratch;
} load_ctx;

static int load_line(load_ctx *c, nd_reader *rd, const nd_line *l)
{
    char err[256], col[32] = "";
    const void *key;
    size_t keylen, at;
    idem_record r, cur;
    if (rec_from_json(l->p, l->len, &c->scratch, &key, &keylen, &r, err,
                      sizeof err, &at)) {
        if (at)
            snprintf(col, sizeof col, ":%zu", at);
        return cli_fail("load", "%s:%" PRIu64 "%s: %s", nd_name(rd),
                        l->lineno, col, err);
    }
    if (!c->replace && idem_get(c->s, key, keylen, &cur) == 0) {
        c->kept++;
        return 0;
    }
    int rc = idem_import(c->s, key, keylen, &r);
    if (rc)
        return cli_fail("load", "%s:%" PRIu64 ": %s", nd_name(rd), l->lineno,
                        idem_errdetail(c->s));
    c->loaded++;
    return 0;
}

static int load_all(load_ctx *c, nd_reader *rd)
{
    for (;;) {
        nd_line l;
        int rc = nd_next(rd, &l, 1);
        if (rc == ND_END)
            return 0;
        if (rc == ND_ERR)
            return cli_fail("load", "%s", rd->err);
        if (rc != ND_LINE) {
            nd_release(rd);
            if ((rc = idem_sync(c->s)) != 0)
                return cli_store_fail("load", c->s, rc, "commit");
            continue;
        }
        if (l.len && load_line(c, rd, &l))
            return 1;
    }
}

int cli_cmd_load(int argc, char **argv)
{
    static const struct option opts[] = {{"store", 1, 0, 's'},
                                         {"replace", 0, 0, 'r'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    load_ctx c = {0};
    const char *uri = NULL;
    int ch;
    while ((ch = cli_getopt("load", argc, argv, opts)) != -1) {
        if (ch == '?')
            return 2;
        if (ch == 'h')
            return fputs(usage, stdout) < 0;
        if (ch == 's')
            uri = optarg;
        else
            c.replace = 1;
    }
    nd_reader rd;
    if (nd_open(&rd, argv + optind, (size_t)(argc - optind), 0, 0, 0)) {
        int rc = cli_fail("load", "%s", rd.err);
        nd_close(&rd);
        return rc;
    }
    c.s = cli_open("load", cli_store_uri(uri), 0, 0, 0);
    int rc = c.s ? load_all(&c, &rd) : cli_open_status();
    int rc2 = c.s ? idem_sync(c.s) : 0;
    if (!rc && rc2)
        rc = cli_store_fail("load", c.s, rc2, "commit");
    if (!rc)
        fprintf(stderr, "idem load: %" PRIu64 " records loaded, %" PRIu64
                " kept (the store had them)\n", c.loaded, c.kept);
    idem_close(c.s);
    nd_close(&rd);
    cli_buf_free(&c.scratch);
    return rc;
}
