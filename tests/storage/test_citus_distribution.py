"""The distribution statements of docs/how-to/distributed-postgres.md on a real Citus cluster, run as the
page prints them: on an empty schema, on one that already holds memories, and a migration applied after.

Each test makes its own database on the cluster (testing.citus), migrated and not yet distributed, and
drops it afterwards. Without the Citus pass's environment (TEST_CITUS_ADMIN_URL, TEST_CITUS_URL) there is
no cluster to run them on.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from memory_lib.storage.db import connect
from memory_lib.storage.migrations import migrate, shipped_migrations
from memory_lib.storage.objectstore import LocalObjectStore
from memory_lib.storage.space import LOCK_VECTOR_TABLES
from testing.citus import CitusDatabases, citus_urls, distribution_blocks, distribution_sql, run_script
from testing.constants import TEST_DIM
from testing.factories import archive_cleanly, make_client
from testing.rows import one

from .test_distribution_keys import REFERENCE_TABLES

pytestmark = pytest.mark.skipif(
    citus_urls() is None, reason="needs the Citus pass's cluster (TEST_CITUS_ADMIN_URL, TEST_CITUS_URL)"
)

# Reference tables that stay plain tables on the coordinator: no per-user table points at them.
COORDINATOR_ONLY = frozenset(
    {"schema_migrations", "archival_pause", "archival_pause_events", "archival_skipped_nights"}
)
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
USERS = ("ada", "grace", "linus", "barbara", "ken")


@pytest.fixture(scope="module")
def cluster() -> Iterator[CitusDatabases]:
    urls = citus_urls()
    assert urls is not None
    made = CitusDatabases(*urls, prefix=f"ctd_{uuid.uuid4().hex[:6]}")
    try:
        yield made
    finally:
        made.drop_all()


@pytest.fixture
def undistributed(cluster: CitusDatabases) -> str:
    """A database on the cluster, migrated by the application role and not distributed yet."""
    return cluster.create(TEST_DIM, distribute=False)


def admin_url(cluster: CitusDatabases, url: str) -> str:
    """The superuser on the same database: Citus's shard catalog functions are the superuser's."""
    return make_conninfo(cluster.admin_url, dbname=str(conninfo_to_dict(url)["dbname"]))


def citus_tables(url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT table_name::text AS tbl, citus_table_type AS kind, distribution_column AS column, "
            "colocation_id FROM citus_tables"
        ).fetchall()
    return {r["tbl"]: r for r in rows}


def public_tables(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p') "
        "AND NOT relispartition"
    ).fetchall()
    return {r[0] if isinstance(r, tuple) else r["relname"] for r in rows}


def on_every_shard(url: str, table: str, query: str) -> list[str]:
    """`query` run on each shard of `table` (`%s` is the shard's name): one result per shard."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT success, result FROM run_command_on_shards(%s, %s)", (table, query)
        ).fetchall()
    assert rows and all(ok for ok, _ in rows), rows
    return [str(result) for _, result in rows]


def test_the_page_distributes_an_empty_schema(cluster, undistributed):
    """The page's statements, as printed, on a migrated empty schema: every per-user table ends
    distributed by user_id and colocated with memories, the reference tables are reference tables, the
    pause and the migrations' record stay plain coordinator tables, and every shard has its triggers on."""
    run_script(undistributed, distribution_sql())

    found = citus_tables(undistributed)
    with psycopg.connect(undistributed) as conn:
        per_user = public_tables(conn) - REFERENCE_TABLES
    assert per_user and "memories" in per_user
    colocation = found["memories"]["colocation_id"]
    for table in per_user:
        assert found.get(table, {}).get("kind") == "distributed", table
        assert found[table]["column"] == "user_id", table
        assert found[table]["colocation_id"] == colocation, table
    for table in REFERENCE_TABLES - COORDINATOR_ONLY:
        assert found.get(table, {}).get("kind") == "reference", table
    assert not COORDINATOR_ONLY & found.keys()
    assert set(found) == per_user | (REFERENCE_TABLES - COORDINATOR_ONLY)

    # The triggers disabled while rows were copied are enabled again, on the table and on every shard.
    admin = admin_url(cluster, undistributed)
    for table, triggers in (("memories", 6), ("archived_memories", 7)):
        query = "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass AND NOT tgisinternal AND tgenabled = 'O'"
        assert set(on_every_shard(admin, table, query)) == {str(triggers)}, table
        with psycopg.connect(undistributed) as conn:
            disabled = conn.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal AND tgenabled <> 'O'",
                (table,),
            ).fetchall()
        assert disabled == []


