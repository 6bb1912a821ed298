/* job.c - exactly-once output to a file, across kill -9 and reruns.
 *
 * The invariant: whenever the store holds a checkpoint of this job, the
 * first out_len bytes of the output file are durable and are exactly the
 * output of every message committed with it. It holds because each batch
 *
 *   1. writes its output lines and fdatasyncs the output file,
 *   2. puts the checkpoint {input position, out_len} next to its records
 *      in the store, and commits the store (the runner's commit step).
 *      If 1 fails, the runner makes sure the batch never commits.
 *
 * A crash before 2 leaves the store at the previous checkpoint and the
 * file possibly longer: the next run cuts the file back to out_len and
 * reads the input again from the checkpoint's position, and since none of
 * the batch's keys were committed they come out again, in the same order.
 * A crash after 2 leaves both at the new state. Keys committed in the
 * store whose lines were lost cannot happen: the lines were durable first.
 * A new output file's directory entry is synced too, so that a power cut
 * cannot lose the file while keeping the commit.
 *
 * Resuming at the offset is only a shortcut. Reading an input again from
 * the start gives the same output, because every key committed before is
 * now a duplicate: that is how standard input and pipes resume, and what
 * happens when the inputs are not the ones the checkpoint names (another
 * device/inode, the line before the offset changed, or bytes now follow
 * it where it had no newline, which puts the offset inside a line; the
 * reader never hands out such a line at the end of an input that may
 * still grow, see ndjson.c). New inputs on an old job append to its
 * output: the output is the first occurrence of each key over every run
 * of the job.
 *
 * Cutting back is only ever done to a file the job owns: one that a
 * checkpoint of this job names. A job without a checkpoint refuses an
 * output that already holds bytes (unless --overwrite), and takes an
 * empty or new one by committing a checkpoint of 0 bytes before writing
 * to it, so that a crash in its first batch still leaves a file the
 * rerun owns. An output that is one of the inputs is refused before
 * anything is opened: the cut would truncate what is being read.
 *
 * One process writes an output at a time: it holds an exclusive flock()
 * on the file from before it reads the checkpoint until it ends. A store
 * that many processes share (Redis) does not keep a second run of the
 * same job out, and two runs would each write at their own length and
 * commit it to the one checkpoint, so that lines of one are overwritten
 * by the other's, or cut by the next run back to the other's shorter
 * length (after an instance started while the last one still stopped,
 * say). The lock is taken before the checkpoint is read: a run that got
 * it later would cut back to a checkpoint the other moved on from.
 *
 * Without --output (standard output) nothing can be cut back, so the
 * guarantee there is at-least-once across crashes, exactly-once across
 * clean runs; the job keeps no checkpoint and reads from the start. Every
 * store keeps checkpoints, Redis included (committed with the batch's
 * writes, see docs/redis.md).
 *
 * The checkpoint also names the job's key space (keyspace.c), and a run
 * that asks for another one is refused rather than finding none of the
 * job's keys; checkpoints written before key spaces (version 1) stand for
 * the shared key space, where those versions stored every key. For the
 * same reason it names how the job keys its messages (--key, --line or
 * --line-hash, version 3): a run keyed otherwise would find every key of
 * the job new, and run again each message that comes again (a rerun
 * from the start, a redelivery). Checkpoints of version 2 do not say;
 * the next commit records the run's way.
 *
 * A stream output (--to, version 4: " to=ID") cannot be cut back, so the
 * invariant there is about what follows the position instead: whenever
 * the store holds a checkpoint naming entry ID, every entry of the
 * stream after ID that this job wrote is of a batch that may not have
 * committed. The next run reads those entries back (connect/rsink.c)
 * and does not write their keys again. The position only moves forward
 * with commits, as out_len does for a file.
 *
 * A source that keeps its own position (Kafka: an offset per partition,
 * connect.h) has it kept beside the sink's (version 5: " from=POS", "-"
 * for none), committed with the records of the messages it covers; the
 * next run resumes the source there. Versions 1 to 4 have none. */
#include "job.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "connect.h"

/* A checkpoint's text: seven numbers, how keys are made, a key space
 * name and the streams' positions. */
#define CHECKPOINT_MAX (4096 + KS_NAME_MAX + sizeof ((job *)0)->sink_pos + \
                        sizeof ((job *)0)->src_pos)

