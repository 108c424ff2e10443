"""The Slow Path through Dagster: real materializations against the embedded Postgres, SeaweedFS and
the fake LLM server through the real SDK. Resources point at each test's own database (db_url)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from memory_assets.definitions import defs as load_defs
from memory_assets.defs.rollback.jobs import rollback
from memory_assets.defs.slow_path import assets, checks
from memory_assets.defs.slow_path.jobs import clear_archival_pause
from memory_assets.defs.slow_path.partitions import SLOW_PATH
from memory_assets.resources import (
    DatabaseResource,
    ObjectStoreResource,
    SummarizerResource,
)
from memory_lib.archival import archive, integrity, nights
from memory_lib.core.models import BackupObject
from memory_lib.lifecycle import pause as pause_switch
from memory_lib.lifecycle import restore
from testing.backups import ARCHIVE_REFS_SQL, ARCHIVE_ROWS_SQL, members_sharing
from testing.constants import TEST_DIM
from testing.dagster_helpers import metadata_value, range_tags, table_fingerprint
from testing.rows import one
from testing.slow_path import (
    NIGHT,
    SLOW_PATH_DEFS,
    checks_of,
    count,
    materialize,
    materialized,
    resources,
)

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- a night on SeaweedFS


def test_partition_archives_and_rows_objects_and_events_agree(conn, db_url, history, s3_store_resource):
    res = resources(db_url, s3_store_resource)
    result = materialize(res)
    assert result.success
    assert checks_of(result) == {
        "backups_round_trip": (True, "ERROR"),
        "error_rate_gate": (True, "ERROR"),
        "tiers_consistent": (True, "ERROR"),
    }
    meta = materialized(result)
    archived = conn.execute(ARCHIVE_ROWS_SQL).fetchall()
    assert meta["archive_rows"]["archived"] == len(archived) == meta["archival_candidates"]["claimed"] > 0
    assert meta["archive_backups"]["bytes_written"] == sum(r["backup_size_bytes"] for r in archived)
    store = s3_store_resource.get_store()
    keys = set(integrity.backup_keys(store))  # lone backups and packs (memory_lib.storage.packs)
    assert keys == {store.key_from_ref(r["storage_ref"]) for r in archived}
    for row in archived:
        key = store.key_from_ref(row["storage_ref"])
        doc = BackupObject.from_json_bytes(store.read_ref(row["storage_ref"], row["backup_sha256"]))
        assert (doc.original_id, doc.user_id, doc.archive_reason) == (
            row["original_id"],
            row["user_id"],
            row["archive_reason"],
        )
        assert key in keys
    assert (
        count(
            conn,
            "SELECT count(*) AS n FROM memories WHERE id = ANY(%s)",
            [r["original_id"] for r in archived],
        )
        == 0
    )
    events = conn.execute(
        "SELECT memory_id, details FROM memory_events WHERE event_type = 'archived'"
    ).fetchall()
    assert sorted(e["memory_id"] for e in events) == sorted(r["original_id"] for r in archived)
    by_id = {r["original_id"]: r for r in archived}
    assert all(e["details"]["sha256"] == by_id[e["memory_id"]]["backup_sha256"] for e in events)

    # The same partition again: no new work.
    again = materialize(res)
    assert again.success
    meta2 = materialized(again)
    assert meta2["archival_candidates"]["newly_claimed"] is False
    assert meta2["memory_summaries"]["summarized"] == 0 and meta2["archive_backups"]["objects_written"] == 0
    assert meta2["archive_rows"]["archived"] == 0
    assert count(conn, "SELECT count(*) AS n FROM archived_memories") == len(archived)


def test_candidates_metadata_counts_every_reason_and_expired_memories(conn, db_url, local_store_resource):
    """A memory whose TTL ran out during the night is claimed as ttl_expired, and the asset shows it."""
    from memory_lib.client import MemoryClient
    from memory_lib.lifecycle.eligibility import REASONS
    from memory_lib.llm.embedding import HashingEmbedder

    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), actor="test")
    end = nights.night_as_of(NIGHT, SLOW_PATH.timezone)
    expired = client.add(
        "u1", "Visitor badge 12 is valid this week", ttl_days=2, now=end - timedelta(days=2, hours=1)
    )
    client.add("u1", "Visitor badge policy lives on the wiki", ttl_days=2, now=end - timedelta(hours=1))
    result = materialize(resources(db_url, local_store_resource))
    assert result.success
    meta = materialized(result)["archival_candidates"]
    assert {k for k in meta if k.startswith("claimed_")} == {f"claimed_{r}" for r in REASONS}
    assert meta["claimed_ttl_expired"] == meta["claimed"] == 1 and meta["eligible_after_ttl_expired"] == 0
    row = conn.execute("SELECT original_id, archive_reason FROM archived_memories").fetchone()
    assert (row["original_id"], row["archive_reason"]) == (expired.memory_id, "ttl_expired")


def test_two_nights_are_disjoint_and_capped(conn, db_url, history, local_store_resource):
    res = resources(db_url, local_store_resource, batch_size=25)
    for night in (NIGHT - timedelta(days=1), NIGHT):
        result = materialize(res, night)
        assert result.success and materialized(result)["archival_candidates"]["claimed"] == 25
    # Each night archived its own 25 (their checkpoint rows pruned after the audit, counted on the batch).
    by_night = conn.execute(
        "SELECT metadata->>'batch_key' AS b, count(DISTINCT original_id) AS n FROM archived_memories GROUP BY 1"
    ).fetchall()
    keys = [nights.batch_key_for(n) for n in (NIGHT - timedelta(days=1), NIGHT)]
    assert {r["b"]: r["n"] for r in by_night} == dict.fromkeys(keys, 25)
    assert [archive.batch_status(conn, k).archived for k in keys] == [25, 25]
    assert count(conn, "SELECT count(*) AS n FROM archived_memories") == 50


def test_a_backfill_run_goes_through_its_nights_in_date_order_within_the_cap(
    conn, db_url, history, local_store_resource
):
    run_nights = [NIGHT - timedelta(days=9 - i) for i in range(10)]
    result = dg.materialize(
        SLOW_PATH_DEFS,
        resources=resources(db_url, local_store_resource, batch_size=15),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
        tags=range_tags(run_nights),
    )
    assert result.success
    assert {e.partition for e in result.get_asset_materialization_events()} == {
        n.isoformat() for n in run_nights
    }
    batches = conn.execute(
        "SELECT batch_key, claimed_count FROM archival_batches ORDER BY created_at"
    ).fetchall()
    assert [b["batch_key"] for b in batches] == [nights.batch_key_for(n) for n in run_nights]
    assert all(b["claimed_count"] <= 15 for b in batches) and sum(b["claimed_count"] for b in batches) > 15
    assert (
        sum(archive.batch_status(conn, b["batch_key"]).archived for b in batches)
        == count(conn, "SELECT count(*) AS n FROM archived_memories")
        == sum(b["claimed_count"] for b in batches)
    )


# --------------------------------------------------------------------------- the error-rate gate


def test_failing_summaries_trip_the_gate_and_pause_the_next_night(
    conn, db_url, history, local_store_resource, fake_llm, llm_keys
):
    fake_llm.fail_fraction, fake_llm.fail_status = 0.1, 400
    llm = SummarizerResource(
        provider="anthropic", base_url=fake_llm.base_url, requests_per_second=1000.0, max_retries=0
    )
    res = resources(db_url, local_store_resource, summarizer=llm)
    hot_before = count(conn, "SELECT count(*) AS n FROM memories")
    result = materialize(res)

    assert not result.success
    assert checks_of(result)["error_rate_gate"] == (False, "ERROR")
    assert "archive_rows" not in materialized(result)
    assert fake_llm.count("/v1/messages") > 0  # the real SDK talked to the fake server
    status = archive.batch_status(conn, nights.batch_key_for(NIGHT))
    assert status.error_rate > 0.05 and status.failed_by_step == {"summarize": status.failed}
    assert count(conn, "SELECT count(*) AS n FROM memories") == hot_before
    assert count(conn, "SELECT count(*) AS n FROM archived_memories") == 0
    assert count(conn, "SELECT count(*) AS n FROM memory_events WHERE event_type = 'archived'") == 0
    pause = pause_switch.pause_status(conn)
    assert pause.paused and pause.batch_key == nights.batch_key_for(NIGHT)

    # The next scheduled run: the 02:00 tick asks for the night that just ended, which does nothing.
    schedule = load_defs().resolve_schedule_def("slow_path")
    tick = datetime.combine(NIGHT + timedelta(days=2), datetime.min.time(), ZoneInfo(SLOW_PATH.timezone))
    requests = schedule.evaluate_tick(
        dg.build_schedule_context(scheduled_execution_time=tick.replace(hour=2))
    )
    assert requests.run_requests is not None
    assert requests.run_requests[0].partition_key is not None
    next_night = datetime.fromisoformat(requests.run_requests[0].partition_key).date()
    assert next_night == NIGHT + timedelta(days=1)
    fake_llm.reset()
    paused_run = materialize(res, next_night)
    assert paused_run.success
    assert "archival paused" in materialized(paused_run)["archival_candidates"]["paused_because"]
    assert checks_of(paused_run)["error_rate_gate"] == (False, "WARN")
    assert fake_llm.count() == 0
    assert (
        count(
            conn,
            "SELECT count(*) AS n FROM archival_attempts WHERE batch_key = %s",
            nights.batch_key_for(next_night),
        )
        == 0
    )
    assert [s["step"] for s in pause_switch.skipped_nights(conn, nights.batch_key_for(next_night))] == [
        "claim",
        "summarize",
        "backup",
        "commit",
    ]
    assert count(conn, "SELECT count(*) AS n FROM memories") == hot_before

    # The operator clears the pause from the UI job; the night re-runs (retrying the failures).
    cleared = clear_archival_pause.execute_in_process(
        run_config={"ops": {"clear_pause": {"config": {"reason": "LLM fixed", "operator": "ops@example"}}}},
        resources={"database": DatabaseResource(database_url=db_url)},
    )
    assert cleared.success and not pause_switch.pause_status(conn).paused
    retried = materialize(res)
    assert retried.success and checks_of(retried)["error_rate_gate"] == (True, "ERROR")
    assert count(conn, "SELECT count(*) AS n FROM archived_memories") == status.attempted


def test_an_empty_summary_fails_its_memory_not_the_run(
    conn, db_url, history, local_store_resource, fake_llm, llm_keys
):
    fake_llm.empty_summary_fraction = 0.05
    llm = SummarizerResource(provider="openai", base_url=fake_llm.openai_base_url, requests_per_second=1000.0)
    res = resources(db_url, local_store_resource, summarizer=llm, max_error_rate=0.2)  # a per-run override
    result = materialize(res)
    assert result.success
    status = archive.batch_status(conn, nights.batch_key_for(NIGHT))
    errors = conn.execute("SELECT memory_id, error FROM archival_attempts WHERE error IS NOT NULL").fetchall()
    assert 0 < len(errors) == status.failed and all("empty summary" in e["error"] for e in errors)
    assert materialized(result)["archive_rows"]["archived"] == status.attempted - status.failed
    assert count(
        conn, "SELECT count(*) AS n FROM memories WHERE id = ANY(%s)", [e["memory_id"] for e in errors]
    ) == len(errors)


def test_a_bad_criteria_override_fails_with_the_field_named(db_url, history, local_store_resource):
    result = materialize(resources(db_url, local_store_resource, max_error_rate=1.5))
    assert not result.success
    messages = " ".join(str(e.event_specific_data) for e in result.all_events if e.is_failure)
    assert "archival.max_error_rate" in messages and "1.5" in messages


# --------------------------------------------------------------------------- fidelity


def test_a_tampered_backup_fails_the_round_trip_and_blocks_deletion(
    conn, db_url, history, s3_store_resource, seaweed
):
    res = resources(db_url, s3_store_resource)
    upto_backups = [assets.archival_candidates, assets.memory_summaries, assets.archive_backups]
    assert materialize(res, defs=upto_backups).success
    victim = conn.execute(
        "SELECT memory_id, backup_key FROM archival_attempts WHERE status = 'backed_up' ORDER BY memory_id LIMIT 1"
    ).fetchone()
    before = integrity.exact_rows(conn, [victim["memory_id"]])
    store = s3_store_resource.get_store()
    evil = store.get(victim["backup_key"]).replace(b'"content":"', b'"content":"(edited) ', 1)
    seaweed.client().put_object(Bucket=store.bucket, Key=victim["backup_key"], Body=evil)
    hot_before = count(conn, "SELECT count(*) AS n FROM memories")

    result = materialize(res)
    assert not result.success
    assert checks_of(result)["backups_round_trip"] == (False, "ERROR")
    assert "archive_rows" not in materialized(result)
    assert count(conn, "SELECT count(*) AS n FROM memories") == hot_before
    assert count(conn, "SELECT count(*) AS n FROM archived_memories") == 0
    assert pause_switch.pause_status(conn).paused
    row = conn.execute(
        "SELECT status, failed_step FROM archival_attempts WHERE memory_id = %s", (victim["memory_id"],)
    ).fetchone()
    assert (row["status"], row["failed_step"]) == ("embedded", "fidelity")

    # Cleared and re-run: the backup is rewritten, round-trips, and the memory archives and restores exactly.
    pause_switch.clear_pause(conn, reason="bucket audited", actor="ops")
    assert materialize(res).success
    assert count(conn, "SELECT count(*) AS n FROM memories") == hot_before - count(
        conn, "SELECT count(*) AS n FROM archived_memories"
    )
    restore.restore_archive(
        conn,
        store,
        user_id=before[victim["memory_id"]]["user_id"],
        original_id=victim["memory_id"],
        actor="test",
    )
    assert integrity.exact_rows(conn, [victim["memory_id"]]) == before


# --------------------------------------------------------------------------- a run killed mid-backup

_KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import dagster as dg
    from memory_assets.defs.slow_path import assets
    from memory_assets.resources import (ArchivalCriteriaResource, DatabaseResource, EmbedderResource,
                                         ObjectStoreResource, SummarizerResource)
    from memory_lib.storage.objectstore import LocalObjectStore

    db_url, root, night, dim, kill_after = sys.argv[1:6]

    class DiesMidBackup(LocalObjectStore):
        puts = 0
        def put(self, key, data, sha256):
            stored = super().put(key, data, sha256)  # the object exists; its checkpoint does not yet
            DiesMidBackup.puts += 1
            if DiesMidBackup.puts >= int(kill_after):
                os.kill(os.getpid(), signal.SIGKILL)
            return stored

    class Store(ObjectStoreResource):
        def get_store(self):
            return DiesMidBackup(Path(self.local_root), self.prefix)

    dg.materialize(
        [assets.archival_candidates, assets.memory_summaries, assets.archive_backups, assets.archive_rows],
        partition_key=night,
        resources={"database": DatabaseResource(database_url=db_url),
                   "object_store": Store(kind="local", local_root=root, prefix="test"),
                   "summarizer": SummarizerResource(provider="extractive"),
                   "embedder": EmbedderResource(provider="hashing", dim=int(dim)),
                   "archival": ArchivalCriteriaResource()},
        instance=dg.DagsterInstance.ephemeral(),
    )
    """
)


