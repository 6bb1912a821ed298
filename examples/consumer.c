/* examples/consumer.c - a stream consumer with exactly-once effects, the
 * README's "In C" loop as a whole program.
 *
 * Each line of standard input is a message: its first word is the message
 * ID, the idempotency key; the rest is the payload. A message is
 * "charged" (printed) only when its claim is NEW; a redelivery, here or in
 * a later run, gets the first outcome back from the store instead. The
 * store is ./idem-data (or the URI given as the only argument), so the
 * dedup holds across runs and crashes.
 *
 *   make                                # builds build/examples/consumer
 *   printf 'm1 5\nm2 7\nm1 5\n' | build/examples/consumer
 *
 * Build it elsewhere with cc consumer.c $(pkg-config --cflags --libs
 * idem). A real consumer would claim a batch with idem_claim_many() and
 * ack the broker only after idem_sync(). */
#include <idem/idem.h>
#include <stdio.h>
#include <string.h>

/* The effect, run at most once per key: here, a line on stdout. */
static int charge(const char *id, const char *payload, uint64_t token)
{
    (void)token;  /* a real sink refuses tokens below one it has seen */
    return printf("%s: charged %s\n", id, payload) < 0;
}

static int consume(idem_store *s, const char *id, const char *payload)
{
    idem_key k = {id, strlen(id), NULL};
    idem_outcome o;
    int rc = idem_claim(s, &k, NULL, &o);
    if (rc)
        return rc;
    switch (o.kind) {
    case IDEM_NEW:
        if ((rc = idem_sync(s)))  /* a crash from here on: the next worker */
            return rc;            /* takes the claim over, new token */
        if (charge(id, payload, o.token))
            return idem_fail(s, id, k.keylen, o.token, "stdout", 6,
                             IDEM_RETRYABLE);
        rc = idem_complete(s, id, k.keylen, o.token, payload, strlen(payload),
                           0);
        return rc ? rc : idem_sync(s);  /* durable: now ack the message */
    case IDEM_REPLAY:
        printf("%s: duplicate, charged %.*s before\n", id, (int)o.len,
               (const char *)o.data);
        return 0;
    case IDEM_FAILED:
        printf("%s: failed before: %.*s\n", id, (int)o.len,
               (const char *)o.data);
        return 0;
    case IDEM_BUSY:
        printf("%s: another worker holds it; do not ack\n", id);
        return 0;
    case IDEM_MISMATCH:
        printf("%s: key reused for another payload; reject\n", id);
        return 0;
    }
    return 0;
}

int main(int argc, char **argv)
{
    idem_store *s;
    if (idem_open(argc > 1 ? argv[1] : "local:./idem-data", NULL, &s)) {
        fprintf(stderr, "consumer: %s\n", idem_errdetail(s));
        idem_close(s);
        return 1;
    }
    char line[4096];
    int rc = 0;
    while (!rc && fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = '\0';
        char *payload = strchr(line, ' ');
        if (payload)
            *payload++ = '\0';
        if (*line)
            rc = consume(s, line, payload ? payload : "");
    }
    if (rc)
        fprintf(stderr, "consumer: %s: %s\n", idem_strerror(rc),
                idem_errdetail(s));
    return idem_close(s) || rc ? 1 : 0;
}
