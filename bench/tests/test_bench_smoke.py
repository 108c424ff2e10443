"""Every benchmark at --smoke size, through the CLI, so the benches never rot.

Each asserts the shape and sanity of what the benchmark reports (rows, counts, ranges), never a time.
The SeaweedFS server is the test session's; the LoCoMo and REALTALK runs need ../shared/data (skipped
without it).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main
from bench.common import LOCOMO_DEFAULT, REALTALK_DEFAULT, REPO_ROOT, Options
from bench.locomo import selected
from bench.locomo_data import REALTALK_CATEGORY_NAMES, parse_dia_ids
from bench.search import _recall


def run_bench(tmp_path: Path, name: str, *args: str) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    assert main([name, "--smoke", "--json", str(out), "--workdir", str(tmp_path), *args]) == 0
    data = json.loads(out.read_text())
    assert data["benchmark"] == name
    assert data["params"]["smoke"] is True
    assert data["machine"]["nproc"] >= 1 and data["machine"]["postgres"].startswith("18")
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith("ma-bench-")]
    assert leftovers == [], f"temporary servers or objects left behind: {leftovers}"
    return data


def rows(data: dict[str, Any], title_start: str) -> list[dict[str, Any]]:
    found = [t for t in data["tables"] if t["title"].startswith(title_start)]
    assert len(found) == 1, [t["title"] for t in data["tables"]]
    return found[0]["rows"]


def bench_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m bench ARGS` in a child process, as a user runs it (argparse exits there)."""
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=REPO_ROOT, capture_output=True, text=True
    )


