#!/bin/sh
# check-style.sh - the house rules a compiler does not check, in the
# spirit of curl's checksrc; `make test` runs it first.
#
#   - no banned function: sprintf, vsprintf, strcpy, strcat, strncpy,
#     strtok, atoi, atol, atoll, atof, gets (unbounded writes, hidden
#     state, or errors that cannot be told from a zero);
#   - every file opens with its essay line, "/* [dir/]NAME - ...";
#   - no tab, no trailing blank, no line over 80 columns;
#   - the layering rule of docs/architecture.md: the core (src/*.[ch])
#     includes its own headers; a subsystem (src/local, src/redis,
#     src/keys) the core's and its own; tools/idem/ the public headers
#     (idem/*.h) and its own, and bench/keys36.h, the benchmark key
#     stream `idem bench` shares with the bench programs (one header of
#     inline code, no library internals). So nothing in src/ includes
#     tools/, and no subsystem reaches into another;
#   - every test has a timeout, its own or its suite's;
#   - shellcheck(1) finds nothing in scripts/*.sh and bench/*.sh (the
#     scripts start servers and kill processes: a word split in the
#     wrong place kills the wrong one).
#
# Prints each violation as FILE:LINE: what, and exits 1 if there was any.
set -u
files=$(ls src/*.[ch] src/*/*.[ch] include/idem/*.h tools/idem/*.[ch] \
    tools/idem/*/*.[ch] \
    tests/*.[ch] tests/progs/*.c bench/*.[ch] examples/*.c 2>/dev/null)
bad=0
report() {
    [ -n "$1" ] || return 0
    echo "$1" | sed "s|\$|: $2|" >&2
    bad=1
}
banned='sprintf|vsprintf|strcpy|strcat|strncpy|strtok|atoi|atol|atoll|atof|gets'
# shellcheck disable=SC2086
report "$(grep -nE "(^|[^A-Za-z_0-9])($banned)[[:space:]]*\(" $files |
    cut -d: -f1,2)" \
    "banned function"
# shellcheck disable=SC2086
report "$(grep -nP '\t' $files | cut -d: -f1,2)" "tab"
# shellcheck disable=SC2086
report "$(grep -nE '[[:space:]]+$' $files | cut -d: -f1,2)" "trailing blank"
# shellcheck disable=SC2086
report "$(awk 'length > 80 { print FILENAME ":" FNR }' $files)" \
    "over 80 columns"
for f in $files; do
    name=$(basename "$f")
    head -n 1 "$f" | grep -qE "^/\* ([a-z]+/)*$name - " ||
        report "$f:1" "no opening essay line \"/* $name - ...\""
done
# layering FILE DIR...: each quoted include of FILE names idem/NAME.h or,
# without a '/', a file of one of the DIRs (the exception above aside);
# no <...> include names a file of the tree, which -Isrc would find.
layering() {
    f=$1
    shift
    grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*<' "$f" |
        while IFS= read -r line; do
            inc=${line#*<}
            inc=${inc%%>*}
            if [ -f "src/$inc" ] || [ -f "tools/$inc" ]; then
                echo "$f:${line%%:*}"
            fi
        done
    grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
        while IFS= read -r line; do
            inc=${line#*\"}
            inc=${inc%%\"*}
            case "$f:$inc" in
            *:idem/*.h | tools/idem/bench.c:../../bench/keys36.h) continue ;;
            esac
            for d in "$@"; do
                case $inc in */*) ;; *) [ -f "$d/$inc" ] && continue 2 ;; esac
            done
            echo "$f:${line%%:*}"
        done
}
layers=
for f in $files; do
    case $f in
    src/*/*) bad_inc=$(layering "$f" "${f%/*}" src) ;;
    src/*) bad_inc=$(layering "$f" src) ;;
    tools/idem/*/*) bad_inc=$(layering "$f" "${f%/*}" tools/idem) ;;
    tools/idem/*) bad_inc=$(layering "$f" tools/idem tools/idem/connect) ;;
    *) bad_inc= ;;
    esac
    [ -z "$bad_inc" ] || layers="$layers${layers:+
}$bad_inc"
done
report "$layers" "include across the layers (docs/architecture.md)"
# Every test has a timeout, its own or its suite's (TestSuite in the same
# file): a test that hangs must end, and fail, on any runner.
# shellcheck disable=SC2016
report "$(awk '
    function flush(   i) {
        for (i = 0; i < n; i++)
            if (!own[i] && !(suite[i] in timed))
                print where[i]
        n = 0
        for (i in timed)
            delete timed[i]
    }
    FNR == 1 { flush() }
    /^(Test|TestSuite)\(/ {
        decl = $0
        at = FILENAME ":" FNR
        while (decl !~ /\)[;{]?[[:space:]]*$/ && (getline more) > 0)
            decl = decl more
        name = decl
        sub(/^[A-Za-z]+\([[:space:]]*/, "", name)
        sub(/[[:space:],)].*/, "", name)
        if (decl ~ /^TestSuite/) {
            if (decl ~ /\.timeout/)
                timed[name] = 1
        } else {
            where[n] = at
            suite[n] = name
            own[n++] = decl ~ /\.timeout/
        }
    }
    END { flush() }' tests/*.c)" "a test without a timeout (.timeout)"
if command -v shellcheck >/dev/null; then
    shellcheck scripts/*.sh bench/*.sh >&2 ||
        report "scripts/*.sh bench/*.sh" "shellcheck (above)"
else
    report "shellcheck" "not installed: sh scripts/deps.sh"
fi
if [ "$bad" -ne 0 ]; then
    echo "check-style: the house rules are in scripts/check-style.sh" >&2
    exit 1
fi
echo "check-style: $(echo "$files" | wc -l) files and the shell scripts clean"
