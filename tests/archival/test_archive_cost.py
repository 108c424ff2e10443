"""What archival costs besides its result: object requests per archived memory (counted on a real
SeaweedFS), and the checkpoint rows a committed, audited night leaves behind (none) while a night
that crashed or failed its audit keeps all of its rows."""

from __future__ import annotations

from collections import Counter

import pytest

from memory_lib.archival import integrity
from memory_lib.archival.archive import (
    ArchivalServices,
    backup_batch,
    batch_status,
    commit_batch,
    embed_batch,
    summarize_batch,
)
from memory_lib.archival.claims import claim_batch
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig
from memory_lib.core.errors import IntegrityError
from memory_lib.core.models import sha256_hex
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from memory_lib.storage.store import insert_memories
from testing.backups import ARCHIVE_REFS_SQL, members_sharing
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories

N = 20
CRITERIA = ArchivalCriteria()


def _services(store) -> ArchivalServices:
    return archival_services(store)


def _count_requests(client) -> Counter[str]:
    """Every S3 request the client sends (retries included), by operation name."""
    sent: Counter[str] = Counter()

    def count(model, **_kwargs):
        sent[model.name] += 1

    client.meta.events.register("before-call.s3", count)
    return sent


def _attempt_rows(conn) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) AS n FROM archival_attempts GROUP BY 1").fetchall()
    return {r["status"]: r["n"] for r in rows}


def test_archiving_costs_one_put_one_get_and_one_head_per_lone_backup_on_s3(conn, s3_store):
    """A memory alone in its batch for its user (below archival.pack_min_members) is one object: PUT
    (its echoed SHA256 is the write's check), the fidelity GET (the round trip), commit's HEAD just
    before the original is deleted; the post-commit audit HEADs a sample (all of a small batch) and the
    retrievability probe GETs a sample (RetrievalConfig.retrievability_sample_size, all of a small batch). No
    LIST: only a backup step that follows a dead one looks for its packs. (Packs: tests/storage/test_backup_packs.py.)"""
    users = tuple(f"user{i:02d}" for i in range(N))
    insert_memories(conn, make_memories(N, dim=TEST_DIM, users=users), actor="test")
    sent = _count_requests(s3_store.client)
    report = run_batch(conn, _services(s3_store), CRITERIA, batch_key="night", as_of=NOW, actor="test")
    assert report.ok and report.archived == N
    audited = min(N, integrity.AUDIT_SAMPLE)
    probed = min(N, RetrievalConfig().retrievability_sample_size)
    assert sent == Counter({"PutObject": N, "GetObject": N + probed, "HeadObject": N + audited})
    assert s3_store.verified_by_head == 0


def test_a_put_the_server_does_not_confirm_is_checked_by_head(s3_store):
    """A server that echoes no SHA256 on PUT: the write is verified by a HEAD instead."""
    sent = _count_requests(s3_store.client)

    def drop_checksum(parsed, **_kwargs):
        parsed.pop("ChecksumSHA256", None)

    s3_store.client.meta.events.register("after-call.s3.PutObject", drop_checksum)
    data = b'{"x": 1}'
    obj = s3_store.put("test/a.json", data, sha256_hex(data))
    assert obj.size == len(data) and obj.sha256 == sha256_hex(data)
    assert sent == Counter({"PutObject": 1, "HeadObject": 1}) and s3_store.verified_by_head == 1


def test_a_put_whose_echoed_checksum_differs_fails(s3_store):
    def wrong_checksum(parsed, **_kwargs):
        parsed["ChecksumSHA256"] = "AAAA" + parsed["ChecksumSHA256"][4:]

    s3_store.client.meta.events.register("after-call.s3.PutObject", wrong_checksum)
    data = b'{"x": 2}'
    with pytest.raises(IntegrityError, match="sha256 the server stored"):
        s3_store.put("test/b.json", data, sha256_hex(data))


