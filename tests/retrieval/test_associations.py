"""Reactivation through associations: follow_links surfaces the archived memories hot
hits link to, a use of one counts toward re-promotion under the same rule as expansions, never across users."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from pgvector.psycopg import register_vector_async
from psycopg.rows import dict_row

from memory_lib.client import AsyncMemoryClient, MemoryClient, SearchFilters
from memory_lib.core.config import PromotionConfig, Settings
from memory_lib.lifecycle.promotion import sweep_promotions
from memory_lib.llm.embedding import HashingEmbedder
from testing.constants import TEST_DIM
from testing.factories import archive_cleanly

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
LINKED = "Tiago recommended the kayak rental at Pinhao on the Douro, 35 EUR a day, book by phone."
UNLINKED = "The dentist moved the cleaning appointment to a Tuesday at nine in the morning."
HOT = "Planning the Douro river weekend with Tiago: trains to Pinhao on Saturday."


def _client(conn, store) -> MemoryClient:
    settings = Settings(promotion=PromotionConfig(expansions_to_promote=3, window_days=30))
    return MemoryClient(
        conn, embedder=HashingEmbedder(TEST_DIM), object_store=store, settings=settings, actor="test"
    )


def _archive_id(conn, original_id) -> uuid.UUID:
    row = conn.execute("SELECT id FROM archived_memories WHERE original_id = %s", (original_id,)).fetchone()
    assert row is not None
    return row["id"]


def _setup(conn, store):
    """u1: two archived memories, one of them named by the entity_links of a hot memory."""
    client = _client(conn, store)
    linked = client.add("u1", LINKED, importance=0.1, now=OLD).memory_id
    unlinked = client.add("u1", UNLINKED, importance=0.1, now=OLD).memory_id
    archive_cleanly(conn, store, as_of=NOW)
    hot = client.add("u1", HOT, importance=0.7, entity_links=[linked], now=NOW).memory_id
    return client, hot, linked, unlinked


def test_follow_links_surfaces_linked_archived_memories_labelled_with_the_hot_hit(conn, local_store):
    client, hot, linked, _ = _setup(conn, local_store)
    # phase2="never": the archive is not searched, so an archived memory can only come by association.
    plain = client.search("u1", "Douro weekend trains", phase2="never", now=NOW)
    assert [h.provenance.memory_id for h in plain.hits] == [hot] and plain.associated == []
    result = client.search("u1", "Douro weekend trains", phase2="never", follow_links=True, now=NOW)
    assert [h.provenance.memory_id for h in result.hits] == [hot]
    [assoc] = result.associated
    assert assoc.source == "archived" and assoc.linked_from == hot
    assert assoc.provenance.memory_id == linked and assoc.id == _archive_id(conn, linked)
    assert assoc.labeled_text.startswith(f"[archived, linked from {hot}] ")
    assert assoc.provenance.user_id == "u1" and assoc.scores.final == 0.0
    # Hard filters hold for associated memories too.
    none = client.search(
        "u1",
        "Douro weekend trains",
        phase2="never",
        follow_links=True,
        now=NOW,
        filters=SearchFilters(since=NOW - timedelta(days=30)),
    )
    assert none.associated == []


def test_the_async_client_surfaces_the_same(db_url, conn, local_store):
    client, hot, linked, _ = _setup(conn, local_store)
    sync = client.search("u1", "Douro weekend trains", phase2="never", follow_links=True, now=NOW)

    async def scenario():
        aconn = await psycopg.AsyncConnection.connect(db_url, autocommit=True, row_factory=dict_row)
        await register_vector_async(aconn)
        try:
            aclient = AsyncMemoryClient(
                aconn, embedder=HashingEmbedder(TEST_DIM), object_store=local_store, actor="test"
            )
            off = await aclient.search("u1", "Douro weekend trains", phase2="never", now=NOW)
            on = await aclient.search(
                "u1", "Douro weekend trains", phase2="never", follow_links=True, now=NOW
            )
            return off, on
        finally:
            await aconn.close()

    off, on = asyncio.run(scenario())
    assert off.associated == [] and on.associated == sync.associated
    assert [(h.linked_from, h.provenance.memory_id) for h in on.associated] == [(hot, linked)]


def _link_uses(conn, archive_id) -> list[tuple]:
    rows = conn.execute(
        "SELECT user_id, linked_from FROM archive_link_uses WHERE archive_id = %s ORDER BY id", (archive_id,)
    )
    return [(r["user_id"], r["linked_from"]) for r in rows]


def test_using_a_linked_archived_memory_counts_toward_re_promotion(conn, local_store):
    client, hot, linked, unlinked = _setup(conn, local_store)
    linked_arch, unlinked_arch = _archive_id(conn, linked), _archive_id(conn, unlinked)
    for day in (1, 2, 3):
        result = client.search(
            "u1", "Douro weekend trains", phase2="never", follow_links=True, now=NOW + timedelta(days=day)
        )
        client.record_access("u1", result.associated, now=NOW + timedelta(days=day))
        client.record_access("u1", [unlinked_arch], now=NOW + timedelta(days=day))  # used, but no hot link
    assert _link_uses(conn, linked_arch) == [("u1", hot)] * 3
    assert _link_uses(conn, unlinked_arch) == []
    # The nightly sweep applies the rule (3 uses in 30 days): the linked memory is hot again, the other not.
    report = sweep_promotions(
        conn, local_store, PromotionConfig(), as_of=NOW + timedelta(days=4), actor="test"
    )
    assert report.promoted == [linked_arch] and report.failed == {}
    assert (
        conn.execute("SELECT content FROM memories WHERE id = %s", (linked,)).fetchone()["content"] == LINKED
    )
    assert conn.execute("SELECT 1 FROM memories WHERE id = %s", (unlinked,)).fetchone() is None
    promoted = conn.execute(
        "SELECT details FROM memory_events WHERE memory_id = %s AND event_type = 'promoted'", (linked,)
    ).fetchone()
    assert promoted["details"]["expansions"] == 3
    assert _link_uses(conn, linked_arch) == []  # they went with the archive row


def test_link_uses_and_expansions_are_one_rule(conn, local_store):
    client, hot, linked, _ = _setup(conn, local_store)
    arch = _archive_id(conn, linked)
    client.record_access("u1", [linked], now=NOW + timedelta(days=1))  # by original id
    client.record_access("u1", [arch], now=NOW + timedelta(days=2))
    first = client.expand("u1", arch, now=NOW + timedelta(days=40))  # the two uses are out of the window
    assert first.expansions_in_window == 1 and not first.promoted
    client.record_access("u1", [arch], now=NOW + timedelta(days=41))
    second = client.expand("u1", arch, now=NOW + timedelta(days=42))  # 1 expansion + 1 use + this one
    assert second.expansions_in_window == 3 and second.promoted


def test_links_never_cross_users(conn, local_store):
    client, hot, linked, _ = _setup(conn, local_store)
    arch = _archive_id(conn, linked)
    # u2 links to u1's archived memory by its id (a guessed or leaked id): nothing surfaces, nothing counts.
    u2_hot = client.add("u2", HOT, importance=0.7, entity_links=[linked], now=NOW).memory_id
    result = client.search("u2", "Douro weekend trains", phase2="never", follow_links=True, now=NOW)
    assert [h.provenance.memory_id for h in result.hits] == [u2_hot] and result.associated == []
    assert client.record_access("u2", [arch, linked], now=NOW) == 0
    # u1 drops its own link: u2's link must not make u1's use count either.
    conn.execute("UPDATE memories SET entity_links = '{}' WHERE id = %s", (hot,))
    assert client.record_access("u1", [arch], now=NOW) == 1
    assert _link_uses(conn, arch) == []
    assert (
        client.search("u1", "Douro weekend trains", phase2="never", follow_links=True, now=NOW).associated
        == []
    )
