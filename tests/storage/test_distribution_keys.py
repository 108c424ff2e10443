"""The schema can be distributed by user_id (Citus) or hash-partitioned by it: every key of a per-user
table includes user_id, and the statements a workflow runs name user_id.

A per-user table is every table of the schema not on REFERENCE_TABLES. Its primary key, unique
constraints, unique indexes and foreign keys must include user_id; a foreign key must join on user_id
(user_id references user_id) unless it points at a reference table. docs/how-to/distributed-postgres.md
lists the same reference tables and gives the distribution statements.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg.sql
import pytest
from psycopg.rows import dict_row

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig, Settings
from memory_lib.llm.embedding import HashingEmbedder
from testing.citus import distribution_sql, split_statements
from testing.constants import TEST_DIM
from testing.factories import archival_services
from testing.rows import one

# Tables that hold no user's data: settings and bookkeeping of the whole deployment. They stay on the
# coordinator (or are reference tables, copied to every worker); their keys need no user_id.
REFERENCE_TABLES = frozenset(
    {
        "schema_migrations",  # the migration runner's
        "memory_archive_settings",  # embedding dim and model of the database
        "archival_batches",  # one row per night or ad-hoc batch, across users
        "archival_pause",  # the operator's switch, one row
        "archival_pause_events",
        "archival_skipped_nights",
        "llm_batches",  # one provider batch serves many users' memories (ids only, no content)
        "embedding_migrations",  # one re-embedding of the whole database at a time
    }
)

_KEYS_SQL = """
    SELECT c.relname AS tbl, k.conname AS name, k.contype AS kind, pg_get_constraintdef(k.oid) AS def,
           ARRAY(SELECT a.attname::text FROM unnest(k.conkey) AS n JOIN pg_attribute a
                 ON a.attrelid = k.conrelid AND a.attnum = n) AS cols,
           f.relname AS ref_tbl,
           ARRAY(SELECT a.attname::text FROM unnest(k.confkey) WITH ORDINALITY AS n(num, i) JOIN pg_attribute a
                 ON a.attrelid = k.confrelid AND a.attnum = n.num ORDER BY n.i) AS ref_cols,
           ARRAY(SELECT a.attname::text FROM unnest(k.conkey) WITH ORDINALITY AS n(num, i) JOIN pg_attribute a
                 ON a.attrelid = k.conrelid AND a.attnum = n.num ORDER BY n.i) AS ordered_cols
    FROM pg_constraint k
    JOIN pg_class c ON c.oid = k.conrelid
    LEFT JOIN pg_class f ON f.oid = k.confrelid
    WHERE k.contype IN ('p', 'u', 'f', 'x') AND c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
      AND k.conparentid = 0 AND NOT c.relispartition  -- a partitioned table's keys once, not its partitions'
"""

# Unique indexes that back no constraint (partial or on expressions): Citus and partitioning need user_id
# in those too.
_UNIQUE_INDEXES_SQL = """
    SELECT c.relname AS tbl, i.relname AS name, pg_get_indexdef(x.indexrelid) AS def,
           ARRAY(SELECT a.attname::text FROM unnest(x.indkey) AS n JOIN pg_attribute a
                 ON a.attrelid = x.indrelid AND a.attnum = n WHERE n > 0) AS cols
    FROM pg_index x
    JOIN pg_class c ON c.oid = x.indrelid
    JOIN pg_class i ON i.oid = x.indexrelid
    WHERE x.indisunique AND c.relnamespace = 'public'::regnamespace AND NOT c.relispartition
      AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid)
