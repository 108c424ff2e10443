"""Expansion from object storage, re-promotion (3 expansions in 30 days), the nightly sweep, restore."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import PromotionConfig, Settings
from memory_lib.core.errors import IntegrityError, NotFoundError
from memory_lib.lifecycle.promotion import sweep_promotions
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.objectstore import LocalObjectStore
from testing.backups import ARCHIVE_ROWS_SQL
from testing.constants import TEST_DIM
from testing.dagster_helpers import metadata_value
from testing.factories import archival_services, archive_cleanly

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
ORIGINAL = (
    "Anniversary dinner booked at Casa Lumi for 14 June, table 7, deposit 80 EUR paid by card. "
    "Ask for the window seat."
)


def _client(conn, store, **promotion) -> MemoryClient:
    settings = Settings(promotion=PromotionConfig(**promotion))
    return MemoryClient(
        conn, embedder=HashingEmbedder(TEST_DIM), object_store=store, settings=settings, actor="test"
    )


def _archived_memory(conn, store, client, user_id: str = "u1", text: str = ORIGINAL):
    added = client.add(user_id, text, importance=0.1, tags=["plans"], now=OLD)
    archive_cleanly(conn, store, as_of=NOW)
    row = conn.execute(f"{ARCHIVE_ROWS_SQL} WHERE a.original_id = %s", (added.memory_id,)).fetchone()
    assert row is not None
    return added.memory_id, row


def _tamper(store, storage_ref: str, data: bytes) -> None:
    key = store.key_from_ref(storage_ref)
    if isinstance(store, LocalObjectStore):
        (store.root / key).write_bytes(data)
    else:  # a valid upload of other bytes: only the sha256 recorded in Postgres can tell
        store.client.put_object(Bucket=store.bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256")


def _events(conn, memory_id) -> list[str]:
    rows = conn.execute("SELECT event_type FROM memory_events WHERE memory_id = %s ORDER BY id", (memory_id,))
    return [r["event_type"] for r in rows]


def _is_hot(conn, memory_id) -> bool:
    return conn.execute("SELECT 1 FROM memories WHERE id = %s", (memory_id,)).fetchone() is not None


def test_expand_returns_the_exact_original_and_logs_it(conn, object_store):
    client = _client(conn, object_store)
    memory_id, arch = _archived_memory(conn, object_store, client)
    when = NOW + timedelta(days=1)
    exp = client.expand("u1", arch["id"], now=when)
    assert exp.content == ORIGINAL and exp.memory_id == memory_id and exp.archive_id == arch["id"]
    expected = HashingEmbedder(TEST_DIM).embed([ORIGINAL])[0]
    assert np.array_equal(exp.original.embedding_array(), expected)  # every float32 bit
    assert exp.original.metadata == {"tags": ["plans"]} and exp.original.created_at == OLD
    assert exp.expansions_in_window == 1 and not exp.promoted
    row = conn.execute(
        "SELECT expansion_count, last_expanded_at FROM archived_memories WHERE id = %s", (arch["id"],)
    ).fetchone()
    assert row == {"expansion_count": 1, "last_expanded_at": when}
    assert _events(conn, memory_id) == ["created", "archived", "expanded"]


def test_a_tampered_backup_is_an_integrity_error_and_nothing_is_recorded(conn, object_store):
    client = _client(conn, object_store)
    memory_id, arch = _archived_memory(conn, object_store, client)
    forged = object_store.get(object_store.key_from_ref(arch["storage_ref"])).replace(b"80 EUR", b"800 EUR")
    _tamper(object_store, arch["storage_ref"], forged)
    with pytest.raises(IntegrityError, match="sha256"):
        client.expand("u1", arch["id"], now=NOW)
    with pytest.raises(IntegrityError):
        client.restore("u1", archive_id=arch["id"], now=NOW)
    assert _events(conn, memory_id) == ["created", "archived"]
    assert conn.execute(
        "SELECT expansion_count FROM archived_memories WHERE id = %s", (arch["id"],)
    ).fetchone() == {"expansion_count": 0}
    assert not _is_hot(conn, memory_id)


def test_third_expansion_within_the_window_promotes(conn, local_store):
    client = _client(conn, local_store)
    memory_id, arch = _archived_memory(conn, local_store, client)
    first = client.expand("u1", arch["id"], now=NOW)
    second = client.expand("u1", arch["id"], now=NOW + timedelta(days=10))
    assert (first.promoted, second.promoted) == (False, False) and not _is_hot(conn, memory_id)
    third = client.expand("u1", arch["id"], now=NOW + timedelta(days=20))
    assert third.promoted and third.expansions_in_window == 3
    row = conn.execute(
        "SELECT content, embedding, created_at, metadata, pinned FROM memories WHERE id = %s", (memory_id,)
    ).fetchone()
    assert row["content"] == ORIGINAL and row["created_at"] == OLD and row["metadata"] == {"tags": ["plans"]}
    assert np.array_equal(row["embedding"].to_numpy(), HashingEmbedder(TEST_DIM).embed([ORIGINAL])[0])
    assert conn.execute("SELECT count(*) AS n FROM archived_memories").fetchone()["n"] == 0
    assert _events(conn, memory_id) == ["created", "archived", "expanded", "expanded", "expanded", "promoted"]
    details = conn.execute(
        "SELECT details FROM memory_events WHERE memory_id = %s AND event_type = 'promoted'", (memory_id,)
    ).fetchone()["details"]
    assert details["archive_id"] == str(arch["id"]) and details["expansions"] == 3
    # It is a hot memory again: search finds it there, and the old archive id says where it went.
    hits = client.search("u1", "anniversary dinner Casa Lumi", phase2="never", now=NOW + timedelta(days=20))
    assert [h.provenance.memory_id for h in hits] == [memory_id]
    with pytest.raises(NotFoundError, match=f"promoted back to hot memory id={memory_id}"):
        client.expand("u1", arch["id"], now=NOW + timedelta(days=21))


def test_expansions_spread_wider_than_the_window_do_not_promote(conn, local_store):
    client = _client(conn, local_store)
    memory_id, arch = _archived_memory(conn, local_store, client)
    for day in (0, 20, 40):  # at day 40 only days 20 and 40 are within the last 30 days
        exp = client.expand("u1", arch["id"], now=NOW + timedelta(days=day))
        assert not exp.promoted
    assert exp.expansions_in_window == 2 and not _is_hot(conn, memory_id)
    exp = client.expand("u1", arch["id"], now=NOW + timedelta(days=45))  # days 20, 40, 45
    assert exp.promoted and _is_hot(conn, memory_id)


def test_rule_is_configurable(conn, local_store):
    client = _client(conn, local_store, expansions_to_promote=2, window_days=7)
    _, arch = _archived_memory(conn, local_store, client)
    assert not client.expand("u1", arch["id"], now=NOW).promoted
    assert not client.expand("u1", arch["id"], now=NOW + timedelta(days=8)).promoted
    assert client.expand("u1", arch["id"], now=NOW + timedelta(days=9)).promoted


def test_a_memory_archived_again_starts_counting_from_zero(conn, local_store):
    client = _client(conn, local_store, window_days=365)  # the earlier expansions stay in the window
    memory_id, arch = _archived_memory(conn, local_store, client)
    for day in (0, 1, 2):
        client.expand("u1", arch["id"], now=NOW + timedelta(days=day))
    assert _is_hot(conn, memory_id)
    # Re-promoted on day 2: the criteria count its age from then (a re-promotion is a restore).
    archive_cleanly(conn, local_store, batch_key="night-2", as_of=NOW + timedelta(days=3))
    assert _is_hot(conn, memory_id)
    archive_cleanly(conn, local_store, batch_key="night-93", as_of=NOW + timedelta(days=93))
    again = conn.execute("SELECT id FROM archived_memories WHERE original_id = %s", (memory_id,)).fetchone()
    assert again is not None and again["id"] != arch["id"]
    exp = client.expand("u1", again["id"], now=NOW + timedelta(days=94))
    assert exp.expansions_in_window == 1 and not exp.promoted  # the three earlier ones were of the old row


def test_nightly_sweep_promotes_what_the_rule_now_says(conn, local_store):
    client = _client(conn, local_store)
    texts = [
        "Ferry to Madeira leaves at 7 am",
        "Dentist moved the cleaning to May",
        "Passport renewal form posted",
    ]
    ids = [_archived_memory(conn, local_store, client, text=t)[1]["id"] for t in texts]
    for archive_id in ids[:2]:  # two expansions each: below the default rule of 3
        client.expand("u1", archive_id, now=NOW)
        client.expand("u1", archive_id, now=NOW + timedelta(days=1))
    client.expand("u1", ids[2], now=NOW)
    as_of = NOW + timedelta(days=2)
    assert sweep_promotions(conn, local_store, PromotionConfig(), as_of=as_of, actor="sweep").promoted == []
    lowered = PromotionConfig(expansions_to_promote=2)
    report = sweep_promotions(conn, local_store, lowered, as_of=as_of, actor="sweep")
    assert sorted(report.promoted) == sorted(ids[:2]) and report.failed == {}
    remaining = [r["id"] for r in conn.execute("SELECT id FROM archived_memories")]
    assert remaining == [ids[2]]
    again = sweep_promotions(conn, local_store, lowered, as_of=as_of, actor="sweep")
    assert again.due == 0 and again.promoted == []  # re-running is a no-op
    # Outside the window nothing is due.
    late = sweep_promotions(
        conn,
        local_store,
        PromotionConfig(expansions_to_promote=1),
        as_of=NOW + timedelta(days=90),
        actor="sweep",
    )
    assert late.due == 0


def test_sweep_reports_a_tampered_backup_and_goes_on(conn, local_store):
    client = _client(conn, local_store)
    archs = [
        _archived_memory(conn, local_store, client, text=t)[1]
        for t in ("Lentil soup needs two carrots", "Bike tyre pressure should be 4 bar")
    ]
    for arch in archs:
        client.expand("u1", arch["id"], now=NOW)
    _tamper(local_store, archs[0]["storage_ref"], b"{}")
    report = sweep_promotions(
        conn, local_store, PromotionConfig(expansions_to_promote=1), as_of=NOW, actor="sweep"
    )
    assert report.promoted == [archs[1]["id"]]
    assert list(report.failed) == [archs[0]["id"]] and "IntegrityError" in report.failed[archs[0]["id"]]
    assert conn.execute("SELECT id FROM archived_memories").fetchall() == [{"id": archs[0]["id"]}]


def test_restore_by_archive_or_original_id_is_idempotent(conn, local_store):
    client = _client(conn, local_store)
    first_id, first = _archived_memory(
        conn, local_store, client, text="Gym locker code changed to the blue padlock"
    )
    second_id, _ = _archived_memory(conn, local_store, client, text="Library card renewed until next spring")
    out = client.restore("u1", archive_id=first["id"], now=NOW)
    assert out.restored and out.memory_id == first_id and _is_hot(conn, first_id)
    assert not client.restore("u1", archive_id=first["id"], now=NOW).restored
    assert client.restore("u1", original_id=second_id, now=NOW).restored
    assert not client.restore("u1", original_id=second_id, now=NOW).restored
    assert _events(conn, first_id)[-1] == "restored"
    with pytest.raises(NotFoundError):
        client.restore("u1", original_id=first["id"], now=NOW)  # an archive id is not a memory id


def test_record_access_counts_hot_and_archived_of_that_user_only(conn, local_store):
    client = _client(conn, local_store)
    _, arch = _archived_memory(conn, local_store, client)
    hot = client.add("u1", "Plants watered on the balcony", now=NOW)
    other = client.add("u2", "Plants watered on the balcony", now=NOW)
    assert client.record_access("u1", [hot.memory_id, arch["id"], other.memory_id], now=NOW) == 2
    counts = {r["id"]: r["access_count"] for r in conn.execute("SELECT id, access_count FROM memories")}
    assert counts == {hot.memory_id: 1, other.memory_id: 0}
    assert conn.execute("SELECT access_count FROM archived_memories").fetchone() == {"access_count": 1}
    assert client.record_access("u1", [], now=NOW) == 0


def test_expanding_another_users_archive_is_not_found(conn, local_store):
    client = _client(conn, local_store)
    _, arch = _archived_memory(conn, local_store, client)
    with pytest.raises(NotFoundError):
        client.expand("u2", arch["id"], now=NOW)
    assert (
        conn.execute("SELECT count(*) AS n FROM memory_events WHERE event_type = 'expanded'").fetchone()["n"]
        == 0
    )


# --------------------------------------------------------------------------- the Dagster asset


def _materialize_promotions(db_url, store, run_config: dict):
    import dagster as dg

    from memory_assets.defs.retrieval.assets import promotions
    from memory_assets.resources import DatabaseResource, ObjectStoreResource

    resources = {
        "database": DatabaseResource(database_url=db_url, embedding_dim=TEST_DIM),
        "object_store": ObjectStoreResource(kind="local", local_root=str(store.root), prefix=store.prefix),
    }
    return dg.materialize(
        [promotions],
        resources=resources,
        instance=dg.DagsterInstance.ephemeral(),
        run_config={"ops": {"promotions": {"config": run_config}}},
        raise_on_error=False,
    )


def test_promotions_asset_runs_the_sweep(db_url, conn, local_store):
    client = _client(conn, local_store)
    memory_id, arch = _archived_memory(conn, local_store, client)
    client.expand("u1", arch["id"], now=NOW)
    as_of = (NOW + timedelta(days=1)).isoformat()
    result = _materialize_promotions(db_url, local_store, {"expansions_to_promote": 1, "as_of": as_of})
    assert result.success
    [mat] = result.asset_materializations_for_node("promotions")
    assert metadata_value(mat, "promoted") == 1 and metadata_value(mat, "failed") == 0
    assert _is_hot(conn, memory_id)
    again = _materialize_promotions(db_url, local_store, {"expansions_to_promote": 1, "as_of": as_of})
    assert again.success
    assert again.asset_materializations_for_node("promotions")[0].metadata["due"].value == 0


def test_promotions_asset_fails_on_a_bad_backup_and_on_bad_config(db_url, conn, local_store):
    client = _client(conn, local_store)
    memory_id, arch = _archived_memory(conn, local_store, client)
    client.expand("u1", arch["id"], now=NOW)
    _tamper(local_store, arch["storage_ref"], b"{}")
    result = _materialize_promotions(
        db_url, local_store, {"expansions_to_promote": 1, "as_of": NOW.isoformat()}
    )
    assert not result.success and not _is_hot(conn, memory_id)
    bad = _materialize_promotions(db_url, local_store, {"window_days": 0})
    assert not bad.success
    [failure] = [e for e in bad.all_events if e.is_step_failure]
    assert "promotion.window_days" in str(failure.step_failure_data.error)


def test_archive_and_restore_keep_the_write_paths_dedupe_key(conn, local_store):
    """A memory written by the client keeps its dedupe key through archival: adding it again after the
    restore is recognised as the same memory, not a duplicate."""
    from datetime import UTC, datetime, timedelta

    from memory_lib.archival.integrity import exact_rows
    from memory_lib.client import MemoryClient
    from memory_lib.core.config import ArchivalCriteria
    from memory_lib.lifecycle.restore import restore_archive
    from memory_lib.llm.embedding import HashingEmbedder

    embedder = HashingEmbedder(dim=64)
    client = MemoryClient(conn, embedder=embedder, object_store=local_store)
    long_ago = datetime.now(UTC) - timedelta(days=400)
    added = client.add(
        "alice", "Kenji Sato renewed passport P-7731 on 2 May 2025", importance=0.1, now=long_ago
    )
    before = exact_rows(conn, [added.memory_id])
    assert before[added.memory_id]["dedupe_key"]
    svc = archival_services(local_store, embedder=embedder)
    report = run_batch(conn, svc, ArchivalCriteria(), batch_key="n", as_of=datetime.now(UTC), actor="t")
    assert report.status.archived == 1
    restore_archive(conn, local_store, user_id="alice", original_id=added.memory_id, actor="t")
    assert exact_rows(conn, [added.memory_id]) == before
    again = client.add("alice", "Kenji Sato renewed passport P-7731 on 2 May 2025")
    assert again.outcome == "duplicate" and again.memory_id == added.memory_id