@pytest.mark.slow
def test_a_run_killed_between_backups_and_archive_rows_resumes_exactly_once(conn, db_url, history, tmp_path):
    root = tmp_path / "objects"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, db_url, str(root), NIGHT.isoformat(), str(TEST_DIM), "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    store_res = ObjectStoreResource(kind="local", local_root=str(root), prefix="test")
    store = store_res.get_store()
    claimed = [r["memory_id"] for r in conn.execute("SELECT memory_id FROM archival_attempts").fetchall()]
    statuses = [r["status"] for r in conn.execute("SELECT status FROM archival_attempts").fetchall()]
    assert "archived" not in statuses and statuses.count("backed_up") < len(claimed)  # killed mid-backup
    assert integrity.orphaned_backups(conn, store)  # the object whose checkpoint the kill prevented

    result = materialize(resources(db_url, store_res))
    assert result.success
    archived = count(conn, "SELECT count(*) AS n FROM archived_memories")
    # Its checkpoint rows were pruned after the audit passed; the night still counts them.
    assert archived == len(claimed) == archive.batch_status(conn, nights.batch_key_for(NIGHT)).archived
    assert count(conn, "SELECT count(*) AS n FROM archival_attempts WHERE status = 'archived'") == 0
    assert count(conn, "SELECT count(*) AS n FROM memories WHERE id = ANY(%s)", claimed) == 0
    assert (
        count(
            conn,
            "SELECT count(*) AS n FROM (SELECT memory_id FROM memory_events WHERE event_type = 'archived' "
            "GROUP BY 1 HAVING count(*) = 1) x",
        )
        == archived
    )
    assert integrity.orphaned_backups(conn, store) == []
    rows = conn.execute(ARCHIVE_REFS_SQL).fetchall()
    assert set(integrity.backup_keys(store)) == {store.key_from_ref(r["storage_ref"]) for r in rows}


