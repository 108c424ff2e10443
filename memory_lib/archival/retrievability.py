"""Can a night's archived memories still be found? The probe behind the retrievability gate.

For one archival night (batch key `night-YYYY-MM-DD`, kept in archived_memories.metadata.batch_key):
sample up to `sample_size` of the night's archived memories (a stable pseudo-random order, so a re-run
probes the same ones), read each verified original from object storage, take its most specific
sentence as the question (`probe_question`), and run the product's two-phase search (default RetrievalConfig, phase 2 auto, as the
memory's own user) with limit `k`. A memory is found when its archive row is among the hits, or, for
a chunk of a long memory, its parent (search returns a chunked memory once, by its best chunk).

`share_found` below `floor` (RetrievalConfig.retrievability_floor, 0.9) means the archive rows no
longer carry what made the memories findable (a summary embedded by another model, rows without the
lexical fingerprint of their originals and with empty or generic summaries): the gate fails and
archival pauses. A night with nothing archived passes (nothing to lose).

Only rows search can return are probed and counted: an archive row whose original was superseded
(original_superseded_by set) is hidden from search by design, so it is never sampled, and `archived`
counts the night's live (searchable) archive rows. A night whose archive holds superseded rows only
has nothing to probe and passes.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from psycopg.types.json import Jsonb

from ..core.config import RetrievalConfig
from ..core.errors import IntegrityError, InvalidInputError, ObjectNotFoundError
from ..core.models import BackupObject
from ..core.plans import query_vector, run_plan
from ..core.validation import utc_now
from ..llm.summarize import split_sentences
from ..retrieval.search import search_plan
from ..retrieval.types import SearchRequest
from ..storage import packs

if TYPE_CHECKING:
    import numpy as np

    from ..core.rows import Conn
    from ..llm.embedding import Embedder
    from ..storage.objectstore import BackupReader

log = logging.getLogger(__name__)

__all__ = ["NightRetrievability", "first_sentence", "probe_night", "probe_nights", "probe_question"]

_SAMPLE_SQL = f"""
    SELECT a.id AS archive_id, a.original_id, a.user_id, a.metadata -> 'chunk' ->> 'parent_id' AS parent_id,
           {packs.backup_sql("a")}
    FROM archived_memories a
    WHERE a.metadata ->> 'batch_key' = %(batch_key)s AND a.original_superseded_by IS NULL
    ORDER BY md5(a.original_id::text), a.original_id
    LIMIT %(n)s"""
# The night's searchable archive rows: superseded originals are hidden from search, so never probed.
_COUNT_SQL = """
    SELECT count(*) AS n FROM archived_memories
    WHERE metadata ->> 'batch_key' = %(batch_key)s AND original_superseded_by IS NULL"""


@dataclass(frozen=True)
class NightRetrievability:
    """One night's result. share_found is None when nothing searchable of the night is archived."""

    batch_key: str
    archived: int  # the night's archive rows search can return (superseded originals left out)
    sampled: int
    found: int
    floor: float
    k: int
    missed: list[uuid.UUID] = field(default_factory=list)  # original ids not in the top k
    seconds: float = 0.0

    @property
    def share_found(self) -> float | None:
        return self.found / self.sampled if self.sampled else None

    @property
    def passed(self) -> bool:
        share = self.share_found
        return share is None or share >= self.floor

    def describe(self) -> str:
        if self.share_found is None:
            return f"{self.batch_key}: nothing searchable archived"
        return (
            f"{self.batch_key}: {self.found}/{self.sampled} sampled archived memories found in the top {self.k} "
            f"by their most specific sentence ({100 * self.share_found:.0f}%, floor {100 * self.floor:.0f}%)"
        )


def first_sentence(text: str, max_chars: int = 300) -> str:
    """The first sentence of `text` (verbatim), cut at a word past max_chars."""
    spans = split_sentences(text)
    return _bounded(text[spans[0][0] : spans[0][1]] if spans else text.strip(), max_chars)


def probe_question(text: str, max_chars: int = 300) -> str:
    """The question a memory is probed with: its most specific sentence, the one with the most distinct
    words (the first of equals), verbatim and cut at a word past max_chars. Not simply the first: in
    chat, a first sentence like "Caroline: That's amazing!" would rank a hundred memories alike, hot or
    archived, and the probe would measure the question instead of what archival kept."""
    spans = split_sentences(text)
    if not spans:
        return _bounded(text.strip(), max_chars)
    sentences = [text[a:b] for a, b in spans]
    return _bounded(max(sentences, key=lambda s: len(_words(s))), max_chars)


def _bounded(sentence: str, max_chars: int) -> str:
    if len(sentence) > max_chars:
        cut = sentence[:max_chars].rsplit(" ", 1)[0]
        sentence = cut or sentence[:max_chars]
    return sentence


def _words(text: str) -> set[str]:
    return set(re.findall(r"[^\W_]+", text.casefold()))


