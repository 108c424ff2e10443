"""Tenant partitioning: memories and archived_memories converted to hash partitions by user_id and
back, with every row, key, index, trigger, foreign key and grant kept, per-partition vector indexes,
plan-time pruning to one partition for a user's search, and nothing changed by a failed conversion."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import psycopg
import pytest

from memory_lib.archival import nights
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig, Settings
from memory_lib.core.errors import InvalidInputError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.sql import (
    BOTH_TIERS_SQL,
    EXACT_MAX,
    HOT_SEARCH_SQL,
    SEARCH_SETTINGS_SQL,
    homes_of,
    pruned,
    statement_for,
)
from memory_lib.retrieval.types import SearchRequest
from memory_lib.storage import partitioning
from memory_lib.storage.db import migrate_database
from memory_lib.storage.store import insert_memories, tier_stats
from testing.citus import citus_urls
from testing.constants import TEST_DIM
from testing.explain import base_name, hot_search_plan
from testing.factories import NOW, archival_services, make_memories, parcel_rows
from testing.rows import one

pytestmark = pytest.mark.skipif(
    citus_urls() is not None,
    reason="tenant partitioning converts plain tables of one Postgres; a distributed schema is split by "
    "Citus's shards instead, and the two together are not supported (docs/how-to/distributed-postgres.md)",
)

USERS = ("ann", "ben", "cyd", "dot", "eve")


def _fingerprint(conn, table: str) -> str:
    """Every column of every row, in id order."""
    return one(conn.execute(f"SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) AS h FROM {table} t"))[
        "h"
    ]


def _state(conn) -> dict[str, object]:
    return {t: _fingerprint(conn, t) for t in (*partitioning.PARTITIONED_TABLES, "memory_retention")} | {
        "constraints": sorted(
            (r["t"], r["conname"], r["def"])
            for r in conn.execute(
                """SELECT conrelid::regclass::text AS t, conname, pg_get_constraintdef(oid) AS def FROM pg_constraint
                   WHERE conparentid = 0 AND (conrelid::regclass::text IN ('memories', 'archived_memories')
                                              OR confrelid::regclass::text IN ('memories', 'archived_memories'))"""
            ).fetchall()
        ),
        "indexes": sorted(
            r["indexname"]
            for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename IN ('memories', 'archived_memories')"
            ).fetchall()
        ),
        "triggers": sorted(
            r["tgname"]
            for r in conn.execute(
                """SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgparentid = 0
                   AND tgrelid::regclass::text IN ('memories', 'archived_memories')"""
            ).fetchall()
        ),
    }


def _populate(conn, local_store) -> MemoryClient:
    partitioning.ensure(conn, 1)  # from plain tables, also when the suite runs on a partitioned schema
    insert_memories(conn, make_memories(40, dim=TEST_DIM, users=USERS, age_days=200), actor="test")
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(), actor="test")
    for u in USERS:
        client.add(u, f"{u} keeps the Heron rollout notes in the blue binder", now=NOW - timedelta(days=2))
    services = archival_services(local_store)
    report = nights.run_night(conn, services, ArchivalCriteria(batch_size=20), NOW.date(), "UTC")
    assert report.ok and report.archived == 20, report.problem
    return client


def test_conversion_keeps_everything_and_prunes_a_users_search_to_one_partition(conn, local_store):
    client = _populate(conn, local_store)
    before = _state(conn)
    searches = {
        u: [h.id for h in client.search(u, "Heron rollout notes", include_past=True).hits] for u in USERS
    }
    assert all(searches.values())

    assert [str(x) for x in partitioning.ensure(conn, 4)] == [
        "memories: 4 hash partitions by user_id",
        "archived_memories: 4 hash partitions by user_id",
    ]
    assert _state(conn) == before
    assert {
        u: [h.id for h in client.search(u, "Heron rollout notes", include_past=True).hits] for u in USERS
    } == searches
    for table in partitioning.PARTITIONED_TABLES:
        assert partitioning.layout(conn, table).partitions == 4
        per_partition = conn.execute(
            """SELECT c.relname, count(*) FILTER (WHERE am.amname = 'hnsw') AS hnsw,
                      count(*) FILTER (WHERE am.amname = 'gin') AS gin
               FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
               JOIN pg_index x ON x.indrelid = c.oid JOIN pg_class ic ON ic.oid = x.indexrelid
               JOIN pg_am am ON am.oid = ic.relam
               WHERE i.inhparent = %s::regclass GROUP BY 1 ORDER BY 1""",
            (table,),
        ).fetchall()
        assert [r["relname"] for r in per_partition] == [f"{table}_p{i:03d}" for i in range(4)]
        assert all(r["hnsw"] >= 1 and r["gin"] >= 1 for r in per_partition), per_partition
    # A user's vector search is planned against one partition, through that partition's HNSW index
    # (a seq scan is cheaper over a few rows: the planner is told not to take it).
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            next(iter(r.values()))
            for r in conn.execute(
                """EXPLAIN SELECT id FROM memories WHERE user_id = %s
                   ORDER BY embedding <=> %s LIMIT 10""",
                ("ann", np.ones(TEST_DIM, dtype=np.float32)),
            ).fetchall()
        )
    scanned = {p for p in (f"memories_p{i:03d}" for i in range(4)) if p in plan}
    assert len(scanned) == 1, plan
    (partition,) = scanned
    hnsw = one(
        conn.execute(
            """SELECT ic.relname FROM pg_index x JOIN pg_class ic ON ic.oid = x.indexrelid JOIN pg_am am ON am.oid = ic.relam
           WHERE x.indrelid = %s::regclass AND am.amname = 'hnsw'""",
            (partition,),
        )
    )["relname"]
    assert f"Index Scan using {hnsw}" in plan, plan

    # The tables work as before: a write gets its retention row, a night archives through the keys.
    added = client.add("ann", "Ann moved the Heron binder to the archive room", now=NOW - timedelta(days=1))
    assert one(
        conn.execute(
            "SELECT pending FROM memory_retention WHERE user_id = 'ann' AND memory_id = %s",
            (added.memory_id,),
        )
    )["pending"]
    services = archival_services(local_store)
    report = nights.run_night(
        conn, services, ArchivalCriteria(batch_size=10), NOW.date() + timedelta(days=1), "UTC"
    )
    assert report.ok and report.archived == 10, report.problem
    orphans = one(
        conn.execute(
            """SELECT count(*) AS n FROM memory_retention r
           WHERE NOT EXISTS (SELECT 1 FROM memories m WHERE m.user_id = r.user_id AND m.id = r.memory_id)"""
        )
    )["n"]
    assert orphans == 0

    # Converting to the layout the tables have does nothing; back to plain tables keeps every row.
    assert partitioning.ensure(conn, 4) == []
    after = _state(conn)
    assert [str(x) for x in partitioning.ensure(conn, 1)] == [
        "memories: not partitioned",
        "archived_memories: not partitioned",
    ]
    assert _state(conn) == after
    assert partitioning.layout(conn, "memories").partitions == 1


def test_a_failed_conversion_changes_nothing(conn, local_store):
    _populate(conn, local_store)
    # A unique index without user_id: Postgres refuses it on a partitioned table, mid-conversion.
    conn.execute("CREATE UNIQUE INDEX memories_content_once ON memories (content, id)")
    before = _state(conn)
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="partition"):
        partitioning.ensure(conn, 4)
    assert _state(conn) == before
    assert partitioning.layout(conn, "memories").partitions == 1
    assert partitioning.layout(conn, "archived_memories").partitions == 1


def test_the_setting_converts_on_migrate_and_bad_values_are_named(db_url):
    migrate_database(db_url, TEST_DIM, user_partitions=1)
    assert migrate_database(db_url, TEST_DIM, user_partitions=3) == [
        "memories: 3 hash partitions by user_id",
        "archived_memories: 3 hash partitions by user_id",
    ]
    assert migrate_database(db_url, TEST_DIM, user_partitions=3) == []
    assert migrate_database(db_url, TEST_DIM) == []  # unset: the database keeps its layout
    for bad in (0, 1001, True):
        with pytest.raises(InvalidInputError, match=f"user_partitions.*{bad}"):
            partitioning.check_partitions(bad)
    with pytest.raises(Exception, match="USER_PARTITIONS"):
        Settings.from_env({"MEMORY_ARCHIVE_USER_PARTITIONS": "0"})
    assert Settings.from_env({"MEMORY_ARCHIVE_USER_PARTITIONS": "16"}).user_partitions == 16


def test_tier_bytes_are_their_partitions_bytes(conn, local_store):
    """What a night reports for each tier's table (tier_stats: the Dagster UI's hot_table_bytes and
    archive_table_bytes) counts every partition: a partitioned table has no storage of its own."""
    _populate(conn, local_store)  # plain tables

    def size(relation: str) -> int:
        return one(conn.execute("SELECT pg_total_relation_size(%s::regclass) AS b", (relation,)))["b"]

    stats = tier_stats(conn)
    assert (stats.hot_bytes, stats.archived_bytes) == (size("memories"), size("archived_memories"))
    assert stats.hot_bytes > 0 and stats.archived_bytes > 0
    partitioning.ensure(conn, 4)
    stats = tier_stats(conn)
    on_disk = {
        t: sum(size(p) for p in partitioning.partitions_of(conn, t))
        for t in ("memories", "archived_memories")
    }
    assert stats.hot_bytes == on_disk["memories"] > 0
    assert stats.archived_bytes == on_disk["archived_memories"] > 0


def test_a_night_of_many_users_lands_in_their_partitions(conn, local_store):
    """Rows are routed by the same hash Postgres documents: each user's rows sit in one partition."""
    partitioning.ensure(conn, 4)
    _populate(conn, local_store)
    spread = conn.execute(
        "SELECT user_id, count(DISTINCT tableoid) AS parts FROM memories GROUP BY 1"
    ).fetchall()
    assert len(spread) == len(USERS) and all(r["parts"] == 1 for r in spread)


