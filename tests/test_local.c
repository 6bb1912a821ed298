/* tests/test_local.c - what only the embedded log engine promises:
 * persistence across reopen, the lock, checkpoints, segment rotation,
 * sweeps, whole-segment drops and compaction. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "common.h"
#include "local/record.h"

/* Room for a small segment built by hand. */
typedef struct seg_buf {
    unsigned char data[4096];
    size_t len;
} seg_buf;

TestSuite(local, .init = t_dir_init, .fini = t_dir_fini, .timeout = 60);

static uint64_t claim_complete(idem_store *s, const char *key,
                               const char *resp)
{
    idem_key k = {key, strlen(key), NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0, "%s", idem_errdetail(s));
    cr_assert_eq(o.kind, IDEM_NEW, "%s", key);
    cr_assert_eq(idem_complete(s, key, strlen(key), o.token, resp,
                               strlen(resp), 0),
                 0);
    return o.token;
}

static int kind_of(idem_store *s, const char *key)
{
    idem_key k = {key, strlen(key), NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    return o.kind;
}

Test(local, reopen_keeps_synced_records)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    claim_complete(s, "a", "ra");
    idem_key k = {"p", 1, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(t_local_uri(t_dir));
    idem_record r;
    cr_assert_eq(idem_get(s, "a", 1, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert(r.len == 2 && memcmp(r.data, "ra", 2) == 0);
    cr_assert_eq(idem_get(s, "p", 1, &r), 0);
    cr_assert_eq(r.state, IDEM_STATE_PENDING);
    cr_assert_eq(kind_of(s, "p"), IDEM_BUSY);
    idem_close(s);
}

/* A claim of key (no sync of its own). */
static void claim_nosync(idem_store *s, const char *key)
{
    idem_key k = {key, strlen(key), NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim_many(s, &k, 1, NULL, &o, IDEM_NOSYNC), 0);
    cr_assert_eq(o.kind, IDEM_NEW);
}

/* idem_sync_start(), then calls, then idem_sync_wait(), in a process
 * killed with SIGKILL after it: what the started commit held is there
 * after a reopen, what came after it (never committed) is not; commits
 * started back to back, and a whole idem_sync() after a started one,
 * are durable too. */
Test(local, a_started_sync_is_durable_once_waited_for)
{
    pid_t pid = fork();
    if (pid == 0) {
        idem_store *s = t_open(t_local_uri(t_dir));
        claim_nosync(s, "a");
        int ok = idem_sync_start(s) == 0;
        claim_nosync(s, "b");
        ok = ok && idem_sync_start(s) == 0;  /* waits for a's first */
        claim_nosync(s, "c");
        ok = ok && idem_sync_wait(s) == 0 && idem_sync_wait(s) == 0;
        claim_nosync(s, "d");
        ok = ok && idem_sync_start(s) == 0 && idem_sync(s) == 0;
        claim_nosync(s, "e");
        ok = ok && idem_sync_start(s) == 0;
        claim_nosync(s, "f");  /* in no commit */
        ok = ok && idem_sync_wait(s) == 0;
        if (!ok)
            _exit(1);
        raise(SIGKILL);
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "status %d", st);
    idem_store *s = t_open(t_local_uri(t_dir));
    idem_record r;
    for (const char *k = "abcde"; *k; k++)
        cr_assert_eq(idem_get(s, k, 1, &r), 0, "%c lost", *k);
    cr_assert_eq(idem_get(s, "f", 1, &r), IDEM_ENOTFOUND);
    /* Nothing in flight: the wait returns at once, and is no sample of
     * sync_duration; a started sync is one, from its start. */
    idem_metrics m0, m1;
    idem_metrics_init(&m0);
    idem_metrics_init(&m1);
    cr_assert_eq(idem_metrics_get(s, &m0), 0);
    cr_assert_eq(idem_sync_wait(s), 0);
    claim_nosync(s, "g");
    cr_assert_eq(idem_sync_start(s), 0);
    cr_assert_eq(idem_sync_wait(s), 0);
    cr_assert_eq(idem_metrics_get(s, &m1), 0);
    cr_assert_eq(m1.sync_duration.count, m0.sync_duration.count + 1);
    idem_close(s);
    /* mem: has no split. */
    s = t_open("mem:");
    claim_nosync(s, "a");
    cr_assert_eq(idem_sync_start(s), 0);
    cr_assert_eq(idem_sync_wait(s), 0);
    idem_close(s);
}

/* A started sync not waited for: idem_close() waits for it, and a
 * started sync with nothing new since is a no-op. A fork child between
 * the start and the wait has no syncing thread: its calls are refused
 * (never a join of the parent's thread), its close writes nothing, and
 * the parent's wait still reports the commit. */
Test(local, a_started_sync_then_fork_then_close)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    claim_nosync(s, "a");
    cr_assert_eq(idem_sync_start(s), 0);
    cr_assert_eq(idem_sync_start(s), 0);
    claim_nosync(s, "b");
    cr_assert_eq(idem_sync_start(s), 0);
    pid_t pid = fork();
    if (pid == 0) {
        int refused = idem_sync_wait(s) != 0 && idem_sync(s) != 0 &&
                      idem_sync_start(s) != 0;
        idem_close(s);
        _exit(refused ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
    claim_nosync(s, "c");
    cr_assert_eq(idem_sync_start(s), 0);
    cr_assert_eq(idem_close(s), 0);  /* waits for c's commit */
    s = t_open(t_local_uri(t_dir));
    idem_record r;
    for (const char *k = "abc"; *k; k++)
        cr_assert_eq(idem_get(s, k, 1, &r), 0, "%c lost", *k);
    idem_close(s);
}

Test(local, second_process_gets_lock_error_naming_pid)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    pid_t pid = fork();
    if (pid == 0) {
        idem_store *t;
        idem_opts o = t_options();
        int rc = idem_open(t_local_uri(t_dir), &o, &t);
        char want[64];
        snprintf(want, sizeof want, "pid %ld", (long)getppid());
        int ok = rc == IDEM_ELOCKED && strstr(idem_errdetail(t), want);
        idem_close(t);
        _exit(ok ? 0 : 1);
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    idem_close(s);
    /* Released on close: the next process gets it. */
    s = t_open(t_local_uri(t_dir));
    idem_close(s);
}

Test(local, second_handle_in_this_process_is_told_so)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    idem_store *t;
    idem_opts o = t_options();
    cr_assert_eq(idem_open(t_local_uri(t_dir), &o, &t), IDEM_ELOCKED);
    const char *d = idem_errdetail(t);
    cr_assert(strstr(d, "another handle of this process"), "%s", d);
    cr_assert(!strstr(d, "another process"), "%s", d);
    idem_close(t);
    idem_close(s);
}

Test(local, null_out_parameters_are_einval)
{
    cr_assert_eq(idem_open("mem:", NULL, NULL), IDEM_EINVAL);
    idem_opts_init(NULL);
    idem_runner_opts_init(NULL);
    idem_store *s = t_open("mem:");
    idem_key k = {"a", 1, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_claim(s, NULL, NULL, &o), IDEM_EINVAL);
    cr_assert_eq(idem_claim_many(s, NULL, 1, NULL, &o, 0), IDEM_EINVAL);
    cr_assert_eq(idem_claim_many(s, &k, 1, NULL, NULL, 0), IDEM_EINVAL);
    cr_assert_eq(idem_complete_many(s, NULL, 1, NULL, 0), IDEM_EINVAL);
    cr_assert_eq(idem_get(s, "a", 1, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_checkpoint_get(s, "c", NULL, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_stats_get(s, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_scan(s, NULL, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_import(s, "a", 1, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_runner_new(s, NULL, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_sweep(s, 0, NULL), 0, "expired may be NULL");
    cr_assert_eq(idem_sync(NULL), IDEM_EINVAL);
    idem_close(s);
}

Test(local, nocreate_and_bad_uris)
{
    idem_opts o = t_options();
    o.flags = IDEM_O_NOCREATE;
    idem_store *s;
    char uri[4300];
    snprintf(uri, sizeof uri, "local:%s/absent", t_dir);
    cr_assert_eq(idem_open(uri, &o, &s), IDEM_ENOTFOUND);
    idem_close(s);
    cr_assert_eq(idem_open("bogus:x", NULL, &s), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "unknown store URI"));
    cr_assert_eq(idem_claim(s, &(idem_key){"k", 1, NULL}, NULL,
                            &(idem_outcome){0}),
                 IDEM_EINVAL);
    idem_close(s);
    cr_assert_eq(idem_open("local:", NULL, &s), IDEM_EINVAL);
    idem_close(s);
    idem_opts bad;
    memset(&bad, 0, sizeof bad);
    cr_assert_eq(idem_open("mem:", &bad, &s), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "idem_opts_init"));
    idem_close(s);
}

/* What a tool may do with a store comes from its backend, asked by URI
 * before anything is opened. */
Test(local, uri_caps_come_from_the_backend)
{
    unsigned local = IDEM_CAP_SEGMENTS | IDEM_CAP_CHECK;
    cr_assert_eq(idem_uri_caps("local:./d"), local);
    cr_assert_eq(idem_uri_caps(NULL), local);
    cr_assert_eq(idem_uri_caps(""), local);
    cr_assert_eq(idem_uri_caps(IDEM_DEFAULT_URI), local);
    cr_assert_eq(idem_uri_caps("mem:"), IDEM_CAP_SEGMENTS);
    cr_assert_eq(idem_uri_caps("redis://h:1"), IDEM_CAP_CHECK);
    cr_assert_eq(idem_uri_caps("redis-cluster://h:1,h:2"), IDEM_CAP_CHECK);
    cr_assert_eq(idem_uri_caps("rediss://h"), 0);
    cr_assert_eq(idem_uri_caps("./d"), 0);
}

/* idem_check() and idem_repair() ask the backend; one without a check,
 * or no backend at all, is told in the report. */
Test(local, check_without_a_backend_check)
{
    idem_check_report r;
    cr_assert_eq(idem_check("mem:", &r), IDEM_ENOTSUP);
    cr_assert(strstr(r.first_damage, "check and repair work on local:"),
              "%s", r.first_damage);
    cr_assert_eq(idem_repair("mem:", NULL), IDEM_ENOTSUP);
    cr_assert_eq(idem_check("nope:x", &r), IDEM_EINVAL);
    cr_assert(strstr(r.first_damage, "unknown store URI 'nope:x'"), "%s",
              r.first_damage);
    cr_assert_eq(r.segments + r.records + r.damaged + r.bytes_lost, 0);
}

Test(local, checkpoint_commits_with_its_batch)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    const void *b;
    size_t n;
    cr_assert_eq(idem_checkpoint_get(s, "src", &b, &n), IDEM_ENOTFOUND);
    claim_complete(s, "a", "1");
    cr_assert_eq(idem_checkpoint_put(s, "src", "offset=10", 9), 0);
    cr_assert_eq(idem_sync(s), 0);
    claim_complete(s, "b", "2");
    cr_assert_eq(idem_checkpoint_put(s, "src", "offset=20", 9), 0);
    cr_assert_eq(idem_checkpoint_get(s, "src", &b, &n), 0);
    cr_assert(n == 9 && memcmp(b, "offset=20", 9) == 0);
    /* A crash now, before the second commit: copy the directory as it
     * is on disk. Neither "b" nor offset=20 may be there. */
    char copy[4300];
    snprintf(copy, sizeof copy, "%s.copy", t_dir);
    cr_assert_eq(t_sh("cp -r '%s' '%s'", t_dir, copy), 0);
    idem_close(s);
    s = t_open(t_local_uri(copy));
    cr_assert_eq(idem_checkpoint_get(s, "src", &b, &n), 0);
    cr_assert(n == 9 && memcmp(b, "offset=10", 9) == 0);
    idem_record r;
    cr_assert_eq(idem_get(s, "a", 1, &r), 0);
    cr_assert_eq(idem_get(s, "b", 1, &r), IDEM_ENOTFOUND);
    idem_close(s);
    t_rmdir(copy);
    /* The closed original has both. */
    s = t_open(t_local_uri(t_dir));
    cr_assert_eq(idem_checkpoint_get(s, "src", &b, &n), 0);
    cr_assert(n == 9 && memcmp(b, "offset=20", 9) == 0);
    cr_assert_eq(idem_get(s, "b", 1, &r), 0);
    idem_close(s);
}

static idem_store *open_small_segments(void)
{
    idem_opts o = t_options();
    o.segment_bytes = 4096;
    o.segment_span_ms = 1000;
    idem_store *s;
    cr_assert_eq(idem_open(t_local_uri(t_dir), &o, &s), 0, "%s",
                 idem_errdetail(s));
    return s;
}

Test(local, segments_roll_by_size_and_time)
{
    idem_store *s = open_small_segments();
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_eq(st.segments, 1);
    char key[32];
    for (int i = 0; i < 400; i++) {
        snprintf(key, sizeof key, "key-%d", i);
        claim_complete(s, key, "v");
        cr_assert_eq(idem_sync(s), 0);
    }
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_gt(st.segments, 5);
    uint64_t by_size = st.segments;
    t_clock_ms += 1000;  /* the time bucket ends: the next write rolls */
    claim_complete(s, "late", "v");
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_eq(st.segments, by_size + 1);
    cr_assert_eq(st.done, 401);
    cr_assert_eq(idem_close(s), 0);
    s = open_small_segments();
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_eq(st.done, 401);
    cr_assert_eq(kind_of(s, "key-0"), IDEM_REPLAY);
    cr_assert_eq(kind_of(s, "late"), IDEM_REPLAY);
    idem_close(s);
}

Test(local, sweep_drops_dead_segments_and_compacts)
{
    idem_store *s = open_small_segments();
    char key[32];
    /* Short-lived records fill several segments... */
    for (int i = 0; i < 150; i++) {
        snprintf(key, sizeof key, "short-%d", i);
        idem_key k = {key, strlen(key), NULL};
        idem_outcome o;
        idem_claim_opts co = {1000, 5000};
        cr_assert_eq(idem_claim(s, &k, &co, &o), 0);
        cr_assert_eq(idem_complete(s, key, strlen(key), o.token, "v", 1,
                                   5000),
                     0);
        cr_assert_eq(idem_sync(s), 0);
    }
    /* ...with one long-lived record in the oldest segment. */
    idem_stats st;
    idem_stats_get(s, &st);
    uint64_t before = st.segments;
    t_clock_ms += 6000;
    claim_complete(s, "long", "keep");  /* after the drop it must survive */
    cr_assert_eq(idem_sync(s), 0);
    uint64_t expired = 0;
    cr_assert_eq(idem_sweep(s, 0, &expired), 0, "%s", idem_errdetail(s));
    cr_assert_eq(expired, 150);
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_lt(st.segments, before);
    cr_assert_gt(st.segments_dropped, 0);
    cr_assert_eq(st.live_keys, 1);
    cr_assert_eq(kind_of(s, "short-3"), IDEM_NEW);
    cr_assert_eq(idem_close(s), 0);
    /* Survives reopen after the drops. */
    s = open_small_segments();
    cr_assert_eq(kind_of(s, "long"), IDEM_REPLAY);
    cr_assert_eq(kind_of(s, "short-4"), IDEM_NEW);
    idem_close(s);
}

Test(local, compaction_copies_survivors_out)
{
    idem_store *s = open_small_segments();
    char key[32];
    claim_complete(s, "survivor", "alive");  /* long TTL, oldest segment */
    const char *ck = "pos=1";
    cr_assert_eq(idem_checkpoint_put(s, "src", ck, 5), 0);
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof key, "s-%d", i);
        idem_key k = {key, strlen(key), NULL};
        idem_outcome o;
        idem_claim_opts co = {1000, 5000};
        cr_assert_eq(idem_claim(s, &k, &co, &o), 0);
        cr_assert_eq(idem_sync(s), 0);
    }
    t_clock_ms += 6000;
    uint64_t expired;
    cr_assert_eq(idem_sweep(s, 0, &expired), 0, "%s", idem_errdetail(s));
    idem_stats st;
    idem_stats_get(s, &st);
    cr_assert_geq(st.records_copied, 2, "copied %llu",
                  (unsigned long long)st.records_copied);
    cr_assert_lt(st.segments, 4);
    idem_close(s);
    s = open_small_segments();
    idem_record r;
    cr_assert_eq(idem_get(s, "survivor", 8, &r), 0);
    cr_assert(r.len == 5 && memcmp(r.data, "alive", 5) == 0);
    const void *b;
    size_t n;
    cr_assert_eq(idem_checkpoint_get(s, "src", &b, &n), 0);
    cr_assert(n == 5 && memcmp(b, ck, 5) == 0);
    idem_close(s);
}

Test(local, incremental_sweep_is_bounded)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    char key[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof key, "k%d", i);
        idem_key k = {key, strlen(key), NULL};
        idem_outcome o;
        idem_claim_opts co = {1000, 2000};
        cr_assert_eq(idem_claim(s, &k, &co, &o), 0);
    }
    t_clock_ms += 2000;
    uint64_t total = 0, e;
    int steps = 0;
    do {
        cr_assert_eq(idem_sweep(s, 100, &e), 0);
        cr_assert_leq(e, 100);
        total += e;
        steps++;
    } while (total < 1000 && steps < 50);
    cr_assert_eq(total, 1000);
    cr_assert_geq(steps, 10);
    idem_stats st;
    idem_stats_get(s, &st);
    cr_assert_eq(st.live_keys, 0);
    idem_close(s);
}

Test(local, readonly_open_changes_nothing)
{
    idem_opts o = t_options();
    o.flags = IDEM_O_READONLY;
    idem_store *s;
    cr_assert_eq(idem_open(t_local_uri(t_dir), &o, &s), IDEM_ENOTFOUND,
                 "a read-only open must not create a store");
    cr_assert(strstr(idem_errdetail(s), "not an idem store"), "%s",
                  idem_errdetail(s));
    idem_close(s);
    s = t_open(t_local_uri(t_dir));
    claim_complete(s, "a", "1");
    cr_assert_eq(idem_sync(s), 0);
    claim_complete(s, "b", "2");  /* never committed: a torn tail */
    char copy[4300];
    snprintf(copy, sizeof copy, "%s/copy", t_dir);
    cr_assert_eq(t_sh("mkdir '%s' && cp '%s'/IDEM '%s'/TAIL '%s'/seg-* '%s'",
                      copy, t_dir, t_dir, t_dir, copy),
                 0);
    idem_close(s);
    /* Append a torn frame by hand so that there is a tail to leave be. */
    cr_assert_eq(t_sh("printf 'torn-frame-bytes' >> '%s'/seg-00000001.log",
                      copy), 0);
    cr_assert_eq(t_sh("stat -c %%s '%s'/seg-00000001.log > '%s'/size",
                      copy, t_dir), 0);
    cr_assert_eq(idem_open(t_local_uri(copy), &o, &s), 0, "%s",
                 idem_errdetail(s));
    idem_record r;
    cr_assert_eq(idem_get(s, "a", 1, &r), 0);
    cr_assert_eq(idem_get(s, "b", 1, &r), IDEM_ENOTFOUND);
    idem_key k = {"c", 1, NULL};
    idem_outcome out;
    cr_assert_eq(idem_claim(s, &k, NULL, &out), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "read-only"));
    cr_assert_eq(idem_sweep(s, 0, NULL), IDEM_EINVAL);
    cr_assert_eq(idem_close(s), 0);
    /* The torn tail is still there: nothing was cut. */
    cr_assert_eq(t_sh("test \"$(stat -c %%s '%s'/seg-00000001.log)\" = "
                      "\"$(cat '%s'/size)\"", copy, t_dir), 0);
    o.flags = 0x80;
    cr_assert_eq(idem_open(t_local_uri(t_dir), &o, &s), IDEM_EINVAL);
    idem_close(s);
}

/* The first segment of the store at t_dir, read whole: its bytes (the
 * caller frees them), *n of them; its path in path. */
static unsigned char *first_segment(char path[4300], size_t *n)
{
    snprintf(path, 4300, "%s/seg-00000001.log", t_dir);
    unsigned char *seg = (unsigned char *)t_read(path, n);
    cr_assert(seg && *n >= 32, "%s: no segment header", path);
    return seg;
}

Test(local, damaged_record_read_back_is_an_error)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    claim_complete(s, "k", "resp");
    cr_assert_eq(idem_sync(s), 0);
    /* The disk (or someone) damages the COMPLETE frame under the open
     * store: header 32, the CLAIM frame, then the COMPLETE frame, whose
     * kind byte is its fifth. */
    char path[4300];
    size_t len;
    unsigned char *seg = first_segment(path, &len);
    idem__frame fr;
    cr_assert(idem__frame_decode(seg + 32, len - 32, &fr, 1) == 0);
    cr_assert_eq(fr.type, IDEM__R_CLAIM);
    free(seg);
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    cr_assert_eq(fseek(f, 32 + (long)fr.len + 4, SEEK_SET), 0);
    cr_assert_eq(fputc(0xee, f), 0xee);
    fclose(f);
    idem_key k = {"k", 1, NULL};
    idem_outcome o;
    int rc = idem_claim(s, &k, NULL, &o);
    cr_assert_eq(rc, IDEM_ECORRUPT, "rc %d kind %d", rc, o.kind);
    cr_assert(strstr(idem_errdetail(s), "seg-00000001.log"), "%s",
              idem_errdetail(s));
    idem_record r;
    cr_assert_eq(idem_get(s, "k", 1, &r), IDEM_ECORRUPT);
    idem_close(s);
}

