/* cli.h - the subcommands of the idem tool.
 *
 * Each subcommand lives in its own file and exposes one function with the
 * shape of main(): argv[0] is the subcommand's name, and the return value
 * is the process exit status. main.c maps names to these functions. */
#ifndef IDEM_CLI_H
#define IDEM_CLI_H

/* Exit statuses, the same for every subcommand. */
enum {
    IDEM_EXIT_OK = 0,   /* done */
    IDEM_EXIT_FAIL = 1, /* the work failed: I/O, a store error, ... */
    IDEM_EXIT_USAGE = 2 /* the command line was wrong; nothing was done */
};

int idem_cmd_bench(int argc, char **argv);
int idem_cmd_keygen(int argc, char **argv);

#endif
