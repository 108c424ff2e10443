"""A backlog as a real Dagster backfill: memory_assets.backfill submits a job backfill of slow_path_job,
a real `dagster-daemon` subprocess runs it (backfill policy, run queue, pools) on the embedded
Postgres, with the instance stored in SQLite under tmp and in Postgres (dagster-postgres)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest
from dagster._core.execution.backfill import BulkActionStatus

from memory_assets.backfill import backfill_runs, running_daemon, submit_job_backfill, wait_for_backfill
from memory_assets.dev import prepare_dagster_home
from testing.constants import TEST_DIM
from testing.dagster_helpers import (
    last_night,
    load_history,
    metadata_value,
    offline_dagster_env,
    sqlalchemy_url,
)
from testing.rows import one

# SIGKILLs and daemons: minutes each; `pytest -m "not slow"` is the quick inner loop.
pytestmark = pytest.mark.slow

NIGHTS = [(last_night() - timedelta(days=2 - i)).isoformat() for i in range(3)]  # 2 nights a run: 2 runs
SLOW_PATH_ASSETS = ("archival_candidates", "memory_summaries", "archive_backups", "archive_rows")
CHECKS = (
    "archive_retrievable",
    "backups_round_trip",
    "error_rate_gate",
    "stubs_backed_up",
    "tiers_consistent",
)


def daemon_env(tmp_path: Path, db_url: str, dagster_pg_url: str | None = None) -> dict[str, str]:
    """The daemon's (and its code server's and runs') environment: this test's database, offline
    summarizer and embedder, partitions from a few days before NIGHTS, 2 nights per backfill run."""
    env = offline_dagster_env(tmp_path, db_url, TEST_DIM) | {
        "MEMORY_ARCHIVE_PARTITION_START": (last_night() - timedelta(days=10)).isoformat(),
        "MEMORY_ARCHIVE_SLOW_PATH__BACKFILL_NIGHTS_PER_RUN": "2",
    }
    if dagster_pg_url:
        env["DAGSTER_PG_URL"] = dagster_pg_url
    prepare_dagster_home(env)  # dagster.yaml, or dagster.postgres.yaml with DAGSTER_PG_URL
    return env


def run_backlog(conn, env: dict[str, str], tmp_path: Path) -> dg.DagsterInstance:
    load_history(conn, TEST_DIM)
    instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
    log = tmp_path / "daemon.log"
    finished: list[Any] = []
    with running_daemon(env, log) as daemon:
        submitted = submit_job_backfill(instance, "slow_path_job", NIGHTS, title="test backlog", env=env)
        assert submitted.runs_expected == 2
        try:
            backfill = wait_for_backfill(
                instance, submitted.backfill_id, timeout_s=300, on_run=finished.append, daemon=daemon
            )
        except (TimeoutError, RuntimeError) as e:
            raise AssertionError(f"{e}\n{log.read_text()[-3000:]}") from e
    assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, log.read_text()[-3000:]
    assert [b.backfill_id for b in instance.get_backfills()] == [submitted.backfill_id]

    # The backfill policy's chunks (2 nights a run), as runs of slow_path_job tagged with the backfill.
    records = backfill_runs(instance, submitted.backfill_id)
    runs = [r.dagster_run for r in records]
    assert [r.job_name for r in runs] == ["slow_path_job", "slow_path_job"]
    assert all(r.tags["dagster/backfill"] == submitted.backfill_id for r in runs)
    assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    assert sorted(
        (r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"])
        for r in runs
    ) == [(NIGHTS[0], NIGHTS[1]), (NIGHTS[2], NIGHTS[2])]
    # The queue let one run of the backfill go at a time (dagster.yaml's dagster/backfill limit).
    spans = sorted((r.start_time, r.end_time) for r in records)
    assert all(None not in s for s in spans) and spans[0][1] <= spans[1][0], spans
    assert {r.run_id for r in finished} == {r.run_id for r in runs}

    # One materialization per asset and night, with that night's numbers; a check result per night.
    for key in SLOW_PATH_ASSETS:
        assert instance.get_materialized_partitions(dg.AssetKey(key)) >= set(NIGHTS), key
    archived = {
        m.partition: metadata_value(m, "archived")
        for r in finished
        for m in r.materializations
        if m.asset_key == dg.AssetKey("archive_rows")
    }
    assert set(archived) == set(NIGHTS)
    in_db = one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"]
    assert in_db > 0 and sum(archived.values()) == in_db
    checks = {(c.check_name, c.partition): c.passed for r in finished for c in r.checks}
    assert checks == {(name, night): True for name in CHECKS for night in NIGHTS}
    return instance


def test_a_backlog_runs_as_a_daemon_backfill_on_a_sqlite_instance(conn, db_url, tmp_path):
    env = daemon_env(tmp_path, db_url)
    instance = run_backlog(conn, env, tmp_path)
    assert list((tmp_path / "dagster").glob("**/*.db"))  # the instance lives in SQLite files here
    # A night outside the partitions is named, and no backfill is stored.
    with pytest.raises(ValueError, match=r"partitions=\['2001-01-01'\]: not partitions of slow_path_job"):
        submit_job_backfill(instance, "slow_path_job", [NIGHTS[0], "2001-01-01"], env=env)
    assert len(instance.get_backfills()) == 1


def test_a_backlog_runs_as_a_daemon_backfill_on_a_postgres_instance(
    conn, db_url, tmp_path, monkeypatch, empty_database
):
    dagster_url = sqlalchemy_url(empty_database)  # the Dagster instance's storage
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_url)  # read by this process's instance too
    env = daemon_env(tmp_path, db_url, dagster_url)
    run_backlog(conn, env, tmp_path)
    assert not list((tmp_path / "dagster").glob("**/*.db"))  # nothing in SQLite
    with psycopg.connect(empty_database) as c:  # the backfill and its runs are in Postgres
        assert one(c.execute("SELECT count(*) FROM bulk_actions"))[0] == 1
        assert one(c.execute("SELECT count(*) FROM runs"))[0] == 2