/* Identity of the input list: device and inode of each file; 0 when one
 * is not a regular file (a pipe cannot be resumed at an offset). */
static uint64_t inputs_id(char **inputs, size_t n)
{
    XXH3_state_t *st = XXH3_createState();
    uint64_t id = 0;
    if (st && XXH3_64bits_reset(st) == XXH_OK) {
        size_t i = 0;
        for (; i < (n ? n : 1); i++) {
            struct stat sb;
            if (!n || !strcmp(inputs[i], "-") || stat(inputs[i], &sb) ||
                !S_ISREG(sb.st_mode))
                break;
            uint64_t v[2] = {(uint64_t)sb.st_dev, (uint64_t)sb.st_ino};
            XXH3_64bits_update(st, v, sizeof v);
        }
        if (i == (n ? n : 1))
            id = XXH3_64bits_digest(st) | 1;
    }
    XXH3_freeState(st);
    return id;
}

/* The device and inode behind an input or output name ("-" and NULL:
 * the standard stream fd); 0 when there is none to compare. */
static int identity(const char *path, int fd, struct stat *sb)
{
    return path && strcmp(path, "-") ? stat(path, sb) == 0
                                     : fstat(fd, sb) == 0;
}

/* A file a job writes: its option, and its path (NULL or "-": the
 * standard stream fd; fd -1: none, so NULL is no file). */
typedef struct written {
    const char *opt, *path;
    int fd;
} written;

static int is_stream(const written *w)
{
    return !w->path || !strcmp(w->path, "-");
}

/* A file inside a local store's directory would be one of the store's
 * files, or be overwritten by them (a segment, TAIL). */
static int in_store_dir(const char *cmd, const written *w,
                        const char *store_dir)
{
    char dir[PATH_MAX], store[PATH_MAX];
    struct stat d, s;
    if (!store_dir || is_stream(w))
        return 0;
    snprintf(dir, sizeof dir, "%s", w->path);
    /* local:DIR?mode=group: the directory ends at the parameters. */
    snprintf(store, sizeof store, "%.*s", (int)strcspn(store_dir, "?"),
             store_dir);
    if (stat(dirname(dir), &d) != 0 || stat(store, &s) != 0 ||
        d.st_dev != s.st_dev || d.st_ino != s.st_ino)
        return 0;
    return cli_usage_error(cmd, "%s %s is inside the store's directory "
                           "%s, among its own files: write it elsewhere",
                           w->opt, w->path, store);
}

/* Where w is: its device and inode, 0 when there is nothing there yet or
 * nothing that can be cut (a pipe, a terminal). */
static int regular(const written *w, struct stat *sb)
{
    return (!is_stream(w) || w->fd >= 0) &&
           identity(w->path, w->fd, sb) && S_ISREG(sb->st_mode);
}

/* "--output out", or "standard output". */
static const char *shown(const written *w, char *buf, size_t n)
{
    if (is_stream(w))
        return "standard output";
    snprintf(buf, n, "%s %s", w->opt, w->path);
    return buf;
}

/* w is not one of the inputs (nor standard input, when one is "-"). */
static int not_an_input(const char *cmd, const written *w, char **inputs,
                        size_t ninputs)
{
    struct stat out, in;
    char name[PATH_MAX + 32];
    if (!regular(w, &out))
        return 0;
    for (size_t i = 0; i < (ninputs ? ninputs : 1); i++) {
        const char *p = ninputs ? inputs[i] : "-";
        if (identity(p, 0, &in) && in.st_dev == out.st_dev &&
            in.st_ino == out.st_ino)
            return cli_usage_error(cmd, "%s is also an input (%s is the "
                                   "same file): writing it would destroy "
                                   "what is being read. Write to another "
                                   "file", shown(w, name, sizeof name),
                                   strcmp(p, "-")
                                   ? p : "standard input");
    }
    return 0;
}

/* Two files a job writes are the same one: the same inode, or, while
 * neither exists, the same real path (links in the directories
 * resolved). */
