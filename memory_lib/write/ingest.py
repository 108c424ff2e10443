"""A text on its way in, before and around the write plans: chunk and embed it, ask the LLM judge.

The client's add is a flow (memory_lib.core.plans) of these steps: `prepare_write` (no database),
`judge_plan` and `judge_verdict` (only when a judge is configured), then `write_plan`
(memory_lib.write.write_path), which stores it in one transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from ..core.config import Settings
from ..core.errors import InvalidInputError
from ..core.plans import Plan, query_vector
from ..llm.embedding import Embedder
from . import chunking
from .write_judge import Candidate, LLMWriteJudge, Verdict
from .write_path import (
    AddResult,
    PreparedMemory,
    add_chunks_plan,
    add_plan,
    judge_candidates_plan,
    near_duplicate_thresholds,
)


@dataclass(frozen=True)
class PreparedWrite:
    """A text on its way in: validated, chunked and embedded (one vector per chunk)."""

    memory: PreparedMemory
    chunks: list[chunking.Chunk]
    vectors: list[np.ndarray]
    supersedes: uuid.UUID | None


def embed_one(embedder: Embedder, text: str) -> np.ndarray:
    """One text's vector, checked against the embedder's dimension."""
    return query_vector(embedder.embed([text])[0], embedder.dim)


def prepare_write(
    memory: PreparedMemory, supersedes: uuid.UUID | None, *, embedder: Embedder, settings: Settings
) -> PreparedWrite:
    """Chunk (memory_lib.write.chunking) and embed a prepared memory: no database yet. A text long
    enough to be chunked never supersedes a memory (InvalidInputError naming `supersedes`)."""
    cfg, e = settings.chunking, embedder
    size, overlap = chunking.chunk_limits(cfg.max_tokens, cfg.overlap_tokens, getattr(e, "max_tokens", None))
    chunks = chunking.split(memory.content, max_tokens=size, overlap=overlap)
    if len(chunks) == 1:
        return PreparedWrite(memory, chunks, [embed_one(e, memory.content)], supersedes)
    if supersedes is not None:
        raise InvalidInputError(
            "supersedes",
            str(supersedes),
            f"a text this long is stored as {len(chunks)} chunks, "
            "and chunks never supersede a memory: update() the memory with a shorter text",
        )
    return PreparedWrite(
        memory, chunks, [query_vector(v, e.dim) for v in e.embed([c.text for c in chunks])], None
    )


def judge_plan(
    w: PreparedWrite, *, judge: LLMWriteJudge | None, embedder: Embedder, settings: Settings
) -> Plan[list[Candidate]] | None:
    """The read that finds what the LLM judge must see; None when no judge is asked (none configured,
    the caller named what the text supersedes, or a long text)."""
    if judge is None or w.supersedes is not None or len(w.chunks) > 1:
        return None
    return judge_candidates_plan(
        w.memory,
        w.vectors[0],
        embedding_model=embedder.model,
        k=settings.write.judge_candidates,
        thresholds=near_duplicate_thresholds(
            settings.retrieval, embedder.model, getattr(embedder, "kind", None)
        ),
    )


def judge_verdict(
    judge: LLMWriteJudge | None, w: PreparedWrite, candidates: list[Candidate]
) -> Verdict | None:
    """The LLM judge's verdict (it never raises: a failure is a failed verdict, and the text is added)."""
    return judge.judge(w.memory.content, candidates) if judge is not None and candidates else None


def write_plan(
    w: PreparedWrite,
    *,
    embedder: Embedder,
    settings: Settings,
    actor: str,
    now: datetime,
    verdict: Verdict | None = None,
) -> Plan[AddResult]:
    """The plan that stores a prepared write (memory_lib.write.write_path)."""
    if len(w.chunks) == 1:
        return add_plan(
            w.memory,
            w.vectors[0],
            config=settings.retrieval,
            write=settings.write,
            embedder_kind=getattr(embedder, "kind", None),
            supersedes=w.supersedes,
            verdict=verdict,
            embedding_model=embedder.model,
            actor=actor,
            now=now,
        )
    vectors: Any = w.vectors  # one vector per chunk (add_chunks_plan zips them with the chunks)
    return add_chunks_plan(w.memory, w.chunks, vectors, embedding_model=embedder.model, actor=actor, now=now)
