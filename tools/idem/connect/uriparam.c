/* uriparam.c - a stream URI's NAME=VALUE parameters. Each connector
 * knows its own names and values; how a parameter is cut out of the
 * query and %-decoded is the same for all, so it is here once. */
#include "uriparam.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rconn.h"

void uri_param_split(const char *p, size_t n, uri_param *out)
{
    const char *eq = memchr(p, '=', n);
    out->namelen = eq ? (size_t)(eq - p) : n;
    out->v = eq ? eq + 1 : p + n;
    out->vl = n - out->namelen - (eq != NULL);
    snprintf(out->name, sizeof out->name, "%.*s",
             (int)(out->namelen < 31 ? out->namelen : 31), p);
}

int uri_param_take(char **dst, const char *v, size_t n)
{
    int badesc;
    free(*dst);
    *dst = rs_decode(v, n, NULL, &badesc);
    return *dst ? 0 : -1;
}
