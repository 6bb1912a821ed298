/* handlerenv.h - the handler's environment: idem's, less its secrets. */
#ifndef IDEM_HANDLERENV_H
#define IDEM_HANDLERENV_H

/* A NULL-terminated copy of environ's pointers without the entries that
 * carry a store password (IDEM_REDIS_PASSWORD; IDEM_STORE when its URI
 * holds one), for execve(). The strings stay environ's: free only the
 * array, with free(). NULL when out of memory. */
char **handler_env_new(void);

/* Before any thread starts: move the same entries' strings to the heap
 * (getenv() still finds them) and clear them in the block the kernel
 * shows as /proc/PID/environ, which the handler, as idem's user, can
 * read for idem and for the watcher it forks. -1 when out of memory. */
int handler_env_hide(void);

#endif