def _snapshot(url: str) -> dict[str, Any]:
    """What distribution must keep: rows per user of both tiers and of the audit log, the statistics,
    and the retention rows."""
    with psycopg.connect(url) as conn:

        def rows(query: str) -> list[tuple[Any, ...]]:
            return sorted(conn.execute(query).fetchall())

        return {
            "memories": rows("SELECT user_id, count(*), count(superseded_by) FROM memories GROUP BY user_id"),
            "archived": rows("SELECT user_id, count(*) FROM archived_memories GROUP BY user_id"),
            "events": rows("SELECT user_id, event_type, count(*) FROM memory_events GROUP BY 1, 2"),
            "retention": rows("SELECT user_id, memory_id FROM memory_retention"),
            "corpus": rows("SELECT user_id, docs, lexemes FROM user_corpus_stats"),
            "terms": rows("SELECT user_id, lexeme, df FROM user_term_stats"),
        }


def _searches(url: str, store: LocalObjectStore) -> dict[tuple[str, str], set[tuple[str, uuid.UUID]]]:
    """Each user's hits for a few queries, both tiers searched."""
    conn = connect(url)
    try:
        client = make_client(conn, store)
        return {
            (user, query): {
                (hit.source, hit.id)
                for hit in client.search(user, query, phase2="always", phase3="never", now=NOW).hits
            }
            for user in USERS
            for query in ("locker code drawer", "coffee in the morning", "train to work")
        }
    finally:
        conn.close()


def test_the_page_distributes_a_populated_schema_without_losing_or_double_counting(
    cluster, undistributed, tmp_path
):
    """Memories of several users added, updated, superseded and archived on one node, then distributed
    by the page's statements: every row is there once, the term statistics equal both what they were
    and a rebuild from the rows, and each search finds the same memories."""
    store = LocalObjectStore(tmp_path / "objects", prefix="test")
    conn = connect(undistributed)
    try:
        client = make_client(conn, store)
        for n, user in enumerate(USERS):
            for i in range(4 + n):
                client.add(
                    user, f"{user} note {i}: the locker code is in drawer {i}", importance=0.1, now=OLD
                )
            first = client.add(user, f"{user} takes the train to work at {7 + n}", importance=0.9, now=NOW)
            client.add(
                user, f"{user} now cycles to work instead of the train", supersedes=first.memory_id, now=NOW
            )
            coffee = client.add(user, f"{user} drinks a cortado in the morning", importance=0.8, now=NOW)
            client.update(user, coffee.memory_id, f"{user} drinks a flat white in the morning", now=NOW)
        archive_cleanly(conn, store, as_of=NOW)
    finally:
        conn.close()
    before = _snapshot(undistributed)
    assert len(before["archived"]) == len(USERS) and len(before["memories"]) == len(USERS)
    assert before["corpus"] and before["terms"]
    searched = _searches(undistributed, store)
    assert all(searched.values())

    run_script(undistributed, distribution_sql())

    assert set(citus_tables(undistributed)) >= {"memories", "archived_memories", "user_term_stats"}
    after = _snapshot(undistributed)
    assert after == before
    with psycopg.connect(undistributed, autocommit=True) as c:
        c.execute("SELECT term_stats_rebuild()")
    rebuilt = _snapshot(undistributed)
    assert rebuilt["corpus"] == before["corpus"] and rebuilt["terms"] == before["terms"]
    assert _searches(undistributed, store) == searched

    # The rows copied into the shards leave their old copies on the coordinator's disk: the page's
    # second block frees them, and the distributed tables keep every row.
    run_script(admin_url(cluster, undistributed), distribution_blocks()["free-local"])
    assert _snapshot(undistributed) == rebuilt

    # The bookkeeping triggers count new writes again, on the shards.
    conn = connect(undistributed)
    try:
        make_client(conn, store).add("ada", "ada keeps a spare key with the neighbour", now=NOW)
    finally:
        conn.close()
    later = _snapshot(undistributed)
    assert [r for r in later["corpus"] if r[0] == "ada"][0][1] == [
        r for r in before["corpus"] if r[0] == "ada"
    ][0][1] + 1
    with psycopg.connect(undistributed, autocommit=True) as c:
        c.execute("SELECT term_stats_rebuild()")
    assert _snapshot(undistributed) == later


