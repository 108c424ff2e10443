"""Migrations: applied once, re-runs are no-ops, a failing one leaves nothing behind."""

from __future__ import annotations

import shutil

import psycopg
import pytest

from memory_lib.core.errors import SchemaError
from memory_lib.storage.db import MIGRATIONS_DIR, migrate
from memory_lib.storage.sql_text import sql_statements
from testing.citus import citus_urls
from testing.constants import TEST_DIM
from testing.migrations import migrate_before
from testing.rows import one


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as c:
        return {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def test_rerun_is_a_noop(empty_database):
    applied = migrate(empty_database, embedding_dim=32)
    assert applied[0] == "001_memory_tiers"
    assert {
        "memories",
        "archived_memories",
        "memory_events",
        "archival_attempts",
        "schema_migrations",
    } <= _tables(empty_database)
    assert migrate(empty_database, embedding_dim=32) == []


def test_failing_migration_rolls_back_whole(empty_database, tmp_path):
    migrations = tmp_path / "sql"
    shutil.copytree(str(MIGRATIONS_DIR), migrations)
    (migrations / "900_broken.sql").write_text(
        "CREATE TABLE half_done (id int);\nALTER TABLE memories ADD COLUMN oops int;\nSELECT 1/0;\n"
    )
    with pytest.raises(psycopg.errors.DivisionByZero):
        migrate(empty_database, embedding_dim=32, directory=migrations)
    assert "half_done" not in _tables(empty_database)
    with psycopg.connect(empty_database) as c:
        cols = {
            r[0]
            for r in c.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name='memories'"
            )
        }
        versions = [r[0] for r in c.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    assert "oops" not in cols
    assert 900 not in versions and 1 in versions  # earlier migrations stay applied


def test_other_dimension_is_refused(empty_database):
    migrate(empty_database, embedding_dim=32)
    with pytest.raises(SchemaError, match="embedding_dim=1536 does not match.*embedding_dim=32"):
        migrate(empty_database, embedding_dim=1536)


def test_edited_migration_is_detected(empty_database, tmp_path):
    migrations = tmp_path / "sql"
    shutil.copytree(str(MIGRATIONS_DIR), migrations)
    migrate(empty_database, embedding_dim=32, directory=migrations)
    last = sorted(migrations.glob("[0-9]*.sql"))[-1]
    last.write_text(last.read_text() + "\nCREATE TABLE edited_later (id int);\n")
    with pytest.raises(SchemaError, match=f"migration {last.stem} changed after it was applied"):
        migrate(empty_database, embedding_dim=32, directory=migrations)


def test_bad_migration_file_name(empty_database, tmp_path):
    (tmp_path / "1_x.sql").write_text("SELECT 1")
    with pytest.raises(SchemaError, match="1_x.sql"):
        migrate(empty_database, embedding_dim=32, directory=tmp_path)


def test_audit_log_is_append_only(conn):
    conn.execute(
        "INSERT INTO memory_events (memory_id, user_id, event_type, actor) VALUES (gen_random_uuid(), 'u', 'created', 't')"
    )
    for sql in (
        "UPDATE memory_events SET actor = 'x'",
        "DELETE FROM memory_events",
        "TRUNCATE memory_events",
    ):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute(sql)


# --------------------------------------------------------------------------- shipped, checked, never run by clients


def test_shipped_migrations_are_the_sql_folder():
    """The package's migrations (importlib.resources) are the top-level sql/ files, byte for byte."""
    from pathlib import Path

    from memory_lib.storage.db import load_migrations, shipped_migrations

    top = Path(__file__).resolve().parents[2] / "sql"
    shipped = {p.name: p.read_bytes() for p in shipped_migrations().iterdir() if p.name.endswith(".sql")}
    assert shipped == {p.name: p.read_bytes() for p in top.glob("*.sql")} and len(shipped) >= 3
    numbered = sorted(int(n[:3]) for n in shipped if n != "schema.sql")  # schema.sql: generated, for reading
    assert [m.version for m in load_migrations(embedding_dim=8)] == numbered


def test_a_missing_migrations_folder_is_an_error(tmp_path, empty_database):
    with pytest.raises(SchemaError, match="missing"):
        migrate(empty_database, embedding_dim=32, directory=tmp_path / "nowhere")
    with pytest.raises(SchemaError, match="no migrations"):
        migrate(empty_database, embedding_dim=32, directory=tmp_path)
    assert _tables(empty_database) == set()


def _settings(url: str, tmp_path, dim: int = 32):
    from memory_lib.core.config import EmbeddingConfig, Settings

    return Settings(
        database_url=url, state_dir=tmp_path, embedding=EmbeddingConfig(provider="hashing", dim=dim)
    )


def test_clients_refuse_an_empty_database_at_once_without_ddl(empty_database, tmp_path):
    import asyncio
    import time

    from memory_lib.client import AsyncMemoryClient, MemoryClient, connection_pool
    from memory_lib.llm.embedding import HashingEmbedder

    started = time.monotonic()
    with pytest.raises(SchemaError, match=r"has no memory-archive schema: run `memory-archive migrate`"):
        MemoryClient.from_settings(_settings(empty_database, tmp_path))
    with pytest.raises(SchemaError, match="run `memory-archive migrate`"):
        asyncio.run(AsyncMemoryClient.from_settings(_settings(empty_database, tmp_path)))
    with pytest.raises(SchemaError, match="run `memory-archive migrate`"):
        connection_pool(empty_database)
    with pytest.raises(SchemaError, match="run `memory-archive migrate`"):
        asyncio.run(AsyncMemoryClient.connect(empty_database, embedder=HashingEmbedder(32)))
    assert time.monotonic() - started < 10  # not a pool timeout
    assert _tables(empty_database) == set()  # the client created nothing
    with psycopg.connect(empty_database) as c:
        assert one(c.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'"))[0] == 0


def test_a_partial_schema_names_the_missing_migrations(empty_database, tmp_path):
    from memory_lib.client import MemoryClient
    from memory_lib.storage.db import check_schema

    only_first = tmp_path / "sql"
    only_first.mkdir()
    first, *rest = sorted(
        (p for p in MIGRATIONS_DIR.iterdir() if p.name.endswith(".sql") and p.name[0].isdigit()),
        key=lambda p: p.name,
    )
    (only_first / first.name).write_text(first.read_text())
    migrate(empty_database, embedding_dim=32, directory=only_first)
    lacking = ", ".join(p.name.removesuffix(".sql") for p in rest)
    assert lacking.startswith(
        "002_retrieval, 003_slow_path, 004_claim_leases, 005_retrievability, 006_backup_row_version, "
        "007_binary_summary_vectors, 008_retention, 009_tier_audit, 010_prune_checkpoints"
    )
    assert {"013_write_path", "014_forget", "016_consolidation", "015_llm_usage"} <= set(lacking.split(", "))
    assert "012_associations_warm" in lacking
    assert "011_stubs" in lacking.split(", ")
    with pytest.raises(SchemaError, match=rf"lacks migrations {lacking}: run `memory-archive migrate`"):
        MemoryClient.from_settings(_settings(empty_database, tmp_path))
    migrate(empty_database, embedding_dim=32)
    assert check_schema(empty_database, embedding_dim=32) == 32
    with pytest.raises(SchemaError, match=r"created with embedding_dim=32, settings have embedding.dim=64"):
        MemoryClient.from_settings(_settings(empty_database, tmp_path, dim=64))
    with psycopg.connect(empty_database, autocommit=True) as c:
        c.execute("INSERT INTO schema_migrations (version, name, checksum) VALUES (999, '999_future', 'x')")
    with pytest.raises(SchemaError, match="does not know .*999_future.*upgrade memory-archive"):
        check_schema(empty_database, embedding_dim=32)


def test_a_client_needs_no_ddl_rights_and_no_migration_lock(databases, db_url, tmp_path):
    """An application role with DML rights only starts a client while a migrator holds the lock."""
    import uuid

    from psycopg.conninfo import make_conninfo

    from memory_lib.client import MemoryClient
    from memory_lib.storage.migrations import _MIGRATION_LOCK_ID

    role = f"app_{uuid.uuid4().hex[:8]}"
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    superuser = make_conninfo(databases.server_url, dbname=dbname)  # db_url's role may not create roles
    with psycopg.connect(superuser, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"ALTER ROLE {role} SET lock_timeout = '5s'")  # waiting for the lock fails, not hangs
        admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        admin.execute(f"REVOKE CREATE, TEMPORARY ON DATABASE {dbname} FROM PUBLIC")
        admin.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
        admin.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}")
    app_url = make_conninfo(db_url, user=role)
    try:
        with psycopg.connect(app_url) as app, pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("CREATE TABLE not_allowed (id int)")
        with psycopg.connect(db_url, autocommit=True) as migrator:
            migrator.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK_ID,))
            with MemoryClient.from_settings(_settings(app_url, tmp_path, dim=64)) as memory:
                added = memory.add("alice", "Prefers a cortado in the morning")
                assert [h.id for h in memory.search("alice", "cortado in the morning").hot] == [
                    added.memory_id
                ]
    finally:
        if citus_urls() is None:
            with psycopg.connect(databases.server_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
                admin.execute(f"DROP ROLE IF EXISTS {role}")
        else:  # the Citus pass reuses the database: take back what the test changed
            with psycopg.connect(superuser, autocommit=True) as admin:
                admin.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
                admin.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}")
                admin.execute(f"GRANT TEMPORARY ON DATABASE {dbname} TO PUBLIC")
                admin.execute(f"DROP ROLE IF EXISTS {role}")


