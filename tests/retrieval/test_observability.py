"""Observability: OpenTelemetry spans retrieve -> rerank -> pack, the search debug record, and
the context metrics, against the real Postgres and the real OpenTelemetry SDK (in-memory exporters);
and the library without opentelemetry (a subprocess where its import fails)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pgvector.psycopg import register_vector_async
from psycopg.rows import dict_row

from memory_lib.archival.pipeline import run_batch
from memory_lib.client import AsyncMemoryClient, MemoryClient
from memory_lib.core.config import ArchivalCriteria, ContextBudget, RetrievalConfig
from memory_lib.core.errors import InvalidInputError
from memory_lib.llm.client import llm_client
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.observability import telemetry
from memory_lib.retrieval.context import ContextItem, assemble_context
from memory_lib.retrieval.escalation import LLMEvaluator
from memory_lib.retrieval.rerank import LLMReranker, rerank_client
from testing.constants import TEST_DIM
from testing.factories import archival_services, make_client
from testing.fake_llm import FAKE_API_KEY

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=200)  # archived by the nightly run (min_age_days 90)
USER = "observer-user-7"
QUERY = "zanzibar kayak harbour"
HOT = ["Zanzibar kayak rental booked for the harbour tour", "Kayak paddles need new grips before Zanzibar"]
ARCHIVED = [
    "Old zanzibar harbour kayak race, finished third",
    "Harbour permit for the zanzibar kayak club renewed",
]
PRIVATE_WORDS = ("zanzibar", "kayak", "harbour", "paddles", "permit", USER.lower())
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def otel():
    """The global tracer and meter providers of this test process, with in-memory exporters."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    assert not isinstance(metrics.get_meter_provider(), MeterProvider), "another test set the meter provider"
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return exporter, reader


@pytest.fixture
def spans(otel):
    exporter, _ = otel
    exporter.clear()
    return exporter


def _seed(conn, store) -> MemoryClient:
    client = make_client(conn, store)
    for text in ARCHIVED:
        client.add(USER, text, importance=0.0, now=OLD)
    for text in HOT:
        client.add(USER, text, now=NOW)
    services = archival_services(store)
    report = run_batch(conn, services, ArchivalCriteria(), batch_key="night-1", as_of=NOW, actor="test")
    assert report.gate_passed and report.archived == len(ARCHIVED)
    return client


def _tree(exported):
    by_id = {s.context.span_id: s for s in exported}
    parent = {
        s.context.span_id: (by_id[s.parent.span_id].name if s.parent and s.parent.span_id in by_id else None)
        for s in exported
    }
    return by_id, parent


def _attr_blob(exported) -> str:
    return json.dumps(
        [{k: list(v) if isinstance(v, tuple) else v for k, v in s.attributes.items()} for s in exported]
    ).lower()


