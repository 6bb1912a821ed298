/* tests/test_operators.c - what an operator relies on: a password that
 * never shows (a real redis-server with requirepass; errors of the
 * library and of the CLI, stats, --stats-json), passwords from a file and
 * from the environment, private store files whatever the umask (checked
 * with stat()), and reading a store that a running job holds, which
 * changes nothing on disk. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "redis_harness.h"

#define PW "h8-Pw-Xq7z"  /* the server's password; must never show */

static th_servers sv;
static char addr[64];

static void start_server(void)
{
    th_start_single_with(&sv, "--requirepass " PW);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", sv.ports[0]);
}

static void stop_server(void)
{
    th_stop(&sv);
}

TestSuite(secrets, .init = start_server, .fini = stop_server,
          .timeout = 120);

static int open_rc(const char *uri, idem_store **s)
{
    idem_opts o;
    idem_opts_init(&o);
    return idem_open(uri, &o, s);
}

/* Open uri, expect rc, and check that the detail says nothing of the
 * password. */
static void expect_hidden(const char *uri, int want)
{
    idem_store *s;
    int rc = open_rc(uri, &s);
    cr_assert_eq(rc, want, "%s: %s: %s", uri, idem_strerror(rc),
                 idem_errdetail(s));
    cr_assert(!strstr(idem_errdetail(s), PW) &&
                  !strstr(idem_errdetail(s), "wr0ng"),
              "the detail shows a password: %s", idem_errdetail(s));
    idem_close(s);
}

/* Does the file hold no password? */
static void expect_file_hidden(const char *path)
{
    cr_assert(!t_grep(path, PW) && !t_grep(path, "wr0ng"),
              "%s shows a password:\n%s", path, t_read(path, NULL));
}

Test(secrets, display)
{
    static const char *const cases[][2] = {
        {"redis://:" PW "@h:1/2?prefix=p", "redis://:***@h:1/2?prefix=p"},
        {"redis://u:" PW "@h", "redis://u:***@h"},
        {"redis://" PW "@h", "redis://***@h"},
        {"redis://u:p@w%40:x@h?wait=1", "redis://u:***@h?wait=1"},
        {"redis-cluster://u:" PW "@a:1,b:2", "redis-cluster://u:***@a:1,b:2"},
        {"redis:/:" PW "@h", "redis:/:***@h"},
        {"rediss://:" PW "@h", "rediss://:***@h"},
        {"redis://u:@h", "redis://u:@h"},
        {"redis://h:1?prefix=a@b", "redis://h:1?prefix=a@b"},
        {"redis://u:p?w@h:1/2?prefix=a", "redis://u:***@h:1/2?prefix=a"},
        {"redis://u:p?w@h:1", "redis://u:***@h:1"},
        {"redis://h:1/2?prefix=a@b", "redis://h:1/2?prefix=a@b"},
        {"local:./a@b:c", "local:./a@b:c"},
        {"redis-sentinel://u:" PW "@a:1,b:2/m?sentinel_password=" PW
         "&wait=1", "redis-sentinel://u:***@a:1,b:2/m?sentinel_password=***"
         "&wait=1"},
        {"redis-sentinel://a/m?db=2&sentinel_password=" PW,
         "redis-sentinel://a/m?db=2&sentinel_password=***"},
        {"redis-sentinel://a/m?sentinel_password_file=/p&sentinel_user=u",
         "redis-sentinel://a/m?sentinel_password_file=/p&sentinel_user=u"},
        {"redis://h?password=" PW, "redis://h?password=***"},
        {"redis://h?PASSWORD=" PW "&db=1", "redis://h?PASSWORD=***&db=1"},
        {"redis://h?Sentinel_Password=" PW, "redis://h?Sentinel_Password=***"},
        {"", "local:./idem-data"},
    };
    char buf[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = idem_uri_display(cases[i][0], buf, sizeof buf);
        cr_assert_str_eq(buf, cases[i][1]);
        cr_assert_eq(n, strlen(cases[i][1]));
    }
    /* Cut short like snprintf, never past size. */
    cr_assert_eq(idem_uri_display("redis://:" PW "@host", buf, 12), 17);
    cr_assert_str_eq(buf, "redis://:**");
    cr_assert_eq(idem_uri_display(NULL, NULL, 0), 17);
}

