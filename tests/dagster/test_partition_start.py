"""The first archival night: an explicit MEMORY_ARCHIVE_PARTITION_START wins; unset, the night of the
oldest memory (hot or archived) read from the database when the definitions load; with no memory or no
reachable database, today minus FALLBACK_DAYS, logged."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from memory_assets.defs.slow_path.partitions import FALLBACK_DAYS, partition_start
from memory_lib.archival import nights
from memory_lib.archival.archive import ArchivalServices
from memory_lib.core.config import ArchivalCriteria, Settings
from memory_lib.lifecycle import eligibility
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from tests.conftest import TEST_DIM
from tests.support.dagster_helpers import last_night, load_history

ROOT = Path(__file__).resolve().parents[2]
# 20:00 UTC on 14 November is already 15 November in Tokyo: the night is the local date. The history
# (tests.support.dagster_helpers) starts in 2026, so this one memory is the oldest.
OLDEST = datetime(2025, 11, 14, 20, 0, tzinfo=UTC)


@pytest.fixture
def unset_start(monkeypatch):
    monkeypatch.delenv("MEMORY_ARCHIVE_PARTITION_START", raising=False)


def _with_oldest(conn, when: datetime) -> None:
    load_history(conn, TEST_DIM)
    conn.execute(
        "UPDATE memories SET created_at = %s WHERE id = (SELECT id FROM memories ORDER BY created_at, id LIMIT 1)",
        (when,),
    )


def _settings(url: str, **slow_path) -> Settings:
    return (
        Settings.from_env(database_url=url, slow_path=slow_path)
        if slow_path
        else Settings.from_env(database_url=url)
    )


def test_unset_start_is_the_oldest_memorys_night_in_the_zone(conn, db_url, unset_start):
    _with_oldest(conn, OLDEST)
    assert partition_start(_settings(db_url)) == date(2025, 11, 14)
    assert partition_start(_settings(db_url, timezone="Asia/Tokyo")) == date(2025, 11, 15)


def test_archived_memories_keep_the_start_where_it_was(conn, db_url, unset_start, local_store):
    """Archiving the oldest memories must not move the first night (its partitions would vanish)."""
    load_history(conn, TEST_DIM)
    as_of = nights.night_as_of(last_night(), "UTC")
    victim = eligibility.select_eligible(conn, ArchivalCriteria(), as_of, 1)[0]["id"]
    conn.execute("UPDATE memories SET created_at = %s WHERE id = %s", (OLDEST, victim))
    first = partition_start(_settings(db_url))
    assert first == OLDEST.date()
    services = ArchivalServices(ExtractiveSummarizer(), HashingEmbedder(TEST_DIM), local_store)
    report = nights.run_night(conn, services, ArchivalCriteria(), last_night(), "UTC")
    assert report.ok and report.archived > 0
    assert conn.execute("SELECT count(*) AS n FROM memories WHERE id = %s", (victim,)).fetchone()["n"] == 0
    oldest_hot = conn.execute("SELECT min(created_at) AS t FROM memories").fetchone()["t"]
    assert oldest_hot.date() > first  # the oldest one is archived now
    assert partition_start(_settings(db_url)) == first


def test_an_explicit_start_wins_over_the_database(conn, db_url, unset_start):
    _with_oldest(conn, OLDEST)
    assert partition_start(_settings(db_url, partition_start_date="2026-05-01")) == date(2026, 5, 1)


def test_an_empty_database_falls_back_and_says_so(db_url, unset_start, caplog):
    today = datetime.now(ZoneInfo("UTC")).date()
    with caplog.at_level(logging.WARNING):
        start = partition_start(_settings(db_url))
    assert start == today - timedelta(days=FALLBACK_DAYS)
    assert "no memory in the database" in caplog.text and "MEMORY_ARCHIVE_PARTITION_START" in caplog.text


def test_an_unreachable_database_falls_back_quickly(unset_start, caplog):
    url = "postgresql://postgres@127.0.0.1:1/nowhere"  # nothing listens on port 1
    started = datetime.now(UTC)
    with caplog.at_level(logging.WARNING):
        start = partition_start(_settings(url))
    assert (datetime.now(UTC) - started).total_seconds() < 10
    assert start == datetime.now(UTC).date() - timedelta(days=FALLBACK_DAYS)
    assert "database not readable" in caplog.text


_FIRST_PARTITION = """
import dagster as dg
from memory_assets.definitions import defs
graph = defs().resolve_asset_graph()
print(graph.get(dg.AssetKey("archive_rows")).partitions_def.get_first_partition_key())
"""


def test_loaded_definitions_start_at_the_oldest_night(conn, db_url):
    _with_oldest(conn, OLDEST)
    env = {k: v for k, v in os.environ.items() if k != "MEMORY_ARCHIVE_PARTITION_START"}
    env |= {"DATABASE_URL": db_url, "MEMORY_ARCHIVE_TIMEZONE": "Asia/Tokyo", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_PARTITION],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "2025-11-15"
