"""A rollback stays rolled back: a restore (one memory, a user's, all) and a re-promotion are a use and
a new start (memories.restored_at, memory_lib.lifecycle.eligibility), so the next night finds the
memories hot and not eligible, paused or not; the ordinary criteria, counted from the restore, archive
them again later. Real Postgres, the real nightly run (nights.run_night)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from memory_lib.archival import nights
from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.integrity import exact_rows
from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, PromotionConfig, Settings
from memory_lib.lifecycle import restore as restore_mod
from memory_lib.lifecycle.eligibility import eligible_counts
from memory_lib.lifecycle.pause import pause_status
from memory_lib.lifecycle.promotion import sweep_promotions
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories

N = 12


def _services(store) -> ArchivalServices:
    return archival_services(store)


def _archived(conn, store) -> tuple[list[dict], dict]:
    """N old, unimportant memories of alice and bob (eligible by the criteria), archived; their exact
    hot rows from before."""
    memories = make_memories(N, dim=TEST_DIM, users=("alice", "bob"), age_days=400)
    insert_memories(conn, memories, actor="test")
    before = exact_rows(conn, [m["id"] for m in memories])
    report = run_batch(conn, _services(store), ArchivalCriteria(), batch_key="night-0", as_of=NOW, actor="t")
    assert report.ok and report.archived == N
    return memories, before


def _hot(conn) -> set:
    return {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}


def _today() -> date:
    return datetime.now(UTC).date()


@pytest.mark.parametrize("scope", ["one", "user", "all"])
def test_the_night_after_a_restore_finds_the_restored_memories_hot(conn, local_store, scope):
    memories, before = _archived(conn, local_store)
    if scope == "one":
        restore_mod.restore_archive(
            conn, local_store, user_id="alice", original_id=memories[0]["id"], actor="t"
        )
        restored = {memories[0]["id"]}
    elif scope == "user":  # as `memory-archive restore --user-id alice` runs it: no pause
        report = restore_mod.restore_archives(conn, local_store, actor="t", user_id="alice")
        assert not report.paused_archival
        restored = {m["id"] for m in memories if m["user_id"] == "alice"}
    else:  # all, and without the pause: the rule alone keeps them hot
        report = restore_mod.restore_archives(
            conn, local_store, actor="t", all_archives=True, pause_archival=False
        )
        restored = {m["id"] for m in memories}
    assert _hot(conn) == restored and not pause_status(conn).paused
    assert exact_rows(conn, list(restored)) == {i: before[i] for i in restored}  # byte-exact all the same
    at = conn.execute("SELECT min(restored_at) AS lo, max(restored_at) AS hi FROM memories").fetchone()
    assert datetime.now(UTC) - timedelta(minutes=5) < at["lo"] <= at["hi"] <= datetime.now(UTC)

    # `stats` counts none of them eligible, and the next night archives none of them.
    assert eligible_counts(conn, ArchivalCriteria(), datetime.now(UTC)) == {}
    night = nights.run_night(conn, _services(local_store), ArchivalCriteria(), _today(), "UTC")
    assert night.ok and night.archived == 0
    assert _hot(conn) == restored

    # The ordinary criteria, counted from the restore: 90 days on, these old unimportant memories go.
    later = nights.run_night(
        conn, _services(local_store), ArchivalCriteria(), _today() + timedelta(days=91), "UTC"
    )
    assert later.ok and later.archived == len(restored) and _hot(conn) == set()


def test_a_restored_superseded_memory_is_not_sent_straight_back(conn, local_store):
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), object_store=local_store, actor="t")
    old = client.add("u1", "Standup moved to Thursday 09:30", now=NOW - timedelta(days=3))
    client.update("u1", old.memory_id, "Standup moved to Friday 10:00", now=NOW - timedelta(days=2))
    report = run_batch(conn, _services(local_store), ArchivalCriteria(), batch_key="n", as_of=NOW, actor="t")
    assert report.archived == 1 and old.memory_id not in _hot(conn)  # archived as superseded
    assert client.restore("u1", original_id=old.memory_id).restored
    night = nights.run_night(conn, _services(local_store), ArchivalCriteria(), _today(), "UTC")
    assert night.ok and night.archived == 0 and old.memory_id in _hot(conn)


def test_a_re_promoted_memory_stays_hot_the_next_night(conn, local_store):
    """Re-promotion (by expansions, and by the nightly sweep) is a restore: the same rule holds."""
    memories, _ = _archived(conn, local_store)
    settings = Settings(promotion=PromotionConfig(expansions_to_promote=3, window_days=30))
    client = MemoryClient(
        conn, embedder=HashingEmbedder(TEST_DIM), object_store=local_store, settings=settings, actor="t"
    )
    archive_of = {
        r["original_id"]: r["id"] for r in conn.execute("SELECT id, original_id FROM archived_memories")
    }
    by_expansion, by_sweep = memories[0]["id"], memories[1]["id"]
    now = datetime.now(UTC) - timedelta(minutes=1)
    for k in range(3):
        exp = client.expand(memories[0]["user_id"], archive_of[by_expansion], now=now + timedelta(seconds=k))
    assert exp.promoted
    client.expand(memories[1]["user_id"], archive_of[by_sweep], now=now)
    swept = sweep_promotions(
        conn, local_store, PromotionConfig(expansions_to_promote=1), as_of=datetime.now(UTC), actor="sweep"
    )
    assert swept.promoted == [archive_of[by_sweep]]
    assert _hot(conn) == {by_expansion, by_sweep}
    assert eligible_counts(conn, ArchivalCriteria(), datetime.now(UTC)) == {}
    night = nights.run_night(conn, _services(local_store), ArchivalCriteria(), _today(), "UTC")
    assert night.ok and night.archived == 0 and _hot(conn) == {by_expansion, by_sweep}


def test_under_the_retention_policy_the_score_restarts_at_the_restore(conn, local_store):
    """Policy `retention`: a restored memory's score decays from its restore, so its streak at the floor
    starts only once it has decayed again, not on the first night it is scored after the restore."""
    memories, _ = _archived(conn, local_store)
    restore_mod.restore_archives(conn, local_store, actor="t", user_id="bob")
    bob = {m["id"] for m in memories if m["user_id"] == "bob"}
    criteria = ArchivalCriteria(policy="retention")
    first = nights.run_night(conn, _services(local_store), criteria, _today(), "UTC")
    scores = conn.execute("SELECT last_touched_at, floor_at FROM memory_retention").fetchall()
    assert len(scores) == len(bob) and all(
        s["floor_at"] > datetime.now(UTC) + timedelta(days=150) for s in scores
    )
    # Eight nights on, a streak from the first night scored would have passed cold_migration_days (7).
    week = nights.run_night(conn, _services(local_store), criteria, _today() + timedelta(days=8), "UTC")
    assert (first.archived, week.archived) == (0, 0) and _hot(conn) == bob
    # Decayed to the floor again (a half-life of 31.2 days, lengthened by use) and 7 nights there: archived.
    late = nights.run_night(conn, _services(local_store), criteria, _today() + timedelta(days=260), "UTC")
    assert late.ok and late.archived == len(bob) and _hot(conn) == set()
