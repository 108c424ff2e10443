#!/usr/bin/env bash
# Debian's PostgreSQL 15 with pgvector, for the test that runs docs/how-to/postgres.md's DBA steps on a
# server set up the way a user's is (tests/packaging/test_docs.py). Debian 12 ships postgresql-15 but no
# pgvector package for it, so pgvector's own Debian source package (from Debian 13) is built here against
# postgresql-server-dev-15 and installed into PostgreSQL 15. Needs root; does nothing when both are there.
set -euo pipefail
PG=15
BIN=/usr/lib/postgresql/$PG/bin
if [ -x "$BIN/initdb" ] && [ -f "/usr/share/postgresql/$PG/extension/vector.control" ]; then
    echo "PostgreSQL $PG with pgvector: already installed"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "postgresql-$PG" "postgresql-server-dev-$PG" dpkg-dev make gcc >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"  # apt downloads as its own user
# The Debian mirror this machine is set up with, with Debian 13's source index in a private apt state
# (the machine's own sources stay as they are).
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
if [ -z "$mirror" ]; then
    mirror=$(awk '$1 == "deb" && $2 !~ /^\[/ {print $2; exit}' /etc/apt/sources.list)
fi
mkdir -p "$work/lists/partial"
echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$work/sources.list"
apt_private=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/lists")
apt-get "${apt_private[@]}" update -qq
mkdir "$work/src" && chown _apt "$work/src" 2>/dev/null || true
(cd "$work/src" && apt-get "${apt_private[@]}" source --download-only -qq pgvector)
# apt checked the files against the signed source index; dpkg-source need not look for a keyring
dpkg-source --no-check -x "$work"/src/pgvector_*.dsc "$work/pgvector" >/dev/null
# OPTFLAGS empty: no -march=native, the build runs on any x86-64 (as Debian's own packages are built).
make -s -C "$work/pgvector" PG_CONFIG="$BIN/pg_config" OPTFLAGS="" with_llvm=no
make -s -C "$work/pgvector" PG_CONFIG="$BIN/pg_config" with_llvm=no install
echo "PostgreSQL $PG with pgvector $(awk -F"'" '/default_version/ {print $2}' "/usr/share/postgresql/$PG/extension/vector.control"): installed"
