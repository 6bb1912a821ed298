/* argvhide.c - passwords out of idem's command line, as `ps` shows it.
 *
 * `--store redis://:pw@host` or `--from nats://user:pw@host/S` puts a
 * secret in argv, and the kernel shows every process's argv to every
 * local user (/proc/PID/cmdline, `ps`). password_file= and the
 * environment keep it off the command line, but a user who typed it
 * there should not have to know that. So before anything else runs,
 * each argument that holds such a URI (alone, or as the value of
 * --OPTION=URI) is copied to the heap for the option parser, and its
 * bytes in the block the kernel reads are overwritten with the URI as
 * messages show it (idem_uri_display(): "redis://:***@host"), cut to
 * the original's length and padded with NULs.
 *
 * What is left: the secret is visible from exec until main() starts
 * (microseconds), and to anyone who reads the process's memory, which
 * only its own user and root can. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The part of arg a URI may be: past "--OPTION=" when it has one. */
static char *uri_part(char *arg)
{
    char *eq = arg[0] == '-' && arg[1] == '-' ? strchr(arg, '=') : NULL;
    return eq ? eq + 1 : arg;
}

/* Overwrite uri in place with its display, cut to uri's length: the
 * display holds no password, so neither does any prefix of it. Without
 * memory for the display, the bytes are cleared and nothing is shown. */
static void overwrite(char *uri)
{
    size_t len = strlen(uri);
    size_t n = idem_uri_display(uri, NULL, 0);
    char *shown = malloc(n + 1);
    if (shown)
        idem_uri_display(uri, shown, n + 1);
    memset(uri, 0, len);
    if (shown)
        memcpy(uri, shown, n < len ? n : len);
    free(shown);
}

int cli_argv_hide(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char *uri = uri_part(argv[i]);
        if (!cli_uri_has_secret(uri))
            continue;
        char *copy = strdup(argv[i]);
        if (!copy)
            return -1;
        overwrite(uri);
        argv[i] = copy;  /* the parser's, until idem exits */
    }
    return 0;
}
