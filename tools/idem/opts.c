/* opts.c - what every subcommand does with its arguments and its store.
 *
 * Bad usage is the most common error a newcomer meets, so it gets the
 * most care: each message names the option and the value that was wrong,
 * says what would be right, and ends with the --help line to read. An
 * unknown option is answered with the nearest known one, because a typo
 * ("--keys" for "--key") is far likelier than a wrong idea. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "idem %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\ntry `idem %s --help`\n", cmd);
    return 2;
}

/* The last cli_fail() message, for --stats-json. */
static char last_error[512];

int cli_fail(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "idem %s: %s\n", cmd, last_error);
    return 1;
}

const char *cli_last_error(void)
{
    return last_error;
}

/* Edit distance of a and b, capped at 9: enough to rank suggestions. */
static int distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 30 || lb > 30)
        return 9;
    int d[31][31];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            d[i][j] = best;
        }
    return d[la][lb] < 9 ? d[la][lb] : 9;
}

static void unknown_option(const char *cmd, const char *arg,
                           const struct option *opts)
{
    char name[64];
    size_t n = strcspn(arg + 2, "=");
    snprintf(name, sizeof name, "%.*s", (int)(n < 60 ? n : 60), arg + 2);
    const char *best = NULL;
    int bd = 3;
    for (const struct option *o = opts; o->name; o++) {
        int d = distance(name, o->name);
        if (d < bd || (strncmp(o->name, name, strlen(name)) == 0 && !best)) {
            bd = d;
            best = o->name;
        }
    }
    if (best)
        cli_usage_error(cmd, "unknown option '%s'; did you mean --%s?", arg,
                        best);
    else
        cli_usage_error(cmd, "unknown option '%s'", arg);
}

int cli_getopt(const char *cmd, int argc, char **argv,
               const struct option *opts)
{
    return cli_getopt_short(cmd, argc, argv, ":h", opts);
}

int cli_getopt_short(const char *cmd, int argc, char **argv,
                     const char *shorts, const struct option *opts)
{
    opterr = 0;
    int ch = getopt_long(argc, argv, shorts, opts, NULL);
    if (ch != '?' && ch != ':')
        return ch;
    /* getopt has stepped past the word at fault, wherever the words that
     * are not options stood: it is the one before optind. (Not so for an
     * unknown letter inside "-abc", but optopt names that one.) */
    const char *word = optind > 0 && optind <= argc ? argv[optind - 1] : "";
    int is_long = !strncmp(word, "--", 2);
    if (ch == ':' && is_long)
        cli_usage_error(cmd, "%s needs a value, e.g. %s VALUE", word, word);
    else if (ch == ':')
        cli_usage_error(cmd, "-%c needs a value, e.g. -%c VALUE", optopt,
                        optopt);
    else if (is_long && optopt == 0)
        unknown_option(cmd, word, opts);
    else
        cli_usage_error(cmd, "unknown option '-%c'", optopt);
    return '?';
}

int cli_parse_duration(const char *arg, int64_t *ms)
{
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"", 1000},        {"ms", 1},          {"s", 1000},
                 {"m", 60000},      {"h", 3600000},     {"d", 86400000}};
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    for (size_t i = 0; end != arg && !errno && i < 6; i++)
        if (!strcmp(end, units[i].unit) && v > 0 &&
            v * (double)units[i].ms < 3.1e12) {
            *ms = (int64_t)(v * (double)units[i].ms);
            if (*ms > 0)
                return 0;
        }
    return -1;
}

int cli_duration(const char *cmd, const char *opt, const char *arg,
                 int64_t *ms)
{
    if (!cli_parse_duration(arg, ms))
        return 0;
    return cli_usage_error(cmd,
                           "%s wants a positive duration such as 250ms, "
                           "30s, 5m, 24h or 7d (up to 100 years), not '%s'",
                           opt, arg);
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

/* n digits at *p into *v; advances *p. */
static int digits(const char **p, int n, unsigned *v)
{
    unsigned x = 0;
    for (int i = 0; i < n; i++) {
        char c = (*p)[i];
        if (c < '0' || c > '9')
            return -1;
        x = x * 10 + (unsigned)(c - '0');
    }
    *p += n;
    *v = x;
    return 0;
}

/* YYYY-MM-DD at *p, a real day from 1970 on, as days since 1970. */
static int iso_date(const char **p, int64_t *days)
{
    static const unsigned mdays[] = {31, 29, 31, 30, 31, 30,
                                     31, 31, 30, 31, 30, 31};
    unsigned y, mo, d;
    if (digits(p, 4, &y) || *(*p)++ != '-' || digits(p, 2, &mo) ||
        *(*p)++ != '-' || digits(p, 2, &d))
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || y < 1970)
        return -1;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap))
        return -1;
    *days = days_from_civil(y, mo, d);
    return 0;
}

