"""The first archival night: an explicit MEMORY_ARCHIVE_PARTITION_START wins; unset, today minus
FALLBACK_DAYS, logged. The definitions never read the database to choose it (they load without one);
`python -m memory_assets.dev` pins an unset start to the night of the oldest memory (hot or archived)
before Dagster starts, so the first night is the history's and does not move as archival goes on."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from memory_assets.defs.slow_path.partitions import FALLBACK_DAYS, partition_start
from memory_assets.dev import pin_partition_start
from memory_lib.archival import nights
from memory_lib.core.config import ArchivalCriteria, SlowPathConfig
from memory_lib.lifecycle import eligibility
from testing.constants import TEST_DIM
from testing.dagster_helpers import last_night, load_history
from testing.factories import archival_services

ROOT = Path(__file__).resolve().parents[2]
# 20:00 UTC on 14 November is already 15 November in Tokyo: the night is the local date. The history
# (testing.dagster_helpers) starts in 2026, so this one memory is the oldest.
OLDEST = datetime(2025, 11, 14, 20, 0, tzinfo=UTC)
CLOSED_PORT_URL = "postgresql://postgres@127.0.0.1:1/nowhere"  # nothing listens on port 1


def _with_oldest(conn, when: datetime) -> None:
    load_history(conn, TEST_DIM)
    conn.execute(
        "UPDATE memories SET created_at = %s WHERE id = (SELECT id FROM memories ORDER BY created_at, id LIMIT 1)",
        (when,),
    )


def _env(url: str, **extra: str) -> dict[str, str]:
    """A dev entry point's environment on `url`, without a start of its own."""
    env = {k: v for k, v in os.environ.items() if k != "MEMORY_ARCHIVE_PARTITION_START"}
    return env | {"DATABASE_URL": url, **extra}


def test_unset_start_is_pinned_to_the_oldest_memorys_night_in_the_zone(conn, db_url):
    _with_oldest(conn, OLDEST)
    utc = _env(db_url)
    assert pin_partition_start(utc) == "2025-11-14" == utc["MEMORY_ARCHIVE_PARTITION_START"]
    tokyo = _env(db_url, MEMORY_ARCHIVE_TIMEZONE="Asia/Tokyo")
    assert pin_partition_start(tokyo) == "2025-11-15"


def test_archived_memories_keep_the_pinned_start_where_it_was(conn, db_url, local_store):
    """Archiving the oldest memories must not move the first night (its partitions would vanish)."""
    load_history(conn, TEST_DIM)
    as_of = nights.night_as_of(last_night(), "UTC")
    victim = eligibility.select_eligible(conn, ArchivalCriteria(), as_of, 1)[0]["id"]
    conn.execute("UPDATE memories SET created_at = %s WHERE id = %s", (OLDEST, victim))
    first = pin_partition_start(_env(db_url))
    assert first == OLDEST.date().isoformat()
    services = archival_services(local_store)
    report = nights.run_night(conn, services, ArchivalCriteria(), last_night(), "UTC")
    assert report.ok and report.archived > 0
    assert conn.execute("SELECT count(*) AS n FROM memories WHERE id = %s", (victim,)).fetchone()["n"] == 0
    oldest_hot = conn.execute("SELECT min(created_at) AS t FROM memories").fetchone()["t"]
    assert oldest_hot.date().isoformat() > first  # the oldest one is archived now
    assert pin_partition_start(_env(db_url)) == first


def test_an_explicit_start_wins(conn, db_url):
    _with_oldest(conn, OLDEST)
    explicit = _env(db_url, MEMORY_ARCHIVE_PARTITION_START="2026-05-01")
    assert (
        pin_partition_start(explicit) is None and explicit["MEMORY_ARCHIVE_PARTITION_START"] == "2026-05-01"
    )
    assert partition_start(SlowPathConfig(partition_start_date=date(2026, 5, 1))) == date(2026, 5, 1)


def test_unset_falls_back_to_a_week_ago_and_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        start = partition_start(SlowPathConfig(timezone="Asia/Tokyo"), today=date(2026, 3, 10))
    assert start == date(2026, 3, 10) - timedelta(days=FALLBACK_DAYS)
    assert "MEMORY_ARCHIVE_PARTITION_START is unset" in caplog.text
    today = datetime.now(ZoneInfo("UTC")).date()
    assert partition_start(SlowPathConfig()) == today - timedelta(days=FALLBACK_DAYS)


def test_nothing_is_pinned_from_an_empty_or_unreachable_database(db_url, capsys):
    empty = _env(db_url)
    assert pin_partition_start(empty) is None and "MEMORY_ARCHIVE_PARTITION_START" not in empty
    started = time.monotonic()
    unreachable = _env(CLOSED_PORT_URL)
    assert pin_partition_start(unreachable) is None and "MEMORY_ARCHIVE_PARTITION_START" not in unreachable
    assert time.monotonic() - started < 10
    assert "database not readable" in capsys.readouterr().err


_LOAD = """
import time
started = time.monotonic()
import dagster as dg
from memory_assets.definitions import defs
loaded = defs()
dg.Definitions.validate_loadable(loaded)
graph = loaded.resolve_asset_graph()
print(graph.get(dg.AssetKey("archive_rows")).partitions_def.get_first_partition_key())
"""


@pytest.mark.parametrize("start", [None, "2025-11-15"])
def test_definitions_load_without_a_database(tmp_path, start):
    """DATABASE_URL at a closed port, no embedded server: the definitions load (nothing connects, no
    server starts), and the first night is the setting's or, unset, today minus FALLBACK_DAYS."""
    state = tmp_path / "state"
    env = _env(CLOSED_PORT_URL, MEMORY_ARCHIVE_STATE_DIR=str(state), PYTHONPATH=str(ROOT))
    env.pop("MEMORY_ARCHIVE_EMBEDDED_DB", None)
    if start is not None:
        env["MEMORY_ARCHIVE_PARTITION_START"] = start
    out = subprocess.run(
        [sys.executable, "-c", _LOAD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-2000:]
    today = datetime.now(UTC).date()
    expected = start or (today - timedelta(days=FALLBACK_DAYS)).isoformat()
    assert out.stdout.split()[-1] in {
        expected,
        (date.fromisoformat(expected) + timedelta(days=1)).isoformat(),
    }
    assert not state.exists()  # no embedded server was started or created
    assert "connect" not in out.stderr.lower()


def test_the_image_entry_point_pins_the_start_then_runs_the_code_server(conn, db_url):
    """The Dockerfile's CMD (memory_assets.code_server) pins an unset start as `make dev` does, then
    execs Dagster's code server on the definitions with the options it was given."""
    from memory_assets.code_server import command

    _with_oldest(conn, OLDEST)
    env = _env(db_url)
    argv = command(["-h", "0.0.0.0", "-p", "4000"], env)
    assert env["MEMORY_ARCHIVE_PARTITION_START"] == "2025-11-14"
    assert argv == [
        sys.executable,
        "-m",
        "dagster",
        "code-server",
        "start",
        "-h",
        "0.0.0.0",
        "-p",
        "4000",
        "-m",
        "memory_assets.definitions",
    ]
    out = subprocess.run(
        [sys.executable, "-m", "memory_assets.code_server", "--help"],
        cwd=ROOT,
        env=_env(CLOSED_PORT_URL, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--module-name" in out.stdout  # Dagster's own `code-server start` usage: the exec ran
