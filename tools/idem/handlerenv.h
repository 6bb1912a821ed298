/* handlerenv.h - the handler's environment: idem's, less its secrets. */
#ifndef IDEM_HANDLERENV_H
#define IDEM_HANDLERENV_H

/* A NULL-terminated copy of environ's pointers without the entries that
 * carry a store password (IDEM_REDIS_PASSWORD; IDEM_STORE when its URI
 * holds one), for execve(). The strings stay environ's: free only the
 * array, with free(). NULL when out of memory. */
char **handler_env_new(void);

#endif
