/* handlerenv.c - the environment a handler starts with: idem's, less
 * its secrets.
 *
 * The handler of `idem run` is any program, and it starts programs of
 * its own; none of them needs the store's credentials, since the store
 * is idem's alone. A password handed to idem through the environment
 * ($IDEM_REDIS_PASSWORD, $IDEM_NATS_PASSWORD, $IDEM_NATS_TOKEN, or
 * $IDEM_STORE naming a URI with a password)
 * would otherwise be inherited by the whole tree: readable in
 * /proc/PID/environ, printed by a debug `env`, copied into a crash
 * report. So it is left out of what the handler gets.
 *
 * The array is built in the parent, before fork(): idem has threads, so
 * its child may only make async-signal-safe calls until it execs, which
 * rules out unsetenv() (it locks, and may free) and leaves execve() with
 * an array made beforehand. Only the array is new: its strings are
 * environ's, which nothing changes while idem runs.
 *
 * Leaving it out of the handler's environment is not enough. The kernel
 * shows a process's environment as it was at exec, from the process's
 * own memory (/proc/PID/environ, `ps e`), and the handler runs as idem's
 * user: it reads idem's, and that of the watcher in its own process
 * group (a fork of idem, coproc.c). unsetenv() would not change what is
 * shown. So `run` first moves each secret to the heap and clears its
 * bytes where the kernel looks (handler_env_hide). */
#include "handlerenv.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"

extern char **environ;

static int has_prefix(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

/* Does the environment entry "NAME=VALUE" carry a password or token
 * (the store's, or a stream's: NATS takes its own)? */
static int secret(const char *entry)
{
    static const char store[] = "IDEM_STORE=";
    return has_prefix(entry, "IDEM_REDIS_PASSWORD=") ||
           has_prefix(entry, "IDEM_NATS_PASSWORD=") ||
           has_prefix(entry, "IDEM_NATS_TOKEN=") ||
           (has_prefix(entry, store) &&
            cli_uri_has_secret(entry + sizeof store - 1));
}

char **handler_env_new(void)
{
    size_t n = 0;
    while (environ && environ[n])
        n++;
    char **env = malloc((n + 1) * sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!secret(environ[i]))
            env[k++] = environ[i];
    env[k] = NULL;
    return env;
}

int handler_env_hide(void)
{
    for (size_t i = 0; environ && environ[i]; i++) {
        if (!secret(environ[i]))
            continue;
        char *copy = strdup(environ[i]);
        if (!copy)
            return -1;
        char *value = strchr(environ[i], '=') + 1;
        memset(value, 0, strlen(value));
        environ[i] = copy;  /* kept for getenv() until idem exits */
    }
    return 0;
}
