/* keyspace.c - each CLI job's keys apart from every other job's.
 *
 * Two jobs on one store must not see each other's keys: `dedup --job
 * events --key event_id` and `dedup --job orders --key order_id` both meet
 * the key "42", and the second must not drop its 42 as a duplicate. So a
 * job's key is stored as
 *
 *   US NAME US KEY          (US: the byte 0x1f, ASCII's unit separator)
 *
 * where NAME is its key space (--key-space, else the --job name, else the
 * real path of the --output file, which names the job, else the
 * command's name). NAME is text without control characters, so the
 * second US ends it, whatever bytes KEY holds, and two key spaces never
 * share a stored key. US rather than NUL keeps stored keys usable as C
 * strings and command-line arguments (redis-cli, xargs), and text keys
 * do not start with it: JSON must escape it. The shared key space
 * (--shared-keys) stores KEY as it is: that is where the library's keys
 * and the keys of idem versions before key spaces live, so an existing
 * deployment keeps its history by naming it. A stored key reads as being
 * in a key space when it has the form above with a NAME that ks_set()
 * accepts; a key written through the library that happens to have that
 * form reads the same way (and stays exact through dump and load).
 *
 * The prefix costs the key limit its length: a job's own key may hold
 * IDEM_KEY_MAX - 2 - strlen(NAME) bytes, and the message says so.
 *
 * Only the store sees the prefix: the handler, the output lines and
 * the messages get the key as the job found it. */
#include "keyspace.h"

#include <string.h>

#define SEP '\x1f'

/* 1 to KS_NAME_MAX bytes of UTF-8 text without control characters. */
static int good_name(const char *name, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return 0;
    return n > 0 && n <= KS_NAME_MAX && cli_utf8_valid(name, n);
}

int ks_set(key_space *ks, const char *name)
{
    memset(ks, 0, sizeof *ks);
    if (!name)
        return 0;
    size_t n = strlen(name);
    if (!good_name(name, n))
        return -1;
    ks->name = name;
    ks->prefix[0] = ks->prefix[n + 1] = SEP;
    memcpy(ks->prefix + 1, name, n);
    ks->len = n + 2;
    return 0;
}

int ks_bad_size(const key_space *ks, size_t klen, char *what, size_t n)
{
    size_t max = IDEM_KEY_MAX - ks->len;
    if (klen > 0 && klen <= max)
        return 0;
    if (ks->name)
        snprintf(what, n, "the key is %zu bytes; keys in key space '%s' "
                 "are 1 to %zu bytes (%u with the key space's name)", klen,
                 ks->name, max, IDEM_KEY_MAX);
    else
        snprintf(what, n, "the key is %zu bytes; keys are 1 to %u bytes",
                 klen, IDEM_KEY_MAX);
    return 1;
}

int ks_add(cli_buf *b, const key_space *ks, const void *key, size_t len)
{
    return cli_buf_add(b, ks->prefix, ks->len) || cli_buf_add(b, key, len);
}

void ks_split(const void *stored, size_t len, const char **name,
              size_t *namelen, const void **key, size_t *keylen)
{
    const char *p = stored;
    const char *end = len > 2 && p[0] == SEP
                          ? memchr(p + 1, SEP, len - 1 < KS_NAME_MAX + 1
                                                   ? len - 1
                                                   : KS_NAME_MAX + 1)
                          : NULL;
    size_t n = end ? (size_t)(end - p - 1) : 0;
    if (!end || end + 1 == p + len || !good_name(p + 1, n)) {
        *name = NULL;
        *namelen = 0;
        *key = stored;
        *keylen = len;
        return;
    }
    *name = p + 1;
    *namelen = n;
    *key = end + 1;
    *keylen = len - n - 2;
}

static void shift_tasks(idem_task *tasks, size_t n, ptrdiff_t by)
{
    for (size_t i = 0; i < n; i++) {
        tasks[i].key = (const char *)tasks[i].key + by;
        tasks[i].keylen = (size_t)((ptrdiff_t)tasks[i].keylen - by);
    }
}

int ks_handle(const key_space *ks, idem_handler_fn fn, void *ctx,
              idem_task *tasks, size_t n)
{
    shift_tasks(tasks, n, (ptrdiff_t)ks->len);
    int rc = fn(ctx, tasks, n);
    shift_tasks(tasks, n, -(ptrdiff_t)ks->len);
    return rc;
}

idem_msg ks_user_msg(const key_space *ks, const idem_msg *m)
{
    idem_msg u = *m;
    u.key = (const char *)m->key + ks->len;
    u.keylen -= ks->len;
    return u;
}

int ks_is(const key_space *ks, const char *name, size_t len)
{
    if (!ks->name || !name)
        return !ks->name && !name;
    return len == ks->len - 2 && !memcmp(name, ks->name, len);
}

int ks_key_arg(const char *cmd, const char *name, const char *key,
               size_t keylen, cli_buf *b)
{
    key_space ks;
    char what[300];
    if (ks_set(&ks, name))
        return cli_usage_error(cmd, "a key space (--key-space, --job) is "
                               "named by 1 to %u bytes of text",
                               KS_NAME_MAX);
    if (ks_bad_size(&ks, keylen, what, sizeof what))
        return cli_usage_error(cmd, "%s", what);
    b->len = 0;
    return ks_add(b, &ks, key, keylen) ? cli_fail(cmd, "out of memory")
                                            : 0;
}

int ks_not_found(const char *cmd, const char *name, const char *key)
{
    if (name)
        return cli_fail(cmd, "no live record for key '%s' in key space '%s'",
                        key, name);
    return cli_fail(cmd, "no live record for key '%s' in the shared key "
                    "space (a job's keys are in its own: add --key-space "
                    "NAME; `idem dump` shows each record's)", key);
}
