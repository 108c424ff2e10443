"""The LLM ledger as memory_summaries metadata: each night's own spend, per model, through Dagster."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dagster as dg
import pytest

from memory_assets.defs.dry_run.assets import archival_dry_run
from memory_assets.resources import SummarizerResource
from memory_lib.archival import nights
from memory_lib.core.config import DEFAULT_ANTHROPIC_MODEL
from memory_lib.core.pricing import DEFAULT_PRICES, Usage, cost_usd
from memory_lib.llm import ledger
from testing.dagster_helpers import END, range_tags
from testing.rows import one
from testing.slow_path import NIGHT, SLOW_PATH_DEFS, resources


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
        tags=range_tags(run_nights),
    )
    assert result.success
    by_night = _summaries_by_night(result)
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
        # The night's own price per 1,000 memories: its cost over the 20 memories it summarized.
        assert meta["usd_per_1000_memories"] == pytest.approx(1000 * row.cost_usd / 20, abs=1e-6)
        assert meta["usd_per_1000_memories_price"] == "list"  # 20 memories: under batch_threshold, sync
        assert meta["price_per_1000_memories"].startswith(
            f"claude-3-haiku: ${1000 * row.cost_usd / 20:.4f} per 1,000 memories at list price"
        )
        costs.append(meta["llm_cost_usd"])
    total = one(conn.execute("SELECT sum(cost_usd) AS c FROM llm_usage"))["c"]
    assert sum(costs) == pytest.approx(float(total), abs=1e-5)


def _summaries_by_night(result: Any) -> dict[str | None, dict[str, Any]]:
    """Each night's memory_summaries metadata values (Dagster types them as the union of every kind)."""
    return {
        e.partition: {k: v.value for k, v in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
        if e.asset_key is not None and e.asset_key.path[-1] == "memory_summaries"
    }


def test_first_night_with_the_default_model_reports_its_batch_price_per_1000(
    conn, db_url, history, local_store_resource, fake_llm, llm_keys
):
    """Only ANTHROPIC_API_KEY set: the default model; a night above batch_threshold goes through Message
    Batches, and its metadata prices it per 1,000 memories at the batch price."""
    llm = SummarizerResource(
        base_url=fake_llm.base_url,
        requests_per_second=1000.0,
        max_retries=0,
        batch_threshold=5,
        batch_poll_seconds=0.05,
    )
    result = dg.materialize(
        SLOW_PATH_DEFS,
        partition_key=NIGHT.isoformat(),
        resources=resources(db_url, local_store_resource, summarizer=llm, batch_size=20),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert result.success
    meta = _summaries_by_night(result)[NIGHT.isoformat()]
    assert meta["summarizer"] == f"anthropic:{DEFAULT_ANTHROPIC_MODEL}"
    [row] = ledger.usage_of_batches(conn, [nights.batch_key_for(NIGHT)])
    assert (row.model, row.mode, row.requests) == (DEFAULT_ANTHROPIC_MODEL, "batch", 20)
    # Priced here from the ledger's tokens at the default model's batch price, independently of the asset.
    tokens = Usage(
        row.input_tokens, row.output_tokens, row.cache_creation_input_tokens, row.cache_read_input_tokens
    )
    batch_cost = cost_usd(DEFAULT_PRICES, DEFAULT_ANTHROPIC_MODEL, tokens, batch=True)
    assert batch_cost is not None
    expected = 1000 * batch_cost / 20
    assert expected > 0
    assert meta["usd_per_1000_memories"] == pytest.approx(expected, abs=1e-6)
    assert meta["usd_per_1000_memories_price"] == "batch"
    assert meta["price_per_1000_memories"].startswith(
        f"{DEFAULT_ANTHROPIC_MODEL}: ${expected:.4f} per 1,000 memories at batch price"
    )


def test_a_night_with_an_unpriced_model_says_unknown_price_not_zero(
    conn, db_url, history, local_store_resource, fake_llm, llm_keys
):
    llm = SummarizerResource(
        provider="anthropic",
        base_url=fake_llm.base_url,
        anthropic_model="claude-future-9",
        requests_per_second=1000.0,
        max_retries=0,
    )
    result = dg.materialize(
        SLOW_PATH_DEFS,
        partition_key=NIGHT.isoformat(),
        resources=resources(db_url, local_store_resource, summarizer=llm, batch_size=5),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert result.success
    meta = _summaries_by_night(result)[NIGHT.isoformat()]
    assert meta["llm_unpriced_requests"] == 5
    assert "usd_per_1000_memories" not in meta
    assert meta["price_per_1000_memories"] == "unknown price for model claude-future-9: set llm.prices"


def test_an_offline_night_reports_zero_per_1000(conn, db_url, history, local_store_resource):
    result = dg.materialize(
        SLOW_PATH_DEFS,
        partition_key=NIGHT.isoformat(),
        resources=resources(db_url, local_store_resource, batch_size=5),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert result.success
    meta = _summaries_by_night(result)[NIGHT.isoformat()]
    assert meta["summarized"] == 5
    assert (meta["usd_per_1000_memories"], meta["price_per_1000_memories"]) == (0.0, "0 (offline extractive)")


def test_dry_run_metadata_shows_the_price_per_1000_of_the_default_model(
    conn, db_url, history, local_store_resource, fake_llm, llm_keys
):
    llm = SummarizerResource(base_url=fake_llm.base_url, requests_per_second=1000.0, max_retries=0)
    result = dg.materialize(
        [archival_dry_run],
        resources=resources(db_url, local_store_resource, summarizer=llm),
        instance=dg.DagsterInstance.ephemeral(),
        run_config={"ops": {"archival_dry_run": {"config": {"as_of": END.isoformat(), "sample_size": 10}}}},
    )
    assert result.success
    [event] = result.get_asset_materialization_events()
    meta: dict[str, Any] = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["sampled"] == 10 and fake_llm.count("/v1/messages") == 10
    used = Usage()
    for r in fake_llm.requests:
        used = used + Usage(r.usage["input_tokens"], r.usage["output_tokens"])
    list_cost = cost_usd(DEFAULT_PRICES, DEFAULT_ANTHROPIC_MODEL, used)
    batch_cost = cost_usd(DEFAULT_PRICES, DEFAULT_ANTHROPIC_MODEL, used, batch=True)
    assert list_cost is not None and batch_cost is not None
    list_1000 = 1000 * list_cost / 10
    batch_1000 = 1000 * batch_cost / 10
    assert meta["usd_per_1000_memories_list"] == pytest.approx(list_1000, abs=1e-6) and list_1000 > 0
    assert meta["usd_per_1000_memories_batch"] == pytest.approx(batch_1000, abs=1e-6)
    assert meta["price_per_1000_memories"].startswith(
        f"anthropic:{DEFAULT_ANTHROPIC_MODEL}: ${batch_1000:.4f} per 1,000 memories at batch price, "
        f"${list_1000:.4f} at list price"
    )
