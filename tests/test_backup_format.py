"""The backup object: the seed's format plus user_id, canonical bytes, float32-exact embeddings."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from memory_lib.errors import IntegrityError, InvalidInputError
from memory_lib.models import BackupObject

SEED_FIELDS = {
    "schema_version", "original_id", "content", "embedding", "entity_links", "metadata", "importance_score",
    "created_at", "archived_at", "archive_reason",
}  # fmt: skip

finite_f32 = arrays(
    np.float32, st.integers(1, 64), elements=st.floats(width=32, allow_nan=False, allow_infinity=False)
)
# What Postgres can hold: no NUL, no lone UTF-16 surrogates (validation refuses both before storage).
storable_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | storable_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(storable_text, children, max_size=3),
    max_leaves=8,
)


def _doc(embedding, **kw) -> BackupObject:
    base = dict(
        original_id=uuid.uuid4(), user_id="u-1", content="Maya booked Kyoto on 3 May 2026 ☕",
        embedding=np.asarray(embedding, dtype=np.float32).tolist(), entity_links=[uuid.uuid4()],
        metadata={"turn": 3}, importance_score=0.25,
        created_at=datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        archived_at=datetime(2026, 1, 1, tzinfo=UTC), archive_reason="stale_low_importance",
    )  # fmt: skip
    return BackupObject(**(base | kw))


@settings(max_examples=200, deadline=None)
@given(vec=finite_f32, metadata=st.dictionaries(storable_text, json_values, max_size=4),
       content=storable_text.filter(bool))  # fmt: skip
def test_round_trip_is_bit_exact(vec, metadata, content):
    doc = _doc(vec, metadata=metadata, content=content)
    data = doc.to_json_bytes()
    back = BackupObject.from_json_bytes(data)
    assert back.embedding_array().tobytes() == vec.tobytes()  # every float32 bit, -0.0 and subnormals included
    assert back.metadata == metadata and back.content == content
    assert back.to_json_bytes() == data  # canonical: re-serializing gives the same bytes


def test_format_is_the_seeds_plus_user_id():
    doc = json.loads(_doc(np.ones(4)).to_json_bytes())
    assert set(doc) == SEED_FIELDS | {"user_id"}
    assert doc["schema_version"] == 1
    assert doc["created_at"] == "2025-01-02T03:04:05.678901+00:00"


def test_timestamps_are_normalized_to_utc():
    local = datetime(2025, 1, 2, 5, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    a = _doc(np.ones(4), created_at=local).to_json_bytes()
    b = _doc(np.ones(4), created_at=local.astimezone(UTC)).to_json_bytes()
    assert json.loads(a)["created_at"] == json.loads(b)["created_at"]


def test_nan_cannot_be_serialized():
    doc = _doc(np.ones(4))
    object.__setattr__(doc, "embedding", [1.0, float("nan")])
    with pytest.raises(InvalidInputError, match="embedding"):
        doc.to_json_bytes()


@pytest.mark.parametrize("data", [b"{not json", b'{"schema_version": 2}', "é".encode("latin-1")])
def test_corrupt_object_is_an_integrity_error(data):
    with pytest.raises(IntegrityError):
        BackupObject.from_json_bytes(data)
