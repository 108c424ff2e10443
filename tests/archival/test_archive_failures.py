"""A failure at any archival step leaves the memory hot and recorded; running again completes it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pytest

from memory_lib.archival.archive import ArchivalServices, batch_status
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.llm.embedding import Embedder, HashingEmbedder
from memory_lib.llm.summarize import AnthropicSummarizer, ExtractiveSummarizer, Summarizer
from memory_lib.storage.objectstore import ObjectStore, StoredObject
from memory_lib.storage.store import insert_memories, tier_stats
from testing.backups import ARCHIVE_REFS_SQL, backup_ref, object_refs, tamper
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories
from testing.fake_llm import FAKE_API_KEY, FakeLLMServer
from testing.rows import one

N = 40  # one failure in 40 is 2.5%: under the 5% gate, so the rest of the batch goes through
MARK = "MARKED-FOR-FAILURE"


@dataclass
class FlakyEmbedder:
    """The real hashing embedder, failing once on texts that carry the mark."""

    inner: HashingEmbedder
    failures_left: int = 1

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def dim(self) -> int:
        return self.inner.dim

    kind: Literal["lexical"] = "lexical"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.failures_left and any(MARK in t for t in texts):
            self.failures_left -= 1 if len(texts) == 1 else 0
            raise RuntimeError("embedding service unavailable")
        return self.inner.embed(texts)


@dataclass
class FlakyStore:
    """A real object store whose put fails once for one key."""

    inner: ObjectStore
    fail_key: str
    failures_left: int = 1
    calls: list[str] = field(default_factory=list)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def put(self, key: str, data: bytes, sha256: str) -> StoredObject:
        self.calls.append(key)
        if key == self.fail_key and self.failures_left:
            self.failures_left -= 1
            raise ConnectionError("upload interrupted")
        return self.inner.put(key, data, sha256)


def _setup(conn, store):
    memories = make_memories(N, dim=TEST_DIM)
    memories[7]["content"] = f"{MARK}: Omar Haddad signed contract C-77 on 3 June 2025."
    # Its user's only memory: a lone backup, so a failed PUT is this memory's alone (a pack's PUT
    # failing fails its members: tests/storage/test_backup_packs.py).
    memories[7]["user_id"] = "mallory"
    insert_memories(conn, memories, actor="test")
    return memories[7]["id"], store


def _assert_exactly_once(conn, store, expected_total: int) -> None:
    row = conn.execute(
        """SELECT (SELECT count(*) FROM memories) AS hot, (SELECT count(*) FROM archived_memories) AS archived,
                  (SELECT count(*) FROM memories m
                   JOIN archived_memories a ON a.user_id = m.user_id AND a.original_id = m.id) AS both_tiers"""
    ).fetchone()
    assert row["hot"] + row["archived"] == expected_total
    assert row["both_tiers"] == 0
    # Every archive row has its verified object; every object belongs to an archive row or an attempt record.
    refs = {r["storage_ref"] for r in conn.execute(ARCHIVE_REFS_SQL).fetchall()}
    recorded = {
        r["backup_ref"]
        for r in conn.execute(
            "SELECT backup_ref FROM archival_attempts WHERE backup_ref IS NOT NULL"
        ).fetchall()
    }
    objects = {store.ref_for(k) for k in store.list()}
    assert object_refs(store, refs) <= objects
    assert objects <= object_refs(store, refs | recorded)


@pytest.mark.parametrize("step", ["summarize", "embed", "upload", "verify", "commit"])
def test_failure_at_each_step_is_recorded_and_retried(conn, local_store, step, tmp_path, test_trigger):
    marked_id, store = _setup(conn, local_store)
    summarizer: Summarizer = ExtractiveSummarizer()
    embedder: Embedder = HashingEmbedder(dim=TEST_DIM)
    server = None
    if step == "summarize":
        # A real SDK against a local server that fails this memory's requests with a 500.
        server = FakeLLMServer().__enter__()
        server.fail_when_contains = MARK
        summarizer = AnthropicSummarizer(
            FAKE_API_KEY, base_url=server.base_url, max_retries=1, retry_wait_max=0.01
        )
    elif step == "embed":
        embedder = FlakyEmbedder(HashingEmbedder(dim=TEST_DIM))
    elif step == "upload":
        store = FlakyStore(local_store, local_store.key_for(marked_id))
    elif step == "commit":
        test_trigger(
            "fail_marked",
            "archived_memories",
            "BEFORE INSERT",
            f"BEGIN IF NEW.original_id = '{marked_id}' THEN RAISE EXCEPTION 'disk full'; END IF; RETURN NEW; END",
        )

    svc = ArchivalServices(summarizer, embedder, store)
    criteria = ArchivalCriteria()
    try:
        if step == "verify":
            # Tamper with the marked backup between its upload and the commit.
            from memory_lib.archival.archive import backup_batch, commit_batch, embed_batch, summarize_batch
            from memory_lib.archival.claims import claim_batch

            claim_batch(conn, "night", criteria, NOW)
            summarize_batch(conn, "night", summarizer, criteria)
            embed_batch(conn, "night", embedder, criteria)
            backup_batch(conn, "night", store, criteria)
            tamper(local_store, backup_ref(conn, marked_id), b"Omar", b"Omer")
            commit_batch(conn, "night", store, criteria, actor="test")
            first = batch_status(conn, "night")
        else:
            first = run_batch(conn, svc, criteria, batch_key="night", as_of=NOW, actor="test").status
    finally:
        if server is not None:
            server.fail_when_contains = None

    expected_step = {"upload": "backup"}.get(step, step)
    assert first.failed == 1 and first.failed_by_step == {expected_step: 1}
    assert first.archived == N - 1
    hot = conn.execute("SELECT id FROM memories").fetchall()
    assert [r["id"] for r in hot] == [marked_id]
    attempt = conn.execute(
        "SELECT status, failed_step, error, attempts FROM archival_attempts WHERE memory_id = %s",
        (marked_id,),
    ).fetchone()
    assert attempt["error"] and attempt["failed_step"] == expected_step and attempt["attempts"] == 1
    _assert_exactly_once(conn, local_store, N)

    if step == "commit":
        conn.execute("DROP TRIGGER fail_marked ON archived_memories")
    second = run_batch(conn, svc, criteria, batch_key="night", as_of=NOW, actor="test").status
    if server is not None:
        server.__exit__(None, None, None)
    assert second.archived == N and second.failed == 0
    stats = tier_stats(conn)
    assert (stats.hot, stats.archived) == (0, N)
    _assert_exactly_once(conn, local_store, N)
    archived = {r["storage_ref"] for r in conn.execute(ARCHIVE_REFS_SQL).fetchall()}
    assert {local_store.ref_for(k) for k in local_store.list()} == object_refs(local_store, archived)
    events = conn.execute(
        "SELECT count(*) AS n, count(DISTINCT memory_id) AS d FROM memory_events WHERE event_type = 'archived'"
    ).fetchone()
    assert events["n"] == events["d"] == N


def test_error_rate_above_gate_deletes_nothing(conn, local_store):
    """10% of summaries failing: the gate holds every original, even the ones that succeeded."""
    memories = make_memories(N, dim=TEST_DIM)
    insert_memories(conn, memories, actor="test")
    with FakeLLMServer() as server:
        server.fail_fraction = 0.1
        server.fail_status = 400
        summarizer = AnthropicSummarizer(FAKE_API_KEY, base_url=server.base_url, max_retries=0)
        svc = archival_services(local_store, summarizer=summarizer)
        report = run_batch(conn, svc, ArchivalCriteria(), batch_key="night", as_of=NOW, actor="test")
    assert not report.gate_passed
    assert report.status.error_rate > 0.05
    assert tier_stats(conn).archived == 0 and tier_stats(conn).hot == N
    assert (
        one(conn.execute("SELECT count(*) AS n FROM memory_events WHERE event_type = 'archived'"))["n"] == 0
    )


def test_memory_changed_after_backup_is_backed_up_again(conn, local_store):
    from memory_lib.archival.archive import backup_batch, commit_batch, embed_batch, summarize_batch
    from memory_lib.archival.claims import claim_batch

    memories = make_memories(5, dim=TEST_DIM)
    insert_memories(conn, memories, actor="test")
    criteria = ArchivalCriteria()
    embedder = HashingEmbedder(dim=TEST_DIM)
    claim_batch(conn, "night", criteria, NOW)
    summarize_batch(conn, "night", ExtractiveSummarizer(), criteria)
    embed_batch(conn, "night", embedder, criteria)
    backup_batch(conn, "night", local_store, criteria)
    changed = memories[0]["id"]
    conn.execute("UPDATE memories SET metadata = metadata || '{\"edited\": true}' WHERE id = %s", (changed,))
    commit_batch(conn, "night", local_store, criteria, actor="test")
    assert [r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()] == [changed]
    # The next run backs it up again with the edit, then archives it.
    backup_batch(conn, "night", local_store, criteria)
    commit_batch(conn, "night", local_store, criteria, actor="test")
    assert tier_stats(conn).archived == 5
    from memory_lib.core.models import BackupObject

    data = local_store.get(local_store.key_for(changed))
    assert BackupObject.from_json_bytes(data).metadata["edited"] is True


def test_memory_failing_every_night_is_released(conn, local_store):
    memories = make_memories(3, dim=TEST_DIM)
    insert_memories(conn, memories, actor="test")
    store = FlakyStore(local_store, local_store.key_for(memories[0]["id"]), failures_left=10**6)
    svc = archival_services(store)
    criteria = ArchivalCriteria(max_error_rate=1.0, max_attempts=2)
    for _ in range(3):
        run_batch(conn, svc, criteria, batch_key="night", as_of=NOW, actor="test")
    attempt = conn.execute(
        "SELECT status, attempts FROM archival_attempts WHERE memory_id = %s", (memories[0]["id"],)
    ).fetchone()
    assert attempt == {"status": "released", "attempts": 2}
    # Released: it stays hot and no later night claims it again (until the memory changes).
    report = run_batch(conn, svc, criteria, batch_key="night-2", as_of=NOW, actor="test")
    assert report.claim is not None
    assert report.claim.claimed == 0
    assert uuid.UUID(str(memories[0]["id"])) in {
        r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()
    }
