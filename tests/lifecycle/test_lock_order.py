"""The rule of memory_lib.core.locks holds: expand, re-promotion and restore read the backup from object
storage with no lock held and re-check the row once locked; re-embedding (dual write and backfill)
embeds with no lock held and writes only rows still as they were embedded."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, Settings
from memory_lib.core.errors import NotFoundError
from memory_lib.core.locks import user_lock_key
from memory_lib.lifecycle import reembedding
from memory_lib.lifecycle.restore import restore_archive, restore_archives
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from memory_lib.storage.db import connect
from testing.backups import ARCHIVE_ROWS_SQL
from testing.constants import TEST_DIM

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)
TEXT = "Anniversary dinner booked at Casa Lumi for 14 June, table 7, deposit 80 EUR paid by card."


def _free(other, user_id: str, table: str, row_id: uuid.UUID) -> bool:
    """From another session: neither the user's write lock nor the row's lock is held by anyone."""
    with other.transaction():
        took = other.execute(
            f"SELECT pg_try_advisory_xact_lock({user_lock_key('%(u)s')}) AS ok", {"u": user_id}
        ).fetchone()["ok"]
        row = other.execute(  # by (user_id, id): a row lock stays on the user's shard when distributed
            f"SELECT id FROM {table} WHERE user_id = %s AND id = %s FOR UPDATE SKIP LOCKED", (user_id, row_id)
        ).fetchone()
    return bool(took) and row is not None


class _WatchedStore:
    """The object store, checking at each backup read that no lock of the row's user is held; `during`
    runs once, at the first read (a concurrent change between the read and the lock)."""

    def __init__(self, store, other, archive_id: uuid.UUID, during=None):
        self.store, self.other, self.archive_id, self.during = store, other, archive_id, during
        self.reads: list[bool] = []

    def read_ref(self, ref: str, sha256: str) -> bytes:
        self.reads.append(_free(self.other, "u1", "archived_memories", self.archive_id))
        if self.during is not None:
            self.during, during = None, self.during
            during()
        return self.store.read_ref(ref, sha256)

    def __getattr__(self, name: str):
        return getattr(self.store, name)


@pytest.fixture
def other(db_url):
    """A second session on the test's database."""
    c = connect(db_url)
    yield c
    c.close()


@pytest.fixture
def archived(conn, local_store):
    client = MemoryClient(
        conn, embedder=HashingEmbedder(TEST_DIM), object_store=local_store, settings=Settings(), actor="test"
    )
    added = client.add("u1", TEXT, importance=0.1, now=OLD)
    services = ArchivalServices(ExtractiveSummarizer(), HashingEmbedder(TEST_DIM), local_store)
    report = run_batch(conn, services, ArchivalCriteria(), batch_key="night-1", as_of=NOW, actor="test")
    assert report.status.failed == 0
    row = conn.execute(f"{ARCHIVE_ROWS_SQL} WHERE a.original_id = %s", (added.memory_id,)).fetchone()
    return added.memory_id, row["id"]


def _client(conn, store) -> MemoryClient:
    return MemoryClient(
        conn, embedder=HashingEmbedder(TEST_DIM), object_store=store, settings=Settings(), actor="test"
    )


def test_expand_and_restore_read_the_backup_with_no_lock_held(conn, other, local_store, archived):
    memory_id, archive_id = archived
    store = _WatchedStore(local_store, other, archive_id)
    client = _client(conn, store)
    for day in (1, 2, 3):  # the third expansion re-promotes it, in the same transaction
        exp = client.expand("u1", archive_id, now=NOW + timedelta(days=day))
    assert exp.promoted and exp.content == TEXT
    assert store.reads == [True, True, True]
    types = [
        r["event_type"]
        for r in conn.execute("SELECT event_type FROM memory_events WHERE memory_id = %s", (memory_id,))
    ]
    assert types.count("expanded") == 3 and types.count("promoted") == 1


def test_a_row_restored_between_the_read_and_the_lock_is_not_expanded(conn, other, local_store, archived):
    memory_id, archive_id = archived

    def restore_meanwhile() -> None:
        restore_archive(other, local_store, user_id="u1", original_id=memory_id, actor="other")

    store = _WatchedStore(local_store, other, archive_id, during=restore_meanwhile)
    with pytest.raises(NotFoundError, match="promoted back to hot memory"):
        _client(conn, store).expand("u1", archive_id, now=NOW + timedelta(days=1))
    assert store.reads == [True]
    types = [
        r["event_type"]
        for r in conn.execute("SELECT event_type FROM memory_events WHERE memory_id = %s", (memory_id,))
    ]
    assert "expanded" not in types and types.count("restored") == 1


