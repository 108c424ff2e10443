"""Backlogs through the providers' batch APIs, with the real SDKs against the local fake server:
submit -> poll -> results, a partial failure, an expired batch, and a crash between submit and poll."""

from __future__ import annotations

import pytest

from memory_lib import batches
from memory_lib.archive import ArchivalServices, batch_status, summarize_batch
from memory_lib.claims import claim_batch
from memory_lib.config import ArchivalCriteria
from memory_lib.embedding import HashingEmbedder
from memory_lib.ledger import usage_of_batches
from memory_lib.pipeline import run_batch
from memory_lib.pricing import DEFAULT_PRICES, Usage, cost_usd
from memory_lib.store import insert_memories
from memory_lib.summarize import AnthropicSummarizer, OpenAISummarizer
from tests.conftest import TEST_DIM
from tests.support.factories import NOW, make_memories
from tests.support.fake_llm import FAKE_API_KEY, FakeLLMServer

PROVIDERS = ["anthropic", "openai"]
MODEL = {"anthropic": "claude-3-haiku-20240307", "openai": "gpt-4o-mini"}
N = 24


def _summarizer(provider: str, server: FakeLLMServer, **kw):
    cls = AnthropicSummarizer if provider == "anthropic" else OpenAISummarizer
    kw = {"batch_threshold": 10, "batch_poll_seconds": 0.01, "batch_wait_seconds": 30.0} | kw
    return cls(FAKE_API_KEY, base_url=server.base_url, model=MODEL[provider], max_retries=0, **kw)


def _setup(conn, n: int = N):
    memories = make_memories(n, dim=TEST_DIM)
    insert_memories(conn, memories, actor="test")
    return memories


def _sync_calls(server: FakeLLMServer) -> int:
    return server.count("/v1/messages") + server.count("/v1/chat/completions")


def _batch_usage(server: FakeLLMServer) -> Usage:
    total = Usage()
    for kind, u in server.batch_results_usage:
        if kind == "anthropic":
            total = total + Usage(u["input_tokens"], u["output_tokens"])
        else:
            total = total + Usage(u["prompt_tokens"], u["completion_tokens"])
    return total