def test_spans_follow_retrieve_rerank_pack_and_carry_no_text(conn, local_store, spans, fake_llm):
    _seed(conn, local_store)
    spans.clear()  # the archival's retrievability probe searched too: only the spans of what follows
    reranker = LLMReranker(
        rerank_client("anthropic", FAKE_API_KEY, base_url=fake_llm.base_url, max_retries=0)
    )
    client = make_client(conn, local_store, reranker=reranker)
    ctx = client.build_context(USER, QUERY, ["what about the kayak trip?"], now=NOW, phase3="never")

    exported = spans.get_finished_spans()
    by_id, parent = _tree(exported)
    ours = [s for s in exported if s.instrumentation_scope.name == "memory_archive"]
    named = {s.name: s for s in ours}
    assert {"memory_archive.build_context", "memory_archive.search", "retrieve", "rerank", "pack"} <= set(
        named
    )
    assert parent[named["memory_archive.build_context"].context.span_id] is None
    assert parent[named["memory_archive.search"].context.span_id] == "memory_archive.build_context"
    assert parent[named["pack"].context.span_id] == "memory_archive.build_context"
    assert parent[named["rerank"].context.span_id] == "memory_archive.search"
    retrieves = sorted((s for s in ours if s.name == "retrieve"), key=lambda s: s.start_time)
    assert [s.attributes["memory_archive.phase"] for s in retrieves] == ["1", "2"]
    assert all(parent[s.context.span_id] == "memory_archive.search" for s in retrieves)
    # retrieve -> rerank -> pack, in time
    assert retrieves[-1].end_time <= named["rerank"].start_time
    assert named["rerank"].end_time <= named["pack"].start_time

    phase1, phase2 = (s.attributes for s in retrieves)
    assert (
        phase1["memory_archive.candidates.hot"] == len(HOT) and phase1["memory_archive.phase2.needed"] is True
    )
    assert phase2["memory_archive.phase2.reason"] == "too_few_hot_hits"
    assert phase2["memory_archive.candidates.archived"] == len(ARCHIVED)
    assert tuple(phase2["memory_archive.tiers"]) == ("archived",)

    search = named["memory_archive.search"].attributes
    hit_ids = list(search["memory_archive.hit_ids"])
    assert len(hit_ids) == len(HOT) + len(ARCHIVED) == search["memory_archive.hits"]
    assert (
        list(named["rerank"].attributes["memory_archive.hit_ids"]) == hit_ids
    )  # the reranked order is returned
    assert search["memory_archive.reranker"] == reranker.name
    assert tuple(search["memory_archive.tiers_searched"]) == ("hot", "archived")
    assert len(search["memory_archive.hit_scores"]) == len(hit_ids)

    pack = named["pack"].attributes
    injected = [str(b.provenance.archive_id or b.provenance.memory_id) for b in ctx.blocks if b.provenance]
    assert list(pack["memory_archive.injected_ids"]) == injected and set(injected) <= set(hit_ids)
    assert pack["memory_archive.tokens.used"] == ctx.total_tokens
    assert pack["memory_archive.tokens.available"] == ctx.available
    assert pack["memory_archive.memories.offered"] == len(hit_ids)
    assert pack["memory_archive.memories.injected"] == ctx.injected_memories
    assert pack["memory_archive.injection_hit_rate"] == pytest.approx(ctx.injection_hit_rate)

    # Privacy: no attribute of any exported span (ours, or a library's under them) holds a memory's
    # words, the query's or the user id.
    blob = _attr_blob(exported)
    for word in PRIVATE_WORDS:
        assert word not in blob, word
    assert all(s.context.trace_id == named["memory_archive.build_context"].context.trace_id for s in ours)
    assert len(by_id) == len(exported)


def test_async_client_spans_nest_the_same_way(db_url, local_store, conn, spans, fake_llm):
    _seed(conn, local_store)
    spans.clear()  # the archival's retrievability probe searched too: only the spans of what follows
    reranker = LLMReranker(
        rerank_client("openai", FAKE_API_KEY, base_url=fake_llm.openai_base_url, max_retries=0)
    )

    async def scenario():
        aconn = await psycopg.AsyncConnection.connect(db_url, autocommit=True, row_factory=dict_row)
        await register_vector_async(aconn)
        try:
            client = AsyncMemoryClient(
                aconn,
                embedder=HashingEmbedder(TEST_DIM),
                object_store=local_store,
                actor="test",
                reranker=reranker,
            )
            return await client.search(USER, QUERY, now=NOW, phase3="never", debug=True)
        finally:
            await aconn.close()

    result = asyncio.run(scenario())
    ours = [s for s in spans.get_finished_spans() if s.instrumentation_scope.name == "memory_archive"]
    _, parent = _tree(ours)
    [search] = [s for s in ours if s.name == "memory_archive.search"]
    retrieves = [s for s in ours if s.name == "retrieve"]
    assert len(retrieves) == 2 and all(
        parent[s.context.span_id] == "memory_archive.search" for s in retrieves
    )
    [rerank] = [s for s in ours if s.name == "rerank"]  # run in a worker thread, still under the search
    assert parent[rerank.context.span_id] == "memory_archive.search"
    assert list(rerank.attributes["memory_archive.hit_ids"]) == [str(h.id) for h in result.hits]
    assert result.debug.reranker == reranker.name and fake_llm.count("/v1/chat/completions") == 1
    assert list(search.attributes["memory_archive.hit_ids"]) == [str(h.id) for h in result.hits]
    assert result.debug is not None and list(result.debug.chosen_ids) == [h.id for h in result.hits]


