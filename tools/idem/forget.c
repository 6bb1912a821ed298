/* forget.c - `idem forget KEY`: delete a key's record, so that its next
 * message runs again. For the operator who knows an effect was undone. */

#include <string.h>

#include "keyspace.h"

static const char usage[] =
    "usage: idem forget [--store URI] [--key-space NAME] KEY\n"
    "\n"
    "Delete KEY's record: its next claim is NEW with token 1, so the next\n"
    "message with this key is processed again, and `idem dedup` lets it\n"
    "through again. Durable when the command returns. Exit status 1 if the\n"
    "key had no live record.\n"
    "\n"
    "  --key-space NAME, --job NAME\n"
    "               the key of a dedup/run job, as for `idem get`; without:\n"
    "               KEY in the shared key space\n"
    "  --store URI  default $IDEM_STORE, else " IDEM_DEFAULT_URI "\n";

int cli_cmd_forget(int argc, char **argv)
{
    cli_simple o;
    int rc = cli_simple_parse("forget", argc, argv, usage, CLI_KEY_SPACE, 1,
                              1, "KEY", &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    const char *key = argv[o.first];
    cli_buf k = {0};
    rc = ks_key_arg("forget", o.key_space, key, strlen(key), &k);
    idem_store *s = rc ? NULL : cli_open("forget", cli_store_uri(o.uri),
                                         IDEM_O_NOCREATE, 0, 0);
    if (!rc && !s)
        rc = cli_open_status();
    else if (!rc)
        rc = idem_forget(s, k.p, k.len);
    if (!rc)
        rc = idem_sync(s);
    if (rc == IDEM_ENOTFOUND)
        rc = ks_not_found("forget", o.key_space, key);
    else if (rc < 0)
        rc = cli_store_fail("forget", s, rc, key);
    cli_buf_free(&k);
    idem_close(s);
    return rc;
}