static int same_file(const written *a, const written *b)
{
    struct stat sa, sb;
    char na[2 * PATH_MAX + 2], nb[2 * PATH_MAX + 2];
    if (regular(a, &sa) && regular(b, &sb))
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    return !is_stream(a) && !is_stream(b) &&
           job_output_name(a->path, na, sizeof na) &&
           job_output_name(b->path, nb, sizeof nb) && !strcmp(na, nb);
}

int job_check_files(const char *cmd, const char *out_path,
                    const char *dead_letter, char **inputs, size_t ninputs,
                    const char *store_dir)
{
    const written files[] = {{"--output", out_path, 1},
                             {"--dead-letter", dead_letter, -1}};
    size_t n = dead_letter ? 2 : 1;
    char a[PATH_MAX + 32], b[PATH_MAX + 32];
    for (size_t i = 0; i < n; i++) {
        int rc = in_store_dir(cmd, &files[i], store_dir);
        rc = rc ? rc : not_an_input(cmd, &files[i], inputs, ninputs);
        for (size_t j = 0; !rc && j < i; j++)
            if (same_file(&files[i], &files[j]))
                rc = cli_usage_error(cmd, "%s is the same file as %s: give "
                                     "each its own file",
                                     shown(&files[i], a, sizeof a),
                                     shown(&files[j], b, sizeof b));
        if (rc)
            return rc;
    }
    return 0;
}

int job_output_name(const char *out_path, char *buf, size_t n)
{
    struct stat sb;
    if (!out_path || !strcmp(out_path, "-") ||
        (stat(out_path, &sb) == 0 && !S_ISREG(sb.st_mode)))
        return 0;
    /* The file itself, links resolved: /dev/stdout or a symlink names
     * the file behind it, which is the job's, not the name. */
    char full[2 * PATH_MAX + 2], real[PATH_MAX];
    if (realpath(out_path, real)) {
        snprintf(full, sizeof full, "%s", real);
    } else {
        char dir[PATH_MAX], base[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", out_path);
        snprintf(base, sizeof base, "%s", out_path);
        const char *d = realpath(dirname(dir), real) ? real : ".";
        snprintf(full, sizeof full, "%s/%s", d, basename(base));
    }
    job_text_name(full, buf, n);
    return 1;
}

void job_text_name(const char *full, char *buf, size_t n)
{
    size_t len = strlen(full);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)full[i] < 0x20)
            len = SIZE_MAX - 1;  /* not text: use the hash */
    if (len < n)
        snprintf(buf, n, "%s", full);
    else
        snprintf(buf, n, "#%016" PRIx64,
                 (uint64_t)XXH3_64bits(full, strlen(full)));
}

static void default_name(job *j, const char *out_path)
{
    size_t k = strlen(j->cmd) + 1;
    snprintf(j->name, sizeof j->name, "%s:", j->cmd);
    job_output_name(out_path, j->name + k, sizeof j->name - k);
}

/* A job's keys stay in the key space they were committed in: a run that
 * names another would find none of them and do every message again. The
 * checkpoint's tail says which (version 1, before key spaces: the shared
 * one). 0 if it is j->ks, else 1 after saying what to type. */
static int same_key_space(const job *j, int version, const char *tail)
{
    const char *name = NULL;
    if (version >= 2 && !strncmp(tail, " space=", 7))
        name = tail + 7;
    else if (version >= 2 && strcmp(tail, " shared"))
        return cli_fail(j->cmd, "checkpoint '%s' is not one idem wrote; "
                        "use another --job", j->name);
    if (ks_is(j->ks, name, name ? strlen(name) : 0))
        return 0;
    if (version == 1)
        return cli_fail(j->cmd, "job '%s' was committed by an idem without "
                        "key spaces, so its keys are in the shared key "
                        "space. Add --shared-keys to keep them (or name a "
                        "new --job to start afresh in its own key space)",
                        j->name);
    if (name)
        return cli_fail(j->cmd, "job '%s' keeps its keys in key space '%s'; "
                        "run it with --key-space '%s' (or name a new --job "
                        "to start afresh)", j->name, name, name);
    return cli_fail(j->cmd, "job '%s' keeps its keys in the shared key "
                    "space; run it with --shared-keys (or name a new --job "
                    "to start afresh)", j->name);
}

/* Version 3 says after " keys=" how the job made its keys; a run that
 * makes them otherwise is refused. *tail moves past it. 0 or 1. */