def test_debug_lists_tiers_candidates_scores_and_chosen_ids(conn, local_store):
    _seed(conn, local_store)
    client = make_client(conn, local_store, retrieval=RetrievalConfig(limit=3))
    plain = client.search(USER, QUERY, now=NOW)
    assert plain.debug is None  # off by default
    result = client.search(USER, QUERY, now=NOW, debug=True)
    # Debug changes nothing about the hits.
    assert [(h.id, h.scores, h.text) for h in result.hits] == [(h.id, h.scores, h.text) for h in plain.hits]
    d = result.debug
    assert d is not None
    assert d.chosen_ids == tuple(h.id for h in result.hits) and len(d.chosen_ids) == 3
    assert result.escalation is not None
    assert d.phase2_reason == result.phase2_reason == "too_few_hot_hits"
    assert d.escalation is result.escalation and d.tiers_searched == result.escalation.tiers_searched
    assert "archived" in d.tiers_searched
    assert d.candidates_by_tier == {"hot": result.hot_candidates, "archived": result.archived_candidates}
    assert d.candidates_by_tier == {"hot": len(HOT), "archived": len(ARCHIVED)}
    # Every candidate, with its tier and scores; the chosen ones are the best of them, with the hits' scores.
    assert len(d.candidates) == len(HOT) + len(ARCHIVED)
    assert {c.tier for c in d.candidates} == {"hot", "archived"}
    finals = [c.scores.final for c in d.candidates]
    assert finals == sorted(finals, reverse=True)
    by_id = {c.id: c for c in d.candidates}
    for hit in result.hits:
        c = by_id[hit.id]
        assert c.tier == hit.source and c.scores == hit.scores and c.memory_id == hit.provenance.memory_id
    archived = [c for c in d.candidates if c.tier == "archived"]
    for c in archived:  # the cosine estimated from the summary's bits, the fused relevance in [0, 1]
        assert -1.0 <= c.scores.similarity <= 1.0 and 0.0 <= c.scores.hybrid_similarity <= 1.0 + 1e-9, (
            c.scores
        )
    assert any(c.scores.text_rank is not None for c in d.candidates)
    assert d.reranker is None

    # The setting turns it on for every search; the argument wins; a non-boolean is refused.
    assert d is not None
    always = make_client(conn, local_store, retrieval=RetrievalConfig(limit=3, debug=True))
    debug = always.search(USER, QUERY, now=NOW).debug
    assert debug is not None and debug.chosen_ids == d.chosen_ids
    assert always.search(USER, QUERY, now=NOW, debug=False).debug is None
    with pytest.raises(InvalidInputError) as err:
        client.search(USER, QUERY, now=NOW, debug="yes")  # type: ignore[arg-type]  # the wrong type is the input under test
    assert err.value.field == "debug"


def test_debug_without_phase2(conn, local_store):
    client = make_client(conn, local_store, retrieval=RetrievalConfig(strong_hot_similarity=-1.0, limit=2))
    _seed(conn, local_store)
    result = client.search(USER, QUERY, now=NOW, debug=True, phase3="never")
    assert result.debug is not None
    assert result.debug is not None
    assert result.phase2_reason is None and result.debug.tiers_searched == ("hot",)
    assert result.debug is not None
    assert result.debug.candidates_by_tier == {"hot": len(HOT), "archived": 0}
    assert {c.tier for c in result.debug.candidates} == {"hot"}


def _llm_client(conn, store, fake_llm, action: str) -> MemoryClient:
    fake_llm.evaluator_decision = {
        "sufficient": False,
        "reason": f"the test wants {action}",
        "action": action,
        "refinedQuery": "harbour permit renewed",
    }
    evaluator = LLMEvaluator(
        llm_client("anthropic", FAKE_API_KEY, base_url=fake_llm.base_url, max_retries=0, timeout=5)
    )
    return MemoryClient(
        conn, embedder=HashingEmbedder(TEST_DIM), object_store=store, actor="test", evaluator=evaluator
    )


