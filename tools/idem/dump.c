/* dump.c - `idem dump`: every live record as NDJSON, for backups,
 * migrations between stores, and looking at a store with jq. */
#include <errno.h>
#include <string.h>

#include "recjson.h"

static const char usage[] =
    "usage: idem dump [--store URI] [--output FILE]\n"
    "\n"
    "Write every live record as one JSON line (see `idem get --json`), in\n"
    "no particular order, to FILE or standard output. Keys and responses\n"
    "that are not UTF-8 text are written in base64 (key_base64,\n"
    "response_base64), so `idem load` restores every byte. A dedup/run\n"
    "job's key is written as the job found it, beside its \"key_space\".\n"
    "Checkpoints of dedup/run jobs are not records and are not dumped.\n"
    "\n"
    "  --output FILE  default standard output\n"
    "  --store URI    default $IDEM_STORE, else " IDEM_DEFAULT_URI "\n";

typedef struct dump_ctx {
    FILE *f;
    cli_buf b;
    unsigned long long n;
} dump_ctx;

static int dump_one(void *ctx, const void *key, size_t keylen,
                    const idem_record *r)
{
    dump_ctx *d = ctx;
    d->b.len = 0;
    if (rec_to_json(&d->b, key, keylen, r) ||
        fwrite(d->b.p, 1, d->b.len, d->f) != d->b.len)
        return 1;
    d->n++;
    return 0;
}

int cli_cmd_dump(int argc, char **argv)
{
    static const struct option opts[] = {{"store", 1, 0, 's'},
                                         {"output", 1, 0, 'o'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *uri = NULL, *out = NULL;
    int ch;
    while ((ch = cli_getopt("dump", argc, argv, opts)) != -1) {
        if (ch == '?')
            return 2;
        if (ch == 'h')
            return fputs(usage, stdout) < 0;
        if (ch == 's')
            uri = optarg;
        else
            out = optarg;
    }
    if (optind < argc)
        return cli_usage_error("dump", "unexpected argument '%s'; write to "
                               "a file with --output FILE", argv[optind]);
    idem_store *s = cli_open("dump", cli_store_uri(uri), IDEM_O_READONLY, 0,
                             0);
    if (!s)
        return cli_open_status();
    dump_ctx d = {out ? fopen(out, "w") : stdout, {0}, 0};
    int rc = d.f ? idem_scan(s, dump_one, &d) : -1;
    if (d.f && ((d.f != stdout && fclose(d.f)) || fflush(stdout)))
        rc = -1;
    if (rc == 1 || rc == -1)
        rc = cli_fail("dump", "writing %s: %s", out ? out : "standard output",
                      strerror(errno));
    else if (rc)
        rc = cli_store_fail("dump", s, rc, "listing the records");
    else
        fprintf(stderr, "idem dump: %llu records\n", d.n);
    cli_buf_free(&d.b);
    idem_close(s);
    return rc;
}
