#include "cli.h"
int idem_cmd_get(int argc, char **argv){(void)argc;(void)argv;return 2;}
int idem_cmd_forget(int argc, char **argv){(void)argc;(void)argv;return 2;}
int idem_cmd_stats(int argc, char **argv){(void)argc;(void)argv;return 2;}
int idem_cmd_sweep(int argc, char **argv){(void)argc;(void)argv;return 2;}
int idem_cmd_check(int argc, char **argv){(void)argc;(void)argv;return 2;}
int idem_cmd_repair(int argc, char **argv){(void)argc;(void)argv;return 2;}
int idem_cmd_dump(int argc, char **argv){(void)argc;(void)argv;return 2;}
int idem_cmd_load(int argc, char **argv){(void)argc;(void)argv;return 2;}
