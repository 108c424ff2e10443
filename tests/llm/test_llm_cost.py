"""LLM cost: one call for summary and entities, the ledger from the provider's usage, the dry run's
projection against the ledger of the run that follows. Real SDKs against the local fake server."""

from __future__ import annotations

import pytest

from memory_lib.archival.archive import ArchivalServices, batch_status
from memory_lib.archival.dry_run import dry_run
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import DEFAULT_ANTHROPIC_MODEL, ArchivalCriteria
from memory_lib.core.pricing import DEFAULT_PRICES, ModelPrice, Usage, cost_usd
from memory_lib.llm.ledger import usage_of_batches
from memory_lib.llm.summarize import AnthropicSummarizer, OpenAISummarizer
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.dagster_helpers import END, load_history
from testing.factories import NOW, archival_services, make_memories
from testing.fake_answers import fake_domain, fake_entities
from testing.fake_llm import FAKE_API_KEY, FakeLLMServer
from testing.rows import one


def _summarizer(provider: str, server: FakeLLMServer, model: str | None = None):
    cls = AnthropicSummarizer if provider == "anthropic" else OpenAISummarizer
    return cls(FAKE_API_KEY, base_url=server.base_url, model=model, max_retries=0)


def _services(provider: str, server: FakeLLMServer, store, model: str | None = None) -> ArchivalServices:
    return archival_services(store, summarizer=_summarizer(provider, server, model))


def _reported_usage(server: FakeLLMServer) -> Usage:
    """What the fake server told the clients they used, summed over its summary answers (OpenAI's
    prompt_tokens include the cached ones; the fake reports none cached)."""
    total = Usage()
    for r in server.requests:
        if r.usage is None:
            continue
        u = r.usage
        if r.path == "/v1/messages":
            total = total + Usage(
                u["input_tokens"],
                u["output_tokens"],
                u["cache_creation_input_tokens"],
                u["cache_read_input_tokens"],
            )
        elif r.path == "/v1/chat/completions":
            cached = u["prompt_tokens_details"]["cached_tokens"]
            total = total + Usage(u["prompt_tokens"] - cached, u["completion_tokens"], 0, cached)
    return total


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_malformed_json_fails_only_that_memory_and_is_ledgered(conn, local_store, fake_llm, provider):
    memories = make_memories(40, dim=TEST_DIM)
    marked = next(m for m in memories if "ORD-" in m["content"])
    fake_llm.malformed_json_when_contains = marked["content"]
    insert_memories(conn, memories, actor="test")

    report = run_batch(
        conn,
        _services(provider, fake_llm, local_store),
        ArchivalCriteria(),
        batch_key="night",
        as_of=NOW,
        actor="test",
    )
    status = batch_status(conn, "night")
    assert status.archived == 39 and status.failed_by_step == {"summarize": 1}
    assert report.ok
    failed = conn.execute("SELECT memory_id, error FROM archival_attempts WHERE error IS NOT NULL").fetchall()
    assert [r["memory_id"] for r in failed] == [marked["id"]]
    assert "malformed summary JSON" in failed[0]["error"]
    # The archive row keeps the model's own entities (names), and the typed ones and the domain guess in
    # its metadata (the attempt's checkpoint row is pruned once the night is audited).
    other = next(m for m in memories if m["id"] != marked["id"])
    row = conn.execute(
        """SELECT key_entities, metadata->'summary_entities' AS summary_entities,
                  metadata->>'domain_guess' AS domain_guess FROM archived_memories WHERE original_id = %s""",
        (other["id"],),
    ).fetchone()
    assert (
        one(conn.execute("SELECT count(*) AS n FROM archival_attempts WHERE memory_id = %s", (other["id"],)))[
            "n"
        ]
        == 0
    )
    expected = fake_entities(other["content"])
    assert row["key_entities"] == [n for n, _ in expected]
    assert row["summary_entities"] == expected
    assert row["domain_guess"] == fake_domain(other["content"])
    # The malformed answer was billed: the ledger has it, as failed.
    ledger = conn.execute("SELECT outcome, count(*) AS n FROM llm_usage GROUP BY 1 ORDER BY 1").fetchall()
    assert [(r["outcome"], r["n"]) for r in ledger] == [("failed", 1), ("ok", 39)]


@pytest.mark.parametrize(
    ("provider", "model"), [("anthropic", "claude-3-haiku-20240307"), ("openai", "gpt-4o-mini")]
)
def test_ledger_totals_equal_the_usage_the_server_reported(conn, local_store, fake_llm, provider, model):
    insert_memories(conn, make_memories(30, dim=TEST_DIM), actor="test")
    fake_llm.malformed_json_fraction = 0.1  # failed answers count too
    run_batch(
        conn,
        _services(provider, fake_llm, local_store, model),
        ArchivalCriteria(max_error_rate=0.5),
        batch_key="night",
        as_of=NOW,
        actor="test",
    )

    reported = _reported_usage(fake_llm)
    [totals] = usage_of_batches(conn, ["night"])
    assert totals.requests == fake_llm.count("/v1/messages") + fake_llm.count("/v1/chat/completions") == 30
    assert (totals.input_tokens, totals.output_tokens) == (reported.input_tokens, reported.output_tokens)
    assert totals.input_tokens > 30 * 100  # computed from the prompts (~150 tokens of instructions each)
    assert (totals.model, totals.mode, totals.unpriced) == (model, "sync", 0)
    assert totals.cost_usd == pytest.approx(cost_usd(DEFAULT_PRICES, model, reported), rel=1e-6)
    # Per memory: each ledger row is one answer of one memory, of the batch's users only.
    rows = conn.execute("SELECT memory_id, user_id FROM llm_usage").fetchall()
    assert len({r["memory_id"] for r in rows}) == 30 and {r["user_id"] for r in rows} == {"alice", "bob"}


