"""The write path: long texts as chunks, TTL expiry archived by the nightly run,
near-duplicates per embedder with the default settings, against the embedded Postgres."""

from __future__ import annotations

import importlib.util
import random
from datetime import UTC, date, datetime, timedelta

import pytest

from memory_lib.archival import nights
from memory_lib.archival.archive import ArchivalServices
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria, Settings
from memory_lib.core.models import sha256_hex
from memory_lib.lifecycle.eligibility import REASON_TTL_EXPIRED, eligible_counts
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.write import chunking
from testing.factories import archival_services, make_client
from testing.rows import one

NIGHT = date(2026, 5, 10)
TZ = "UTC"


def as_of(night: date) -> datetime:
    return nights.night_as_of(night, TZ)


def _services(store) -> ArchivalServices:
    return archival_services(store)


# --------------------------------------------------------------------------- chunking

_TOPICS = ["harbour", "ferry", "lighthouse", "storm", "tide", "cargo", "pilot", "anchor", "gull", "quay"]


def long_text(tokens: int = 3000, seed: int = 4) -> str:
    """Generated prose of about `tokens` WordPiece tokens; one sentence names the Vellmar invoice."""
    rng = random.Random(seed)
    sentences: list[str] = []
    while chunking.count_tokens(" ".join(sentences)) < tokens:
        a, b = rng.sample(_TOPICS, 2)
        sentences.append(
            f"The {a} log for day {len(sentences)} notes that the {b} crew checked the harbour "
            f"charts before {rng.choice(['dawn', 'noon', 'dusk'])} and wrote it down."
        )
    sentences.insert(
        len(sentences) * 2 // 3, "The Vellmar invoice of 1,870 EUR was settled by the quartermaster."
    )
    return " ".join(sentences)


def test_a_3000_token_text_is_stored_as_overlapping_chunks_and_found_once_per_parent(conn):
    client = make_client(conn)
    text = long_text()
    total = chunking.count_tokens(text)
    assert 3000 <= total <= 3100
    added = client.add("u1", text, tags=["logbook"], category="semantic", ttl_days=30, now=as_of(NIGHT))
    assert added.outcome == "created" and added.parent_id is not None
    rows = conn.execute(
        """SELECT id, content, metadata, category, ttl_days, expires_at FROM memories WHERE user_id = 'u1'
           ORDER BY (metadata -> 'chunk' ->> 'index')::int"""
    ).fetchall()
    assert [r["id"] for r in rows] == list(added.chunk_ids) and len(rows) >= 6
    chunks = [r["metadata"]["chunk"] for r in rows]
    assert {c["parent_id"] for c in chunks} == {str(added.parent_id)}
    assert [c["index"] for c in chunks] == list(range(len(rows))) and {c["count"] for c in chunks} == {
        len(rows)
    }
    counts = [chunking.count_tokens(r["content"]) for r in rows]
    assert max(counts) <= 512 and sum(counts) > total  # overlapping
    for a, b in zip(chunks, chunks[1:], strict=False):
        shared = chunking.count_tokens(text[b["start"] : a["end"]])
        assert 20 <= shared <= 30, (a, b, shared)
    # Every chunk carries the parent's fields; together they are the text, nothing lost.
    assert {r["category"] for r in rows} == {"semantic"} and all(
        r["metadata"]["tags"] == ["logbook"] for r in rows
    )
    assert {r["ttl_days"] for r in rows} == {30} and {r["expires_at"] for r in rows} == {added.expires_at}
    assert (
        chunking.join_chunks(
            [(c["start"], c["end"], r["content"]) for c, r in zip(chunks, rows, strict=True)]
        )
        == text
    )

    # Searched as memories, returned once per parent: its best chunk, with the parent's provenance.
    client.add("u1", "The harbour office closes at six on Sundays", now=as_of(NIGHT))
    result = client.search("u1", "harbour charts crew log", phase2="never", now=as_of(NIGHT))
    parents = [h.provenance.parent_id for h in result if h.provenance.parent_id is not None]
    assert parents == [added.parent_id]
    assert result.hot_candidates > len(result.hits)  # several chunks were candidates
    hit = client.search("u1", "Vellmar invoice quartermaster", phase2="never", now=as_of(NIGHT)).hits[0]
    assert "Vellmar invoice" in hit.text
    assert hit.provenance.parent_id == added.parent_id and hit.provenance.chunk_count == len(rows)
    assert hit.provenance.chunk_index is not None
    assert hit.provenance.memory_id == added.chunk_ids[hit.provenance.chunk_index]

    # The same long text again is a duplicate of its parent; nothing new is written.
    again = client.add("u1", "  " + text.replace(" ", "  ") + " ", now=as_of(NIGHT) + timedelta(days=1))
    assert again.outcome == "duplicate" and again.parent_id == added.parent_id
    assert again.chunk_ids == added.chunk_ids
    assert one(conn.execute("SELECT count(*) AS n FROM memories"))["n"] == len(rows) + 1


