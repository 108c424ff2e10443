"""Calibrate the write path's near-duplicate thresholds per embedder (memory_lib.near_duplicates).

    python -m bench.near_duplicates            # hashing, and MiniLM when the local extra is installed

For each embedder: the cosine of every labelled pair (bench/near_duplicate_pairs.py), then a grid
search of (vector, floor) that keeps one live memory for paraphrases and changed values and two for
related and unrelated pairs. A false merge/supersede (two true facts become one) counts double: it
hides a live fact. Ties go to the higher thresholds. Prints the table and the shipped defaults'
accuracy beside the best found; writes bench/results/near_duplicates.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from bench.near_duplicate_pairs import PAIRS, SAME_FACT
from memory_lib.embedding import HashingEmbedder
from memory_lib.near_duplicates import Thresholds, decide, embedder_family, thresholds_for

GRID = [round(x, 2) for x in np.arange(0.05, 1.0, 0.05)]


def cosines(embedder) -> list[float]:
    a = embedder.embed([p[1] for p in PAIRS])
    b = embedder.embed([p[2] for p in PAIRS])
    return [float(x) for x in (a * b).sum(axis=1)]


def score(cos: list[float], t: Thresholds) -> dict[str, int]:
    out = {"right": 0, "missed": 0, "false_same": 0}
    for (label, old, new), c in zip(PAIRS, cos, strict=True):
        same = decide(c, old, new, t)[0] != "new"
        if same == (label in SAME_FACT):
            out["right"] += 1
        elif same:
            out["false_same"] += 1
        else:
            out["missed"] += 1
    return out


def calibrate(cos: list[float]) -> tuple[Thresholds, dict[str, int]]:
    best: tuple[tuple[int, float, float], Thresholds, dict[str, int]] | None = None
    for vector in GRID:
        for floor in (f for f in GRID if f <= vector):
            t = Thresholds(vector, floor)
            s = score(cos, t)
            key = (-(s["missed"] + 2 * s["false_same"]), vector, floor)
            if best is None or key > best[0]:
                best = (key, t, s)
    assert best is not None
    return best[1], best[2]


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    embedders = [HashingEmbedder(1536)]
    try:
        from memory_lib.embedding import LocalEmbedder

        embedders.append(LocalEmbedder())
    except ImportError:
        print("(local extra not installed: MiniLM skipped)", file=sys.stderr)
    rows, results = [], {}
    for e in embedders:
        cos = cosines(e)
        shipped = thresholds_for(e.model, e.kind)
        best, best_score = calibrate(cos)
        ship_score = score(cos, shipped)
        by_label = {lab: [c for (la, _, _), c in zip(PAIRS, cos, strict=True) if la == lab]
                    for lab in ("paraphrase", "changed", "related", "unrelated")}  # fmt: skip
        family = embedder_family(e.model, e.kind)
        results[family] = {
            "pairs": len(PAIRS), "shipped": shipped.__dict__, "shipped_score": ship_score,
            "best": best.__dict__, "best_score": best_score,
            "cosine_range": {k: [round(min(v), 3), round(max(v), 3)] for k, v in by_label.items()},
        }  # fmt: skip
        rows.append(
            f"| {family} | {shipped.vector:.2f} / {shipped.floor:.2f} | {ship_score['right']}/{len(PAIRS)} "
            f"| {ship_score['missed']} | {ship_score['false_same']} | {best.vector:.2f} / {best.floor:.2f} "
            f"| {best_score['right']}/{len(PAIRS)} | "
            + " | ".join(f"{min(v):.2f}-{max(v):.2f}" for v in by_label.values())
            + " |"
        )
    print("| embedder | shipped vector / floor | right | missed | false same | best found | right "
          "| paraphrase cos | changed cos | related cos | unrelated cos |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    out = Path(__file__).resolve().parent / "results" / "near_duplicates.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
