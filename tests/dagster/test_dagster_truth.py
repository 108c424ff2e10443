"""What the Dagster UI shows is true: per-night materializations and check results in a ranged run,
checks that only read, memory_lib's logs in the run's event log, and a cheap resource setup.
Real runs against the embedded Postgres, a local object store and the fake LLM server."""

from __future__ import annotations

import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest
import yaml  # type: ignore[import-untyped]  # a dependency of dagster

from memory_assets.defs.slow_path import assets, checks
from memory_assets.defs.slow_path.retention import retention_scores
from memory_assets.defs.slow_path.stubs import stub_conversions
from memory_assets.resources import DatabaseResource, ObjectStoreResource, SummarizerResource
from memory_lib.archival import nights
from memory_lib.lifecycle import pause as pause_switch
from memory_lib.storage.db import check_schema
from testing.backups import edit_content
from testing.constants import TEST_DIM
from testing.dagster_helpers import last_night, metadata_value, range_tags, table_fingerprint
from testing.rows import one
from testing.slow_path import SLOW_PATH_DEFS, resources

ROOT = Path(__file__).resolve().parents[2]
NIGHT = last_night()
GATE_CHECKS = [checks.backups_round_trip, checks.error_rate_gate]


@pytest.fixture
def store(tmp_path):
    return ObjectStoreResource(kind="local", local_root=str(tmp_path / "objects"), prefix="test")


def shipped_python_logs() -> dict:
    return yaml.safe_load((ROOT / "dagster.yaml").read_text())["python_logs"]


@pytest.fixture
def instance(tmp_path):
    """A persistent test instance with the python_logs section of the shipped dagster.yaml."""
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(
        temp_dir=str(tmp_path / "dagster"), overrides={"python_logs": shipped_python_logs()}
    ) as inst:
        yield inst


def db_state(conn) -> dict:
    """Every table a check could write, and the pause switch itself."""
    state = table_fingerprint(conn)
    state["archival_pause"] = conn.execute("SELECT * FROM archival_pause").fetchall()
    return state


def per_partition(instance, asset_key: dg.AssetKey, night: str) -> list[dict]:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[night]), limit=10
    ).records
    return [{k: v.value for k, v in r.asset_materialization.metadata.items()} for r in records]


# --------------------------------------------------------------------------- per-night truth


def test_a_ranged_run_records_each_nights_own_numbers(conn, db_url, history, store, instance):
    run = [NIGHT - timedelta(days=2 - i) for i in range(3)]
    result = dg.materialize(
        SLOW_PATH_DEFS,
        resources=resources(db_url, store, batch_size=40),
        instance=instance,
        tags=range_tags(run),
    )
    assert result.success
    archived_in_run = one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"]
    seen: dict[str, list[Any]] = {"claimed": [], "archived": []}
    for night in run:
        key = nights.batch_key_for(night)
        # What the night claimed: its remaining checkpoint rows plus those pruned after its audit (010).
        claimed = one(
            conn.execute(
                """SELECT (SELECT count(*) FROM archival_attempts WHERE batch_key = %(k)s)
                      + (SELECT archived_pruned FROM archival_batches WHERE batch_key = %(k)s) AS n""",
                {"k": key},
            )
        )["n"]
        archived = one(
            conn.execute(
                "SELECT count(*) AS n FROM archived_memories WHERE metadata->>'batch_key' = %s", (key,)
            )
        )["n"]
        [candidates] = per_partition(instance, dg.AssetKey("archival_candidates"), night.isoformat())
        [rows] = per_partition(instance, dg.AssetKey("archive_rows"), night.isoformat())
        [backups] = per_partition(instance, dg.AssetKey("archive_backups"), night.isoformat())
        assert candidates["claimed"] == claimed > 0
        assert rows["archived"] == rows["archived_total"] == archived
        assert backups["round_trip_checked"] == backups["attempted"] == claimed and backups["gate_passed"]
        seen["claimed"].append(claimed)
        seen["archived"].append(archived)
    # Each night its own figures: they add up to the run, none carries the run's total.
    assert sum(seen["archived"]) == archived_in_run and archived_in_run not in seen["archived"]
    assert len(set(seen["claimed"])) > 1
    # Table sizes, which cannot be read as of a night, only on the run's last night, named as after the run.
    last = per_partition(instance, dg.AssetKey("archive_rows"), run[-1].isoformat())[0]
    assert "after the run of" in last["hot_table_size_after_run"]
    assert (
        "hot_table_bytes_after_run"
        not in per_partition(instance, dg.AssetKey("archive_rows"), run[0].isoformat())[0]
    )

    # One check result per night, each with its partition, in the instance's check history too.
    evaluations = result.get_asset_check_evaluations()
    for name in ("backups_round_trip", "error_rate_gate", "tiers_consistent"):
        mine = [e for e in evaluations if e.check_name == name]
        assert sorted(str(e.partition) for e in mine) == [n.isoformat() for n in run] and all(
            e.passed for e in mine
        )
    history_rows = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(dg.AssetKey("archive_rows"), "tiers_consistent"), limit=10
    )
    assert sorted(r.partition for r in history_rows) == [n.isoformat() for n in run]
    tiers = {e.partition: e for e in evaluations if e.check_name == "tiers_consistent"}
    for night, archived in zip(run, seen["archived"], strict=True):
        assert metadata_value(tiers[night.isoformat()], "archived_by_this_night") == archived


