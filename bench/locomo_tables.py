"""The locomo bench's report: its JSON shape and its tables (settings, categories, folds, phase 3,
generalization across datasets). `key` is where a dataset x embedder's figures live: the embedder's name
in a one-dataset run, "<dataset>/<embedder>" otherwise."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from .common import (
    Report,
    Table,
    percentiles_ms,
    ratio,
)
from .locomo_data import BASELINES, CV_GRID, KS, SETTINGS, Conversation, Dataset


class LocomoReport(Report):
    """The JSON also carries the summary keys at the top level (first dataset's first embedder) and per
    figures key."""

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


def cv_table(
    report: Report, ds: Dataset, key: str, emb_name: str, embedder: Any, folds: list[dict[str, Any]]
) -> None:
    """Leave one conversation out: the vector_weight with the best recall@10 over the other conversations'
    questions (ties: the smaller weight), and its recall@10 on the held-out conversation."""
    rows: list[list[Any]] = []
    figures: list[dict[str, Any]] = []
    if len(folds) < 2:
        report.figures[key]["cv"] = {"skipped": "cross-validation needs at least 2 conversations"}
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
            f"{ds.title} cross-validated vector_weight and context_weight, {emb_name} embedder ({embedder.model}): leave one conversation out",
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
    report.figures[key]["cv"] = {"folds": figures, "mean_of_folds": means, "all_questions": pooled}


def phase3_rows_of(res: dict[str, Any], categories: dict[int, str]) -> list[dict[str, Any]]:
    """Per question of one conversation: its category, each phase-3 setting's decision, and recall@10 of
    tiered and the phase-3 settings (to compare them on the questions that escalated)."""
    out = []
    for i, q in enumerate(res["questions"]):
        row: dict[str, Any] = {"category": categories.get(q.category, str(q.category))}
        for s in ("tiered", "phase3_auto", "phase3_always"):
            row[s] = res["scores"][s][i]["recall@10"]
        for s, decisions in res["decisions"].items():
            row[f"{s}_decision"] = decisions[i]
        out.append(row)
    return out


def phase3_table(report: Report, ds: Dataset, key: str, emb_name: str, rows: list[dict[str, Any]]) -> None:
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
            f"{ds.title} phase 3, {emb_name} embedder: what escalated, and recall@10 on those questions",
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
    report.figures[key]["phase3"] = figures


def _mean(values: list[dict[str, float]], key: str) -> float:
    return float(np.mean([v[key] for v in values])) if values else float("nan")


def recall_tables(
    report: Report,
    ds: Dataset,
    key: str,
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
            ds.categories.get(c, str(c)): {k: _mean(per_cat[s][c], k) for k in keys}
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
        label = "overall" if c is None else f"{c} ({ds.categories.get(c, '?')})"
        vals = {s: overall(s) if c is None else per_cat[s][c] for s in (*settings, *BASELINES)}
        rows.append(
            [label, len(vals["all_hot"])] + [_mean(vals[s], "recall@10") for s in (*settings, *BASELINES)]
        )
    report.tables.append(
        Table(
            f"{ds.title} evidence recall@10 by category, {emb_name} embedder {embedder.model} ({embedder.dim}-d): "
            f"{archived:,} of {memories:,} memories archived ({100 * archived / max(memories, 1):.0f}%)",
            ["category", "questions", *[LABELS[s] for s in (*settings, *BASELINES)]],
            rows,
            f"Conversations: {', '.join(c.sample_id for c in convs)}. "
            + (
                "Category names follow the common reading of LoCoMo's labels (used inconsistently in the "
                "literature)."
                if ds.name == "locomo"
                else f"Category names: {ds.title}'s own."
            ),
        )
    )
    report.figures[key] = {
        "model": embedder.model,
        "dim": embedder.dim,
        "memories": memories,
        "archived": archived,
        "default": default,
        "baselines": baselines,
        "first_sentence_vs_extractive_recall@10": first_vs_extractive,
    }


def _fold_figures(name: str, tiered: list[float], bm25: list[float]) -> dict[str, Any]:
    """Questions, mean tiered and BM25 recall@10 and their ratio over one set of questions."""
    t = float(np.mean(tiered)) if tiered else float("nan")
    b = float(np.mean(bm25)) if bm25 else float("nan")
    return {
        "conversation": name,
        "questions": len(tiered),
        "tiered_recall@10": t,
        "bm25_recall@10": b,
        "ratio": ratio(t, b) if tiered else float("nan"),
    }


def fold_table(
    report: Report, ds: Dataset, key: str, emb_name: str, folds: list[dict[str, Any]]
) -> dict[str, Any]:
    """Leave one conversation out, the library's defaults against BM25: per conversation (the held-out
    fold), pooled over every question of every fold, and the weakest fold. `folds`: per conversation, its
    id and per question its category, tiered (b) recall@10 and BM25 recall@10. Returns the figures."""
    cat1 = ds.categories.get(1, "1")
    figures, rows = [], []

    def of(name: str, qs: list[dict[str, Any]]) -> dict[str, Any]:
        out = _fold_figures(name, [q["tiered"] for q in qs], [q["bm25"] for q in qs])
        one = [q for q in qs if q["category"] == 1]
        out["category_1"] = _fold_figures(name, [q["tiered"] for q in one], [q["bm25"] for q in one])
        return out

    def row(f: dict[str, Any]) -> list[Any]:
        c = f["category_1"]
        return [
            f["conversation"],
            f["questions"],
            f["tiered_recall@10"],
            f["bm25_recall@10"],
            f["ratio"],
            c["questions"],
            c["tiered_recall@10"],
            c["bm25_recall@10"],
            c["ratio"],
        ]

    for fold in folds:
        figures.append(of(fold["conversation"], fold["questions"]))
        rows.append(row(figures[-1]))
    pooled = of("pooled (all questions)", [q for f in folds for q in f["questions"]])
    rows.append(row(pooled))

    def least(values: list[float]) -> float:
        finite = [v for v in values if not np.isnan(v)]
        return min(finite) if finite else float("nan")

    min_ratio = least([f["ratio"] for f in figures])
    min_cat1 = least([f["category_1"]["ratio"] for f in figures])
    rows.append(["minimum fold ratio", None, None, None, min_ratio, None, None, None, min_cat1])
    report.tables.append(
        Table(
            f"{ds.title} leave-one-conversation-out folds, {emb_name}: tiered (b) vs BM25 recall@10, "
            f"category 1 = {cat1}",
            [
                "held-out conversation",
                "questions",
                "tiered recall@10",
                "BM25 recall@10",
                "ratio",
                "category 1 questions",
                "category 1 tiered recall@10",
                "category 1 BM25 recall@10",
                "category 1 ratio",
            ],
            rows,
            "One row per conversation, the fold it is held out of. The run fits nothing on the other "
            "conversations; the library's default constants, though, were chosen on LoCoMo's and REALTALK's "
            "dev sets, so these rows are not held out from that choice (docs/performance.md gives a held-out "
            "check; with --cv, the cross-validated weights have their own table). Tiered = (b), the library's defaults after archiving every memory "
            f"older than {ds.cutoff_days} days; BM25 over every turn, same run. Ratio = tiered / BM25 recall@10; "
            "pooled = mean recall over all questions of all folds, its ratio the ratio of those means; "
            "minimum fold ratio = the weakest conversation's.",
        )
    )
    out = {
        "folds": figures,
        "pooled": pooled,
        "min_fold_ratio": min_ratio,
        "min_fold_ratio_category_1": min_cat1,
    }
    report.figures[key]["folds"] = out
    return out


def generalization(ds: Dataset, emb_name: str, fig: dict[str, Any], folds: dict[str, Any]) -> dict[str, Any]:
    """One dataset x embedder's line of the generalization table, from its figures and its folds."""
    hot, tiered = fig["default"]["all_hot"], fig["default"]["tiered"]
    pooled = folds["pooled"]
    return {
        "dataset": ds.name,
        "embedder": emb_name,
        "questions": pooled["questions"],
        "tiered_recall@10": pooled["tiered_recall@10"],
        "bm25_recall@10": pooled["bm25_recall@10"],
        "pooled_ratio": pooled["ratio"],
        "min_fold_ratio": folds["min_fold_ratio"],
        "category_1": ds.categories.get(1, "1"),
        "category_1_questions": pooled["category_1"]["questions"],
        "category_1_tiered_recall@10": pooled["category_1"]["tiered_recall@10"],
        "category_1_bm25_recall@10": pooled["category_1"]["bm25_recall@10"],
        "category_1_ratio": pooled["category_1"]["ratio"],
        "all_hot_recall@10": hot["recall@10"],
        "tiered_vs_all_hot@5": ratio(tiered["recall@5"], hot["recall@5"]),
        "tiered_vs_all_hot@10": ratio(tiered["recall@10"], hot["recall@10"]),
        "search_p50_ms": tiered["latency_ms"]["p50"],
        "search_p95_ms": tiered["latency_ms"]["p95"],
    }


