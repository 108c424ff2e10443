"""Migrations: applied once, re-runs are no-ops, a failing one leaves nothing behind."""

from __future__ import annotations

import shutil

import psycopg
import pytest

from memory_lib.db import MIGRATIONS_DIR, migrate
from memory_lib.errors import SchemaError


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as c:
        return {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


@pytest.fixture
def empty_db(databases):
    name = "mig_" + __import__("uuid").uuid4().hex[:8]
    with psycopg.connect(databases.server_url, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    url = databases.url(name)
    yield url
    databases.drop(url)


def test_rerun_is_a_noop(empty_db):
    applied = migrate(empty_db, embedding_dim=32)
    assert applied[0] == "001_memory_tiers"
    assert {"memories", "archived_memories", "memory_events", "archival_attempts", "schema_migrations"} <= _tables(
        empty_db
    )
    assert migrate(empty_db, embedding_dim=32) == []


def test_failing_migration_rolls_back_whole(empty_db, tmp_path):
    migrations = tmp_path / "sql"
    shutil.copytree(MIGRATIONS_DIR, migrations)
    (migrations / "900_broken.sql").write_text(
        "CREATE TABLE half_done (id int);\nALTER TABLE memories ADD COLUMN oops int;\nSELECT 1/0;\n"
    )
    with pytest.raises(psycopg.errors.DivisionByZero):
        migrate(empty_db, embedding_dim=32, directory=migrations)
    assert "half_done" not in _tables(empty_db)
    with psycopg.connect(empty_db) as c:
        cols = {r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE table_name='memories'")}
        versions = [r[0] for r in c.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    assert "oops" not in cols
    assert 900 not in versions and 1 in versions  # earlier migrations stay applied


def test_other_dimension_is_refused(empty_db):
    migrate(empty_db, embedding_dim=32)
    with pytest.raises(SchemaError, match="embedding_dim=1536 does not match.*embedding_dim=32"):
        migrate(empty_db, embedding_dim=1536)


def test_edited_migration_is_detected(empty_db, tmp_path):
    migrations = tmp_path / "sql"
    shutil.copytree(MIGRATIONS_DIR, migrations)
    migrate(empty_db, embedding_dim=32, directory=migrations)
    first = sorted(migrations.glob("*.sql"))[-1]
    first.write_text(first.read_text() + "\n-- edited\n")
    with pytest.raises(SchemaError, match="changed after it was applied"):
        migrate(empty_db, embedding_dim=32, directory=migrations)


def test_bad_migration_file_name(empty_db, tmp_path):
    (tmp_path / "1_x.sql").write_text("SELECT 1")
    with pytest.raises(SchemaError, match="1_x.sql"):
        migrate(empty_db, embedding_dim=32, directory=tmp_path)


def test_audit_log_is_append_only(conn):
    conn.execute(
        "INSERT INTO memory_events (memory_id, user_id, event_type, actor) VALUES (gen_random_uuid(), 'u', 'created', 't')"
    )
    for sql in ("UPDATE memory_events SET actor = 'x'", "DELETE FROM memory_events", "TRUNCATE memory_events"):
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute(sql)