Test(local, idle_checkpoint_does_not_stop_segment_drops)
{
    /* A checkpoint nobody updates any more (an idle source) sits in a
     * small segment. Once the records around it are dead, that segment
     * must go like any other: it is the oldest, and while it stays no
     * segment after it can be dropped. */
    idem_store *s = open_small_segments();
    idem_key k = {"x", 1, NULL};
    idem_outcome o;
    idem_claim_opts co = {1000, 2000};
    cr_assert_eq(idem_claim(s, &k, &co, &o), 0);
    cr_assert_eq(idem_checkpoint_put(s, "idle", "pos=7", 5), 0);
    cr_assert_eq(idem_sync(s), 0);
    t_clock_ms += 1000;  /* the next write starts a new segment */
    char key[32];
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof key, "s-%d", i);
        idem_key ki = {key, strlen(key), NULL};
        cr_assert_eq(idem_claim(s, &ki, &co, &o), 0);
        cr_assert_eq(idem_checkpoint_put(s, "busy", key, strlen(key)), 0);
        cr_assert_eq(idem_sync(s), 0);
    }
    idem_stats st;
    cr_assert_eq(idem_stats_get(s, &st), 0);
    uint64_t before = st.segments;
    cr_assert_gt(before, 5);
    t_clock_ms += 5000;
    uint64_t expired;
    cr_assert_eq(idem_sweep(s, 0, &expired), 0, "%s", idem_errdetail(s));
    cr_assert_eq(expired, 301);
    cr_assert_eq(idem_stats_get(s, &st), 0);
    cr_assert_leq(st.segments, 2, "%llu of %llu segments left",
                  (unsigned long long)st.segments,
                  (unsigned long long)before);
    cr_assert_eq(idem_close(s), 0);
    s = open_small_segments();
    const void *b;
    size_t n;
    cr_assert_eq(idem_checkpoint_get(s, "idle", &b, &n), 0);
    cr_assert(n == 5 && memcmp(b, "pos=7", 5) == 0);
    cr_assert_eq(idem_checkpoint_get(s, "busy", &b, &n), 0);
    cr_assert(n == 5 && memcmp(b, "s-299", 5) == 0);
    idem_close(s);
}

