"""get / list / update / delete / history on MemoryClient and AsyncMemoryClient (same tests, both
clients), against real Postgres and a local object store: paging, filters, supersede semantics,
audit events across hot, archived and restored states, and no call ever crossing user_id."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector_async
from psycopg.rows import dict_row

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import AsyncMemoryClient, MemoryClient
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig, Settings
from memory_lib.core.errors import InvalidInputError, NotFoundError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.db import connect
from testing.constants import TEST_DIM
from testing.factories import archival_services

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
SETTINGS = Settings(retrieval=RetrievalConfig(near_duplicate_threshold=1.0))


class Api:
    """One client flavour: every method call runs on MemoryClient, or on AsyncMemoryClient in asyncio.run."""

    def __init__(self, flavour: str, url: str, store):
        self.flavour, self.url, self.store = flavour, url, store
        self.conn = connect(url)

    def __getattr__(self, name: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.flavour == "sync":
                client = MemoryClient(
                    self.conn,
                    embedder=HashingEmbedder(TEST_DIM),
                    object_store=self.store,
                    settings=SETTINGS,
                    actor="api-test",
                )
                return getattr(client, name)(*args, **kwargs)

            async def main() -> Any:
                aconn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, row_factory=dict_row)
                await register_vector_async(aconn)
                try:
                    client = AsyncMemoryClient(
                        aconn,
                        embedder=HashingEmbedder(TEST_DIM),
                        object_store=self.store,
                        settings=SETTINGS,
                        actor="api-test",
                    )
                    return await getattr(client, name)(*args, **kwargs)
                finally:
                    await aconn.close()

            return asyncio.run(main())

        return call


@pytest.fixture(params=["sync", "async"])
def api(request, db_url, local_store):
    a = Api(request.param, db_url, local_store)
    yield a
    a.conn.close()


def _archive(api: Api, as_of: datetime = NOW) -> None:
    services = archival_services(api.store)
    report = run_batch(
        api.conn,
        services,
        ArchivalCriteria(),
        batch_key=f"b-{uuid.uuid4().hex[:8]}",
        as_of=as_of,
        actor="test",
    )
    assert report.gate_passed


def test_get_returns_both_tiers_and_never_another_users(api):
    hot = api.add(
        "u1", "Prefers a cortado", tags=["coffee"], domain="food", importance=0.9, now=NOW
    ).memory_id
    old = api.add("u1", "Old note: locker code in drawer 4", importance=0.1, now=OLD).memory_id
    _archive(api)
    got = api.get("u1", hot)
    assert (got.tier, got.content, got.tags, got.domain, got.importance) == (
        "hot",
        "Prefers a cortado",
        ("coffee",),
        "food",
        0.9,
    )
    archived = api.get("u1", old)
    assert archived.tier == "archived" and archived.content is None and archived.summary
    assert api.get("u1", archived.archive_id) == archived  # by its archive id too
    assert (
        api.get("u2", hot) is None
        and api.get("u2", old) is None
        and api.get("u2", archived.archive_id) is None
    )
    assert api.get("u1", uuid.uuid4()) is None


def test_list_pages_with_a_keyset_cursor_and_filters(api):
    ids = []
    for i in range(7):
        ids.append(
            api.add(
                "u1",
                f"note number {i} about topic {i}",
                category="semantic" if i % 2 else "episodic",
                importance=0.1 if i < 3 else 0.9,
                now=OLD + timedelta(days=i) if i < 3 else NOW - timedelta(hours=i),
            ).memory_id
        )
    api.add("u2", "someone else's note", now=NOW)
    _archive(api)  # notes 0..2 are old and unimportant: archived
    seen, cursor = [], None
    while True:
        page = api.list("u1", limit=3, cursor=cursor)
        seen += page.items
        assert len(page.items) <= 3
        cursor = page.next_cursor
        if cursor is None:
            break
        api.add(
            "u1", f"written while paging {len(seen)}", now=NOW + timedelta(days=1)
        )  # newer: never in later pages
    assert [m.id for m in seen][:7] == [ids[i] for i in (3, 4, 5, 6, 2, 1, 0)]
    assert len(seen) == 7 and all(m.user_id == "u1" for m in seen)
    assert {m.tier for m in seen} == {"hot", "archived"}
    assert [m.id for m in api.list("u1", tier="archived").items] == [ids[2], ids[1], ids[0]]
    assert {m.id for m in api.list("u1", category="semantic", tier="hot").items} == {ids[3], ids[5]}
    window = api.list("u1", created_after=OLD, created_before=OLD + timedelta(days=2))
    assert [m.id for m in window.items] == [ids[1], ids[0]]
    assert all(m.user_id == "u2" for m in api.list("u2").items) and len(api.list("u2").items) == 1


def test_update_supersedes_new_text_in_place_for_fields_and_audits_both(api):
    first = api.add("u1", "Drives a red bicycle", tags=["bike"], pinned=True, now=NOW).memory_id
    same = api.update("u1", first, importance=0.8, tags=["bike", "red"], now=NOW)
    assert (same.outcome, same.memory_id, set(same.changed)) == ("updated", first, {"importance", "metadata"})
    assert api.get("u1", first).tags == ("bike", "red") and api.get("u1", first).importance == 0.8
    assert api.update("u1", first, importance=0.8, now=NOW).outcome == "unchanged"

    newer = api.update("u1", first, "Drives a blue bicycle", now=NOW + timedelta(minutes=1))
    assert newer.outcome == "superseded" and newer.previous_id == first and newer.memory_id != first
    new = api.get("u1", newer.memory_id)
    assert (new.content, new.tags, new.pinned, new.importance) == (
        "Drives a blue bicycle",
        ("bike", "red"),
        True,
        0.8,
    )
    assert api.get("u1", first).superseded_by == newer.memory_id
    row = api.conn.execute("SELECT embedding FROM memories WHERE id = %s", (newer.memory_id,)).fetchone()
    expected = HashingEmbedder(TEST_DIM).embed(["Drives a blue bicycle"])[0]
    assert np.allclose(
        np.asarray(row["embedding"].to_list()), expected / np.linalg.norm(expected), atol=1e-5
    ) or np.allclose(np.asarray(row["embedding"].to_list()), expected, atol=1e-5)
    assert [m.id for m in api.list("u1").items] == [newer.memory_id]  # the old version is history
    assert {m.id for m in api.list("u1", include_superseded=True).items} == {first, newer.memory_id}
    assert [e.event_type for e in api.history("u1", first)] == ["created", "updated", "superseded"]
    created = api.history("u1", newer.memory_id)
    assert [e.event_type for e in created] == ["created"] and created[0].details["supersedes"] == str(first)

    with pytest.raises(InvalidInputError, match="superseded by") as e:
        api.update("u1", first, "Drives a green bicycle")
    assert e.value.field == "memory_id"
    with pytest.raises(NotFoundError):
        api.update("u2", newer.memory_id, "Drives u2's bicycle")  # another user's memory: not found
    assert api.get("u1", newer.memory_id).content == "Drives a blue bicycle"


def test_history_follows_a_memory_through_archive_and_restore(api):
    mid = api.add("u1", "Old note: the spare key is under the mat", importance=0.1, now=OLD).memory_id
    _archive(api)
    archive_id = api.get("u1", mid).archive_id
    with pytest.raises(InvalidInputError, match="is archived") as e:
        api.update("u1", mid, importance=0.5)
    assert e.value.field == "memory_id"
    api.restore("u1", original_id=mid, now=NOW)
    assert api.get("u1", mid).tier == "hot"
    events = api.history("u1", mid)
    assert [e.event_type for e in events] == ["created", "archived", "restored"]
    assert api.history("u1", archive_id) == events  # the archive id of a restored memory still leads to it
    assert api.history("u2", mid) == [] and api.history("u2", archive_id) == []


def test_delete_is_forget_of_one_memory(api):
    mid = api.add("u1", "Old note: passport number is in the safe", importance=0.1, now=OLD).memory_id
    other = api.add("u1", "Likes tennis", importance=0.9, now=NOW).memory_id
    _archive(api)
    assert list(api.store.list())
    with pytest.raises(NotFoundError):
        api.delete("u2", mid)
    result = api.delete("u1", mid)
    assert result.memory_ids == (mid,) and result.rows_deleted["archived_memories"] == 1
    assert api.get("u1", mid) is None and api.get("u1", other) is not None
    assert not list(api.store.list())
    assert [e.event_type for e in api.history("u1", mid)] == ["created", "archived", "redacted", "forgotten"]
    assert api.delete("u1", mid).already_forgotten
    with pytest.raises(NotFoundError):
        api.delete("u1", uuid.uuid4())


def test_update_to_a_case_change_or_to_another_live_memorys_text(api):
    a = api.add("u1", "Lives in lisbon", now=NOW).memory_id
    b = api.add("u1", "Works in Porto", now=NOW).memory_id
    cased = api.update("u1", a, "Lives in Lisbon")  # same dedupe key (case-folded): still a new version
    assert cased.outcome == "superseded" and api.get("u1", cased.memory_id).content == "Lives in Lisbon"
    merged = api.update("u1", cased.memory_id, "Works in Porto")  # the text of another live memory: that one
    assert (merged.outcome, merged.memory_id, merged.previous_id) == ("superseded", b, cased.memory_id)
    assert [m.id for m in api.list("u1").items] == [b]
    live = api.conn.execute(
        "SELECT count(*) AS n FROM memories WHERE user_id = 'u1' AND superseded_by IS NULL"
    )
    assert live.fetchone()["n"] == 1


def _audit(api: Api, user: str, query: str, **kw: Any) -> dict[uuid.UUID, Any]:
    """search(include_superseded=True) hits by memory id."""
    hits = api.search(user, query, include_superseded=True, now=NOW, **kw)
    return {h.provenance.memory_id: h for h in hits}


def test_search_include_superseded_and_get_show_the_chain_never_another_users(api):
    later = OLD + timedelta(minutes=1)
    first = api.add("u1", "Keeps the canoe at the Riverside boathouse", importance=0.1, now=OLD).memory_id
    newer = api.update("u1", first, "Keeps the canoe at the Harbor marina", now=later).memory_id
    theirs = api.add("u2", "Keeps the canoe at the Riverside boathouse", importance=0.1, now=OLD).memory_id
    their_newer = api.update("u2", theirs, "Keeps the kayak in the garage", now=later).memory_id
    query = "canoe Riverside boathouse"

    default = api.search("u1", query, phase2="never", now=NOW)
    assert [h.provenance.memory_id for h in default.hits] == [newer]
    assert all(h.superseded_by is None for h in default.hits)
    audit = _audit(api, "u1", query, phase2="never")
    assert set(audit) == {first, newer}
    assert (audit[first].superseded_by, audit[newer].superseded_by) == (newer, None)
    theirs_audit = _audit(api, "u2", query)
    assert theirs in theirs_audit and not set(theirs_audit) & {first, newer}
    with pytest.raises(InvalidInputError) as e:
        api.search("u1", query, include_superseded="yes")
    assert e.value.field == "include_superseded"

    old, new = api.get("u1", first), api.get("u1", newer)
    assert (old.superseded_by, old.supersedes) == (newer, None)
    assert (new.superseded_by, new.supersedes) == (None, first)
    assert [e.event_type for e in api.history("u1", first)] == ["created", "superseded"]
    assert api.get("u2", first) is None and api.get("u2", their_newer).supersedes == theirs

    # Archived (a superseded memory is archived the next night): the same, from archive rows.
    _archive(api)
    archived = api.get("u1", first)
    assert (archived.tier, archived.superseded_by) == ("archived", newer)
    assert api.get("u1", newer).supersedes == first
    assert first not in {h.provenance.memory_id for h in api.search("u1", query, phase2="always", now=NOW)}
    audit = _audit(api, "u1", query, phase2="always")
    assert audit[first].source == "archived" and audit[first].superseded_by == newer
    assert not {theirs, their_newer} & set(audit)