"""


def keys_without_user_id(conn: psycopg.Connection[Any]) -> list[str]:
    """Every key of a per-user table that does not include user_id, as 'table.name: definition'."""
    problems: list[str] = []
    for k in conn.execute(_KEYS_SQL).fetchall():
        if k["tbl"] in REFERENCE_TABLES:
            continue
        where = f"{k['tbl']}.{k['name']}: {k['def']}"
        if k["kind"] == "f":
            if k["ref_tbl"] in REFERENCE_TABLES:
                continue  # a per-user row may point at a reference row (a batch)
            # user_id must reference the other table's user_id: a key that only contains user_id
            # somewhere could still join a row to another user's.
            pairs = dict(zip(k["ordered_cols"], k["ref_cols"], strict=True))
            if pairs.get("user_id") != "user_id":
                problems.append(where + " (does not join user_id to user_id)")
        elif "user_id" not in k["cols"]:
            problems.append(where)
    for ix in conn.execute(_UNIQUE_INDEXES_SQL).fetchall():
        if ix["tbl"] not in REFERENCE_TABLES and "user_id" not in ix["cols"]:
            problems.append(f"{ix['tbl']}.{ix['name']}: {ix['def']}")
    return sorted(problems)


def per_user_tables(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p') "
        "AND NOT relispartition"
    ).fetchall()
    return {r["relname"] for r in rows} - REFERENCE_TABLES


def test_every_key_of_a_per_user_table_includes_user_id(conn):
    assert keys_without_user_id(conn) == []
    # Every per-user table has the column to distribute by, never NULL.
    lacking = conn.execute(
        """SELECT c.relname FROM pg_class c
           WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> ALL(%s)
             AND NOT c.relispartition
             AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'user_id'
                             AND a.attnotnull AND NOT a.attisdropped)""",
        (sorted(REFERENCE_TABLES),),
    ).fetchall()
    assert [r["relname"] for r in lacking] == []
    assert {"memories", "archived_memories", "memory_retention", "llm_usage"} <= per_user_tables(conn)


def test_the_check_reports_keys_without_user_id(conn):
    """The check can fail: a table with a unique id alone, a key that joins without user_id, a unique
    index without user_id, all in a transaction rolled back afterwards."""
    with conn.transaction(force_rollback=True):
        conn.execute("CREATE TABLE probe_notes (id uuid UNIQUE, user_id text NOT NULL, note text)")
        conn.execute(
            """CREATE TABLE probe_links (user_id text NOT NULL, other_user text NOT NULL, memory_id uuid,
                   PRIMARY KEY (user_id, memory_id),
                   FOREIGN KEY (other_user, memory_id) REFERENCES memories (user_id, id))"""
        )
        conn.execute("CREATE UNIQUE INDEX probe_notes_note ON probe_notes (note)")
        found = keys_without_user_id(conn)
    assert found == [
        "probe_links.probe_links_other_user_memory_id_fkey: FOREIGN KEY (other_user, memory_id) "
        "REFERENCES memories(user_id, id) (does not join user_id to user_id)",
        "probe_notes.probe_notes_id_key: UNIQUE (id)",
        "probe_notes.probe_notes_note: CREATE UNIQUE INDEX probe_notes_note ON public.probe_notes USING btree (note)",
    ]
    assert keys_without_user_id(conn) == []


# --------------------------------------------------------------------------- statements of a workflow

# Statements that touch a per-user table without naming user_id, on purpose. Each is a maintenance or
# whole-deployment statement (docs/how-to/distributed-postgres.md lists them with the same reasons);
# the pattern must match the statement's text.
STATEMENT_ALLOWLIST: dict[str, str] = {
    r"^(BEGIN [^;]*;\s*)?SET LOCAL citus\.enable_ddl_propagation = off;\s+LOCK TABLE ": "a table lock for a "
    "consistent read (a read-only plan's BEGIN may go with it), no row read or written",
    r"FROM archival_attempts WHERE batch_key = %s (GROUP BY|AND status)": "a night's totals: one batch, all its users",
    r"SELECT count\(\*\) AS n FROM archival_attempts\s+WHERE batch_key = %s": "a night's totals: one batch, all its users",
    r"UPDATE archival_attempts\s+SET status = '(summarized|embedded|backed_up)'.*"
    r"WHERE batch_key = %s AND memory_id = %s": "a step's checkpoint, keyed by (batch_key, memory_id)",
    r"FROM archival_attempts a WHERE a.batch_key = %s AND a.status = %s": "a step's work: one batch, all its users",
    r"FROM archival_attempts\s+WHERE batch_key = %s AND status IN": "the night's fidelity check: one batch",
    r"FROM archived_memories a\s+WHERE a.metadata->>'batch_key' = ANY": "the night's backup check: one batch, all its users",
    r"FROM archival_attempts a JOIN llm_batches b": "stalled provider batches: a report across users",
    r"FROM archived_memories( a)?\s+WHERE (a\.)?metadata ->> 'batch_key' = %\(batch_key\)s": "the night's "
    "retrievability probe (its count and sample): one batch, all its users",
}

_TABLE_REF = re.compile(
    r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE|USING)\s+([a-z_]+)|,\s*([a-z_]+)\s+[a-z]\b", re.IGNORECASE
)
_SELECT_LIST = re.compile(r"\bSELECT\b.*?\bFROM\b", re.IGNORECASE | re.DOTALL)
_RETURNING = re.compile(r"\bRETURNING\b[^)]*", re.IGNORECASE)


class StatementLog:
    """Every statement text psycopg sends in the test (sync cursors: the client and the pipeline)."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def lacking_user_id(self, tables: set[str]) -> list[tuple[str, list[str]]]:
        """Distinct statements that reference per-user tables more often than they name user_id: each
        reference needs its user_id (a filter, a join condition, an inserted column), since a join of
        two distributed tables runs on one worker only when it joins on the distribution column. A
        user_id that is only read (a SELECT list, RETURNING) does not count."""
        out = []
        for sql in dict.fromkeys(self.statements):  # each distinct text once, in order
            refs = [(a or b).lower() for a, b in _TABLE_REF.findall(sql)]
            refs = [t for t in refs if t in tables]
            keys = _RETURNING.sub(" ", _SELECT_LIST.sub("SELECT FROM", sql))
            named = len(re.findall(r"\buser_id\b", keys))
            allowed = any(re.search(p, sql, re.DOTALL) for p in STATEMENT_ALLOWLIST)
            if refs and named < len(refs) and not allowed:
                out.append((sql, sorted(set(refs))))
        return out


