"""Rankings with no library code in them, over every turn's text: BM25 over Postgres's English lexemes,
exact dense cosine, and their reciprocal rank fusion."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import TypeVar

import numpy as np

from .locomo_data import DB

BM25_K1, BM25_B, RRF_K = 1.2, 0.75, 60
K = TypeVar("K", bound=Hashable)


def lexemes(conn: DB, texts: list[str]) -> list[dict[str, int]]:
    """Term frequencies of Postgres's English lexemes (the tokenizer and stemmer full text uses)."""
    rows = conn.execute(
        """SELECT t.i, l.lexeme, coalesce(array_length(l.positions, 1), 1) AS tf
           FROM unnest(%s::text[]) WITH ORDINALITY AS t(txt, i), unnest(to_tsvector('english', t.txt)) AS l""",
        (texts,),
    ).fetchall()
    out: list[dict[str, int]] = [{} for _ in texts]
    for r in rows:
        out[r["i"] - 1][r["lexeme"]] = r["tf"]
    return out


def bm25_rank(docs: list[dict[str, int]], query: dict[str, int], ids: list[str]) -> list[str]:
    """Okapi BM25 over every doc; docs sharing no term with the query are not ranked."""
    n = len(docs)
    lengths = np.array([sum(d.values()) for d in docs], dtype=np.float64)
    avg = float(lengths.mean()) if n else 1.0
    scores = np.zeros(n)
    for term in query:
        tf = np.array([d.get(term, 0) for d in docs], dtype=np.float64)
        df = int((tf > 0).sum())
        if df == 0:
            continue
        idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
        scores += idf * tf * (BM25_K1 + 1) / (tf + BM25_K1 * (1 - BM25_B + BM25_B * lengths / avg))
    order = [i for i in np.argsort(-scores, kind="stable") if scores[i] > 0]
    return [ids[i] for i in order]


def dense_rank(doc_vecs: np.ndarray, qvec: np.ndarray, ids: list[str]) -> list[str]:
    sims = doc_vecs @ (qvec / (np.linalg.norm(qvec) or 1.0))
    return [ids[i] for i in np.argsort(-sims, kind="stable")]


def rrf_rank(*lists: Sequence[K]) -> list[K]:
    score: dict[K, float] = defaultdict(float)
    for ranked in lists:
        for pos, key in enumerate(ranked, start=1):
            score[key] += 1.0 / (RRF_K + pos)
    return sorted(score, key=lambda key: -score[key])
