"""On a Citus cluster (TEST_CITUS_*: testing.citus), expand, re-promotion, restore (one, a user, all) and
forget (one memory, a user) run each user's work on that user's worker: every statement they send that
reads or writes a distributed table is a router query (one task, no subplan). Each statement is explained
just before it runs, in its plan's transaction, with its values bound client-side (Citus 13.2 refuses the
EXPLAIN of a statement with server-side parameters on a worker). Skipped without the cluster: one node
has no shards to route to."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from memory_lib.client import MemoryClient
from memory_lib.core.config import Settings
from memory_lib.lifecycle.restore import restore_archive, restore_archives
from memory_lib.llm.embedding import HashingEmbedder
from testing.citus import PlanRecorder, citus_urls
from testing.constants import TEST_DIM
from testing.factories import archive_cleanly

pytestmark = pytest.mark.skipif(
    citus_urls() is None,
    reason="reads Citus plans: needs the Citus cluster (TEST_CITUS_ADMIN_URL, TEST_CITUS_URL)",
)

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)


@pytest.fixture
def explained(monkeypatch: pytest.MonkeyPatch) -> PlanRecorder:
    return PlanRecorder().install(monkeypatch)


def _router(plan: str) -> bool:
    """One task on one node (Task Count: 1, or the router executor), or a statement Citus does not
    distribute at all (a function, a reference or coordinator-local table read)."""
    if "Citus" not in plan:
        return True
    return "Distributed Subplan" not in plan and re.findall(r"Task Count: (\d+)", plan) == ["1"]


def _assert_router(statements: list[tuple[str, str | None]], *must_touch: str) -> None:
    plans = [(q, p) for q, p in statements if p is not None]
    assert plans, "no statement was explained"
    bad = [(" ".join(q.split())[:200], p) for q, p in plans if not _router(p)]
    assert not bad, "\n\n".join(f"{q}\n{p}" for q, p in bad)
    for table in must_touch:
        assert any(table in q for q, _ in plans), f"no statement touched {table}"


def _client(conn: Any, store: Any) -> MemoryClient:
    return MemoryClient(
        conn, embedder=HashingEmbedder(TEST_DIM), object_store=store, settings=Settings(), actor="test"
    )


def _archive(conn: Any, store: Any, client: MemoryClient, user: str, n: int) -> list[Any]:
    """`n` memories of `user` archived (and one hot memory each of two other users, on other shards)."""
    ids = [
        client.add(user, f"{user} note {i}: the parcel went to depot {i}", importance=0.1, now=OLD).memory_id
        for i in range(n)
    ]
    for other in ("other-a", "other-b"):
        client.add(other, f"{other}'s note on the depot", importance=0.1, now=OLD)
    archive_cleanly(conn, store, as_of=NOW)
    return ids


def _archive_id(conn: Any, original_id: Any) -> Any:
    row = conn.execute("SELECT id FROM archived_memories WHERE original_id = %s", (original_id,)).fetchone()
    assert row is not None
    return row["id"]


def test_expand_and_re_promotion_are_router_queries(conn, local_store, explained: PlanRecorder) -> None:
    client = _client(conn, local_store)
    (memory_id,) = _archive(conn, local_store, client, "u1", 1)
    archive_id = _archive_id(conn, memory_id)
    explained.take()
    for day in (1, 2):
        assert not client.expand("u1", archive_id, now=NOW + timedelta(days=day)).promoted
    _assert_router(explained.take(), "archived_memories", "memory_events")
    assert client.expand("u1", archive_id, now=NOW + timedelta(days=3)).promoted  # the third: re-promoted
    _assert_router(explained.take(), "INSERT INTO memories", "DELETE FROM archived_memories")


def test_restore_one_a_user_and_all_are_router_queries(conn, local_store, explained: PlanRecorder) -> None:
    client = _client(conn, local_store)
    mine = _archive(conn, local_store, client, "u1", 3)
    theirs = _archive(conn, local_store, client, "u2", 2)
    explained.take()
    assert restore_archive(conn, local_store, user_id="u1", original_id=mine[0], actor="test").restored
    _assert_router(explained.take(), "FOR UPDATE", "INSERT INTO memories")
    report = restore_archives(conn, local_store, actor="test", user_id="u1", pause_archival=False)
    assert report.restored == 2
    _assert_router(explained.take(), "FOR UPDATE", "DELETE FROM archived_memories")
    report = restore_archives(conn, local_store, actor="test", all_archives=True, pause_archival=False)
    assert report.restored == len(theirs) + 2  # u2's and the other users' (archived with them)
    _assert_router(explained.take(), "FOR UPDATE", "DELETE FROM archived_memories")


def test_forget_one_memory_and_a_user_are_router_queries(conn, local_store, explained: PlanRecorder) -> None:
    client = _client(conn, local_store)
    archived = _archive(conn, local_store, client, "u1", 2)
    hot = client.add("u1", "a hot note of u1 about the depot", now=NOW).memory_id
    explained.take()
    client.forget("u1", archived[0])
    _assert_router(explained.take(), "forget_requests", "redact_memory_events", "DELETE FROM memories")
    client.forget_user("u1")
    _assert_router(
        explained.take(), "forget_requests", "redact_memory_events", "DELETE FROM archived_memories"
    )
    assert conn.execute("SELECT count(*) AS n FROM memories WHERE id = %s", (hot,)).fetchone()["n"] == 0


def test_retention_scoring_runs_on_the_users_shards_in_one_step(conn) -> None:
    """A night's statement for a batch of users is one distributed step: each shard's task joins its
    own rows (Citus 13.2 does not prune an UPDATE ... FROM by `user_id = ANY`: a task per shard, an
    index lookup where the batch has no user), no subplan through the coordinator."""
    from memory_lib.core.config import RetentionConfig
    from memory_lib.lifecycle import retention
    from memory_lib.storage.store import insert_memories
    from testing.factories import make_memories

    users = ("u1", "u2", "u3")
    insert_memories(conn, make_memories(6, dim=TEST_DIM, users=users, now=NOW, age_days=10), actor="test")
    config = RetentionConfig()
    params = retention.category_params(config) | {
        "as_of": NOW,
        "boost": config.retrieval_boost,
        "tol": config.floor_tolerance,
        "tz": "UTC",
    }
    cur = psycopg.ClientCursor(conn, row_factory=dict_row)

    def plan(batch: list[str]) -> str:
        rows = cur.execute("EXPLAIN (COSTS OFF) " + retention._SCORE_SQL, params | {"users": batch})
        return "\n".join(r["QUERY PLAN"] for r in rows.fetchall())

    for batch in (["u1"], list(users)):
        text = plan(batch)
        assert "Distributed Subplan" not in text and "Update on memory_retention_" in text, text
    assert retention.score(conn, NOW, config).scored == 6