static int same_keying(const job *j, int version, const char **tail)
{
    if (version < 3)
        return 0;
    size_t n = strncmp(*tail, " keys=", 6) ? 0 : strcspn(*tail + 6, " ");
    if (!n)
        return cli_fail(j->cmd, "checkpoint '%s' is not one idem wrote; "
                        "use another --job", j->name);
    const char *was = *tail + 6;
    *tail = was + n;
    if (n == strlen(j->keyed) && !memcmp(was, j->keyed, n))
        return 0;
    return cli_fail(j->cmd, "job '%s' keyed its messages with %.*s, this "
                    "run with %s: none of its keys would be found, and "
                    "every message that comes again would be new again. "
                    "Run it with %.*s (or name a new --job to start afresh)",
                    j->name, (int)n, was, j->keyed, (int)n, was);
}

/* Version 4 says after " to=" where a stream sink was at the commit
 * ("-" for a file). *tail moves past it. 0 or 1. */
static int sink_position(job *j, const char **tail)
{
    size_t n = strncmp(*tail, " to=", 4) ? 0 : strcspn(*tail + 4, " ");
    if (!n || n >= sizeof j->sink_pos ||
        (j->sink && !strncmp(*tail + 4, "-", n)) ||
        (!j->sink && strncmp(*tail + 4, "-", n)))
        return cli_fail(j->cmd, "checkpoint '%s' is not one idem wrote for "
                        "this %s; use another --job", j->name,
                        j->sink ? "stream" : "file");
    snprintf(j->sink_pos, sizeof j->sink_pos, "%.*s", (int)n, *tail + 4);
    *tail += 4 + n;
    return 0;
}

/* Version 5 says after " from=" where a source that keeps its own
 * position was ("-": none). *tail moves past it. 0 or 1. */
static int source_position(job *j, const char **tail)
{
    size_t n = strncmp(*tail, " from=", 6) ? 0 : strcspn(*tail + 6, " ");
    if (!n || n >= sizeof j->src_pos)
        return cli_fail(j->cmd, "checkpoint '%s' is not one idem wrote; "
                        "use another --job", j->name);
    snprintf(j->src_pos, sizeof j->src_pos, "%.*s", (int)n, *tail + 6);
    if (!strcmp(j->src_pos, "-"))
        j->src_pos[0] = 0;
    *tail += 6 + n;
    return 0;
}

int job_from(job *j, const char *pos)
{
    size_t n = strlen(pos);
    if (n >= sizeof j->src_pos || strchr(pos, ' '))
        return -1;
    memcpy(j->src_pos, pos, n + 1);
    return 0;
}

static int read_checkpoint(job *j, int *found)
{
    const void *blob;
    size_t len;
    *found = 0;
    int rc = idem_checkpoint_get(j->s, j->name, &blob, &len);
    if (rc == IDEM_ENOTFOUND || (!rc && !len))  /* empty: reset.c */
        return 0;
    if (rc)
        return cli_store_fail(j->cmd, j->s, rc, "reading the checkpoint");
    char text[CHECKPOINT_MAX];
    snprintf(text, sizeof text, "%.*s",
             (int)(len < sizeof text - 1 ? len : sizeof text - 1),
             (const char *)blob);
    job_pos *p = &j->pos;
    int version = 0, end = 0;
    if (sscanf(text,
               "idem-job %d out=%" SCNu64 " inputs=%" SCNx64 " input=%" SCNu64
               " offset=%" SCNu64 " line=%" SCNu64 " tail=%" SCNx64
               "/%" SCNu64 "%n",
               &version, &p->out_len, &p->inputs_id, &p->input, &p->offset,
               &p->lineno, &p->tail_hash, &p->tail_len, &end) != 8 ||
        !end || version < 1 || version > 5)
        return cli_fail(j->cmd, "checkpoint '%s' is not one idem wrote; "
                        "use another --job", j->name);
    *found = 1;
    const char *tail = text + end;
    if (version >= 4 && sink_position(j, &tail))
        return 1;
    if (version >= 5 && source_position(j, &tail))
        return 1;
    return same_keying(j, version, &tail) ||
           same_key_space(j, version, tail);
}

