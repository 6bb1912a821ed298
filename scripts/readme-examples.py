#!/usr/bin/env python3
"""readme-examples.py - run every shell example of the README verbatim and
check what it prints, so that the README cannot drift from the program.

usage: readme-examples.py README BUILD

`make test` runs it (tests/test_readme.c). Each ```sh block is an
example. Its lines that start with "$ " are commands (a line ending with
a backslash goes on in the next); the lines after a command, up to the
next one, are what it prints, standard output and error together. A block
runs in one shell, in a fresh scratch directory holding a copy of
examples/ and build (a link to BUILD), without IDEM_STORE, so its
commands see what the earlier ones left. A block without commands is a
script that must exit 0.

What a command printed matches its text in the README when they are
equal after:
  - runs of white space, line breaks included, become one space (a long
    message may be wrapped in the README);
  - a "  # comment" (two spaces or more before '#') ends a README line;
  - "..." in the README stands for any text (a line of it: any lines).

A visible HTML comment on the line before a block's fence changes this:
  <!-- norun -->  the block is not run (it needs root or a server, or it
                  is `make test` itself). Keep these few.
  <!-- shape -->  the output varies (clock, randomness): each hex digit
                  in the README's text matches any hex digit.

Prints one line per block; exits 1 if any example failed, 2 on bad usage.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

TIMEOUT_S = 300


def blocks(readme):
    """(line number, marker, lines) of each ```sh block."""
    lines = open(readme, encoding="utf-8").read().split("\n")
    out, i, marker = [], 0, None
    while i < len(lines):
        line = lines[i].strip()
        if line in ("<!-- norun -->", "<!-- shape -->"):
            marker = line[5:-4]
        elif line == "```sh":
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            out.append((start, marker, body))
            marker = None
        elif line:
            marker = None
        i += 1
    return out


def commands(body):
    """[(command, expected text)] of a block, or [] for a script."""
    cmds, cur = [], None
    lines = iter(body)
    for line in lines:
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\"):
                cmd += "\n" + next(lines, "")
            cur = [cmd, []]
            cmds.append(cur)
        elif cur is not None:
            cur[1].append(re.sub(r"\s{2,}#.*$", "", line))
    return [(c, "\n".join(e)) for c, e in cmds]


def squeeze(text):
    return " ".join(text.split())


def matches(want, got, shape):
    parts = [re.escape(p) for p in squeeze(want).split("...")]
    if shape:
        parts = [re.sub("[0-9a-f]", "[0-9a-f]", p) for p in parts]
    return re.fullmatch(".*".join(parts), squeeze(got), re.S) is not None


def scratch(root, build):
    d = tempfile.mkdtemp(prefix="idem-readme-")
    if os.path.isdir(os.path.join(root, "examples")):
        shutil.copytree(os.path.join(root, "examples"),
                        os.path.join(d, "examples"))
    os.symlink(os.path.abspath(build), os.path.join(d, "build"))
    return d


def run_block(root, build, start, marker, body):
    cmds = commands(body)
    sep = "@@idem-readme-%d@@" % os.getpid()
    script = "".join("echo '%s'\n%s\n" % (sep, c) for c, _ in cmds) \
        if cmds else "set -e\n" + "\n".join(body) + "\n"
    env = dict(os.environ)
    env.pop("IDEM_STORE", None)
    d = scratch(root, build)
    try:
        p = subprocess.run(["sh", "-c", script], cwd=d, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=TIMEOUT_S)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    out = p.stdout.decode("utf-8", "replace")
    if not cmds:
        return [] if p.returncode == 0 else \
            ["the script exited %d:\n%s" % (p.returncode, out)]
    got = out.split(sep + "\n")[1:]
    errors = []
    for (cmd, want), text in zip(cmds, got + [""] * len(cmds)):
        if not matches(want, text, marker == "shape"):
            errors.append("$ %s\nprinted:\n%swhere the README has:\n%s\n"
                          % (cmd, text, want))
    return errors


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: readme-examples.py README BUILD\n")
        return 2
    readme, build = sys.argv[1:]
    root = os.path.dirname(os.path.abspath(readme))
    failed = 0
    for start, marker, body in blocks(readme):
        where = "%s:%d" % (os.path.basename(readme), start)
        if marker == "norun":
            print("%s: not run (<!-- norun -->)" % where)
            continue
        errors = run_block(root, build, start, marker, body)
        print("%s: %s" % (where, "FAILED" if errors else "ok"))
        for e in errors:
            print(e)
        failed += bool(errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