/* A clock stepped back, in the same process or across a reopen, gives no
 * key a token it had before: the store keeps a high-water mark of its
 * tokens and finds it again in its log. */
Test(local, clock_stepped_back_repeats_no_token)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    uint64_t first = claim_complete(s, "k", "one");
    cr_assert_eq(idem_forget(s, "k", 1), 0);
    t_clock_ms -= 3600 * 1000;
    uint64_t second = claim_complete(s, "k", "two");
    cr_assert_gt(second, first, "%llu after %llu",
                 (unsigned long long)second, (unsigned long long)first);
    cr_assert_eq(idem_forget(s, "k", 1), 0);
    cr_assert_eq(idem_close(s), 0);
    t_clock_ms -= 3600 * 1000;
    s = t_open(t_local_uri(t_dir));
    uint64_t third = claim_complete(s, "k", "three");
    cr_assert_gt(third, second, "%llu after a reopen, after %llu",
                 (unsigned long long)third, (unsigned long long)second);
    cr_assert_gt(claim_complete(s, "other", "x"), third,
                 "the mark is the store's, not the key's");
    idem_close(s);
}

/* Append to b a version-1 frame: a 72-byte header whose 32-bit token at
 * offset 16 also counted the claims, as stores written before tokens
 * were 64 bits hold them. */
