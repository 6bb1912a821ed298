/* tests/common.h - what the tests share: temp dirs, a settable clock,
 * fault injection (tests/fault.c) and small store helpers. */
#ifndef IDEM_TESTS_COMMON_H
#define IDEM_TESTS_COMMON_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/types.h>

#include "idem/idem.h"

/* What a test measures (never asserts on): to the log and, so that a
 * plain `make test` shows it, to stderr. */
#define T_REPORT(...)                                                      \
    do {                                                                   \
        cr_log_info(__VA_ARGS__);                                          \
        fprintf(stderr, "[info] " __VA_ARGS__);                            \
        fputc('\n', stderr);                                               \
    } while (0)

/* A fresh empty directory under $TMPDIR; removed by t_rmdir(). */
char *t_tmpdir(void);
void t_rmdir(const char *dir);

/* The fixture of the suites whose tests each work in a fresh temp dir
 * (the CLI's, among others): t_dir_init() (a suite's .init, or the first
 * step of its own) makes t_dir, t_dir_fini() (its .fini) removes it with
 * everything in it. */
extern char *t_dir;
void t_dir_init(void);
void t_dir_fini(void);

/* t_dir/name, as t_path() makes it. */
const char *t_at(const char *name);

/* How many lines t_dir/name holds (newlines counted; 0 when missing). */
int t_lines_of(const char *name);

/* Wait (a minute at most) until t_dir/name holds at least k lines;
 * assert that it does. */
void t_wait_lines(const char *name, int k);

/* Write text to t_dir/name, replacing it. */
void t_put(const char *name, const char *text);

/* Assert that t_dir/name holds exactly text. */
void t_expect(const char *name, const char *text);

/* The injectable clock: tests set t_clock_ms and open stores with
 * t_options(). */
extern int64_t t_clock_ms;
idem_opts t_options(void);

/* Open uri with t_options(); fails the test on error. */
idem_store *t_open(const char *uri);

/* "local:DIR" in a static buffer. */
const char *t_local_uri(const char *dir);

/* Fault injection: after `n` more successful calls, the next call of that
 * kind fails (malloc/calloc/realloc return NULL; write, pwrite, fdatasync,
 * ftruncate and unlinkat fail with t_fail_errno; mmap with ENOMEM). -1
 * disarms. */
extern long t_fail_alloc_after;
extern long t_fail_write_after;
extern long t_fail_sync_after;
extern long t_fail_mmap_after;
extern long t_fail_unlink_after;
extern int t_fail_errno;

/* Called, when set, before every unlinkat (with the name it was given)
 * and every mmap (with the file descriptor) the library makes, from the
 * thread that makes it: a test stops a handle there to run another. */
extern void (*t_unlink_hook)(const char *name);
extern void (*t_mmap_hook)(int fd);

/* A whole file in malloc'ed memory (NUL-terminated; *len may be NULL);
 * fails the test if it cannot be read. */
char *t_read(const char *path, size_t *len);

/* dir/name, in one of eight buffers that take turns: valid until the
 * eighth call after this one. */
const char *t_path(const char *dir, const char *name);

/* Assert that the file at path holds exactly text. */
void t_expect_file(const char *path, const char *text);

/* Write n bytes to path, replacing it. */
void t_write(const char *path, const void *data, size_t n);

/* A fresh temp dir (as t_tmpdir) holding one file, name, with text. */
char *t_dir_with(const char *name, const char *text);

/* Run `idem ARGS` (a shell fragment, redirections allowed) in dir, with
 * IDEM_STORE=local:DIR/store; returns its exit status. */
int t_cli(const char *dir, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* t_cli() in the background: the returned pid is idem's own (the
 * shell execs it), so a test can signal it; see t_wait(). */
pid_t t_cli_start(const char *dir, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Wait for pid; its exit status, or 128 + the signal that ended it. */
int t_wait(pid_t pid);

/* Does the file at path contain the text? */
int t_grep(const char *path, const char *text);

/* How many processes have text in their argv (its arguments joined by
 * spaces), read from /proc: what a test started, or left behind. */
int t_processes_with(const char *text);

/* Wait, ten seconds at most, until no process has text in its argv (as
 * t_processes_with); 1 if none has. */
int t_no_process_with(const char *text);

/* The monotonic clock in milliseconds, and a sleep of ms on it: for the
 * tests' deadlines and pauses, never for an assertion on timing. */
int64_t t_mono_ms(void);
void t_sleep_ms(long ms);

/* Run a shell command; returns its exit status. */
int t_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
