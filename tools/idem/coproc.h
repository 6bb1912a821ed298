/* coproc.h - a handler in any language, as a co-process. */
#ifndef IDEM_COPROC_H
#define IDEM_COPROC_H

#include <signal.h>
#include <sys/types.h>

#include "cli.h"

typedef struct coproc {
    const char *cmd;        /* run with sh -c */
    int line_mode;          /* messages are text, not JSON */
    int64_t lease_ms;       /* the longest wait for one answer */
    const volatile sig_atomic_t *stop;  /* when *stop: send nothing more,
                                         * wait grace_ms for the answers
                                         * to what was sent */
    int64_t grace_ms;
    int stopped;            /* the last call ended because of *stop */
    pid_t pid;              /* 0: not running */
    pid_t watcher;          /* kills the group when idem dies (coproc.c) */
    int life;               /* the watcher's pipe: closed when idem dies */
    int to, from;           /* its stdin, its stdout */
    cli_buf wb, rb;         /* envelopes out, answers in */
    size_t rpos;            /* answers consumed from rb */
    size_t scanned;         /* rb[rpos, scanned) holds no newline: each
                             * byte is searched once */
    uint64_t answer_max;    /* the longest answer line read, in bytes */
    uint64_t answers;       /* lines read from it, for messages */
    idem_runner *runner;    /* ticked while the handler works */
    int store_failed;       /* a tick failed: the store, not the handler */
    size_t fixed;           /* answers whose data points into rb */
    int64_t extended_until; /* an "extend" line asks to wait till then */
    size_t sent;            /* envelopes of the last call the handler was
                             * given, whole or in part */
    size_t whole;           /* envelopes of this call written whole: an
                             * answer to any other is not one */
    int fault;              /* the last call failed through the handler:
                             * it crashed, hung or broke the grammar
                             * (not a stop, a store error, or a command
                             * that could not be run: status 126, 127) */
    char err[512];          /* why the last call failed */
} coproc;

/* An idem_handler_fn over ctx = coproc *: starts the command if needed,
 * writes one envelope line per task and reads one answer line per task,
 * pipelined. On any failure the child is killed, err says why, and the
 * call returns IDEM_EPROTO (garbage), IDEM_ETIMEOUT (no answer within
 * the lease) or IDEM_EIO (it exited or could not be started). After
 * *stop, the envelopes being written are finished and no more are
 * sent; the call returns IDEM_ETIMEOUT with stopped set once the
 * handler answered those (it keeps running) or grace_ms ran out (it is
 * killed). */
int coproc_handle(void *ctx, idem_task *tasks, size_t n);

/* Close its stdin and wait for it to exit (killing it after the lease).
 * 0, or 1 after printing that it failed. */
int coproc_stop(coproc *c, const char *cmdname);

#endif