def finite_positive(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture
def s3_args(seaweed, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Point the benchmarks at the session's SeaweedFS (credentials through the standard AWS variables)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    bucket = seaweed.create_bucket(f"bench-{uuid.uuid4().hex[:12]}")
    return ["--s3-endpoint", seaweed.endpoint_url, "--s3-bucket", bucket]


def test_search_smoke(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "search", "--embedder", "hashing")
    n = data["params"]["sizes"][0]
    latency = rows(data, "Hot top-10 search")
    assert latency[0]["mode"] == "exact scan (baseline)" and latency[0]["speedup p50 vs exact"] == 1.0
    assert [r["mode"].split(" (")[0] for r in latency[1:]] == [
        f"hnsw ef_search={ef}" for ef in data["params"]["ef_sweep"]
    ]
    for r in latency:
        assert 0.0 <= r["recall@10 vs exact"] <= 1.0
        assert finite_positive(r["p50"]) and r["p50"] <= r["p95"] <= r["p99"]
        assert finite_positive(r["speedup p50 vs exact"])
    assert "hnsw" not in latency[0]["plan"]
    assert all("memories_embedding_hnsw" in r["plan"] for r in latency[1:])  # HNSW rows measure HNSW
    hot = data["figures"]["hot"][str(n)]
    assert hot["dim"] == 1536 and 0.0 <= hot["default"]["recall_at_10"] <= 1.0 and hot["default"]["p95"] > 0

    two = rows(data, "Two-phase search vs hot-only")
    assert [r["mode"].split(" ")[0] for r in two] == ["hot", "two-phase"]
    assert two[0]["archived hits/query"] == 0
    assert 0 < two[1]["archived hits/query"] <= 10  # the default limit counts hot and archived hits together
    assert finite_positive(two[1]["ratio p50 vs hot-only"]) and finite_positive(
        two[1]["ratio p95 vs hot-only"]
    )
    assert data["figures"]["two_phase"][str(n)]["archived"] == 4 * n
    speed = rows(data, "Search speed vs the bare vector query")
    assert [r["search"].split(",")[0].split(" (")[0] for r in speed] == [
        "default search",
        "default search",
        "16 concurrent AsyncMemoryClient.search",
    ]
    assert all(finite_positive(r["p50"]) and finite_positive(r["ratio p50"]) for r in speed)
    assert data["figures"]["conversation"][str(n)]["hot"] > 0
    engine = data["figures"]["two_phase"][str(n)]
    assert engine["term_stats"]["docs"] == 5 * n and engine["term_stats"]["terms"] > 0
    assert finite_positive(engine["vector_leg"]["p95"]) and finite_positive(engine["default"]["p95"])
    assert finite_positive(engine["ratio_p95_vs_vector_leg"]["default"])

    load = data["figures"]["under_load"][str(n)]
    assert load["archival"]["archived"] > 0 and load["under_load"]["searches"] > 0
    assert finite_positive(load["under_load"]["ratio_p95_vs_same_threads_idle"])


def test_archival_smoke(tmp_path: Path, s3_args: list[str]) -> None:
    data = run_bench(tmp_path, "archival", *s3_args, "--baseline", "50")
    n = data["params"]["sizes"][0]
    assert data["params"]["baseline"] == 50 < n
    throughput = rows(data, "Archival throughput")
    assert [(r["object store"].split(" ")[0], r["method"]) for r in throughput] == [
        ("S3", "naive loop (baseline)"),
        ("S3", "run_batch × 500"),
        ("S3", "run_batch × 500, no packs (one object per memory)"),
        ("S3", "memory-archive archive --until-drained × 2 shards (a process each)"),
        ("local", "naive loop (baseline)"),
        ("local", "run_batch × 500"),
        ("local", "run_batch × 500, no packs (one object per memory)"),
        ("local", "memory-archive archive --until-drained × 2 shards (a process each)"),
    ]
    for r in throughput:  # the baselines archive the backlog's first 50 (and leave the rest hot: checked)
        drains = r["method"] == "run_batch × 500" or r["method"].startswith("memory-archive")
        assert r["archived"] == (n if drains else 50)
        assert finite_positive(r["memories/s"]) and finite_positive(r["throughput vs naive"])
        assert r["backup bytes/memory"] > 1536 * 4  # the float32 embedding as JSON decimals, at least
    steps = rows(data, "Archival: share of time per step")
    for r in steps:
        shares = [v for k, v in r.items() if k not in ("object store", "method", "total s") and v is not None]
        assert all(0 <= v <= 100 for v in shares)
        assert sum(shares) <= 101
        if r["method"] == "batched":
            assert sum(shares) == pytest.approx(100, abs=1.0)  # the steps plus their remainder
    restore = rows(data, "Restore and re-promotion")
    # 20 bulk restores, 4 one per call; 3 promotions after 2 expansions each
    assert [r["count"] for r in restore] == [20, 4, 2 * 3, 3]
    for r in restore:
        assert finite_positive(r["per second"])
        assert (
            r["p50 ms"] is None
            if r["operation"].startswith("restore_archives")
            else finite_positive(r["p50 ms"])
        )
    fig = data["figures"]  # the summary keys every run writes, for the largest size
    assert fig["size"] == n and fig["by_size"][str(n)]["size"] == n
    for key in (
        "rate_per_s",
        "naive_rate_per_s",
        "ratio_vs_naive",
        "no_packs_rate_per_s",
        "restore_rate_per_s",
        "peak_rss_mib",
        "machine_cpu_ms_per_memory",
        "cpu_ceiling_per_s",
        "sharded_rate_per_s",
    ):
        assert finite_positive(fig[key]), key
    assert fig["ratio_vs_naive"] == pytest.approx(fig["rate_per_s"] / fig["naive_rate_per_s"])
    # the ceiling is the cores' rate: every core busy at the measured CPU cost per memory
    assert fig["cpu_ceiling_per_s"] == pytest.approx(
        fig["load"]["cpu_count"] * 1000 / fig["machine_cpu_ms_per_memory"], rel=1e-6
    )
    assert all(finite_positive(r["machine CPU ms/memory"]) for r in throughput)
    assert 0 <= fig["rss_growth_mib"] <= fig["peak_rss_mib"]
    assert fig["load"]["cpu_count"] >= 1 and len(fig["load"]["loadavg_end"]) == 3
    assert fig["machine"]["nproc"] >= 1
    summary = rows(data, "Archival summary")
    assert [r["backlog"] for r in summary] == [n]
    assert summary[0]["batched memories/s"] == pytest.approx(fig["rate_per_s"])


def test_footprint_smoke(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "footprint")
    table = rows(data, "Postgres bytes per memory, ")
    assert [(r["dim"], r["row"].split(" ")[0]) for r in table] == [
        (1536, "hot"),
        (1536, "archived"),
        (1536, "+"),
        (384, "hot"),
        (384, "archived"),
        (384, "+"),
    ]
    for r in table:
        assert finite_positive(r["total"]) and r["indexes"] > 0
        assert r["saving vs hot %"] < 100
        # archival_attempts keeps no row per archived memory: pruned after the audit, only empty pages left
        assert (r["heap"] == 0) if r["row"].startswith("+") else (r["heap"] > 0)
    by_dim = {r["dim"]: r for r in table if r["row"].startswith("hot")}
    assert by_dim[1536]["total"] > by_dim[384]["total"]
    for fig in data["figures"][str(data["params"]["sizes"][0])]:
        assert fig["object_store"]["objects"] == fig["object_store"]["objects_recorded"] > 0
    objects = rows(data, "Object storage and audit log per memory")
    sizes = {r["dim"]: r["backup object bytes"] for r in objects}
    assert sizes[1536] > 3 * sizes[384] > 0
    for r in objects:
        # a pack stores one newline after each member
        assert r["bytes on disk (local store)"] == pytest.approx(r["backup object bytes"], abs=1.0)
        assert r["memory_events bytes (after archiving)"] > r["memory_events bytes (hot)"] > 0
    reps = rows(data, "Summary vectors: Postgres bytes per archived memory vs LoCoMo tiered recall@10")
    assert reps[0]["representation"].startswith("halfvec") and reps[0]["recall vs halfvec"] == 1.0
    assert "007 default" in reps[1]["representation"]
    for r in reps:
        assert 0 < r["bytes 1536-d"] < by_dim[1536]["total"] and 0.0 <= r["tiered recall@10"] <= 1.0
    # bits take less room than half floats, and no vector least of all
    assert reps[-1]["bytes 1536-d"] < reps[1]["bytes 1536-d"] < reps[0]["bytes 1536-d"]
    assert set(data["figures"]["archived_vs_hot"]) == {"1536", "384"}
    assert all(0 < v < 1 for v in data["figures"]["archived_vs_hot"].values())
    assert set(data["figures"]["archived_vs_hot_written"]) == {"1536", "384"}
    assert all(0 < v < 1 for v in data["figures"]["archived_vs_hot_written"].values())
    n = data["params"]["sizes"][-1]
    written = rows(data, "Postgres bytes per memory as written and compacted")
    assert [r["dim"] for r in written] == [1536, 384]
    for r in written:
        # VACUUM FULL rebuilds every index: never larger than the inserts left them
        assert r["hot as written"] >= r["hot compacted"] > r["archived as written"] > 0
        assert 0 < r["distinct summary vectors"] <= n


def test_memory_smoke(tmp_path: Path, s3_args: list[str]) -> None:
    data = run_bench(tmp_path, "memory", *s3_args)
    table = rows(data, "Peak RSS of an archival run")
    assert [r["backlog"] for r in table] == data["params"]["sizes"]
    expected = data["params"]["batches"] * data["params"]["batch_size"]
    for r in table:
        assert r["archived"] == expected and r["nights"] == data["params"]["batches"]
        assert 10 < r["RSS ready MiB"] <= r["peak RSS MiB"] < 4096
        assert finite_positive(r[next(k for k in r if k.startswith("peak vs"))])
    assert table[0][next(k for k in table[0] if k.startswith("peak vs"))] == 1.0


@pytest.mark.skipif(not LOCOMO_DEFAULT.exists(), reason="LoCoMo dev split not present in ../shared/data")
def test_locomo_smoke_without_phase3(tmp_path: Path) -> None:
    """`make bench`'s LoCoMo: settings (a)-(c) and the baselines; phase 3 only with --phase3."""
    data = run_bench(tmp_path, "locomo", "--queries", "10")
    summary = rows(data, "LoCoMo evidence recall, overall")
    assert [r["setting"][:2] for r in summary] == ["a)", "b)", "b'", "c)", "BM", "de", "RR", "ra"]
    assert data["params"]["phase3"] is False and "consolidation" not in data["figures"]["hashing"]
    assert set(data["default"]) == {"all_hot", "tiered", "tiered_first_sentence", "hot_only"}
    assert all(r["questions"] == 10 for r in summary)
    # Every turn went through MemoryClient.add: each is a memory, or merged into / a duplicate of one.
    load = data["figures"]["hashing"]["load"]
    assert load["turns"] == sum(load["outcomes"].values()) > 0
    assert load["memories"] == load["outcomes"].get("created", 0) + load["outcomes"].get("superseded", 0)
    assert load["turns_merged_or_duplicate_on_write"] == sum(
        load["outcomes"].get(k, 0) for k in ("merged", "duplicate")
    )
    assert rows(data, "LoCoMo loading through MemoryClient.add")[0]["turns"] == load["turns"]
    tiered = {r["setting"][:2]: r["recall@10"] for r in summary}
    if tiered["b)"]:  # the last row: first-sentence summaries vs extractive ones at recall@10
        assert summary[-1]["recall@10"] == pytest.approx(tiered["b'"] / tiered["b)"])
    # --smoke reads LoCoMo only; its fold table and its line of the generalization table
    assert list(data["params"]["datasets"]) == ["locomo"]
    folds = rows(data, "LoCoMo leave-one-conversation-out folds, hashing")
    assert [r["held-out conversation"] for r in folds[1:]] == ["pooled (all questions)", "minimum fold ratio"]
    assert folds[1]["tiered recall@10"] == pytest.approx(tiered["b)"])
    (line,) = data["figures"]["generalization"]
    assert (line["dataset"], line["embedder"], line["category_1"]) == ("locomo", "hashing", "multi-hop")
    assert line["pooled_ratio"] == pytest.approx(tiered["b)"] / tiered["BM"])


@pytest.mark.skipif(not LOCOMO_DEFAULT.exists(), reason="LoCoMo dev split not present in ../shared/data")
def test_locomo_smoke(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "locomo", "--phase3")
    summary = rows(data, "LoCoMo evidence recall, overall")
    assert [r["setting"][:2] for r in summary] == ["a)", "b)", "b'", "c)", "d)", "e)", "BM", "de", "RR", "ra"]
    for r in summary[:-1]:  # the last row is a ratio
        assert r["questions"] == data["params"]["questions_per_conversation"]
        for k in ("recall@5", "recall@10", "recall@20"):
            assert 0.0 <= r[k] <= 1.0
        if r["setting"][:2] in ("BM", "de", "RR"):  # prefixes of one ranking (the library: a search per k)
            assert r["recall@5"] <= r["recall@10"] <= r["recall@20"]
        assert 0.0 <= r["zero-hit share"] <= 1.0
    # The keys, for the (only) embedder of the run, at the top level of the JSON.
    for setting in ("all_hot", "tiered", "tiered_first_sentence", "hot_only"):
        assert 0.0 <= data["default"][setting]["recall@10"] <= 1.0
        assert finite_positive(data["default"][setting]["latency_ms"]["p95"])
    assert 0.0 <= data["default"]["tiered"]["zero_hit_share"] <= 1.0
    assert 0.0 < data["baselines"]["bm25"]["recall@10"] <= 1.0
    assert 0.0 < data["baselines"]["dense"]["recall@10"] <= 1.0
    assert data["by_embedder"]["hashing"]["default"] == data["default"]
    # Hot only after archiving most memories finds less than the tiered search over both tiers.
    assert data["default"]["hot_only"]["recall@10"] < data["default"]["tiered"]["recall@10"]
    fig = data["figures"]["hashing"]
    assert 0 < fig["archived"] < fig["memories"]
    # Phase 3 on the product's consolidation (consolidate_month + build_level 3): forced, it runs for
    # every question; with the heuristic deciding, only for some. Digests add no turns, so a question
    # whose fact hits add no turn ranks exactly as (b): with no fact turns at all, (d) and (e) equal (b).
    built = fig["consolidation"]
    assert built["digests_l2"] > 0 and built["digests_l3"] > 0 and built["facts"] >= 0
    assert (built["builder"], built["extractor"]) == (
        "extractive-offline:extractive-digest-v1",
        "rules-offline-v1",
    )
    assert data["default"]["phase3_always"]["phase3_share"] == 1.0
    assert 0.0 <= data["default"]["phase3_auto"]["phase3_share"] < 1.0
    for setting in ("phase3_auto", "phase3_always"):
        p3 = fig["phase3"][setting]
        assert p3["escalated"] == round(data["default"][setting]["phase3_share"] * p3["questions"])
        if p3["fact_turns_per_escalated"] == 0:
            assert p3["better"] == p3["worse"] == 0
            for k in ("recall@5", "recall@10", "recall@20"):
                assert data["default"][setting][k] == data["default"]["tiered"][k]
    assert fig["phase3"]["phase3_always"]["escalated_with_digest_hits"] > 0
    by_cat = rows(data, "LoCoMo evidence recall@10 by category")
    assert by_cat[-1]["category"] == "overall"
    assert by_cat[-1]["questions"] == sum(r["questions"] for r in by_cat[:-1])


@pytest.mark.skipif(not REALTALK_DEFAULT.exists(), reason="REALTALK's chats not present in ../shared/data")
def test_locomo_realtalk_smoke(tmp_path: Path) -> None:
    """REALTALK through the same bench: every message added at its own time, its own categories and
    archival cut-off, one fold row per conversation plus the pooled one."""
    data = run_bench(tmp_path, "locomo", "--dataset", "realtalk")
    params = data["params"]
    assert list(params["datasets"]) == ["realtalk"] and params["cutoff_days"] == 7
    assert all(t["title"].startswith(("REALTALK ", "Generalization")) for t in data["tables"])
    fig = data["figures"]["hashing"]  # one dataset: figures keyed by the embedder alone
    load = fig["load"]
    # Each memory carries the time of a message it holds, and the chat spans many days.
    assert load["memories_created_at_a_turn_time"] == load["memories"] > 0
    assert all(days >= 3 for days in load["days_with_memories_per_conversation"])
    assert 0 < fig["archived"] < fig["memories"]
    # Categories by REALTALK's names, in the table and the JSON.
    names = set(REALTALK_CATEGORY_NAMES.values())
    assert set(fig["default"]["tiered"]["by_category"]) <= names
    by_cat = rows(data, "REALTALK evidence recall@10 by category")
    assert {r["category"].split(" (")[1].rstrip(")") for r in by_cat[:-1]} <= names
    # The fold table: one row per conversation run, the pooled row, the weakest fold.
    folds = rows(data, "REALTALK leave-one-conversation-out folds, hashing")
    assert len(folds) == params["conversations"] + 2
    *per_conv, pooled, least = folds
    assert pooled["held-out conversation"] == "pooled (all questions)"
    assert (
        pooled["questions"] == sum(r["questions"] for r in per_conv) == params["questions_per_conversation"]
    )
    for r in (*per_conv, pooled):
        assert 0.0 <= r["tiered recall@10"] <= 1.0 and 0.0 < r["BM25 recall@10"] <= 1.0
        assert r["ratio"] == pytest.approx(r["tiered recall@10"] / r["BM25 recall@10"])
        if r["category 1 BM25 recall@10"]:
            assert r["category 1 ratio"] == pytest.approx(
                r["category 1 tiered recall@10"] / r["category 1 BM25 recall@10"]
            )
    assert least["ratio"] == pytest.approx(min(r["ratio"] for r in per_conv))
    assert pooled["tiered recall@10"] == pytest.approx(fig["default"]["tiered"]["recall@10"])
    assert pooled["BM25 recall@10"] == pytest.approx(fig["baselines"]["bm25"]["recall@10"])
    (line,) = data["figures"]["generalization"]
    assert (line["dataset"], line["embedder"], line["category_1"]) == ("realtalk", "hashing", "multi-answer")
    assert line["pooled_ratio"] == pytest.approx(pooled["ratio"])
    assert line["min_fold_ratio"] == pytest.approx(least["ratio"])
    assert rows(data, "Generalization")[0]["pooled ratio"] == pytest.approx(line["pooled_ratio"])


def test_locomo_dataset_choice_and_data_path_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--data"):  # one path, two datasets
        selected(Options(datasets=("locomo", "realtalk"), data=tmp_path))
    with pytest.raises(FileNotFoundError, match="danny911kr/REALTALK"):  # where to get it
        selected(Options(datasets=("realtalk",), data=tmp_path / "absent"))
    proc = bench_cli("locomo", "--dataset", "locomo,nope")
    assert proc.returncode == 2 and "--dataset 'locomo,nope'" in proc.stderr


def test_evidence_ids_are_parsed_tolerantly() -> None:
    assert parse_dia_ids("D3:7") == ["D3:7"]
    assert parse_dia_ids("D:11:26") == ["D11:26"]
    assert parse_dia_ids("D30:05") == ["D30:5"]
    assert parse_dia_ids("D8:6; D9:17") == ["D8:6", "D9:17"]
    assert parse_dia_ids(["D1:2", "D", None, 7]) == ["D1:2"]


def test_recall_counts_ties_at_the_kth_distance() -> None:
    exact = [("a", 0.1), ("b", 0.2), ("c", 0.3)]
    assert _recall([("a", 0.1), ("b", 0.2), ("c", 0.3)], exact, 3) == 1.0
    assert _recall([("a", 0.1), ("b", 0.2), ("x", 0.3)], exact, 3) == 1.0  # x ties with c
    assert _recall([("a", 0.1), ("b", 0.2), ("y", 0.4)], exact, 3) == pytest.approx(2 / 3)


def test_cli_rejects_bad_sizes_and_lists_benchmarks() -> None:
    proc = bench_cli("--help")
    assert proc.returncode == 0
    for name in ("search", "archival", "footprint", "memory", "locomo", "all"):
        assert name in proc.stdout
    proc = bench_cli("search", "--size", "ten")
    assert proc.returncode == 2 and "--size 'ten'" in proc.stderr


def test_memo_embedder_returns_the_inner_vectors_and_embeds_each_text_once() -> None:
    from bench.common import MemoEmbedder
    from memory_lib.llm.embedding import HashingEmbedder

    calls: list[list[str]] = []

    class Counting(HashingEmbedder):
        def embed(self, texts):
            calls.append(list(texts))
            return super().embed(texts)

    inner = HashingEmbedder(64)
    memo = MemoEmbedder(Counting(64), limit=3)
    first = memo.embed(["a b", "c d", "a b"])
    assert first.shape == (3, 64) and (first == inner.embed(["a b", "c d", "a b"])).all()
    again = memo.embed(["c d", "e f"])
    assert (again == inner.embed(["c d", "e f"])).all()
    assert calls == [["a b", "c d"], ["e f"]]  # each text once; the memo is full at 3
    memo.embed(["g h", "g h"])
    memo.embed(["g h"])
    assert calls[-2:] == [["g h"], ["g h"]]  # past the limit: embedded again, still correct
    assert memo.dim == 64 and memo.embed([]).shape == (0, 64)
