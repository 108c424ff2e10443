"""Retention scores, days at the floor, the `retention` policy and the superseded rule,
against the embedded Postgres on a fixed clock; the nightly asset through Dagster."""

from __future__ import annotations

import math
import uuid
import zlib
from datetime import date, timedelta

import dagster as dg
import pytest

from memory_assets.defs.slow_path.partitions import SLOW_PATH
from memory_assets.defs.slow_path.retention import retention_scores
from memory_assets.resources import ArchivalCriteriaResource, DatabaseResource
from memory_lib.archival import nights
from memory_lib.archival.archive import ArchivalServices
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, RetentionConfig, Settings
from memory_lib.lifecycle import retention
from memory_lib.lifecycle.eligibility import REASON_RETENTION, REASON_SUPERSEDED, select_eligible
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.factories import archival_services, make_memories

CONFIG = RetentionConfig()
NIGHT0 = date(2026, 5, 1)  # a past night in UTC (the test clock, not today's date)
TZ = "UTC"


def as_of(night: date):
    return nights.night_as_of(night, TZ)


def _memory(label: str, *, idle_days: float, category: str = "episodic", accesses: int = 0, **fields):
    """A memory last touched `idle_days` before the end of NIGHT0."""
    touched = as_of(NIGHT0) - timedelta(days=idle_days)
    mem = make_memories(1, dim=TEST_DIM, seed=zlib.crc32(label.encode()), users=("u1",))[0]
    mem.update(
        id=uuid.uuid5(uuid.NAMESPACE_OID, label),  # one id per label, whatever the seed's vector
        content=f"{label}: a memory about the Heron rollout.",
        category=category,
        access_count=accesses,
        created_at=touched,
        last_accessed_at=None,
        importance_score=0.9,
    )
    return mem | fields


def _rows(conn, night: date) -> dict[str, dict]:
    """Each hot memory's retention as of the end of `night`, by its label."""
    labels = {
        r["id"]: r["label"]
        for r in conn.execute("SELECT id, split_part(content, ':', 1) AS label FROM memories").fetchall()
    }
    return {
        labels[r["memory_id"]]: r | {"label": labels[r["memory_id"]]}
        for r in retention.scores(conn, as_of(night))
    }


def _expected(idle_days: float, half_life: float | None, floor: float, accesses: int = 0) -> float:
    if half_life is None:
        return 1.0
    return max(
        floor, 0.5 ** (idle_days / (half_life * (1 + CONFIG.retrieval_boost * math.log(1 + accesses))))
    )


# --------------------------------------------------------------------------- decay and floors


def test_decay_and_floors_per_category(conn):
    cases = {
        "episodic_one_half_life": ("episodic", 31.2, 0),
        "episodic_used": ("episodic", 31.2, 3),
        "episodic_forgotten": ("episodic", 400, 0),
        "semantic_one_half_life": ("semantic", 83.2, 0),
        "semantic_fresh": ("semantic", 0, 0),
        "procedural_ancient": ("procedural", 3000, 0),
        "core_recent": ("core", 20, 0),
        "core_ancient": ("core", 3650, 0),
        "core_beyond_underflow": ("core", 10**5, 0),
    }
    insert_memories(
        conn,
        [_memory(k, idle_days=d, category=c, accesses=n) for k, (c, d, n) in cases.items()],
        actor="test",
    )
    run = retention.score(conn, as_of(NIGHT0), CONFIG)
    assert (run.scored, run.users, run.statements) == (len(cases), 1, 1)
    rows = _rows(conn, NIGHT0)
    for label, (category, idle, accesses) in cases.items():
        half = getattr(CONFIG, f"{category}_half_life_days")
        floor = getattr(CONFIG, f"{category}_floor")
        assert rows[label]["score"] == pytest.approx(_expected(idle, half, floor, accesses), abs=1e-9), label
        assert rows[label]["floor"] == floor
    assert rows["episodic_one_half_life"]["score"] == pytest.approx(0.5)
    assert rows["semantic_one_half_life"]["score"] == pytest.approx(0.5)
    assert rows["episodic_used"]["score"] > 0.6  # retrieval slows the decay
    assert rows["procedural_ancient"]["score"] == 1.0  # procedural never decays
    assert rows["episodic_forgotten"]["score"] == 0.02 and rows["episodic_forgotten"]["at_floor"]
    # Core: never below 0.60, and at it once decayed that far.
    assert rows["core_recent"]["score"] > 0.8 and not rows["core_recent"]["at_floor"]
    for label in ("core_ancient", "core_beyond_underflow"):
        assert rows[label]["score"] == 0.60 and rows[label]["at_floor"]
    assert min(r["score"] for r in rows.values() if r["label"].startswith("core")) >= 0.60


