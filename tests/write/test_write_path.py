"""Write path: normalization, upsert by dedupe key, supersede on a changed value, secrets refused."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.errors import EmbeddingMismatchError, InvalidInputError
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.db import connect
from memory_lib.storage.store import insert_memories
from memory_lib.write.write_path import dedupe_key, find_secret, lexical_change, normalize_text
from testing.constants import TEST_DIM
from testing.factories import archival_services, make_client

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


def _live(conn, user_id: str) -> list[dict]:
    return conn.execute(
        "SELECT id, content, superseded_by, access_count, updated_at, pinned FROM memories "
        "WHERE user_id = %s ORDER BY created_at, id",
        (user_id,),
    ).fetchall()


def _events(conn, memory_id) -> list[str]:
    rows = conn.execute("SELECT event_type FROM memory_events WHERE memory_id = %s ORDER BY id", (memory_id,))
    return [r["event_type"] for r in rows]


# --------------------------------------------------------------------------- pure parts


def test_normalize_text_is_nfkc_with_collapsed_whitespace():
    assert normalize_text("  \ufb01ne\u00a0 tuning\n\tdone  ") == "fine tuning done"
    assert normalize_text("Ｏｒｄｅｒ　４４１７") == "Order 4417"  # full-width forms and ideographic space


def test_dedupe_key_is_stable_per_user_and_ignores_case():
    key = dedupe_key("u1", "Prefers tea")
    assert key == dedupe_key("u1", "prefers TEA")
    assert key != dedupe_key("u2", "Prefers tea")
    assert key != dedupe_key("u1", "Prefers coffee")
    assert len(key) == 64


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        ("User prefers cortado.", "the user prefers cortado", False),
        ("User prefers cortado", "User prefers flat white", True),
        ("Meeting moved to 3pm", "Meeting moved to 4pm", True),
        ("Budget is 1,200 EUR", "Budget is 1,300 EUR", True),
        ("User likes cilantro", "User does not like cilantro", True),
        ("Alice owes Bob 5 EUR", "Bob owes Alice 5 EUR", True),  # word order carries meaning
    ],
)
def test_lexical_guard(old, new, changed):
    assert lexical_change(old, new).changed is changed


def test_lexical_guard_names_the_changed_words():
    change = lexical_change("User prefers cortado in the morning", "User prefers flat white in the morning")
    assert change.removed == ("cortado",)
    assert change.added == ("flat", "white")


def _fake(prefix: str, body: str) -> str:
    # Built at run time so no credential-shaped literal sits in the repository.
    return prefix + body


SECRET_SAMPLES = {
    "OpenAI/Anthropic-style API key": _fake("sk-", "proj-" + "Ab3dEf9hIj2lMn5pQr8tUv1x"),
    "AWS access key id": _fake("AKIA", "Q3EXAMPLE7ZZ4KTY"),
    "GitHub token": _fake("ghp_", "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    "Slack token": _fake("xoxb-", "1234567890-abcdefghij"),
    "JSON Web Token": _fake(
        "eyJ", "hbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    ),
    "private key block": _fake("-----BEGIN RSA ", "PRIVATE KEY-----\nMIIEow..."),
    "high-entropy token": _fake("k9Qz", "T4mW8xRb2LpV7nYc3HsJ6dGf1KaE5uNt"),
}


@pytest.mark.parametrize("kind", sorted(SECRET_SAMPLES))
def test_find_secret_recognizes(kind):
    finding = find_secret(f"the value is {SECRET_SAMPLES[kind]} ok")
    assert finding is not None and finding.kind == kind


@pytest.mark.parametrize(
    "text",
    [
        "Order ORD-4417 was refunded on 2024-03-03",
        "commit 3f786850e387550fdab836ed7e6dc881de23001b fixed the build",
        "request id 123e4567-e89b-12d3-a456-426614174000",
        "see https://github.com/pgvector/pgvector-python/blob/master/README.md",
        "HTTPServerConfigurationManagerV2Factory3 is the class to patch",
        "Task: ask about the sk- prefix of keys",
    ],
)
def test_find_secret_leaves_ordinary_text_alone(text):
    assert find_secret(text) is None


# --------------------------------------------------------------------------- add against Postgres


def test_same_text_twice_is_one_memory(conn):
    client = make_client(conn)
    first = client.add("u1", "User prefers a cortado in the morning", now=T0)
    again = client.add("u1", "  user prefers a CORTADO in the\n morning ", now=T0 + timedelta(days=2))
    assert first.outcome == "created"
    assert again.outcome == "duplicate" and again.memory_id == first.memory_id
    rows = _live(conn, "u1")
    assert len(rows) == 1
    assert rows[0]["content"] == "User prefers a cortado in the morning"
    assert rows[0]["access_count"] == 1
    assert rows[0]["updated_at"] == T0 + timedelta(days=2)
    assert _events(conn, first.memory_id) == ["created", "updated"]


def test_same_text_for_another_user_is_their_own_memory(conn):
    client = make_client(conn)
    a = client.add("u1", "Lives in Lisbon", now=T0)
    b = client.add("u2", "Lives in Lisbon", now=T0)
    assert a.memory_id != b.memory_id and b.outcome == "created"
    assert len(_live(conn, "u1")) == len(_live(conn, "u2")) == 1


def test_near_duplicate_with_the_same_words_is_merged(conn):
    client = make_client(conn)
    first = client.add("u1", "User prefers cortado in the morning.", now=T0)
    merged = client.add("u1", "The user prefers cortado in the morning", now=T0 + timedelta(hours=1))
    assert merged.outcome == "merged" and merged.memory_id == first.memory_id
    assert merged.reason == "restatement" and merged.similarity is not None
    assert [r["id"] for r in _live(conn, "u1")] == [first.memory_id]


def test_changed_value_is_a_new_memory_unless_told_it_supersedes(conn):
    client = make_client(conn)
    old = client.add("u1", "User prefers cortado in the morning", now=T0)
    other = client.add("u2", "User prefers cortado in the morning", now=T0)
    kept = client.add("u2", "User prefers flat white in the morning", now=T0 + timedelta(days=1))
    assert kept.outcome == "created" and len(_live(conn, "u2")) == 2 and other.outcome == "created"
    new = client.add(
        "u1", "User prefers flat white in the morning", supersedes=old.memory_id, now=T0 + timedelta(days=1)
    )
    assert new.outcome == "superseded" and new.previous_id == old.memory_id
    assert new.change is not None and new.change.added == ("flat", "white")
    rows = {r["id"]: r for r in _live(conn, "u1")}
    assert rows[old.memory_id]["superseded_by"] == new.memory_id
    assert rows[new.memory_id]["superseded_by"] is None
    assert _events(conn, old.memory_id) == ["created", "superseded"]
    detail = conn.execute(
        "SELECT details FROM memory_events WHERE memory_id = %s AND event_type = 'superseded'",
        (old.memory_id,),
    ).fetchone()["details"]
    assert detail["superseded_by"] == str(new.memory_id) and detail["removed"] == ["cortado"]
    assert detail["reason"] == "explicit"
    # Search sees only the current fact.
    hits = client.search(
        "u1", "what does the user prefer in the morning", phase2="never", now=T0 + timedelta(days=1)
    )
    assert [h.provenance.memory_id for h in hits] == [new.memory_id]
    # Going back to the old value supersedes again: the old text is not "still there".
    back = client.add(
        "u1", "User prefers cortado in the morning", supersedes=new.memory_id, now=T0 + timedelta(days=2)
    )
    assert back.outcome == "superseded" and back.previous_id == new.memory_id
    assert sum(r["superseded_by"] is None for r in _live(conn, "u1")) == 1


def test_unrelated_text_is_a_new_memory(conn):
    client = make_client(conn)
    client.add("u1", "User prefers cortado in the morning", now=T0)
    other = client.add("u1", "The dentist appointment is on Tuesday", now=T0)
    assert other.outcome == "created"
    assert len(_live(conn, "u1")) == 2


def test_superseding_a_pinned_memory_keeps_the_pin(conn):
    client = make_client(conn)
    old = client.add("u1", "Emergency contact is Maria", pinned=True, now=T0)
    new = client.add("u1", "Emergency contact is Joana", supersedes=old.memory_id, now=T0)
    assert new.outcome == "superseded"
    assert {r["id"]: r["pinned"] for r in _live(conn, "u1")}[new.memory_id] is True


def test_a_secret_is_refused_and_nothing_is_written(conn):
    client = make_client(conn)
    secret = SECRET_SAMPLES["AWS access key id"]
    with pytest.raises(InvalidInputError) as err:
        client.add("u1", f"the deploy key is {secret}")
    assert err.value.field == "content"
    assert secret not in str(err.value)  # the error never echoes the secret
    assert "allow_secrets=True" in str(err.value)
    assert _live(conn, "u1") == []
    stored = client.add("u1", f"the deploy key is {secret}", allow_secrets=True)
    assert stored.outcome == "created"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"user_id": "", "content": "x"}, "user_id"),
        ({"user_id": "u1", "content": " \n "}, "content"),
        ({"user_id": "u1", "content": "ok", "category": "gossip"}, "category"),
        ({"user_id": "u1", "content": "ok", "importance": 1.5}, "importance_score"),
        ({"user_id": "u1", "content": "ok", "tags": "coffee"}, "tags"),
        ({"user_id": "u1", "content": "ok", "metadata": {"tags": ["a"]}}, "metadata.tags"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(conn, kwargs, field):
    client = make_client(conn)
    user_id = kwargs.pop("user_id")
    content = kwargs.pop("content")
    with pytest.raises(InvalidInputError) as err:
        client.add(user_id, content, **kwargs)
    assert err.value.field == field
    assert conn.execute("SELECT count(*) AS n FROM memories").fetchone()["n"] == 0


def test_an_embedder_of_another_dimension_is_refused(conn):
    client = MemoryClient(conn, embedder=HashingEmbedder(TEST_DIM * 2), actor="test")
    with pytest.raises(EmbeddingMismatchError, match="embedder.dim"):
        client.add("u1", "hello there")


def test_rows_written_by_bulk_insert_are_matched_by_content(conn):
    emb = HashingEmbedder(TEST_DIM)
    [mid] = insert_memories(
        conn,
        [
            {
                "user_id": "u1",
                "content": "Allergic to peanuts",
                "embedding": emb.embed(["Allergic to peanuts"])[0],
                "embedding_model": emb.model,
            }
        ],
        actor="bulk",
    )
    again = make_client(conn).add("u1", "Allergic to peanuts")
    assert again.outcome == "duplicate" and again.memory_id == mid


def test_concurrent_adds_of_one_text_make_one_memory(db_url):
    conns = [connect(db_url) for _ in range(4)]
    results, errors = [], []

    def add(c):
        try:
            results.append(make_client(c).add("u1", "Works at the harbour office"))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert sorted(r.outcome for r in results) == ["created", "duplicate", "duplicate", "duplicate"]
        assert len({r.memory_id for r in results}) == 1
        assert len(_live(conns[0], "u1")) == 1
    finally:
        for c in conns:
            c.close()


def test_pinned_memories_are_never_archived(conn, local_store):
    client = make_client(conn)
    old = T0 - timedelta(days=400)
    pinned = client.add("u1", "Blood type is O negative", pinned=True, importance=0.0, now=old)
    plain = client.add("u1", "Bought a blue umbrella at the market", importance=0.0, now=old)
    services = archival_services(local_store)
    run_batch(conn, services, ArchivalCriteria(), batch_key="night-1", as_of=T0, actor="test")
    hot = {r["id"] for r in _live(conn, "u1")}
    assert pinned.memory_id in hot and plain.memory_id not in hot


def test_secret_thresholds_come_from_settings():
    from memory_lib.core.config import SecretDetectionConfig

    token = "aZ3kQ9mX2pL7vB4n"  # 16 random-looking characters: under the default 32-character floor
    assert find_secret(f"code {token}") is None
    assert find_secret(f"code {token}", SecretDetectionConfig(min_token_length=16)) is not None
