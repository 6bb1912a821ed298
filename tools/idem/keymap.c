/* keymap.c - see keymap.h. Linear probing over a power-of-two table;
 * XXH3 spreads the keys, which an attacker may choose, well enough for a
 * table that lives one run: the worst case is slow, never wrong. */
#include "keymap.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static size_t slot_of(const keymap *m, uint64_t h, const void *key,
                      size_t keylen)
{
    size_t i = (size_t)h & (m->cap - 1);
    while (m->slots[i] && !(m->slots[i]->hash == h &&
                            m->slots[i]->keylen == keylen &&
                            !memcmp(m->slots[i]->data, key, keylen)))
        i = (i + 1) & (m->cap - 1);
    return i;
}

static int grow(keymap *m)
{
    size_t cap = m->cap ? 2 * m->cap : 1024;
    km_entry **old = m->slots, **slots = calloc(cap, sizeof *slots);
    if (!slots)
        return -1;
    size_t oldcap = m->cap;
    m->slots = slots;
    m->cap = cap;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i])
            m->slots[slot_of(m, old[i]->hash, old[i]->data,
                             old[i]->keylen)] = old[i];
    free(old);
    return 0;
}

int km_put(keymap *m, const void *key, size_t keylen, const void *a,
           size_t alen, const void *b, size_t blen)
{
    if (2 * (m->n + 1) > m->cap && grow(m))
        return -1;
    km_entry *e = malloc(sizeof *e + keylen + alen + blen);
    if (!e)
        return -1;
    *e = (km_entry){XXH3_64bits(key, keylen), keylen, alen, blen};
    if (keylen)
        memcpy(e->data, key, keylen);
    if (alen)
        memcpy(e->data + keylen, a, alen);
    if (blen)
        memcpy(e->data + keylen + alen, b, blen);
    size_t i = slot_of(m, e->hash, key, keylen);
    m->n += !m->slots[i];
    free(m->slots[i]);
    m->slots[i] = e;
    return 0;
}

const km_entry *km_get(const keymap *m, const void *key, size_t keylen)
{
    if (!m->n)
        return NULL;
    return m->slots[slot_of(m, XXH3_64bits(key, keylen), key, keylen)];
}

void km_del(keymap *m, const void *key, size_t keylen)
{
    if (!m->n)
        return;
    size_t i = slot_of(m, XXH3_64bits(key, keylen), key, keylen);
    if (!m->slots[i])
        return;
    free(m->slots[i]);
    m->slots[i] = NULL;
    m->n--;
    /* The rest of its run is put again, so that no probe stops at the
     * hole before an entry it is looking for. */
    for (size_t j = (i + 1) & (m->cap - 1); m->slots[j];
         j = (j + 1) & (m->cap - 1)) {
        km_entry *e = m->slots[j];
        m->slots[j] = NULL;
        m->slots[slot_of(m, e->hash, e->data, e->keylen)] = e;
    }
}

void km_clear(keymap *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        free(m->slots[i]);
        m->slots[i] = NULL;
    }
    m->n = 0;
}

void km_free(keymap *m)
{
    km_clear(m);
    free(m->slots);
    m->slots = NULL;
    m->cap = 0;
}