static void v1_frame(seg_buf *b, uint8_t type, uint8_t state,
                     uint32_t token, const char *key, int64_t created,
                     int64_t expires, int64_t lease, const char *val)
{
    size_t kl = strlen(key), vl = strlen(val);
    size_t len = (72 + kl + vl + 7) & ~(size_t)7;
    unsigned char *p = b->data + b->len;
    cr_assert_leq(b->len + len, sizeof b->data);
    memset(p, 0, len);
    uint32_t len32 = (uint32_t)len, kl32 = (uint32_t)kl, vl32 = (uint32_t)vl;
    memcpy(p + 8, &len32, 4);
    p[12] = 1;
    p[13] = type;
    p[14] = state;
    memcpy(p + 16, &token, 4);
    memcpy(p + 20, &kl32, 4);
    memcpy(p + 24, &created, 8);
    memcpy(p + 32, &expires, 8);
    memcpy(p + 40, &lease, 8);
    memcpy(p + 64, &vl32, 4);
    memcpy(p + 72, key, kl);
    memcpy(p + 72 + kl, val, vl);
    uint64_t check = XXH3_64bits(p + 8, len - 8);
    memcpy(p, &check, 8);
    b->len += len;
}

/* A store written in the first record format (32-bit tokens) opens, its
 * records read as they were, and the protocol goes on from them with
 * greater tokens in the new format. */