def _partitions_read(conn, sql: str, user: str) -> set[str]:
    """The hot partitions the search statement reads for `user` (its plan's scans of memories)."""
    nodes = hot_search_plan(conn, sql, user)
    return {
        n["Relation Name"]
        for n in nodes
        if base_name(n.get("Relation Name")) == "memories" and n["Relation Name"] != "memories"
    }


def test_a_large_users_search_reads_only_its_partition(conn):
    """The graph walk filters by an unindexable `user_id || ''` (so a large user's rows are not read from
    a user index and sorted). That filter prunes no partition, so on partitioned tiers the walk reads the
    user's partition, found by the search's session settings: one partition's graph, not every one's."""
    partitioning.ensure(conn, 4)
    # above EXACT_MAX: the search's graph walk is the branch taken
    rows = parcel_rows(EXACT_MAX + 200, seed=3, dim=TEST_DIM, now=NOW, user_of=lambda i: "big")
    insert_memories(conn, rows, actor="test", now=NOW)
    conn.execute("ANALYZE memories")
    home = one(
        conn.execute("SELECT DISTINCT tableoid::regclass::text AS p FROM memories WHERE user_id = 'big'")
    )["p"]
    assert _partitions_read(conn, HOT_SEARCH_SQL, "big") == {f"memories_p{i:03d}" for i in range(4)}
    request = SearchRequest(
        user_id="big",
        query="parcel",
        embedding=np.ones(TEST_DIM, dtype=np.float32),
        config=RetrievalConfig(),
        now=NOW,
    )
    # What the search reads from its session settings decides it: the user's partition of each tier.
    with conn.transaction():
        session = conn.execute(SEARCH_SETTINGS_SQL, {"ef_search": "100", "user_id": "big"}).fetchone()
    assert session["partitioned"] is True and session["hot_home"] == home
    assert session["archived_home"] is None  # no archive row yet: that tier's walk keeps the key
    homes = homes_of(session)
    sql = statement_for(HOT_SEARCH_SQL, request, homes=homes)
    assert _partitions_read(conn, sql, "big") == {home}
    # ... and the walk still walks: the HNSW index of that partition, not the user's rows read and sorted.
    walked = {
        n["Index Name"]
        for n in hot_search_plan(conn, sql, "big", analyze=True)
        if n.get("Actual Loops") and n.get("Index Name", "").startswith("memories_embedding_hnsw")
    }
    assert walked == {home.replace("memories", "memories_embedding_hnsw")}
    assert "memories_p" in pruned(BOTH_TIERS_SQL, homes) and "AND a.user_id = %(user_id)s" in pruned(
        BOTH_TIERS_SQL, homes
    )
    partitioning.ensure(conn, 1)
    with conn.transaction():
        plain = conn.execute(SEARCH_SETTINGS_SQL, {"ef_search": "100", "user_id": "big"}).fetchone()
    assert plain["partitioned"] is False and homes_of(plain) == ()
