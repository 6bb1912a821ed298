/* error.c - names for error codes.
 *
 * Codes are small negative ints so that `if (rc < 0)` works everywhere and
 * batch outcomes can carry them per key. The text says what the code means
 * to a caller; the detail string on a handle says what happened. */
#include "idem/idem.h"

#include <stddef.h>

static const char *const idem__errors[] = {
    "IDEM_OK: success",
    "IDEM_EINVAL: invalid argument",
    "IDEM_ENOMEM: out of memory",
    "IDEM_EIO: input/output error",
    "IDEM_ENOSPC: no space left on device",
    "IDEM_ENOTFOUND: no such record",
    "IDEM_ELOST: lease lost: the token no longer holds the key",
    "IDEM_ELOCKED: store is locked by another process",
    "IDEM_ECORRUPT: stored data is damaged",
    "IDEM_EKEYSIZE: key is empty or too long",
    "IDEM_EVALSIZE: value is too long",
    "IDEM_EVERSION: unknown data format version",
    "IDEM_ECOLLISION: two keys share an index hash",
    "IDEM_ECONN: cannot connect to server",
    "IDEM_ETIMEOUT: server timed out",
    "IDEM_EPROTO: unexpected reply from server",
    "IDEM_EAUTH: authentication failed",
    "IDEM_ENOTSUP: operation not supported by this store",
};

const char *idem_strerror(int code)
{
    if (code == IDEM_ECLOCK)
        return "IDEM_ECLOCK: the clock is outside what the generator can use";
    size_t i = (size_t)(code <= 0 ? -(long)code : 0);
    if (code > 0 || i >= sizeof idem__errors / sizeof idem__errors[0])
        return "IDEM_E?: unknown error code";
    return idem__errors[i];
}

const char *idem_version(void)
{
    return IDEM_VERSION_STRING;
}