def test_scores_one_statement_per_user_batch_and_never_mix_users(conn):
    mems = make_memories(12, dim=TEST_DIM, users=("a", "b", "c", "d", "e"), now=as_of(NIGHT0), age_days=10)
    insert_memories(conn, mems, actor="test")
    run = retention.score(conn, as_of(NIGHT0), CONFIG.model_copy(update={"users_per_statement": 2}))
    assert (run.scored, run.users, run.statements) == (12, 5, 3)
    # Each row is its own user's memory's: joined on (user_id, id), every row and every memory pairs up
    # (a join on the id alone would cross shards on distributed Postgres).
    paired = conn.execute(
        """SELECT (SELECT count(*) FROM memory_retention) AS rows, (SELECT count(*) FROM memories) AS memories,
                  (SELECT count(*) FROM memory_retention r JOIN memories m
                   ON m.user_id = r.user_id AND m.id = r.memory_id) AS paired"""
    ).fetchone()
    assert paired == {"rows": 12, "memories": 12, "paired": 12}


# --------------------------------------------------------------------------- days at the floor


def test_days_at_floor_count_each_night_and_restart_on_access(conn):
    insert_memories(conn, [_memory("faded", idle_days=400), _memory("fresh", idle_days=1)], actor="test")
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(), actor="test")
    faded = conn.execute("SELECT id FROM memories WHERE content LIKE 'faded:%'").fetchone()["id"]
    for i in range(4):
        retention.score(conn, as_of(NIGHT0 + timedelta(days=i)), CONFIG)
        assert _rows(conn, NIGHT0 + timedelta(days=i))["faded"]["days_at_floor"] == i + 1
        assert _rows(conn, NIGHT0 + timedelta(days=i))["fresh"]["days_at_floor"] == 0
    # The same night again, and an older night after a newer one: nothing changes.
    before = _rows(conn, NIGHT0 + timedelta(days=3))["faded"]
    assert retention.score(conn, as_of(NIGHT0 + timedelta(days=3)), CONFIG).scored == 0
    assert retention.score(conn, as_of(NIGHT0 + timedelta(days=1)), CONFIG).scored == 0
    assert _rows(conn, NIGHT0 + timedelta(days=3))["faded"] == before
    # A skipped night still counts (nothing touched it in between).
    retention.score(conn, as_of(NIGHT0 + timedelta(days=5)), CONFIG)
    assert _rows(conn, NIGHT0 + timedelta(days=5))["faded"]["days_at_floor"] == 6
    # Used on day 6: the count restarts.
    client.record_access("u1", [faded], now=as_of(NIGHT0 + timedelta(days=5)) + timedelta(hours=10))
    retention.score(conn, as_of(NIGHT0 + timedelta(days=6)), CONFIG)
    row = _rows(conn, NIGHT0 + timedelta(days=6))["faded"]
    assert (row["days_at_floor"], row["at_floor"], row["floor_since"]) == (0, False, None)
    assert row["score"] > 0.9