def test_debug_adds_a_search_warm_re_search(conn, local_store, fake_llm):
    _seed(conn, local_store)
    result = _llm_client(conn, local_store, fake_llm, "search_warm").search(USER, QUERY, now=NOW, debug=True)
    assert result is not None
    d = result.debug
    assert d is not None
    assert result.escalation is not None
    assert result.escalation.action == "search_warm" and d.escalation is result.escalation
    # Both searches' rows counted; each candidate once, at its best score; the chosen ids are the hits'.
    assert d is not None
    assert d.candidates_by_tier == {"hot": 2 * len(HOT), "archived": 2 * len(ARCHIVED)}
    assert len({c.id for c in d.candidates}) == len(d.candidates) == len(HOT) + len(ARCHIVED)
    assert d.chosen_ids == tuple(h.id for h in result.hits)
    best = {c.id: c.scores.final for c in d.candidates}
    assert all(best[h.id] == h.scores.final for h in result.hits)


def test_phase3_retrieve_span(conn, local_store, fake_llm, spans):
    _seed(conn, local_store)
    result = _llm_client(conn, local_store, fake_llm, "search_cold").search(USER, QUERY, now=NOW)
    ours = [s for s in spans.get_finished_spans() if s.instrumentation_scope.name == "memory_archive"]
    _, parent = _tree(ours)
    [phase3] = [s for s in ours if s.name == "retrieve" and s.attributes["memory_archive.phase"] == "3"]
    assert parent[phase3.context.span_id] == "memory_archive.search"
    assert tuple(phase3.attributes["memory_archive.tiers"]) == ("digests", "facts")
    assert phase3.attributes["memory_archive.phase3.action"] == "search_cold"
    assert phase3.attributes["memory_archive.candidates.consolidated"] == len(result.consolidated)
    assert phase3.attributes["memory_archive.phase3.refined_query"] is True  # that there is one, not its text
    assert result.escalation is not None
    [search] = [s for s in ours if s.name == "memory_archive.search"]
    assert tuple(search.attributes["memory_archive.tiers_searched"]) == result.escalation.tiers_searched
    blob = _attr_blob(spans.get_finished_spans())
    assert "permit" not in blob and "zanzibar" not in blob