@pytest.mark.parametrize("provider", PROVIDERS)
def test_backlog_goes_through_the_batch_api_with_a_partial_failure(conn, local_store, fake_llm, provider):
    memories = _setup(conn)
    bad = memories[3]
    fake_llm.batch_error_when_contains = bad["content"]
    fake_llm.batch_polls_before_end = 2  # two polls answer "in progress"
    services = ArchivalServices(_summarizer(provider, fake_llm), HashingEmbedder(dim=TEST_DIM), local_store)

    report = run_batch(conn, services, ArchivalCriteria(), batch_key="night", as_of=NOW, actor="test")

    assert fake_llm.batch_creates() == 1 and _sync_calls(fake_llm) == 0  # one batch, no single requests
    status = batch_status(conn, "night")
    assert status.archived == N - 1 and status.failed_by_step == {"summarize": 1} and report.ok
    error = conn.execute("SELECT memory_id, error FROM archival_attempts WHERE error IS NOT NULL").fetchone()
    assert error["memory_id"] == bad["id"] and "errored" in error["error"]
    [sub] = conn.execute("SELECT * FROM llm_batches").fetchall()
    assert sub["status"] == "collected" and sub["provider_batch_id"] and len(sub["memory_ids"]) == N
    # Ledger: batch mode, batch price, exactly the usage the server reported for the results it served.
    [totals] = usage_of_batches(conn, ["night"])
    served = _batch_usage(fake_llm)
    assert (totals.mode, totals.requests) == ("batch", N - 1)
    assert (totals.input_tokens, totals.output_tokens) == (served.input_tokens, served.output_tokens)
    assert totals.cost_usd == pytest.approx(cost_usd(DEFAULT_PRICES, MODEL[provider], served, batch=True), rel=1e-6)
    assert totals.cost_usd == pytest.approx(cost_usd(DEFAULT_PRICES, MODEL[provider], served) / 2, rel=1e-6)

    # The failed memory is retried by the next run (below the threshold: synchronously).
    second = run_batch(conn, services, ArchivalCriteria(), batch_key="night-2", as_of=NOW, actor="test")
    assert second.archived == 1 and fake_llm.batch_creates() == 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_expired_batch_falls_back_to_synchronous_calls(conn, local_store, fake_llm, provider):
    _setup(conn)
    fake_llm.batch_outcome = "expired"  # the provider answered half before the batch expired
    services = ArchivalServices(_summarizer(provider, fake_llm), HashingEmbedder(dim=TEST_DIM), local_store)

    report = run_batch(conn, services, ArchivalCriteria(), batch_key="night", as_of=NOW, actor="test")

    assert report.ok and batch_status(conn, "night").archived == N
    assert fake_llm.batch_creates() == 1 and _sync_calls(fake_llm) == N // 2
    modes = {r["mode"]: r["n"] for r in conn.execute("SELECT mode, count(*) AS n FROM llm_usage GROUP BY 1")}
    assert modes == {"batch": N // 2, "sync": N // 2}
    assert conn.execute("SELECT status FROM llm_batches").fetchone()["status"] == "expired"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_crash_between_submit_and_checkpoint_never_submits_twice(conn, local_store, fake_llm, provider, monkeypatch):
    _setup(conn)
    criteria = ArchivalCriteria()
    claim_batch(conn, "night", criteria, NOW)
    summarizer = _summarizer(provider, fake_llm)

    class Killed(BaseException):
        """The process dies: nothing after the provider's create runs."""

    real = batches.record_submitted

    def die(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(batches, "record_submitted", die)
    with pytest.raises(Killed):
        summarize_batch(conn, "night", summarizer, criteria)
    assert fake_llm.batch_creates() == 1
    [sub] = conn.execute("SELECT * FROM llm_batches").fetchall()
    assert sub["status"] == "submitting" and sub["provider_batch_id"] is None  # the id never got recorded
    monkeypatch.setattr(batches, "record_submitted", real)

    # The next run finds the provider's batch (OpenAI: by metadata; Anthropic: by time and size) and adopts it.
    result = summarize_batch(conn, "night", _summarizer(provider, fake_llm), criteria)
    assert fake_llm.batch_creates() == 1 and _sync_calls(fake_llm) == 0
    assert result.succeeded == N
    assert conn.execute("SELECT count(*) AS n FROM archival_attempts WHERE status = 'summarized'").fetchone()["n"] == N


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_run_that_stops_waiting_leaves_the_batch_to_the_next_run(conn, local_store, fake_llm, provider):
    _setup(conn)
    criteria = ArchivalCriteria()
    claim_batch(conn, "night", criteria, NOW)
    fake_llm.hold_batches = True
    first = summarize_batch(conn, "night", _summarizer(provider, fake_llm, batch_wait_seconds=0.05), criteria)
    assert (first.succeeded, first.failed, first.waiting) == (0, 0, N)
    waiting = conn.execute("SELECT count(*) AS n FROM archival_attempts WHERE llm_submission IS NOT NULL").fetchone()
    assert waiting["n"] == N

    fake_llm.hold_batches = False  # the batch ends while nobody polls; the next run collects it
    second = summarize_batch(conn, "night", _summarizer(provider, fake_llm), criteria)
    assert (second.succeeded, second.waiting) == (N, 0)
    assert fake_llm.batch_creates() == 1 and _sync_calls(fake_llm) == 0
    # Collecting again (say, after a crash before the batch was marked collected) records nothing twice.
    [totals] = usage_of_batches(conn, ["night"])
    assert totals.requests == N


def test_below_the_threshold_summaries_stay_synchronous(conn, local_store, fake_llm):
    _setup(conn, 8)
    criteria = ArchivalCriteria()
    claim_batch(conn, "night", criteria, NOW)
    result = summarize_batch(conn, "night", _summarizer("anthropic", fake_llm), criteria)
    assert result.succeeded == 8 and fake_llm.batch_creates() == 0 and _sync_calls(fake_llm) == 8