def test_a_night_failing_after_commit_fails_the_run_and_the_nights_before_it_stay_recorded(
    conn, db_url, history, store, instance
):
    run = [NIGHT - timedelta(days=1), NIGHT]
    res = resources(db_url, store, batch_size=30)
    tags = range_tags(run)
    upto_gate = [assets.archival_candidates, assets.memory_summaries, assets.archive_backups, *GATE_CHECKS]
    assert dg.materialize(upto_gate, resources=res, instance=instance, tags=tags).success
    # The second night's backups vanish between its gate and its commit.
    for r in conn.execute(
        "SELECT DISTINCT backup_key FROM archival_attempts WHERE batch_key = %s",
        (nights.batch_key_for(run[1]),),
    ).fetchall():
        (Path(store.local_root) / r["backup_key"]).unlink()  # lone backups and packs

    result = dg.materialize(
        [assets.archive_rows], resources=res, instance=instance, tags=tags, raise_on_error=False
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_failure_data.error is not None
    assert nights.batch_key_for(run[1]) in failure.step_failure_data.error.message
    first = one(
        conn.execute(
            "SELECT count(*) AS n FROM archived_memories WHERE metadata->>'batch_key' = %s",
            (nights.batch_key_for(run[0]),),
        )
    )["n"]
    assert first == 30
    assert [
        m["archived"] for m in per_partition(instance, dg.AssetKey("archive_rows"), run[0].isoformat())
    ] == [30]
    assert per_partition(instance, dg.AssetKey("archive_rows"), run[1].isoformat()) == []
    pause = pause_switch.pause_status(conn)
    assert pause.paused and pause.batch_key == nights.batch_key_for(run[1])


def test_a_night_with_nothing_to_check_says_so(conn, db_url, store):
    # No memories at all: nothing is claimed, backed up or archived.
    result = dg.materialize(
        SLOW_PATH_DEFS,
        partition_key=NIGHT.isoformat(),
        resources=resources(db_url, store),
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    for e in result.get_asset_check_evaluations():
        assert e.partition == NIGHT.isoformat()
        assert e.description is not None
        assert metadata_value(e, "nothing_to_check") is True
        assert e.description.startswith(checks.NOTHING), (e.check_name, e.description)


_UNIT = re.compile(r"^(\d+ B|\d+\.\d (KiB|MiB|GiB|TiB)) \(([\d,]+) bytes\)")


def _tiers_at_end_of(conn, night) -> tuple[int, int]:
    """Hot and archived memories at the end of `night`, from the rows: an archive row counts from the
    night of the batch that made it (whenever that batch ran)."""
    as_of = nights.night_as_of(night, "UTC")
    row = conn.execute(
        """SELECT (SELECT count(*) FROM archived_memories a JOIN archival_batches b
                   ON b.batch_key = a.metadata->>'batch_key' WHERE b.as_of <= %(t)s) AS archived,
                  (SELECT count(*) FROM memories WHERE created_at <= %(t)s)
                  + (SELECT count(*) FROM archived_memories WHERE original_created_at <= %(t)s) AS every""",
        {"t": as_of},
    ).fetchone()
    return row["every"] - row["archived"], row["archived"]


def test_a_backlog_in_two_runs_shows_each_nights_own_tiers_steps_and_sizes(
    conn, db_url, history, store, instance
):
    """As the backfill policy splits a backlog: two runs of two nights each, every Slow Path asset.
    Each night's page then says what its names say, for that night."""
    backlog = [NIGHT - timedelta(days=3 - i) for i in range(4)]
    every_asset = [retention_scores, *SLOW_PATH_DEFS, stub_conversions]
    for run in (backlog[:2], backlog[2:]):
        result = dg.materialize(
            every_asset,
            resources=resources(db_url, store, batch_size=40),
            instance=instance,
            tags=range_tags(run),
        )
        assert result.success
    archived_before = 0
    for night in backlog:
        key = night.isoformat()
        [scores] = per_partition(instance, dg.AssetKey("retention_scores"), key)
        [summaries] = per_partition(instance, dg.AssetKey("memory_summaries"), key)
        [backups] = per_partition(instance, dg.AssetKey("archive_backups"), key)
        [rows] = per_partition(instance, dg.AssetKey("archive_rows"), key)
        [stubbed] = per_partition(instance, dg.AssetKey("stub_conversions"), key)

        # Tiers at the end of the night, its archival included: archive_rows and stub_conversions say the
        # same, the rows agree, and the night adds exactly what it archived. retention_scores, which runs
        # before any night of its run is archived, records no tiers and says whose scores it has.
        hot, archived = _tiers_at_end_of(conn, night)
        assert (rows["hot_memories"], rows["archived_memories"]) == (hot, archived)
        assert (stubbed["hot_memories"], stubbed["archived_memories"], stubbed["stub_memories"]) == (
            hot,
            archived,
            0,
        )
        assert rows["archived"] > 0 and archived == archived_before + rows["archived"]
        archived_before = archived
        assert not {"hot_memories", "archived_memories", "stub_memories"} & set(scores)
        assert scores["scores_of"].startswith("the memories hot when this run scored them")
        assert ("archive" in scores["scores_of"]) == (night not in (backlog[0], backlog[2]))

        # memory_summaries: each step's own counts, never their sum.
        assert "processed" not in summaries
        assert summaries["summarize_processed"] == summaries["summarized"] + summaries["summarize_failed"]
        assert (
            summaries["summarized"]
            == summaries["embed_processed"]
            == summaries["embedded"]
            == rows["archived"]
        )
        assert backups["processed"] == backups["objects_written"] == rows["archived"]

        # Every size: an int with its unit in its name, and the same size as text with a unit.
        sizes = {k: v for page in (backups, rows) for k, v in page.items() if "bytes" in k}
        assert {"bytes_written", "backup_bytes_total"} <= set(sizes)
        for k, n in sizes.items():
            text = {**backups, **rows}[k.replace("bytes", "size")]
            match = _UNIT.match(text)
            assert match and int(match.group(3).replace(",", "")) == n > 0, (k, text)
    last = per_partition(instance, dg.AssetKey("archive_rows"), backlog[-1].isoformat())[0]
    assert "not as of this night" in last["hot_table_size_after_run"]


# --------------------------------------------------------------------------- checks only read


def run_checks_only(res):
    """The gate checks alone, as `Execute` on a check in the UI: archive_backups does not run."""
    job = dg.define_asset_job("gate_checks", selection=dg.AssetSelection.checks(*GATE_CHECKS))
    defs = dg.Definitions(
        assets=[assets.archive_backups], asset_checks=GATE_CHECKS, jobs=[job], resources=res
    )
    return defs.resolve_job_def("gate_checks").execute_in_process(
        # The partition as a tag (what the UI launches): a job of checks alone has no partitions of its
        # own for execute_in_process(partition_key=...) to validate against.
        tags={"dagster/partition": NIGHT.isoformat()},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def test_a_failed_gate_is_written_by_the_asset_and_its_checks_only_read(
    conn, db_url, history, store, fake_llm, llm_keys
):
    fake_llm.fail_fraction, fake_llm.fail_status = 0.1, 400
    llm = SummarizerResource(
        provider="anthropic", base_url=fake_llm.base_url, requests_per_second=1000.0, max_retries=0
    )
    res = resources(db_url, store, summarizer=llm)
    result = dg.materialize(
        SLOW_PATH_DEFS,
        partition_key=NIGHT.isoformat(),
        resources=res,
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    key = nights.batch_key_for(NIGHT)
    pause = pause_switch.pause_status(conn)
    # The pause says who, why and when; archive_backups set it, deciding the gate before the checks.
    assert pause.reason is not None
    assert pause.paused and pause.batch_key == key and pause.actor == nights.ACTOR
    assert key in pause.reason and "above max_error_rate" in pause.reason and pause.changed_at is not None
    [materialized] = [
        e
        for e in result.get_asset_materialization_events()
        if e.asset_key is not None and e.asset_key.path[-1] == "archive_backups"
    ]
    assert metadata_value(materialized.materialization, "gate_passed") is False

    before = db_state(conn)
    for _ in range(2):  # as if re-run twice from the UI
        again = run_checks_only(res)
        assert not again.success
        assert not again.get_asset_materialization_events()  # the asset did not run
        gate = next(e for e in again.get_asset_check_evaluations() if e.check_name == "error_rate_gate")
        assert (gate.passed, gate.severity, gate.partition) == (
            False,
            dg.AssetCheckSeverity.ERROR,
            NIGHT.isoformat(),
        )
        assert metadata_value(gate, "paused_by") == nights.ACTOR
        assert db_state(conn) == before


def test_a_check_re_run_on_a_tampered_night_changes_nothing(conn, db_url, history, store):
    res = resources(db_url, store)
    upto_backups = [assets.archival_candidates, assets.memory_summaries, assets.archive_backups]
    assert dg.materialize(upto_backups, partition_key=NIGHT.isoformat(), resources=res).success
    victim = conn.execute(
        "SELECT memory_id, backup_ref FROM archival_attempts WHERE status = 'backed_up' ORDER BY memory_id LIMIT 1"
    ).fetchone()
    edit_content(store.get_store(), victim["backup_ref"])  # one member of its pack, the others intact

    # The checks alone see the tampered object and fail, writing nothing: no reset, no pause.
    before = db_state(conn)
    first = run_checks_only(res)
    trip = next(e for e in first.get_asset_check_evaluations() if e.check_name == "backups_round_trip")
    assert not trip.passed and metadata_value(trip, "failed") == 1
    assert db_state(conn) == before and not pause_switch.pause_status(conn).paused

    # The asset decides the gate: it sends the memory back and pauses; the checks report it, twice alike.
    assert not dg.materialize(
        SLOW_PATH_DEFS, partition_key=NIGHT.isoformat(), resources=res, raise_on_error=False
    ).success
    row = conn.execute(
        "SELECT status, failed_step FROM archival_attempts WHERE memory_id = %s", (victim["memory_id"],)
    ).fetchone()
    assert (row["status"], row["failed_step"]) == ("embedded", "fidelity")
    assert pause_switch.pause_status(conn).paused
    assert one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"] == 0
    before = db_state(conn)
    for _ in range(2):
        again = run_checks_only(res)
        trip = next(e for e in again.get_asset_check_evaluations() if e.check_name == "backups_round_trip")
        assert not trip.passed and "sent back after a failed round trip" in metadata_value(trip, "failures")
        assert db_state(conn) == before


# --------------------------------------------------------------------------- logs and setup


def test_memory_lib_warnings_reach_the_runs_event_log(conn, db_url, history, store, instance):
    pause_switch.set_pause(conn, reason="bucket audit", actor="ops@example")
    result = dg.materialize(
        SLOW_PATH_DEFS, partition_key=NIGHT.isoformat(), resources=resources(db_url, store), instance=instance
    )
    assert result.success
    records = [e for e in instance.all_logs(result.run_id) if e.dagster_event is None]
    skipped = [e for e in records if f"{nights.batch_key_for(NIGHT)} claim skipped" in e.user_message]
    assert skipped and skipped[0].level == logging.WARNING
    assert "bucket audit" in skipped[0].user_message


def test_database_setup_migrates_only_a_database_that_needs_it(databases):
    url = databases.new_empty("t_setup")
    try:
        with dg.build_resources(
            {"database": DatabaseResource(database_url=url, embedding_dim=TEST_DIM)}
        ) as r:
            assert check_schema(r.database.url) == TEST_DIM  # an empty database was migrated
        with psycopg.connect(url) as c:
            applied = one(c.execute("SELECT max(applied_at) FROM schema_migrations"))[0]
        with (
            dg.build_resources({"database": DatabaseResource(database_url=url)}) as r,
            r.database.connect() as c,
        ):
            assert one(c.execute("SELECT max(applied_at) AS t FROM schema_migrations"))["t"] == applied
    finally:
        databases.drop(url)
