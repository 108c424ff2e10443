"""Memory records and the archive's backup object format.

Validation happens here, before any SQL: a bad record raises InvalidInputError naming the field
and the value, and nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from . import validation as v
from .errors import EmbeddingMismatchError, IntegrityError, InvalidInputError

Category = Literal["core", "episodic", "semantic", "procedural"]
CATEGORIES: tuple[str, ...] = ("core", "episodic", "semantic", "procedural")
BACKUP_SCHEMA_VERSION: Literal[1] = 1


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def utc(ts: datetime) -> datetime:
    """Timestamps are stored and serialized as aware UTC; naive input is ambiguous and refused."""
    if ts.tzinfo is None:
        raise InvalidInputError("timestamp", ts, "must be timezone-aware")
    return ts.astimezone(UTC)


def to_float32(value: Any) -> np.ndarray:
    """A float32 array from what psycopg returns for vector/halfvec columns (pgvector objects)."""
    if hasattr(value, "to_numpy"):
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float32)


def as_float32_embedding(value: Any, *, field: str = "embedding", dim: int | None = None) -> np.ndarray:
    """A 1-d float32 array with only finite values, of the expected dimension when given."""
    try:
        arr = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(field, value, "is not a sequence of numbers") from exc
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidInputError(field, value, f"must be a non-empty 1-d vector, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        bad = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise InvalidInputError(field, f"[{bad}]={arr[bad]}", "contains NaN or infinity")
    if dim is not None and arr.size != dim:
        raise EmbeddingMismatchError(f"{field}.dim", int(arr.size), f"the store holds {dim}-d embeddings")
    return arr


def _holds_nul(value: Any) -> bool:
    """Whether a NUL character is in any string (key or value) of a JSON value."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


def _json_storable(field: str, value: dict[str, Any]) -> dict[str, Any]:
    """What jsonb can hold: JSON without NaN/infinity, no NUL character, valid Unicode."""
    if not isinstance(value, dict):
        raise InvalidInputError(field, value, "must be a JSON object (a dict)")
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(field, value, f"is not JSON-serializable without NaN: {exc}") from None
    if "\\u0000" in text and _holds_nul(value):  # the text test alone also matches a "\\u0000" string
        raise InvalidInputError(field, value, "contains a NUL character (jsonb cannot store it)")
    v.storable(field, json.dumps(value, ensure_ascii=False))
    return value


