/* tests/killloop.h - kill -9 and power cuts of `idem` runs, shared by the
 * stream suites (rstream, kafka, nats).
 *
 * What read-back is for is the moment between a run's write to its sink
 * and its commit, which a random kill seldom hits; so most runs kill
 * themselves there (IDEM_TEST_KILL_AT=sink-written:N, N batches in), and
 * the others are killed at a random time, once the first three kills
 * have landed (a random kill too late lets a run do the whole input, and
 * none lands after it). A power cut goes further: each
 * file a run synced goes back to its size at its last fdatasync that
 * returned (tests/shim/synclog.c notes them), so what was only written,
 * which a kill -9 leaves in the page cache, is lost. */
#ifndef IDEM_TESTS_KILLLOOP_H
#define IDEM_TESTS_KILLLOOP_H

typedef struct t_kill_plan {
    const char *args;  /* `idem ARGS`, run in t_dir, stderr to err */
    double span;       /* random kills land within this many seconds */
    long nkills;       /* kills to land (see t_kills) */
    int tries;         /* runs at most: tries × nkills */
    int at_max;        /* self-kills after 1..at_max batches */
    int every;         /* of each `every` runs, one is killed at random
                          only; the others kill themselves */
    int self_only;     /* the others are not killed at random too */
    int done_ends;     /* a run that ends by itself (exit 0) ends the loop:
                          it did the whole input */
    int power_cut;     /* each kill is a power cut too */
} t_kill_plan;

/* IDEM_CLI_KILLS if set, else dflt. */
long t_kills(long dflt);

/* Start and kill runs as p says until p->nkills kills landed on a live
 * process; a run that ends by itself must exit 0. Returns the kills that
 * landed. The caller makes the last, whole run. */
long t_kill_loop(const t_kill_plan *p);

/* The runs started from now on have the sync-noting shim preloaded (on),
 * or not. */
void t_synclog_preload(int on);

/* A power cut after a run with the shim preloaded: every file it synced
 * goes back to its size at its last fdatasync that returned. */
void t_power_cut(void);

/* One run of args in t_dir (stderr appended to err) with the shim
 * preloaded, killed at kill_at (IDEM_TEST_KILL_AT; NULL: not), then a
 * power cut. Its exit status. */
int t_cli_cut_at(const char *kill_at, const char *args);

#endif
