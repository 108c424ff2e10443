"""Archived summaries keep binary-quantized vectors (migration 007): still found, still exact on the way back.

Real Postgres + pgvector, real archival (offline summarizer, hashing embedder), a local object store.
"""

from __future__ import annotations

import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from memory_lib.archival import pipeline
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria, Settings
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.db import MIGRATIONS_DIR, connect, migrate
from testing.constants import TEST_DIM
from testing.explain import search_statement_tier
from testing.factories import archival_services, make_client

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=400)
OLD_FACTS = [
    "Paid 142.80 EUR to Vattenfall for the electricity bill of February.",
    "Booked the dentist, Dr. Okafor, for a cleaning on April 2.",
    "Lent my bike to Tomasz for his triathlon training.",
    "The plumber replaced the kitchen tap for 95 EUR.",
    "Passport renewal appointment at the consulate on Friday morning.",
    "Planted tulip bulbs along the garden fence in October.",
    "Grandma's lasagna recipe uses nutmeg in the bechamel.",
    "Car insurance with Allianz renews every March for 610 EUR.",
]
RECENT = [
    "Bought oat milk at the corner shop.",
    "Team standup moved to 9:30 on Mondays.",
    "Ran 8 km along the river before work.",
]


def _fill_and_archive(conn, store, *, probe: bool = True) -> dict[str, uuid.UUID]:
    """OLD_FACTS archived by run_batch; probe=False: by its stages up to the commit, without the
    post-commit stage, whose retrievability probe searches with today's SQL (a schema before 007 lacks
    its column)."""
    client = make_client(conn, store, actor="t")
    ids = {
        t: client.add("u1", t, importance=0.1, now=OLD + timedelta(days=i)).memory_id
        for i, t in enumerate(OLD_FACTS)
    }
    for i, t in enumerate(RECENT):
        client.add("u1", t, now=NOW - timedelta(days=i))
    services = archival_services(store)
    criteria, key = ArchivalCriteria(), "night-1"
    if probe:
        report = run_batch(conn, services, criteria, batch_key=key, as_of=NOW, actor="test")
        assert report.gate_passed and report.status.archived == len(OLD_FACTS)
        return ids
    pipeline.claim_stage(conn, key, criteria, NOW)
    pipeline.summarize_stage(conn, key, services.summarizer, services.embedder, criteria)
    pipeline.backup_stage(conn, key, store, criteria)
    assert pipeline.fidelity_stage(conn, key, store, criteria, actor="test").passed
    commit = pipeline.commit_stage(conn, key, store, criteria, actor="test")
    assert commit.results[0].succeeded == len(OLD_FACTS)
    return ids


def _assert_found_first(conn, store, ids: dict[str, uuid.UUID]) -> None:
    client = make_client(conn, store, actor="t")
    for text, memory_id in ids.items():
        result = client.search("u1", text, phase2="always", now=NOW)
        top = result.hits[0]
        assert top.provenance.memory_id == memory_id and top.source == "archived", (
            text,
            [h.text for h in result],
        )
        # The vector arm on its own puts it first too: its estimated cosine is the best of the archived.
        archived = [h for h in result.hits if h.source == "archived"]
        assert top.scores.similarity == max(h.scores.similarity for h in archived) > 0.5


def test_an_archived_memory_is_found_first_by_its_own_sentence(conn, local_store):
    ids = _fill_and_archive(conn, local_store)
    _assert_found_first(conn, local_store, ids)


def test_rows_keep_only_the_bits_of_the_summary_embedding(conn, local_store):
    _fill_and_archive(conn, local_store)
    rows = conn.execute(
        "SELECT summary, summary_embedding, summary_bits::text AS bits FROM archived_memories"
    ).fetchall()
    assert len(rows) == len(OLD_FACTS)
    vecs = HashingEmbedder(TEST_DIM).embed([r["summary"] for r in rows])
    for row, vec in zip(rows, vecs, strict=True):
        assert row["summary_embedding"] is None  # the halfvec is not kept at rest
        assert row["bits"] == "".join("1" if x > 0 else "0" for x in vec)  # binary_quantize: the signs
    # No HNSW over halfvec is left; the bit index is used by phase 2's vector arm.
    indexes = {
        r["indexname"]
        for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'archived_memories'")
    }
    assert "archived_summary_bits_hnsw" in indexes and "archived_summary_hnsw" not in indexes
    # One transaction, rolled back by the violation: the trigger is never left disabled (a Citus pass
    # reuses its databases). Citus alters a distributed table's triggers only with unsafe triggers on.
    with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():  # nothing parks a halfvec
        conn.execute("SET LOCAL citus.enable_unsafe_triggers = on")
        conn.execute("ALTER TABLE archived_memories DISABLE TRIGGER archived_memories_quantize")
        conn.execute(
            f"UPDATE archived_memories SET summary_embedding = array_fill(0.5, ARRAY[{TEST_DIM}])::halfvec"
        )


