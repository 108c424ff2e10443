"""The backup object: its format with user_id, canonical bytes, float32-exact embeddings."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from memory_lib.core.errors import IntegrityError, InvalidInputError
from memory_lib.core.models import BackupObject, MalformedBackupError

SEED_FIELDS = {
    "schema_version",
    "original_id",
    "content",
    "embedding",
    "entity_links",
    "metadata",
    "importance_score",
    "created_at",
    "archived_at",
    "archive_reason",
}

finite_f32 = arrays(
    np.float32, st.integers(1, 64), elements=st.floats(width=32, allow_nan=False, allow_infinity=False)
)
# What Postgres can hold: no NUL, no lone UTF-16 surrogates (validation refuses both before storage).
storable_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | storable_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(storable_text, children, max_size=3),
    max_leaves=8,
)


def _doc(embedding, **kw) -> BackupObject:
    base = dict(
        original_id=uuid.uuid4(),
        user_id="u-1",
        content="Maya booked Kyoto on 3 May 2026 ☕",
        embedding=np.asarray(embedding, dtype=np.float32).tolist(),
        entity_links=[uuid.uuid4()],
        metadata={"turn": 3},
        importance_score=0.25,
        created_at=datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        archived_at=datetime(2026, 1, 1, tzinfo=UTC),
        archive_reason="stale_low_importance",
    )
    return BackupObject(**(base | kw))


@settings(max_examples=200, deadline=None)
@given(
    vec=finite_f32,
    metadata=st.dictionaries(storable_text, json_values, max_size=4),
    content=storable_text.filter(bool),
)
def test_round_trip_is_bit_exact(vec, metadata, content):
    doc = _doc(vec, metadata=metadata, content=content)
    data = doc.to_json_bytes()
    back = BackupObject.from_json_bytes(data)
    assert (
        back.embedding_array().tobytes() == vec.tobytes()
    )  # every float32 bit, -0.0 and subnormals included
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


# --------------------------------------------------------------------------- malformed documents


def _bytes_with(**change) -> bytes:
    doc = json.loads(_doc(np.ones(4)).to_json_bytes()) | change
    return json.dumps(doc).encode()  # json writes NaN as the bare token NaN, as a hand edit might


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"content": "booked\x00"}, "backup.content"),
        ({"content": "booked \ud800"}, "backup.content"),
        ({"content": ""}, "backup.content"),
        ({"user_id": "u\x00"}, "backup.user_id"),
        ({"embedding": [1.0, float("nan"), 1.0]}, "backup.embedding[1]"),
        ({"embedding": [1.0, float("inf")]}, "backup.embedding[1]"),
        ({"embedding": ["1.0", 2.0]}, "backup.embedding[0]"),  # never coerced from a string
        ({"embedding": [True, 2.0]}, "backup.embedding[0]"),
        ({"embedding": []}, "backup.embedding"),
        ({"importance_score": 7}, "backup.importance_score"),
        ({"importance_score": "0.5"}, "backup.importance_score"),
        ({"created_at": "2024-01-01T00:00:00"}, "backup.created_at"),  # no offset: naive
        ({"archived_at": 1_700_000_000}, "backup.archived_at"),
        ({"metadata": {"note": "a\x00b"}}, "backup.metadata"),
        ({"metadata": ["not", "an", "object"]}, "backup.metadata"),
        ({"schema_version": 2}, "backup.schema_version"),
        ({"colour": "blue"}, "backup.colour"),
    ],
)
def test_a_malformed_document_names_the_field(change, field):
    with pytest.raises(MalformedBackupError) as info:
        BackupObject.from_json_bytes(_bytes_with(**change))
    assert info.value.field == field
    assert isinstance(info.value, InvalidInputError) and isinstance(info.value, IntegrityError)
    assert str(info.value).startswith(f"invalid {field}=")


def test_not_json_is_a_malformed_backup_naming_the_document():
    for data in (b"{not json", b"[1, 2]", "é".encode("latin-1")):
        with pytest.raises(MalformedBackupError) as info:
            BackupObject.from_json_bytes(data)
        assert info.value.field == "backup"


def test_timestamps_with_an_offset_parse_and_the_dimension_is_checked():
    doc = BackupObject.from_json_bytes(_bytes_with(created_at="2025-01-02T05:04:05+02:00"))
    assert doc.created_at == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert doc.check_dimension(4) is doc
    with pytest.raises(MalformedBackupError, match="the store holds 8-d embeddings") as info:
        doc.check_dimension(8)
    assert info.value.field == "backup.embedding"


def test_text_stored_once_is_restorable_even_if_new_input_would_be_refused():
    """Whitespace- or zero-width-only text was accepted by older versions: its backup must restore."""
    doc = BackupObject.from_json_bytes(_bytes_with(content="\u200b\u200b"))
    assert doc.content == "\u200b\u200b"