def _same_fact(summary: str, question: str, min_overlap: float = 0.9) -> bool:
    """A hit (hot, or an archived summary) that states nearly the probed sentence answers "did I ever know
    this?" as the probed memory would: agents store the same fact many times, and only one copy ranks
    first. Nearly = the same numbers, and at least 90% of the words shared both ways."""
    q, h = _words(question), _words(probe_question(summary.strip()))
    if not q or not h or {w for w in q if w.isdigit()} != {w for w in h if w.isdigit()}:
        return False
    shared = len(q & h)
    return shared / len(q) >= min_overlap and shared / len(h) >= min_overlap


def probe_night(
    conn: Conn,
    embedder: Embedder,
    store: BackupReader,
    batch_key: str,
    *,
    config: RetrievalConfig | None = None,
    sample_size: int | None = None,
    k: int = 10,
    now: datetime | None = None,
) -> NightRetrievability:
    """Search a sample of the night's searchable (not superseded) archived memories with their own first
    sentence (read-only)."""
    if not isinstance(batch_key, str) or not batch_key.strip():
        raise InvalidInputError("batch_key", batch_key, "must be a non-empty string like 'night-2025-06-01'")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1000:
        raise InvalidInputError("k", k, "must be an integer between 1 and 1000")
    config = config or RetrievalConfig()
    n = config.retrievability_sample_size if sample_size is None else sample_size
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidInputError("sample_size", n, "must be a positive integer")
    started = time.monotonic()
    when = utc_now(now)
    count = conn.execute(_COUNT_SQL, {"batch_key": batch_key}).fetchone()
    assert count is not None  # an aggregate without GROUP BY returns exactly one row
    archived = count["n"]
    rows = conn.execute(_SAMPLE_SQL, {"batch_key": batch_key, "n": n}).fetchall()
    if not rows:
        return NightRetrievability(batch_key, archived, 0, 0, config.retrievability_floor, k)
    readable, questions = [], []
    missed: list[uuid.UUID] = []
    for row in rows:
        try:
            raw = store.read_ref(row["storage_ref"], row["backup_sha256"])
        except (ObjectNotFoundError, IntegrityError) as exc:
            # A backup that cannot be read back is not retrievable: a miss, reported, not a crashed probe
            # (the tier audit and the round-trip check name the object itself).
            log.warning("retrievability %s: backup of %s unreadable: %s", batch_key, row["original_id"], exc)
            missed.append(row["original_id"])
            continue
        readable.append(row)
        questions.append(probe_question(BackupObject.from_json_bytes(raw).content))
    vectors: np.ndarray | list[np.ndarray] = embedder.embed(questions) if questions else []
    search_config = config.model_copy(update={"limit": k})
    for row, question, vector in zip(readable, questions, vectors, strict=True):
        request = SearchRequest(
            user_id=row["user_id"],
            query=question,
            embedding=query_vector(vector, embedder.dim),
            config=search_config,
            now=when,
            phase2="auto",
            embedding_model=embedder.model,
            embedder_kind=getattr(embedder, "kind", None),
        )
        result = run_plan(conn, search_plan(request))
        parent = uuid.UUID(row["parent_id"]) if row["parent_id"] else None
        if not any(
            h.provenance.archive_id == row["archive_id"]
            or (parent is not None and h.provenance.parent_id == parent)
            or _same_fact(h.text, question)
            for h in result.hits
        ):
            missed.append(row["original_id"])
    return NightRetrievability(
        batch_key,
        archived,
        len(rows),
        len(rows) - len(missed),
        config.retrievability_floor,
        k,
        missed,
        time.monotonic() - started,
    )


def probe_nights(
    conn: Conn,
    embedder: Embedder,
    store: BackupReader,
    batch_keys: Sequence[str],
    **kwargs: object,
) -> list[NightRetrievability]:
    """probe_night for each key, in order."""
    return [probe_night(conn, embedder, store, key, **kwargs) for key in batch_keys]  # type: ignore[arg-type]


def record(conn: Conn, result: NightRetrievability) -> None:
    """Keep a night's result on its batch (archival_batches.retrievability), for the read-only check."""
    conn.execute(
        "UPDATE archival_batches SET retrievability = %s WHERE batch_key = %s",
        (
            Jsonb(
                {
                    "archived": result.archived,
                    "sampled": result.sampled,
                    "found": result.found,
                    "floor": result.floor,
                    "k": result.k,
                    "missed": [str(m) for m in result.missed],
                    "seconds": round(result.seconds, 3),
                }
            ),
            result.batch_key,
        ),
    )


def recorded(conn: Conn, batch_key: str) -> NightRetrievability | None:
    """The last result `record` kept for the night, or None when the night was never probed."""
    row = conn.execute(
        "SELECT retrievability AS r FROM archival_batches WHERE batch_key = %s", (batch_key,)
    ).fetchone()
    if row is None or row["r"] is None:
        return None
    r = row["r"]
    return NightRetrievability(
        batch_key,
        r["archived"],
        r["sampled"],
        r["found"],
        r["floor"],
        r["k"],
        [uuid.UUID(m) for m in r["missed"]],
        r["seconds"],
    )