@pytest.fixture
def statement_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatementLog]:
    log = StatementLog()
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany

    def text(cur: psycopg.Cursor, query: object) -> str:
        if isinstance(query, bytes):
            return query.decode()
        if isinstance(query, psycopg.sql.Composable):
            return query.as_string(cur)
        return str(query)

    def recording_execute(self, query, *args, **kwargs):
        log.statements.append(text(self, query))
        return execute(self, query, *args, **kwargs)

    def recording_executemany(self, query, *args, **kwargs):
        log.statements.append(text(self, query))
        return executemany(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recording_execute)
    monkeypatch.setattr(psycopg.Cursor, "executemany", recording_executemany)
    yield log


NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)


def test_the_statement_check_reports_what_lacks_user_id():
    """The check can fail: a delete by id alone, a join on ids alone and a user_id that is only read are
    reported; a filter, a join on user_id and an inserted user_id are not."""
    log = StatementLog()
    log.statements = [
        "DELETE FROM memories WHERE id = ANY(%s)",
        "SELECT a.user_id FROM archival_attempts a JOIN memories m ON m.id = a.memory_id WHERE a.user_id = %s",
        "UPDATE forget_requests SET status = 'done' WHERE id = %s RETURNING user_id",
        "DELETE FROM memories WHERE user_id = %s AND id = ANY(%s)",
        "SELECT m.id FROM archival_attempts a JOIN memories m ON m.id = a.memory_id AND m.user_id = a.user_id"
        " WHERE a.user_id = %s",
        "INSERT INTO memory_events (memory_id, user_id, event_type) VALUES (%s, %s, 'created')",
    ]
    reported = [sql for sql, _ in log.lacking_user_id({"memories", "archival_attempts", "forget_requests"})]
    assert reported == log.statements[:3]