PROBE_MIGRATION = """
-- A later release's migration on a distributed schema: a column, an index, a row trigger and its function.
ALTER TABLE memories ADD COLUMN probe_note text;
CREATE INDEX memories_probe_note ON memories (user_id, probe_note);
CREATE FUNCTION probe_note_fill() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.probe_note := 'noted for ' || NEW.user_id;
    RETURN NEW;
END $$;
CREATE TRIGGER memories_probe_note BEFORE INSERT ON memories
    FOR EACH ROW EXECUTE FUNCTION probe_note_fill();
DO $$ BEGIN RAISE WARNING 'probe migration applied'; END $$;
"""


def test_a_migration_after_distribution_reaches_every_shard(cluster, tmp_path, caplog):
    """`migrate` on a distributed schema with a new migration: applied through the coordinator by the
    application role, its column, index and row trigger on every shard of memories, the trigger runs
    where the rows are, and the server's WARNING is in migrate's log."""
    url = cluster.create(TEST_DIM)  # distributed by the page's statements
    directory = tmp_path / "migrations"
    directory.mkdir()
    for item in shipped_migrations().iterdir():
        if item.name.endswith(".sql") and item.name != "schema.sql":
            (directory / item.name).write_text(item.read_text(encoding="utf-8"), encoding="utf-8")
    (directory / "999_probe.sql").write_text(PROBE_MIGRATION, encoding="utf-8")

    with caplog.at_level("WARNING", logger="memory_lib.storage.migrations"):
        assert migrate(url, embedding_dim=TEST_DIM, directory=directory) == ["999_probe"]
    assert "migration 999_probe: server WARNING: probe migration applied" in caplog.text

    admin = admin_url(cluster, url)
    column = "SELECT count(*) FROM pg_attribute WHERE attrelid = '%s'::regclass AND attname = 'probe_note'"
    index = "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = '%s'::regclass AND c.relname LIKE 'memories_probe_note%%'"
    trigger = "SELECT count(*) FROM pg_trigger WHERE tgrelid = '%s'::regclass AND tgname LIKE 'memories_probe_note%%' AND tgenabled = 'O'"
    for query in (column, index, trigger):
        assert set(on_every_shard(admin, "memories", query)) == {"1"}, query

    conn = connect(url)
    try:
        added = [
            make_client(conn).add(user, f"{user} waters the plants on Sundays", now=NOW) for user in USERS
        ]
        notes = {
            r["user_id"]: r["probe_note"]
            for r in conn.execute(
                "SELECT user_id, probe_note FROM memories WHERE id = ANY(%s)", ([a.memory_id for a in added],)
            )
        }
    finally:
        conn.close()
    assert notes == {user: f"noted for {user}" for user in USERS}
    # Run again: nothing pending.
    assert migrate(url, embedding_dim=TEST_DIM, directory=directory) == []
    shutil.rmtree(directory)


