"""The code location loads, validates and wires what the Slow Path promises (no data moved here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import psycopg
import pytest

from memory_assets.definitions import defs as load_defs
from memory_assets.defs.slow_path.partitions import SLOW_PATH
from memory_assets.resources import ArchivalCriteriaResource, DatabaseResource, ObjectStoreResource
from memory_lib.core.errors import InvalidInputError
from memory_lib.lifecycle import pause
from testing.constants import TEST_DIM
from testing.rows import one

ROOT = Path(__file__).resolve().parents[2]
SLOW_PATH_ASSETS = [
    "retention_scores",
    "archival_candidates",
    "memory_summaries",
    "archive_backups",
    "archive_rows",
    "stub_conversions",
]


@pytest.fixture(scope="module")
def defs() -> dg.Definitions:
    return load_defs()


def test_definitions_are_loadable(defs):
    dg.Definitions.validate_loadable(defs)


@pytest.mark.parametrize("with_home", [True, False])
def test_dagster_definitions_validate_cli_passes(tmp_path, with_home):
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    # Without DAGSTER_HOME the instance lives under the state dir (dagster.yaml): a temporary one here.
    env["MEMORY_ARCHIVE_STATE_DIR"] = str(tmp_path / "state")
    if with_home:  # as under `make`, which exports DAGSTER_HOME; CI may not
        env["DAGSTER_HOME"] = str(tmp_path)
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "All code locations passed validation" in proc.stdout + proc.stderr


def test_jobs_schedule_and_resources_are_wired(defs):
    for name in (
        "slow_path_job",
        "dry_run",
        "rollback",
        "clear_archival_pause",
        "pause_archival",
        "forget_user",
        "reembedding_start",
        "reembedding_flip",
        "reembedding_flip_back",
        "reembedding_drop_old",
    ):
        assert defs.resolve_job_def(name) is not None
    schedule = defs.resolve_schedule_def("slow_path")
    assert schedule.cron_schedule == f"0 {SLOW_PATH.schedule_hour} * * *"
    assert schedule.execution_timezone == SLOW_PATH.timezone
    assert schedule.job_name == "slow_path_job"
    assert set(defs.resources) >= {"database", "object_store", "summarizer", "embedder", "archival", "alerts"}
    for name in ("archival_pause_sensor", "archival_failure_alert"):  # on without a click: the pause is seen
        assert defs.resolve_sensor_def(name).default_status == dg.DefaultSensorStatus.RUNNING
    assert dg.AssetKey("archival_pause") in defs.resolve_asset_graph().get_all_asset_keys()
    job = defs.resolve_job_def("slow_path_job")
    keys = {k.path[-1] for k in job.asset_layer.selected_asset_keys}
    assert keys == set(SLOW_PATH_ASSETS)


def test_slow_path_assets_share_partitions_and_backfill_policy(defs):
    graph = defs.resolve_asset_graph()
    nodes = [graph.get(dg.AssetKey(name)) for name in SLOW_PATH_ASSETS]
    assert len({n.partitions_def for n in nodes}) == 1
    assert len({n.backfill_policy for n in nodes}) == 1
    partitions = nodes[0].partitions_def
    assert isinstance(partitions, dg.DailyPartitionsDefinition) and partitions.timezone == SLOW_PATH.timezone
    assert partitions.start.date() == SLOW_PATH.partition_start_date
    # The night's scores are in before its claim (policy `retention` claims on them).
    assert dg.AssetKey("retention_scores") in graph.get(dg.AssetKey("archival_candidates")).parent_keys
    summaries = defs.resolve_assets_def("memory_summaries")
    assert summaries.op.pool == SLOW_PATH.llm_pool


def test_gates_are_blocking_checks(defs):
    graph = defs.resolve_asset_graph()
    specs = {key.name: graph.get_check_spec(key) for key in graph.asset_check_keys}
    assert {name: spec.blocking for name, spec in specs.items()} == {
        "backups_round_trip": True,
        "error_rate_gate": True,
        "tiers_consistent": True,
        "archive_retrievable": True,
        # consolidation: a month that cites a missing or foreign memory stops its facts, key moments and year
        "monthly_digests_provenance": True,
        "monthly_digests_fresh": True,
        "yearly_digests_provenance": True,
        "memory_facts_provenance": True,
        "key_moments_provenance": True,
        # stubs: a stub whose backup cannot be found fails its night
        "stubs_backed_up": True,
        # re-embedding: full coverage of the second vectors (the flip job refuses on its own too)
        "reembedding_coverage": True,
    }
    assert (
        specs["backups_round_trip"].asset_key
        == specs["error_rate_gate"].asset_key
        == dg.AssetKey("archive_backups")
    )
    assert (
        specs["tiers_consistent"].asset_key
        == specs["archive_retrievable"].asset_key
        == dg.AssetKey("archive_rows")
    )


@pytest.mark.parametrize(
    "tick,night",
    [
        ("2026-03-15T02:00", "2026-03-14"),
        ("2026-03-01T02:00", "2026-02-28"),
        ("2027-01-01T02:00", "2026-12-31"),
    ],
)
def test_the_0200_tick_requests_the_previous_night(defs, tick, night):
    schedule = defs.resolve_schedule_def("slow_path")
    when = datetime.fromisoformat(tick).replace(tzinfo=ZoneInfo(SLOW_PATH.timezone))
    result = schedule.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=when))
    assert [r.partition_key for r in result.run_requests] == [night]


_PRINT_SCHEDULE = """
import datetime, zoneinfo, dagster as dg
from memory_assets.definitions import defs
d = defs()
s = d.resolve_schedule_def("slow_path")
tick = datetime.datetime(2026, 7, 10, 2, 0, tzinfo=zoneinfo.ZoneInfo("Europe/Lisbon"))
req = s.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=tick)).run_requests
p = d.resolve_assets_def("archive_rows").partitions_def
m = d.resolve_assets_def("monthly_digests").partitions_def
y = d.resolve_assets_def("yearly_digests").partitions_def
print(s.execution_timezone, s.cron_schedule, req[0].partition_key, p.get_first_partition_key())
print(m.get_first_partition_key(), y.get_first_partition_key())
"""


def test_zone_and_start_come_from_the_environment(tmp_path):
    env = dict(
        os.environ,
        MEMORY_ARCHIVE_TIMEZONE="Europe/Lisbon",
        MEMORY_ARCHIVE_PARTITION_START="2026-02-01",
        # Consolidation's months may start before the nights: at the month of this date.
        MEMORY_ARCHIVE_SLOW_PATH__CONSOLIDATION_START_DATE="2025-11-15",
    )
    out = subprocess.run(
        [sys.executable, "-c", _PRINT_SCHEDULE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [
        "Europe/Lisbon",
        "0",
        "2",
        "*",
        "*",
        "*",
        "2026-07-09",
        "2026-02-01",
        "2025-11-01",
        "2025",
    ]
    bad = subprocess.run(
        [sys.executable, "-c", _PRINT_SCHEDULE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(env, MEMORY_ARCHIVE_TIMEZONE="Mars/Olympus"),
        timeout=120,
    )
    assert bad.returncode != 0 and "Mars/Olympus" in bad.stderr and "timezone" in bad.stderr


@pytest.mark.parametrize(
    "resource,field",
    [
        (ArchivalCriteriaResource(max_error_rate=1.5), "archival.max_error_rate"),
        (ArchivalCriteriaResource(batch_size=501), "archival.batch_size"),
        (ArchivalCriteriaResource(min_age_days=400), "force_archive_age_days"),
        (
            ArchivalCriteriaResource(exempt_categories=["core", "semantic"], max_attempts=0),
            "archival.max_attempts",
        ),
    ],
)
def test_bad_criteria_are_refused_naming_the_field(resource, field):
    with pytest.raises(InvalidInputError, match=field.replace(".", r"\.")):
        resource.get_criteria()


def test_criteria_overrides_keep_the_other_defaults():
    criteria = ArchivalCriteriaResource(
        max_error_rate=0.1, exempt_categories=["core", "procedural"]
    ).get_criteria()
    assert criteria.max_error_rate == 0.1 and criteria.exempt_categories == ("core", "procedural")
    assert criteria.batch_size == 500 and criteria.min_age_days == 90


def test_s3_store_needs_a_bucket():
    with pytest.raises(InvalidInputError, match="object_store"):
        ObjectStoreResource(kind="s3").get_store()


def test_database_resource_starts_and_releases_an_embedded_server(tmp_path, monkeypatch):
    monkeypatch.delenv("DATABASE_URL", raising=False)
    resource = DatabaseResource(
        state_dir=str(tmp_path / "state"), embedded_database="memory_t", embedding_dim=32
    )
    with dg.build_resources({"database": resource}) as built, built.database.connect() as conn:
        assert one(conn.execute("SELECT current_database() AS d"))["d"] == "memory_t"
        assert not pause.pause_status(conn).paused  # migrations applied, 003 included
        url = built.database.url
    with pytest.raises(psycopg.OperationalError):  # its last holder left: the server stopped
        psycopg.connect(url, connect_timeout=3).close()


def test_pause_cli_sets_shows_and_clears(db_url):
    env = dict(os.environ, DATABASE_URL=db_url, MEMORY_ARCHIVE_EMBEDDING_DIM=str(TEST_DIM))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memory_lib.cli", "pause", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    out = cli("set", "--reason", "provider outage", "--operator", "ops")
    assert (
        out.returncode == 0 and "archival paused by cli:ops" in out.stdout and "provider outage" in out.stdout
    )
    assert "provider outage" in cli("status").stdout
    cleared = cli("clear", "--reason", "provider back", "--operator", "ops")
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["describe"] == "archival is running"
    refused = cli("clear", "--reason", " ", "--operator", "ops")
    assert refused.returncode == 2 and "reason" in refused.stderr


@pytest.mark.parametrize("name", ["dagster.yaml", "dagster.postgres.yaml"])
def test_instance_yaml_files_are_valid(name, tmp_path, monkeypatch):
    from dagster._core.instance.config import dagster_instance_config

    (tmp_path / "dagster.yaml").write_text((ROOT / name).read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_PG_URL", "postgresql+psycopg2://postgres@/dagster?host=/tmp")
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["concurrency"]["pools"]["default_limit"] == 1
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert {"key": "dagster/backfill", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
    assert ("postgres" in config.get("storage", {})) == ("postgres" in name)
    assert config["python_logs"]["managed_python_loggers"] == ["memory_lib"]


def test_slow_path_assets_carry_owners_tags_versions_freshness_and_the_store_kind(defs):
    graph = defs.resolve_asset_graph()
    for name in SLOW_PATH_ASSETS:
        spec = defs.resolve_assets_def(name).specs_by_key[dg.AssetKey(name)]
        assert spec.owners == ["team:memory-archive"] and spec.tags.get("domain") == "archival"
        assert spec.code_version
        assert ("s3" in spec.kinds) is False  # the default store is local
    freshness = graph.get(dg.AssetKey("archive_rows")).freshness_policy
    assert (
        isinstance(freshness, dg.FreshnessPolicy)
        # the time-window policy's field: dagster types FreshnessPolicy as the base class without it
        and freshness.fail_window.to_timedelta().total_seconds() == 26 * 3600  # type: ignore[attr-defined]
    )
    assert (
        "file"
        in defs.resolve_assets_def("archive_backups").specs_by_key[dg.AssetKey("archive_backups")].kinds
    )
    # One process per run: a step pays no interpreter start, import or resource setup of its own.
    assert defs.resolve_job_def("slow_path_job").executor_def.name == "in_process"


_PRINT_KINDS = """
from memory_assets.definitions import defs
import dagster as dg
print(",".join(sorted(defs().resolve_assets_def("archive_backups").specs_by_key[dg.AssetKey("archive_backups")].kinds)))
"""


def test_the_s3_kind_shows_only_when_the_store_is_s3():
    env = dict(os.environ, MEMORY_ARCHIVE_OBJECT_STORE="s3", MEMORY_ARCHIVE_BUCKET="archive")
    out = subprocess.run(
        [sys.executable, "-c", _PRINT_KINDS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "postgres,s3"


@pytest.mark.parametrize(
    "tick,month,year",
    [
        ("2026-03-01", "2026-02-01", "2026"),
        ("2027-01-01", "2026-12-01", "2026"),
        ("2026-08-01", "2026-07-01", "2026"),
    ],
)
def test_the_monthly_consolidation_schedules_request_the_month_that_ended_and_its_year(
    defs, tick, month, year
):
    tz = ZoneInfo(SLOW_PATH.timezone)
    monthly = defs.resolve_schedule_def("consolidation_monthly")
    assert monthly.job_name == "consolidation_job"
    assert monthly.cron_schedule == f"0 {min(SLOW_PATH.schedule_hour + 2, 23)} 1 * *"
    when = datetime.fromisoformat(f"{tick}T{min(SLOW_PATH.schedule_hour + 2, 23):02d}:00").replace(tzinfo=tz)
    got = monthly.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=when)).run_requests
    assert [r.partition_key for r in got] == [month]
    yearly = defs.resolve_schedule_def("yearly_digests_monthly")
    assert yearly.job_name == "yearly_digests_job" and yearly.execution_timezone == SLOW_PATH.timezone
    when = datetime.fromisoformat(f"{tick}T{min(SLOW_PATH.schedule_hour + 3, 23):02d}:00").replace(tzinfo=tz)
    context = dg.build_schedule_context(
        scheduled_execution_time=when, repository_def=defs.get_repository_def()
    )
    got = yearly.evaluate_tick(context).run_requests
    assert [r.partition_key for r in got] == [year]