def test_an_access_restarts_the_streak_even_when_the_score_stays_at_floor(conn):
    # A floor so high that even a just-used memory is "at" it: only the access can restart the count.
    config = CONFIG.model_copy(update={"episodic_floor": 0.99})
    insert_memories(conn, [_memory("flat", idle_days=400)], actor="test")
    mid = conn.execute("SELECT id FROM memories").fetchone()["id"]
    for i in range(3):
        retention.score(conn, as_of(NIGHT0 + timedelta(days=i)), config)
    assert _rows(conn, NIGHT0 + timedelta(days=2))["flat"]["days_at_floor"] == 3
    conn.execute(
        "UPDATE memories SET last_accessed_at = %s WHERE id = %s",
        (as_of(NIGHT0 + timedelta(days=2)) + timedelta(hours=1), mid),
    )
    retention.score(conn, as_of(NIGHT0 + timedelta(days=3)), config)
    assert _rows(conn, NIGHT0 + timedelta(days=3))["flat"]["days_at_floor"] == 1


# --------------------------------------------------------------------------- policies


def _services(local_store) -> ArchivalServices:
    return archival_services(local_store)


def _archived(conn) -> dict[str, str]:
    rows = conn.execute("SELECT summary, archive_reason, original_id FROM archived_memories").fetchall()
    labels = {
        r["id"]: r["label"]
        for r in conn.execute("SELECT id, split_part(content, ':', 1) AS label FROM memories").fetchall()
    }
    return {labels.get(r["original_id"], str(r["original_id"])): r["archive_reason"] for r in rows}


def test_retention_policy_archives_after_seven_nights_at_floor_and_not_before(conn, local_store):
    mems = [
        _memory("faded", idle_days=400),
        _memory("core_faded", idle_days=4000, category="core"),
        _memory("pinned_faded", idle_days=400, pinned=True),
        _memory("recent", idle_days=3),
        _memory("procedural_ancient", idle_days=4000, category="procedural"),
    ]
    ids = {m["content"].split(":")[0]: m["id"] for m in mems}
    insert_memories(conn, mems, actor="test")
    # exempt_categories emptied: core is still never archived by the retention policy.
    criteria = ArchivalCriteria(policy="retention", exempt_categories=())
    for i in range(6):
        night = NIGHT0 + timedelta(days=i)
        report = nights.run_night(conn, _services(local_store), criteria, night, TZ)
        assert report.ok and report.archived == 0, (night, report.problem)
        assert _rows(conn, night)["faded"]["days_at_floor"] == i + 1
    seventh = NIGHT0 + timedelta(days=6)
    assert select_eligible(conn, criteria, as_of(seventh - timedelta(days=1)), limit=10) == []
    retention.score(conn, as_of(seventh), CONFIG)
    assert [(r["id"], r["reason"]) for r in select_eligible(conn, criteria, as_of(seventh), limit=10)] == [
        (ids["faded"], REASON_RETENTION)
    ]
    report = nights.run_night(conn, _services(local_store), criteria, seventh, TZ)
    assert report.ok and report.archived == 1
    reasons = conn.execute("SELECT original_id, archive_reason FROM archived_memories").fetchall()
    assert [(r["original_id"], r["archive_reason"]) for r in reasons] == [(ids["faded"], REASON_RETENTION)]
    hot = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
    assert hot == set(ids.values()) - {ids["faded"]}
    assert _rows(conn, seventh)["core_faded"]["days_at_floor"] == 7  # at the floor all along, still hot
    # Its retention row went with the original.
    assert (
        conn.execute(
            "SELECT count(*) AS n FROM memory_retention WHERE memory_id = %s", (ids["faded"],)
        ).fetchone()["n"]
        == 0
    )