def test_unknown_model_is_ledgered_as_unpriced(conn, local_store, fake_llm):
    insert_memories(conn, make_memories(3, dim=TEST_DIM), actor="test")
    run_batch(
        conn,
        _services("anthropic", fake_llm, local_store, "claude-future-9"),
        ArchivalCriteria(),
        batch_key="night",
        as_of=NOW,
        actor="test",
    )
    [totals] = usage_of_batches(conn, ["night"])
    assert totals.unpriced == 3 and totals.cost_usd == 0.0 and totals.input_tokens > 0


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_dry_run_projection_within_20_percent_of_the_ledger(conn, local_store, fake_llm, provider):
    load_history(conn, TEST_DIM)  # the demo's history (memory_assets.demo_data): varied templates and users
    services = _services(provider, fake_llm, local_store)
    criteria = ArchivalCriteria(batch_size=500)
    report = dry_run(conn, services, criteria, as_of=END, sample_size=50)
    p = report.projection
    assert p.eligible > 100 and p.cost_usd > 0 and p.cost_usd_batch == pytest.approx(p.cost_usd / 2, rel=0.01)

    run_batch(conn, services, criteria, batch_key="night", as_of=END, actor="test")
    [totals] = usage_of_batches(conn, ["night"])
    assert totals.requests == p.eligible
    assert p.cost_usd == pytest.approx(totals.cost_usd, rel=0.20)
    assert p.input_tokens == pytest.approx(totals.input_tokens, rel=0.20)
    assert p.output_tokens == pytest.approx(totals.output_tokens, rel=0.20)


# --------------------------------------------------------------------------- price per 1,000 memories


def test_dry_run_price_per_1000_is_the_sampled_usage_at_the_default_models_price(conn, local_store, fake_llm):
    insert_memories(conn, make_memories(30, dim=TEST_DIM), actor="test")
    fake_llm.malformed_json_fraction = 0.1  # a failed answer is billed: it counts in the price
    report = dry_run(
        conn, _services("anthropic", fake_llm, local_store), ArchivalCriteria(), as_of=NOW, sample_size=20
    )
    p = report.projection
    sampled = len(report.samples)
    assert sampled == 20 and fake_llm.count("/v1/messages") == 20
    assert {r.body["model"] for r in fake_llm.requests} == {DEFAULT_ANTHROPIC_MODEL}
    # What the server reported it used, priced independently for the default model, over the memories sampled.
    used = _reported_usage(fake_llm)
    list_cost = cost_usd(DEFAULT_PRICES, DEFAULT_ANTHROPIC_MODEL, used)
    batch_cost = cost_usd(DEFAULT_PRICES, DEFAULT_ANTHROPIC_MODEL, used, batch=True)
    assert list_cost is not None and batch_cost is not None
    list_1000 = 1000 * list_cost / sampled
    batch_1000 = 1000 * batch_cost / sampled
    assert p.usd_per_1000_memories == pytest.approx(list_1000, rel=1e-9) and list_1000 > 0
    assert p.usd_per_1000_memories_batch == pytest.approx(batch_1000, rel=1e-9)
    assert p.usd_per_1000_memories is not None
    assert p.usd_per_1000_memories_batch == pytest.approx(p.usd_per_1000_memories / 2, rel=1e-9)
    # The same figure as the backlog projection, per memory.
    assert p.usd_per_1000_memories == pytest.approx(1000 * p.cost_usd / p.eligible, rel=0.01)
    assert p.price_per_1000 == (
        f"anthropic:{DEFAULT_ANTHROPIC_MODEL}: ${batch_1000:.4f} per 1,000 memories at batch price, "
        f"${list_1000:.4f} at list price (estimated from the token usage of 20 sampled summaries)"
    )


def test_dry_run_price_per_1000_of_a_model_without_a_price_says_so(conn, local_store, fake_llm):
    insert_memories(conn, make_memories(5, dim=TEST_DIM), actor="test")
    services = _services("anthropic", fake_llm, local_store, "claude-future-9")
    p = dry_run(conn, services, ArchivalCriteria(), as_of=NOW, sample_size=5).projection
    assert (p.usd_per_1000_memories, p.usd_per_1000_memories_batch, p.priced) == (None, None, False)
    assert p.price_per_1000 == "unknown price for model claude-future-9: set llm.prices"

    # Priced through llm.prices (which replaces the built-in table), the same model has a figure.
    priced = AnthropicSummarizer(
        FAKE_API_KEY,
        base_url=fake_llm.base_url,
        model="claude-future-9",
        max_retries=0,
        prices={"claude-future-9": ModelPrice(input=2.0, output=10.0, batch_input=1.0, batch_output=5.0)},
    )
    fake_llm.reset()
    services = archival_services(local_store, summarizer=priced)
    p = dry_run(conn, services, ArchivalCriteria(), as_of=NOW, sample_size=5).projection
    used = _reported_usage(fake_llm)
    assert p.usd_per_1000_memories == pytest.approx(
        1000 * (used.input_tokens * 2.0 + used.output_tokens * 10.0) / 1e6 / 5, rel=1e-9
    )


def test_dry_run_price_per_1000_offline_is_zero_and_says_offline(conn, local_store):
    insert_memories(conn, make_memories(5, dim=TEST_DIM), actor="test")
    services = archival_services(local_store)
    p = dry_run(conn, services, ArchivalCriteria(), as_of=NOW, sample_size=5).projection
    assert (p.usd_per_1000_memories, p.usd_per_1000_memories_batch) == (0.0, 0.0)
    assert p.price_per_1000 == "0 (offline extractive)"