/* Chain input i, of which n bytes were read, into a done_hash. */
static uint64_t done_step(uint64_t h, uint64_t i, uint64_t n)
{
    uint64_t v[2] = {i, n};
    return XXH3_64bits_withSeed(v, sizeof v, h);
}

/* done_hash of inputs[0..upto) as they are now: each read to its end. */
static uint64_t done_now(char **inputs, uint64_t upto)
{
    uint64_t h = 0;
    for (uint64_t i = 0; i < upto; i++) {
        struct stat sb;
        h = done_step(h, i, stat(inputs[i], &sb) == 0
                                ? (uint64_t)sb.st_size : UINT64_MAX);
    }
    return h;
}

/* Does the line before the checkpoint's offset still read the same,
 * have the inputs before it not grown since they were read to their
 * end (lines appended to them would never be read), and does the offset
 * not fall inside a line? A line without its newline (the end of an
 * input that another one followed, or a checkpoint of an idem that
 * committed unterminated last lines) is whole only while nothing
 * follows it: bytes appended since would be its continuation. */
static int tail_matches(const job_pos *p, char **inputs)
{
    if (p->tail_len == 0 || p->tail_len > p->offset)
        return p->tail_len == 0;
    char *b = malloc(p->tail_len + 1);
    int fd = b ? open(inputs[p->input], O_RDONLY | O_CLOEXEC) : -1;
    ssize_t got = fd >= 0 ? pread(fd, b, p->tail_len + 1,
                                  (off_t)(p->offset - p->tail_len))
                          : -1;
    int ok = got >= (ssize_t)p->tail_len &&
             (XXH3_64bits(b, p->tail_len) ^ done_now(inputs, p->input)) ==
                 p->tail_hash &&
             (got == (ssize_t)p->tail_len || b[p->tail_len - 1] == '\n');
    if (fd >= 0)
        close(fd);
    free(b);
    return ok;
}