Test(local, version_1_records_still_read)
{
    enum { CLAIM = 1, COMPLETE = 2, COMMIT = 8 };
    idem_store *s = t_open(t_local_uri(t_dir));
    cr_assert_eq(idem_close(s), 0);
    char path[4300];
    size_t n;
    unsigned char *seg = first_segment(path, &n);
    static seg_buf b;
    memcpy(b.data, seg, 32);  /* the segment header */
    b.len = 32;
    free(seg);
    int64_t now = t_clock_ms;
    v1_frame(&b, CLAIM, IDEM_STATE_PENDING, 6, "done", now, now + 60000,
             now + 1000, "");
    v1_frame(&b, COMPLETE, IDEM_STATE_DONE, 7, "done", now, now + 60000, 0,
             "resp");
    v1_frame(&b, CLAIM, IDEM_STATE_PENDING, 3, "pending", now, now + 60000,
             now - 1, "");
    v1_frame(&b, COMMIT, 0, 0, "", 32, 0, 0, "");
    t_write(path, b.data, b.len);

    s = t_open(t_local_uri(t_dir));
    idem_record r;
    cr_assert_eq(idem_get(s, "done", 4, &r), 0, "%s", idem_errdetail(s));
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(r.token, 7);
    cr_assert_eq(r.attempts, 7, "a version-1 token counted the claims");
    cr_assert(r.len == 4 && !memcmp(r.data, "resp", 4));
    idem_key k = {"pending", 7, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0, "%s", idem_errdetail(s));
    cr_assert_eq(o.kind, IDEM_NEW, "its lease ran out: a takeover");
    cr_assert_gt(o.token, 3);
    cr_assert_eq(o.attempts, 4);
    cr_assert_eq(idem_complete(s, "pending", 7, 3, "late", 4, 0),
                 IDEM_ELOST);
    cr_assert_eq(idem_complete(s, "pending", 7, o.token, "ok", 2, 0), 0);
    cr_assert_eq(idem_close(s), 0);
    s = t_open(t_local_uri(t_dir));
    cr_assert_eq(idem_get(s, "pending", 7, &r), 0, "%s", idem_errdetail(s));
    cr_assert_eq(r.state, IDEM_STATE_DONE);
    cr_assert_eq(r.token, o.token);
    cr_assert_eq(r.attempts, 4);
    cr_assert_eq(kind_of(s, "done"), IDEM_REPLAY);
    idem_close(s);
}

