/* tests/progs/forker.c - a process that forks while it holds a store.
 *
 * usage: forker URI calls|atexit
 *
 * Opens URI, claims "k" without syncing, and forks. The parent completes
 * "k" with the response "parent" and syncs; only then does the child go
 * on, with its copy of the handle, whose buffer still holds the claim:
 *
 *   calls   claims "c", completes "k" with "child", syncs: each must fail
 *           with IDEM_EINVAL, naming both processes; then it closes;
 *   atexit  exits through an atexit handler that closes the handle, as a
 *           C++ destructor or a library's cleanup would.
 *
 * The parent waits for the child, checks that "k" is still DONE with
 * "parent", and closes. Exit status 0 when everything went so; what went
 * wrong is on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "idem/idem.h"

static idem_store *store;

static void close_store(void)
{
    idem_close(store);
}

/* A call made in the child: it must be refused as a fork child's. */
static int refused(int rc, const char *what)
{
    if (rc == IDEM_EINVAL &&
        strstr(idem_errdetail(store), "fork children must open their own"))
        return 1;
    fprintf(stderr, "forker: child %s: rc %d (%s)\n", what, rc,
            idem_errdetail(store));
    return 0;
}

static int child_calls(uint64_t token)
{
    idem_key c = {"c", 1, NULL};
    idem_outcome o;
    int ok = refused(idem_claim(store, &c, NULL, &o), "claim");
    ok &= refused(idem_complete(store, "k", 1, token, "child", 5, 0),
                  "complete");
    ok &= refused(idem_sync(store), "sync");
    idem_close(store);
    return ok ? 0 : 1;
}

static int parent_done(void)
{
    idem_record r;
    int rc = idem_get(store, "k", 1, &r);
    if (rc || r.state != IDEM_STATE_DONE || r.len != 6 ||
        memcmp(r.data, "parent", 6) != 0) {
        fprintf(stderr, "forker: parent lost its completion: %s\n",
                idem_errdetail(store));
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    int go[2];
    if (argc != 3 || pipe(go) != 0)
        return 2;
    if (idem_open(argv[1], NULL, &store) != 0) {
        fprintf(stderr, "forker: %s\n", idem_errdetail(store));
        return 1;
    }
    idem_key k = {"k", 1, NULL};
    idem_outcome o;
    if (idem_claim(store, &k, NULL, &o) != 0 || o.kind != IDEM_NEW)
        return 1;
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) != 1)
            _exit(1);
        if (strcmp(argv[2], "calls") == 0)
            _exit(child_calls(o.token));
        atexit(close_store);
        exit(0);
    }
    close(go[0]);
    int rc = idem_complete(store, "k", 1, o.token, "parent", 6, 0);
    if (!rc)
        rc = idem_sync(store);
    if (rc || write(go[1], "g", 1) != 1) {
        fprintf(stderr, "forker: parent: %s\n", idem_errdetail(store));
        return 1;
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        return 1;
    int ok = parent_done();
    return idem_close(store) == 0 && ok ? 0 : 1;
}
