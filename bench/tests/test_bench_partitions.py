"""`python -m bench partitions --smoke`: the tenant-partitioning bench at its smoke size (seconds).

It must build what it claims to compare: each partitioned database really partitioned (by
storage.partitioning.layout, both tables) and holding the same rows as the plain one, all of them in
partitions; a filter by user_id pruned to one partition; recalls in [0, 1]; the baseline rows at ratio 1.
Never a time."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench.__main__ import main
from bench.partitions import SMOKE_LAYOUTS, SMOKE_SIZES, SMOKE_USERS, STATEMENTS, TARGET_P95_MS, TARGET_RECALL


def test_partitions_smoke_builds_each_layout_and_reports_recall(tmp_path: Path) -> None:
    out = tmp_path / "partitions.json"
    assert main(["partitions", "--smoke", "--json", str(out), "--workdir", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ma-bench-")] == []
    data = json.loads(out.read_text())
    assert data["benchmark"] == "partitions" and data["params"]["smoke"] is True
    (n,) = SMOKE_SIZES
    fig = data["figures"][str(n)]
    assert sorted(int(u) for u in fig["users"]) == sorted(SMOKE_USERS)

    for users, fu in fig["users"].items():
        dbs = fu["databases"]
        assert sorted(int(p) for p in dbs) == sorted(SMOKE_LAYOUTS)
        plain = dbs["1"]
        assert plain["partitions"] == plain["archived_partitions"] == 1 and plain["rows"] == n
        for p in SMOKE_LAYOUTS:
            if p == 1:
                continue
            db = dbs[str(p)]
            assert db["partitions"] == db["archived_partitions"] == p, db
            assert db["layout"] == f"memories: {p} hash partitions by user_id"
            # The same rows as the plain table, every one of them in a partition.
            assert db["rows"] == db["rows_in_partitions"] == plain["rows"]
            assert 1 <= db["non_empty_partitions"] <= min(p, int(users))
            if int(users) >= 2 * p:  # many users: hashing spreads them over more than one partition
                assert db["non_empty_partitions"] > 1
            # A filter on the partition key is pruned to one partition: its plan reads one partition's index.
            plan = fu["modes"][f"{p}|user_id = filter"]["plan"]
            assert "Merge Append" not in plan and len(set(re.findall(r"_p(\d{3})\b", plan))) == 1, plan

    (leg,) = [t for t in data["tables"] if t["title"].startswith("Hot vector leg")]
    assert len(leg["rows"]) == len(SMOKE_USERS) * len(SMOKE_LAYOUTS) * len(STATEMENTS)
    target = next(c for c in leg["rows"][0] if c.startswith("target met"))
    for row in leg["rows"]:
        assert 0.0 <= row["recall@10 vs exact"] <= 1.0
        assert row["p50"] > 0 and row["p95"] >= row["p50"]
        assert row[target] == (row["recall@10 vs exact"] >= TARGET_RECALL and row["p95"] <= TARGET_P95_MS)
        if row["layout"].startswith("not partitioned"):
            assert row["ratio p95 vs not partitioned"] == 1.0
    (dbt,) = [t for t in data["tables"] if t["title"].startswith("Databases")]
    assert {(r["users"], r["layout"]) for r in dbt["rows"]} == {
        (u, "not partitioned" if p == 1 else f"{p} hash partitions")
        for u in SMOKE_USERS
        for p in SMOKE_LAYOUTS
    }
    (default,) = [t for t in data["tables"] if t["title"].startswith("Default search")]
    assert [r["layout"].split(" (")[0] for r in default["rows"]] == [
        "not partitioned" if p == 1 else f"{p} hash partitions" for p in SMOKE_LAYOUTS
    ]
    for r in default["rows"]:
        assert 0.0 <= r["same hits as not partitioned (share)"] <= 1.0
