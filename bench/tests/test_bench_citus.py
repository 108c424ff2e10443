"""`python -m bench citus --smoke`: one node vs the Citus cluster at the smoke size, when the Citus pass is on
(TEST_CITUS_ADMIN_URL / TEST_CITUS_URL). One run; its figures must say what the bench claims: both sides
hold the same rows, top-10 agreement and ratios computed from the sides' own figures, every memory once in
hot or archive after every archival run, and the cluster's shard processes draining the backlog. Never a
time."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from bench.__main__ import main
from bench.citus import ARCHIVED_PER_HOT, CLUSTER_SHARDS, SMOKE_BACKLOG, SMOKE_QUERIES, SMOKE_SIZE
from testing.citus import citus_urls

pytestmark = pytest.mark.skipif(
    citus_urls() is None,
    reason="no Citus cluster: TEST_CITUS_ADMIN_URL / TEST_CITUS_URL unset (make test sets them for its Citus pass)",
)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("citus")
    out = tmp / "citus.json"
    assert main(["citus", "--smoke", "--json", str(out), "--workdir", str(tmp)]) == 0
    assert [p.name for p in tmp.iterdir() if p.name.startswith("ma-bench-")] == []
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["benchmark"] == "citus" and data["params"]["smoke"] is True
    return data


def _failures(data: dict[str, Any], step: str) -> list[str]:
    return [f["error"] for f in data["figures"]["failures"] if f["step"].startswith(step)]


def test_search_same_rows_on_both_sides_and_figures_add_up(smoke: dict[str, Any]) -> None:
    assert _failures(smoke, "search") == []
    fig = smoke["figures"]["search"]
    assert fig["n_hot"] == SMOKE_SIZE and fig["queries"] == SMOKE_QUERIES
    for side in ("one node", "cluster"):
        load = fig["loads"][side]
        assert load["hot"] == SMOKE_SIZE and load["archived"] == ARCHIVED_PER_HOT * SMOKE_SIZE
        assert load["docs"] == load["hot"] + load["archived"]  # BM25 statistics kept by the triggers
    assert fig["loads"]["one node"]["terms"] == fig["loads"]["cluster"]["terms"] > 0
    assert math.isclose(fig["ratio_p50"], fig["cluster"]["p50"] / fig["one_node"]["p50"])
    assert math.isclose(fig["ratio_p95"], fig["cluster"]["p95"] / fig["one_node"]["p95"])
    top = fig["top10"]
    assert 0 <= top["identical"] <= top["same_set"] <= 1 and 0 <= top["mean_overlap"] <= 1
    assert top["same_set"] <= top["mean_overlap"] + 1e-12  # a query with the same set has overlap 1
    assert set(fig["users"].values()) and "?" not in fig["users"].values()  # every user's shard found
    # The same rows rank the same on one node and on the cluster when the vector arms are exact (ties
    # cut by id): at the smoke size every user is under the exact threshold, so the default is too.
    assert fig["top10_exact_scans"]["identical"] == 1.0
    assert top["identical"] == 1.0
    for side in ("one node", "cluster"):
        assert fig["top10_vs_exact"][side]["mean_overlap"] == 1.0


def test_archival_keeps_every_memory_exactly_once(smoke: dict[str, Any]) -> None:
    runs = smoke["figures"]["archival"]
    assert sorted(runs) == sorted(["node_1"] + [f"cluster_{n}" for n in CLUSTER_SHARDS])
    for name, run in runs.items():
        assert run["backlog"] == run["eligible"] == SMOKE_BACKLOG, name
        tiers = run["tiers"]
        assert tiers["both"] == tiers["twice"] == tiers["lost"] == tiers["new"] == 0, (name, tiers)
        assert tiers["hot"] + tiers["archived"] == SMOKE_BACKLOG
        assert tiers["archived"] == run["archived"] == sum(p["archived"] for p in run["processes"])
        assert sorted(p["shard"] for p in run["processes"]) == [f"{i}/{run['n']}" for i in range(run["n"])]
    node = runs["node_1"]
    assert node["problems"] == [] and node["archived"] == SMOKE_BACKLOG


def test_archival_shard_processes_drain_the_backlog_on_the_cluster(smoke: dict[str, Any]) -> None:
    assert _failures(smoke, "archival") == []
    runs = smoke["figures"]["archival"]
    base = runs["node_1"]["rate_per_s"]
    for n in CLUSTER_SHARDS:
        run = runs[f"cluster_{n}"]
        assert run["archived"] == SMOKE_BACKLOG and run["problems"] == []
        assert all(p["returncode"] == 0 and p["batches"] >= 1 for p in run["processes"])
        assert math.isclose(run["rate_per_s"], run["archived"] / run["wall_s"])
        assert math.isclose(run["ratio_vs_node"], run["rate_per_s"] / base)