def test_expand_and_restore_are_byte_exact(conn, local_store):
    ids = _fill_and_archive(conn, local_store)
    client = make_client(conn, local_store, actor="t")
    text = OLD_FACTS[3]
    arch = conn.execute("SELECT id FROM archived_memories WHERE original_id = %s", (ids[text],)).fetchone()
    exp = client.expand("u1", arch["id"], now=NOW)
    expected = HashingEmbedder(TEST_DIM).embed([text])[0]
    assert exp.content == text and np.array_equal(exp.original.embedding_array(), expected)
    assert client.restore("u1", archive_id=arch["id"], now=NOW).restored
    row = conn.execute("SELECT content, embedding FROM memories WHERE id = %s", (ids[text],)).fetchone()
    assert row["content"] == text and np.array_equal(np.asarray(row["embedding"].to_numpy()), expected)


def test_upgrade_to_007_keeps_archived_rows_searchable(databases, tmp_path, local_store):
    url = databases.new_empty("up")
    try:
        old = tmp_path / "sql"
        old.mkdir()
        for path in sorted(Path(str(MIGRATIONS_DIR)).iterdir()):
            # Every migration but 007 (and 011, stubs, which alters its column): today's archival code
            # writes halfvec rows as before 007.
            if path.name[0].isdigit() and path.name.endswith(".sql") and int(path.name[:3]) not in (7, 11):
                shutil.copy(path, old / path.name)
        migrate(url, embedding_dim=TEST_DIM, directory=old)
        with connect(url) as conn:
            ids = _fill_and_archive(conn, local_store, probe=False)  # archived without 007: halfvec rows
            before = conn.execute(
                "SELECT original_id, binary_quantize(summary_embedding)::text AS bits FROM archived_memories"
            ).fetchall()
            assert all(r["bits"] and len(r["bits"]) == TEST_DIM for r in before)
        assert migrate(url, embedding_dim=TEST_DIM) == ["007_binary_summary_vectors", "011_stubs"]
        with connect(url) as conn:
            after = {
                r["original_id"]: r
                for r in conn.execute(
                    "SELECT original_id, summary_bits::text AS bits, summary_embedding FROM archived_memories"
                )
            }
            assert {r["original_id"]: r["bits"] for r in before} == {k: r["bits"] for k, r in after.items()}
            assert all(r["summary_embedding"] is None for r in after.values())
            _assert_found_first(conn, local_store, ids)
    finally:
        databases.drop(url)


def _plan_statements(conn, plan) -> tuple[Any, list[str]]:
    """Run a search plan, recording the search statements it sent."""
    from memory_lib.core.plans import Sql, run_plan

    sent: list[str] = []

    def spy():
        op = next(plan)
        try:
            while True:
                if isinstance(op, Sql) and (tier := search_statement_tier(op.query)) is not None:
                    sent.append(tier)
                op = plan.send((yield op))
        except StopIteration as stop:
            return stop.value

    return run_plan(conn, spy()), sent


@pytest.mark.parametrize(
    "query", [OLD_FACTS[0], "electricity bill", "who borrowed my bike?", "Mondays standup"]
)
def test_one_statement_for_both_tiers_returns_the_same_hits(conn, local_store, query):
    from memory_lib.retrieval.search import search_plan
    from memory_lib.retrieval.types import SearchRequest

    _fill_and_archive(conn, local_store)
    vec = HashingEmbedder(TEST_DIM).embed([query])[0]
    request = SearchRequest(
        user_id="u1",
        query=query,
        embedding=vec,
        config=Settings().retrieval,
        now=NOW,
        phase2="always",
        embedder_kind="lexical",
    )
    one, sent_one = _plan_statements(conn, search_plan(request, one_statement=True))
    two, sent_two = _plan_statements(conn, search_plan(request, one_statement=False))
    assert sent_one == ["both"] and sent_two == ["hot", "archived"]
    assert [(h.source, h.provenance.memory_id, h.scores) for h in one.hits] == [
        (h.source, h.provenance.memory_id, h.scores) for h in two.hits
    ]
    assert (one.phase2_reason, one.hot_candidates, one.archived_candidates) == (
        two.phase2_reason,
        two.hot_candidates,
        two.archived_candidates,
    )
    assert any(h.source == "archived" for h in one.hits)