def test_a_workflows_statements_on_per_user_tables_name_user_id(conn, local_store, statement_log):
    """add, search, archive a night, expand, restore, forget: every statement that touches a per-user
    table names user_id (in its filter, join or inserted columns), or is on the allowlist."""
    tables = per_user_tables(conn)
    client = MemoryClient(
        conn,
        embedder=HashingEmbedder(TEST_DIM),
        object_store=local_store,
        settings=Settings(
            retrieval=RetrievalConfig(hot_similarity_threshold=-1.0, archived_similarity_threshold=-1.0)
        ),
        actor="test",
    )
    statement_log.statements.clear()  # the client's construction reads settings only
    for user in ("u1", "u2"):
        for i in range(3):
            client.add(
                user, f"{user} old note {i}: the locker code is in drawer {i}", importance=0.1, now=OLD
            )
        client.add(user, f"{user} prefers a cortado in the morning", importance=0.9, now=NOW)
    assert list(client.search("u1", "locker code drawer", phase2="always", now=NOW))
    services = archival_services(local_store)
    run_batch(conn, services, ArchivalCriteria(), batch_key="night-1", as_of=NOW, actor="test")
    archived = conn.execute(
        "SELECT id, original_id FROM archived_memories WHERE user_id = 'u1' ORDER BY original_created_at"
    ).fetchall()
    assert len(archived) == 3
    client.expand("u1", archived[0]["id"], now=NOW)
    assert client.restore("u1", archive_id=archived[1]["id"], now=NOW).restored
    client.forget("u1", archived[2]["original_id"], now=NOW)
    client.forget_user("u2", now=NOW)

    unnamed = statement_log.lacking_user_id(tables)
    assert unnamed == [], "\n\n".join(f"{t}:\n{s}" for s, t in unnamed)


# --------------------------------------------------------------------------- the docs page's statements

# Reference tables that stay plain tables on the coordinator (no foreign key from a per-user table).
COORDINATOR_ONLY = frozenset(
    {"schema_migrations", "archival_pause", "archival_pause_events", "archival_skipped_nights"}
)
_TRIGGERS_OFF = re.compile(r"ALTER TABLE (\w+) DISABLE TRIGGER USER")
_TRIGGERS_ON = re.compile(r"ALTER TABLE (\w+) ENABLE TRIGGER USER")


def test_the_docs_distribute_every_table_in_an_order_citus_accepts(conn):
    """The page's statements parse (as PL/pgSQL, which parses each statement without running it), name
    every per-user table once, distributed by user_id and colocated with memories, every other reference
    table once, and come after the tables their foreign keys point at; the tables whose triggers write
    other tables have them off while their rows are copied. (tests/storage/test_citus_distribution.py
    runs them on a cluster.)"""
    block = distribution_sql()
    body = re.sub(r"(?m)^SELECT ", "PERFORM ", block)
    with conn.transaction(force_rollback=True):
        conn.execute(
            f"CREATE FUNCTION pg_temp.citus_block() RETURNS void LANGUAGE plpgsql AS $body$ BEGIN {body} END $body$"
        )
    statements = split_statements(block)
    calls = [re.fullmatch(r"SELECT (create_\w+)\('(\w+)'(.*?)\)", s) for s in statements]
    order = [m.group(2) for m in calls if m]
    others = [s for s, m in zip(statements, calls, strict=True) if not m]
    off = [m.group(1) for s in others if (m := _TRIGGERS_OFF.fullmatch(s))]
    on = [m.group(1) for s in others if (m := _TRIGGERS_ON.fullmatch(s))]
    assert others == [
        "SET citus.enable_unsafe_triggers = on",
        "SELECT bookkeeping_per_row()",
        *(f"ALTER TABLE {t} DISABLE TRIGGER USER" for t in off),
        *(f"ALTER TABLE {t} ENABLE TRIGGER USER" for t in on),
    ]
    assert (
        statements[: len(off) + 2] == others[: len(off) + 2] and statements[-len(on) :] == others[-len(on) :]
    )
    writers = conn.execute(
        """SELECT DISTINCT c.relname AS tbl FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
           WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition AND NOT t.tgisinternal
             AND t.tgtype & 2 = 0 AND t.tgtype & (4 | 8 | 16) <> 0"""  # AFTER a row change
    ).fetchall()
    assert sorted(off) == sorted(on) == sorted(r["tbl"] for r in writers)
    assert len(order) == len(set(order))
    reference = {m.group(2) for m in calls if m and m.group(1) == "create_reference_table"}
    distributed = {m.group(2): m.group(3) for m in calls if m and m.group(1) == "create_distributed_table"}
    assert reference == REFERENCE_TABLES - COORDINATOR_ONLY
    assert set(distributed) == per_user_tables(conn)
    assert distributed.pop("memories") == ", 'user_id'"
    assert set(distributed.values()) == {", 'user_id', colocate_with => 'memories'"}
    for fk in conn.execute(
        "SELECT conrelid::regclass::text AS tbl, confrelid::regclass::text AS ref FROM pg_constraint WHERE contype = 'f' AND conparentid = 0"
    ):
        if fk["tbl"] in order:
            assert fk["ref"] in order and order.index(fk["ref"]) < order.index(fk["tbl"]), fk