/* Open the store at t_dir expecting IDEM_EVERSION with detail `want`, and
 * check that the refusal changed no byte of the segment at path and
 * sent nobody to `idem repair`. */
static void refused_as_newer(const char *path, const char *want)
{
    size_t n0, n1;
    char *before = t_read(path, &n0);
    idem_opts o = t_options();
    idem_store *s;
    cr_assert_eq(idem_open(t_local_uri(t_dir), &o, &s), IDEM_EVERSION, "%s",
                 idem_errdetail(s));
    cr_assert(strstr(idem_errdetail(s), want), "%s", idem_errdetail(s));
    cr_assert(strstr(idem_errdetail(s), "newer idem") &&
                  !strstr(idem_errdetail(s), "repair"),
              "%s", idem_errdetail(s));
    idem_close(s);
    char *after = t_read(path, &n1);
    cr_assert(n0 == n1 && !memcmp(before, after, n0),
              "a refused store was changed");
    free(before);
    free(after);
}

/* Move the header version of segment bytes seg by d, its check with it. */
static void set_header_version(unsigned char *seg, int d)
{
    uint32_t version;
    memcpy(&version, seg + 8, 4);
    version += (uint32_t)d;
    memcpy(seg + 8, &version, 4);
    uint64_t check = XXH3_64bits(seg, 24);
    memcpy(seg + 24, &check, 8);
}

