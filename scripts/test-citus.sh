#!/usr/bin/env bash
# The Citus pass of `make test`: the core suites again, each test on a database distributed over a real
# cluster (a coordinator and two workers of Citus 13.2 with pgvector on PostgreSQL 15, on loopback) by the
# statements of docs/how-to/distributed-postgres.md (testing/citus.py, tests/fix_db.py).
#
# The cluster comes from the test kit at $CITUS_KIT (default ../shared/tools/citus/cluster.sh beside this
# checkout: root, apt-get, about a minute the first time). It is a test fixture, not a way to deploy
# Citus: users install Citus from its own packages or image. Without the kit, or without root, the pass
# is skipped with a message (it is not a failure on a laptop that lacks it).
#   scripts/test-citus.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${CITUS_KIT:-../shared/tools/citus/cluster.sh}
PY=${PY:-.venv/bin/python}
if [ ! -x "$KIT" ]; then
    echo "Citus pass skipped: no cluster kit at $KIT (set CITUS_KIT)"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "Citus pass skipped: the cluster kit ($KIT) needs root"
    exit 0
fi
"$KIT" install
# start prints DATABASE_URL (the application role, no superuser) and ADMIN_URL (the superuser).
eval "$("$KIT" start)"
TEST_CITUS_URL=$DATABASE_URL TEST_CITUS_ADMIN_URL=$ADMIN_URL "$PY" -m pytest "$@"