def test_chunks_never_supersede_and_are_never_superseded(conn):
    client = make_client(conn)
    text = long_text(1200, seed=9)
    added = client.add("u1", text, now=as_of(NIGHT))
    first = one(conn.execute("SELECT content FROM memories WHERE id = %s", (added.chunk_ids[0],)))["content"]
    # A short text equal to a chunk but for one word would supersede a memory; a chunk is a passage.
    changed = first.replace("harbour", "marina", 1)
    other = client.add("u1", changed, now=as_of(NIGHT))
    assert other.outcome == "created"
    live = one(conn.execute("SELECT count(*) AS n FROM memories WHERE superseded_by IS NULL"))["n"]
    assert live == len(added.chunk_ids) + 1


def test_chunks_of_a_parent_are_archived_as_memories_and_still_come_back_once(conn, local_store):
    client = make_client(conn, local_store)
    old = as_of(NIGHT) - timedelta(days=400)
    added = client.add("u1", long_text(1500, seed=2), importance=0.1, now=old)
    client.add("u1", "The harbour crew sings on Fridays", importance=0.9, now=as_of(NIGHT))
    report = nights.run_night(conn, _services(local_store), ArchivalCriteria(), NIGHT, TZ)
    assert report.ok and report.archived == len(added.chunk_ids)
    rows = conn.execute("SELECT original_id, metadata FROM archived_memories").fetchall()
    assert {r["original_id"] for r in rows} == set(added.chunk_ids)
    assert {r["metadata"]["chunk"]["parent_id"] for r in rows} == {str(added.parent_id)}
    result = client.search("u1", "harbour charts crew log", phase2="always", now=as_of(NIGHT))
    assert [h.provenance.parent_id for h in result.archived] == [added.parent_id]
    # Every chunk expands byte-exact, and the chunks give the parent's text back.
    texts = []
    for r in conn.execute("SELECT id FROM archived_memories").fetchall():
        e = client.expand("u1", r["id"], now=as_of(NIGHT))
        c = e.original.metadata["chunk"]
        texts.append((c["start"], c["end"], e.content))
    assert chunking.join_chunks(texts) == chunking.join_chunks(texts[::-1])
    assert sha256_hex(chunking.join_chunks(texts)) == sha256_hex(long_text(1500, seed=2))


def test_the_local_embedder_gets_chunks_it_reads_whole():
    assert chunking.chunk_limits(512, 25, None) == (512, 25)
    assert chunking.chunk_limits(512, 25, 254) == (254, 25)
    chunks = chunking.split(long_text(1000), max_tokens=254, overlap=25)
    assert max(c.tokens for c in chunks) <= 254 and len(chunks) >= 4
    assert chunking.split("a short note") == [chunking.Chunk(0, "a short note", 0, 12, 3)]


# --------------------------------------------------------------------------- TTL


def test_an_expired_memory_is_archived_at_the_next_night_with_reason_ttl_expired(conn, local_store):
    client = make_client(conn, local_store)
    written = as_of(NIGHT) - timedelta(hours=12)
    text = "Gate code for the Tuesday delivery is 4471 — valid this week only"
    short = client.add("u1", text, ttl_days=3, importance=0.9, now=written)
    assert short.expires_at == written + timedelta(days=3)
    row = conn.execute(
        "SELECT ttl_days, expires_at, pinned FROM memories WHERE id = %s", (short.memory_id,)
    ).fetchone()
    assert (row["ttl_days"], row["expires_at"], row["pinned"]) == (3, short.expires_at, False)
    canonical = client.add("u1", "Blood type is O negative", ttl_days=0, now=written)
    assert canonical.expires_at is None
    assert one(conn.execute("SELECT pinned FROM memories WHERE id = %s", (canonical.memory_id,)))["pinned"]
    plain = client.add("u1", "Likes the harbour walk on Sundays", now=written)
    # get and list show the expiry
    record = client.get("u1", short.memory_id)
    assert record is not None
    assert (record.tier, record.ttl_days, record.expires_at) == ("hot", 3, short.expires_at)
    listed = {r.id: r for r in client.list("u1").items}
    assert (
        listed[short.memory_id].expires_at == short.expires_at and listed[plain.memory_id].expires_at is None
    )
    assert listed[canonical.memory_id].ttl_days == 0 and listed[canonical.memory_id].pinned

    # Nights before it expires archive nothing (it is important and recent: only the TTL can take it).
    for i in range(3):
        report = nights.run_night(
            conn, _services(local_store), ArchivalCriteria(), NIGHT + timedelta(days=i), TZ
        )
        assert report.ok and report.archived == 0
    expired_night = NIGHT + timedelta(days=3)
    assert eligible_counts(conn, ArchivalCriteria(), as_of(expired_night)) == {REASON_TTL_EXPIRED: 1}
    report = nights.run_night(conn, _services(local_store), ArchivalCriteria(), expired_night, TZ)
    assert report.ok and report.archived == 1, report.problem
    assert report.claim is not None and report.claim.by_reason == {REASON_TTL_EXPIRED: 1}
    arch = conn.execute("SELECT id, original_id, archive_reason FROM archived_memories").fetchone()
    assert (arch["original_id"], arch["archive_reason"]) == (short.memory_id, REASON_TTL_EXPIRED)
    hot = {r["id"] for r in conn.execute("SELECT id FROM memories").fetchall()}
    assert hot == {canonical.memory_id, plain.memory_id}
    # Archived, not dropped: the original comes back byte for byte.
    expansion = client.expand("u1", arch["id"], now=as_of(expired_night))
    assert (
        expansion.content.encode() == text.encode()
        and expansion.original.archive_reason == REASON_TTL_EXPIRED
    )
    record = client.get("u1", short.memory_id)
    assert record is not None
    assert (record.tier, record.archive_reason, record.expires_at) == ("archived", REASON_TTL_EXPIRED, None)