/* A store at t_dir holding key "a", done, closed: its first segment
 * read whole, as first_segment() gives it. */
static unsigned char *store_of_a(char path[4300], size_t *n)
{
    idem_store *s = t_open(t_local_uri(t_dir));
    claim_complete(s, "a", "1");
    cr_assert_eq(idem_close(s), 0);
    return first_segment(path, n);
}

/* A frame of type for r and key, of the version after this build's,
 * its check and all, at dst (64 bytes); its length. */
static size_t newer_frame(unsigned char *dst, uint8_t type,
                          const idem__rec *r, const char *key)
{
    idem__fplan plan;
    size_t len = idem__frame_plan(&plan, type, r, key, strlen(key), NULL, 0);
    cr_assert_leq(len, 64);
    idem__frame_write(dst, &plan);
    dst[12] = IDEM__REC_VERSION + 1;
    uint32_t check = (uint32_t)XXH3_64bits(dst + 4, len - 4);
    memcpy(dst, &check, 4);
    return len;
}

/* A store written by a later build is refused as of a newer format, and
 * left as it was: a segment of a newer header version, and a record of a
 * newer frame version at the end of the log, where a torn tail would be
 * cut. */
Test(local, a_newer_format_is_refused_and_left_alone)
{
    char path[4300];
    size_t n;
    unsigned char *seg = store_of_a(path, &n);

    idem__rec r = {.state = IDEM_STATE_PENDING, .attempts = 1,
                   .token = (uint64_t)t_clock_ms * 1000, .created = t_clock_ms,
                   .expires = t_clock_ms + 60000, .lease = t_clock_ms + 1000};
    unsigned char *more = malloc(n + 64);
    cr_assert(more);
    memcpy(more, seg, n);
    size_t len = newer_frame(more + n, 1, &r, "b");
    t_write(path, more, n + len);
    refused_as_newer(path, "record of a newer format");
    idem_check_report rep;
    cr_assert_eq(idem_check(t_local_uri(t_dir), &rep), IDEM_EVERSION);
    cr_assert(strstr(rep.first_damage, "record of a newer format"), "%s",
              rep.first_damage);
    cr_assert_eq(idem_repair(t_local_uri(t_dir), &rep), IDEM_EVERSION,
                 "repair must not drop what a newer idem wrote");
    refused_as_newer(path, "record of a newer format");
    /* Not past damage: there a frame that checks out may be the bytes of
     * a value, and a newer idem writes its frames in a segment of its
     * own. Repair keeps what it can read and drops the rest. */
    more[32 + 5] ^= 0x40;
    t_write(path, more, n + len);
    cr_assert_eq(idem_repair(t_local_uri(t_dir), &rep), 0, "%s",
                 rep.first_damage);
    cr_assert_geq(rep.damaged, 1);
    free(more);

    set_header_version(seg, 1);
    t_write(path, seg, n);
    refused_as_newer(path, "segment of a newer format");
    cr_assert_eq(idem_check(t_local_uri(t_dir), &rep), IDEM_EVERSION);
    cr_assert_eq(idem_repair(t_local_uri(t_dir), &rep), IDEM_EVERSION);
    refused_as_newer(path, "segment of a newer format");
    free(seg);
}

/* A value may hold any bytes, a frame of a newer version among them,
 * checksum and all. Damage to the frame that carries it makes the 4-byte
 * walk through the damage meet it: that is still damage, which check
 * reports and repair mends, not a store a newer idem wrote. */