# --------------------------------------------------------------------------- a role that may not create extensions


@pytest.fixture
def limited_role(databases, empty_database):
    """A login role (no superuser) with CREATE on `empty_database` and its public schema, as a DBA would
    give an application's migrator; yields (superuser url, the role's url, role, database name)."""
    import uuid

    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    role = f"migrator_{uuid.uuid4().hex[:8]}"
    dbname = conninfo_to_dict(empty_database)["dbname"]
    with psycopg.connect(empty_database, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f'GRANT CREATE ON DATABASE "{dbname}" TO {role}')
        admin.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
    try:
        yield empty_database, make_conninfo(empty_database, user=role), role, dbname
    finally:  # the role owns objects in the database: drop the database first
        with psycopg.connect(databases.server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def _extensions(url: str) -> set[str]:
    with psycopg.connect(url) as c:
        return {r[0] for r in c.execute("SELECT extname FROM pg_extension")}


def test_a_role_that_may_not_create_extensions_migrates_once_the_dba_created_pgvector(limited_role):
    from memory_lib.storage.db import check_schema

    admin_url, role_url, role, _ = limited_role
    with psycopg.connect(role_url, autocommit=True) as c, pytest.raises(psycopg.errors.InsufficientPrivilege):
        c.execute("CREATE EXTENSION vector")  # the premise: this role may not
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("CREATE EXTENSION vector")
    assert migrate(role_url, embedding_dim=32)[0] == "001_memory_tiers"
    assert check_schema(role_url, embedding_dim=32) == 32
    assert migrate(role_url, embedding_dim=32) == []
    assert {"vector", "btree_gin"} <= _extensions(admin_url)  # btree_gin is trusted: the role created it
    with psycopg.connect(admin_url) as c:
        assert one(c.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'memories'"))[0] == role


def test_missing_pgvector_is_one_clear_error_and_writes_nothing(limited_role, monkeypatch, tmp_path, capsys):
    from memory_lib.cli import main
    from memory_lib.core.errors import MissingExtensionError

    admin_url, role_url, role, dbname = limited_role
    with pytest.raises(MissingExtensionError) as caught:
        migrate(role_url, embedding_dim=32)
    assert str(caught.value).startswith(
        f'pgvector is not installed in database "{dbname}" and role "{role}" may not create it: ask a superuser '
        f'to run CREATE EXTENSION vector; in database "{dbname}"'
    )
    assert (
        "on a managed Postgres (RDS, Cloud SQL, Azure, Supabase, Neon) enable the pgvector extension"
        in str(caught.value)
    )
    assert caught.value.available and caught.value.extension == "vector"
    assert _tables(admin_url) == set()  # not even schema_migrations
    assert _extensions(admin_url) == {"plpgsql"}  # nor btree_gin, which the role could have created

    for name, value in {
        "DATABASE_URL": role_url,
        "MEMORY_ARCHIVE_EMBEDDING_DIM": "32",
        "MEMORY_ARCHIVE_EMBEDDER": "hashing",
        "MEMORY_ARCHIVE_SUMMARIZER": "extractive",
        "MEMORY_ARCHIVE_LOCAL_ROOT": str(tmp_path / "objects"),
    }.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert main(["migrate"]) != 0
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    assert out.err.count("\n") == 1 and "ask a superuser to run CREATE EXTENSION vector;" in out.err
    assert _tables(admin_url) == set()


def test_an_extension_the_server_does_not_offer_is_named_and_nothing_is_written(empty_database, tmp_path):
    """Even a superuser cannot create an extension the server lacks: the error says the server needs it."""
    from memory_lib.core.errors import MissingExtensionError

    migrations = tmp_path / "sql"
    shutil.copytree(str(MIGRATIONS_DIR), migrations)
    (migrations / "900_needs_more.sql").write_text("CREATE EXTENSION IF NOT EXISTS no_such_extension;\n")
    with pytest.raises(
        MissingExtensionError, match=r"no_such_extension is not available on the Postgres server"
    ):
        migrate(empty_database, embedding_dim=32, directory=migrations)
    assert _tables(empty_database) == set()
    assert _extensions(empty_database) == {"plpgsql"}  # vector was not created either


def test_the_missing_extension_messages_say_who_must_do_what():
    from memory_lib.core.errors import MissingExtensionError

    absent = str(MissingExtensionError("vector", "mem", "app", available=False))
    assert absent.startswith('pgvector is not available on the Postgres server of database "mem"')
    assert "the server needs pgvector (>= 0.7) installed" in absent
    assert "enable the pgvector extension" in absent
    denied = str(MissingExtensionError("btree_gin", "mem", "app", available=True))
    assert denied.startswith('btree_gin is not installed in database "mem" and role "app" may not create it')
    assert "CREATE EXTENSION btree_gin;" in denied
    assert "\n" not in absent + denied


def test_a_role_without_create_on_the_schema_is_told_what_to_grant(limited_role):
    admin_url, role_url, role, dbname = limited_role
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("CREATE EXTENSION vector")
        admin.execute(f"REVOKE CREATE ON SCHEMA public FROM {role}")
    with pytest.raises(SchemaError) as caught:
        migrate(role_url, embedding_dim=32)
    assert str(caught.value) == (
        f'creating table schema_migrations needs a privilege role "{role}" lacks in database "{dbname}" '
        "(permission denied for schema public): run `memory-archive migrate` as the role that owns the schema, "
        f'the one the application connects as; or grant "{role}" CREATE on the database and on schema public '
        "(the DBA steps in docs/how-to/postgres.md)"
    )
    assert _tables(admin_url) == set()


# --------------------------------------------------------------------------- 023: backup objects by number

_ARCHIVE_ROW = """
    INSERT INTO archived_memories (original_id, user_id, summary, summary_embedding, summary_embedding_model,
        original_category, original_embedding_model, original_updated_at, importance_score, archived_at,
        original_created_at, archive_reason, storage_ref, backup_sha256, backup_size_bytes, summary_model,
        summarizer_kind)
    VALUES (gen_random_uuid(), %(user)s, 'a trip to Lisbon', '[1,0,0,0]', 'm', 'episodic', 'm', now(), 0.2,
            now(), now(), 'force_age', %(ref)s, repeat('b', 64), %(size)s, 's', 'extractive')"""
_PACK = "s3://bucket/memory-archive/packs/u=ab/night-1/" + "c" * 64 + ".jsonl"


def test_archive_rows_keep_their_backup_refs_when_refs_move_to_backup_objects(empty_database, tmp_path):
    """Migrations 023 and 024 over archive rows: pack members of two users and a lone backup. Each object's
    ref is stored once per user, every row's storage_ref composes back to exactly what it was, and its
    sha256 is kept as its 32 bytes."""
    from memory_lib.storage.packs import ref_sql

    migrate_before(empty_database, "023", tmp_path)
    rows = [
        ("u1", f"{_PACK}#bytes=0-99", 100),
        ("u1", f"{_PACK}#bytes=101-350", 250),
        ("u2", f"{_PACK}#bytes=0-9", 10),  # the same ref under another user: an object of that user's
        ("u2", "s3://bucket/memory-archive/memories/0b1c.json", 4096),
    ]
    with psycopg.connect(empty_database, autocommit=True) as c:
        for user, ref, size in rows:
            c.execute(_ARCHIVE_ROW, {"user": user, "ref": ref, "size": size})
    assert migrate(empty_database, embedding_dim=4)[:2] == ["023_backup_objects", "024_backup_digest"]
    with psycopg.connect(empty_database, autocommit=True) as c:
        objects = c.execute("SELECT user_id, ref FROM backup_objects ORDER BY 1, 2").fetchall()
        composed = c.execute(
            f"SELECT a.user_id, {ref_sql('a')}, a.backup_size_bytes FROM archived_memories a ORDER BY 1, 2"
        ).fetchall()
        digests = {r[0] for r in c.execute("SELECT backup_digest FROM archived_memories")}
        columns = {
            r[0]
            for r in c.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'archived_memories'::regclass"
            )
        }
    assert objects == sorted(
        [("u1", _PACK), ("u2", _PACK), ("u2", "s3://bucket/memory-archive/memories/0b1c.json")]
    )
    assert composed == sorted(rows)
    assert "storage_ref" not in columns and "backup_sha256" not in columns
    assert digests == {bytes.fromhex("b" * 64)}  # 024: the sha256's 32 bytes, not its 64 hex digits


def test_a_ref_that_would_not_compose_back_stops_the_migration_and_changes_nothing(empty_database, tmp_path):
    """A member range that does not span the row's backup size cannot be stored as an offset: the migration
    fails, naming the ref, and the rows keep their storage_ref."""
    migrate_before(empty_database, "023", tmp_path)
    bad = f"{_PACK}#bytes=0-99"
    with psycopg.connect(empty_database, autocommit=True) as c:
        c.execute(_ARCHIVE_ROW, {"user": "u1", "ref": bad, "size": 50})
    with pytest.raises(psycopg.Error, match="does not compose back"):
        migrate(empty_database, embedding_dim=4)
    with psycopg.connect(empty_database, autocommit=True) as c:
        assert one(c.execute("SELECT storage_ref FROM archived_memories"))[0] == bad
        assert one(c.execute("SELECT to_regclass('backup_objects')"))[0] is None


def test_memories_restored_before_migration_025_count_from_their_last_restore(empty_database, tmp_path):
    """025 over existing rows: a hot memory restored or re-promoted earlier gets its last such event's
    time as restored_at (its retention row marked for recomputation); one never archived keeps NULL."""
    from datetime import timedelta

    from memory_lib.storage.db import connect
    from memory_lib.storage.store import insert_memories
    from testing.factories import NOW, make_memories

    migrate_before(empty_database, "025", tmp_path)
    memories = make_memories(3, dim=4, users=("u1",))
    events = [
        (memories[0]["id"], "restored", NOW - timedelta(days=9)),
        (memories[0]["id"], "restored", NOW - timedelta(days=2)),  # restored twice: the last one counts
        (memories[1]["id"], "promoted", NOW - timedelta(days=5)),
        (memories[2]["id"], "expanded", NOW - timedelta(days=1)),  # not a return to hot
    ]
    with connect(empty_database) as c:
        insert_memories(c, memories, actor="test")
        c.execute(  # as a night before the upgrade left them: computed, none pending
            """UPDATE memory_retention SET pending = false, category = 'episodic', last_touched_at = created_at,
                      access_count = 0, floor = 0.02, scored_as_of = %s""",
            (NOW,),
        )
        for memory_id, kind, at in events:
            c.execute(
                """INSERT INTO memory_events (memory_id, user_id, event_type, actor, occurred_at, details)
                   VALUES (%s, 'u1', %s, 'test', %s, '{}')""",
                (memory_id, kind, at),
            )
    assert migrate(empty_database, embedding_dim=4)[:1] == ["025_restores"]
    with connect(empty_database) as c:
        rows = c.execute(
            """SELECT m.id, m.restored_at, r.pending FROM memories m
               JOIN memory_retention r ON r.user_id = m.user_id AND r.memory_id = m.id"""
        ).fetchall()
    got = {r["id"]: (r["restored_at"], r["pending"]) for r in rows}
    assert got == {
        memories[0]["id"]: (NOW - timedelta(days=2), True),
        memories[1]["id"]: (NOW - timedelta(days=5), True),
        memories[2]["id"]: (None, False),
    }


def test_a_migration_runs_statement_by_statement_and_its_server_warnings_are_logged(db_url, tmp_path, caplog):
    """A pending migration on a migrated database: its statements (a function body with semicolons,
    comments with them) run one by one in one transaction, and the server's WARNING and NOTICE are in
    migrate's log under the migration's name. The probe is removed again (the Citus pass reuses the
    database)."""
    migrations = tmp_path / "sql"
    shutil.copytree(str(MIGRATIONS_DIR), migrations)
    (migrations / "999_probe.sql").write_text(
        "-- a comment; with a semicolon\n"
        "CREATE FUNCTION probe_fn() RETURNS text LANGUAGE plpgsql AS $$\n"
        "BEGIN RAISE NOTICE 'probe notice'; RETURN 'a;b'; END $$;\n"
        "/* another; comment */\n"
        "DO $$ BEGIN RAISE WARNING 'probe warning: %', probe_fn(); END $$;\n"
    )
    try:
        with caplog.at_level("INFO", logger="memory_lib.storage.migrations"):
            assert migrate(db_url, embedding_dim=TEST_DIM, directory=migrations) == ["999_probe"]
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert [w for w in warnings if "999_probe" in w] == [
            "migration 999_probe: server WARNING: probe warning: a;b"
        ]
        assert "migration 999_probe: server NOTICE: probe notice" in caplog.text
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("DROP FUNCTION IF EXISTS probe_fn()")
            c.execute("DELETE FROM schema_migrations WHERE version = 999")


def test_sql_statements_cut_at_semicolons_outside_literals_and_comments():
    text = (
        "SELECT 'a;b'; -- c;\n/* x; /* nested; */ */ SELECT $f$;$f$;\n"
        "SELECT E'\\';', \"q;\"; -- only a comment;\n"
    )
    assert sql_statements(text) == [
        "SELECT 'a;b';",
        "-- c;\n/* x; /* nested; */ */ SELECT $f$;$f$;",
        "SELECT E'\\';', \"q;\";",
    ]


ARCHIVE_INDEX_OPTIONS = """SELECT c.relname, t.relname AS tbl, c.reloptions
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid
    JOIN pg_am am ON am.oid = c.relam
    WHERE (i.indrelid = 'archived_memories'::regclass
           OR i.indrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'archived_memories'::regclass))
      AND (am.amname = 'hnsw' OR starts_with(c.relname, 'archived_user_lexemes'))
    ORDER BY 1"""
OTHER_ARCHIVE_INDEXES = """SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE i.indrelid = 'archived_memories'::regclass AND c.relname NOT IN (%s, 'archived_user_lexemes')
    ORDER BY 1"""


@pytest.mark.parametrize(("partitions", "reembedded"), [(1, False), (4, True)])
def test_027_rebuilds_the_archive_indexes_smaller_under_their_names(
    empty_database, tmp_path, partitions, reembedded
):
    """027 over a database deployed before it: plain, or hash-partitioned by user with the bits index named
    as a re-embedding names it. The full-text index loses its pending list and the bits HNSW graph is
    m = 12, under the names they had, each partition's index named after the table's as partitioning
    names it; the archive's other indexes are as they were."""
    from memory_lib.storage import partitioning
    from memory_lib.storage.db import connect

    migrate_before(empty_database, "027", tmp_path)
    bits = "archived_memories_summary_bits_m1_hnsw" if reembedded else "archived_summary_bits_hnsw"
    with connect(empty_database) as c:
        if reembedded:
            c.execute(f"ALTER INDEX archived_summary_bits_hnsw RENAME TO {bits}")
        partitioning.ensure(c, partitions)
        others = c.execute(OTHER_ARCHIVE_INDEXES, (bits,)).fetchall()
    assert migrate(empty_database, embedding_dim=4) == ["027_archive_index_footprint"]
    with connect(empty_database) as c:
        got = {r["relname"]: (r["tbl"], r["reloptions"]) for r in c.execute(ARCHIVE_INDEX_OPTIONS)}
        assert partitioning.layout(c, "archived_memories").partitions == partitions
        assert c.execute(OTHER_ARCHIVE_INDEXES, (bits,)).fetchall() == others
        assert one(c.execute("SELECT count(*) AS n FROM pg_index WHERE NOT indisvalid"))["n"] == 0
    expected = {}
    parts = [f"archived_memories_p{i:03d}" for i in range(partitions)] if partitions > 1 else []
    for table in ["archived_memories", *parts]:
        suffix = table.removeprefix("archived_memories")
        expected[f"archived_user_lexemes{suffix}"] = (table, ["fastupdate=off"])
        expected[f"{bits}{suffix}"] = (table, ["m=12", "ef_construction=64"])
    assert got == expected