def test_ttl_expiry_takes_an_exempt_category_but_never_a_pinned_memory(conn):
    client = make_client(conn)
    t = as_of(NIGHT)
    core = client.add("u1", "Current project codename is Heron", category="core", ttl_days=1, now=t)
    pinned = client.add("u1", "Emergency contact is Maria", pinned=True, now=t)
    later = as_of(NIGHT + timedelta(days=5))
    counts = eligible_counts(conn, ArchivalCriteria(), later)
    assert counts == {REASON_TTL_EXPIRED: 1}
    ids = {
        r["id"] for r in conn.execute("SELECT id FROM memories WHERE expires_at <= %s", (later,)).fetchall()
    }
    assert ids == {core.memory_id} and pinned.memory_id not in ids


def test_the_same_text_with_a_ttl_renews_the_expiry(conn):
    client = make_client(conn)
    t = as_of(NIGHT)
    first = client.add("u1", "Parking permit is on the dashboard", ttl_days=2, now=t)
    again = client.add("u1", "Parking permit is on the dashboard", ttl_days=10, now=t + timedelta(days=1))
    assert again.outcome == "duplicate" and again.expires_at == t + timedelta(days=11)
    kept = client.add("u1", "parking permit is on the dashboard", now=t + timedelta(days=2))
    assert kept.expires_at == t + timedelta(days=11)
    row = conn.execute(
        "SELECT ttl_days, expires_at FROM memories WHERE id = %s", (first.memory_id,)
    ).fetchone()
    assert (row["ttl_days"], row["expires_at"]) == (10, t + timedelta(days=11))


# --------------------------------------------------------------------------- the README example, default settings

README_OLD = "Prefers a cortado in the morning"
README_NEW = "Prefers a flat white in the morning"


def _readme_example(client: MemoryClient, conn) -> None:
    """Add-only by default: a changed value is a second memory until the caller says what it replaces."""
    t = datetime(2026, 3, 1, 9, tzinfo=UTC)
    old = client.add("alice", README_OLD, now=t)
    kept = client.add("bob", README_OLD, now=t)
    both = client.add("bob", README_NEW, now=t + timedelta(hours=1))
    assert both.outcome == "created" and kept.outcome == "created"
    new = client.add("alice", README_NEW, supersedes=old.memory_id, now=t + timedelta(hours=1))
    assert new.outcome == "superseded" and new.previous_id == old.memory_id, new
    assert new.change is not None and new.change.added == ("flat", "white")
    live = conn.execute(
        "SELECT content FROM memories WHERE superseded_by IS NULL AND user_id = 'alice'"
    ).fetchall()
    assert [r["content"] for r in live] == [README_NEW]
    # Unrelated and related-but-different facts stay separate memories.
    assert client.add("alice", "Drinks green tea in the evening", now=t).outcome == "created"
    assert client.add("alice", "ORD-4471 refund requested", now=t).outcome == "created"
    assert client.add("alice", "ORD-4147 refund requested", now=t).outcome == "created"  # another order


def test_the_readme_example_with_the_default_hashing_embedder(make_conn):
    """Settings() untouched: the default embedder (hashing, 1536-d) and its calibrated thresholds."""
    settings = Settings()
    assert settings.embedding.provider == "auto" and settings.retrieval.near_duplicate_threshold is None
    conn = make_conn(settings.embedding.dim)
    client = MemoryClient(
        conn, embedder=HashingEmbedder(settings.embedding.dim), settings=settings, actor="t"
    )
    _readme_example(client, conn)


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="needs the local extra")
def test_the_readme_example_with_the_local_embedder(make_conn):
    from memory_lib.llm.embedding import LOCAL_MODEL_DIM, LocalEmbedder

    conn = make_conn(LOCAL_MODEL_DIM)
    client = MemoryClient(conn, embedder=LocalEmbedder(), settings=Settings(), actor="t")
    _readme_example(client, conn)
