#!/usr/bin/env bash
# Debian's PostgreSQL 15 with pgvector, for the test that runs docs/how-to/postgres.md's DBA steps on a
# server set up the way a user's is (tests/packaging/test_docs.py). Debian 12 ships postgresql-15 but no
# pgvector for it (users take PGDG's postgresql-15-pgvector): pgvector 0.8.6 (>= 0.8.4, which fixed HNSW
# index corruption during vacuum) comes from the shared Citus kit's binaries, built against Debian's
# PostgreSQL 15.20 headers. Only pgvector's files are taken, not Citus. Needs root; does nothing when
# PostgreSQL 15 already has pgvector 0.8.6.
set -euo pipefail
PG=15
MIN_PG=15.20
VECTOR=0.8.6
BIN=/usr/lib/postgresql/$PG/bin
EXT=/usr/share/postgresql/$PG/extension
KIT="$(cd "$(dirname "$0")/.." && pwd)/../shared/tools/citus/citus-13.2.2-pgvector-$VECTOR-pg15-amd64.tar.gz"

have_vector=$(awk -F"'" '/default_version/ {print $2}' "$EXT/vector.control" 2>/dev/null || true)
if [ -x "$BIN/initdb" ] && [ "$have_vector" = "$VECTOR" ]; then
    echo "PostgreSQL $PG with pgvector $VECTOR: already installed"
    exit 0
fi
[ -f "$KIT" ] || { echo "install-pg15-pgvector: $KIT is missing (../shared/tools/citus)" >&2; exit 1; }
have_pg=$("$BIN/postgres" --version 2>/dev/null | awk '{print $3}' || true)
if [ -z "$have_pg" ] || ! printf '%s\n%s\n' "$MIN_PG" "$have_pg" | sort -V -C; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "postgresql-$PG" >/dev/null
    # Debian starts a default cluster on 5432; the test starts its own server.
    pg_ctlcluster "$PG" main stop >/dev/null 2>&1 || true
fi
tar -xzf "$KIT" -C / "usr/lib/postgresql/$PG/lib/vector.so" --wildcards "usr/share/postgresql/$PG/extension/vector*"
echo "PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') with pgvector $VECTOR: installed"
