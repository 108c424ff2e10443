"""Bad input at every public entry point: a clear InvalidInputError naming the field, and nothing written.

One database is seeded for the module (hot memories, archived ones, and archived ones whose backup
object was replaced by a malformed document with its sha256 and size updated to match, so only
validation can tell). Each row calls one entry point with one bad value; the row counts of
memories / archived_memories / memory_events, a digest of every row of memories and
archived_memories, and the object store's keys and bytes must be the same before and after.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector_async
from psycopg.rows import dict_row

from memory_lib.archival.pipeline import run_batch
from memory_lib.cli import main
from memory_lib.client import AsyncMemoryClient, MemoryClient
from memory_lib.core.config import (
    ArchivalCriteria,
    ContextBudget,
    ObjectStoreConfig,
    RetrievalConfig,
    Settings,
)
from memory_lib.core.errors import (
    ConfigError,
    IntegrityError,
    InvalidInputError,
    NotFoundError,
    UnknownParameterError,
)
from memory_lib.core.models import sha256_hex
from memory_lib.core.plans import run_plan
from memory_lib.core.validation import MAX_QUERY_CHARS
from memory_lib.lifecycle.restore import archived_ids, restore_archive, restore_archives
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.context import ContextItem, assemble_context
from memory_lib.retrieval.types import SearchFilters
from memory_lib.storage.db import connect
from memory_lib.storage.objectstore import LocalObjectStore, object_store_from_settings
from memory_lib.storage.store import insert_memories
from memory_lib.write.write_path import add_plan, prepare_memory
from testing.backups import ARCHIVE_ROWS_SQL
from testing.constants import TEST_DIM
from testing.factories import archival_services, make_memories
from testing.rows import one

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
RETRIEVAL = RetrievalConfig(hot_similarity_threshold=-1.0, archived_similarity_threshold=-1.0)
ONE_MB = "word " * 200_000
NAIVE = datetime(2025, 1, 1, 12, 0)


# --------------------------------------------------------------------------- the seeded database


def _malformed(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    doc = dict(doc)
    if kind == "wrong_dim":
        doc["embedding"] = doc["embedding"] + [0.5]
    elif kind == "nan":
        doc["embedding"] = [float("nan"), *doc["embedding"][1:]]
    elif kind == "nul":
        doc["content"] = doc["content"] + "\x00"
    elif kind == "importance":
        doc["importance_score"] = 7
    elif kind == "surrogate":
        doc["content"] = doc["content"] + "\ud800"
    elif kind == "naive_time":
        doc["created_at"] = "2024-01-01T00:00:00"
    return doc


MALFORMED = {  # kind -> the field the error must name
    "wrong_dim": "backup.embedding",
    "nan": "backup.embedding[0]",
    "nul": "backup.content",
    "importance": "backup.importance_score",
    "surrogate": "backup.content",
    "naive_time": "backup.created_at",
}


class World:
    """The seeded database, its object store and the ids the rows refer to."""

    def __init__(self, url: str, store: LocalObjectStore):
        self.url = url
        self.store = store
        self.conn = connect(url)
        self.archive_ids: dict[str, uuid.UUID] = {}  # "good" and each malformed kind
        self.original_ids: dict[str, uuid.UUID] = {}

    def client(self) -> MemoryClient:
        return MemoryClient(
            self.conn,
            embedder=HashingEmbedder(TEST_DIM),
            object_store=self.store,
            settings=Settings(retrieval=RETRIEVAL),
            actor="test",
        )

    def state(self) -> dict[str, Any]:
        row = one(
            self.conn.execute(
                """SELECT (SELECT count(*) FROM memories) AS memories,
                      (SELECT count(*) FROM archived_memories) AS archived,
                      (SELECT count(*) FROM memory_events) AS events,
                      (SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t.id), '')) FROM memories t) AS hot_rows,
                      (SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t.id), ''))
                         FROM archived_memories t) AS archived_rows"""
            )
        )
        objects = {k: hashlib.sha256(self.store.get(k)).hexdigest() for k in self.store.list()}
        return dict(row) | {"object_count": len(objects), "objects": objects}


@pytest.fixture(scope="module")
def world(databases, tmp_path_factory) -> Iterator[World]:
    url = databases.new()
    store = LocalObjectStore(tmp_path_factory.mktemp("objects"), prefix="test")
    w = World(url, store)
    client = w.client()
    kinds = ["good", *MALFORMED]
    for i, kind in enumerate(kinds):
        added = client.add(
            "u1", f"Archived note {i}: the {kind} locker code is in drawer {i}", importance=0.1, now=OLD
        )
        w.original_ids[kind] = added.memory_id
    client.add("u1", "Prefers a cortado in the morning", importance=0.9, now=NOW)
    client.add("u2", "Another user's note about cortado", importance=0.9, now=NOW)
    services = archival_services(store)
    report = run_batch(w.conn, services, ArchivalCriteria(), batch_key="seed", as_of=NOW, actor="test")
    assert report.gate_passed and report.status.failed == 0
    for kind in kinds:
        arch = w.conn.execute(
            f"{ARCHIVE_ROWS_SQL} WHERE a.original_id = %s", (w.original_ids[kind],)
        ).fetchone()
        assert arch is not None
        w.archive_ids[kind] = arch["id"]
        if kind == "good":
            continue
        # A hand-edited object whose record was "fixed" to match: the sha256 check passes.
        key = store.key_from_ref(arch["storage_ref"])
        doc = _malformed(json.loads(store.get(key)), kind)
        data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        store.put(key, data, sha256_hex(data))
        w.conn.execute(
            "UPDATE archived_memories SET backup_digest = %s, backup_size_bytes = %s WHERE id = %s",
            (bytes.fromhex(sha256_hex(data)), len(data), arch["id"]),
        )
    yield w
    w.conn.close()


# --------------------------------------------------------------------------- the clients, sync and async


def _run_async(world: World, call: Callable[[AsyncMemoryClient], Any]) -> Any:
    async def main() -> Any:
        aconn = await psycopg.AsyncConnection.connect(world.url, autocommit=True, row_factory=dict_row)
        await register_vector_async(aconn)
        try:
            client = AsyncMemoryClient(
                aconn,
                embedder=HashingEmbedder(TEST_DIM),
                object_store=world.store,
                settings=Settings(retrieval=RETRIEVAL),
                actor="test",
            )
            return await call(client)
        finally:
            await aconn.close()

    return asyncio.run(main())


def _call(world: World, flavour: str, call: Callable[[Any], Any]) -> Any:
    if flavour == "sync":
        return call(world.client())
    return _run_async(world, call)


def _hot(w: World) -> uuid.UUID:
    return one(w.conn.execute("SELECT id FROM memories WHERE user_id = 'u1' ORDER BY created_at LIMIT 1"))[
        "id"
    ]


def _a(kind: str) -> Callable[[World], uuid.UUID]:
    return lambda w: w.archive_ids[kind]


# (name, field, call(client, world)): every row runs on MemoryClient and on AsyncMemoryClient.
CLIENT_ROWS: list[tuple[str, str, Callable[[Any, World], Any]]] = [
    ("add: NUL in domain", "domain", lambda c, w: c.add("u1", "a new note", domain="wo\x00rk")),
    ("add: lone surrogate in domain", "domain", lambda c, w: c.add("u1", "a new note", domain="wo\ud800rk")),
    ("add: zero-width-only content", "content", lambda c, w: c.add("u1", "\u200b\u200b")),
    ("add: BOM and zero-width joiner only", "content", lambda c, w: c.add("u1", "\ufeff \u200d\n")),
    ("add: NUL in content", "content", lambda c, w: c.add("u1", "order\x00 shipped")),
    ("add: pinned='yes'", "pinned", lambda c, w: c.add("u1", "a new note", pinned="yes")),
    ("add: pinned=1", "pinned", lambda c, w: c.add("u1", "a new note", pinned=1)),
    (
        "add: importance as a string",
        "importance_score",
        lambda c, w: c.add("u1", "a new note", importance="0.5"),
    ),
    ("add: importance=True", "importance_score", lambda c, w: c.add("u1", "a new note", importance=True)),
    ("add: lone surrogate in a tag", "tags", lambda c, w: c.add("u1", "a new note", tags=["ok", "b\udc00d"])),
    ("add: metadata not a dict", "metadata", lambda c, w: c.add("u1", "a new note", metadata=[("a", 1)])),
    ("add: NUL in metadata", "metadata", lambda c, w: c.add("u1", "a new note", metadata={"k": "v\x00"})),
    ("add: allow_secrets='no'", "allow_secrets", lambda c, w: c.add("u1", "a new note", allow_secrets="no")),
    ("add: naive now", "now", lambda c, w: c.add("u1", "a new note", now=NAIVE)),
    ("add: lone surrogate in user_id", "user_id", lambda c, w: c.add("u\ud800", "a new note")),
    ("add: entity link not a UUID", "entity_links.0", lambda c, w: c.add("u1", "a note", entity_links=["x"])),
    ("add: ttl_days=-1", "ttl_days", lambda c, w: c.add("u1", "a new note", ttl_days=-1)),
    ("add: ttl_days='7'", "ttl_days", lambda c, w: c.add("u1", "a new note", ttl_days="7")),
    ("add: ttl_days=True", "ttl_days", lambda c, w: c.add("u1", "a new note", ttl_days=True)),
    ("add: ttl_days=1.5", "ttl_days", lambda c, w: c.add("u1", "a new note", ttl_days=1.5)),
    ("add: ttl_days beyond a century", "ttl_days", lambda c, w: c.add("u1", "a new note", ttl_days=36_501)),
    ("add: pinned with a ttl", "ttl_days", lambda c, w: c.add("u1", "a new note", pinned=True, ttl_days=3)),
    ("add: unknown category", "category", lambda c, w: c.add("u1", "a new note", category="gossip")),
    (
        "add: metadata.chunk from the caller",
        "metadata.chunk",
        lambda c, w: c.add("u1", "a new note", metadata={"chunk": {"parent_id": "x"}}),
    ),
    (
        "add: a long text with ttl_days=-3",
        "ttl_days",
        lambda c, w: c.add("u1", "harbour log " * 800, ttl_days=-3),
    ),
    ("add: a long text with a NUL", "content", lambda c, w: c.add("u1", "harbour log " * 800 + "\x00")),
    ("search: NUL in query", "query", lambda c, w: c.search("u1", "cor\x00tado")),
    ("search: lone surrogate in query", "query", lambda c, w: c.search("u1", "cor\ud800tado")),
    ("search: 1 MB query", "query", lambda c, w: c.search("u1", ONE_MB)),
    ("search: query one over the maximum", "query", lambda c, w: c.search("u1", "x" * (MAX_QUERY_CHARS + 1))),
    ("search: text_query=123", "text_query", lambda c, w: c.search("u1", "cortado", text_query=123)),
    ("search: NUL in text_query", "text_query", lambda c, w: c.search("u1", "cortado", text_query="a\x00")),
    (
        "search: surrogate in text_query",
        "text_query",
        lambda c, w: c.search("u1", "cortado", text_query="\udfff"),
    ),
    ("search: 1 MB text_query", "text_query", lambda c, w: c.search("u1", "cortado", text_query=ONE_MB)),
    ("search: limit=-1", "limit", lambda c, w: c.search("u1", "cortado", limit=-1)),
    ("search: limit='5'", "limit", lambda c, w: c.search("u1", "cortado", limit="5")),
    (
        "search: archived_limit=True",
        "archived_limit",
        lambda c, w: c.search("u1", "cortado", archived_limit=True),
    ),
    (
        "search: include_past='yes'",
        "include_past",
        lambda c, w: c.search("u1", "cortado", include_past="yes"),
    ),
    (
        "search: record_access='yes'",
        "record_access",
        lambda c, w: c.search("u1", "cortado", record_access="yes"),
    ),
    ("search: phase2='sometimes'", "phase2", lambda c, w: c.search("u1", "cortado", phase2="sometimes")),
    ("search: tags as one string", "tags", lambda c, w: c.search("u1", "cortado", tags="coffee")),
    ("search: now='2024-01-01'", "now", lambda c, w: c.search("u1", "cortado", now="2024-01-01")),
    ("search: now as epoch seconds", "now", lambda c, w: c.search("u1", "cortado", now=1_700_000_000)),
    (
        "search: NUL in filters.domains",
        "filters.domains",
        lambda c, w: c.search("u1", "cortado", filters=SearchFilters(domains=["wo\x00rk"])),
    ),
    (
        "search: surrogate in filters.domains",
        "filters.domains",
        lambda c, w: c.search("u1", "cortado", filters=SearchFilters(domains=["\ud800"])),
    ),
    (
        "search: surrogate in filters.required_tags",
        "filters.required_tags",
        lambda c, w: c.search("u1", "cortado", filters=SearchFilters(required_tags=["caf\udce9"])),
    ),
    (
        "search: naive filters.seen_since",
        "filters.seen_since",
        lambda c, w: c.search("u1", "cortado", filters=SearchFilters(seen_since=NAIVE)),
    ),
    (
        "search: seen window the wrong way round",
        "filters.seen_until",
        lambda c, w: c.search("u1", "cortado", filters=SearchFilters(seen_since=NOW, seen_until=OLD)),
    ),
    (
        "search: filters as a dict",
        "filters",
        lambda c, w: c.search("u1", "cortado", filters={"domains": ["w"]}),
    ),
    (
        "build_context: naive created_at in a summary item",
        "ContextItem.created_at",
        lambda c, w: c.build_context(
            "u1", "cortado", summaries=[ContextItem("s", "caller", created_at=NAIVE)], record_access=True
        ),
    ),
    (
        "build_context: a turn that is a number",
        "recent_turns[1]",
        lambda c, w: c.build_context("u1", "cortado", ["hi", 42], record_access=True),
    ),
    (
        "build_context: NUL-free but non-str role",
        "recent_turns[0]",
        lambda c, w: c.build_context("u1", "cortado", [{"role": 7, "content": "hi"}], record_access=True),
    ),
    (
        "build_context: max_tokens=-1",
        "max_tokens",
        lambda c, w: c.build_context("u1", "cortado", max_tokens=-1, record_access=True),
    ),
    (
        "build_context: limit=-1 in the search",
        "limit",
        lambda c, w: c.build_context("u1", "cortado", limit=-1),
    ),
    (
        "build_context: an unknown keyword limt=3",
        "limt",
        lambda c, w: c.build_context("u1", "cortado", ["hi"], limt=3, record_access=True),
    ),
    (
        "build_context: a budget with total=-1",
        "budget.total",
        lambda c, w: c.build_context("u1", "cortado", ["hi"], ContextBudget(total=-1), record_access=True),
    ),
    ("expand: archive_id not a UUID", "archive_id", lambda c, w: c.expand("u1", "not-a-uuid")),
    (
        "expand: now without an offset",
        "now",
        lambda c, w: c.expand("u1", w.archive_ids["good"], now="2025-06-01"),
    ),
    ("record_access: an id that is a number", "ids", lambda c, w: c.record_access("u1", [123])),
    (
        "record_access: naive now",
        "now",
        lambda c, w: c.record_access("u1", [w.original_ids["good"]], now=NAIVE),
    ),
    ("restore: neither id", "archive_id/original_id", lambda c, w: c.restore("u1")),
    ("restore: original_id not a UUID", "original_id", lambda c, w: c.restore("u1", original_id=42)),
    ("get: id not a UUID", "memory_id", lambda c, w: c.get("u1", "not-a-uuid")),
    ("get: blank user_id", "user_id", lambda c, w: c.get(" ", w.original_ids["good"])),
    ("list: tier='warm'", "tier", lambda c, w: c.list("u1", tier="warm")),
    ("list: category='fact'", "category", lambda c, w: c.list("u1", category="fact")),
    ("list: limit=0", "limit", lambda c, w: c.list("u1", limit=0)),
    ("list: limit='10'", "limit", lambda c, w: c.list("u1", limit="10")),
    (
        "list: a cursor that list() never returned",
        "cursor",
        lambda c, w: c.list("u1", cursor="bm90LWEtY3Vyc29y"),
    ),
    ("list: naive created_after", "created_after", lambda c, w: c.list("u1", created_after=NAIVE)),
    (
        "list: created_after after created_before",
        "created_after",
        lambda c, w: c.list("u1", created_after=NOW, created_before=OLD),
    ),
    (
        "list: include_superseded='yes'",
        "include_superseded",
        lambda c, w: c.list("u1", include_superseded="yes"),
    ),
    ("update: nothing to change", "update", lambda c, w: c.update("u1", _hot(w))),
    ("update: id not a UUID", "memory_id", lambda c, w: c.update("u1", 42, "new text")),
    ("update: importance=2", "importance_score", lambda c, w: c.update("u1", _hot(w), importance=2)),
    ("update: NUL in content", "content", lambda c, w: c.update("u1", _hot(w), "cor\x00tado")),
    (
        "update: a secret as content",
        "content",
        lambda c, w: c.update("u1", _hot(w), "key sk-ant-api03-abcdefghijklmnopqrstuvwxyz0123456789"),
    ),
    (
        "update: an archived memory",
        "memory_id",
        lambda c, w: c.update("u1", w.original_ids["good"], importance=0.2),
    ),
    ("update: naive now", "now", lambda c, w: c.update("u1", _hot(w), importance=0.3, now=NAIVE)),
    ("delete: id not a UUID", "memory_id", lambda c, w: c.delete("u1", "x")),
    ("delete: no id", "memory_id", lambda c, w: c.delete("u1", None)),
    ("forget_user: blank user_id", "user_id", lambda c, w: c.forget_user("")),
    ("forget_user: naive now", "now", lambda c, w: c.forget_user("u1", now=NAIVE)),
    ("history: id=42", "memory_id", lambda c, w: c.history("u1", 42)),
]
CLIENT_ROWS += [
    (
        f"expand: malformed backup ({kind})",
        field,
        lambda c, w, k=kind: c.expand("u1", w.archive_ids[k], now=NOW),
    )
    for kind, field in MALFORMED.items()
] + [
    (
        f"restore: malformed backup ({kind})",
        field,
        lambda c, w, k=kind: c.restore("u1", archive_id=w.archive_ids[k], now=NOW),
    )
    for kind, field in MALFORMED.items()
]


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize(("name", "field", "call"), CLIENT_ROWS, ids=[r[0] for r in CLIENT_ROWS])
def test_client_refuses_bad_input_and_writes_nothing(world, flavour, name, field, call):
    before = world.state()
    with pytest.raises(InvalidInputError) as info:
        _call(world, flavour, lambda c: call(c, world))
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(f"invalid {field}=")
    assert world.state() == before


# --------------------------------------------------------------------------- store insert, write path, restore


def _memory(**change: Any) -> dict[str, Any]:
    return make_memories(1, dim=TEST_DIM, users=("u9",), seed=7)[0] | change


def _insert(w: World, *memories: Any, **kwargs: Any) -> Any:
    return insert_memories(w.conn, list(memories), **({"actor": "test"} | kwargs))


def _add_with_embedding(w: World, embedding: Any) -> Any:
    prepared = prepare_memory("u1", "a note about kayaks")
    plan = add_plan(
        prepared,
        embedding,
        embedding_model=HashingEmbedder(TEST_DIM).model,
        config=RETRIEVAL,
        actor="test",
        now=NOW,
    )
    return run_plan(w.conn, plan)


def _nan_vector() -> np.ndarray:
    v = np.ones(TEST_DIM, dtype=np.float32)
    v[3] = np.nan
    return v


LIBRARY_ROWS: list[tuple[str, str, Callable[[World], Any]]] = [
    ("insert: NUL in domain", "domain", lambda w: _insert(w, _memory(), _memory(domain="a\x00"))),
    ("insert: surrogate in domain", "domain", lambda w: _insert(w, _memory(domain="\ud800"))),
    ("insert: zero-width content", "content", lambda w: _insert(w, _memory(content="\u200b\u200b"))),
    ("insert: pinned='yes'", "pinned", lambda w: _insert(w, _memory(pinned="yes"))),
    ("insert: created_at='2024-01-01'", "created_at", lambda w: _insert(w, _memory(created_at="2024-01-01"))),
    (
        "insert: created_at as epoch seconds",
        "created_at",
        lambda w: _insert(w, _memory(created_at=1_700_000_000)),
    ),
    ("insert: importance '0.5'", "importance_score", lambda w: _insert(w, _memory(importance_score="0.5"))),
    ("insert: access_count=-1", "access_count", lambda w: _insert(w, _memory(access_count=-1))),
    (
        "insert: NUL in embedding_model",
        "embedding_model",
        lambda w: _insert(w, _memory(embedding_model="m\x00")),
    ),
    ("insert: a memory that is a string", "memory", lambda w: _insert(w, "remember this")),
    ("insert: memories not a list", "memories", lambda w: insert_memories(w.conn, 42, actor="test")),  # type: ignore[arg-type]
    ("insert: NUL in actor", "actor", lambda w: _insert(w, _memory(), actor="te\x00st")),
    ("insert: naive now", "now", lambda w: _insert(w, _memory(), now=NAIVE)),
    ("write path: zero-width content", "content", lambda w: prepare_memory("u1", "\u200b")),
    ("write path: pinned='yes'", "pinned", lambda w: prepare_memory("u1", "a note", pinned="yes")),  # type: ignore[arg-type]
    ("write path: surrogate in domain", "domain", lambda w: prepare_memory("u1", "a note", domain="\udfff")),
    ("write path: NaN in the embedding", "embedding", lambda w: _add_with_embedding(w, _nan_vector())),
    (
        "write path: embedding of another dimension",
        "embedder.dim",
        lambda w: _add_with_embedding(w, np.ones(TEST_DIM + 1, dtype=np.float32)),
    ),
]
LIBRARY_ROWS += [
    (
        f"restore.restore_archive (CLI): malformed backup ({kind})",
        field,
        lambda w, k=kind: restore_archive(  # type: ignore[misc]
            w.conn, w.store, user_id="u1", original_id=w.original_ids[k], actor="cli"
        ),
    )
    for kind, field in MALFORMED.items()
]


# --------------------------------------------------------------------------- duplicate ids, limits, counters


LIBRARY_ROWS += [
    (
        "insert: one id twice in a call",
        "id",
        lambda w: _insert(w, _memory(), _memory(content="another text")),
    ),
    ("insert: the id of a hot memory", "id", lambda w: _insert(w, _memory(id=_hot(w)))),
    (
        "insert: the id of an archived memory",
        "id",
        lambda w: _insert(w, _memory(), _memory(id=w.original_ids["good"], content="another text")),
    ),
    ("archived_ids: limit=-1", "limit", lambda w: archived_ids(w.conn, limit=-1)),
    ("archived_ids: limit='5'", "limit", lambda w: archived_ids(w.conn, limit="5")),  # type: ignore[arg-type]
    ("archived_ids: limit=True", "limit", lambda w: archived_ids(w.conn, limit=True)),
    ("archived_ids: blank user_id", "user_id", lambda w: archived_ids(w.conn, user_id=" ")),
    (
        "restore_archives: chunk_size=0",
        "chunk_size",
        lambda w: restore_archives(
            w.conn, w.store, actor="t", original_ids=[w.original_ids["good"]], chunk_size=0
        ),
    ),
    (
        "restore_archives: chunk_size=-1",
        "chunk_size",
        lambda w: restore_archives(w.conn, w.store, actor="t", user_id="u1", chunk_size=-1),
    ),
    (
        "build_context: a counter returning -1",
        "counter",
        lambda w: w.client().build_context("u1", "cortado", ["hi"], counter=lambda t: -1, record_access=True),
    ),
    (
        "build_context: a counter returning 2.5",
        "counter",
        lambda w: w.client().build_context(
            "u1",
            "cortado",
            ["hi"],
            counter=lambda t: 2.5,  # type: ignore[arg-type, return-value]
            record_access=True,
        ),
    ),
    (
        "build_context: a counter returning '3'",
        "counter",
        lambda w: w.client().build_context(
            "u1",
            "cortado",
            ["hi"],
            counter=lambda t: "3",  # type: ignore[arg-type, return-value]
            record_access=True,
        ),
    ),
    (
        "build_context: a counter returning None",
        "counter",
        lambda w: w.client().build_context(
            "u1",
            "cortado",
            ["hi"],
            counter=lambda t: None,  # type: ignore[arg-type, return-value]
            record_access=True,
        ),
    ),
    (
        "client: a token_counter returning -5",
        "token_counter",
        lambda w: MemoryClient(
            w.conn,
            embedder=HashingEmbedder(TEST_DIM),
            object_store=w.store,
            actor="test",
            token_counter=lambda t: -5,
        ),
    ),
    (
        "client: a token_counter that is not callable",
        "token_counter",
        lambda w: MemoryClient(
            w.conn,
            embedder=HashingEmbedder(TEST_DIM),
            object_store=w.store,
            actor="test",
            token_counter=42,  # type: ignore[arg-type]
        ),
    ),
]


LIBRARY_ROWS += [
    (
        "MemoryClient.from_settings: an unknown keyword",
        "actr",
        lambda w: MemoryClient.from_settings(Settings(database_url=w.url), actr="ops"),
    ),
    (
        "AsyncMemoryClient.from_settings: an unknown keyword",
        "actr",
        lambda w: asyncio.run(AsyncMemoryClient.from_settings(Settings(database_url=w.url), actr="ops")),
    ),
    (
        "AsyncMemoryClient.connect: an unknown keyword",
        "embeder",
        lambda w: asyncio.run(AsyncMemoryClient.connect(w.url, embeder=HashingEmbedder(TEST_DIM))),
    ),
]


@pytest.mark.parametrize(("name", "field", "call"), LIBRARY_ROWS, ids=[r[0] for r in LIBRARY_ROWS])
def test_library_entry_points_refuse_bad_input_and_write_nothing(world, name, field, call):
    before = world.state()
    with pytest.raises(InvalidInputError) as info:
        call(world)
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(f"invalid {field}=")
    assert world.state() == before


# --------------------------------------------------------------------------- what still works


def test_a_malformed_backup_is_also_an_integrity_error(world):
    """Callers that keep a memory archived on IntegrityError (sweeps, fidelity checks) still do."""
    with pytest.raises(IntegrityError, match="backup.importance_score"):
        world.client().expand("u1", world.archive_ids["importance"], now=NOW)


def test_the_longest_allowed_query_reaches_postgres_without_error(world):
    """MAX_QUERY_CHARS is below what Postgres' full-text parser can take, even as one-character terms."""
    terms = " ".join(str(i % 10) for i in range(MAX_QUERY_CHARS // 2))
    assert len(terms) < MAX_QUERY_CHARS
    client = world.client()
    client.search("u1", terms, now=NOW, phase2="always")
    client.search("u1", "cortado", text_query=terms, now=NOW, phase2="always")
    client.search("u1", "x" * MAX_QUERY_CHARS, now=NOW, phase2="always")


def test_iso_strings_with_an_offset_are_accepted_for_timestamps(world):
    """The documented choice: an ISO 8601 string with an offset is parsed; one without is refused."""
    client = world.client()
    as_string = client.search("u1", "cortado", now="2025-06-01T14:00:00+02:00", phase2="always")
    as_datetime = client.search("u1", "cortado", now=NOW, phase2="always")
    assert [(h.id, h.scores.final) for h in as_string] == [(h.id, h.scores.final) for h in as_datetime]
    assert len(as_datetime) > 0


def test_the_good_archive_still_expands_and_a_caller_item_with_an_aware_time_packs(world):
    client = world.client()
    expansion = client.expand("u1", world.archive_ids["good"], now=NOW)
    assert "good locker code" in expansion.content
    item = ContextItem("Earlier summary", "caller", created_at="2025-01-01T00:00:00Z")  # type: ignore[arg-type]
    assert item.created_at == datetime(2025, 1, 1, tzinfo=UTC)
    context = client.build_context("u1", "cortado", ["hello"], summaries=[item], now=NOW)
    assert any(b.text == "Earlier summary" for b in context.blocks)


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_an_unknown_keyword_names_the_public_method_never_an_internal_one(world, flavour):
    with pytest.raises(UnknownParameterError) as info:
        _call(world, flavour, lambda c: c.build_context("u1", "cortado", limt=3))
    assert (
        str(info.value) == "invalid limt=3: build_context() has no parameter 'limt' (did you mean 'limit'?)"
    )
    assert isinstance(info.value, TypeError)  # what Python raises for an unknown keyword
    assert "_search" not in str(info.value) and "_Flows" not in str(info.value)
    with pytest.raises(
        UnknownParameterError, match=r"build_context\(\) has no parameter 'sumaries' .*'summaries'"
    ):
        _call(world, flavour, lambda c: c.build_context("u1", "cortado", sumaries=["x"]))


def test_a_context_budget_with_a_bad_value_is_our_error_naming_the_field():
    """Built by a caller, ContextBudget raises InvalidInputError (never pydantic's ValidationError); as
    a settings section, the variable is named (ConfigError)."""
    with pytest.raises(InvalidInputError) as info:
        ContextBudget(total=-1)
    assert (info.value.field, info.value.value) == ("budget.total", -1)
    assert str(info.value) == "invalid budget.total=-1: Input should be greater than or equal to 0"
    with pytest.raises(InvalidInputError, match=r"^invalid budget=.*more than total=100"):
        ContextBudget(total=100)
    with pytest.raises(ConfigError, match=r"MEMORY_ARCHIVE_CONTEXT__TOTAL='-1' \(context.total\)"):
        Settings.from_env({"MEMORY_ARCHIVE_CONTEXT__TOTAL": "-1"})
    assert ContextBudget(total=9000).total == Settings(context={"total": 9000}).context.total == 9000


def test_a_date_string_in_search_filters_is_refused_naming_the_field():
    with pytest.raises(InvalidInputError) as info:
        SearchFilters(since="2024-01-01")  # type: ignore[arg-type]
    assert info.value.field == "filters.since"


def test_a_duplicate_id_names_the_id_and_its_position(world):
    hot = _hot(world)
    with pytest.raises(InvalidInputError) as info:
        _insert(world, _memory(), _memory(id=hot, content="another text"))
    assert info.value.value == hot and str(hot) in str(info.value)
    assert "memories[1]" in str(info.value) and "in memories[1]" in info.value.__notes__
    with pytest.raises(InvalidInputError, match=r"memories\[2\].*memories\[0\]"):
        _insert(world, _memory(), _memory(id=uuid.uuid4()), _memory(content="another text"))


def test_a_counter_that_goes_negative_later_is_refused_naming_what_it_returned():
    def counter(text: str) -> int:
        return -7 if "bad" in text else len(text.split())

    with pytest.raises(InvalidInputError) as info:
        assemble_context(recent_turns=["fine", "a bad turn"], counter=counter)
    assert (info.value.field, info.value.value) == ("counter", -7)
    assert str(info.value).startswith("invalid counter=-7: ")
    assemble_context(recent_turns=["fine"], counter=lambda t: np.int64(3))  # type: ignore[arg-type, return-value]  # integers of any kind count


def test_restore_of_an_unknown_original_id_names_the_field(world):
    before = world.state()
    unknown = uuid.uuid4()
    report = restore_archives(world.conn, world.store, actor="t", original_ids=[unknown])
    assert (report.requested, report.not_found) == (1, 1)
    assert any(f"original_id={unknown}" in e for e in report.errors), report.errors
    with pytest.raises(NotFoundError, match=f"original_id={unknown}"):
        world.client().restore("u1", original_id=unknown)
    assert world.state() == before


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_restore_of_an_id_of_the_wrong_kind_says_what_it_is(world, flavour):
    """An archive id (what search and expand return) given as original_id, and a memory's own id given
    as archive_id: NotFoundError saying which kind of id it is, nothing written."""
    before = world.state()
    archive_id, original_id, hot = world.archive_ids["good"], world.original_ids["good"], _hot(world)
    with pytest.raises(NotFoundError) as info:
        _call(world, flavour, lambda c: c.restore("u1", original_id=archive_id))
    assert str(info.value) == (
        f"original_id={archive_id}: that is an archive id (what search and expand return), not an "
        f"original_id; its original_id is {original_id} (user_id='u1')"
    )
    for memory_id in (original_id, hot):  # archived and hot memories' own ids
        with pytest.raises(NotFoundError) as info:
            _call(world, flavour, lambda c, m=memory_id: c.restore("u1", archive_id=m))  # type: ignore[misc]
        assert str(info.value) == (
            f"archive_id={memory_id}: that is a memory's original_id, not an archive id: restore it by "
            "original_id (user_id='u1')"
        )
    with pytest.raises(NotFoundError, match=f"no archived memory original_id={archive_id} for user_id='u2'"):
        world.client().restore("u2", original_id=archive_id)  # another user's archive id: not named
    assert world.state() == before


# --------------------------------------------------------------------------- the local object store's root


def _root_cases(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    return {
        "an existing file": a_file,
        "under an existing file": a_file / "objects",
        "under /proc": Path("/proc/memory-archive-objects"),
        "/proc itself": Path("/proc"),
    }


@pytest.mark.parametrize(
    "case", ["an existing file", "under an existing file", "under /proc", "/proc itself"]
)
def test_a_local_root_that_cannot_be_a_writable_directory_is_refused(tmp_path, case):
    root = _root_cases(tmp_path)[case]
    with pytest.raises(InvalidInputError) as info:
        LocalObjectStore(root)
    assert info.value.field == "object_store.local_root" and info.value.value == str(root)
    with pytest.raises(ConfigError) as config_info:
        object_store_from_settings(Settings(object_store=ObjectStoreConfig(local_root=root)))
    message = str(config_info.value)
    assert "MEMORY_ARCHIVE_LOCAL_ROOT" in message and repr(str(root)) in message and "\n" not in message
    assert (config_info.value.variable, config_info.value.value) == ("MEMORY_ARCHIVE_LOCAL_ROOT", str(root))


def test_a_local_root_that_does_not_exist_yet_is_created(tmp_path):
    store = object_store_from_settings(
        Settings(object_store=ObjectStoreConfig(local_root=tmp_path / "a" / "b"))
    )
    assert isinstance(store, LocalObjectStore) and store.root.is_dir()


# --------------------------------------------------------------------------- the command line


def _archive_state(url: str) -> dict[str, Any]:
    with connect(url) as conn:
        return one(
            conn.execute(
                """SELECT (SELECT count(*) FROM archival_batches) AS batches,
                          (SELECT count(*) FROM archival_attempts) AS attempts,
                          (SELECT count(*) FROM archived_memories) AS archived,
                          (SELECT count(*) FROM memory_events) AS events"""
            )
        )


def _old_memories(url: str) -> None:
    with connect(url) as conn:
        insert_memories(
            conn, make_memories(4, dim=TEST_DIM, age_days=400, now=datetime.now(UTC)), actor="test"
        )


@pytest.mark.parametrize("key", ["", "   ", "\t"])
def test_cli_archive_refuses_an_empty_batch_key(cli_env, capsys, key):
    _old_memories(cli_env)
    before = _archive_state(cli_env)
    assert main(["archive", "--batch-key", key]) == 2
    err = capsys.readouterr().err
    assert "--batch-key" in err and f"batch_key={key!r}" in err and "Traceback" not in err
    assert _archive_state(cli_env) == before


def test_cli_archive_refuses_a_local_root_that_is_a_file(cli_env, capsys, monkeypatch, tmp_path):
    _old_memories(cli_env)
    root = tmp_path / "a-file"
    root.write_text("not a directory")
    monkeypatch.setenv("MEMORY_ARCHIVE_LOCAL_ROOT", str(root))
    before = _archive_state(cli_env)
    assert main(["archive"]) == 2
    err = capsys.readouterr().err.strip()
    assert "MEMORY_ARCHIVE_LOCAL_ROOT" in err and repr(str(root)) in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert _archive_state(cli_env) == before
    assert root.read_text() == "not a directory"


def test_cli_restore_of_an_unknown_original_id_names_the_field(cli_env, capsys):
    unknown = uuid.uuid4()
    assert main(["restore", "--original-id", str(unknown)]) == 1
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["not_found"] == 1
    assert any(f"original_id={unknown}" in e for e in out["errors"]), out["errors"]
