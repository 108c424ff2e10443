"""The LLM ledger as memory_summaries metadata: each night's own spend, per model, through Dagster."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg
import pytest

from memory_assets.resources import SummarizerResource
from memory_lib.archival import nights
from memory_lib.llm import ledger
from tests.support.slow_path import NIGHT, SLOW_PATH_DEFS, resources


@pytest.fixture
def local_store_resource(tmp_path):
    from memory_assets.resources import ObjectStoreResource

    return ObjectStoreResource(kind="local", local_root=str(tmp_path / "objects"), prefix="test")


def test_memory_summaries_records_each_nights_ledger_per_model(
    conn, db_url, history, local_store_resource, fake_llm, llm_keys
):
    llm = SummarizerResource(
        provider="anthropic",
        base_url=fake_llm.base_url,
        anthropic_model="claude-3-haiku",
        requests_per_second=1000.0,
        max_retries=0,
    )
    run_nights = [NIGHT - timedelta(days=1), NIGHT]
    result = dg.materialize(
        SLOW_PATH_DEFS,
        resources=resources(db_url, local_store_resource, summarizer=llm, batch_size=20),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
        tags={
            "dagster/asset_partition_range_start": run_nights[0].isoformat(),
            "dagster/asset_partition_range_end": run_nights[-1].isoformat(),
        },
    )
    assert result.success
    by_night = {
        e.partition: {k: v.value for k, v in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
        if e.asset_key.path[-1] == "memory_summaries"
    }
    assert set(by_night) == {n.isoformat() for n in run_nights}
    costs = []
    for night in run_nights:
        meta = by_night[night.isoformat()]
        [row] = ledger.usage_of_batches(conn, [nights.batch_key_for(night)])
        # The night's own numbers (not the run's total), from the ledger, which the server's usage fed.
        assert meta["llm_requests"] == row.requests == 20
        assert meta["input_tokens"] == row.input_tokens > 0 and meta["output_tokens"] == row.output_tokens
        assert meta["llm_cost_usd"] == pytest.approx(row.cost_usd, abs=1e-6) and row.cost_usd > 0
        assert "claude-3-haiku" in meta["llm_by_model"] and "| sync |" in meta["llm_by_model"]
        costs.append(meta["llm_cost_usd"])
    total = conn.execute("SELECT sum(cost_usd) AS c FROM llm_usage").fetchone()["c"]
    assert sum(costs) == pytest.approx(float(total), abs=1e-5)
