/* tests/common.c - shared test helpers. */
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int64_t t_clock_ms = 1700000000000LL;

static int64_t t_clock(void *ctx)
{
    (void)ctx;
    return t_clock_ms;
}

idem_options t_options(void)
{
    idem_options o;
    idem_options_init(&o);
    o.clock = t_clock;
    return o;
}

char *t_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/idem-test-XXXXXX", base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    cr_assert(d, "mkdtemp: %s", strerror(errno));
    char *copy = malloc(strlen(d) + 1);
    cr_assert(copy);
    memcpy(copy, d, strlen(d) + 1);
    return copy;
}

void t_rmdir(const char *dir)
{
    t_sh("rm -rf '%s'", dir);
}

const char *t_local_uri(const char *dir)
{
    static char buf[4200];
    snprintf(buf, sizeof buf, "local:%s", dir);
    return buf;
}

idem_store *t_open(const char *uri)
{
    idem_options o = t_options();
    idem_store *s;
    int rc = idem_open(uri, &o, &s);
    cr_assert_eq(rc, 0, "open %s: %s: %s", uri, idem_strerror(rc),
                 idem_errdetail(s));
    return s;
}

int t_sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return st == -1 ? -1 : WEXITSTATUS(st);
}