# The archive's two indexes as migration 026 left them, and 027 not recorded: a schema distributed before 027.
BEFORE_027 = """
DROP INDEX archived_user_lexemes;
CREATE INDEX archived_user_lexemes ON archived_memories
    USING gin (user_id, (to_tsvector('english'::regconfig, summary) || coalesce(lexemes, ''::tsvector)));
DROP INDEX archived_summary_bits_hnsw;
CREATE INDEX archived_summary_bits_hnsw ON archived_memories
    USING hnsw (summary_bits bit_hamming_ops) WITH (m = 16, ef_construction = 64);
DELETE FROM schema_migrations WHERE version = 27;
"""
# Each index of a table or shard that has options, without the shard number Citus appends to its name.
INDEX_OPTIONS = """SELECT string_agg(regexp_replace(c.relname, '_[0-9]+$', '') || ' ' || array_to_string(c.reloptions, ','),
    '; ' ORDER BY c.relname) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = '%s'::regclass AND c.reloptions IS NOT NULL"""


def test_migration_027_rebuilds_the_archive_indexes_on_every_shard(cluster, tmp_path):
    """027 on a distributed schema holding archived memories: through the coordinator, each shard's
    full-text index is rebuilt without its pending list and its bits HNSW graph with m = 12, under the
    indexes' names, and each search finds what it found before."""
    url = cluster.create(TEST_DIM)
    store = LocalObjectStore(tmp_path / "objects", prefix="test")
    conn = connect(url)
    try:
        client = make_client(conn, store)
        for n, user in enumerate(USERS):
            for i in range(3 + n):
                client.add(
                    user, f"{user} note {i}: the locker code is in drawer {i}", importance=0.1, now=OLD
                )
            client.add(user, f"{user} takes the train to work at {7 + n}", importance=0.1, now=OLD)
        archive_cleanly(conn, store, as_of=NOW)
    finally:
        conn.close()
    searched = _searches(url, store)
    assert any(source == "archived" for hits in searched.values() for source, _ in hits)
    run_script(url, BEFORE_027)
    admin = admin_url(cluster, url)
    old = "archived_summary_bits_hnsw m=16,ef_construction=64"
    assert set(on_every_shard(admin, "archived_memories", INDEX_OPTIONS)) == {old}

    assert migrate(url, embedding_dim=TEST_DIM) == ["027_archive_index_footprint"]
    new = "archived_summary_bits_hnsw m=12,ef_construction=64; archived_user_lexemes fastupdate=off"
    assert set(on_every_shard(admin, "archived_memories", INDEX_OPTIONS)) == {new}
    with psycopg.connect(url) as c:
        assert one(c.execute(INDEX_OPTIONS % "archived_memories"))[0] == new
    assert _searches(url, store) == searched


SHARD_LOCKS = """SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
    WHERE l.mode = 'AccessShareLock' AND c.relname ~ '^(memories|archived_memories)(_[0-9]+)?$'"""


def test_the_space_lock_of_add_and_search_stays_on_the_coordinator_and_still_waits_for_a_flip(cluster):
    """Every add and search first takes ACCESS SHARE on the vector tables (storage.space): on Citus that
    lock is the coordinator's alone (no worker locks its copy of the tables or a shard), and it still
    makes a flip's ACCESS EXCLUSIVE wait. A plain LOCK of the same tables does reach the workers."""
    url = cluster.create(TEST_DIM)
    workers = cluster.worker_urls(url)
    assert workers

    def shard_locks() -> int:
        total = 0
        for worker in workers:
            with psycopg.connect(worker) as conn:
                row = conn.execute(SHARD_LOCKS).fetchone()
                assert row is not None
                total += int(row[0])
        return total

    with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as flipper:
        with holder.transaction():
            holder.execute(LOCK_VECTOR_TABLES.query)
            assert shard_locks() == 0
            flipper.execute("SET lock_timeout = '300ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable), flipper.transaction():
                flipper.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE")
        with holder.transaction():
            holder.execute("LOCK TABLE memories, archived_memories IN ACCESS SHARE MODE")
            assert shard_locks() > 0
        # Released at commit: the flip's lock is granted.
        with flipper.transaction():
            flipper.execute("LOCK TABLE memories IN ACCESS EXCLUSIVE MODE")