def test_a_restore_reads_again_when_the_row_changed_under_it(conn, other, local_store, archived):
    """A concurrent restore and re-archival between the read and the lock: the row is another one (a
    new archive id, a new backup), so the restore reads again and restores the row that is there."""
    memory_id, archive_id = archived

    def restore_and_archive_again() -> None:
        restore_archive(other, local_store, user_id="u1", original_id=memory_id, actor="other", now=NOW)
        services = ArchivalServices(ExtractiveSummarizer(), HashingEmbedder(TEST_DIM), local_store)
        later = NOW + timedelta(days=400)
        report = run_batch(other, services, ArchivalCriteria(), batch_key="night-2", as_of=later, actor="t")
        assert report.status.archived == 1

    store = _WatchedStore(local_store, other, archive_id, during=restore_and_archive_again)
    result = restore_archive(conn, store, user_id="u1", original_id=memory_id, actor="test")
    assert (
        conn.execute("SELECT 1 FROM archived_memories WHERE original_id = %s", (memory_id,)).fetchone()
        is None
    )
    assert result.restored and len(store.reads) == 2
    assert (
        conn.execute("SELECT content FROM memories WHERE id = %s", (memory_id,)).fetchone()["content"] == TEXT
    )


class _WatchedEmbedder(HashingEmbedder):
    """The secondary space's embedder, checking at each call that the rows it embeds are not locked;
    `during` runs once, at the first call."""

    def __init__(self, dim: int, other, during=None):
        super().__init__(dim)
        self.other, self.during = other, during
        self.free: list[bool] = []

    def embed(self, texts):
        ids = [
            r["id"]
            for r in self.other.execute("SELECT id FROM memories WHERE content = ANY(%s)", (list(texts),))
        ]
        self.free.extend(_free(self.other, "u1", "memories", i) for i in ids)
        if self.during is not None:
            self.during, during = None, self.during
            during()
        return super().embed(texts)


def test_the_backfill_embeds_with_no_lock_held_and_skips_a_row_changed_meanwhile(conn, other, local_store):
    client = _client(conn, local_store)
    kept = client.add("u1", "Waters the fern every Sunday.", now=NOW)
    changed = client.add("u1", "Keeps the spare key under the blue pot.", now=NOW)
    reembedding.start(conn, "hashing-lexical-v1-96", 96, actor="test")

    def edit_meanwhile() -> None:  # a write that changes the text but not the vector (the guard's case aside)
        other.execute(
            """UPDATE memories SET content = 'Keeps the spare key with the neighbour.',
                      content_sha256 = encode(sha256('Keeps the spare key with the neighbour.'), 'hex')
               WHERE id = %s""",
            (changed.memory_id,),
        )

    embedder = _WatchedEmbedder(96, other, during=edit_meanwhile)
    assert reembedding.backfill_batch(conn, embedder, "hot") == 1  # the changed row stays pending
    assert embedder.free and all(embedder.free)
    rows = {
        r["id"]: r
        for r in conn.execute("SELECT id, content, embedding_next, embedding_model_next FROM memories")
    }
    np.testing.assert_allclose(
        rows[kept.memory_id]["embedding_next"].to_numpy(),
        HashingEmbedder(96).embed([rows[kept.memory_id]["content"]])[0],
        atol=1e-6,
    )
    assert rows[changed.memory_id]["embedding_model_next"] is None
    assert reembedding.backfill_batch(conn, HashingEmbedder(96), "hot") == 1  # the next batch fills it
    assert reembedding.pending(conn, "hot") == 0


class _SessionWatchedStore:
    """The object store, recording at each backup read how many advisory locks (the users' write
    locks) the restoring session holds."""

    def __init__(self, store, other, pid: int):
        self.store, self.other, self.pid = store, other, pid
        self.held: list[int] = []

    def _watch(self) -> None:
        time.sleep(0.3)  # a slow read: a session that locked before waiting for it holds the lock now
        row = self.other.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = %s AND granted",
            (self.pid,),
        ).fetchone()
        self.held.append(int(row["n"]))

    def get_verified(self, key: str, sha256: str) -> bytes:
        self._watch()
        return self.store.get_verified(key, sha256)

    def read_ref(self, ref: str, sha256: str) -> bytes:
        self._watch()
        return self.store.read_ref(ref, sha256)

    def __getattr__(self, name: str):
        return getattr(self.store, name)


def test_the_bulk_restore_reads_a_group_before_it_locks_it(conn, other, local_store, archived):
    client = _client(conn, local_store)
    second = client.add("u1", "Renews the passport before the trip in March.", importance=0.1, now=OLD)
    services = ArchivalServices(ExtractiveSummarizer(), HashingEmbedder(TEST_DIM), local_store)
    run_batch(conn, services, ArchivalCriteria(), batch_key="night-2", as_of=NOW, actor="test")
    store = _SessionWatchedStore(local_store, other, conn.info.backend_pid)
    report = restore_archives(conn, store, actor="test", user_id="u1")
    assert report.restored == 2 and report.failed == 0
    assert len(store.held) == 2 and store.held == [0, 0]
    hot = {r["id"] for r in conn.execute("SELECT id FROM memories WHERE user_id = 'u1'")}
    assert {archived[0], second.memory_id} <= hot