class NewMemory(BaseModel):
    """A memory to write to the hot tier. Every field follows memory_lib.core.validation's rules."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    user_id: Annotated[str, BeforeValidator(v.user)]
    content: Annotated[str, v.rule(v.text, max_chars=v.MAX_CONTENT_CHARS)]
    embedding: Any
    embedding_model: Annotated[str, v.rule(v.text, max_chars=v.MAX_LABEL_CHARS)]
    id: uuid.UUID = Field(default_factory=uuid.uuid4)
    entity_links: list[uuid.UUID] = Field(default_factory=list)
    metadata: Annotated[dict[str, Any], v.rule(_json_storable)] = Field(default_factory=dict)
    domain: Annotated[str | None, v.rule(v.optional_text, max_chars=v.MAX_LABEL_CHARS)] = None
    category: Category = "episodic"
    importance_score: Annotated[float, v.rule(v.number, low=0.0, high=1.0)] = 0.5
    access_count: Annotated[int, v.rule(v.non_negative_int)] = 0
    last_accessed_at: Annotated[datetime | None, v.rule(v.optional_timestamp)] = None
    created_at: Annotated[datetime | None, v.rule(v.optional_timestamp)] = None
    pinned: Annotated[bool, v.rule(v.boolean)] = False


def validate_memory(data: NewMemory | dict[str, Any], *, dim: int, embedding_model: str | None) -> NewMemory:
    """Validate one memory for a store of `dim`-d embeddings from `embedding_model`."""
    if isinstance(data, NewMemory):
        data = data.model_dump()
    elif not isinstance(data, Mapping):
        raise InvalidInputError("memory", data, "must be a NewMemory or a mapping of its fields")
    mem = v.validated(NewMemory, data)
    mem.embedding = as_float32_embedding(mem.embedding, dim=dim)
    if embedding_model is not None and mem.embedding_model != embedding_model:
        raise EmbeddingMismatchError(
            "embedding_model", mem.embedding_model, f"this store's embeddings come from {embedding_model!r}"
        )
    return mem


# --------------------------------------------------------------------------- backup object


def _iso(ts: datetime) -> str:
    return utc(ts).isoformat(timespec="microseconds")


class MalformedBackupError(InvalidInputError, IntegrityError):
    """A backup object that cannot be restored as it is: not a schema_version 1 document, or a field
    Postgres would refuse (NUL, NaN, importance outside [0, 1], an embedding of the wrong dimension).
    Its sha256 may well match the record, so the integrity check alone does not catch it.

    It is both an InvalidInputError (field, value, reason) and an IntegrityError (what, expected,
    actual), so callers that keep a memory archived on IntegrityError keep doing so.
    """

    def __init__(self, field: str, value: object, reason: str):
        probe = InvalidInputError(field, value, reason)  # the one message format
        self.field, self.value, self.reason = field, value, reason
        self.what, self.expected, self.actual = (
            "backup object",
            "a restorable schema_version 1 document",
            reason,
        )
        Exception.__init__(self, str(probe))


def _restorable_text(field: str, value: object) -> str:
    """Text that was stored once: storable and non-empty (no stricter rule, or an old memory could
    never come back)."""
    if not isinstance(value, str) or not value:
        raise InvalidInputError(field, value, "must be a non-empty string")
    return v.storable(field, value)


def _restorable_embedding(field: str, value: object) -> list[float]:
    """A non-empty list of finite JSON numbers (strings and booleans are not coerced)."""
    if not isinstance(value, list) or not value:
        raise InvalidInputError(field, value, "must be a non-empty list of numbers")
    if not set(map(type, value)) <= {float, int}:  # vectorized checks: archival builds one per memory
        i = next(i for i, x in enumerate(value) if type(x) not in (float, int))
        raise InvalidInputError(f"{field}[{i}]", value[i], "must be a number")
    finite = np.isfinite(np.asarray(value, dtype=np.float64))
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise InvalidInputError(f"{field}[{i}]", value[i], "contains NaN or infinity")
    return value


class BackupObject(BaseModel):
    """The backup object format in S3/R2 (schema_version 1), with user_id.

    `to_json_bytes` is canonical (sorted keys, no spaces, UTC timestamps with microseconds), so the
    same memory always serializes to the same bytes and a sha256 identifies it. Embedding floats are
    written as the shortest decimal of their float32 value: parsing them back as float32 restores
    every bit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = BACKUP_SCHEMA_VERSION
    original_id: uuid.UUID
    user_id: Annotated[str, v.rule(_restorable_text)]
    content: Annotated[str, v.rule(_restorable_text)]
    embedding: Annotated[list[float], v.rule(_restorable_embedding)]
    entity_links: list[uuid.UUID]
    metadata: Annotated[dict[str, Any], v.rule(_json_storable)]
    importance_score: Annotated[float, v.rule(v.number, low=0.0, high=1.0)]
    created_at: Annotated[datetime, v.rule(v.timestamp)]
    archived_at: Annotated[datetime, v.rule(v.timestamp)]
    archive_reason: Annotated[str, v.rule(_restorable_text)]

    def to_json_bytes(self) -> bytes:
        doc = {
            "schema_version": self.schema_version,
            "original_id": str(self.original_id),
            "user_id": self.user_id,
            "content": self.content,
            "embedding": _float32_json(self.embedding),
            "entity_links": [str(u) for u in self.entity_links],
            "metadata": self.metadata,
            "importance_score": self.importance_score,
            "created_at": _iso(self.created_at),
            "archived_at": _iso(self.archived_at),
            "archive_reason": self.archive_reason,
        }
        try:
            # orjson: ~20x faster than json on a 1536-float document (archival serializes one per memory).
            return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            # What orjson refuses (an integer beyond 64 bits in metadata): the stdlib's form. The same
            # document always takes the same path, so the bytes stay canonical.
            return json.dumps(
                doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
            ).encode("utf-8")

    @classmethod
    def from_json_bytes(cls, data: bytes) -> BackupObject:
        """Parse and validate a stored object; anything Postgres could not take back raises
        MalformedBackupError naming the field ("backup.content", "backup.embedding[3]", ...)."""
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            doc = None  # the stdlib parses what orjson refuses (a bare NaN): validation then names the field
        try:
            doc = json.loads(data.decode("utf-8")) if doc is None else doc
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError both are
            raise MalformedBackupError("backup", data[:60], f"is not a UTF-8 JSON document: {exc}") from None
        if not isinstance(doc, dict):
            raise MalformedBackupError("backup", doc, "is not a JSON object")
        try:
            return cls.model_validate(doc)
        except ValidationError as exc:
            err = v.as_invalid_input(exc, prefix="backup.")
            raise MalformedBackupError(err.field, err.value, err.reason) from None

    def check_dimension(self, dim: int) -> BackupObject:
        """The store holds `dim`-d embeddings: a backup of another dimension cannot be restored."""
        if len(self.embedding) != dim:
            raise MalformedBackupError(
                "backup.embedding", f"{len(self.embedding)} dimensions", f"the store holds {dim}-d embeddings"
            )
        return self

    def embedding_array(self) -> np.ndarray:
        return np.asarray(self.embedding, dtype=np.float32)

    @classmethod
    def from_row(cls, row: dict[str, Any], *, archived_at: datetime, archive_reason: str) -> BackupObject:
        """Build from a `memories` row (as returned by psycopg with dict rows)."""
        emb = to_float32(row["embedding"])
        return cls(
            original_id=row["id"],
            user_id=row["user_id"],
            content=row["content"],
            embedding=emb.tolist(),
            entity_links=list(row["entity_links"] or []),
            metadata=row["metadata"] or {},
            importance_score=float(row["importance_score"]),
            created_at=row["created_at"],
            archived_at=archived_at,
            archive_reason=archive_reason,
        )


def _float32_json(values: list[float]) -> list[float]:
    # float32 -> float64 is exact, and json writes the shortest repr that parses back to the same
    # float64, which rounds back to the same float32. Vectorized: archival serializes one per memory.
    # Refuse non-finite values (and values beyond float32's range) explicitly.
    with np.errstate(over="ignore", invalid="ignore"):
        arr = np.asarray(values, dtype=np.float64).astype(np.float32)
    finite = np.isfinite(arr)
    if not finite.all():
        i = int(np.flatnonzero(~finite)[0])
        raise InvalidInputError("embedding", values[i], "contains NaN or infinity")
    return arr.astype(np.float64).tolist()
