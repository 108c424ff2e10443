"""Shared by the Slow Path tests: a small deterministic history, and resources for a test database."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from memory_assets.demo_data import generate_history
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.store import insert_memories


def sqlalchemy_url(libpq_url: str) -> str:
    """A test database's libpq conninfo as the SQLAlchemy URL dagster-postgres takes (psycopg2, unix socket)."""
    info = psycopg.conninfo.conninfo_to_dict(libpq_url)
    return (
        f"postgresql+psycopg2://{info['user']}@/{info['dbname']}"
        f"?host={info['host']}&port={info.get('port', 5432)}"
    )


# History ends here; its nights before END are all past partitions whatever today's date.
END = datetime(2026, 6, 1, tzinfo=UTC)
HISTORY_DAYS = 120  # the first 30 days are older than min_age_days=90 on the last night


def load_history(
    conn: psycopg.Connection[Any],
    dim: int,
    *,
    days: int = HISTORY_DAYS,
    per_day: tuple[int, int] = (5, 9),
    users: int = 3,
    end: datetime = END,
) -> list[uuid.UUID]:
    embedder = HashingEmbedder(dim)
    items = list(generate_history(end=end, days=days, per_day=per_day, users=users))
    vectors = embedder.embed([m.content for m in items])
    memories = [m.as_new_memory(v, embedder.model) for m, v in zip(items, vectors, strict=True)]
    return insert_memories(conn, memories, actor="test-loader")


def range_tags(nights: list[date]) -> dict[str, str]:
    """The tags of one run over the nights from the first to the last (as a backfill launches it)."""
    return {
        "dagster/asset_partition_range_start": nights[0].isoformat(),
        "dagster/asset_partition_range_end": nights[-1].isoformat(),
    }


def last_night(end: datetime = END) -> date:
    return (end - timedelta(days=1)).date()


def table_fingerprint(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Row counts and content hashes of every table the Slow Path could write."""
    out: dict[str, Any] = {}
    assert out is not None
    for table in (
        "memories",
        "archived_memories",
        "memory_events",
        "archival_batches",
        "archival_attempts",
        "archival_pause_events",
        "archival_skipped_nights",
    ):
        row = conn.execute(
            f"SELECT count(*) AS n, md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) AS h FROM {table} t"
        ).fetchone()
        assert row is not None
        out[table] = (row["n"], row["h"])
    return out


def offline_dagster_env(tmp_path: Path, db_url: str, dim: int) -> dict[str, str]:
    """The environment of a Dagster process a test starts (daemon, `dagster dev`, their code servers and
    runs): this process's, without its memory-archive and Dagster settings, plus the test's database, an
    offline summarizer and embedder, a local object store, a state dir and a DAGSTER_HOME under tmp_path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMORY_ARCHIVE_") and k not in ("DATABASE_URL", "DAGSTER_PG_URL", "DAGSTER_HOME")
    }
    return env | {
        "DAGSTER_HOME": str(tmp_path / "dagster"),
        "DATABASE_URL": db_url,
        "MEMORY_ARCHIVE_STATE_DIR": str(tmp_path / "state"),
        "MEMORY_ARCHIVE_EMBEDDING_DIM": str(dim),
        "MEMORY_ARCHIVE_EMBEDDER": "hashing",
        "MEMORY_ARCHIVE_SUMMARIZER": "extractive",
        "MEMORY_ARCHIVE_OBJECT_STORE": "local",
        "MEMORY_ARCHIVE_LOCAL_ROOT": str(tmp_path / "objects"),
    }


def metadata_value(event: Any, key: str) -> Any:
    """The value of an event's (or a check's) metadata entry. Dagster types it as the union of every
    metadata kind; the test knows which kind the code under test wrote."""
    return event.metadata[key].value
