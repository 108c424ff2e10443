"""Stubs (the third tier; memory_lib.lifecycle.stubs, sql/011), against the embedded Postgres and
a real object store; the nightly asset, its blocking check and its tier metadata through Dagster."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest

from memory_assets.defs.slow_path.stubs import stub_conversions, stubs_backed_up
from memory_assets.resources import DatabaseResource, ObjectStoreResource
from memory_lib.archival import integrity
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria, RetentionConfig
from memory_lib.core.errors import NotFoundError
from memory_lib.core.models import BackupObject, sha256_hex, to_float32
from memory_lib.core.plans import run_plan
from memory_lib.core.shards import Shard
from memory_lib.lifecycle import stubs
from memory_lib.llm.embedding import HashingEmbedder
from testing.backups import ARCHIVE_ROWS_SQL
from testing.constants import TEST_DIM
from testing.dagster_helpers import metadata_value
from testing.factories import archival_services, make_client
from testing.rows import one

ADDED = datetime(2025, 1, 10, 12, 0, tzinfo=UTC)
ARCHIVED = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)  # the test history's archival time
DAYS = RetentionConfig().stub_after_days
DUE = ARCHIVED + timedelta(days=DAYS + 1)
ORIGINAL = (
    "Anniversary dinner booked at Casa Lumi for 14 June, table 7, deposit 80 EUR paid by card. "
    "Ask for the window seat."
)


def _archive_all(conn, store) -> None:
    """Archive every memory added before ARCHIVED - 90 days (min_age_days), as archived at ARCHIVED."""
    services = archival_services(store)
    report = run_batch(
        conn,
        services,
        ArchivalCriteria(),
        batch_key=f"night-{uuid.uuid4().hex[:8]}",
        as_of=ARCHIVED,
        actor="test",
    )
    assert report.gate_passed and report.status.failed == 0
    conn.execute("UPDATE archived_memories SET archived_at = %s", (ARCHIVED,))


def _row(conn, archive_id) -> dict:
    return conn.execute(f"{ARCHIVE_ROWS_SQL} WHERE a.id = %s", (archive_id,)).fetchone()


def _arch_of(conn, memory_id) -> dict:
    return conn.execute(f"{ARCHIVE_ROWS_SQL} WHERE a.original_id = %s", (memory_id,)).fetchone()


def _events(conn, event_type: str) -> list[tuple]:
    rows = conn.execute(
        "SELECT memory_id, user_id FROM memory_events WHERE event_type = %s ORDER BY id", (event_type,)
    ).fetchall()
    return [(r["memory_id"], r["user_id"]) for r in rows]


def _state(conn) -> list[tuple]:
    rows = conn.execute(
        """SELECT id, user_id, stubbed_at, summary_bits IS NULL AS no_vector, summary FROM archived_memories
           ORDER BY id"""
    ).fetchall()
    return [tuple(r.values()) for r in rows] + [("stubbed events", len(_events(conn, "stubbed")))]


def _by_vector(client, user_id: str, query: str, now: datetime) -> set:
    """Vector arm only: a text query that matches nothing."""
    hits = client.search(user_id, query, limit=5, phase2="always", text_query='"qqqzzzxv"', now=now)
    return {h.provenance.archive_id for h in hits.archived}


def test_stub_found_by_full_text_not_by_vector_and_expanded_byte_exact(conn, object_store):
    client = make_client(conn, object_store)
    added = client.add("u1", ORIGINAL, importance=0.1, now=ADDED)
    before = integrity.exact_rows(conn, [added.memory_id])[added.memory_id]
    _archive_all(conn, object_store)
    arch = _arch_of(conn, added.memory_id)
    bits, summary = arch["summary_bits"], arch["summary"]
    assert _by_vector(client, "u1", summary, DUE) == {arch["id"]}  # searchable by vector before

    # Not due the night before stub_after_days is over; due the night after.
    early = stubs.convert(conn, object_store, ARCHIVED + timedelta(days=DAYS - 1), stub_after_days=DAYS)
    assert (early.due, early.stubbed) == (0, 0)
    run = stubs.convert(conn, object_store, DUE, stub_after_days=DAYS)
    assert (run.due, run.stubbed, run.unverified) == (1, 1, {})
    row = _row(conn, arch["id"])
    assert row["summary_bits"] is None and row["stubbed_at"] == DUE and row["summary"] == summary
    assert _events(conn, "stubbed") == [(added.memory_id, "u1")]
    # The HNSW index holds no entry for it (NULLs are not indexed), and the vector arm never returns it.
    assert _by_vector(client, "u1", summary, DUE) == set()
    # Full text finds it, shown as its stub text.
    hits = client.search("u1", "Casa Lumi anniversary dinner", limit=5, phase2="always", now=DUE).archived
    assert [h.provenance.archive_id for h in hits] == [arch["id"]]
    assert hits[0].text == "[archived] " + summary[:200] == stubs.stub_text(summary)
    assert hits[0].labeled_text == hits[0].text  # not labelled twice
    assert hits[0].scores.vector_position is None and hits[0].scores.text_position == 1

    # Expanded: the backup's original equals what was archived, byte for byte.
    exp = client.expand("u1", arch["id"], now=DUE + timedelta(days=1))
    assert exp.content == ORIGINAL and not exp.promoted and exp.vector_restored
    assert to_float32(exp.original.embedding).tobytes() == before["embedding"]
    raw = object_store.get(object_store.key_from_ref(arch["storage_ref"]))
    assert BackupObject.from_json_bytes(raw) == exp.original
    assert sha256_hex(raw) == arch["backup_sha256"]
    # Its summary vector is back (the same bits: same summary, same embedder), searchable by vector again.
    row = _row(conn, arch["id"])
    assert row["stubbed_at"] is None and row["summary_bits"] == bits
    assert _events(conn, "unstubbed") == [(added.memory_id, "u1")]
    assert _by_vector(client, "u1", summary, DUE) == {arch["id"]}
    # Used since: not due again until stub_after_days after that expansion.
    assert stubs.convert(conn, object_store, DUE + timedelta(days=2), stub_after_days=DAYS).due == 0


def test_three_expansions_of_a_stub_in_30_days_re_promote_it(conn, local_store):
    client = make_client(conn, local_store)
    added = client.add("u1", ORIGINAL, importance=0.1, now=ADDED)
    _archive_all(conn, local_store)
    arch_id = _arch_of(conn, added.memory_id)["id"]
    stubs.convert(conn, local_store, DUE, stub_after_days=DAYS)
    first = client.expand("u1", arch_id, now=DUE + timedelta(days=1))
    assert first.vector_restored
    stubs.convert(conn, local_store, DUE + timedelta(days=DAYS + 2), stub_after_days=DAYS)  # a stub again
    assert _row(conn, arch_id)["stubbed_at"] is not None
    # The 30-day window counts expansions of the archive row, stub or not (promotion.py's rule).
    when = DUE + timedelta(days=DAYS + 3)
    assert client.expand("u1", arch_id, now=when).vector_restored
    last = client.expand("u1", arch_id, now=when + timedelta(days=1))
    assert not last.promoted
    conn.execute(
        "UPDATE archived_memories SET summary_bits = NULL, stubbed_at = %s WHERE id = %s", (when, arch_id)
    )
    third = client.expand("u1", arch_id, now=when + timedelta(days=2))
    assert third.promoted and not third.vector_restored and third.content == ORIGINAL
    assert _row(conn, arch_id) is None
    hot = conn.execute("SELECT content FROM memories WHERE id = %s", (added.memory_id,)).fetchone()
    assert hot["content"] == ORIGINAL


class _CrashingStore:
    """The store, until `after` HEADs: then the run dies as a killed process would (no cleanup)."""

    def __init__(self, store, after: int):
        self._store, self._left = store, after

    def head(self, key):
        self._left -= 1
        if self._left < 0:
            raise SystemExit("killed")
        return self._store.head(key)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_conversion_is_idempotent_and_crash_safe(conn, local_store):
    client = make_client(conn, local_store)
    for i in range(5):
        client.add(
            f"u{i % 2}", f"Trip {i}: train to Lyon on platform {i}, seat {40 + i}.", importance=0.1, now=ADDED
        )
    _archive_all(conn, local_store)
    assert one(conn.execute("SELECT count(*) AS n FROM archived_memories"))["n"] == 5

    # Killed during its second batch (2 rows a batch): the first batch is in, whole, events included.
    with pytest.raises(SystemExit):
        stubs.convert(conn, _CrashingStore(local_store, after=3), DUE, stub_after_days=DAYS, batch_size=2)
    partial = _state(conn)
    assert sum(1 for r in partial[:-1] if r[3]) == 2 and partial[-1] == ("stubbed events", 2)
    for r in partial[:-1]:  # stub state and vector agree on every row (the 011 constraint holds)
        assert (r[2] is not None) == r[3]
    resumed = stubs.convert(conn, local_store, DUE, stub_after_days=DAYS, batch_size=2)
    assert (resumed.due, resumed.stubbed) == (3, 3)
    done = _state(conn)
    assert all(r[3] and r[2] == DUE for r in done[:-1]) and done[-1] == ("stubbed events", 5)
    # Run again, and again for a later night: nothing changes.
    again = stubs.convert(conn, local_store, DUE, stub_after_days=DAYS, batch_size=2)
    later = stubs.convert(conn, local_store, DUE + timedelta(days=3), stub_after_days=DAYS)
    assert (again.due, again.stubbed, later.due, later.stubbed) == (0, 0, 0, 0)
    assert _state(conn) == done


def test_a_backup_that_does_not_verify_keeps_the_row_searchable(conn, local_store):
    client = make_client(conn, local_store)
    added = client.add("u1", ORIGINAL, importance=0.1, now=ADDED)
    _archive_all(conn, local_store)
    arch = _arch_of(conn, added.memory_id)
    local_store.delete(local_store.key_from_ref(arch["storage_ref"]))
    run = stubs.convert(conn, local_store, DUE, stub_after_days=DAYS)
    assert (run.due, run.stubbed, run.unverified) == (1, 0, {arch["storage_ref"]: "missing"})
    assert _row(conn, arch["id"])["summary_bits"] is not None and _events(conn, "stubbed") == []


def test_users_never_cross(conn, local_store):
    client = make_client(conn, local_store)
    a = client.add("u1", ORIGINAL, importance=0.1, now=ADDED)
    b = client.add("u2", ORIGINAL, importance=0.1, now=ADDED)
    _archive_all(conn, local_store)
    arch_a, arch_b = _arch_of(conn, a.memory_id), _arch_of(conn, b.memory_id)
    client.expand("u2", arch_b["id"], now=DUE - timedelta(days=10))  # u2 used theirs: not due
    # Two shard runs (as two concurrent Dagster runs): each converts its own users' rows only.
    runs = [
        stubs.convert(conn, local_store, DUE, stub_after_days=DAYS, shard=Shard.parse(f"{i}/2"))
        for i in (0, 1)
    ]
    assert sorted((r.due, r.stubbed) for r in runs) == [(0, 0), (1, 1)]
    assert _events(conn, "stubbed") == [(a.memory_id, "u1")]
    assert _row(conn, arch_a["id"])["stubbed_at"] == DUE and _row(conn, arch_b["id"])["stubbed_at"] is None
    # u2 sees only their own row, by vector and by text; u1 only their stub.
    for query in ("Casa Lumi anniversary dinner", arch_b["summary"]):
        hits = client.search("u2", query, limit=5, phase2="always", now=DUE).archived
        assert [(h.provenance.archive_id, h.provenance.user_id) for h in hits] == [(arch_b["id"], "u2")]
    hits = client.search("u1", "Casa Lumi anniversary dinner", limit=5, phase2="always", now=DUE).archived
    assert [(h.provenance.archive_id, h.text[:10]) for h in hits] == [(arch_a["id"], "[archived]")]
    # u2 cannot expand nor restore the vector of u1's stub.
    with pytest.raises(NotFoundError):
        client.expand("u2", arch_a["id"], now=DUE)
    plan = stubs.restore_vector_plan(
        "u2", arch_a["id"], HashingEmbedder(TEST_DIM).embed(["x"])[0], model="hashing", actor="test", now=DUE
    )
    assert run_plan(conn, plan) is False
    assert _row(conn, arch_a["id"])["summary_bits"] is None and _events(conn, "unstubbed") == []
    # The check of a shard reads only that shard's users' stubs.
    by_shard = [
        stubs.verify_stub_backups(conn, local_store, shard=Shard.parse(f"{i}/2")).stubs for i in (0, 1)
    ]
    assert sorted(by_shard) == [0, 1] and stubs.verify_stub_backups(conn, local_store).stubs == 1


# --------------------------------------------------------------------------- the asset and its check


def _night(t: datetime) -> date:
    return t.date()  # SLOW_PATH.timezone is UTC in the tests (tests/lifecycle/test_retention.py asserts it)


def _resources(db_url, store) -> dict:
    return {
        "database": DatabaseResource(database_url=db_url),
        "object_store": ObjectStoreResource(kind="local", local_root=str(store.root), prefix=store.prefix),
    }


def _metadata(instance, night: date) -> dict:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("stub_conversions"), asset_partitions=[night.isoformat()]
        ),
        limit=10,
    ).records
    assert len(records) == 1, f"{night}: {len(records)} materializations"
    return {k: v.value for k, v in records[0].asset_materialization.metadata.items()}


def test_asset_records_each_nights_tier_counts(conn, db_url, local_store):
    client = make_client(conn, local_store)
    for i in range(2):
        client.add("u1", f"Old plan {i}: Heron rollout review in room {i}.", importance=0.1, now=ADDED)
    kept = client.add("u2", "Old plan: Heron rollout budget for the kiosk.", importance=0.1, now=ADDED)
    _archive_all(conn, local_store)
    client.add("u1", "Fresh: the Heron launch party is on Friday.", now=ARCHIVED)
    client.add("u1", "Fresh: bring the kiosk badges.", now=ARCHIVED)
    client.add("u2", "Fresh: kiosk budget approved.", now=ARCHIVED)
    client.expand("u2", _arch_of(conn, kept.memory_id)["id"], now=ARCHIVED + timedelta(days=150))
    # The first night whose end is stub_after_days after ARCHIVED is the night the two stubs are made.
    first, second = _night(ARCHIVED + timedelta(days=100)), _night(ARCHIVED + timedelta(days=DAYS))
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        [stub_conversions, stubs_backed_up],
        resources=_resources(db_url, local_store),
        instance=instance,
        tags={
            "dagster/asset_partition_range_start": first.isoformat(),
            "dagster/asset_partition_range_end": second.isoformat(),
        },
    )
    assert result.success
    m1, m2 = _metadata(instance, first), _metadata(instance, second)
    assert (m1["stubbed"], m1["hot_memories"], m1["archived_memories"], m1["stub_memories"]) == (0, 3, 3, 0)
    # Archived memories include the stubs (hot + archived is every memory); stub_memories are of them.
    assert (m2["stubbed"], m2["hot_memories"], m2["archived_memories"], m2["stub_memories"]) == (2, 3, 3, 2)
    before = _metadata(instance, second - timedelta(days=1))
    assert (before["stubbed"], before["stub_memories"], before["archived_memories"]) == (0, 0, 3)
    assert (m2["users"], m2["users_with_stubs"], m2["max_stub_per_user"], m2["stub_per_user_p50"]) == (
        2,
        1,
        2,
        1.0,
    )
    assert (m2["max_hot_per_user"], m2["hot_per_user_p50"], m2["max_archived_per_user"]) == (2, 1.5, 2)
    assert "| u1 | 2 | 2 | 2 |" in m2["tiers_by_user"] and "| u2 | 1 | 1 | 0 |" in m2["tiers_by_user"]
    # A night re-run later (a backfill) shows its own numbers, not today's.
    again = dg.materialize(
        [stub_conversions],
        resources=_resources(db_url, local_store),
        instance=dg.DagsterInstance.ephemeral(),
        partition_key=first.isoformat(),
    )
    meta = again.asset_materializations_for_node("stub_conversions")[0].metadata
    assert meta["stub_memories"].value == 0 and meta["archived_memories"].value == 3


def test_blocking_check_fails_when_a_stubs_backup_is_deleted(conn, db_url, local_store):
    client = make_client(conn, local_store)
    added = client.add("u1", ORIGINAL, importance=0.1, now=ADDED)
    _archive_all(conn, local_store)
    night = _night(DUE)
    instance = dg.DagsterInstance.ephemeral()
    res = _resources(db_url, local_store)
    ok = dg.materialize(
        [stub_conversions, stubs_backed_up], resources=res, instance=instance, partition_key=night.isoformat()
    )
    [evaluation] = ok.get_asset_check_evaluations()
    assert ok.success and evaluation.passed and metadata_value(evaluation, "stubs") == 1
    # The bucket as checked now, on whichever night the result shows: its label says so.
    assert metadata_value(evaluation, "stubs_checked").endswith("after this run (not as of this night)")

    ref = _arch_of(conn, added.memory_id)["storage_ref"]
    local_store.delete(local_store.key_from_ref(ref))
    bad = dg.materialize(
        [stub_conversions, stubs_backed_up],
        resources=res,
        instance=instance,
        partition_key=night.isoformat(),
        raise_on_error=False,
    )
    [evaluation] = bad.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert metadata_value(evaluation, "backups_missing") == 1 and ref in metadata_value(
        evaluation, "bad_backups"
    )
    assert all(spec.blocking for spec in stubs_backed_up.check_specs)
    # The stub itself is untouched by the check (read-only): still a stub.
    assert _arch_of(conn, added.memory_id)["stubbed_at"] is not None
