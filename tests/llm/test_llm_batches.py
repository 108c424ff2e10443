"""Backlogs through the providers' batch APIs, with the real SDKs against the local fake server:
submit -> poll -> results, a partial failure, an expired batch, and a crash between submit and poll."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from memory_lib.archival.archive import batch_status, summarize_batch
from memory_lib.archival.claims import claim_batch
from memory_lib.archival.pipeline import run_batch
from memory_lib.cli import main
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.errors import SummarizationError
from memory_lib.core.pricing import DEFAULT_PRICES, Usage, cost_usd
from memory_lib.lifecycle.pause import clear_pause, pause_status
from memory_lib.llm import batches
from memory_lib.llm.ledger import usage_of_batches
from memory_lib.llm.summarize import AnthropicSummarizer, OpenAISummarizer
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.factories import NOW, archival_services, make_memories
from testing.fake_llm import FAKE_API_KEY, FakeLLMServer
from testing.rows import one

PROVIDERS = ["anthropic", "openai"]
MODEL = {"anthropic": "claude-3-haiku-20240307", "openai": "gpt-4o-mini"}
N = 24


def _summarizer(provider: str, server: FakeLLMServer, **kw):
    cls = AnthropicSummarizer if provider == "anthropic" else OpenAISummarizer
    kw = {"batch_threshold": 10, "batch_poll_seconds": 0.01, "batch_wait_seconds": 30.0} | kw
    kw.setdefault("max_retries", 0)
    return cls(FAKE_API_KEY, base_url=server.base_url, model=MODEL[provider], **kw)


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
    services = archival_services(local_store, summarizer=_summarizer(provider, fake_llm))

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
    assert totals.cost_usd == pytest.approx(
        cost_usd(DEFAULT_PRICES, MODEL[provider], served, batch=True), rel=1e-6
    )
    sync_cost = cost_usd(DEFAULT_PRICES, MODEL[provider], served)
    assert sync_cost is not None
    assert totals.cost_usd == pytest.approx(sync_cost / 2, rel=1e-6)

    # The failed memory is retried by the next run (below the threshold: synchronously).
    second = run_batch(conn, services, ArchivalCriteria(), batch_key="night-2", as_of=NOW, actor="test")
    assert second.archived == 1 and fake_llm.batch_creates() == 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_expired_batch_falls_back_to_synchronous_calls(conn, local_store, fake_llm, provider):
    _setup(conn)
    fake_llm.batch_outcome = "expired"  # the provider answered half before the batch expired
    services = archival_services(local_store, summarizer=_summarizer(provider, fake_llm))

    report = run_batch(conn, services, ArchivalCriteria(), batch_key="night", as_of=NOW, actor="test")

    assert report.ok and batch_status(conn, "night").archived == N
    assert fake_llm.batch_creates() == 1 and _sync_calls(fake_llm) == N // 2
    modes = {r["mode"]: r["n"] for r in conn.execute("SELECT mode, count(*) AS n FROM llm_usage GROUP BY 1")}
    assert modes == {"batch": N // 2, "sync": N // 2}
    assert one(conn.execute("SELECT status FROM llm_batches"))["status"] == "expired"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_crash_between_submit_and_checkpoint_never_submits_twice(
    conn, local_store, fake_llm, provider, monkeypatch
):
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
    assert (
        one(conn.execute("SELECT count(*) AS n FROM archival_attempts WHERE status = 'summarized'"))["n"] == N
    )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_run_that_stops_waiting_leaves_the_batch_to_the_next_run(conn, local_store, fake_llm, provider):
    _setup(conn)
    criteria = ArchivalCriteria()
    claim_batch(conn, "night", criteria, NOW)
    fake_llm.hold_batches = True
    first = summarize_batch(conn, "night", _summarizer(provider, fake_llm, batch_wait_seconds=0.05), criteria)
    assert (first.succeeded, first.failed, first.waiting) == (0, 0, N)
    waiting = conn.execute(
        "SELECT count(*) AS n FROM archival_attempts WHERE llm_submission IS NOT NULL"
    ).fetchone()
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


# --------------------------------------------------------------------------- failed submissions


def _one_each(conn, memories) -> None:
    """None lost, none duplicated: each memory exactly once in hot or archive."""
    ids = [m["id"] for m in memories]
    hot = one(conn.execute("SELECT count(*) AS n FROM memories WHERE id = ANY(%s)", (ids,)))["n"]
    rows = conn.execute(
        "SELECT original_id FROM archived_memories WHERE original_id = ANY(%s)", (ids,)
    ).fetchall()
    assert len(rows) == len({r["original_id"] for r in rows}) and hot + len(rows) == len(ids)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_refused_submission_releases_its_memories_says_why_and_the_next_run_archives_them(
    conn, local_store, fake_llm, provider
):
    memories = _setup(conn)
    # A bad key: the provider refuses the batch (401) and every single request too.
    fake_llm.batch_create_status = 401
    fake_llm.fail_fraction, fake_llm.fail_status = 1.0, 401
    services = archival_services(local_store, summarizer=_summarizer(provider, fake_llm))

    report = run_batch(conn, services, ArchivalCriteria(), batch_key="night", as_of=NOW, actor="test")

    assert report.why is not None
    assert not report.ok and report.archived == 0 and report.stalled
    assert report.why is not None
    assert "archived 0 of 24 claimed" in report.why
    assert report.why is not None
    assert "the provider rejected the submission" in report.why and "invalid x-api-key" in report.why
    assert report.problem is not None
    assert "24 memories failed (summarize: 24)" in report.why and "401" in report.why
    assert report.why in report.problem  # the CLI's `problem` carries it
    [sub] = conn.execute("SELECT * FROM llm_batches").fetchall()
    assert sub["status"] == "failed" and sub["provider_batch_id"] is None and "HTTP 401" in sub["error"]
    assert fake_llm.batches_created() == 0
    held = conn.execute(
        "SELECT count(*) AS n FROM archival_attempts WHERE llm_submission IS NOT NULL"
    ).fetchone()
    assert held["n"] == 0  # released: no memory waits in the refused submission
    assert batches.held_submissions(conn) == []

    # The key is fixed and the pause the failed gate set is cleared: the next run archives them all.
    fake_llm.batch_create_status, fake_llm.fail_fraction = None, 0.0
    clear_pause(conn, reason="key fixed", actor="test")
    again = run_batch(conn, services, ArchivalCriteria(), batch_key="night", as_of=NOW, actor="test")
    assert again.ok and batch_status(conn, "night").archived == N and not again.stalled and again.why is None
    assert fake_llm.batches_created() == 1
    assert one(conn.execute("SELECT status FROM llm_batches"))["status"] == "collected"
    _one_each(conn, memories)


@pytest.mark.parametrize("fault", ["timeout", "500 after create"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_ambiguous_submission_is_kept_and_the_next_run_adopts_it(
    conn, local_store, fake_llm, provider, fault
):
    memories = _setup(conn)
    if fault == "timeout":
        fake_llm.batch_create_delay_seconds = (
            2.0  # the batch is made, the answer comes after the client gave up
        )
        kw = {"timeout": 0.5}
    else:
        fake_llm.batch_create_status, fake_llm.batch_create_creates = 500, True
        kw = {"max_retries": 3}  # a create that may have succeeded is not retried: no second batch
    services = archival_services(local_store, summarizer=_summarizer(provider, fake_llm, **kw))

    report = run_batch(conn, services, ArchivalCriteria(), batch_key="night", as_of=NOW, actor="test")

    assert not report.ok and report.archived == 0 and fake_llm.batches_created() == 1
    [sub] = conn.execute("SELECT * FROM llm_batches").fetchall()
    assert sub["status"] == "submitting" and sub["provider_batch_id"] is None
    assert sub["error"].startswith("outcome unknown (the provider may have created the batch")
    assert report.why is not None
    assert (
        f"24 memories held by LLM batch {sub['submission_key']} in status 'submitting' since " in report.why
    )
    [held] = batches.held_submissions(conn, "night")
    assert held.stalled and held.memories == N

    # The next run looks the provider's batch up and adopts it: no second batch, no single requests.
    fake_llm.batch_create_delay_seconds, fake_llm.batch_create_status = 0.0, None
    clear_pause(conn, reason="provider answered again", actor="test")
    again = run_batch(conn, services, ArchivalCriteria(), batch_key="night", as_of=NOW, actor="test")
    assert again.ok and batch_status(conn, "night").archived == N
    assert fake_llm.batches_created() == 1 and _sync_calls(fake_llm) == 0
    assert conn.execute("SELECT status, error FROM llm_batches").fetchone() == {
        "status": "collected",
        "error": None,
    }
    _one_each(conn, memories)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_intent_the_provider_never_got_is_resubmitted_then_released_past_the_lookup_window(
    conn, local_store, fake_llm, provider
):
    _setup(conn)
    criteria = ArchivalCriteria()
    claim_batch(conn, "night", criteria, NOW)
    fake_llm.batch_create_status = 503  # no batch made, yet a 5xx leaves it unknown to us
    first = summarize_batch(conn, "night", _summarizer(provider, fake_llm), criteria)
    assert (first.succeeded, first.waiting) == (0, N)
    # Within the lookup window: the provider shows no batch for it, so it is submitted again.
    second = summarize_batch(conn, "night", _summarizer(provider, fake_llm), criteria)
    assert (second.succeeded, second.waiting) == (0, N) and fake_llm.batch_creates() == 2
    [sub] = conn.execute("SELECT * FROM llm_batches").fetchall()
    assert sub["status"] == "submitting" and "HTTP 503" in sub["error"]

    # Past the window (the next night): looked up, not found, released to synchronous summaries.
    conn.execute(
        "UPDATE llm_batches SET created_at = now() - %s", (batches.LOOKUP_WINDOW + timedelta(minutes=1),)
    )
    third = summarize_batch(conn, "night", _summarizer(provider, fake_llm), criteria)
    assert (third.succeeded, third.waiting) == (N, 0) and fake_llm.batch_creates() == 2
    assert _sync_calls(fake_llm) == N and fake_llm.batches_created() == 0
    sub = conn.execute("SELECT * FROM llm_batches").fetchone()
    assert sub["status"] == "failed" and "shows no batch for it 12 h after it was submitted" in sub["error"]
    assert "HTTP 503" in sub["error"]  # the last error is kept in the why
    assert batches.held_submissions(conn) == []


def test_a_lookup_that_fails_leaves_the_intent_with_why(conn, local_store, fake_llm):
    _setup(conn)
    criteria = ArchivalCriteria()
    claim_batch(conn, "night", criteria, NOW)
    fake_llm.batch_create_status = 500
    summarize_batch(conn, "night", _summarizer("anthropic", fake_llm), criteria)
    down = AnthropicSummarizer(
        FAKE_API_KEY,
        base_url="http://127.0.0.1:9",
        model=MODEL["anthropic"],
        max_retries=0,
        batch_threshold=10,
        batch_poll_seconds=0.01,
    )
    result = summarize_batch(conn, "night", down, criteria)  # the lookup cannot connect: no crash
    assert (result.succeeded, result.failed, result.waiting) == (0, 0, N)
    sub = conn.execute("SELECT status, error FROM llm_batches").fetchone()
    assert sub["status"] == "submitting" and sub["error"].startswith(
        "looking its batch up at the provider failed"
    )
    # Past the lookup window it is released all the same (its memories then fail here: no connection).
    conn.execute("UPDATE llm_batches SET created_at = now() - interval '13 hours'")
    later = summarize_batch(conn, "night", down, criteria)
    assert (later.failed, later.waiting) == (N, 0)
    sub = conn.execute("SELECT status, error FROM llm_batches").fetchone()
    assert sub["status"] == "failed" and sub["error"].startswith(
        "looking its batch up at the provider failed"
    )
    assert " 12 h after it was submitted" in sub["error"]


def test_which_failures_leave_no_batch(fake_llm):
    """Refused (4xx) or never connected: no batch. A timeout or a 5xx: maybe one."""
    requests = [
        (
            uuid.uuid4(),
            {"model": MODEL["anthropic"], "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]},
        )
    ]

    def fail(summarizer) -> Exception:
        with pytest.raises(SummarizationError) as err:
            batches.BatchClient(summarizer).create("night:x", requests)
        return err.value

    refused = AnthropicSummarizer(
        FAKE_API_KEY, base_url="http://127.0.0.1:9", model=MODEL["anthropic"], max_retries=0
    )
    exc = fail(refused)
    assert batches.not_created(exc) and batches.describe_submit_failure(exc).startswith(
        "the submission did not reach the provider"
    )
    fake_llm.batch_create_status = 403
    exc = fail(_summarizer("anthropic", fake_llm))
    assert batches.not_created(exc) and "rejected the submission" in batches.describe_submit_failure(exc)
    fake_llm.batch_create_status = 502
    assert not batches.not_created(fail(_summarizer("anthropic", fake_llm)))
    fake_llm.batch_create_status, fake_llm.batch_create_delay_seconds = None, 1.0
    assert not batches.not_created(fail(_summarizer("anthropic", fake_llm, timeout=0.2)))


@pytest.mark.parametrize("provider", ["openai"])
def test_a_failed_file_upload_leaves_no_batch(conn, local_store, fake_llm, provider, monkeypatch):
    _setup(conn)
    criteria = ArchivalCriteria()
    claim_batch(conn, "night", criteria, NOW)
    summarizer = _summarizer(provider, fake_llm)

    def timeout(*args, **kwargs):
        raise TimeoutError("upload timed out")

    monkeypatch.setattr(summarizer.client.files, "create", timeout)
    result = summarize_batch(conn, "night", summarizer, criteria)
    assert result.succeeded == N and _sync_calls(fake_llm) == N  # no batch without its file: synchronously
    sub = conn.execute("SELECT status, error FROM llm_batches").fetchone()
    assert sub["status"] == "failed" and sub["error"].startswith("the submission did not reach the provider")


def test_stats_show_a_stuck_batch_with_its_age_and_memories(conn, local_store, fake_llm, cli_env, capsys):
    _setup(conn)
    criteria = ArchivalCriteria()
    claim_batch(conn, "night", criteria, NOW)
    fake_llm.batch_create_status = 500
    summarize_batch(conn, "night", _summarizer("anthropic", fake_llm), criteria)
    conn.execute("UPDATE llm_batches SET created_at = now() - interval '3 hours'")

    stats = batches.submission_stats(conn)
    assert stats["by_status"]["submitting"]["memories_held"] == N
    assert stats["by_status"]["submitting"]["submissions"] == 1
    assert 3 * 3600 <= stats["by_status"]["submitting"]["oldest_age_seconds"] < 3 * 3600 + 60
    [holding] = stats["holding"]
    assert holding["stalled"] and holding["memories"] == N and "HTTP 500" in holding["error"]
    assert stats["stalled"][0].startswith(f"{N} memories held by LLM batch night:")

    assert main(["stats"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["llm_batches"]
    assert out["by_status"]["submitting"]["memories_held"] == N
    assert out["by_status"]["submitting"]["oldest_age_seconds"] >= 3 * 3600
    assert out["holding"][0]["stalled"] is True and out["stalled"] == stats["stalled"]


@pytest.mark.parametrize("provider", ["anthropic"])
def test_memories_stuck_behind_a_submission_fail_the_run_that_archives_the_rest(
    conn, local_store, fake_llm, provider
):
    """The night after a submission failed without an answer, the run takes its memories over and
    archives the new ones: not ok while the old ones wait, and released once past the lookup window."""
    memories = make_memories(N + 5, dim=TEST_DIM)
    insert_memories(conn, memories[:N], actor="test")
    fake_llm.batch_create_status = 500  # no batch made; to us the outcome is unknown
    services = archival_services(local_store, summarizer=_summarizer(provider, fake_llm))
    first = run_batch(conn, services, ArchivalCriteria(), batch_key="night-1", as_of=NOW, actor="test")
    assert not first.ok and first.archived == 0
    clear_pause(conn, reason="archived nothing: looked into it", actor="test")

    insert_memories(conn, memories[N:], actor="test")
    second = run_batch(conn, services, ArchivalCriteria(), batch_key="night-2", as_of=NOW, actor="test")
    assert second.claim is not None
    assert second.claim.taken_over == N and second.archived == 5  # the new ones, synchronously
    assert second.problem is not None
    assert not second.ok and second.stalled and second.gate_passed
    assert second.why is not None
    assert "night-2: archived 5 of 29 claimed; 24 memories held by LLM batch night-1:" in second.problem
    assert "in status 'submitting' since" in second.why and "HTTP 500" in second.why

    # The next night, past the lookup window: the provider has no batch for it, so it is released.
    conn.execute(
        "UPDATE llm_batches SET created_at = now() - %s", (batches.LOOKUP_WINDOW + timedelta(hours=1),)
    )
    third = run_batch(conn, services, ArchivalCriteria(), batch_key="night-3", as_of=NOW, actor="test")
    assert third.ok and third.archived == N and not third.stalled, third.problem
    assert fake_llm.batches_created() == 0
    _one_each(conn, memories)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_night_that_waits_on_its_llm_batch_passes_the_gate_and_the_next_archives_it(
    conn, local_store, fake_llm, provider
):
    """The provider has not answered by the end of the night: the run archives nothing, and says so, but
    waiting is not failing: the gate passes and archival is not paused. The next night collects it."""
    memories = _setup(conn)
    fake_llm.hold_batches = True
    services = archival_services(
        local_store, summarizer=_summarizer(provider, fake_llm, batch_wait_seconds=0.05)
    )
    first = run_batch(conn, services, ArchivalCriteria(), batch_key="night-1", as_of=NOW, actor="test")
    assert first.gate is not None
    assert first.archived == 0 and first.gate_passed and first.gate.waiting == N
    assert first.gate is not None
    assert not pause_status(conn).paused
    assert f"{N} wait in an LLM batch submission" in first.gate.describe()

    fake_llm.hold_batches = False
    second = run_batch(conn, services, ArchivalCriteria(), batch_key="night-2", as_of=NOW, actor="test")
    assert second.ok and second.archived == N, second.problem
    assert fake_llm.batch_creates() == 1
    _one_each(conn, memories)