Test(local, a_newer_frame_inside_a_damaged_value_is_damage)
{
    idem__rec r = {.state = IDEM_STATE_DONE, .attempts = 1,
                   .token = (uint64_t)t_clock_ms * 1000, .created = t_clock_ms,
                   .expires = t_clock_ms + 60000};
    unsigned char fr[64], val[256];
    size_t len = newer_frame(fr, 2, &r, "x"), vl = 0;
    for (int i = 0; i < 4; i++, vl += len + 1)  /* at every offset mod 4 */
        memcpy(val + vl, fr, len);
    idem_store *s = t_open(t_local_uri(t_dir));
    claim_complete(s, "before", "b");
    cr_assert_eq(idem_sync(s), 0);
    idem_key k = {"host", 4, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0);
    cr_assert_eq(idem_complete(s, "host", 4, o.token, val, vl, 0), 0);
    cr_assert_eq(idem_sync(s), 0);
    claim_complete(s, "after", "a");
    cr_assert_eq(idem_close(s), 0);
    char path[4300];
    size_t n;
    unsigned char *seg = first_segment(path, &n);
    size_t host = 32;
    idem__frame f;
    while (host < n && idem__frame_decode(seg + host, n - host, &f, 1) == 0 &&
           f.vallen != vl)
        host += f.len;
    cr_assert(host < n && f.vallen == vl, "no host frame");
    seg[host] ^= 1;  /* one bit of its check */
    t_write(path, seg, n);
    free(seg);
    idem_check_report rep;
    cr_assert_eq(idem_check(t_local_uri(t_dir), &rep), IDEM_ECORRUPT, "%s",
                 rep.first_damage);
    cr_assert_eq(idem_repair(t_local_uri(t_dir), &rep), 0, "%s",
                 rep.first_damage);
    s = t_open(t_local_uri(t_dir));
    cr_assert_eq(kind_of(s, "before"), IDEM_REPLAY);
    cr_assert_eq(kind_of(s, "after"), IDEM_REPLAY);
    idem_close(s);
}

/* The sums of every file of a store but PATH/LOCK (which holds the pid
 * of whoever opened it last) into the file beside it named `which`. */
#define SUMS_TO(which) \
    "cd '%s' && md5sum $(ls | grep -vx LOCK) > '%s." which "'"

/* Repair refuses a store with a segment of a newer header version before
 * it changes any file: not the older segments, not their key indexes. */
Test(local, repair_of_a_newer_segment_changes_no_file)
{
    char uri[4400];
    snprintf(uri, sizeof uri, "%s?hot=0&segment=1", t_local_uri(t_dir));
    idem_store *s = t_open(uri);
    for (int i = 0; i < 4; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        claim_complete(s, k, "v");
        cr_assert_eq(idem_sync(s), 0);
    }
    cr_assert_eq(idem_close(s), 0);
    char path[4300];
    size_t n;
    unsigned char *seg = first_segment(path, &n);
    free(seg);
    snprintf(path, sizeof path, "%s/seg-00000004.log", t_dir);
    seg = (unsigned char *)t_read(path, &n);
    cr_assert(seg && n >= 32);
    set_header_version(seg, 1);
    t_write(path, seg, n);
    free(seg);
    /* The identity file damaged too: a repair would write it anew, and
     * drop every key index, but not in a store it refuses. */
    cr_assert_eq(t_sh("printf X | dd of='%s/IDEM' bs=1 seek=20 "
                      "conv=notrunc 2>/dev/null",
                      t_dir),
                 0);
    cr_assert_eq(t_sh(SUMS_TO("before"), t_dir, t_dir), 0);
    cr_assert_eq(t_sh("ls '%s'/seg-00000001.kix >/dev/null", t_dir), 0,
                  "no key index to keep");
    idem_check_report rep;
    cr_assert_eq(idem_repair(t_local_uri(t_dir), &rep), IDEM_EVERSION);
    cr_assert(strstr(rep.first_damage, "seg-00000004.log"), "%s",
              rep.first_damage);
    cr_assert_eq(t_sh(SUMS_TO("after"), t_dir, t_dir), 0);
    cr_assert_eq(t_sh("cmp '%s.before' '%s.after'", t_dir, t_dir), 0,
                 "a refused repair changed the store");
    t_sh("rm -f '%s.before' '%s.after'", t_dir, t_dir);
}

/* A store whose newest segment an older idem started gets no frame of
 * this version in it: the first write starts a new segment, so that the
 * older idem refuses the store, repair included, instead of taking the
 * new frames for damage. */
Test(local, an_older_segment_takes_no_newer_frame)
{
    char path[4300];
    size_t n;
    unsigned char *seg = store_of_a(path, &n);
    set_header_version(seg, -1);
    t_write(path, seg, n);
    idem_store *s = t_open(t_local_uri(t_dir));
    cr_assert_eq(kind_of(s, "a"), IDEM_REPLAY);
    claim_complete(s, "b", "2");
    cr_assert_eq(idem_close(s), 0);
    size_t n1;
    char *now = t_read(path, &n1);
    cr_assert(n1 == n && !memcmp(now, seg, n), "the older segment grew");
    free(now);
    free(seg);
    char second[4300];
    snprintf(second, sizeof second, "%s/seg-00000002.log", t_dir);
    cr_assert_eq(access(second, F_OK), 0, "no new segment");
    s = t_open(t_local_uri(t_dir));
    cr_assert_eq(kind_of(s, "a"), IDEM_REPLAY);
    cr_assert_eq(kind_of(s, "b"), IDEM_REPLAY);
    idem_close(s);
}