def generalization_table(lines: list[dict[str, Any]]) -> Table:
    return Table(
        "Generalization: recall@10 vs BM25 per dataset and embedder",
        [
            "dataset",
            "embedder",
            "questions",
            "tiered recall@10",
            "BM25 recall@10",
            "pooled ratio",
            "min fold ratio",
            "category 1 ratio",
            "all-hot recall@10",
            "tiered / all hot @5",
            "tiered / all hot @10",
            "search p50 ms",
            "search p95 ms",
        ],
        [
            [
                g["dataset"],
                g["embedder"],
                g["questions"],
                g["tiered_recall@10"],
                g["bm25_recall@10"],
                g["pooled_ratio"],
                g["min_fold_ratio"],
                g["category_1_ratio"],
                g["all_hot_recall@10"],
                g["tiered_vs_all_hot@5"],
                g["tiered_vs_all_hot@10"],
                g["search_p50_ms"],
                g["search_p95_ms"],
            ]
            for g in lines
        ],
        "The library's defaults (MemoryClient.search, no override, the same settings for every dataset) on "
        "the tiered (b) database against BM25 over every turn in the same run. Pooled ratio = mean recall@10 "
        "over all questions / BM25's; min fold ratio = the weakest conversation's (the run fits "
        "nothing; the defaults were chosen on these dev sets); category 1 = multi-hop (LoCoMo), multi-answer (REALTALK); tiered / all "
        "hot = what archival costs; latency = the tiered limit-10 searches, question vector precomputed.",
    )