# --------------------------------------------------------------------------- the migration on existing rows


def test_the_migration_keeps_existing_rows_and_repairs_what_the_new_keys_check(empty_database, tmp_path):
    """Migration 022 over a populated database: every row stays, a ledger row without a user takes its
    memory's (or the empty user id), a link use recorded under another user takes its archive row's,
    and the re-pointed foreign keys still cascade."""
    from memory_lib.storage.db import migrate
    from testing.migrations import migrate_before

    migrate_before(empty_database, "022", tmp_path)
    with psycopg.connect(empty_database, autocommit=True, row_factory=dict_row) as c:
        hot = one(
            c.execute(
                """INSERT INTO memories (user_id, content, content_sha256, embedding, embedding_model, embedding_dim)
               VALUES ('u1', 'keeps a spare key under the mat', repeat('a', 64), '[1,0,0,0]', 'm', 4)
               RETURNING id"""
            )
        )["id"]
        archive = one(
            c.execute(
                """INSERT INTO archived_memories (original_id, user_id, summary, summary_embedding,
                   summary_embedding_model, original_category, original_embedding_model, original_updated_at,
                   importance_score, archived_at, original_created_at, archive_reason, storage_ref,
                   backup_sha256, backup_size_bytes, summary_model, summarizer_kind)
               VALUES (gen_random_uuid(), 'u1', 'a trip to Lisbon', '[1,0,0,0]', 'm', 'episodic', 'm', now(),
                   0.2, now(), now(), 'force_age', 'local://x', repeat('b', 64), 10, 's', 'extractive')
               RETURNING id"""
            )
        )["id"]
        c.execute(
            """INSERT INTO archive_link_uses (archive_id, user_id, original_id, linked_from, used_at)
               VALUES (%(a)s, 'u1', gen_random_uuid(), %(h)s, now()), (%(a)s, 'u2', gen_random_uuid(), %(h)s, now())""",
            {"a": archive, "h": hot},
        )
        c.execute(
            """INSERT INTO llm_usage (memory_id, user_id, provider, model, mode, outcome, input_tokens,
                   output_tokens, cost_usd, priced)
               VALUES (%s, NULL, 'x', 'm', 'sync', 'ok', 1, 1, 0, true),
                      (gen_random_uuid(), NULL, 'x', 'm', 'sync', 'ok', 1, 1, 0, true)""",
            (hot,),
        )
        assert one(c.execute("SELECT count(*) AS n FROM memory_retention"))["n"] == 1

    assert migrate(empty_database, embedding_dim=4)[0] == "022_distribution_keys"

    with psycopg.connect(empty_database, autocommit=True, row_factory=dict_row) as c:
        assert keys_without_user_id(c) == []
        ledger = [
            r["user_id"] for r in c.execute("SELECT user_id FROM llm_usage ORDER BY memory_id = %s", (hot,))
        ]
        assert ledger == ["", "u1"]
        uses = c.execute("SELECT user_id FROM archive_link_uses").fetchall()
        assert [r["user_id"] for r in uses] == ["u1", "u1"]
        c.execute("DELETE FROM archived_memories WHERE id = %s", (archive,))
        c.execute("DELETE FROM memories WHERE id = %s", (hot,))
        counts = c.execute(
            "SELECT (SELECT count(*) FROM archive_link_uses) AS uses, (SELECT count(*) FROM memory_retention) AS scores"
        ).fetchone()
        assert counts == {"uses": 0, "scores": 0}
