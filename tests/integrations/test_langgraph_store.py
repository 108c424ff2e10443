"""The LangGraph store (memory_lib.integrations.langgraph) against LangGraph's own InMemoryStore: the same
operations give the same results where the semantics match, and the documented differences hold (no
scores there, newest-first order without a query here, TTL archives, users never cross)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    SearchItem,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from pgvector.psycopg import register_vector_async
from psycopg.rows import dict_row

from memory_lib.client import AsyncMemoryClient
from memory_lib.core.config import RetrievalConfig, Settings
from memory_lib.core.errors import InvalidInputError
from memory_lib.integrations.langgraph import MemoryArchiveStore, StoredItem, StoredSearchItem
from memory_lib.llm.embedding import HashingEmbedder
from testing.constants import TEST_DIM
from testing.factories import archive_batch, make_client

RETRIEVAL = RetrievalConfig(hot_similarity_threshold=0.05, archived_similarity_threshold=0.05)

PREFS = ("prefs", "food")
MUSIC = ("prefs", "music")
NOTES = ("notes",)
DEEP = ("notes", "trips", "2026")

# One sequence of operations, each run as its own batch on both stores.
SEQUENCE: list[Op] = [
    PutOp(PREFS, "drink", {"text": "Prefers a cortado in the morning", "rating": 5, "tags": ["coffee"]}),
    PutOp(PREFS, "diet", {"text": "Vegetarian since 2019", "rating": 3}),
    PutOp(MUSIC, "band", {"text": "Listens to Radiohead while coding", "rating": 4, "meta": {"src": "chat"}}),
    PutOp(NOTES, "kayak", {"text": "Kayak trip on the Douro with Tiago", "rating": 2}),
    PutOp(DEEP, "lisbon", {"text": "Flight to Lisbon on 12 March", "rating": 5}),
    # The same value under two keys stays two items (the write path never merges them).
    PutOp(NOTES, "twin-a", {"text": "Same words twice"}),
    PutOp(NOTES, "twin-b", {"text": "Same words twice"}),
    GetOp(PREFS, "drink"),
    GetOp(PREFS, "missing"),
    GetOp(MUSIC, "drink"),
    SearchOp(("prefs",), filter={"rating": {"$gte": 4}}),
    SearchOp(("prefs",), filter={"meta": {"src": "chat"}}),
    SearchOp(("notes",), filter={"text": "Same words twice"}),
    SearchOp(("prefs",), filter={"rating": {"$ne": 5}}),
    SearchOp(("prefs",), filter={"rating": {"$gt": 3, "$lte": 4}}),
    SearchOp(("prefs",), filter={"rating": {"$lt": 4}}),
    SearchOp(("prefs", "food"), filter={"text": {"$eq": "Vegetarian since 2019"}, "rating": 3}),
    SearchOp(("prefs",), filter={"tags": ["coffee"]}),
    SearchOp(("prefs",), filter={"missing": 1}),
    SearchOp(("nowhere",)),
    ListNamespacesOp(),
    ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("prefs",)),)),
    ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("2026",)),)),
    ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("*", "trips")),)),
    ListNamespacesOp(max_depth=1),
    ListNamespacesOp(limit=2, offset=1),
    # An overwrite: new text (a new version), then the same text with another non-indexed field.
    PutOp(PREFS, "drink", {"text": "Prefers a flat white in the morning", "rating": 5}),
    GetOp(PREFS, "drink"),
    PutOp(PREFS, "drink", {"text": "Prefers a flat white in the morning", "rating": 1}),
    GetOp(PREFS, "drink"),
    SearchOp(("prefs", "food"), filter={"rating": 1}),
    # Deletes: the item, and a key that never existed.
    PutOp(NOTES, "twin-b", None),
    PutOp(NOTES, "never", None),
    GetOp(NOTES, "twin-b"),
    SearchOp(("notes",)),
    PutOp(MUSIC, "band", None),
]


def _comparable(result: Any) -> Any:
    """What both stores promise: a search's items as a set (InMemoryStore keeps insertion order, this
    store returns newest first), an item's namespace, key and value (timestamps are each store's own)."""
    if result is None or isinstance(result, tuple):
        return result
    if isinstance(result, list):
        if result and isinstance(result[0], tuple):
            return result
        return sorted((_comparable(item) for item in result), key=repr)
    return (result.namespace, result.key, result.value)


def _got(store: MemoryArchiveStore, namespace: tuple[str, ...], key: str) -> StoredItem:
    item = store.get(namespace, key)
    assert item is not None, (namespace, key)
    return item


def _stored(items: list[SearchItem]) -> list[StoredSearchItem]:
    assert all(isinstance(i, StoredSearchItem) for i in items)
    return [i for i in items if isinstance(i, StoredSearchItem)]


def _reference(ops: list[Op]) -> list[Any]:
    memory = InMemoryStore()
    return [_comparable(memory.batch([op])[0]) for op in ops]


def _sync_store(conn, local_store, **kwargs: Any) -> MemoryArchiveStore:
    client = make_client(conn, local_store, retrieval=RETRIEVAL)
    return MemoryArchiveStore(client, **({"user_id": "u1"} | kwargs))


async def _async_client(db_url: str, local_store) -> tuple[AsyncMemoryClient, psycopg.AsyncConnection[Any]]:
    aconn = await psycopg.AsyncConnection.connect(db_url, autocommit=True, row_factory=dict_row)
    await register_vector_async(aconn)
    client = AsyncMemoryClient(
        aconn,
        embedder=HashingEmbedder(TEST_DIM),
        object_store=local_store,
        settings=Settings(retrieval=RETRIEVAL),
        actor="test",
    )
    return client, aconn


def test_the_same_operations_give_inmemorystores_results(conn, local_store):
    store = _sync_store(conn, local_store)
    ours = [_comparable(store.batch([op])[0]) for op in SEQUENCE]
    assert ours == _reference(SEQUENCE)
    # What the comparison must not miss: the overwrite and the delete happened here too.
    assert _got(store, PREFS, "drink").value == {"text": "Prefers a flat white in the morning", "rating": 1}
    assert store.get(NOTES, "twin-b") is None and store.get(NOTES, "twin-a") is not None
    # The documented difference: a namespace exists here while it holds an item; InMemoryStore keeps
    # listing one whose last item was deleted (MUSIC).
    memory = InMemoryStore()
    memory.batch(SEQUENCE)
    assert store.list_namespaces() == [NOTES, DEEP, PREFS]
    assert memory.list_namespaces() == [NOTES, DEEP, PREFS, MUSIC]
    # Without a query: newest first here, insertion order (namespace by namespace) there.
    assert [i.key for i in store.search(("notes",))] == ["twin-a", "lisbon", "kayak"]
    assert [i.key for i in memory.search(("notes",))] == ["kayak", "twin-a", "lisbon"]
    # A comparison on an item without the field: no match here, a TypeError there.
    assert {i.key for i in store.search((), filter={"rating": {"$lt": 3}})} == {"drink", "kayak"}
    with pytest.raises(TypeError):
        memory.search((), filter={"rating": {"$lt": 3}})


def test_async_store_gives_the_same_results(db_url, local_store):
    async def scenario() -> list[Any]:
        client, aconn = await _async_client(db_url, local_store)
        try:
            store = MemoryArchiveStore(aclient=client, user_id="u1")
            return [_comparable((await store.abatch([op]))[0]) for op in SEQUENCE]
        finally:
            await aconn.close()

    assert asyncio.run(scenario()) == _reference(SEQUENCE)


def test_one_batch_reads_before_its_puts_like_inmemorystore(conn, local_store):
    ops: list[Op] = [
        PutOp(NOTES, "k", {"text": "first"}),
        GetOp(NOTES, "k"),
        PutOp(NOTES, "k", {"text": "second"}),
        SearchOp(("notes",)),
    ]
    store = _sync_store(conn, local_store)
    memory = InMemoryStore()
    assert [_comparable(r) for r in store.batch(ops)] == [_comparable(r) for r in memory.batch(ops)]
    theirs = memory.get(NOTES, "k")
    assert theirs is not None and _got(store, NOTES, "k").value == theirs.value == {"text": "second"}


def test_search_with_a_query_ranks_the_matching_item_first_with_a_score(conn, local_store):
    store = _sync_store(conn, local_store)
    memory = InMemoryStore()
    for op in SEQUENCE[:7]:
        store.batch([op])
        memory.batch([op])
    [top, *_] = _stored(store.search(("notes",), query="kayak Douro Tiago"))
    assert (top.namespace, top.key, top.tier) == (NOTES, "kayak", "hot")
    assert isinstance(top.score, float) and top.score > 0
    # The documented difference: InMemoryStore without an index returns its items unranked, unscored.
    theirs = memory.search(("notes",), query="kayak Douro Tiago")
    assert {(i.namespace, i.key) for i in theirs} >= {(NOTES, "kayak")}
    assert all(i.score is None for i in theirs)
    # A filter applies to a query search too; the prefix bounds it.
    assert [i.key for i in store.search(("prefs",), query="morning cortado", filter={"rating": 3})] == [
        "diet"
    ]
    assert [(i.namespace, i.key) for i in store.search(("prefs", "music"), query="Radiohead morning")] == [
        (MUSIC, "band")
    ]
    # offset/limit page the ranked hits.
    every = store.search(("notes",), query="kayak trip words flight", limit=10)
    assert [i.key for i in store.search(("notes",), query="kayak trip words flight", limit=1, offset=1)] == [
        every[1].key
    ]


def test_an_archived_item_is_still_got_and_found(conn, local_store):
    store = _sync_store(conn, local_store, importance=0.1)
    value = {"text": "Old library card number is in the blue folder", "n": 7, "nested": {"a": [1, 2.5]}}
    store.put(NOTES, "card", value)
    store.put(NOTES, "kayak", {"text": "Kayak trip on the Douro"}, index=["text"])
    now = datetime.now(UTC)
    report = archive_batch(conn, local_store, as_of=now + timedelta(days=120))
    assert report.archived >= 2
    # The search options reach the client's search: without phase 2, archived items are not searched.
    hot_only = _sync_store(conn, local_store, search_options={"phase2": "never"})
    assert hot_only.search(("notes",), query="library card blue folder") == []
    got = _got(store, NOTES, "card")
    assert got.tier == "archived" and got.archive_id is not None
    assert (got.namespace, got.key, got.value) == (NOTES, "card", value)
    hits = _stored(store.search(("notes",), query="library card blue folder", filter={"n": 7}))
    assert [(h.key, h.tier, h.value) for h in hits] == [("card", "archived", value)]
    assert {(i.key, i.tier) for i in _stored(store.search(("notes",)))} == {
        ("card", "archived"),
        ("kayak", "archived"),
    }
    assert store.list_namespaces() == [NOTES]
    # Each read of an archived value was an expansion: the third (expansions_to_promote) brought the card
    # back to the hot tier; the kayak, expanded once, stays archived.
    assert _got(store, NOTES, "card").tier == "hot"
    assert _got(store, NOTES, "kayak").tier == "archived"
    # A put over an archived item restores it, then writes the new value (new text: a new version).
    store.put(NOTES, "kayak", {"text": "Kayak trip on the Douro, twice"}, index=["text"])
    again = _got(store, NOTES, "kayak")
    assert again.tier == "hot" and again.value == {"text": "Kayak trip on the Douro, twice"}
    store.put(NOTES, "card", value | {"n": 8})
    assert _got(store, NOTES, "card").value == value | {"n": 8}
    store.delete(NOTES, "kayak")
    assert store.get(NOTES, "kayak") is None
    left = conn.execute("SELECT count(*) AS n FROM archived_memories WHERE user_id = 'u1'").fetchone()
    assert left["n"] == 0


def test_archived_item_through_the_async_store(db_url, conn, local_store):
    sync = _sync_store(conn, local_store, importance=0.1)
    sync.put(NOTES, "card", {"text": "Old library card number is in the blue folder"})
    archive_batch(conn, local_store, as_of=datetime.now(UTC) + timedelta(days=120))

    async def scenario() -> tuple[Any, Any]:
        client, aconn = await _async_client(db_url, local_store)
        try:
            store = MemoryArchiveStore(aclient=client, user_id="u1")
            return await store.aget(NOTES, "card"), _stored(
                await store.asearch(("notes",), query="library card")
            )
        finally:
            await aconn.close()

    got, hits = asyncio.run(scenario())
    assert (
        got is not None
        and got.tier == "archived"
        and got.value == {"text": "Old library card number is in the blue folder"}
    )
    assert [(h.key, h.tier) for h in hits] == [("card", "archived")]


def test_no_read_crosses_users(conn, local_store):
    client = make_client(conn, local_store, retrieval=RETRIEVAL)
    store = MemoryArchiveStore(client, user_position=1)
    store.put(("memories", "alice"), "city", {"text": "Lives in Lisbon"})
    store.put(("memories", "bob"), "city", {"text": "Lives in Porto"})
    store.put(("memories", "bob", "work"), "desk", {"text": "Desk by the window in Lisbon"})
    assert _got(store, ("memories", "alice"), "city").value == {"text": "Lives in Lisbon"}
    assert _got(store, ("memories", "bob"), "city").value == {"text": "Lives in Porto"}
    assert store.get(("memories", "carol"), "city") is None
    hits = store.search(("memories", "alice"), query="Lisbon window desk")
    assert [(h.namespace, h.key) for h in hits] == [(("memories", "alice"), "city")]
    assert [(i.namespace, i.key) for i in store.search(("memories", "alice"))] == [
        (("memories", "alice"), "city")
    ]
    assert store.list_namespaces(prefix=("memories", "bob")) == [
        ("memories", "bob"),
        ("memories", "bob", "work"),
    ]
    assert store.list_namespaces(prefix=("memories", "alice")) == [("memories", "alice")]
    # A read that does not name its user is refused, never answered with everyone's.
    for call in (
        lambda: store.search(("memories",), query="Lisbon"),
        lambda: store.list_namespaces(),
        lambda: store.list_namespaces(prefix=("memories", "*")),
        lambda: store.get(("memories",), "city"),
    ):
        with pytest.raises(InvalidNamespaceError, match="position 1"):
            call()
    assert {r.user_id for r in client.list("alice").items} == {"alice"}
    # Each user's memories are that user's rows.
    owners = conn.execute("SELECT DISTINCT user_id FROM memories ORDER BY 1").fetchall()
    assert [r["user_id"] for r in owners] == ["alice", "bob"]


def test_ttl_becomes_days_until_archival(conn, local_store):
    store = _sync_store(conn, local_store)
    store.put(NOTES, "short", {"text": "Parking spot B4 today"}, ttl=90)
    store.put(NOTES, "long", {"text": "Hotel booking reference"}, ttl=3 * 24 * 60 + 1)
    store.put(NOTES, "none", {"text": "No expiry"})
    got = {k: _got(store, NOTES, k) for k in ("short", "long", "none")}
    ttl = {
        k: conn.execute("SELECT ttl_days FROM memories WHERE id = %s", (item.memory_id,)).fetchone()[
            "ttl_days"
        ]
        for k, item in got.items()
    }
    assert ttl == {"short": 1, "long": 4, "none": None}
    with pytest.raises(InvalidInputError, match="ttl"):
        store.put(NOTES, "bad", {"text": "x"}, ttl=-5)
    # A put with a TTL renews the expiry, of the same text (the value updated in place) or a new one.
    before = _got(store, NOTES, "short")
    store.put(NOTES, "short", {"text": "Parking spot B4 today"}, ttl=2 * 24 * 60)
    store.put(NOTES, "long", {"text": "Hotel booking reference 7Q2"}, ttl=24 * 60)
    expiry = {
        k: conn.execute(
            "SELECT expires_at, ttl_days FROM memories WHERE id = %s", (_got(store, NOTES, k).memory_id,)
        ).fetchone()
        for k in ("short", "long")
    }
    assert _got(store, NOTES, "short").memory_id == before.memory_id
    assert expiry["short"]["expires_at"] > datetime.now(UTC) + timedelta(days=1, hours=23)
    assert expiry["long"]["ttl_days"] == 1
    assert expiry["long"]["expires_at"] < datetime.now(UTC) + timedelta(days=1, minutes=1)


def test_store_arguments_are_checked(conn, local_store):
    client = make_client(conn, local_store)
    with pytest.raises(InvalidInputError, match="exactly one"):
        MemoryArchiveStore(client)
    with pytest.raises(InvalidInputError, match="client"):
        MemoryArchiveStore(user_id="u1")
    with pytest.raises(InvalidInputError, match="search_options.limit"):
        MemoryArchiveStore(client, user_id="u1", search_options={"limit": 3})
    store = MemoryArchiveStore(client, user_id="u1")
    with pytest.raises(InvalidInputError, match="at most 56 bytes"):
        store.put(("x" * 57,), "k", {"text": "long label"})
    with pytest.raises(InvalidNamespaceError):
        store.put(("a.b",), "k", {"text": "dotted label"})
    with pytest.raises(InvalidNamespaceError, match="matches labels"):
        store.put(("a", "*"), "k", {"text": "a wildcard is not a label"})
    # A batch whose last put is refused writes nothing.
    with pytest.raises(InvalidInputError, match="ttl"):
        store.batch([PutOp(NOTES, "ok", {"text": "fine"}), PutOp(NOTES, "bad", {"text": "x"}, ttl=0)])
    assert store.get(NOTES, "ok") is None


def test_list_by_tags_finds_hot_and_archived_memories_of_the_user(conn, local_store):
    client = make_client(conn, local_store)
    old = datetime.now(UTC) - timedelta(days=200)
    a = client.add("u1", "Archived note about kayaks", tags=["Trip", "x"], importance=0.1, now=old).memory_id
    b = client.add("u1", "Hot note about kayaks", tags=["trip"]).memory_id
    client.add("u1", "Untagged note")
    client.add("u2", "Another user's trip", tags=["trip"])
    archive_batch(conn, local_store, as_of=datetime.now(UTC))
    page = client.list("u1", tags=["TRIP"])
    assert [(r.id, r.tier) for r in page.items] == [(b, "hot"), (a, "archived")]
    assert [r.id for r in client.list("u1", tags=["trip", "x"]).items] == [a]
    with pytest.raises(InvalidInputError, match="tags"):
        client.list("u1", tags="trip")


def test_an_overwrite_keeps_history_and_its_first_time_and_delete_forgets_every_version(conn, local_store):
    client = make_client(conn, local_store, retrieval=RETRIEVAL)
    store = MemoryArchiveStore(client, user_id="u1")
    store.put(PREFS, "drink", {"text": "Prefers a cortado"})
    first = _got(store, PREFS, "drink")
    store.put(PREFS, "drink", {"text": "Prefers a flat white"})
    second = _got(store, PREFS, "drink")
    assert second.memory_id != first.memory_id and second.created_at == first.created_at
    assert second.updated_at >= first.updated_at
    events = [e.event_type for e in client.history("u1", first.memory_id)]
    assert "superseded" in events
    versions = client.list("u1", include_superseded=True).items
    assert {r.id for r in versions} == {first.memory_id, second.memory_id}
    store.delete(PREFS, "drink")
    assert client.list("u1", include_superseded=True).items == []


def test_abatch_without_an_async_client_runs_the_sync_one(conn, local_store):
    store = _sync_store(conn, local_store)

    async def scenario() -> Any:
        await store.aput(NOTES, "k", {"text": "from a coroutine"})
        return await store.aget(NOTES, "k")

    got = asyncio.run(scenario())
    assert got is not None and got.value == {"text": "from a coroutine"} and got.tier == "hot"
    only_async = MemoryArchiveStore(
        aclient=AsyncMemoryClient(conn, embedder=HashingEmbedder(TEST_DIM)), user_id="u1"
    )
    with pytest.raises(InvalidInputError, match="async methods"):
        only_async.get(NOTES, "k")


def test_the_ttl_config_default_applies_to_puts_without_a_ttl(conn, local_store):
    store = _sync_store(conn, local_store, ttl={"default_ttl": 60.0})
    store.put(NOTES, "k", {"text": "Gate code changes weekly"})
    row = conn.execute("SELECT ttl_days FROM memories WHERE id = %s", (_got(store, NOTES, "k").memory_id,))
    assert row.fetchone()["ttl_days"] == 1
