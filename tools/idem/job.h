/* job.h - an output file and an input position that survive kill -9. */
#ifndef IDEM_JOB_H
#define IDEM_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "keyspace.h"
#include "ndjson.h"

typedef struct job_pos {
    uint64_t out_len;    /* committed bytes of the output file */
    uint64_t inputs_id;  /* which inputs (0: not resumable) */
    uint64_t input;      /* input number ... */
    uint64_t offset;     /* ... byte offset in it ... */
    uint64_t lineno;     /* ... and its line number there */
    uint64_t tail_hash;  /* hash of the last line before offset, mixed
                          * with done_hash */
    uint64_t tail_len;
    uint64_t done_hash;  /* the inputs before `input` and the bytes read
                          * of each (0 while input is 0) */
} job_pos;

struct sink;

/* One entry of a stream sink: a line of obuf and the key it is for. */
typedef struct job_rec {
    size_t off, len;       /* in obuf */
    size_t koff, klen;     /* in rkeys */
    size_t moff, mlen;     /* the message's meta, in rkeys */
} job_rec;

typedef struct job {
    const char *cmd;
    idem_store *s;
    const key_space *ks;   /* where the job's keys are */
    const char *keyed;     /* how: "--key", "--line" or "--line-hash" */
    char name[IDEM_CHECKPOINT_NAME_MAX + 1]; /* "" without checkpoints */
    const char *out_path;  /* NULL: standard output */
    int out_fd;
    int out_file;          /* a regular file we may cut and sync */
    uint64_t out_len;
    cli_buf obuf;          /* the output of the batch being committed */
    job_pos pos;           /* where the committed state ends */
    int resumed;
    struct sink *sink;     /* --to a stream: entries, not a file */
    char sink_pos[8192];   /* the sink's position at the last commit (a
                            * Kafka sink's: up to 256 partitions) */
    int sink_pinned;       /* keep sink_pos where the read-back began
                            * (connect.h, source_ops.in_doubt) */
    char src_pos[16384];   /* the source's (connect.h: source_ops.pos),
                            * "" when it keeps none (a Kafka group's:
                            * long topic names, many partitions) */
    job_rec *recs;         /* the batch's entries (sink only) */
    size_t nrecs, caprecs;
    cli_buf rkeys;
} job;

/* Refuse a file the job writes, the output (out_path; NULL or "-":
 * standard output) or the dead-letter file (dead_letter; NULL: none),
 * that is the same file as one of the inputs ("-": standard input) or
 * as the other one, through any link, or that lies in store_dir (a local
 * store's directory; NULL: none), before anything is opened or changed.
 * Returns 0, or 2 after saying why. */
int job_check_files(const char *cmd, const char *out_path,
                    const char *dead_letter, char **inputs, size_t ninputs,
                    const char *store_dir);

/* The name of the job that writes out_path when no --job names it: the
 * file's real path (links resolved), or "#" and a hash of it when that
 * is longer than n - 1 bytes or not text. Into buf; returns 0 when
 * out_path is standard output or not a regular file (no job). */
int job_output_name(const char *out_path, char *buf, size_t n);

/* full as a checkpoint or key space name: itself when it is text
 * shorter than n bytes, else "#" and a hash of it. Into buf. */
void job_text_name(const char *full, char *buf, size_t n);

/* Open the output and find where to start: the checkpoint of job `name`
 * (NULL: derived from the output path) when it matches these inputs. A
 * job whose checkpoint keeps its keys in another key space than ks
 * (older versions: the shared one), or made them otherwise than `keyed`
 * (the option: "--key", "--line" or "--line-hash"), is refused: its
 * history is there, under those keys.
 * The output is cut back to what the last commit recorded. An output
 * file with bytes that no checkpoint names is refused, or with
 * `overwrite` cut to 0 bytes. Fills the start position for nd_open() in
 * at, off and lineno. Returns 0 or an exit status. */
int job_start(job *j, const char *cmd, idem_store *s, const char *name,
              const key_space *ks, const char *keyed, const char *out_path,
              int overwrite, char **inputs,
              size_t ninputs, size_t *at, uint64_t *off, uint64_t *lineno);

/* As job_start() for a stream sink (which takes ownership of it): the
 * checkpoint names the sink's position, and the entries after it are
 * read back (connect.h). Returns 0 or an exit status. */
int job_start_sink(job *j, const char *cmd, idem_store *s, const char *name,
                   const key_space *ks, const char *keyed,
                   struct sink *out);

/* The output appended to obuf since `from` is the entry of key (a stream
 * sink needs it to write idem-key), of a message with meta (NULL, 0:
 * none; connect.h); nothing for a file. 0 or -1. */
int job_mark(job *j, size_t from, const void *key, size_t keylen,
             const char *meta, size_t metalen);

/* The source's position that the next checkpoint keeps (from=); 0, or
 * -1 when it is too long for a checkpoint. */
int job_from(job *j, const char *pos);

/* Within a batch's commit (idem_commit_fn): write obuf and make it
 * durable, then put the checkpoint that says the input is consumed up to
 * `last` (a line of input number `input`; NULL: none read). 0, or an
 * IDEM_E* code after printing why. */
int job_commit(job *j, size_t input, const nd_line *last);

/* Release the output; 0 or an exit status. */
int job_end(job *j);

#endif