def test_default_policy_is_adr004_and_ignores_the_floor(conn):
    assert ArchivalCriteria().policy == "adr004" and Settings.from_env({}).archival.policy == "adr004"
    # At the floor for 10 nights but only 60 days old: the adr004 policy keeps it (min_age_days = 90).
    insert_memories(
        conn,
        [
            _memory("faded_young", idle_days=60, importance_score=0.1),
            _memory("old_unimportant", idle_days=120, importance_score=0.1),
        ],
        actor="test",
    )
    config = CONFIG.model_copy(update={"episodic_half_life_days": 1.0})
    for i in range(10):
        retention.score(conn, as_of(NIGHT0 + timedelta(days=i)), config)
    night = as_of(NIGHT0 + timedelta(days=9))
    assert _rows(conn, NIGHT0 + timedelta(days=9))["faded_young"]["days_at_floor"] == 10
    labels = {
        r["id"]: r["label"]
        for r in conn.execute("SELECT id, split_part(content, ':', 1) AS label FROM memories").fetchall()
    }
    default = {
        labels[r["id"]]: r["reason"] for r in select_eligible(conn, ArchivalCriteria(), night, limit=10)
    }
    assert default == {"old_unimportant": "stale_low_importance"}
    by_retention = select_eligible(conn, ArchivalCriteria(policy="retention"), night, limit=10)
    assert {labels[r["id"]] for r in by_retention} == {"faded_young", "old_unimportant"}


@pytest.mark.parametrize("policy", ["adr004", "retention"])
def test_superseded_memory_is_archived_the_next_night_with_reason_superseded(conn, local_store, policy):
    settings = Settings()
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=settings, actor="test")
    day = NIGHT0
    start = as_of(day) - timedelta(hours=15)  # 09:00 on NIGHT0
    old = client.add("u1", "User prefers cortado in the morning", now=start)
    new = client.add(
        "u1",
        "User prefers flat white in the morning",
        supersedes=old.memory_id,
        now=start + timedelta(hours=6),
    )
    assert new.outcome == "superseded" and new.previous_id == old.memory_id
    criteria = ArchivalCriteria(policy=policy)
    # The night before it was superseded archives nothing.
    report = nights.run_night(conn, _services(local_store), criteria, day - timedelta(days=1), TZ)
    assert report.archived == 0
    report = nights.run_night(conn, _services(local_store), criteria, day, TZ)
    assert report.ok and report.archived == 1, report.problem
    row = conn.execute(
        "SELECT original_id, archive_reason, original_superseded_by FROM archived_memories"
    ).fetchone()
    assert (row["original_id"], row["archive_reason"], row["original_superseded_by"]) == (
        old.memory_id,
        REASON_SUPERSEDED,
        new.memory_id,
    )
    assert [r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()] == [new.memory_id]


def test_superseded_memories_come_first_in_a_full_batch(conn):
    settings = Settings()
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=settings, actor="test")
    insert_memories(conn, make_memories(5, dim=TEST_DIM, now=as_of(NIGHT0), importance=0.0), actor="test")
    old = client.add("u1", "User prefers cortado in the morning", now=as_of(NIGHT0) - timedelta(hours=5))
    new = client.add(
        "u1",
        "User prefers flat white in the morning",
        supersedes=old.memory_id,
        now=as_of(NIGHT0) - timedelta(hours=4),
    )
    rows = select_eligible(conn, ArchivalCriteria(), as_of(NIGHT0), limit=1)
    assert [(r["id"], r["reason"]) for r in rows] == [(new.previous_id, REASON_SUPERSEDED)]


# --------------------------------------------------------------------------- the asset


def _metadata(instance, night: date) -> dict:
    events = instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("retention_scores"), asset_partitions=[night.isoformat()]
        ),
        limit=10,
    ).records
    assert len(events) == 1, f"{night}: {len(events)} materializations"
    return {k: v.value for k, v in events[0].asset_materialization.metadata.items()}