Test(secrets, errors_never_show_the_password)
{
    char uri[512];
    /* A wrong password, a right one with an unknown parameter, a host
     * that does not exist, a port where nothing listens, a cluster. */
    snprintf(uri, sizeof uri, "redis://:wr0ng@%s", addr);
    expect_hidden(uri, IDEM_EAUTH);
    snprintf(uri, sizeof uri, "redis://default:wr0ng@%s", addr);
    expect_hidden(uri, IDEM_EAUTH);
    snprintf(uri, sizeof uri, "redis://:%s@%s?timout_ms=5", PW, addr);
    expect_hidden(uri, IDEM_EINVAL);
    expect_hidden("redis://:" PW "@no-such-host.invalid:6379?timeout_ms=3000",
                  IDEM_ECONN);
    expect_hidden("redis://:" PW "@127.0.0.1:1?timeout_ms=3000", IDEM_ECONN);
    expect_hidden("redis-cluster://u:" PW "@127.0.0.1:1?timeout_ms=3000",
                  IDEM_ECONN);
    expect_hidden("rediss://:" PW "@127.0.0.1:1", IDEM_EINVAL);
    expect_hidden("redis:/:" PW "@127.0.0.1:1", IDEM_EINVAL);
    /* The right password opens it. */
    idem_store *s;
    snprintf(uri, sizeof uri, "redis://:%s@%s", PW, addr);
    cr_assert_eq(open_rc(uri, &s), 0, "%s", idem_errdetail(s));
    idem_close(s);
}

Test(secrets, cli_never_shows_the_password)
{
    char *dir = t_tmpdir();
    t_sh("printf '{\"id\":1}\\n{\"id\":1}\\n' > '%s/in'", dir);
    /* Every command, its output and its errors, on both streams. */
    cr_assert_eq(t_cli(dir, "stats --store redis://:%s@%s > out 2>&1", PW,
                       addr), 0);
    cr_assert(t_sh("grep -q 'redis://:\\*\\*\\*@' '%s/out'", dir) == 0);
    cr_assert_eq(t_cli(dir, "dedup --key id --stats-json --store "
                            "redis://:%s@%s in >> out 2>&1", PW, addr), 0);
    cr_assert_eq(t_cli(dir, "get --store redis://:%s@%s --job dedup 1 "
                            ">> out 2>&1", PW, addr), 0);
    cr_assert_eq(t_cli(dir, "dump --store redis://:%s@%s >> out 2>&1", PW,
                       addr), 0);
    cr_assert_eq(t_cli(dir, "check --store redis://:%s@%s >> out 2>&1", PW,
                       addr), 0);
    cr_assert_neq(t_cli(dir, "stats --store redis://:wr0ng@%s >> out 2>&1",
                        addr), 0);
    cr_assert_neq(t_cli(dir, "get --store redis://u:wr0ng@%s k >> out 2>&1",
                        addr), 0);
    cr_assert_neq(t_cli(dir, "check --store redis://:wr0ng@%s >> out 2>&1",
                        addr), 0);
    cr_assert_neq(t_cli(dir, "dedup --key id --store redis://:wr0ng@%s in "
                             ">> out 2>&1", addr), 0);
    cr_assert_neq(t_cli(dir, "stats --store 'redis://:%s@%s?pool=0' "
                             ">> out 2>&1", PW, addr), 0);
    cr_assert_neq(t_cli(dir, "stats --store 'redis://:%s@no-such-host."
                             "invalid:1?timeout_ms=3000' >> out 2>&1", PW),
                  0);
    char out[4200];
    snprintf(out, sizeof out, "%s/out", dir);
    cr_assert(t_grep(out, "WRONGPASS"), "%s", t_read(out, NULL));
    cr_assert(t_grep(out, "\"new\":1"), "%s", t_read(out, NULL));
    expect_file_hidden(out);
    t_rmdir(dir);
    free(dir);
}

