"""Bad input is refused with an error that names the field and the value; nothing is written."""

from __future__ import annotations

import threading
import time
from datetime import UTC, date, datetime

import numpy as np
import pytest
from pydantic import ValidationError

from memory_lib.core import validation
from memory_lib.core.config import ArchivalCriteria, Settings
from memory_lib.core.errors import ConfigError, EmbeddingMismatchError, InvalidInputError
from memory_lib.storage.db import connect
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.factories import make_memories
from testing.rows import one


def _counts(conn) -> tuple[int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM memories) AS m, (SELECT count(*) FROM memory_events) AS e"
    ).fetchone()
    return row["m"], row["e"]


def _nan_embedding():
    v = np.ones(TEST_DIM, dtype=np.float32)
    v[5] = np.nan
    return v


BAD = [
    ("embedding.dim", {"embedding": np.ones(TEST_DIM + 1, dtype=np.float32)}, EmbeddingMismatchError),
    ("embedding", {"embedding": _nan_embedding()}, InvalidInputError),
    ("embedding", {"embedding": np.full(TEST_DIM, np.inf, dtype=np.float32)}, InvalidInputError),
    ("content", {"content": "order ORD-1\x00 shipped"}, InvalidInputError),
    ("content", {"content": "   "}, InvalidInputError),
    ("content", {"content": "broken \ud800 surrogate"}, InvalidInputError),
    ("metadata", {"metadata": {"note": "broken \udfff"}}, InvalidInputError),
    ("importance_score", {"importance_score": 1.5}, InvalidInputError),
    ("importance_score", {"importance_score": float("nan")}, InvalidInputError),
    ("user_id", {"user_id": None}, InvalidInputError),
    ("user_id", {"user_id": ""}, InvalidInputError),
    ("category", {"category": "gossip"}, InvalidInputError),
    ("metadata", {"metadata": {"x": float("nan")}}, InvalidInputError),
    ("created_at", {"created_at": __import__("datetime").datetime(2025, 1, 1)}, InvalidInputError),
    ("colour", {"colour": "blue"}, InvalidInputError),  # unknown key
]


@pytest.mark.parametrize(("field", "change", "error"), BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_memory_is_refused_and_nothing_written(conn, field, change, error):
    good = make_memories(3, dim=TEST_DIM)
    bad = make_memories(1, dim=TEST_DIM, seed=9)[0] | change
    with pytest.raises(error) as info:
        insert_memories(conn, [*good, bad], actor="test")
    assert info.value.field == field
    assert field.split(".")[0] in str(info.value)
    assert _counts(conn) == (0, 0)


def test_missing_user_id_names_the_field(conn):
    bad = make_memories(1, dim=TEST_DIM)[0]
    del bad["user_id"]
    with pytest.raises(InvalidInputError, match="user_id"):
        insert_memories(conn, [bad], actor="test")
    assert _counts(conn) == (0, 0)


def test_embedding_model_is_fixed_per_database(conn):
    insert_memories(conn, make_memories(1, dim=TEST_DIM, embedding_model="model-a"), actor="test")
    with pytest.raises(EmbeddingMismatchError, match="model-a") as info:
        insert_memories(conn, make_memories(1, dim=TEST_DIM, seed=3, embedding_model="model-b"), actor="test")
    assert info.value.field == "embedding_model"
    assert _counts(conn) == (1, 1)


def test_database_rejects_wrong_dimension_even_without_the_library(conn):
    import psycopg

    with pytest.raises(psycopg.errors.DataException, match="expected 64 dimensions"):
        conn.execute(
            "INSERT INTO memories (user_id, content, content_sha256, embedding, embedding_model, embedding_dim)"
            " VALUES ('u', 'x', repeat('a', 64), %s, 'm', 64)",
            (np.ones(3, dtype=np.float32),),
        )


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"min_age_days": -1}, "min_age_days"),
        ({"max_importance_score": 1.5}, "max_importance_score"),
        ({"batch_size": 501}, "batch_size"),
        ({"min_age_days": 400}, "force_archive_age_days"),
        ({"bogus_threshold": 3}, "bogus_threshold"),
    ],
)
def test_bad_criteria_name_the_key(config, needle):
    with pytest.raises(ValidationError, match=needle) as info:
        ArchivalCriteria(**config)
    assert str(next(iter(config.values()))) in str(info.value)


