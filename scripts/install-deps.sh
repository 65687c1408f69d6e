#!/bin/sh
# Installs the Debian packages loom builds and tests with. Idempotent.
set -eu
PKGS="build-essential pkg-config libpcre2-dev libutf8proc-dev libcjson-dev libmicrohttpd-dev libxxhash-dev valgrind curl"
missing=""
for p in $PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
