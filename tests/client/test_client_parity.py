"""MemoryClient and AsyncMemoryClient are one API: the same public methods with the same signatures and
docstrings, MemoryClient generated from AsyncMemoryClient (tools/async_to_sync.py), and every public
method returning the same result through both on the same data."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import inspect
import re
import subprocess
import sys
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel

from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.pipeline import run_batch
from memory_lib.client import AsyncMemoryClient, MemoryClient, SearchOptions
from memory_lib.core.config import ArchivalCriteria, EmbeddingConfig, RetrievalConfig, Settings
from memory_lib.core.validation import SearchParams
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from memory_lib.storage.db import connect
from memory_lib.storage.objectstore import LocalObjectStore
from memory_lib.write.memory_api import MemoryEvent, MemoryPage, decode_cursor
from testing.consolidation import insert_digest
from testing.constants import TEST_DIM

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
SETTINGS = Settings(
    retrieval=RetrievalConfig(hot_similarity_threshold=0.2, archived_similarity_threshold=0.2)
)
# The sync names of the async side's (tools/async_to_sync.py's map, as far as the public API shows it).
SYNC_NAMES = {
    "AsyncMemoryClient": "MemoryClient",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncConnection": "Connection",
}


def _public(cls: type) -> dict[str, Any]:
    return {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}


def _as_sync(text: str) -> str:
    for name, sync in SYNC_NAMES.items():
        text = re.sub(rf"\b{name}\b", sync, text)
    return text


# --------------------------------------------------------------------------- one API


def test_both_clients_have_the_same_public_methods_signatures_and_docstrings():
    sync, aio = _public(MemoryClient), _public(AsyncMemoryClient)
    assert sorted(sync) == sorted(aio)
    assert {"add", "search", "build_context", "connect", "from_settings", "close", "forget_user"} <= set(sync)
    for name in sync:
        assert _as_sync(str(inspect.signature(aio[name]))) == str(inspect.signature(sync[name])), name
        assert aio[name].__doc__ and len(aio[name].__doc__) > 40, f"{name} has no docstring"
        assert _as_sync(aio[name].__doc__) == sync[name].__doc__, name
        assert inspect.iscoroutinefunction(aio[name]) and not inspect.iscoroutinefunction(sync[name]), name
    assert inspect.iscoroutinefunction(AsyncMemoryClient.__aenter__)
    assert callable(MemoryClient.__enter__) and callable(MemoryClient.__exit__)


def test_the_generated_client_is_what_the_tool_writes_from_the_async_one():
    done = subprocess.run(
        [sys.executable, "tools/async_to_sync.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    generated = (ROOT / "memory_lib/client/sync_client.py").read_text(encoding="utf-8")
    assert generated.startswith(
        "# generated from memory_lib/client/async_client.py by tools/async_to_sync.py"
    )
    assert "async " not in generated and "await " not in generated


def test_the_transform_drops_async_maps_names_and_keeps_comments():
    spec = importlib.util.spec_from_file_location("async_to_sync", ROOT / "tools/async_to_sync.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    source = (
        '"""Old docstring."""\n'
        "class AsyncMemoryClient:\n"
        "    async def __aenter__(self) -> AsyncMemoryClient:  # type: ignore[misc]\n"
        '        """Over the AsyncConnectionPool."""\n'
        "        async with self._conn.connection() as conn:\n"
        "            await drive_async(conn)  # noqa: B018\n"
        "        async_name = await self._resources.aclose()\n"
    )
    assert tool.to_sync(source) == (
        tool.HEADER + tool.DOCSTRING + "\n"
        "class MemoryClient:\n"
        "    def __enter__(self) -> MemoryClient:  # type: ignore[misc]\n"
        '        """Over the ConnectionPool."""\n'
        "        with self._conn.connection() as conn:\n"
        "            drive(conn)  # noqa: B018\n"
        "        async_name = self._resources.close()\n"
    )


def test_search_options_are_the_validated_search_parameters():
    """SearchOptions (the keywords of search and build_context) and SearchParams (their checks and
    defaults) name the same parameters: a keyword added to one and not the other fails here."""
    assert set(SearchOptions.__annotations__) == set(SearchParams.model_fields) - {"user_id", "query"} | {
        "filters"
    }


# --------------------------------------------------------------------------- the same results


class Ids:
    """Each run's random ids (memories, archives, digests, requests) and backup digests by order of first
    appearance, and its
    object store's location as one name, so two runs on two databases compare equal when they did the
    same things."""

    UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
    SHA256 = re.compile(r"\b[0-9a-f]{64}\b")  # a backup's digest: it covers the run's ids and times

    def __init__(self, store: LocalObjectStore) -> None:
        self.seen: dict[object, str] = {}
        self.store_root = store.root.as_uri()  # each run has its own object store

    def label(self, value: object) -> str:
        return self.seen.setdefault(value, f"id{len(self.seen)}")

    def plain(self, value: Any) -> Any:
        """`value` as comparable plain data: ids as labels, clock readings as one value, floats rounded,
        vectors as rounded lists."""
        if isinstance(value, uuid.UUID):
            return self.label(value)
        if isinstance(value, datetime) and abs(value - datetime.now(UTC)) < timedelta(hours=1):
            return (
                "<clock>"  # a database clock reading (archived_at, an event's time): the fixed NOW elsewhere
            )
        if isinstance(value, str):
            value = value.replace(self.store_root, "<store>")
            value = self.SHA256.sub(lambda m: self.label(m.group()), value)
            return self.UUID.sub(lambda m: self.label(uuid.UUID(m.group())), value)
        if isinstance(value, float | np.floating):
            return round(float(value), 9)
        if isinstance(value, np.ndarray):
            return [round(float(v), 6) for v in value]
        if isinstance(value, MemoryPage) and value.next_cursor is not None:  # it encodes an id
            value = dataclasses.replace(value, next_cursor=self.plain(decode_cursor(value.next_cursor)))
        if isinstance(value, MemoryEvent):  # its id is a sequence number; the seed's archival order is random
            value = dataclasses.replace(value, id=0, details={**value.details, "event": self.label(value.id)})
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return (
                type(value).__name__,
                {f.name: self.plain(getattr(value, f.name)) for f in dataclasses.fields(value)},
            )
        if isinstance(value, BaseModel):
            return (type(value).__name__, self.plain(value.model_dump()))
        if isinstance(value, dict):
            return {self.plain(k): self.plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            items = [self.plain(v) for v in value]
            return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
        return value


def _difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two plain values first differ (a readable failure), or None."""
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=repr):
            found = _difference(a.get(k), b.get(k), f"{path}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list | tuple):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{path}: {a!r} != {b!r}"


async def _settle(call: Any) -> Any:
    """`call()`: a sync client's result as it is, an async client's awaited; an error as (type, message)."""
    try:
        value = call()
        return await value if inspect.isawaitable(value) else value
    except Exception as exc:  # noqa: BLE001 - both clients must fail the same way
        return ("raised", type(exc).__name__, str(exc))


# Each write at its own time: list pages by (created_at, id), and ids differ between the two runs.
TEXTS = [
    ("Prefers cortado in the morning", 0.6, NOW - timedelta(minutes=3)),
    ("Kayak trip on the Douro with Tiago", 0.1, OLD),
    ("Refund for ORD-4417 approved", 0.6, NOW - timedelta(minutes=2)),
    ("Dentist appointment moved to Tuesday", 0.1, OLD - timedelta(days=1)),
    ("Garden tomatoes need compost", 0.6, NOW - timedelta(minutes=1)),
]
SOON = [NOW + timedelta(seconds=n) for n in range(6)]


def _seed(url: str, store: LocalObjectStore) -> dict[str, Any]:
    """The same data in a fresh database: hot memories, archived ones, a digest, a second user."""
    embedder = HashingEmbedder(TEST_DIM)
    conn = connect(url)
    try:
        seed = MemoryClient(conn, embedder=embedder, settings=SETTINGS, actor="seed")
        ids = [seed.add("u1", t, importance=i, tags=["seed"], now=at).memory_id for t, i, at in TEXTS]
        seed.add("u2", "Second user's locker code is in the red folder", now=NOW)
        services = ArchivalServices(ExtractiveSummarizer(), embedder, store)
        run_batch(conn, services, ArchivalCriteria(), batch_key="parity", as_of=NOW, actor="seed")
        archived = {
            r["original_id"]: r["id"]
            for r in conn.execute("SELECT id, original_id FROM archived_memories WHERE user_id = 'u1'")
        }
        digest = insert_digest(
            conn,
            embedder,
            user_id="u1",
            level=2,
            period_start=date(2024, 11, 1),
            period_end=date(2024, 12, 1),
            summary="November 2024: kayak trip on the Douro, dentist moved",
            source_memory_ids=[ids[1], ids[3], ids[0]],
        )
    finally:
        conn.close()
    assert set(archived) == {ids[1], ids[3]}  # the two old, unimportant ones
    return {"ids": ids, "kayak_archive": archived[ids[1]], "dentist": ids[3], "digest": digest}


async def _scenario(
    cls: Any, url: str, store: LocalObjectStore, seed: dict[str, Any], state_dir: Path
) -> dict[str, Any]:
    """Every public method, through `cls`, on the seeded data: what each call returned or raised."""
    ids, out = seed["ids"], {}
    settings = Settings(
        database_url=url,
        state_dir=state_dir,
        embedding=EmbeddingConfig(provider="hashing", dim=TEST_DIM),
        retrieval=SETTINGS.retrieval,
    )
    client = await _settle(lambda: cls.from_settings(settings, object_store=store, actor="test"))
    call = lambda name, *args, **kwargs: _settle(lambda: getattr(client, name)(*args, **kwargs))  # noqa: E731
    out["search"] = [
        await call("search", "u1", "kayak Douro", now=NOW),
        await call("search", "u1", "kayak Douro", phase2="always", debug=True, now=NOW),
        await call("search", "u1", "cortado", tags=["seed"], limit=2, text_query="cortado morning", now=NOW),
        await call(
            "search",
            "u1",
            "Kayak trip on the Douro in November 2024",
            phase3="always",
            follow_links=True,
            now=NOW,
        ),
        await call(
            "search",
            "u1",
            "Refund for ORD-4417",
            record_access=True,
            include_superseded=True,
            limit=1,
            now=NOW,
        ),
        await call("search", "u1", "kayak", limt=3),
        await call("search", "u1", "kayak", phase2="sometimes"),
    ]
    out["build_context"] = [
        await call(
            "build_context", "u1", "kayak", ["hello"], summaries=["Earlier: a trip"], phase2="always", now=NOW
        ),
        await call("build_context", "u1", "kayak", sumaries=["x"]),
    ]
    out["add"] = [
        await call("add", "u1", "Prefers a flat white after lunch", now=SOON[1]),
        await call("add", "u1", "prefers a flat white  after lunch", now=SOON[2]),
        await call("add", "u1", "Prefers oat milk", supersedes=ids[0], now=SOON[3]),
        await call("add", "u1", "", now=SOON[4]),
    ]
    out["expand"] = [await call("expand", "u1", seed["kayak_archive"], now=NOW)]
    out["expand_digest"] = [
        await call("expand_digest", "u1", seed["digest"]),
        await call("expand_digest", "u2", seed["digest"]),
    ]
    out["record_access"] = [await call("record_access", "u1", [ids[2], seed["kayak_archive"]], now=NOW)]
    out["restore"] = [
        await call("restore", "u2", original_id=seed["dentist"], now=NOW),
        await call("restore", "u1", original_id=seed["dentist"], now=NOW),
        await call("restore", "u1", original_id=seed["dentist"], now=NOW),
    ]
    out["update"] = [
        await call("update", "u1", ids[2], tags=["money"], now=NOW),
        await call("update", "u1", ids[4], "Garden tomatoes need compost and water", now=SOON[5]),
    ]
    out["get"] = [
        await call("get", "u1", ids[2]),
        await call("get", "u1", seed["kayak_archive"]),
        await call("get", "u2", ids[2]),
    ]
    out["history"] = [await call("history", "u1", ids[4]), await call("history", "u1", seed["dentist"])]
    first = await call("list", "u1", limit=3, include_superseded=True)
    out["list"] = [
        first,
        await call("list", "u1", limit=3, include_superseded=True, cursor=first.next_cursor),
    ]
    out["delete"] = [await call("delete", "u1", ids[2], now=NOW), await call("delete", "u1", ids[2], now=NOW)]
    out["forget"] = [await call("forget", "u1", ids[4], now=NOW), await call("forget", "u1", None, now=NOW)]
    out["forget_user"] = [await call("forget_user", "u2", now=NOW), await call("list", "u2")]
    await _settle(client.close)
    out["close"] = [(await call("search", "u1", "kayak", now=NOW))[:2]]
    connected = await _settle(
        lambda: cls.connect(url, embedder=HashingEmbedder(TEST_DIM), settings=SETTINGS, actor="test")
    )
    out["connect"] = [await _settle(lambda: connected.search("u1", "cortado", now=NOW))]
    await _settle(connected.close)
    await _settle(connected.close)  # idempotent
    return out


@pytest.fixture
def two_databases(databases, tmp_path):
    """Two fresh databases seeded alike, each with its object store."""
    worlds = []
    for name in ("a", "b"):
        url, store = databases.new(), LocalObjectStore(tmp_path / name, prefix="test")
        worlds.append((url, store, _seed(url, store)))
    yield worlds
    for url, _, _ in worlds:
        databases.drop(url)


def test_every_public_method_returns_the_same_through_both_clients(two_databases, tmp_path):
    (s_url, s_store, s_seed), (a_url, a_store, a_seed) = two_databases
    sync = asyncio.run(_scenario(MemoryClient, s_url, s_store, s_seed, tmp_path / "sync"))
    aio = asyncio.run(_scenario(AsyncMemoryClient, a_url, a_store, a_seed, tmp_path / "async"))
    covered = set(sync) - {"close"}
    assert covered == {n for n in _public(MemoryClient) if n not in ("close", "from_settings")}
    for method in sync:
        s_plain, a_plain = Ids(s_store).plain(sync[method]), Ids(a_store).plain(aio[method])
        assert s_plain == a_plain, _difference(s_plain, a_plain, method)
    # The scenario did what it says (both sides agree, so checking one is enough).
    assert [r.outcome for r in sync["add"][:3]] == ["created", "duplicate", "superseded"]
    assert sync["add"][3][:2] == ("raised", "InvalidInputError")
    assert sync["search"][5][:2] == ("raised", "UnknownParameterError") and "search()" in sync["search"][5][2]
    assert sync["build_context"][1][:2] == ("raised", "UnknownParameterError")
    assert sync["search"][1].archived and sync["search"][3].consolidated
    assert sync["expand_digest"][1][:2] == ("raised", "NotFoundError")
    assert [r.restored for r in sync["restore"][1:]] == [True, False]
    assert [r.outcome for r in sync["update"]] == ["updated", "superseded"]
    assert sync["get"][2] is None and sync["list"][1].items
    assert sync["forget_user"][1].items == [] and sync["close"][0] == ("raised", "PoolClosed")
    assert sync["connect"][0].hits
