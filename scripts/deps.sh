#!/bin/sh
# Install the Debian packages idem needs to build, test and bench, if any
# are missing. Runs apt-get itself when root; otherwise prints the command.
# The README says why each package is here.
set -e
PKGS="gcc make pkg-config libssl-dev libxxhash-dev libcriterion-dev
      liblmdb-dev libhiredis-dev uuid-dev redis-server redis-tools
      redis-sentinel faketime mawk libyajl-dev shellcheck python3 strace
      libmicrohttpd-dev prometheus libnats-dev nats-server librdkafka-dev
      kcat curl"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
        missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "idem: missing Debian packages:$missing" >&2
    echo "idem: run: sudo apt-get install -y$missing" >&2
    exit 1
fi
echo "idem: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
# shellcheck disable=SC2086 # a list of package names, split on purpose
apt-get install -y -qq --no-install-recommends $missing >/dev/null
