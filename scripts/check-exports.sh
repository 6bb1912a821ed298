#!/bin/sh
# check-exports.sh - libidem.so exports the public API and nothing else,
# and every function of it has its manual page.
#
# The public API is what include/idem/*.h declares with IDEM_EXPORT; the
# library is built with -fvisibility=hidden so that everything else, the
# idem__ internals first, stays out of the dynamic symbol table, where a
# program could link against it and then break on any release. `make test`
# runs this on the shared library it built (usage: check-exports.sh
# LIBIDEM.so) and fails on:
#   - a defined dynamic symbol the headers do not declare (an idem__
#     internal, or a function that lost its static);
#   - a declared function the library does not export (IDEM_EXPORT missing
#     on the declaration, or the function not built);
#   - a function declared in a public header without IDEM_EXPORT;
#   - an exported function without a manual page (curl's rule): each
#     has docs/man/FUNCTION.3, the page that documents it or a
#     ".so man3/PAGE.3" of the page that documents it with others, and
#     that page's NAME section names it. A function added without its
#     page fails here, naming the function, so the manual (from
#     include/idem/idem.h, its source of truth) cannot fall behind.
set -u
lib=${1:?usage: check-exports.sh LIBIDEM.so}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0

# Declarations start at column 0 in the headers; the name is the last
# identifier before the first parenthesis.
grep -h '^IDEM_EXPORT ' include/idem/*.h |
    sed 's/(.*//; s/.*[ *]//' | sort -u >"$tmp/declared"
nm -D --defined-only "$lib" | awk '{ print $NF }' | sort -u >"$tmp/exported"
[ -s "$tmp/exported" ] || {
    echo "check-exports: no dynamic symbols in $lib" >&2
    exit 1
}

extra=$(comm -13 "$tmp/declared" "$tmp/exported")
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
unmarked=$(grep -nE '^[a-z][a-z0-9_ ]*[ *]idem_[a-z0-9_]+\(' include/idem/*.h |
    grep -v ':typedef ')
if [ -n "$extra" ]; then
    echo "check-exports: $lib exports what no header declares:" >&2
    echo "$extra" | sed 's/^/  /' >&2
    bad=1
fi
if [ -n "$missing" ]; then
    echo "check-exports: $lib does not export these declared functions:" >&2
    echo "$missing" | sed 's/^/  /' >&2
    bad=1
fi
if [ -n "$unmarked" ]; then
    echo "check-exports: public declarations without IDEM_EXPORT:" >&2
    echo "$unmarked" | sed 's/^/  /' >&2
    bad=1
fi

# What is wrong with the manual page of function $1, or nothing.
page_fault() {
    page=docs/man/$1.3
    if [ ! -f "$page" ]; then
        echo "$1 is exported but has no manual page: write $page, or" \
            "make it a .so of the page that documents it"
        return
    fi
    so=$(sed -n '1s|^\.so man3/||p' "$page")
    if [ -n "$so" ] && [ ! -f "docs/man/$so" ]; then
        echo "$1: $page is a .so of man3/$so, which is not in docs/man"
        return
    fi
    doc=docs/man/${so:-$1.3}
    sed -n '/^\.SH NAME/,/^\.SH/p' "$doc" | grep -qw "$1" ||
        echo "$1: $page leads to $doc, whose NAME section does not name it"
}
while read -r fn; do
    fault=$(page_fault "$fn")
    [ -z "$fault" ] || { echo "check-exports: $fault" >&2; bad=1; }
done <"$tmp/exported"
[ "$bad" -eq 0 ] || exit 1
echo "check-exports: $(wc -l <"$tmp/exported") symbols, the public API" \
    "only, each with its manual page"