def test_a_committed_audited_night_keeps_no_checkpoint_rows(conn, local_store):
    insert_memories(conn, make_memories(N, dim=TEST_DIM), actor="test")
    report = run_batch(conn, _services(local_store), CRITERIA, batch_key="night", as_of=NOW, actor="test")
    assert report.ok and report.archived == N
    assert _attempt_rows(conn) == {}
    # What the rows counted is still counted; what they recorded is in the archive rows and events.
    status = batch_status(conn, "night")
    assert status.archived == status.attempted == N and status.failed == 0
    assert integrity.orphaned_backups(conn, local_store) == []
    events = conn.execute("SELECT count(*) AS n FROM memory_events WHERE event_type = 'archived'").fetchone()
    assert events["n"] == N
    # A re-run of the night finds nothing to do and changes nothing.
    again = run_batch(conn, _services(local_store), CRITERIA, batch_key="night", as_of=NOW, actor="test")
    assert again.ok and batch_status(conn, "night").archived == N and _attempt_rows(conn) == {}
    assert integrity.prune_archived_attempts(conn, "night") == 0


def test_a_night_stopped_before_commit_keeps_its_checkpoint_rows(conn, local_store):
    """A crash after the backups (nothing committed): every row stays, and the re-run resumes from them."""
    insert_memories(conn, make_memories(N, dim=TEST_DIM), actor="test")
    embedder = HashingEmbedder(dim=TEST_DIM)
    claim_batch(conn, "night", CRITERIA, NOW)
    summarize_batch(conn, "night", ExtractiveSummarizer(), CRITERIA)
    embed_batch(conn, "night", embedder, CRITERIA)
    backup_batch(conn, "night", local_store, CRITERIA)
    assert integrity.prune_archived_attempts(conn, "night") == 0
    assert _attempt_rows(conn) == {"backed_up": N}
    report = run_batch(conn, _services(local_store), CRITERIA, batch_key="night", as_of=NOW, actor="test")
    assert report.ok and report.archived == N and _attempt_rows(conn) == {}


def test_a_night_whose_audit_fails_keeps_its_checkpoint_rows(conn, local_store, monkeypatch):
    """A committed backup object gone before the audit (here a pack: every member of it is missing):
    the audit fails and keeps every row as evidence."""
    import memory_lib.archival.post_commit as post_commit

    insert_memories(conn, make_memories(N, dim=TEST_DIM), actor="test")
    lost: list[str] = []

    def audit_after_loss(conn_, store, batch_key, **kw):
        ref = conn_.execute(f"{ARCHIVE_REFS_SQL} ORDER BY a.original_id LIMIT 1").fetchone()
        lost.append(ref["storage_ref"])
        store.delete(store.key_from_ref(ref["storage_ref"]))
        return integrity.audit_batch(conn_, store, batch_key, **kw)

    monkeypatch.setattr(post_commit, "audit_batch", audit_after_loss)
    report = run_batch(conn, _services(local_store), CRITERIA, batch_key="night", as_of=NOW, actor="test")
    assert not report.ok and report.committed is not None
    assert len(report.committed.missing) == members_sharing(conn, local_store, lost[0]) > 1
    assert _attempt_rows(conn) == {"archived": N}
    assert batch_status(conn, "night").archived == N


def test_pruning_keeps_a_row_its_archive_row_does_not_confirm(conn, local_store):
    """Only a row whose archive row records the same backup (ref and sha256) is pruned."""
    insert_memories(conn, make_memories(N, dim=TEST_DIM), actor="test")
    claim_batch(conn, "night", CRITERIA, NOW)
    summarize_batch(conn, "night", ExtractiveSummarizer(), CRITERIA)
    embed_batch(conn, "night", HashingEmbedder(dim=TEST_DIM), CRITERIA)
    backup_batch(conn, "night", local_store, CRITERIA)
    commit_batch(conn, "night", local_store, CRITERIA, actor="test")
    odd = conn.execute(
        """WITH one AS (SELECT min(original_id::text)::uuid AS id FROM archived_memories),
                moved AS (INSERT INTO backup_objects (user_id, ref)
                          SELECT a.user_id, o.ref || '.moved' FROM archived_memories a, one, backup_objects o
                          WHERE a.original_id = one.id AND o.id = a.backup_object AND o.user_id = a.user_id
                          RETURNING id, user_id)
           UPDATE archived_memories a SET backup_object = moved.id FROM moved, one
           WHERE a.original_id = one.id AND a.user_id = moved.user_id RETURNING a.original_id"""
    ).fetchone()["original_id"]
    assert integrity.prune_archived_attempts(conn, "night") == N - 1
    kept = conn.execute("SELECT memory_id, status FROM archival_attempts").fetchall()
    assert [(r["memory_id"], r["status"]) for r in kept] == [(odd, "archived")]
    assert batch_status(conn, "night").archived == N
