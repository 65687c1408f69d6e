#!/bin/sh
# Installs the Debian packages loom builds and tests with. Idempotent.
set -eu
PKGS="build-essential pkg-config libpcre2-dev libutf8proc-dev libcjson-dev libmicrohttpd-dev libxxhash-dev libzstd-dev libpng-dev libjpeg62-turbo-dev valgrind curl"
missing=""
for p in $PKGS; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
# The server tests drive loom serve with the OpenAI Node client. A node
# that is already installed (e.g. from NodeSource, which bundles npm) is kept.
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
# tests/js: the packages pinned in package.json and package-lock.json,
# unless those versions are installed already (npm ci would first delete
# them, which an offline machine cannot undo). Without them the server
# tests fail.
cd "$(dirname "$0")/.."
stale=
for p in $(sed -n 's/^ *"\([^"]*\)": *"[0-9][^"]*",\{0,1\}$/\1/p' tests/js/package.json); do
  want=$(sed -n "s|.*\"$p\": *\"\([0-9][^\"]*\)\".*|\1|p" tests/js/package.json 2>/dev/null)
  have=$(sed -n 's/^  "version": *"\([^"]*\)".*/\1/p' "tests/js/node_modules/$p/package.json" 2>/dev/null || true)
  [ "$want" = "$have" ] || stale=1
done
if [ -f tests/js/package-lock.json ] && [ -n "$stale" ]; then
  npm ci --prefix tests/js --no-audit --no-fund --loglevel=error ||
    echo "install-deps: warning: npm ci --prefix tests/js failed; the server tests will fail" >&2
fi
