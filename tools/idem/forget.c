/* forget.c - `idem forget KEY`: delete a key's record, so that its next
 * message runs again. For the operator who knows an effect was undone. */
#include <string.h>

#include "cli.h"

static const char usage[] =
    "usage: idem forget [--store URI] KEY\n"
    "\n"
    "Delete KEY's record: its next claim is NEW with token 1, so the next\n"
    "message with this key is processed again, and `idem dedup` lets it\n"
    "through again. Durable when the command returns. Exit status 1 if the\n"
    "key had no live record.\n"
    "\n"
    "  --store URI  default $IDEM_STORE, else local:./idem-data\n";

int idem_cmd_forget(int argc, char **argv)
{
    cli_simple o;
    int rc = cli_simple_parse("forget", argc, argv, usage, 0, 1, 1, "KEY",
                              &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    const char *key = argv[o.first];
    idem_store *s = cli_open("forget", cli_store_uri(o.uri),
                             IDEM_O_NOCREATE, 0, 0);
    if (!s)
        return 1;
    rc = idem_forget(s, key, strlen(key));
    if (!rc)
        rc = idem_sync(s);
    if (rc == IDEM_ENOTFOUND)
        rc = cli_fail("forget", "no live record for key '%s'", key);
    else if (rc)
        rc = cli_store_fail("forget", s, rc, key);
    idem_close(s);
    return rc;
}
