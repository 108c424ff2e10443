"""The client API: tenant isolation (property test), sync/async parity, construction from settings."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pgvector.psycopg import register_vector_async
from psycopg.rows import dict_row

from memory_lib.client import AsyncMemoryClient, MemoryClient
from memory_lib.core.config import EmbeddingConfig, RetrievalConfig, Settings
from memory_lib.core.errors import InvalidInputError, NotFoundError
from memory_lib.llm.embedding import HashingEmbedder
from testing.constants import TEST_DIM
from testing.factories import archive_batch, make_client

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
# Everything is a candidate: isolation must hold for whatever the ranking lets through.
WIDE_OPEN = RetrievalConfig(
    hot_similarity_threshold=-1.0,
    archived_similarity_threshold=-1.0,
    hot_limit=100,
    archived_limit=100,
    near_duplicate_threshold=1.0,
)


# --------------------------------------------------------------------------- tenant isolation

TOPICS = str.split("coffee Lisbon ORD-4417 kayak dentist budget tennis garden passport nurse 42 invoice")
MEMORY = st.tuples(
    st.integers(0, 2), st.lists(st.sampled_from(TOPICS), min_size=1, max_size=5), st.booleans()
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    memories=st.lists(MEMORY, min_size=1, max_size=10),
    queries=st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3),
)
def test_no_call_ever_returns_another_users_memory(conn, local_store, memories, queries):
    client = make_client(conn, local_store, retrieval=WIDE_OPEN)
    run = uuid.uuid4().hex[:6]
    users = [f"user-{run}-{i}" for i in range(3)]
    owned: dict[str, set[uuid.UUID]] = {u: set() for u in users}
    for n, (who, words, old) in enumerate(memories):
        text = f"note {n}: " + " ".join(words)
        added = client.add(users[who], text, importance=0.1 if old else 0.6, now=OLD if old else NOW)
        owned[users[who]].add(added.memory_id)
    archive_batch(conn, local_store, as_of=NOW)
    archives = {
        r["id"]: r
        for r in conn.execute(
            "SELECT id, original_id, user_id FROM archived_memories WHERE user_id = ANY(%s)", (users,)
        )
    }
    every_id = set().union(*owned.values()) | set(archives)

    for user in users:
        for query in queries:
            for hit in client.search(user, query, phase2="always", now=NOW):
                assert hit.provenance.user_id == user
                assert hit.provenance.memory_id in owned[user]
        context = client.build_context(user, queries[0], phase2="always", now=NOW)
        assert all(b.provenance.user_id == user for b in context.blocks if b.provenance)
        # Touching every id of every user only ever counts this user's rows.
        mine = len(owned[user])
        assert client.record_access(user, sorted(every_id), now=NOW) == mine
    for archive_id, arch in archives.items():
        for user in users:
            if user == arch["user_id"]:
                continue
            with pytest.raises(NotFoundError):
                client.expand(user, archive_id, now=NOW)
            with pytest.raises(NotFoundError):
                client.restore(user, archive_id=archive_id, now=NOW)
            with pytest.raises(NotFoundError):
                client.restore(user, original_id=arch["original_id"], now=NOW)
        expansion = client.expand(arch["user_id"], archive_id, now=NOW)
        assert expansion.original.user_id == arch["user_id"] and expansion.memory_id in owned[arch["user_id"]]


@pytest.mark.parametrize("user_id", ["", None, "  ", "x" * 201])
def test_every_method_requires_a_user(conn, local_store, user_id):
    client = make_client(conn, local_store, retrieval=WIDE_OPEN)
    calls = [
        lambda: client.add(user_id, "text"),
        lambda: client.search(user_id, "text"),
        lambda: client.expand(user_id, uuid.uuid4()),
        lambda: client.record_access(user_id, [uuid.uuid4()]),
        lambda: client.build_context(user_id, "text"),
        lambda: client.restore(user_id, archive_id=uuid.uuid4()),
    ]
    for call in calls:
        with pytest.raises(InvalidInputError) as err:
            call()
        assert err.value.field == "user_id"


# --------------------------------------------------------------------------- sync and async agree


async def _async_conn(url: str) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
    await register_vector_async(conn)
    return conn


def _summary(result) -> list[tuple]:
    return [(h.source, h.id, h.label, h.text, round(h.scores.final, 9), h.provenance) for h in result]


def test_async_client_returns_what_the_sync_client_returns(db_url, conn, local_store):
    retrieval = RetrievalConfig(hot_similarity_threshold=0.2, archived_similarity_threshold=0.2)
    sync = make_client(conn, local_store, retrieval=retrieval)
    texts = [
        "Prefers cortado in the morning",
        "Kayak trip on the Douro with Tiago",
        "Refund for ORD-4417 approved",
        "Dentist appointment moved to Tuesday",
        "Garden tomatoes need compost",
    ]
    for i, text in enumerate(texts):
        sync.add("u1", text, importance=0.1 if i % 2 else 0.6, now=OLD if i % 2 else NOW)
    archive_batch(conn, local_store, as_of=NOW)
    queries = ["kayak Douro", "ORD-4417", "morning coffee", "tomatoes"]

    async def scenario():
        aconn = await _async_conn(db_url)
        try:
            client = AsyncMemoryClient(
                aconn,
                embedder=HashingEmbedder(TEST_DIM),
                object_store=local_store,
                settings=Settings(retrieval=retrieval),
                actor="test",
            )
            searches = [await client.search("u1", q, phase2="always", now=NOW) for q in queries]
            context = await client.build_context("u1", "kayak", ["hello"], phase2="always", now=NOW)
            adds = [
                await client.add("u2", t, now=NOW)
                for t in (
                    "Prefers cortado in the morning",
                    "prefers cortado in the  morning",
                    "Prefers flat white in the morning",
                )
            ]
            adds.append(await client.add("u2", "Prefers oat milk", supersedes=adds[2].memory_id, now=NOW))
            archive_id = searches[0].archived[0].id
            expansion = await client.expand("u1", archive_id, now=NOW)
            touched = await client.record_access("u1", [h.id for h in searches[1]], now=NOW)
            return searches, context, adds, expansion, touched
        finally:
            await aconn.close()

    a_searches, a_context, a_adds, a_expansion, a_touched = asyncio.run(scenario())
    s_searches = [sync.search("u1", q, phase2="always", now=NOW) for q in queries]
    assert [_summary(r) for r in a_searches] == [_summary(r) for r in s_searches]
    assert any(r.archived for r in s_searches) and any(r.hot for r in s_searches)
    assert a_context == sync.build_context("u1", "kayak", ["hello"], phase2="always", now=NOW)
    s_adds = [
        sync.add("u3", t, now=NOW)
        for t in (
            "Prefers cortado in the morning",
            "prefers cortado in the  morning",
            "Prefers flat white in the morning",
        )
    ]
    s_adds.append(sync.add("u3", "Prefers oat milk", supersedes=s_adds[2].memory_id, now=NOW))
    assert (
        [a.outcome for a in a_adds]
        == [s.outcome for s in s_adds]
        == ["created", "duplicate", "created", "superseded"]
    )
    assert [a.reason for a in a_adds] == [s.reason for s in s_adds] == [None, "duplicate", None, "explicit"]
    s_expansion = sync.expand("u1", a_expansion.archive_id, now=NOW + timedelta(seconds=1))
    assert s_expansion.content == a_expansion.content and s_expansion.original == a_expansion.original
    assert (a_expansion.expansions_in_window, s_expansion.expansions_in_window) == (1, 2)
    assert a_touched == sync.record_access("u1", [h.id for h in s_searches[1]], now=NOW) > 0


def test_async_pool_client_restores_and_refuses_tampering_like_sync(db_url, conn, local_store):
    sync = make_client(conn, local_store, retrieval=WIDE_OPEN)
    added = sync.add("u1", "Old library card number is in the blue folder", importance=0.1, now=OLD)
    archive_batch(conn, local_store, as_of=NOW)

    async def scenario():
        client = await AsyncMemoryClient.connect(
            db_url, embedder=HashingEmbedder(TEST_DIM), object_store=local_store, actor="test"
        )
        async with client:
            with pytest.raises(NotFoundError):
                await client.restore("u2", original_id=added.memory_id, now=NOW)
            first = await client.restore("u1", original_id=added.memory_id, now=NOW)
            second = await client.restore("u1", original_id=added.memory_id, now=NOW)
            return first, second

    first, second = asyncio.run(scenario())
    assert first.restored and not second.restored and first.memory_id == added.memory_id
    assert conn.execute("SELECT content FROM memories WHERE id = %s", (added.memory_id,)).fetchone() == {
        "content": "Old library card number is in the blue folder"
    }


def test_client_from_settings_uses_a_pool_and_closes_it(db_url, tmp_path):
    settings = Settings(
        database_url=db_url,
        state_dir=tmp_path,
        embedding=EmbeddingConfig(provider="hashing", dim=TEST_DIM),
        retrieval=RetrievalConfig(hot_similarity_threshold=0.3),
    )
    with MemoryClient.from_settings(settings) as client:
        added = client.add("u1", "Favourite bakery is on Rua Augusta", now=NOW)
        [hit] = client.search("u1", "favourite bakery", now=NOW).hits
        assert hit.provenance.memory_id == added.memory_id
    with pytest.raises(Exception, match="closed"):
        client.search("u1", "bakery")