# --------------------------------------------------------------------------- dry run and rollback


def test_dry_run_job_writes_nothing_and_shows_the_review(conn, db_url, history, local_store_resource):
    before = table_fingerprint(conn)
    job = load_defs().resolve_job_def("dry_run")
    result = job.execute_in_process(
        run_config={"ops": {"archival_dry_run": {"config": {"as_of": "2026-06-01T00:00:00+00:00"}}}},
        resources=resources(db_url, local_store_resource),
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    assert table_fingerprint(conn) == before
    meta = materialized(result)["archival_dry_run"]
    assert (
        meta["sampled"]
        == SLOW_PATH.dry_run_sample_size
        == meta["round_trip_faithful"]
        == meta["round_trip_deleted"]
    )
    assert meta["review"].count("\n| ") == SLOW_PATH.dry_run_sample_size  # one table row per sampled memory
    assert meta["eligible"] == sum(v for k, v in meta.items() if k.startswith("eligible_"))
    assert meta["projected_nights"] >= 1 and meta["projected_backup_bytes"] > 0
    assert list(local_store_resource.get_store().list("")) == []


def output_metadata(result, node: str) -> dict:
    for event in result.all_events:
        if event.event_type == dg.DagsterEventType.STEP_OUTPUT and event.step_key == node:
            return {k: v.value for k, v in event.event_specific_data.metadata.items()}
    raise AssertionError(f"no output of {node}")


def test_rollback_job_restores_byte_exact_and_is_idempotent(conn, db_url, history, local_store_resource):
    res = resources(db_url, local_store_resource)
    before = integrity.exact_rows(conn, history)
    assert materialize(res).success
    ids = [r["original_id"] for r in conn.execute("SELECT original_id FROM archived_memories").fetchall()]
    assert ids
    rollback_resources = {"database": res["database"], "object_store": local_store_resource}
    run = rollback.execute_in_process(
        run_config={"ops": {"restore_archives": {"config": {"all": True, "operator": "test"}}}},
        resources=rollback_resources,
    )
    assert run.success
    meta = output_metadata(run, "restore_archives")
    assert (meta["restored"], meta["failed"], meta["archival_paused"]) == (len(ids), 0, True)
    assert count(conn, "SELECT count(*) AS n FROM archived_memories") == 0
    assert integrity.exact_rows(conn, ids) == {i: before[i] for i in ids}
    assert pause_switch.pause_status(conn).paused  # restoring all pauses archival until an operator clears it
    events = count(conn, "SELECT count(*) AS n FROM memory_events WHERE event_type = 'restored'")
    assert events == len(ids)

    again = rollback.execute_in_process(
        run_config={"ops": {"restore_archives": {"config": {"original_ids": [str(i) for i in ids[:3]]}}}},
        resources=rollback_resources,
    )
    assert again.success
    meta = output_metadata(again, "restore_archives")
    assert (meta["restored"], meta["already_hot"], meta["archival_paused"]) == (0, 3, False)
    assert count(conn, "SELECT count(*) AS n FROM memory_events WHERE event_type = 'restored'") == events


def test_rollback_needs_a_selection(db_url, local_store_resource):
    run = rollback.execute_in_process(
        resources={"database": DatabaseResource(database_url=db_url), "object_store": local_store_resource},
        raise_on_error=False,
    )
    assert not run.success
    assert "choose all=true, a user_id, or a list of original_ids" in " ".join(
        str(e.event_specific_data) for e in run.all_events if e.is_failure
    )


# --------------------------------------------------------------------------- success means archived


def test_archive_rows_fails_its_night_when_the_store_dies_before_commit(conn, db_url, history, tmp_path):
    store = ObjectStoreResource(kind="local", local_root=str(tmp_path / "objects"), prefix="test")
    res = resources(db_url, store)
    before = [
        assets.archival_candidates,
        assets.memory_summaries,
        assets.archive_backups,
        checks.backups_round_trip,
        checks.error_rate_gate,
    ]
    first = materialize(res, defs=before)
    assert first.success and all(passed for passed, _ in checks_of(first).values())
    import shutil

    shutil.rmtree(tmp_path / "objects")  # the object store is gone between the gate and the commit
    second = materialize(res, defs=[assets.archive_rows])
    assert not second.success
    failure = next(e for e in second.all_events if e.event_type_value == "STEP_FAILURE")
    assert "failed the gate after commit" in failure.step_failure_data.error.message
    key = nights.batch_key_for(NIGHT)
    assert (
        count(conn, "SELECT count(*) AS n FROM archived_memories WHERE metadata->>'batch_key' = %s", key) == 0
    )
    assert pause_switch.pause_status(conn).paused


def test_tiers_consistent_fails_when_a_committed_backup_disappears(conn, db_url, history, tmp_path):
    assert integrity.AUDIT_SAMPLE >= 1000  # every backup of a night up to 1,000 is checked
    store = ObjectStoreResource(kind="local", local_root=str(tmp_path / "objects"), prefix="test")
    res = resources(db_url, store)
    first = materialize(res)
    assert first.success
    recorded = next(e for e in first.get_asset_check_evaluations() if e.check_name == "tiers_consistent")
    # The last by the retrievability probe's order (md5 of the id; it reads the first 10): the probe
    # would fail the step on a missing backup before the check could run.
    ref = one(conn.execute(f"{ARCHIVE_REFS_SQL} ORDER BY md5(a.original_id::text) DESC LIMIT 1"))[
        "storage_ref"
    ]
    lib_store = store.get_store()
    lost = members_sharing(conn, lib_store, ref)  # the object is a pack: all of its members go with it
    lib_store.delete(lib_store.key_from_ref(ref))
    # The check alone only reads what archive_rows recorded: the same audit, no HEAD of its own.
    job = dg.define_asset_job("tier_check", selection=dg.AssetSelection.checks(checks.tiers_consistent))
    alone = (
        dg.Definitions(
            assets=[assets.archive_rows], asset_checks=[checks.tiers_consistent], jobs=[job], resources=res
        )
        .resolve_job_def("tier_check")
        .execute_in_process(
            tags={"dagster/partition": NIGHT.isoformat()},
            instance=dg.DagsterInstance.ephemeral(),
            raise_on_error=False,
        )
    )
    again = next(e for e in alone.get_asset_check_evaluations() if e.check_name == "tiers_consistent")
    assert again.passed and again.metadata["audited_at"] == recorded.metadata["audited_at"]
    assert metadata_value(again, "backups_checked") == metadata_value(recorded, "backups_checked") > 0
    result = materialize(res, defs=[assets.archive_rows, checks.tiers_consistent])
    assert checks_of(result)["tiers_consistent"] == (False, "ERROR")
    evaluation = next(e for e in result.get_asset_check_evaluations() if e.check_name == "tiers_consistent")
    assert metadata_value(evaluation, "backups_missing") == lost > 1
    assert evaluation.metadata["audited_at"] != recorded.metadata["audited_at"]
    pause = pause_switch.pause_status(conn)  # archive_rows audited the night after its commit and paused
    assert pause.reason is not None
    assert (
        pause.paused
        and "tier integrity failed" in pause.reason
        and pause.details == {"check": "tiers_consistent"}
    )
