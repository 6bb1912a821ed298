/* linehash.c - --line-hash: a line too long to be a key is keyed by its
 * SHA-256.
 *
 * With --line the whole line is the key, which fails for lines longer
 * than IDEM_KEY_MAX. --line-hash keys every line (not only the long ones,
 * so that a line's key never depends on its length) by the SHA-256 of its
 * bytes, without a final \r as --line has it, written as 64 lowercase hex
 * digits: the same text `sha256sum` prints, readable in `idem get` and
 * `idem dump`, and typed back as an argument. SHA-256 rather than a fast
 * hash because lines come from outside: nobody can make two lines share
 * a key on purpose (2^128 work), where a 128-bit XXH3 could be forced.
 *
 * The digest is the library's, through its public bizkey API (keys.h), so
 * that the CLI carries no second copy of the OpenSSL plumbing: a bizkey
 * with 64 hex digits ends with the whole SHA-256 of its payload, and the
 * fixed "l:h:" before it is dropped. */
#include "linehash.h"

#include <string.h>

#include "cli.h"

#define LH_PREFIX "l:h:"

idem_bizkey_gen *lh_new(const char *cmd)
{
    idem_bizkey_opts o;
    idem_bizkey_opts_init(&o);
    o.hash_len = LH_KEY_LEN;
    idem_bizkey_gen *g;
    int rc = idem_bizkey_gen_new(&o, &g);
    if (!rc)
        return g;
    cli_fail(cmd, "--line-hash: %s", idem_bizkey_gen_errdetail(g));
    idem_bizkey_gen_free(g);
    return NULL;
}

int lh_key(idem_bizkey_gen *g, const char *cmd, const char *line, size_t n,
           char key[LH_KEY_LEN])
{
    char out[sizeof LH_PREFIX + LH_KEY_LEN];
    if (idem_bizkey_gen_make(g, "l", "h", line, n, out, sizeof out, NULL))
        return cli_fail(cmd, "--line-hash: %s", idem_bizkey_gen_errdetail(g));
    memcpy(key, out + strlen(LH_PREFIX), LH_KEY_LEN);
    return 0;
}