def _metric_points(reader) -> dict[str, tuple[float, int]]:
    """name -> (sum, count) of histograms, (value, 1) of counters; cumulative since the provider was set."""
    out: dict[str, tuple[float, int]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out[m.name] = (p.sum, p.count) if hasattr(p, "count") else (p.value, 1)
    return out


def test_context_metrics_on_a_constructed_case(otel):
    _, reader = otel
    before = _metric_points(reader)
    snippets = [
        ContextItem(t, "hot", score=1.0 - i / 10)
        for i, t in enumerate(
            ["alpha bravo charlie delta", "sierra tango victor whiskey", "romeo quebec yankee oscar"]
        )
    ]
    budget = ContextBudget(total=100, summaries=10, recent_turns=10, snippets=16, reserve=10)
    ctx = assemble_context(
        snippets=snippets, recent_turns=["hello there"], summaries=["caller note"], budget=budget
    )
    # 8 tokens a snippet: 2 of the 3 fit in 16; the turn is 4 tokens, the caller's summary 5 (not memory).
    assert [b.text for b in ctx.part("snippets")] == [
        "alpha bravo charlie delta",
        "sierra tango victor whiskey",
    ]
    assert ctx.offered_memories == 3 and ctx.injected_memories == 2
    assert ctx.injection_hit_rate == pytest.approx(0.667, abs=1e-3)
    assert ctx.total_tokens == 16 + 4 + ctx.part("summaries")[0].tokens
    assert ctx.memory_token_share == pytest.approx(16 / ctx.total_tokens)
    telemetry.record_context(ctx)

    after = _metric_points(reader)

    def delta(name):
        s0, c0 = before.get(name, (0, 0))
        s1, c1 = after[name]
        return s1 - s0, c1 - c0

    assert delta(telemetry.HIT_RATE) == (pytest.approx(2 / 3), 1)
    assert delta(telemetry.TOKEN_SHARE) == (pytest.approx(ctx.memory_token_share), 1)
    assert delta(telemetry.OFFERED)[0] == 3 and delta(telemetry.INJECTED)[0] == 2
    # Nothing offered, nothing in the context: no rate, no share (and none recorded).
    empty = assemble_context(budget=budget)
    assert empty.injection_hit_rate is None and empty.memory_token_share is None
    telemetry.record_context(empty)
    assert _metric_points(reader)[telemetry.HIT_RATE][1] == after[telemetry.HIT_RATE][1]


def test_build_context_exports_its_metrics(conn, local_store, otel):
    _, reader = otel
    client = _seed(conn, local_store)
    before = _metric_points(reader)
    ctx = client.build_context(
        USER,
        QUERY,
        ["ok"],
        now=NOW,
        phase3="never",
        budget=ContextBudget(total=60, summaries=0, recent_turns=10, snippets=18, reserve=0),
    )
    after = _metric_points(reader)
    assert ctx.offered_memories == len(HOT) + len(ARCHIVED)  # archived hits go to summaries: none fit there
    assert 0 < ctx.injected_memories < ctx.offered_memories
    rate_sum = after[telemetry.HIT_RATE][0] - before.get(telemetry.HIT_RATE, (0, 0))[0]
    assert rate_sum == pytest.approx(ctx.injection_hit_rate)
    share_sum = after[telemetry.TOKEN_SHARE][0] - before.get(telemetry.TOKEN_SHARE, (0, 0))[0]
    assert share_sum == pytest.approx(ctx.memory_token_share) and 0 < share_sum < 1


_WITHOUT_OTEL = """
import json, sys
for name in [m for m in list(sys.modules) if m.startswith("opentelemetry")] + [
        "opentelemetry", "opentelemetry.trace", "opentelemetry.metrics"]:
    sys.modules[name] = None  # `import opentelemetry...` now raises ImportError
from datetime import datetime, timezone
from memory_lib.observability import telemetry, trace
from memory_lib.client import MemoryClient
from memory_lib.core.config import RetrievalConfig, Settings
from memory_lib.storage.db import connect
from memory_lib.llm.embedding import HashingEmbedder
assert not trace.available() and telemetry._otel_metrics is None
now = datetime(2025, 6, 1, 12, tzinfo=timezone.utc)
with connect(sys.argv[1]) as conn:
    client = MemoryClient(conn, embedder=HashingEmbedder(int(sys.argv[2])), actor="test",
                          settings=Settings(retrieval=RetrievalConfig(debug=True)))
    added = client.add("u1", "Sailing lessons on Saturday mornings", now=now)
    result = client.search("u1", "sailing lessons", now=now)
    ctx = client.build_context("u1", "sailing lessons", ["hi"], now=now)
print(json.dumps({"hits": [str(h.id) for h in result.hits], "chosen": [str(i) for i in result.debug.chosen_ids],
                  "added": str(added.memory_id), "rate": ctx.injection_hit_rate,
                  "otel_loaded": sorted(m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v)}))
"""


def test_the_library_works_without_opentelemetry(db_url):
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OTEL, db_url, str(TEST_DIM)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["hits"] == report["chosen"] == [report["added"]]
    assert report["rate"] == 1.0
    assert report["otel_loaded"] == []


def test_a_failed_step_ends_the_flows_span_before_the_callers(spans):
    """drive closes the escalation flow when a step fails: its open span ends, and no span stays current."""
    from memory_lib.core.plans import Call, drive
    from memory_lib.observability.trace import span

    def failing_step():
        raise RuntimeError("the database went away")

    def flow():
        with span("retrieve", {"memory_archive.phase": "3"}):
            yield Call(failing_step)
        return None

    with pytest.raises(RuntimeError), span("memory_archive.search"):
        drive(None, flow())  # type: ignore[arg-type]  # the wrong type is the input under test
    assert not trace.get_current_span().get_span_context().is_valid
    ours = {s.name: s for s in spans.get_finished_spans()}
    assert ours["retrieve"].parent.span_id == ours["memory_archive.search"].context.span_id
    assert ours["retrieve"].end_time <= ours["memory_archive.search"].end_time
    assert ours["memory_archive.search"].status.status_code.name == "ERROR"