Test(secrets, password_from_the_environment)
{
    char uri[512];
    snprintf(uri, sizeof uri, "redis://%s", addr);
    expect_hidden(uri, IDEM_EAUTH);  /* NOAUTH: none given */
    setenv("IDEM_REDIS_PASSWORD", PW, 1);
    idem_store *s;
    cr_assert_eq(open_rc(uri, &s), 0, "%s", idem_errdetail(s));
    idem_key k = {"env", 3, NULL};
    idem_outcome o;
    cr_assert_eq(idem_claim(s, &k, NULL, &o), 0, "%s", idem_errdetail(s));
    idem_close(s);
    /* A user named in the URI, the password from the environment. */
    snprintf(uri, sizeof uri, "redis://default:@%s", addr);
    cr_assert_eq(open_rc(uri, &s), 0, "%s", idem_errdetail(s));
    idem_close(s);
    /* The URI's own password comes first. */
    snprintf(uri, sizeof uri, "redis://:wr0ng@%s", addr);
    expect_hidden(uri, IDEM_EAUTH);
    /* And the CLI reads it too. */
    char *dir = t_tmpdir();
    cr_assert_eq(t_cli(dir, "stats --store redis://%s > out 2>&1", addr), 0);
    char out[4200];
    snprintf(out, sizeof out, "%s/out", dir);
    expect_file_hidden(out);
    t_rmdir(dir);
    free(dir);
}

/* The handler of `idem run`, and all it starts, get idem's environment
 * without the store's password, whether it came in $IDEM_REDIS_PASSWORD
 * or in a $IDEM_STORE URI. The handler writes its environment to a file
 * before it answers. */
Test(secrets, the_handler_does_not_inherit_the_password)
{
    static const char *const how[] = {
        "IDEM_REDIS_PASSWORD=" PW " IDEM_STORE=redis://",
        "IDEM_STORE=redis://:" PW "@"};
    char *dir = t_dir_with("in", "{\"id\":\"a\"}\n");
    for (int i = 0; i < 2; i++) {
        char env[600];
        snprintf(env, sizeof env, "%s%s", how[i], addr);
        cr_assert_eq(t_sh("cd '%s' && IDEM_KEPT=yes %s \"$IDEM_CLI\" run "
                          "--key id --key-space k%d --exec 'env > env%d; "
                          "exec \"$IDEM_PROGS/handler\"' in > out 2>&1",
                          dir, env, i, i), 0, "%s",
                     t_read(t_path(dir, "out"), NULL));
        const char *got = t_path(dir, i ? "env1" : "env0");
        cr_assert(t_grep(got, "IDEM_KEPT=yes"), "%s", t_read(got, NULL));
        cr_assert(!t_grep(got, "IDEM_REDIS_PASSWORD"), "%s",
                  t_read(got, NULL));
        expect_file_hidden(got);
    }
    cr_assert(t_grep(t_path(dir, "env0"), "IDEM_STORE=redis://"),
              "a URI without a password is passed on");
    t_rmdir(dir);
    free(dir);
}

/* A URI given where a file is meant (redis:// for redis-stream://, a
 * stream for --output) is refused as bad usage, shown without its
 * password; as a file name, every message about it showed it. */
Test(secrets, a_uri_for_a_file_is_refused_without_its_password)
{
    static const char *const args[] = {
        "dedup --key id --from 'redis://:" PW "@h/s?group=g'",
        "dedup --key id --to 'redis://u:" PW "@h/s' in",
        "dedup --key id --output 'redis-stream://:" PW "@h/s' in",
        "dedup --key id 'redis://:" PW "@h/s'",
        "run --key id --exec cat --dead-letter 'redis://:" PW "@h/dl' in"};
    char *dir = t_dir_with("in", "{\"id\":\"a\"}\n");
    for (size_t i = 0; i < sizeof args / sizeof *args; i++) {
        cr_assert_eq(t_cli(dir, "%s --store mem: < in > out 2>&1", args[i]),
                     2, "%s: %s", args[i], t_read(t_path(dir, "out"), NULL));
        cr_assert(t_grep(t_path(dir, "out"), "a URI where a file is meant"),
                  "%s", t_read(t_path(dir, "out"), NULL));
        expect_file_hidden(t_path(dir, "out"));
    }
    t_rmdir(dir);
    free(dir);
}

