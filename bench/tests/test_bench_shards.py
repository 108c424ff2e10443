"""`python -m bench.shards --launcher cli --smoke`: the shard bench's CLI launcher at its smoke size, on the
session's SeaweedFS. Its figures must add up: every memory archived once, per run and in total, and the
per-run counts and rates consistent with the totals. Never a time."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import pytest

from bench.shards import SHARD_COUNTS, SMOKE_SIZE, main


@pytest.fixture
def s3_args(seaweed, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The bench on the session's SeaweedFS (credentials through the standard AWS variables, which the
    bench's `memory-archive` processes inherit)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    bucket = seaweed.create_bucket(f"shards-{uuid.uuid4().hex[:12]}")
    return ["--s3-endpoint", seaweed.endpoint_url, "--s3-bucket", bucket]


def _markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of the one markdown table printed (github format), as column -> cell text."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [
        dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]
    ]


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_cli_shard_runs_archive_the_backlog_once_and_add_up(
    tmp_path: Path, s3_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "shards.json"
    argv = ["--launcher", "cli", "--smoke", "--json", str(out), "--workdir", str(tmp_path), *s3_args]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["benchmark"] == "shards" and data["params"]["smoke"] is True
    assert data["params"]["launchers"] == ["cli"] and data["params"]["size"] == SMOKE_SIZE
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ma-bench-")] == []

    by_n = data["figures"]["launchers"]["cli"]
    assert sorted(int(n) for n in by_n) == list(SHARD_COUNTS)
    for n, fig in by_n.items():
        runs = fig["runs"]
        # One run per shard of N, each its own shard, together the whole backlog exactly once.
        assert sorted(r["shard"] for r in runs) == [f"{i}/{n}" for i in range(int(n))]
        assert fig["archived"] == fig["eligible"] == SMOKE_SIZE == sum(r["archived"] for r in runs)
        assert all(r["archived"] == SMOKE_SIZE // int(n) for r in runs)  # balanced users: equal shards
        for r in runs:
            assert math.isclose(r["rate_per_s"], r["archived"] / r["seconds"], rel_tol=1e-9)
            assert r["batches"] >= 1
        assert math.isclose(fig["sum_of_run_rates_per_s"], sum(r["rate_per_s"] for r in runs), rel_tol=1e-9)
        # Together the runs never deliver more than their rates added, nor take less than the longest run.
        assert fig["wall_s"] >= max(r["seconds"] for r in runs) - 1e-6
        assert math.isclose(fig["total_rate_per_s"], fig["archived"] / fig["wall_s"], rel_tol=1e-9)
        assert fig["total_rate_per_s"] <= fig["sum_of_run_rates_per_s"] * (1 + 1e-9)
        assert math.isclose(fig["ratio_vs_1"], fig["total_rate_per_s"] / by_n["1"]["total_rate_per_s"])
        assert 1 <= fig["peak_connections"] <= 2 * int(n) + 2

    # The printed table: per shard-run rows add up to each total row, counts exactly, rates within rounding
    # (each cell is rounded to 3 significant digits).
    rows = _markdown_rows(printed)
    for n in SHARD_COUNTS:
        mine = [r for r in rows if r["N"] == str(n)]
        (total,) = [r for r in mine if r["run"] == "total"]
        runs = [r for r in mine if r["run"].startswith("shard ")]
        assert len(runs) == n
        assert sum(_number(r["archived"]) for r in runs) == _number(total["archived"]) == SMOKE_SIZE
        rates = [_number(r["memories/s"]) for r in runs]
        assert _number(total["Σ run memories/s"]) == pytest.approx(sum(rates), rel=0.01)
    assert "cores" in printed and "min(N × one shard's rate" in printed
