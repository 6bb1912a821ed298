#!/bin/sh
# check-exports.sh - libidem.so exports the public API and nothing else.
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
#   - a function declared in a public header without IDEM_EXPORT.
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
[ "$bad" -eq 0 ] || exit 1
echo "check-exports: $(wc -l <"$tmp/exported") symbols, the public API only"
