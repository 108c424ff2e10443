"""What every re-embedding module shares: the vector groups (each table's vector and the columns that
travel with it), the migration record, and the embedder a recorded (model, dim) names. The design is in
memory_lib.lifecycle.reembedding."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from ..core.config import EmbeddingConfig
from ..core.errors import EmbeddingMismatchError, InvalidInputError, MemoryArchiveError
from ..core.rows import Conn
from ..llm.embedding import LOCAL_MODEL_NAME, Embedder, HashingEmbedder, LocalEmbedder, embedder_from_settings

Kind = Literal["hot", "archived", "digests", "facts"]
KINDS: tuple[Kind, ...] = ("hot", "archived", "digests", "facts")
HNSW_MAX_VECTOR_DIM = 2000  # pgvector's HNSW limit for `vector` columns


class ReembeddingError(MemoryArchiveError):
    """A re-embedding step that cannot run in the current state (the message says why and what to do)."""


@dataclass(frozen=True)
class Col:
    name: str
    type: str  # {dim} is the migration's dimension
    not_null: bool


@dataclass(frozen=True)
class Group:
    """One table's vector and the columns that travel with it."""

    table: str
    kind: Kind | None  # None: not backfilled (archival checkpoints are refused at flip instead)
    vector: str  # the column whose change invalidates the secondary (the guard trigger)
    model: str  # NULL in the secondary = pending
    cols: tuple[Col, ...]
    text: str = "NULL"  # SQL giving the text to embed
    needs_vector: str = "true"  # rows that get a vector (archive stubs only get the model)
    index: str | None = None  # the HNSW index method/opclass of the vector column


VECTOR_GROUPS: tuple[Group, ...] = (
    Group(
        "memories",
        "hot",
        "embedding",
        "embedding_model",
        (
            Col("embedding", "vector({dim})", True),
            Col("embedding_model", "text", True),
            Col("embedding_dim", "integer", True),
        ),
        text="content",
        index="hnsw ({col} vector_cosine_ops) WITH (m = 16, ef_construction = 64)",
    ),
    Group(
        "archived_memories",
        "archived",
        "summary_bits",
        "summary_embedding_model",
        (
            Col("summary_bits", "bit({dim})", False),
            Col("summary_embedding", "halfvec({dim})", False),
            Col("summary_embedding_model", "text", True),
        ),
        text="summary",
        needs_vector="summary_bits IS NOT NULL",
        index="hnsw ({col} bit_hamming_ops) WITH (m = 12, ef_construction = 64)",  # as 027 made it
    ),
    Group(
        "memory_digests",
        "digests",
        "embedding",
        "embedding_model",
        (Col("embedding", "vector({dim})", True), Col("embedding_model", "text", True)),
        text="summary",
    ),
    Group(
        "memory_facts",
        "facts",
        "embedding",
        "embedding_model",
        (Col("embedding", "vector({dim})", True), Col("embedding_model", "text", True)),
        text="subject || ' ' || predicate || ' ' || object",
    ),
    Group(
        "archival_attempts",
        None,
        "summary_embedding",
        "summary_embedding_model",
        (Col("summary_embedding", "halfvec({dim})", False), Col("summary_embedding_model", "text", False)),
    ),
)
BY_KIND = {g.kind: g for g in VECTOR_GROUPS if g.kind is not None}


@dataclass(frozen=True)
class Migration:
    id: int
    source_model: str
    source_dim: int
    target_model: str
    target_dim: int
    state: str
    started_at: datetime
    flipped_at: datetime | None
    flips: int

    @property
    def open(self) -> bool:
        return self.state in ("running", "flipped")

    @property
    def suffix(self) -> str:
        """The secondary columns' suffix: `_next` (target) while running, `_prev` (source) once flipped."""
        return "_next" if self.state == "running" else "_prev"

    @property
    def secondary(self) -> tuple[str, int]:
        """(model, dim) the secondary columns hold: the target while running, the source once flipped."""
        if self.state == "running":
            return self.target_model, self.target_dim
        return self.source_model, self.source_dim

    @property
    def active(self) -> tuple[str, int]:
        if self.state == "flipped":
            return self.target_model, self.target_dim
        return self.source_model, self.source_dim

    def dim_of(self, suffix: str) -> int:
        return self.target_dim if suffix == "_next" else self.source_dim


MIGRATION_SQL = """SELECT id, source_model, source_dim, target_model, target_dim, state, started_at, flipped_at,
                           flips FROM embedding_migrations"""


def active_migration(conn: Conn, *, for_update: bool = False) -> Migration | None:
    """The open (running or flipped) migration, or None."""
    row = conn.execute(
        f"{MIGRATION_SQL} WHERE state IN ('running', 'flipped'){' FOR UPDATE' if for_update else ''}"
    ).fetchone()
    return None if row is None else Migration(**row)


def latest_migration(conn: Conn) -> Migration | None:
    row = conn.execute(f"{MIGRATION_SQL} ORDER BY id DESC LIMIT 1").fetchone()
    return None if row is None else Migration(**row)


# --------------------------------------------------------------------------- embedders by name


@functools.lru_cache(maxsize=8)
def _cached_embedder(model: str, dim: int, embedding: EmbeddingConfig) -> Embedder:
    if model == LOCAL_MODEL_NAME:
        return LocalEmbedder(model)
    if model == HashingEmbedder(dim).model:
        return HashingEmbedder(dim)
    # Any other name is an OpenAI(-compatible) model: the key and base URL of the configured embedding.
    cfg = embedding.model_copy(update={"provider": "openai", "openai_model": model, "dim": dim})
    return embedder_from_settings(cfg)


def embedder_for(model: str, dim: int, embedding: EmbeddingConfig) -> Embedder:
    """The embedder a recorded (model, dim) names: the packaged local model, the hashing embedder of that
    dim, or else an OpenAI model with the key and base URL of `embedding` (the caller's settings: this
    never reads the environment). Cached per process and configuration."""
    return _cached_embedder(model, dim, embedding)


def check_embedder(embedder: Embedder, model: str, dim: int, what: str) -> None:
    if embedder.model != model or embedder.dim != dim:
        raise EmbeddingMismatchError(
            "embedder",
            f"{embedder.model} ({embedder.dim}-d)",
            f"the {what} columns hold {model!r} ({dim}-d) vectors",
        )


def group_of(kind: object) -> Group:
    if kind not in BY_KIND:
        raise InvalidInputError("kind", kind, f"must be one of {list(KINDS)}")
    return BY_KIND[kind]
