"""Bad input is refused with an error that names the field and the value; nothing is written."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from memory_lib.config import ArchivalCriteria, Settings
from memory_lib.errors import EmbeddingMismatchError, InvalidInputError
from memory_lib.store import insert_memories
from tests.conftest import TEST_DIM
from tests.support.factories import make_memories


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
    assert (c.min_age_days, c.max_importance_score, c.max_recent_access_count, c.force_archive_age_days,
            c.batch_size, c.max_error_rate) == (90, 0.3, 2, 365, 500, 0.05)  # fmt: skip
    s = Settings.from_env({})
    assert s.embedding.dim == 1536 and s.retrieval.active_boost == 1.0 and s.context.total == 8000  # issue 9: ties only


def test_settings_from_env_validates():
    with pytest.raises(ValidationError, match="embedding.dim"):
        Settings.from_env({"MEMORY_ARCHIVE_EMBEDDING_DIM": "zero"})
    with pytest.raises(ValidationError, match="bucket"):
        Settings.from_env({"MEMORY_ARCHIVE_OBJECT_STORE": "s3"})
    s = Settings.from_env({"MEMORY_ARCHIVE_BUCKET": "b", "MEMORY_ARCHIVE_S3_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert (s.object_store.kind, s.object_store.bucket) == ("s3", "b")
    assert "hunter2" not in repr(Settings.from_env({"DATABASE_URL": "postgresql://u:hunter2@h/db"}))
