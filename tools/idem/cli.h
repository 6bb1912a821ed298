/* cli.h - the subcommands of the idem tool. Each returns the exit status:
 * 0 success, 1 failure of the work, 2 bad usage. */
#ifndef IDEM_CLI_H
#define IDEM_CLI_H

int idem_cmd_bench(int argc, char **argv);

#endif