/* HH:MM[:SS[.fff]] at *p as ms since midnight. */
static int iso_clock(const char **p, int64_t *ms)
{
    unsigned h, mi, sec = 0, frac = 0;
    if (digits(p, 2, &h) || *(*p)++ != ':' || digits(p, 2, &mi))
        return -1;
    if (**p == ':') {
        (*p)++;
        if (digits(p, 2, &sec))
            return -1;
        if (**p == '.') {
            (*p)++;
            unsigned scale = 100, n = 0;
            for (; **p >= '0' && **p <= '9'; (*p)++, n++) {
                frac += (unsigned)(**p - '0') * scale;
                scale /= 10;
            }
            if (n == 0 || n > 3)
                return -1;
        }
    }
    if (h > 23 || mi > 59 || sec > 59)
        return -1;
    *ms = (((int64_t)h * 60 + mi) * 60 + sec) * 1000 + frac;
    return 0;
}

/* Z, or +HH:MM / -HH:MM, at *p as minutes east of UTC; -2 if absent. */
static int iso_zone(const char **p, int64_t *minutes)
{
    if (**p == 'Z' || **p == 'z') {
        (*p)++;
        *minutes = 0;
        return 0;
    }
    if (**p != '+' && **p != '-')
        return -2;
    int sign = *(*p)++ == '-' ? -1 : 1;
    unsigned oh, om;
    if (digits(p, 2, &oh) || *(*p)++ != ':' || digits(p, 2, &om) ||
        oh > 23 || om > 59)
        return -1;
    *minutes = sign * (int64_t)(oh * 60 + om);
    return 0;
}

/* cli_time() without its messages: 0, -1 (not a time) or -2 (no zone). */
static int parse_time(const char *s, int64_t *out)
{
    if (!strchr(s, '-') && !strchr(s, ':')) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (*s < '0' || *s > '9' || errno || *end ||
            v > (unsigned long long)INT64_MAX / 2)
            return -1;
        *out = (int64_t)v;
        return 0;
    }
    const char *p = s;
    int64_t days, clock_ms = 0, zone_min = 0;
    if (iso_date(&p, &days))
        return -1;
    if (*p) {
        if (*p != 'T' && *p != 't')
            return -1;
        p++;
        if (iso_clock(&p, &clock_ms))
            return -1;
        int rc = iso_zone(&p, &zone_min);
        if (rc)
            return rc;
        if (*p)
            return -1;
    }
    int64_t t = days * 86400000 + clock_ms - zone_min * 60000;
    if (t < 0)
        return -1;
    *out = t;
    return 0;
}

int cli_time(const char *cmd, const char *opt, const char *arg, int64_t *ms)
{
    int rc = parse_time(arg, ms);
    if (rc == -2)
        return cli_usage_error(cmd,
                               "%s '%s' has no time zone: add Z for UTC "
                               "(e.g. 2024-01-01T00:00:00Z) or an offset "
                               "(+09:00)",
                               opt, arg);
    if (rc)
        return cli_usage_error(cmd,
                               "%s wants Unix milliseconds (1704067200000) "
                               "or an ISO 8601 date or time from 1970 on "
                               "(2024-01-01, 2024-01-01T00:00:00Z); got '%s'",
                               opt, arg);
    return 0;
}

int cli_number(const char *cmd, const char *opt, const char *arg,
               uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    /* Digits only: strtoull() skips blanks and takes a sign, and wraps
     * " -5" round to 2^64 - 5. */
    if (errno || *arg < '0' || *arg > '9' || *end || v < lo || v > hi)
        return cli_usage_error(cmd,
                               "%s wants a whole number from %llu to %llu, "
                               "not '%s'",
                               opt, (unsigned long long)lo,
                               (unsigned long long)hi, arg);
    *out = v;
    return 0;
}

int cli_choice(const char *cmd, const char *opt, const char *arg,
               const char *const *choices, int *out)
{
    char list[256] = "";
    for (int i = 0; choices[i]; i++) {
        if (!strcmp(arg, choices[i])) {
            *out = i;
            return 0;
        }
        size_t n = strlen(list);
        snprintf(list + n, sizeof list - n, "%s%s", i ? "|" : "",
                 choices[i]);
    }
    return cli_usage_error(cmd, "%s is one of %s, not '%s'", opt, list, arg);
}

const char *cli_store_uri(const char *given)
{
    const char *env = getenv("IDEM_STORE");
    return given ? given : env && *env ? env : IDEM_DEFAULT_URI;
}

const char *cli_shown_uri(const char *uri)
{
    static char *shown;
    size_t n = idem_uri_display(uri, NULL, 0) + 1;
    char *p = realloc(shown, n);
    if (!p)
        return "(the store)";  /* nothing better to say without memory */
    shown = p;
    idem_uri_display(uri, shown, n);
    return shown;
}

int cli_uri_has_secret(const char *uri)
{
    if (!*uri)
        return 0;
    size_t n = idem_uri_display(uri, NULL, 0);
    char *shown = malloc(n + 1);
    int differs = !shown;  /* unsure: treat it as a secret */
    if (shown) {
        idem_uri_display(uri, shown, n + 1);
        differs = strcmp(shown, uri) != 0;
        free(shown);
    }
    return differs;
}

