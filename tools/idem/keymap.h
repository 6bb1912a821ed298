/* keymap.h - a set of keys, each with two values, for lookups by key.
 *
 * The sinks read back what a dead run wrote (connect/) and need to ask,
 * per message, whether its key is among thousands or millions of
 * entries: a hash table, open addressing, grown at half full. */
#ifndef IDEM_KEYMAP_H
#define IDEM_KEYMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct km_entry {
    uint64_t hash;
    size_t keylen, alen, blen;  /* key, then value a, then value b */
    char data[];
} km_entry;

typedef struct keymap {
    km_entry **slots;
    size_t cap, n;
} keymap;

/* Add key with values a and b (copied; a later put of the same key
 * replaces them). 0 or -1 (out of memory). */
int km_put(keymap *m, const void *key, size_t keylen, const void *a,
           size_t alen, const void *b, size_t blen);
/* The entry of key, or NULL. */
const km_entry *km_get(const keymap *m, const void *key, size_t keylen);
static inline const char *km_a(const km_entry *e)
{
    return e->data + e->keylen;
}
static inline const char *km_b(const km_entry *e)
{
    return e->data + e->keylen + e->alen;
}
/* Remove key's entry, if there is one. */
void km_del(keymap *m, const void *key, size_t keylen);
/* Empty the map (keep nothing); km_free also releases the table. */
void km_clear(keymap *m);
void km_free(keymap *m);

#endif