/* A handler's shell script: run FN on idem (its parent) and on every
 * process of its own group (the watcher), appending to OUT, then answer.
 * Builtins only in the loop (no fork per process): on a loaded machine
 * hundreds of processes must be looked at within the handler's lease. */
#define EACH_IN_GROUP(FN, OUT)                                          \
    "group() { g=; read -r l 2>/dev/null < \"$1/stat\" || return 0; "   \
    "l=${l##*) }; set -- $l; g=$3; }\n"                                 \
    FN " /proc/$PPID > " OUT "\n"                                       \
    "group /proc/$$; mine=$g\n"                                         \
    "for d in /proc/[0-9]*; do\n"                                       \
    "  group $d; [ \"$g\" = \"$mine\" ] && " FN " $d >> " OUT "\n"     \
    "done\n"                                                            \
    "exec \"$IDEM_PROGS/handler\"\n"

/* Nor can it read the password where the kernel shows idem's environment
 * as it was at exec (/proc/PID/environ), which it may as idem's user:
 * idem's own, and that of every process in the handler's group (the
 * watcher is a fork of idem). The handler, run by sh -c itself, copies
 * them all before it answers. */
Test(secrets, no_environment_the_handler_can_read_holds_the_password)
{
    static const char script[] =
        "env_of() { tr '\\0' '\\n' < \"$1/environ\" 2>/dev/null; }\n"
        EACH_IN_GROUP("env_of", "envs");
    static const char *const how[] = {
        "IDEM_REDIS_PASSWORD=" PW " IDEM_STORE=redis://",
        "IDEM_STORE=redis://:" PW "@"};
    char *dir = t_dir_with("in", "{\"id\":\"a\"}\n");
    t_write(t_path(dir, "group.sh"), script, sizeof script - 1);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(t_sh("cd '%s' && rm -f envs && IDEM_KEPT=yes %s%s "
                          "\"$IDEM_CLI\" run --key id --key-space e%d "
                          "--exec '. ./group.sh' in > out 2>&1", dir, how[i],
                          addr, i), 0,
                     "%s", t_read(t_path(dir, "out"), NULL));
        const char *got = t_path(dir, "envs");
        cr_assert(t_grep(got, "IDEM_KEPT=yes"), "%s", t_read(got, NULL));
        expect_file_hidden(got);
    }
    t_rmdir(dir);
    free(dir);
}

/* Nor where the kernel shows idem's command line to every local user
 * (/proc/PID/cmdline, `ps`): a password typed in a URI, alone or as
 * --OPTION=URI, is overwritten there with the URI as messages show it.
 * The handler copies the command lines of its parent, idem, and of its
 * whole group (the watcher) while idem runs. */
Test(secrets, the_command_line_shows_no_password)
{
    static const char script[] =
        "args_of() { tr '\\0' ' ' < \"$1/cmdline\" 2>/dev/null; echo; }\n"
        EACH_IN_GROUP("args_of", "args");
    char *dir = t_dir_with("in", "{\"id\":\"a\"}\n");
    t_write(t_path(dir, "group.sh"), script, sizeof script - 1);
    cr_assert_eq(t_sh("cd '%s' && \"$IDEM_CLI\" run --key id --key-space "
                      "argv --store=redis://:" PW "@%s --to "
                      "redis-stream://:" PW "@%s/argv --exec '. ./group.sh' "
                      "in > out 2>&1", dir, addr, addr), 0,
                 "%s", t_read(t_path(dir, "out"), NULL));
    const char *got = t_path(dir, "args");
    cr_assert(t_grep(got, "redis-stream://:***@"), "%s", t_read(got, NULL));
    cr_assert(t_grep(got, "--store=redis://:***@"), "%s", t_read(got, NULL));
    expect_file_hidden(got);
    t_rmdir(dir);
    free(dir);
}

/* Nor its connections: an authenticated socket inherited by the handler
 * would let it send any command as idem (CONFIG GET requirepass tells
 * the password). The handler lists the sockets it holds; those the test's
 * own shell held before idem started are not idem's. Both the store's
 * connection and a stream sink's are open while the handler runs. */
