/* tests/progs/handler.c - a scriptable `idem run` handler for the tests.
 *
 * usage: handler [LOG] [ACTION=KEY|N ...]
 *
 * Answers {"ok":true,"key":K,"n":LEN} to each envelope, where LEN is the
 * length of the envelope's message: deterministic, so outputs of runs
 * can be compared byte for byte. If LOG is a path (not an action), every
 * envelope's "key attempt token" is appended to it before answering, one
 * write per line, so a kill -9 cannot leave half a line. Actions:
 *
 *   fail=KEY      answer a permanent failure for KEY
 *   retry=KEY     answer a retryable failure for KEY, every time
 *   flaky=KEY     a retryable failure for KEY on attempt 1, then ok
 *   exit=N        exit(3) instead of answering the Nth envelope (1-based)
 *   crash=KEY     exit(3) instead of answering KEY, every time (poison)
 *   hangon=KEY    sleep forever instead of answering KEY, every time
 *   garbage=N     answer the Nth envelope with a line that is not JSON
 *   hang=N        sleep forever instead of answering the Nth envelope
 *   wrongkey=N    answer the Nth envelope with another key
 *   big=KEY[:N]   answer KEY with a result of 65 MiB, over IDEM_VALUE_MAX
 *                 (or of about N bytes)
 *   sleep=MS      take MS milliseconds over each envelope (a slow effect),
 *                 between logging it and answering
 *   waitfor=FILE  before that, wait until FILE exists (an effect that
 *                 lasts until the test lets it end)
 *   extend=D      before that, ask for the lease to be extended by D
 *                 ({"extend":"D"}, e.g. 10s)
 *   reply=N:FILE  answer the Nth envelope with the first line of FILE,
 *                 as it is (answers that test the grammar)
 *   twice=N       after the Nth envelope's answer, in the same write,
 *                 {"ok":true}: an answer too many, with no key */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *action(int argc, char **argv, const char *name)
{
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], name, n) && argv[i][n] == '=')
            return argv[i] + n + 1;
    return NULL;
}

static long nth(int argc, char **argv, const char *name)
{
    const char *v = action(argc, argv, name);
    return v ? strtol(v, NULL, 10) : -1;
}

/* Copy the string value after "name": into out. */
static void field(const char *line, const char *name, char *out, size_t n)
{
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":", name);
    const char *p = strstr(line, pat);
    out[0] = '\0';
    if (!p)
        return;
    p += strlen(pat);
    size_t k = 0;
    if (*p == '"')
        p++;
    while (*p && *p != '"' && *p != ',' && k + 1 < n)
        out[k++] = *p++;
    out[k] = '\0';
}

/* The first line of the file named after "N:" in reply=N:FILE. */
static void reply_line(const char *arg, char *out, size_t n)
{
    const char *colon = strchr(arg, ':');
    FILE *f = colon ? fopen(colon + 1, "r") : NULL;
    if (!f || !fgets(out, (int)n, f)) {
        fprintf(stderr, "handler: reply=%s: %s\n", arg, strerror(errno));
        exit(4);
    }
    fclose(f);
}

static void wait_for_file(const char *path)
{
    struct timespec ts = {0, 10 * 1000000};
    while (access(path, F_OK) != 0)
        nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    int log = -1;
    if (argc > 1 && !strchr(argv[1], '='))
        log = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0644);
    const char *fail = action(argc, argv, "fail");
    const char *retry = action(argc, argv, "retry");
    const char *flaky = action(argc, argv, "flaky");
    const char *crash = action(argc, argv, "crash");
    const char *hangon = action(argc, argv, "hangon");
    const char *extend = action(argc, argv, "extend");
    const char *waitfor = action(argc, argv, "waitfor");
    long exit_at = nth(argc, argv, "exit"), garbage = nth(argc, argv,
                                                          "garbage");
    long hang = nth(argc, argv, "hang"), wrong = nth(argc, argv, "wrongkey");
    long slow_ms = nth(argc, argv, "sleep");
    const char *big = action(argc, argv, "big");
    long reply = nth(argc, argv, "reply");
    long twice = nth(argc, argv, "twice");
    static char line[1 << 22];
    char key[256], token[32], attempt[32], out[600];
    for (long i = 1; fgets(line, sizeof line, stdin); i++) {
        field(line, "key", key, sizeof key);
        field(line, "token", token, sizeof token);
        field(line, "attempt", attempt, sizeof attempt);
        const char *msg = strstr(line, "\"message\":");
        size_t mlen = msg ? strlen(msg) : 0;
        if (log >= 0) {
            int k = snprintf(out, sizeof out, "%s %s %s\n", key, attempt,
                             token);
            if (write(log, out, (size_t)k) != k)
                return 1;
        }
        if (extend) {
            printf("{\"extend\":\"%s\"}\n", extend);
            fflush(stdout);
        }
        if (waitfor)
            wait_for_file(waitfor);
        if (slow_ms > 0) {
            struct timespec ts = {slow_ms / 1000, slow_ms % 1000 * 1000000};
            nanosleep(&ts, NULL);
        }
        if (i == exit_at || (crash && !strcmp(key, crash)))
            exit(3);
        if (i == hang || (hangon && !strcmp(key, hangon)))
            for (;;)
                pause();
        if (i == garbage)
            snprintf(out, sizeof out, "this is not json\n");
        else if (i == reply)
            reply_line(action(argc, argv, "reply"), out, sizeof out);
        else if (fail && !strcmp(key, fail))
            snprintf(out, sizeof out, "{\"error\":\"no such card\"}\n");
        else if ((retry && !strcmp(key, retry)) ||
                 (flaky && !strcmp(key, flaky) && !strcmp(attempt, "1")))
            snprintf(out, sizeof out,
                     "{\"error\":\"timeout\",\"retryable\":true}\n");
        else
            snprintf(out, sizeof out,
                     "{\"ok\":true,\"key\":\"%s\",\"n\":%zu}\n",
                     i == wrong ? "someone-else" : key, mlen);
        if (big && !strncmp(key, big, strcspn(big, ":")) &&
            strlen(key) == strcspn(big, ":")) {
            const char *size = strchr(big, ':');
            long bytes = size ? strtol(size + 1, NULL, 10) : 65L << 20;
            fputs("{\"ok\":true,\"pad\":\"", stdout);
            for (long k = 0; k < bytes / 64; k++)
                fputs("0123456789abcdef0123456789abcdef"
                      "0123456789abcdef0123456789abcdef", stdout);
            fputs("\"}\n", stdout);
        } else {
            fputs(out, stdout);
        }
        if (i == twice)
            fputs("{\"ok\":true}\n", stdout);
        fflush(stdout);
    }
    return 0;
}
