"""On Citus, a user's add and update run on that user's worker: every statement they send that reads or
writes a distributed table is a router query (one task, no subplans), and all of them go to the same
worker. Each statement is explained (EXPLAIN, FORMAT JSON) just before it runs, in the plan's own
transaction, with the values it runs with, bound client-side: Citus 13.2 sends a worker the EXPLAIN of a
statement with server-side parameters in a form it refuses, which aborts the transaction."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memory_lib.client import MemoryClient
from memory_lib.core.config import ChunkingConfig, LLMConfig, Settings, WriteConfig
from memory_lib.llm.embedding import HashingEmbedder
from testing.citus import PlanRecorder, citus_urls
from testing.constants import TEST_DIM
from testing.fake_llm import FAKE_API_KEY

pytestmark = pytest.mark.skipif(citus_urls() is None, reason="reads Citus plans: needs the Citus pass")

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def explained(monkeypatch: pytest.MonkeyPatch) -> PlanRecorder:
    return PlanRecorder("json").install(monkeypatch)


def _distributed_tables(conn) -> set[str]:
    rows = conn.execute(
        "SELECT logicalrelid::regclass::text AS t FROM pg_dist_partition WHERE partmethod = 'h'"
    )
    return {r["t"] for r in rows}


def _citus_scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan] if plan.get("Custom Plan Provider", "").startswith("Citus") else []
    for child in plan.get("Plans", []):
        found += _citus_scans(child)
    return found


def _per_user(explained: PlanRecorder, tables: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """The explained statements that name a distributed (per-user) table."""
    names = re.compile(r"\b(" + "|".join(sorted(tables)) + r")\b")
    return [(q, p) for q, p in explained.statements if p is not None and names.search(q)]


def _assert_router(statements: list[tuple[str, dict[str, Any]]]) -> None:
    """Each statement: one Citus scan, one task, no subplans; all of them on one worker."""
    nodes = set()
    for query, plan in statements:
        scans = _citus_scans(plan)
        assert len(scans) == 1, f"not one distributed scan: {query}"
        job = scans[0]["Distributed Query"]
        assert job["Job"]["Task Count"] == 1, f"multi-shard ({job['Job']['Task Count']} tasks): {query}"
        assert not job.get("Subplans"), f"distributed subplans: {query}"
        nodes |= {task["Node"] for task in job["Job"].get("Tasks", [])}
    assert len(nodes) == 1, f"a user's statements ran on {sorted(nodes)}"


def _client(conn, fake_llm, **write: Any) -> MemoryClient:
    settings = Settings(
        llm=LLMConfig(base_url=fake_llm.base_url, max_retries=0, anthropic_api_key=FAKE_API_KEY),
        write=WriteConfig(**write),
        chunking=ChunkingConfig(max_tokens=32, overlap_tokens=4),
    )
    return MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=settings, actor="test")


def test_every_statement_of_a_users_add_is_a_router_query(conn, fake_llm, explained):
    client = _client(conn, fake_llm, state_rule=True)
    tables = _distributed_tables(conn)
    client.add("other", "Prefers green tea in the morning", now=T0)  # the model bound; another user's rows
    explained.statements.clear()

    first = client.add("u", "Lives in Lisbon", ttl_days=30, now=T0)  # created
    assert first.outcome == "created"
    assert client.add("u", "lives in  LISBON", now=T0).outcome == "duplicate"
    judged = client.add(
        "u", "Lives in Porto", now=T0 + timedelta(minutes=1)
    )  # the judge's candidates, its verdict
    assert judged.outcome == "superseded" and judged.reason == "llm"
    explicit = client.add("u", "Lives in Braga", supersedes=judged.memory_id, now=T0 + timedelta(minutes=2))
    assert explicit.outcome == "superseded" and explicit.reason == "explicit"
    assert client.add("u", "the user lives in Braga", now=T0).outcome == "merged"  # a restatement
    long_text = " ".join(f"Step {i}: tighten bolt number {i} on the left wheel." for i in range(30))
    chunks = client.add("u", long_text, now=T0)
    assert chunks.outcome == "created" and len(chunks.chunk_ids) > 1
    assert client.add("u", long_text, now=T0).outcome == "duplicate"

    statements = _per_user(explained, tables)
    assert {"memories", "memory_events", "llm_usage"} <= {
        t for q, _ in statements for t in tables if re.search(rf"\b{t}\b", q)
    }
    _assert_router(statements)
    # The embedding model is bound once: an add never writes the replicated settings table again.
    assert not [q for q, _ in explained.statements if "INSERT INTO memory_archive_settings" in q]


def test_every_statement_of_a_users_update_is_a_router_query(conn, fake_llm, explained):
    client = _client(conn, fake_llm, judge="off")
    tables = _distributed_tables(conn)
    added = client.add("u", "Prefers cortado", now=T0)
    explained.statements.clear()
    assert client.update("u", added.memory_id, importance=0.9, now=T0).outcome == "updated"
    assert client.update("u", added.memory_id, "Prefers flat white", now=T0).outcome == "superseded"
    _assert_router(_per_user(explained, tables))


@pytest.mark.schema_changing  # a re-embedding
def test_the_dual_write_of_a_users_add_during_a_reembedding_is_router(conn, explained):
    from memory_lib.lifecycle import reembedding

    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(), actor="test")
    tables = _distributed_tables(conn)
    client.add("u", "Waters the fern every Sunday", now=T0)
    reembedding.start(conn, HashingEmbedder(96).model, 96, actor="test")
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM), settings=Settings(), actor="test")
    explained.statements.clear()
    added = client.add("u", "Feeds the cat at seven", now=T0)
    row = conn.execute(
        "SELECT embedding_model_next FROM memories WHERE id = %s", (added.memory_id,)
    ).fetchone()
    assert row is not None and row["embedding_model_next"] == HashingEmbedder(96).model  # dual-written
    assert [q for q, _ in explained.statements if "embedding_next" in q]
    _assert_router(_per_user(explained, tables))