def test_asset_materializes_each_night_with_its_own_numbers_in_one_ranged_run(conn, db_url):
    assert SLOW_PATH.timezone == TZ
    insert_memories(
        conn,
        [_memory("faded", idle_days=400), _memory("core_faded", idle_days=4000, category="core")],
        actor="test",
    )
    # A memory written during the second night: not counted on the first.
    insert_memories(conn, [_memory("new", idle_days=-0.5)], actor="test")
    instance = dg.DagsterInstance.ephemeral()
    res = {
        "database": DatabaseResource(database_url=db_url),
        "archival": ArchivalCriteriaResource(policy="retention"),
    }
    first, second = NIGHT0, NIGHT0 + timedelta(days=1)
    # One run over both nights (as a backfill runs them): each night still gets its own numbers.
    result = dg.materialize(
        [retention_scores],
        resources=res,
        instance=instance,
        tags={
            "dagster/asset_partition_range_start": first.isoformat(),
            "dagster/asset_partition_range_end": second.isoformat(),
        },
    )
    assert result.success
    m1, m2 = _metadata(instance, first), _metadata(instance, second)
    assert (m1["scored"], m2["scored"]) == (2, 3)
    # No tiers: the step runs before its run archives any night (archive_rows and stub_conversions have them).
    assert not {"hot_memories", "archived_memories", "tiers_by_user"} & (set(m1) | set(m2))
    assert m1["scores_of"] == "the memories hot when this run scored them, created by the end of the night"
    assert m2["scores_of"].startswith(
        m1["scores_of"] + f"; this run scores {first}..{second} before archiving"
    )
    assert (m1["at_floor"], m2["at_floor"]) == (2, 2)
    assert m1["policy"] == "retention"
    # Buckets: one score at 0.02, one at 0.60 on the first night; the new memory adds one near 1.0.
    assert m1["retention_00_10"] == 1 and m1["retention_60_70"] == 1 and m1["retention_90_100"] == 0
    assert m2["retention_90_100"] == 1
    assert sum(m1[f"retention_{i * 10:02d}_{(i + 1) * 10:02d}"] for i in range(10)) == m1["scored"]
    assert m1["retention_p50"] == pytest.approx(0.31)


def test_a_superseded_memory_used_since_is_not_sent_back(conn):
    """A superseded memory re-promoted by its expansions (each an access) stays hot the next night."""
    settings = Settings()
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=settings, actor="test")
    old = client.add("u1", "User prefers cortado in the morning", now=as_of(NIGHT0) - timedelta(hours=9))
    client.add(
        "u1",
        "User prefers flat white in the morning",
        supersedes=old.memory_id,
        now=as_of(NIGHT0) - timedelta(hours=8),
    )
    assert [r["reason"] for r in select_eligible(conn, ArchivalCriteria(), as_of(NIGHT0), limit=5)] == [
        REASON_SUPERSEDED
    ]
    client.record_access("u1", [old.memory_id], now=as_of(NIGHT0) - timedelta(hours=2))
    assert select_eligible(conn, ArchivalCriteria(), as_of(NIGHT0), limit=5) == []


def test_tier_counts_count_an_archive_row_from_its_batchs_night_whenever_the_batch_ran(
    conn, history, local_store
):
    """A backfill archives past nights today: each night's tiers still include its own archival (the
    batch's as_of), not none of it (archived_at, the claim's time, is today for every backfilled night)."""
    from memory_lib.archival.pipeline import run_batch
    from testing.dagster_helpers import last_night

    night = last_night()
    services = archival_services(local_store)
    report = run_batch(
        conn,
        services,
        ArchivalCriteria(),
        batch_key=nights.batch_key_for(night),
        as_of=nights.night_as_of(night, TZ),
        actor="test",
    )
    assert report.archived > 0
    row = conn.execute("SELECT min(archived_at) AS at, count(*) AS n FROM archived_memories").fetchone()
    assert row["at"] > nights.night_as_of(night, TZ) + timedelta(days=30) and row["n"] == report.archived
    every = len(history)
    after = retention.tier_counts(conn, nights.night_as_of(night, TZ))
    assert (after.hot, after.archived, after.stub) == (every - report.archived, report.archived, 0)
    before = retention.tier_counts(conn, nights.night_as_of(night - timedelta(days=1), TZ))
    created_by_then = conn.execute(
        """SELECT (SELECT count(*) FROM memories WHERE created_at <= %(t)s)
                  + (SELECT count(*) FROM archived_memories WHERE original_created_at <= %(t)s) AS n""",
        {"t": nights.night_as_of(night - timedelta(days=1), TZ)},
    ).fetchone()["n"]
    assert (before.hot, before.archived) == (created_by_then, 0)
