/* redis/scripts.h - the Lua scripts behind every Redis state change. */
#ifndef IDEM_REDIS_SCRIPTS_H
#define IDEM_REDIS_SCRIPTS_H

#include <stddef.h>

enum idem__script {
    IDEM__S_CLAIM,
    IDEM__S_COMPLETE,
    IDEM__S_FAIL,
    IDEM__S_EXTEND,
    IDEM__S_GET,
    IDEM__S_FORGET,
    IDEM__S_SWEEP,
    IDEM__S_STATS,
    IDEM__S_DUMP,
    IDEM__S_IMPORT,
    IDEM__S_CHECK,
    IDEM__S_CLAIM_DONE,      /* a claim that writes NEW keys DONE */
    IDEM__S_CKPT_PUT,        /* checkpoints: PREFIX checkpoint:{NAME} */
    IDEM__S_CKPT_GET,
    IDEM__S_CKPT_CLEAR,
    IDEM__S_CKPT_COMMIT,     /* the put, with completions applied in it */
    IDEM__S_COUNT
};

/* Reasons a finishing script (complete, fail, extend) refuses a token;
 * 0 means it accepted. They are the reasons local: gives for IDEM_ELOST. */
enum {
    IDEM__WHY_NONE = 1,      /* no live record */
    IDEM__WHY_FINISHED = 2,  /* already DONE or FAILED */
    IDEM__WHY_RELEASED = 3,  /* released by a retryable failure */
    IDEM__WHY_TAKEN = 4      /* another token holds it */
};

/* Where records live (scripts.c explains both). */
enum { IDEM__LAYOUT_HASH, IDEM__LAYOUT_DAY, IDEM__LAYOUTS };

/* The text of script i for layout. */
const char *idem__script_text(int layout, enum idem__script i);

/* SHA-1 of every script of layout in hex, as EVALSHA wants it: out[i]
 * has 41 bytes. */
void idem__script_shas(int layout, char out[IDEM__S_COUNT][41]);

#endif