Test(secrets, the_handler_inherits_no_connection)
{
    char *dir = t_dir_with("in", "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    cr_assert_eq(t_sh("cd '%s' && readlink /proc/$$/fd/* | grep socket: "
                      "| sort > before; IDEM_REDIS_PASSWORD=" PW " "
                      "\"$IDEM_CLI\" run --key id --key-space fds --store "
                      "redis://%s --to redis-stream://%s/fds --exec "
                      "'readlink /proc/$$/fd/* | grep socket: | sort > "
                      "inside; exec \"$IDEM_PROGS/handler\"' in > out 2>&1",
                      dir, addr, addr), 0, "%s",
                 t_read(t_path(dir, "out"), NULL));
    cr_assert_eq(t_sh("cd '%s' && test -f inside && comm -13 before "
                      "inside > leaked && test ! -s leaked", dir), 0,
                 "the handler holds idem's sockets: %s",
                 t_read(t_path(dir, "leaked"), NULL));
    t_rmdir(dir);
    free(dir);
}

Test(secrets, password_from_a_file)
{
    char *dir = t_tmpdir();
    char path[4200], uri[5000];
    snprintf(path, sizeof path, "%s/pw", dir);
    t_write(path, PW "\n", strlen(PW) + 1);  /* as `echo PW > pw` */
    cr_assert_eq(chmod(path, 0640), 0);
    snprintf(uri, sizeof uri, "redis://%s?password_file=%s", addr, path);
    idem_store *s;
    cr_assert_eq(open_rc(uri, &s), 0, "%s", idem_errdetail(s));
    idem_close(s);
    cr_assert_eq(t_cli(dir, "stats --store 'redis://%s?password_file=pw' "
                            "> out 2>&1", addr), 0);
    /* Without the newline, and with a user. */
    t_write(path, PW, strlen(PW));
    snprintf(uri, sizeof uri, "redis://default:@%s?password_file=%s", addr,
             path);
    cr_assert_eq(open_rc(uri, &s), 0, "%s", idem_errdetail(s));
    idem_close(s);
    /* A file other users can read keeps nothing secret: refused. */
    cr_assert_eq(chmod(path, 0644), 0);
    expect_hidden(uri, IDEM_EINVAL);
    cr_assert_eq(open_rc(uri, &s), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "read by other users"), "%s",
              idem_errdetail(s));
    idem_close(s);
    cr_assert_eq(chmod(path, 0600), 0);
    /* Two passwords, an empty file, a missing one: refused. */
    snprintf(uri, sizeof uri, "redis://:%s@%s?password_file=%s", PW, addr,
             path);
    expect_hidden(uri, IDEM_EINVAL);
    t_write(path, "\n", 1);
    snprintf(uri, sizeof uri, "redis://%s?password_file=%s", addr, path);
    expect_hidden(uri, IDEM_EINVAL);
    snprintf(uri, sizeof uri, "redis://%s?password_file=%s/none", addr,
             dir);
    expect_hidden(uri, IDEM_EINVAL);
    char out[4200];
    snprintf(out, sizeof out, "%s/out", dir);
    expect_file_hidden(out);
    t_rmdir(dir);
    free(dir);
}

/* ------------------------------------------------------------------------
 * Modes */

TestSuite(modes, .timeout = 60);

/* The mode bits of path. */
static unsigned mode_of(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "stat %s", path);
    return (unsigned)(st.st_mode & 07777);
}

/* Every file of dir has mode want; returns how many there are. */
static int files_have_mode(const char *dir, unsigned want)
{
    DIR *d = opendir(dir);
    cr_assert(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char p[4300];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        cr_assert_eq(mode_of(p), want, "%s is %04o, not %04o", p, mode_of(p),
                     want);
        n++;
    }
    closedir(d);
    return n;
}

/* Fill the store at uri (keys from..from+39) over several segments and
 * close it: every kind of file idem writes but a repair's. */