int cli_store_fail(const char *cmd, idem_store *s, int rc, const char *what)
{
    const char *d = s ? idem_errdetail(s) : "";
    return cli_fail(cmd, "%s: %s", what, *d ? d : idem_strerror(rc));
}

idem_store *cli_open(const char *cmd, const char *uri, unsigned flags,
                     int64_t ttl_ms, int64_t lease_ms)
{
    idem_opts o;
    idem_opts_init(&o);
    o.flags = flags;
    if (ttl_ms)
        o.ttl_ms = ttl_ms;
    if (lease_ms)
        o.lease_ms = lease_ms;
    return cli_open_with(cmd, uri, &o);
}

/* Why the last cli_open_with() failed, as an exit status. The CLI is one
 * thread when it opens its store. */
static int open_status = CLI_EXIT_FAIL;

int cli_open_status(void)
{
    return open_status;
}

idem_store *cli_open_with(const char *cmd, const char *uri,
                          const idem_opts *o)
{
    idem_store *s;
    int rc = idem_open(uri, o, &s);
    if (!rc && *idem_warning(s))
        fprintf(stderr, "idem %s: warning: %s\n", cmd, idem_warning(s));
    if (!rc)
        return s;
    /* The options come from checked command-line values, so EINVAL is
     * the URI: its scheme, host, port, parameters or missing parent
     * directory. */
    open_status = rc == IDEM_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
    const char *d = s ? idem_errdetail(s) : "out of memory";
    uri = cli_shown_uri(uri);
    /* The detail of a handle names the store already. */
    if (!strncmp(d, uri, strlen(uri)))
        fprintf(stderr, "idem %s: cannot open the store %s\n", cmd, d);
    else
        fprintf(stderr, "idem %s: cannot open the store %s: %s\n", cmd,
                uri, d);
    if (rc == IDEM_ELOCKED)
        fprintf(stderr, "idem %s: wait for that process to finish, or "
                        "give this one its own --store\n", cmd);
    else if (rc == IDEM_ENOTFOUND)
        fprintf(stderr, "idem %s: no store there yet; check --store (or "
                        "$IDEM_STORE)\n", cmd);
    else if (rc == IDEM_EINVAL)
        fprintf(stderr, "try `idem %s --help`; `man idem` lists the store "
                        "URIs\n", cmd);
    else if (rc == IDEM_ECORRUPT)
        fprintf(stderr, "idem %s: `idem check --store %s` shows the "
                        "damage; `idem repair` keeps every valid record\n",
                cmd, uri);
    idem_close(s);
    return NULL;
}

/* The options of cli_simple_parse() that flags allow, into opts. */
static void simple_options(unsigned flags, struct option *opts)
{
    static const struct {
        struct option o;
        unsigned needs;
    } all[] = {{{"store", 1, 0, 's'}, 0},
               {{"help", 0, 0, 'h'}, 0},
               {{"json", 0, 0, 'J'}, CLI_JSON},
               {{"job", 1, 0, 'K'}, CLI_KEY_SPACE},
               {{"key-space", 1, 0, 'K'}, CLI_KEY_SPACE},
               {{"key-spaces", 0, 0, 'P'}, CLI_PER_SPACE},
               {{"base64", 0, 0, 'B'}, CLI_BASE64},
               {{"format", 1, 0, 'F'}, CLI_FORMAT}};
    size_t n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if ((all[i].needs & flags) == all[i].needs)
            opts[n++] = all[i].o;
    opts[n] = (struct option){0, 0, 0, 0};
}

int cli_simple_parse(const char *cmd, int argc, char **argv,
                     const char *usage, unsigned flags, int min, int max,
                     const char *args, cli_simple *out)
{
    struct option opts[9];
    simple_options(flags, opts);
    *out = (cli_simple){0};
    int ch;
    while ((ch = cli_getopt(cmd, argc, argv, opts)) != -1) {
        if (ch == '?')
            return 2;
        if (ch == 'h') {
            fputs(usage, stdout);
            return -1;
        }
        if (ch == 's')
            out->uri = optarg;
        if (ch == 'K')
            out->key_space = optarg;
        if (ch == 'F')
            out->format = optarg;
        out->json |= ch == 'J';
        out->per_space |= ch == 'P';
        out->base64 |= ch == 'B';
    }
    int n = argc - optind;
    out->first = optind;
    if (n < min)
        return cli_usage_error(cmd, "%s is missing: idem %s%s%s", args, cmd,
                               flags & CLI_JSON ? " [--json]" : "",
                               max ? " KEY" : "");
    if (n > max)
        return cli_usage_error(cmd, "unexpected argument '%s'%s",
                               argv[optind + max],
                               max ? " (one key at a time; quote a key "
                                     "with spaces)"
                                   : "");
    return 0;
}
