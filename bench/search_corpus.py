"""The search bench's corpus: real text embedded once, hot and archived rows drawn from it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeAlias

import numpy as np
import psycopg

from memory_lib.llm.embedding import HashingEmbedder

from .common import (
    HotRow,
    Text,
    local_embedder,
    local_embedder_available,
    stopwatch,
)
from .textcache import embedded_texts

DB: TypeAlias = psycopg.Connection[Any]  # bench_connect's connections: autocommit, dict rows


ARCHIVED_PER_HOT = 4


DIM = 1536


NOW = datetime(2026, 1, 1, tzinfo=UTC)


CHUNK = 5000


class CorpusEmbedder:
    """The corpus' embedding space as the library sees it: the recorded model name, DIM, the source
    embedder's kind. A text given a vector (a held-out query) gets it, as an embedding API would return
    it, so searches time the library, not the model; any other text (archival's summaries) is embedded
    by HashingEmbedder at the source dimension and lifted (cheap: the archival run's cost is the
    library's, not a model's)."""

    max_tokens: int | None = None

    def __init__(
        self, model: str, kind: str, lift_matrix: np.ndarray, vectors: dict[str, np.ndarray] | None = None
    ):
        self.model = model
        self.dim = DIM
        self.kind: Literal["semantic", "lexical"] = "lexical" if kind == "lexical" else "semantic"
        self.lift_matrix = lift_matrix
        self.vectors = vectors or {}
        self._fallback = HashingEmbedder(lift_matrix.shape[1])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self.vectors))
        fresh: dict[str, np.ndarray] = {}
        if missing:
            lifted = np.asarray(self._fallback.embed(missing), dtype=np.float32) @ self.lift_matrix.T
            fresh = dict(zip(missing, lifted, strict=True))
        if not texts:
            return np.zeros((0, DIM), np.float32)
        return np.stack([self.vectors[t] if t in self.vectors else fresh[t] for t in texts])


class Corpus:
    """Texts, their embeddings lifted to DIM (cosines kept), and held-out queries."""

    def __init__(self, n: int, n_queries: int, embedder_name: str | None):
        wanted = embedder_name or ("local" if local_embedder_available() else "hashing")
        embedder: Any = local_embedder() if wanted == "local" else HashingEmbedder(384)
        self.what = "all-MiniLM-L6-v2 (local)" if wanted == "local" else "HashingEmbedder(384)"
        self.model = f"{self.what} lifted to {DIM}-d"  # what the database records as its embedding model
        self.kind = str(getattr(embedder, "kind", "semantic"))
        self.source_dim = embedder.dim
        with stopwatch() as t:
            self.texts, self.vecs = embedded_texts(n, seed=7, embedder=embedder)
            self.queries, self.qvecs = embedded_texts(n_queries, seed=99, embedder=embedder)
        self.embed_s = t[0]
        rng = np.random.default_rng(0)
        q, _ = np.linalg.qr(rng.standard_normal((DIM, embedder.dim)))
        self.lift_matrix = q.astype(np.float32)  # DIM x source_dim, orthonormal columns

    def lift(self, vecs: np.ndarray) -> np.ndarray:
        return np.asarray(vecs, dtype=np.float32) @ self.lift_matrix.T

    def embedder(self, texts: Sequence[str], vectors: np.ndarray) -> CorpusEmbedder:
        """An embedder returning these texts' precomputed (lifted) vectors."""
        return CorpusEmbedder(self.model, self.kind, self.lift_matrix, dict(zip(texts, vectors, strict=True)))

    def hot_rows(self) -> Iterator[list[HotRow]]:
        for start in range(0, len(self.texts), CHUNK):
            lifted = self.lift(self.vecs[start : start + CHUNK])
            yield [
                HotRow(
                    uuid.uuid4(),
                    t.user_id,
                    t.content,
                    v,
                    NOW - timedelta(minutes=start + j),
                    importance_score=t.importance_score,
                    category=t.category,
                    domain=t.domain,
                )
                for j, (t, v) in enumerate(zip(self.texts[start : start + CHUNK], lifted, strict=True))
            ]

    def archived_rows(self, copies: int) -> Iterator[list[HotRow]]:
        rng = np.random.default_rng(5)
        for c in range(copies):
            for start in range(0, len(self.texts), CHUNK):
                src = self.vecs[start : start + CHUNK]
                noisy = src + rng.normal(0, 0.02, src.shape).astype(np.float32)
                lifted = self.lift(noisy / np.linalg.norm(noisy, axis=1, keepdims=True))
                texts: list[Text] = self.texts[start : start + CHUNK]
                yield [
                    HotRow(
                        uuid.uuid4(),
                        t.user_id,
                        t.content,
                        v,
                        NOW - timedelta(days=400, minutes=c * len(self.texts) + start + j),
                    )
                    for j, (t, v) in enumerate(zip(texts, lifted, strict=True))
                ]
