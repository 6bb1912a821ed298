/* error.c - names for error codes.
 *
 * Codes are small negative ints so that `if (rc < 0)` works everywhere and
 * batch outcomes can carry them per key. The text says what the code means
 * to a caller; the detail string on a handle says what happened. Both
 * the codes and their texts come from one table, IDEM_ERRNO_MAP in
 * idem.h, so that a new code cannot lack its text. */
#include "idem/idem.h"

const char *idem_strerror(int code)
{
    switch (code) {
#define IDEM__STRERROR(name, value, text)                                  \
    case IDEM_##name:                                                      \
        return "IDEM_" #name ": " text;
        IDEM_ERRNO_MAP(IDEM__STRERROR)
#undef IDEM__STRERROR
    }
    return "IDEM_E?: unknown error code";
}

const char *idem_version(void)
{
    return IDEM_VERSION_STRING;
}
