"""1,000 memories archived to a real S3 server and restored: every field and every bit comes back."""

from __future__ import annotations

from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig
from memory_lib.core.models import BackupObject, sha256_hex
from memory_lib.lifecycle.restore import archived_ids, restore_archive
from memory_lib.storage.packs import backup_sql
from memory_lib.storage.store import insert_memories, tier_stats
from testing.factories import NOW, archival_services, make_memories, snapshot

DIM = 1536  # the default dimension


def test_thousand_memories_round_trip_through_s3(make_conn, s3_store):
    conn = make_conn(DIM)
    memories = make_memories(1000, dim=DIM, users=("alice", "bob", "carol"))
    ids = insert_memories(conn, memories, actor="test")
    before = snapshot(conn, ids)
    assert len(before) == 1000

    svc = archival_services(s3_store, DIM)
    criteria = ArchivalCriteria()
    # 200 copies of each of five sentences differing by one number: their first sentences do not tell
    # them apart, so the retrievability probe (tests/archival/test_post_commit.py) runs without a floor.
    unfloored = RetrievalConfig(retrievability_floor=0.0)
    for night in ("n1", "n2"):
        report = run_batch(conn, svc, criteria, batch_key=night, as_of=NOW, actor="test", retrieval=unfloored)
        assert report.gate_passed and report.status.failed == 0
        assert report.status.archived == 500  # the nightly cap

    stats = tier_stats(conn)
    assert (stats.hot, stats.archived) == (0, 1000)
    keys = set(s3_store.list())

    # Every archive row's sha256 is the sha256 of the stored object and of the original's canonical form.
    rows = conn.execute(
        f"SELECT a.original_id, {backup_sql('a')}, a.backup_size_bytes, a.archived_at,"
        " a.archive_reason, a.storage_verified FROM archived_memories a"
    ).fetchall()
    # Three users' memories of two nights: one pack per user and night (memory_lib.storage.packs), nothing else.
    assert keys == {s3_store.key_from_ref(r["storage_ref"]) for r in rows} and len(keys) == 6
    for row in rows:
        data = s3_store.read_ref(row["storage_ref"], row["backup_sha256"])  # the member's own ranged GET
        assert sha256_hex(data) == row["backup_sha256"] and len(data) == row["backup_size_bytes"]
        assert row["storage_verified"]
        original = dict(before[row["original_id"]])
        doc = BackupObject.from_json_bytes(data)
        assert doc.content == original["content"]
        assert doc.embedding_array().tobytes() == original["embedding"]
        assert doc.entity_links == list(original["entity_links"])
        assert doc.metadata == original["metadata"]
        assert doc.created_at == original["created_at"]
        assert doc.archived_at == row["archived_at"]

    archived_events = conn.execute(
        "SELECT count(*) AS n FROM memory_events WHERE event_type = 'archived'"
    ).fetchone()["n"]
    assert archived_events == 1000

    for user_id, original_id in archived_ids(conn):
        result = restore_archive(conn, s3_store, user_id=user_id, original_id=original_id, actor="test")
        assert result.restored

    after = snapshot(conn, ids)
    assert after == before  # every column, embeddings compared as raw float32 bytes
    stats = tier_stats(conn)
    assert (stats.hot, stats.archived) == (1000, 0)
    restored_events = conn.execute(
        "SELECT count(*) AS n FROM memory_events WHERE event_type = 'restored'"
    ).fetchone()["n"]
    assert restored_events == 1000