def test_seed_defaults():
    c = ArchivalCriteria()
    assert (
        c.min_age_days,
        c.max_importance_score,
        c.max_recent_access_count,
        c.force_archive_age_days,
        c.batch_size,
        c.max_error_rate,
    ) == (90, 0.3, 2, 365, 500, 0.05)
    s = Settings.from_env({})
    assert (
        s.embedding.dim == 1536 and s.retrieval.active_boost == 1.0 and s.context.total == 8000
    )  # boosts break ties only


def test_settings_from_env_validates():
    with pytest.raises(ConfigError, match="embedding.dim"):
        Settings.from_env({"MEMORY_ARCHIVE_EMBEDDING_DIM": "zero"})
    with pytest.raises(ConfigError, match="bucket"):
        Settings.from_env({"MEMORY_ARCHIVE_OBJECT_STORE": "s3"})
    s = Settings.from_env(
        {"MEMORY_ARCHIVE_BUCKET": "b", "MEMORY_ARCHIVE_S3_ENDPOINT_URL": "http://127.0.0.1:9"}
    )
    assert (s.object_store.kind, s.object_store.bucket) == ("s3", "b")
    assert "hunter2" not in repr(Settings.from_env({"DATABASE_URL": "postgresql://u:hunter2@h/db"}))


# --------------------------------------------------------------------------- the shared rules (memory_lib.core.validation)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("a\x00b", "NUL"),
        ("a\ud800b", "not valid Unicode"),
        ("\u200b\u200b", "invisible"),
        ("\ufeff\u2060 \t", "invisible"),
        ("", "empty"),
        (123, "must be a string"),
        (b"bytes", "must be a string"),
        ("x" * 11, "maximum is 10"),
    ],
)
def test_text_rule(value, reason):
    with pytest.raises(InvalidInputError, match=reason) as info:
        validation.text("note", value, max_chars=10)
    assert info.value.field == "note" and info.value.value == value


def test_text_rule_keeps_visible_text_with_format_characters():
    assert validation.text("note", "a\u200bb", max_chars=10) == "a\u200bb"
    assert validation.text("note", "é", max_chars=10) == "é"


def test_query_length_limit_is_inclusive():
    assert validation.query_text("query", "q" * validation.MAX_QUERY_CHARS)
    with pytest.raises(InvalidInputError, match="maximum is 4000"):
        validation.query_text("query", "q" * (validation.MAX_QUERY_CHARS + 1))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, tzinfo=UTC)),
        ("2024-01-01T00:00:00Z", datetime(2024, 1, 1, tzinfo=UTC)),
        ("2024-01-01T02:00:00+02:00", datetime(2024, 1, 1, tzinfo=UTC)),
    ],
)
def test_timestamps_aware_or_iso_with_offset(value, expected):
    assert validation.timestamp("since", value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("2024-01-01", "timezone-aware"),
        ("2024-01-01T00:00:00", "timezone-aware"),
        (datetime(2024, 1, 1), "timezone-aware"),
        ("yesterday", "ISO 8601"),
        (1_700_000_000, "not int"),
        (date(2024, 1, 1), "not date"),
    ],
)
def test_timestamps_refused(value, reason):
    with pytest.raises(InvalidInputError, match=reason) as info:
        validation.timestamp("since", value)
    assert info.value.field == "since"


@pytest.mark.parametrize("value", ["yes", "no", 1, 0, None, "true"])
def test_flags_are_never_read_by_truthiness(value):
    with pytest.raises(InvalidInputError, match="True or False") as info:
        validation.boolean("pinned", value)
    assert info.value.field == "pinned"


def test_flags_accept_bools_including_numpy():
    assert validation.boolean("pinned", True) is True
    assert validation.boolean("pinned", np.False_) is False


@pytest.mark.parametrize("value", [-1, 1001, True, 2.0, "5"])
def test_limits(value):
    with pytest.raises(InvalidInputError, match="between 0 and 1000"):
        validation.row_limit("limit", value)
    assert validation.row_limit("limit", None) is None
    assert validation.row_limit("limit", np.int64(5)) == 5