static void fill(const char *uri, int from)
{
    idem_opts o = t_options();
    o.segment_bytes = 4096;
    idem_store *s;
    cr_assert_eq(idem_open(uri, &o, &s), 0, "%s", idem_errdetail(s));
    char v[600];
    memset(v, 'v', sizeof v);
    for (int i = from; i < from + 40; i++) {
        char k[16];
        int n = snprintf(k, sizeof k, "k%d", i);
        idem_key key = {k, (size_t)n, NULL};
        idem_outcome out;
        cr_assert_eq(idem_claim(s, &key, NULL, &out), 0);
        cr_assert_eq(idem_complete(s, k, (size_t)n, out.token, v, sizeof v,
                                   0), 0);
        cr_assert_eq(idem_sync(s), 0);
    }
    cr_assert_eq(idem_close(s), 0);
}

Test(modes, private_whatever_the_umask)
{
    static const mode_t masks[] = {0, 022, 077, 0277};
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        char *dir = t_tmpdir(), st[4200];
        snprintf(st, sizeof st, "%s/store", dir);
        mode_t old = umask(masks[i]);
        fill(t_local_uri(st), 0);
        umask(old);
        cr_assert_eq(mode_of(st), 0700, "umask %04o: %04o", masks[i],
                     mode_of(st));
        cr_assert_geq(files_have_mode(st, 0600), 5);
        /* A repair rewrites a segment through a temporary file. */
        char seg[4300];
        snprintf(seg, sizeof seg, "%s/seg-00000001.log", st);
        t_sh("printf 'XXXXXXXX' | dd of='%s' bs=1 seek=200 conv=notrunc "
             "2>/dev/null", seg);
        cr_assert_eq(idem_repair(t_local_uri(st), NULL), 0);
        files_have_mode(st, 0600);
        t_rmdir(dir);
        free(dir);
    }
}

Test(modes, group_access)
{
    char *dir = t_tmpdir(), st[4200], uri[4300];
    snprintf(st, sizeof st, "%s/store", dir);
    snprintf(uri, sizeof uri, "local:%s?mode=group", st);
    mode_t old = umask(077);
    fill(uri, 0);
    cr_assert_eq(mode_of(st), 0750);
    cr_assert_geq(files_have_mode(st, 0640), 5);
    /* Later files follow the directory, parameter or not. */
    fill(t_local_uri(st), 40);
    files_have_mode(st, 0640);
    umask(old);
    /* The store's directory is the path before the parameters: an
     * output inside it is still refused. */
    cr_assert_eq(t_sh("cd '%s' && echo '{\"id\":1}' > in && \"$IDEM_CLI\" "
                      "dedup --key id --store 'local:store?mode=group' "
                      "--output store/out in 2> err", dir), 2);
    char err[4300];
    snprintf(err, sizeof err, "%s/err", dir);
    cr_assert(t_grep(err, "inside the store's directory"), "%s",
              t_read(err, NULL));
    idem_store *s;
    snprintf(uri, sizeof uri, "local:%s?mode=world", st);
    cr_assert_eq(open_rc(uri, &s), IDEM_EINVAL);
    cr_assert(strstr(idem_errdetail(s), "mode=world"), "%s",
              idem_errdetail(s));
    idem_close(s);
    t_rmdir(dir);
    free(dir);
}

Test(modes, warns_when_others_can_read)
{
    char *dir = t_tmpdir(), st[4200], seg[4300];
    snprintf(st, sizeof st, "%s/store", dir);
    fill(t_local_uri(st), 0);
    idem_store *s = t_open(t_local_uri(st));
    cr_assert_str_eq(idem_warning(s), "");
    idem_close(s);
    /* What an older idem left: 0755 and 0644. */
    snprintf(seg, sizeof seg, "%s/seg-00000001.log", st);
    cr_assert_eq(chmod(seg, 0644), 0);
    cr_assert_eq(chmod(st, 0755), 0);
    s = t_open(t_local_uri(st));
    cr_assert(strstr(idem_warning(s), "other users can read") &&
                  strstr(idem_warning(s), "seg-00000001.log"),
              "%s", idem_warning(s));
    idem_close(s);
    cr_assert_eq(t_cli(dir, "stats > out 2> err"), 0);
    char err[4300];
    snprintf(err, sizeof err, "%s/err", dir);
    cr_assert(t_grep(err, "idem stats: warning: ") &&
                  t_grep(err, "chmod o-rwx"),
              "%s", t_read(err, NULL));
    /* A directory others cannot enter keeps its files private. */
    cr_assert_eq(chmod(st, 0750), 0);
    s = t_open(t_local_uri(st));
    cr_assert_str_eq(idem_warning(s), "");
    idem_close(s);
    t_rmdir(dir);
    free(dir);
}

