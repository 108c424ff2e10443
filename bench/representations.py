"""Ways to store an archived summary's vector, compared by `bench footprint`: bytes and LoCoMo recall.

Each variant is a memory_lib.retrieval.sql.VectorArm plus the DDL that adds its columns and index to an
archived_memories table whose rows carry the summary vector in a scratch column `bench_vec` (real
float32, filled by the benchmark). The default (007: bit + HNSW by Hamming) needs no extra column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memory_lib.retrieval.sql import ARCHIVED_VECTORS, VectorArm


def int8_codes(vecs: np.ndarray) -> list[bytes]:
    """Symmetric int8 per vector (scale = 127 / max |x|); the scale cancels in a cosine."""
    v = np.asarray(vecs, dtype=np.float32)
    scale = 127.0 / np.maximum(np.abs(v).max(axis=1, keepdims=True), 1e-12)
    return [row.tobytes() for row in np.clip(np.rint(v * scale), -127, 127).astype(np.int8)]


def int8_cosine(code: bytes, query: np.ndarray) -> float:
    v = np.frombuffer(code, dtype=np.int8).astype(np.float32)
    q = np.asarray(query, dtype=np.float32)
    return float(v @ q / ((np.linalg.norm(v) * np.linalg.norm(q)) or 1.0))


@dataclass(frozen=True)
class Representation:
    key: str  # stable JSON key
    name: str
    arm: VectorArm
    ddl: Callable[[int], list[str]]  # statements adding the variant's columns/indexes for dim d
    fill: str | None = None  # 'halfvec', 'int8' or 'truncated': what the bench writes from bench_vec
    keeps_bits: bool = True  # does the variant keep 007's bit column and its HNSW?


_BIT = ARCHIVED_VECTORS.distance


def variants(dim: int) -> list[Representation]:
    half = dim // 2
    return [
        Representation(
            "halfvec",
            "halfvec + HNSW (before 007)",
            VectorArm(
                "halfvec",
                "a.bench_half <=> %(embedding)s::vector::halfvec",
                "1 - (a.bench_half <=> %(embedding)s::vector::halfvec)",
            ),
            lambda d: [
                f"ALTER TABLE archived_memories ADD COLUMN bench_half halfvec({d})",
                "CREATE INDEX bench_half_hnsw ON archived_memories USING hnsw (bench_half halfvec_cosine_ops) "
                "WITH (m = 16, ef_construction = 64)",
            ],
            "halfvec",
            keeps_bits=False,
        ),
        Representation(
            "bit", "bit + HNSW (Hamming), cosine estimated (007 default)", ARCHIVED_VECTORS, lambda d: []
        ),
        Representation(
            "bit_int8",
            "bit + HNSW, 4x candidates re-ranked by int8 in Python",
            VectorArm(
                "bit+int8", _BIT, "NULL::float8", oversample=4, rerank_column="a.bench_i8", rerank=int8_cosine
            ),
            lambda d: [
                "ALTER TABLE archived_memories ADD COLUMN bench_i8 bytea",
                "ALTER TABLE archived_memories ALTER COLUMN bench_i8 SET STORAGE EXTERNAL",
            ],
            "int8",
        ),
        Representation(
            "truncated_half",
            f"halfvec of the first {half} dims + HNSW (Matryoshka-style truncation)",
            VectorArm(
                "truncated",
                f"a.bench_trunc <=> subvector(%(embedding)s::vector, 1, {half})::halfvec",
                f"1 - (a.bench_trunc <=> subvector(%(embedding)s::vector, 1, {half})::halfvec)",
            ),
            lambda d: [
                f"ALTER TABLE archived_memories ADD COLUMN bench_trunc halfvec({d // 2})",
                "CREATE INDEX bench_trunc_hnsw ON archived_memories USING hnsw (bench_trunc halfvec_cosine_ops) "
                "WITH (m = 16, ef_construction = 64)",
            ],
            "truncated",
            keeps_bits=False,
        ),
        Representation(
            "none",
            "no summary vector (full text only)",
            VectorArm("none", "0::float8", "0::float8", oversample=0),  # LIMIT 0: no vector candidate
            lambda d: [],
            keeps_bits=False,
        ),
    ]