def test_numbers_refuse_bools_strings_and_nan():
    for value in (True, "0.5", float("nan"), 1.5):
        with pytest.raises(InvalidInputError) as info:
            validation.number("importance_score", value, low=0.0, high=1.0)
        assert info.value.field == "importance_score"
    assert validation.number("importance_score", np.float32(0.25), low=0.0, high=1.0) == 0.25


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"domain": "a\x00b"}, "domain"),
        ({"domain": "\ud800"}, "domain"),
        ({"domain": "\u200b"}, "domain"),
        ({"content": "\u200b\u200b"}, "content"),
        ({"pinned": "yes"}, "pinned"),
        ({"importance_score": True}, "importance_score"),
        ({"access_count": -1}, "access_count"),
        ({"created_at": "2025-01-01"}, "created_at"),
        ({"embedding_model": "m\x00"}, "embedding_model"),
    ],
)
def test_bulk_insert_applies_the_same_rules(conn, change, field):
    with pytest.raises(InvalidInputError) as info:
        insert_memories(
            conn,
            [*make_memories(2, dim=TEST_DIM), make_memories(1, dim=TEST_DIM, seed=4)[0] | change],
            actor="test",
        )
    assert info.value.field == field
    assert "in memories[2]" in getattr(info.value, "__notes__", [])
    assert _counts(conn) == (0, 0)


def test_bulk_insert_accepts_iso_timestamps_with_an_offset(conn):
    [memory] = make_memories(1, dim=TEST_DIM, created_at="2025-01-01T00:00:00+00:00", last_accessed_at=None)
    [memory_id] = insert_memories(conn, [memory], actor="test")
    row = conn.execute("SELECT created_at FROM memories WHERE id = %s", (memory_id,)).fetchone()
    assert row["created_at"] == datetime(2025, 1, 1, tzinfo=UTC)


def test_an_id_inserted_concurrently_is_refused_naming_it(db_url):
    """The check before the insert cannot see another transaction's uncommitted row: the unique
    violation when it commits is the same InvalidInputError, and nothing of this call is written."""
    first, second = connect(db_url), connect(db_url)
    [memory] = make_memories(1, dim=TEST_DIM)
    other = make_memories(2, dim=TEST_DIM, seed=5)[1]
    outcome: list[BaseException | None] = []
    try:
        with first.transaction():
            insert_memories(first, [memory], actor="test")
            worker = threading.Thread(target=lambda: outcome.append(_try_insert(second, [other, memory])))
            worker.start()
            for _ in range(200):  # until the second insert waits for this transaction
                waiting = one(
                    first.execute(
                        "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()"
                    )
                )["n"]
                if waiting:
                    break
                time.sleep(0.02)
        worker.join(timeout=30)
        [error] = outcome
        assert isinstance(error, InvalidInputError), repr(error)
        assert (error.field, error.value) == ("id", memory["id"])
        assert "memories[1]" in str(error)
        assert _counts(first) == (1, 1)
    finally:
        first.close()
        second.close()


def _try_insert(conn, memories) -> BaseException | None:
    try:
        insert_memories(conn, memories, actor="test")
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread
        return exc
    return None


def test_metadata_naming_the_nul_escape_is_stored_and_a_real_nul_is_refused(conn):
    """A backslash followed by "u0000" is text (a coding agent's note about JSON escapes): stored as given.
    Only a NUL character itself, which jsonb cannot hold, is refused."""
    escape = {"snippet": "\\u0000 ends a C string", "\\u0000": ["a \\u0000 key"]}
    [memory] = make_memories(1, dim=TEST_DIM, metadata=escape)
    [memory_id] = insert_memories(conn, [memory], actor="test")
    row = conn.execute("SELECT metadata FROM memories WHERE id = %s", (memory_id,)).fetchone()
    assert row["metadata"] == escape
    with pytest.raises(InvalidInputError) as info:
        insert_memories(conn, make_memories(1, dim=TEST_DIM, seed=5, metadata={"k": ["v\x00"]}), actor="test")
    assert info.value.field == "metadata"
