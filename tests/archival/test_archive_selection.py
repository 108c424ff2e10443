"""Which memories are eligible, in which order, and that claims are idempotent and disjoint."""

from __future__ import annotations

import threading
import zlib
from datetime import timedelta

import psycopg
import pytest

from memory_lib.archival.claims import claim_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.errors import InvalidInputError
from memory_lib.lifecycle.eligibility import (
    REASON_FORCE_AGE,
    REASON_LOW_IMPORTANCE,
    eligible_counts,
    select_eligible,
)
from memory_lib.storage.db import connect
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.factories import NOW, make_memories


def _one(label: str, **fields):
    # A stable seed per label: hash() of a str changes with every process (PYTHONHASHSEED), and two labels
    # of nine sharing hash % 1000 (a few % of runs) gave two cases the same id.
    mem = make_memories(
        1, dim=TEST_DIM, seed=zlib.crc32(label.encode()), access_count=0, last_accessed_at=None
    )[0]
    mem.update(fields, content=f"{label}: a memory about Project Quill and Lucia Romero.")
    return label, mem


CASES = dict(
    [
        _one("young", created_at=NOW - timedelta(days=89), importance_score=0.1),
        _one("old_unimportant", created_at=NOW - timedelta(days=91), importance_score=0.3),
        _one("old_important", created_at=NOW - timedelta(days=200), importance_score=0.31),
        _one("ancient_important", created_at=NOW - timedelta(days=366), importance_score=0.9),
        _one("pinned", created_at=NOW - timedelta(days=400), importance_score=0.0, pinned=True),
        _one("core", created_at=NOW - timedelta(days=400), importance_score=0.0, category="core"),
        _one(
            "in_use",
            created_at=NOW - timedelta(days=200),
            importance_score=0.1,
            access_count=3,
            last_accessed_at=NOW - timedelta(days=2),
        ),
        _one(
            "used_long_ago",
            created_at=NOW - timedelta(days=200),
            importance_score=0.1,
            access_count=9,
            last_accessed_at=NOW - timedelta(days=60),
        ),
        _one(
            "used_twice_recently",
            created_at=NOW - timedelta(days=200),
            importance_score=0.05,
            access_count=2,
            last_accessed_at=NOW - timedelta(days=1),
        ),
    ]
)
EXPECTED = {
    "old_unimportant": REASON_LOW_IMPORTANCE,
    "ancient_important": REASON_FORCE_AGE,
    "used_long_ago": REASON_LOW_IMPORTANCE,
    "used_twice_recently": REASON_LOW_IMPORTANCE,
}


def test_seed_criteria_select_exactly_the_cold_memories(conn):
    insert_memories(conn, CASES.values(), actor="test")
    label_of = {m["id"]: label for label, m in CASES.items()}
    rows = select_eligible(conn, ArchivalCriteria(), NOW, limit=100)
    assert {label_of[r["id"]]: r["reason"] for r in rows} == EXPECTED
    # Lowest importance first, then oldest.
    assert [label_of[r["id"]] for r in rows] == [
        "used_twice_recently",
        "used_long_ago",
        "old_unimportant",
        "ancient_important",
    ]
    assert eligible_counts(conn, ArchivalCriteria(), NOW) == {REASON_LOW_IMPORTANCE: 3, REASON_FORCE_AGE: 1}


def test_thresholds_come_from_the_criteria(conn):
    insert_memories(conn, CASES.values(), actor="test")
    strict = ArchivalCriteria(min_age_days=150, max_importance_score=0.2, exempt_categories=())
    label_of = {m["id"]: label for label, m in CASES.items()}
    got = {label_of[r["id"]] for r in select_eligible(conn, strict, NOW, limit=100)}
    assert got == {"ancient_important", "core", "used_long_ago", "used_twice_recently"}


def test_claim_is_idempotent_and_capped(conn):
    insert_memories(conn, make_memories(30, dim=TEST_DIM), actor="test")
    criteria = ArchivalCriteria(batch_size=10)
    first = claim_batch(conn, "night-1", criteria, NOW)
    again = claim_batch(conn, "night-1", criteria, NOW)
    assert first.newly_claimed and not again.newly_claimed
    assert first.claimed == again.claimed == 10
    assert conn.execute("SELECT count(*) AS n FROM archival_attempts").fetchone()["n"] == 10
    second = claim_batch(conn, "night-2", criteria, NOW)
    ids = conn.execute("SELECT batch_key, memory_id FROM archival_attempts").fetchall()
    assert second.claimed == 10 and len({r["memory_id"] for r in ids}) == 20  # never the same memory twice
    with pytest.raises(InvalidInputError, match="limit"):
        claim_batch(conn, "night-3", criteria, NOW, limit=11)


def test_concurrent_claims_never_share_a_memory(db_url):
    conn = connect(db_url)
    insert_memories(conn, make_memories(120, dim=TEST_DIM), actor="test")
    criteria = ArchivalCriteria(batch_size=50)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def claim(key: str) -> None:
        with connect(db_url) as c:
            barrier.wait()
            try:
                claim_batch(c, key, criteria, NOW)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

    threads = [threading.Thread(target=claim, args=(f"run-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    rows = conn.execute("SELECT memory_id, count(*) AS n FROM archival_attempts GROUP BY 1").fetchall()
    assert all(r["n"] == 1 for r in rows)
    assert len(rows) == 120  # 4 claimers x 50 cap over 120 eligible: all claimed, none twice
    conn.close()


def test_open_attempts_are_unique_per_memory_in_the_schema(conn):
    (mem,) = make_memories(1, dim=TEST_DIM)
    insert_memories(conn, [mem], actor="test")
    claim_batch(conn, "a", ArchivalCriteria(), NOW)
    conn.execute(
        "INSERT INTO archival_batches (batch_key, as_of, criteria, claimed_count) VALUES ('b', now(), '{}', 0)"
    )
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO archival_attempts (batch_key, memory_id, user_id, archive_reason) VALUES ('b', %s, %s, 'force_age')",
            (mem["id"], mem["user_id"]),
        )