static int open_output(job *j)
{
    if (!j->out_path) {
        j->out_fd = 1;
        return 0;
    }
    struct stat sb;
    int existed = stat(j->out_path, &sb) == 0;
    j->out_fd = open(j->out_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (j->out_fd < 0 || fstat(j->out_fd, &sb) != 0)
        return cli_fail(j->cmd, "cannot open --output %s: %s", j->out_path,
                        strerror(errno));
    j->out_file = S_ISREG(sb.st_mode);
    if (j->out_file && flock(j->out_fd, LOCK_EX | LOCK_NB) != 0)
        return errno == EWOULDBLOCK
                   ? cli_fail(j->cmd, "--output %s is being written by "
                              "another idem process (this job, run "
                              "twice?); run one at a time: each would cut "
                              "the other's lines", j->out_path)
                   : cli_fail(j->cmd, "cannot lock --output %s: %s",
                              j->out_path, strerror(errno));
    if (!existed && j->out_file) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", j->out_path);
        int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    return 0;
}

/* Cut the output back to what the last commit recorded. */
static int cut_output(job *j)
{
    struct stat sb;
    if (fstat(j->out_fd, &sb) != 0)
        return cli_fail(j->cmd, "%s: %s", j->out_path, strerror(errno));
    if ((uint64_t)sb.st_size < j->pos.out_len)
        return cli_fail(j->cmd,
                        "%s holds %lld bytes, but job '%s' committed %" PRIu64
                        " bytes to it: the file was changed or replaced by "
                        "something else. Restore it, or start over with a "
                        "fresh --store (its keys are already committed)",
                        j->out_path, (long long)sb.st_size, j->name,
                        j->pos.out_len);
    if (ftruncate(j->out_fd, (off_t)j->pos.out_len) != 0 ||
        lseek(j->out_fd, (off_t)j->pos.out_len, SEEK_SET) < 0 ||
        fdatasync(j->out_fd) != 0)
        return cli_fail(j->cmd, "%s: cannot cut back to %" PRIu64
                        " bytes: %s", j->out_path, j->pos.out_len,
                        strerror(errno));
    j->out_len = j->pos.out_len;
    return 0;
}

/* An output file that holds bytes and that no checkpoint of this store
 * names is not the job's: another store's job, a renamed job or a file
 * made by hand. Cutting it back to the 0 bytes that "no checkpoint"
 * means would destroy it, so only --overwrite allows that. */
static int may_take_output(const job *j, int found, int overwrite)
{
    struct stat sb;
    if (found || overwrite || !j->out_path ||
        stat(j->out_path, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_size == 0)
        return 0;
    return cli_fail(j->cmd, "--output %s already holds %lld bytes, and no "
                    "checkpoint of this store names it (job '%s' has "
                    "none): it is not this job's output, so it is not cut. "
                    "Pass --overwrite to start it over, or run the job "
                    "that wrote it (its --store and --job)",
                    j->out_path, (long long)sb.st_size, j->name);
}

static int put_checkpoint(job *j)
{
    char text[CHECKPOINT_MAX];
    int n = snprintf(text, sizeof text,
                     "idem-job 5 out=%" PRIu64 " inputs=%" PRIx64
                     " input=%" PRIu64 " offset=%" PRIu64 " line=%" PRIu64
                     " tail=%" PRIx64 "/%" PRIu64 " to=%s from=%s keys=%s "
                     "%s%s",
                     j->pos.out_len, j->pos.inputs_id, j->pos.input,
                     j->pos.offset, j->pos.lineno, j->pos.tail_hash,
                     j->pos.tail_len, j->sink ? j->sink_pos : "-",
                     j->src_pos[0] ? j->src_pos : "-", j->keyed,
                     j->ks->name ? "space=" : "shared",
                     j->ks->name ? j->ks->name : "");
    return idem_checkpoint_put(j->s, j->name, text, (size_t)n);
}

/* The job takes its output before writing a byte to it: a checkpoint of
 * 0 bytes, committed, so that after a crash in the first batch the file
 * is known as the job's and cut back, not refused as someone else's. */
static int take_output(job *j)
{
    int rc = put_checkpoint(j);
    rc = rc ? rc : idem_sync(j->s);
    return rc ? cli_store_fail(j->cmd, j->s, rc, "taking the output") : 0;
}

int job_start(job *j, const char *cmd, idem_store *s, const char *name,
              const key_space *ks, const char *keyed, const char *out_path,
              int overwrite, char **inputs,
              size_t ninputs, size_t *at, uint64_t *off, uint64_t *lineno)
{
    memset(j, 0, sizeof *j);
    j->cmd = cmd;
    j->s = s;
    j->ks = ks;
    j->keyed = keyed;
    j->out_path = out_path && strcmp(out_path, "-") ? out_path : NULL;
    *at = 0;
    *off = *lineno = 0;
    struct stat sb;
    if (name)
        snprintf(j->name, sizeof j->name, "%s:%s", cmd, name);
    else if (j->out_path && (stat(j->out_path, &sb) != 0 ||
                             S_ISREG(sb.st_mode)))
        default_name(j, j->out_path);
    int found = 0, rc = 0;
    if ((rc = open_output(j)) != 0 ||
        (j->name[0] && (rc = read_checkpoint(j, &found)) != 0))
        return rc;
    if (!found)
        j->pos = (job_pos){0};
    if ((rc = may_take_output(j, found, overwrite)) != 0)
        return rc;
    if (j->out_file && (rc = cut_output(j)) != 0)
        return rc;
    if (j->out_file && !found && (rc = take_output(j)) != 0)
        return rc;
    uint64_t id = inputs_id(inputs, ninputs);
    if (found && id && id == j->pos.inputs_id &&
        j->pos.input < (ninputs ? ninputs : 1) &&
        tail_matches(&j->pos, inputs)) {
        *at = (size_t)j->pos.input;
        *off = j->pos.offset;
        *lineno = j->pos.lineno;
        j->pos.done_hash = done_now(inputs, j->pos.input);
        j->resumed = 1;
    }
    j->pos.inputs_id = id;
    return 0;
}

int job_start_sink(job *j, const char *cmd, idem_store *s, const char *name,
                   const key_space *ks, const char *keyed, sink *out)
{
    memset(j, 0, sizeof *j);
    j->cmd = cmd;
    j->s = s;
    j->ks = ks;
    j->keyed = keyed;
    j->sink = out;
    j->out_fd = -1;
    size_t k = strlen(cmd) + 1;
    snprintf(j->name, sizeof j->name, "%s:", cmd);
    job_text_name(name, j->name + k, sizeof j->name - k);
    /* One run of the job at a time, from before its checkpoint is read,
     * as flock() on an --output file. */
    if (out->ops->lock) {
        int st = out->ops->lock(out, j->name);
        if (st)
            return st;
    }
    int found = 0, rc = read_checkpoint(j, &found);
    if (rc)
        return rc;
    if (found) {
        j->resumed = 1;
        return out->ops->read_back(out, j->sink_pos) ? 1 : 0;
    }
    if (out->ops->start(out))
        return 1;
    snprintf(j->sink_pos, sizeof j->sink_pos, "%s", out->ops->pos(out));
    return take_output(j);
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int job_mark(job *j, size_t from, const void *key, size_t keylen,
             const char *meta, size_t metalen)
{
    if (!j->sink || j->obuf.len == from)
        return 0;
    if (j->nrecs == j->caprecs) {
        size_t cap = j->caprecs ? 2 * j->caprecs : 1024;
        job_rec *r = realloc(j->recs, cap * sizeof *r);
        if (!r)
            return -1;
        j->recs = r;
        j->caprecs = cap;
    }
    j->recs[j->nrecs++] = (job_rec){from, j->obuf.len - from, j->rkeys.len,
                                    keylen, j->rkeys.len + keylen, metalen};
    return cli_buf_add(&j->rkeys, key, keylen) ||
                   (metalen && cli_buf_add(&j->rkeys, meta, metalen))
               ? -1
               : 0;
}

/* The batch's entries into the stream, flushed; its position kept. */
static int write_sink(job *j)
{
    int rc = 0;
    for (size_t i = 0; !rc && i < j->nrecs; i++) {
        const job_rec *r = &j->recs[i];
        rc = j->sink->ops->put(j->sink, j->obuf.p + r->off, r->len,
                               j->rkeys.p + r->koff, r->klen,
                               r->mlen ? j->rkeys.p + r->moff : NULL,
                               r->mlen);
    }
    rc = rc ? rc : j->sink->ops->flush(j->sink);
    j->nrecs = 0;
    j->rkeys.len = 0;
    if (rc)
        return IDEM_EIO;
    if (!j->sink_pinned)
        snprintf(j->sink_pos, sizeof j->sink_pos, "%s",
                 j->sink->ops->pos(j->sink));
    return 0;
}

static int write_file(job *j)
{
    if (write_all(j->out_fd, j->obuf.p, j->obuf.len) != 0 ||
        (j->out_file && fdatasync(j->out_fd) != 0)) {
        cli_fail(j->cmd, "writing %s: %s",
                 j->out_path ? j->out_path : "standard output",
                 strerror(errno));
        return IDEM_EIO;
    }
    j->out_len += j->obuf.len;
    j->pos.out_len = j->out_len;
    return 0;
}

int job_commit(job *j, size_t input, const nd_line *last)
{
    int wrote = j->sink ? j->nrecs > 0 : j->obuf.len > 0;
    int rc = j->sink ? write_sink(j) : write_file(j);
    if (rc)
        return rc;
    if (wrote)
        cli_kill_point("sink-written");  /* written, not yet committed */
    j->obuf.len = 0;
    if (last && !j->sink) {
        /* Inputs left behind were read to their end: the last line
         * committed of the one we were in ended it; any in between had
         * nothing committed, so nothing to read. */
        for (uint64_t i = j->pos.input; i < input; i++)
            j->pos.done_hash = done_step(j->pos.done_hash, i,
                                         i == j->pos.input ? j->pos.offset
                                                           : 0);
        j->pos.input = input;
        j->pos.offset = last->end;
        j->pos.lineno = last->lineno;
        j->pos.tail_len = last->len + (size_t)last->has_nl;
        j->pos.tail_hash = XXH3_64bits(last->p, j->pos.tail_len) ^
                           j->pos.done_hash;
    }
    return j->name[0] ? put_checkpoint(j) : 0;
}

int job_end(job *j)
{
    cli_buf_free(&j->obuf);
    cli_buf_free(&j->rkeys);
    free(j->recs);
    if (j->sink)
        j->sink->ops->close(j->sink);
    j->sink = NULL;
    if (j->out_path && j->out_fd >= 0 && close(j->out_fd) != 0)
        return cli_fail(j->cmd, "closing %s: %s", j->out_path,
                        strerror(errno));
    return 0;
}