/* ------------------------------------------------------------------------
 * Reading a store that a job holds */

TestSuite(readonly, .timeout = 180);

/* Run sh -c cmd in dir in the background; its pid. */
static pid_t spawn(const char *dir, const char *cmd)
{
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0) {
        /* A failed test must not leave the job behind. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || chdir(dir) != 0)
            _exit(127);
        setenv("IDEM_STORE", "local:store", 1);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return p;
}

/* Wait (generously) until `idem stats --json` of dir's store says
 * "done":n: each try is a reader that must not be refused. */
static void wait_done(const char *dir, int n)
{
    char want[64], out[4200];
    snprintf(want, sizeof want, "\"done\":%d,", n);
    snprintf(out, sizeof out, "%s/stats.json", dir);
    for (int i = 0; i < 1200; i++) {
        if (t_cli(dir, "stats --json > stats.json 2>&1") == 0 &&
            t_grep(out, want))
            return;
        usleep(100 * 1000);
    }
    cr_assert_fail("no %s in time: %s", want, t_read(out, NULL));
}

Test(readonly, get_stats_dump_while_a_job_runs)
{
    char *dir = t_tmpdir(), cmd[9000];
    t_sh("cd '%s' && for i in 1 2 3 4 5 6 7 8; do echo \"{\\\"id\\\":$i}\"; "
         "done > in", dir);
    /* Answers the first five, then waits for the file go (or for its
     * idem to be gone). */
    t_sh("cd '%s' && printf '%%s\\n' 'n=0' 'while read -r l; do' "
         "'n=$((n+1)); [ $n -gt 5 ] && while [ ! -e \"%s/go\" ] && "
         "kill -0 $PPID; do sleep 0.05; done' "
         "'echo \"{\\\"ok\\\":true,\\\"n\\\":$n}\"' 'done' > h.sh",
         dir, dir);
    snprintf(cmd, sizeof cmd, "exec \"$IDEM_CLI\" run --job J --key id "
             "--output out --commit-interval 50ms --lease 10m --quiet "
             "--exec 'sh h.sh' in 2> run.err");
    pid_t run = spawn(dir, cmd);
    wait_done(dir, 5);
    /* The job holds the store all along: it waits for go. */
    cr_assert_eq(waitpid(run, NULL, WNOHANG), 0);
    cr_assert_eq(t_cli(dir, "get --job J 3 > get.out 2>&1"), 0);
    cr_assert_eq(t_cli(dir, "dump > dump.out 2> dump.err"), 0);
    cr_assert_eq(t_cli(dir, "stats > stats.out 2>&1"), 0);
    cr_assert_eq(waitpid(run, NULL, WNOHANG), 0);
    char p[4300];
    snprintf(p, sizeof p, "%s/get.out", dir);
    cr_assert(t_grep(p, "state      done") && t_grep(p, "\"n\":3"), "%s",
              t_read(p, NULL));
    snprintf(p, sizeof p, "%s/dump.out", dir);
    cr_assert_eq(t_sh("test $(grep -c '\"state\":\"done\"' '%s') -ge 5", p),
                 0, "%s", t_read(p, NULL));
    snprintf(p, sizeof p, "%s/stats.out", dir);
    cr_assert(t_grep(p, "done"), "%s", t_read(p, NULL));
    /* Let it finish: its output is whole. */
    t_sh("touch '%s/go'", dir);
    int st;
    cr_assert_eq(waitpid(run, &st, 0), run);
    snprintf(p, sizeof p, "%s/run.err", dir);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", t_read(p, NULL));
    cr_assert_eq(t_sh("test $(wc -l < '%s/out') -eq 8", dir), 0);
    t_rmdir(dir);
    free(dir);
}

Test(readonly, readers_write_nothing)
{
    char *dir = t_tmpdir();
    t_sh("cd '%s' && printf '{\"id\":1}\\n{\"id\":2}\\n' > in", dir);
    cr_assert_eq(t_cli(dir, "dedup --quiet --job D --key id --output out "
                            "in"), 0);
    /* A torn group past the end, as a writer that died mid-write leaves
     * it: a reader leaves it there. */
    t_sh("printf 'torn-group' >> '%s/store/seg-00000001.log'", dir);
    /* Read-only for its owner too (root may write it all the same, so
     * what counts is that nothing changed). */
    char store[4300];
    snprintf(store, sizeof store, "%s/store", dir);
    cr_assert_eq(chmod(store, 0500), 0);
#define SNAP "cd '%s' && stat -c '%%n %%s %%y %%z %%a %%i' store store/* > %s"
    t_sh(SNAP, dir, "before");
    cr_assert_eq(t_cli(dir, "stats > o 2>&1"), 0);
    cr_assert_eq(t_cli(dir, "stats --json --key-spaces >> o 2>&1"), 0);
    cr_assert_eq(t_cli(dir, "get --job D 1 >> o 2>&1"), 0);
    cr_assert_eq(t_cli(dir, "dump >> o 2>&1"), 0);
    t_sh(SNAP, dir, "after");
#undef SNAP
    cr_assert_eq(chmod(store, 0700), 0);
    cr_assert_eq(t_sh("cd '%s' && diff before after >&2", dir), 0,
                 "a reader changed the store");
    char o[4300];
    snprintf(o, sizeof o, "%s/o", dir);
    cr_assert(t_grep(o, "2 done"), "%s", t_read(o, NULL));
    t_rmdir(dir);
    free(dir);
}

/* A writer that never stops: batches of claims made DONE with a short
 * TTL, small segments, sweeps that drop the oldest ones. */
static void busy_writer(const char *uri)
{
    idem_opts o;
    idem_opts_init(&o);
    o.segment_bytes = 4096;
    o.ttl_ms = 30;
    idem_store *s;
    if (idem_open(uri, &o, &s) != 0)
        _exit(1);
    char v[300];
    memset(v, 'v', sizeof v);
    for (unsigned long i = 0;; i++) {
        char k[32];
        int n = snprintf(k, sizeof k, "k%lu", i);
        idem_key key = {k, (size_t)n, NULL};
        idem_outcome out;
        if (idem_claim(s, &key, NULL, &out) ||
            idem_complete(s, k, (size_t)n, out.token, v, sizeof v, 0) ||
            idem_sync(s) || (i % 16 == 0 && idem_sweep(s, 0, NULL)))
            _exit(2);
    }
}

Test(readonly, a_busy_writer_is_no_damage)
{
    char *dir = t_tmpdir(), uri[4300];
    snprintf(uri, sizeof uri, "local:%s/store", dir);
    pid_t w = fork();
    cr_assert_geq(w, 0);
    if (w == 0 && prctl(PR_SET_PDEATHSIG, SIGKILL) == 0)
        busy_writer(uri);
    if (w == 0)
        _exit(1);
    /* Wait for it to have made segments and dropped its first. */
    int i = 0;
    for (; i < 600 && t_sh("cd '%s/store' 2>/dev/null && ls | grep -q seg- "
                           "&& ! test -e seg-00000001.log", dir) != 0;
         i++)
        usleep(100 * 1000);
    cr_assert_lt(i, 600, "the writer dropped no segment");
    idem_opts o;
    idem_opts_init(&o);
    o.flags = IDEM_O_READONLY;
    for (int n = 0; n < 300; n++) {
        idem_store *s;
        int rc = idem_open(uri, &o, &s);
        cr_assert_eq(rc, 0, "open %d: %s: %s", n, idem_strerror(rc),
                     idem_errdetail(s));
        idem_stats st;
        cr_assert_eq(idem_stats_get(s, &st), 0);
        idem_close(s);
    }
    int status;
    cr_assert_eq(waitpid(w, &status, WNOHANG), 0, "the writer stopped");
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    t_rmdir(dir);
    free(dir);
}
