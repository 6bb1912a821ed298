/* uriparam.h - the query parameters of the stream URIs (redis-stream://,
 * kafka://, nats://), split and decoded one way for all three. */
#ifndef IDEM_CONNECT_URIPARAM_H
#define IDEM_CONNECT_URIPARAM_H

#include <stddef.h>

/* One NAME=VALUE of a stream URI's query, split where it stands: the
 * name cut to 31 bytes (no parameter's is longer, so a longer one is
 * unknown all the same; namelen is its whole length) and the value as
 * written, empty without '='. */
typedef struct uri_param {
    char name[32];
    size_t namelen;
    const char *v;
    size_t vl;
} uri_param;
void uri_param_split(const char *p, size_t n, uri_param *out);

/* Replace *dst (freed) with v[0, n) %-decoded: 0, or -1 for a bad escape
 * or out of memory. */
int uri_param_take(char **dst, const char *v, size_t n);

#endif
