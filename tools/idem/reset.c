/* reset.c - `idem reset --job NAME`: drop a job's checkpoint on purpose.
 *
 * A dedup or run job resumes from its checkpoint (job.c): the input
 * position and the committed length of its output. An operator who means
 * the next run to start over (the inputs were replaced, the output was
 * thrown away) drops it here rather than by hand in the store. The
 * library has no call that deletes a checkpoint; an empty one stands for
 * none (job.c reads it so), which every store can write and commit like
 * any other. The job's keys stay: what it committed is still a duplicate
 * for its next run; `idem forget` drops a key. */
#include <stdio.h>
#include <string.h>

#include "job.h"

static const char usage[] =
    "usage: idem reset [--store URI] --job NAME\n"
    "       idem reset [--store URI] --output FILE\n"
    "\n"
    "Drop the checkpoint of a dedup or run job, so that its next run reads\n"
    "its inputs from the start and takes its output afresh (an output that\n"
    "holds bytes then needs --overwrite). Says what it dropped. The job's\n"
    "keys stay in the store: messages it committed are still duplicates\n"
    "(`idem forget` drops a key). Stop the job first: a run that is going\n"
    "on writes its checkpoint again at its next commit. Exit status 1 when\n"
    "the store has no checkpoint of that job.\n"
    "\n"
    "  --job NAME     the job's --job name (dedup's and run's both go)\n"
    "  --output FILE  a job without --job: the one that writes FILE\n"
    "  --store URI    default $IDEM_STORE, else " IDEM_DEFAULT_URI "\n";

/* What the checkpoint said, in words when it reads as job.c writes it. */
static void say_dropped(const char *name, const char *blob, size_t len)
{
    char text[512];
    unsigned long long out, input, line;
    snprintf(text, sizeof text, "%.*s", (int)(len < 511 ? len : 511), blob);
    if (sscanf(text, "idem-job %*d out=%llu inputs=%*x input=%llu "
               "offset=%*u line=%llu", &out, &input, &line) == 3)
        printf("idem reset: dropped checkpoint '%s': it was after line %llu "
               "of input %llu, with %llu bytes of output committed\n",
               name, line, input + 1, out);
    else
        printf("idem reset: dropped checkpoint '%s': %s\n", name, text);
}

/* Drop checkpoint `name` if it holds one; *dropped counts it. */
static int drop(idem_store *s, const char *name, int *dropped)
{
    const void *blob;
    size_t len;
    int rc = idem_checkpoint_get(s, name, &blob, &len);
    if (rc == IDEM_ENOTFOUND || (!rc && len == 0))
        return 0;
    if (rc)
        return cli_store_fail("reset", s, rc, name);
    say_dropped(name, blob, len);
    (*dropped)++;
    rc = idem_checkpoint_put(s, name, "", 0);
    return rc ? cli_store_fail("reset", s, rc, name) : 0;
}

/* The checkpoint names of the job: "CMD:NAME" for dedup and run. */
static int reset_job(idem_store *s, const char *jobname, const char *output)
{
    static const char *const cmds[] = {"dedup", "run"};
    char name[IDEM_CHECKPOINT_NAME_MAX + 1];
    int dropped = 0, rc = 0;
    for (size_t i = 0; !rc && i < 2; i++) {
        size_t k = (size_t)snprintf(name, sizeof name, "%s:", cmds[i]);
        if (jobname && strlen(jobname) + k > IDEM_CHECKPOINT_NAME_MAX)
            return cli_usage_error("reset", "--job %.40s...: a job name is "
                                   "at most %zu bytes", jobname,
                                   IDEM_CHECKPOINT_NAME_MAX - k);
        if (jobname)
            snprintf(name + k, sizeof name - k, "%s", jobname);
        else if (!job_output_name(output, name + k, sizeof name - k))
            return cli_usage_error("reset", "--output %s is not a file a "
                                   "job writes", output);
        rc = drop(s, name, &dropped);
    }
    if (!rc && (rc = idem_sync(s)) != 0)
        return cli_store_fail("reset", s, rc, "commit");
    if (!rc && !dropped)  /* name is run:NAME */
        return cli_fail("reset", "no job %s%s%s in this store: no "
                        "checkpoint dedup:%s or run:%s", jobname ? "'" :
                        "writing ", jobname ? jobname : output,
                        jobname ? "'" : "", name + 4, name + 4);
    return rc;
}

int cli_cmd_reset(int argc, char **argv)
{
    static const struct option opts[] = {{"store", 1, 0, 's'},
                                         {"job", 1, 0, 'j'},
                                         {"output", 1, 0, 'o'},
                                         {"help", 0, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *uri = NULL, *jobname = NULL, *output = NULL;
    int ch;
    while ((ch = cli_getopt("reset", argc, argv, opts)) != -1) {
        if (ch == '?')
            return CLI_EXIT_USAGE;
        if (ch == 'h')
            return fputs(usage, stdout) < 0;
        uri = ch == 's' ? optarg : uri;
        jobname = ch == 'j' ? optarg : jobname;
        output = ch == 'o' ? optarg : output;
    }
    if (optind < argc)
        return cli_usage_error("reset", "unexpected argument '%s'",
                               argv[optind]);
    if (!jobname == !output)
        return cli_usage_error("reset", "name the job: --job NAME, or "
                               "--output FILE for a job without --job");
    if (jobname && !*jobname)
        return cli_usage_error("reset", "--job wants a name, not ''");
    idem_store *s = cli_open("reset", cli_store_uri(uri), IDEM_O_NOCREATE,
                             0, 0);
    if (!s)
        return cli_open_status();
    int rc = reset_job(s, jobname, output);
    if (idem_close(s) && !rc)
        rc = cli_fail("reset", "closing the store failed");
    return rc;
}
