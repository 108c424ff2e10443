"""Memory records and the archive's backup object format.

Validation happens here, before any SQL: a bad record raises InvalidInputError naming the field
and the value, and nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import EmbeddingMismatchError, IntegrityError, InvalidInputError

Category = Literal["core", "episodic", "semantic", "procedural"]
CATEGORIES: tuple[str, ...] = ("core", "episodic", "semantic", "procedural")
BACKUP_SCHEMA_VERSION = 1


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


def _check_text(field: str, value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{field} contains a NUL byte (Postgres text cannot store it)")
    _check_utf8(field, value)
    if not value.strip():
        raise ValueError(f"{field} is empty")
    return value


def _check_utf8(field: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{field} is not valid Unicode ({exc.reason} at position {exc.start})") from None


class NewMemory(BaseModel):
    """A memory to write to the hot tier."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    user_id: str = Field(min_length=1, max_length=200)
    content: str = Field(min_length=1, max_length=100_000)
    embedding: Any
    embedding_model: str = Field(min_length=1)
    id: uuid.UUID = Field(default_factory=uuid.uuid4)
    entity_links: list[uuid.UUID] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    domain: str | None = None
    category: Category = "episodic"
    importance_score: float = Field(0.5, ge=0.0, le=1.0, allow_inf_nan=False)
    access_count: int = Field(0, ge=0)
    last_accessed_at: datetime | None = None
    created_at: datetime | None = None
    pinned: bool = False

    @field_validator("user_id")
    @classmethod
    def _user(cls, v: str) -> str:
        return _check_text("user_id", v)

    @field_validator("content")
    @classmethod
    def _content(cls, v: str) -> str:
        return _check_text("content", v)

    @field_validator("created_at", "last_accessed_at")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("must be timezone-aware")
        return v

    @field_validator("metadata")
    @classmethod
    def _json_metadata(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            text = json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"metadata is not JSON-serializable without NaN: {exc}") from exc
        if "\\u0000" in text:
            raise ValueError("metadata contains a NUL character (jsonb cannot store it)")
        _check_utf8("metadata", json.dumps(v, ensure_ascii=False))
        return v


def validate_memory(data: NewMemory | dict[str, Any], *, dim: int, embedding_model: str | None) -> NewMemory:
    """Validate one memory for a store of `dim`-d embeddings from `embedding_model`."""
    if isinstance(data, NewMemory):
        data = data.model_dump()
    try:
        mem = NewMemory.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "memory"
        raise InvalidInputError(field, err.get("input"), err["msg"]) from None
    mem.embedding = as_float32_embedding(mem.embedding, dim=dim)
    if embedding_model is not None and mem.embedding_model != embedding_model:
        raise EmbeddingMismatchError(
            "embedding_model", mem.embedding_model, f"this store's embeddings come from {embedding_model!r}"
        )
    return mem


# --------------------------------------------------------------------------- backup object


def _iso(ts: datetime) -> str:
    return utc(ts).isoformat(timespec="microseconds")


class BackupObject(BaseModel):
    """The seed's "S3/R2 Backup Object Format" (schema_version 1), plus user_id.

    `to_json_bytes` is canonical (sorted keys, no spaces, UTC timestamps with microseconds), so the
    same memory always serializes to the same bytes and a sha256 identifies it. Embedding floats are
    written as the shortest decimal of their float32 value: parsing them back as float32 restores
    every bit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = BACKUP_SCHEMA_VERSION
    original_id: uuid.UUID
    user_id: str
    content: str
    embedding: list[float]
    entity_links: list[uuid.UUID]
    metadata: dict[str, Any]
    importance_score: float
    created_at: datetime
    archived_at: datetime
    archive_reason: str

    def to_json_bytes(self) -> bytes:
        doc = {
            "schema_version": self.schema_version,
            "original_id": str(self.original_id),
            "user_id": self.user_id,
            "content": self.content,
            "embedding": [_float32_json(x) for x in self.embedding],
            "entity_links": [str(u) for u in self.entity_links],
            "metadata": self.metadata,
            "importance_score": self.importance_score,
            "created_at": _iso(self.created_at),
            "archived_at": _iso(self.archived_at),
            "archive_reason": self.archive_reason,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
            "utf-8"
        )

    @classmethod
    def from_json_bytes(cls, data: bytes) -> BackupObject:
        try:
            doc = json.loads(data.decode("utf-8"))
            return cls.model_validate(doc)
        except (UnicodeDecodeError, ValueError) as exc:
            raise IntegrityError("backup object", "a schema_version 1 JSON document", str(exc)[:200]) from exc

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


def _float32_json(x: float) -> float:
    # float32 -> float64 is exact, and json writes the shortest repr that parses back to the same
    # float64, which rounds back to the same float32. Refuse non-finite values explicitly.
    if not math.isfinite(x):
        raise InvalidInputError("embedding", x, "contains NaN or infinity")
    return float(np.float32(x))
