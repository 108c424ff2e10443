"""The warm tier in time: a question naming a time makes phase 2 read only the archive
rows of those months, shown by the executed plan (EXPLAIN ANALYZE): other months' rows are never read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memory_lib.core.config import RetrievalConfig
from memory_lib.core.plans import Sql, run_plan
from memory_lib.core.timescope import TimeWindow
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.search import search_plan
from memory_lib.retrieval.sql import SEARCH_SETTINGS_SQL
from memory_lib.retrieval.types import SearchRequest
from memory_lib.retrieval.warm import month_scope, scope_sql
from memory_lib.storage.space import LOCK_VECTOR_TABLES
from testing.constants import TEST_DIM
from testing.explain import base_name, plan_nodes

NOW = datetime(2025, 9, 15, 12, 0, tzinfo=UTC)
MAY = (datetime(2025, 5, 1, tzinfo=UTC), datetime(2025, 6, 1, tzinfo=UTC))
USERS, MONTHS, PER_MONTH = 5, 12, 100  # u1's May is 100 of 6,000 archive rows

# Archive rows straight in SQL (the archival pipeline is tested elsewhere): PER_MONTH a month for each
# user over the 12 months to September 2025, each with its own summary vector (the 007 trigger keeps its bits).
_FILL = f"""
    WITH objects AS (INSERT INTO backup_objects (user_id, ref)
                     SELECT 'u' || u, 's3://b/' || u FROM generate_series(1, {USERS}) u RETURNING id, user_id)
    INSERT INTO archived_memories (
        original_id, user_id, summary, summary_embedding, summary_embedding_model, original_category,
        original_embedding_model, original_updated_at, importance_score, archived_at, original_created_at,
        archive_reason, backup_object, backup_digest, backup_size_bytes, summary_model, summarizer_kind)
    SELECT gen_random_uuid(), 'u' || u, 'Went kayaking with Tiago on the river, trip ' || i || ' of month ' || mo,
           (SELECT array_agg(sin(i * 7.1 + u * 3.3 + mo + d))::float4[]
            FROM generate_series(1, {TEST_DIM}) d)::vector::halfvec,
           'hashing', 'episodic', 'hashing', t, 0.1, now(), t, 'force_age',
           (SELECT o.id FROM objects o WHERE o.user_id = 'u' || u),
           sha256(''), 100, 'extractive', 'extractive'
    FROM generate_series(1, {USERS}) u, generate_series(0, {MONTHS - 1}) mo, generate_series(1, {PER_MONTH}) i,
         LATERAL (SELECT timestamptz '2024-10-01 00:00+00' + make_interval(months => mo)
                         + make_interval(hours => i * 7) AS t) ts"""


@pytest.fixture
def archive(conn) -> None:
    conn.execute(_FILL)
    conn.execute("ANALYZE archived_memories")


def _explaining(plan, plans: list[tuple[str, dict[str, Any]]]):
    """`plan`, each statement that reads the archive executed under EXPLAIN ANALYZE first."""
    op = next(plan)
    try:
        while True:
            # (storage.space.LOCK_VECTOR_TABLES names the table but reads nothing: no plan to explain, nor
            # in the statement that locks and sets the search's session; the session settings read one row
            # of the user's, only to find its partition when partitioned)
            if (
                isinstance(op, Sql)
                and ("archived_memories" in op.query)
                and not op.query.startswith(LOCK_VECTOR_TABLES.query)
                and op.query != SEARCH_SETTINGS_SQL
            ):
                row = yield Sql("EXPLAIN (ANALYZE, FORMAT JSON) " + op.query, op.params, "one")
                plans.append((op.query, row["QUERY PLAN"][0]["Plan"]))
            op = plan.send((yield op))
    except StopIteration as stop:
        return stop.value


def _archive_reads(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes that read archived_memories rows."""
    return [n for n in plan_nodes(plan) if base_name(n.get("Relation Name")) == "archived_memories"]


def _search(conn, query: str, *, scoped: bool = True, one_statement: bool = True, **kw):
    config = RetrievalConfig(archive_time_scope="months" if scoped else "off")
    embedding = HashingEmbedder(TEST_DIM).embed([query])[0]
    request = SearchRequest(user_id="u1", query=query, embedding=embedding, config=config, now=NOW, **kw)
    plans: list[tuple[str, dict[str, Any]]] = []
    result = run_plan(conn, _explaining(search_plan(request, one_statement=one_statement), plans))
    return result, plans


@pytest.mark.parametrize("one_statement", [True, False], ids=["both-tiers", "phase-2-alone"])
def test_a_month_scoped_phase_2_reads_only_that_month(conn, archive, one_statement):
    may_rows = conn.execute(
        "SELECT count(*) AS n FROM archived_memories WHERE user_id = 'u1' AND original_created_at >= %s "
        "AND original_created_at < %s",
        MAY,
    ).fetchone()["n"]
    assert may_rows == PER_MONTH
    result, plans = _search(conn, "kayaking with Tiago in May 2025", one_statement=one_statement)
    assert result.archive_scope == MAY and result.phase2_reason == "query_names_the_past"
    assert result.archived and all(MAY[0] <= h.provenance.created_at < MAY[1] for h in result.archived)
    assert plans and all("a_scope" in sql for sql, _ in plans)  # phase 1's BM25 statistics too
    for sql, plan in plans:
        reads = _archive_reads(plan)
        for node in reads:  # only a range scan of (user_id, original_created_at), nothing filtered away
            assert base_name(node.get("Index Name")) == "archived_user_created_id" or any(
                base_name(c.get("Index Name")) == "archived_user_created_id" for c in node.get("Plans", ())
            ), node["Node Type"]
            assert (
                node.get("Rows Removed by Filter", 0) == 0
                and node.get("Rows Removed by Index Recheck", 0) == 0
            )
        read = sum(n["Actual Rows"] * n["Actual Loops"] for n in reads)
        # The statement searching the archive reads May's rows once; phase 1 alone at most those.
        assert read == may_rows if "a_candidates" in sql else read <= may_rows


def test_without_a_time_or_with_the_scope_off_phase_2_reads_other_months(conn, archive):
    # The control for the test above: the same plan reader sees more than one month's rows.
    for query, scoped in (("kayaking with Tiago", True), ("kayaking with Tiago in May 2025", False)):
        result, plans = _search(conn, query, scoped=scoped, phase2="always")
        assert result.archive_scope is None
        [(sql, plan)] = plans
        assert "a_scope" not in sql
        assert sum(n["Actual Rows"] * n["Actual Loops"] for n in _archive_reads(plan)) > PER_MONTH


def test_the_scope_never_reads_another_users_rows(conn, archive):
    result, plans = _search(conn, "kayaking with Tiago in May 2025")
    assert {h.provenance.user_id for h in result.hits} == {"u1"} and len(result.archived) == 10


def test_month_scope_covers_whole_months_within_the_filters():
    def w(a: datetime, b: datetime) -> TimeWindow:
        return TimeWindow(a, b, "x")

    assert month_scope(None) is None
    assert month_scope(w(*MAY)) == MAY
    # "last week" across a month's end: both months, whole.
    week = w(datetime(2025, 4, 28, tzinfo=UTC), datetime(2025, 5, 5, tzinfo=UTC))
    assert month_scope(week) == (datetime(2025, 4, 1, tzinfo=UTC), MAY[1])
    dec = w(datetime(2024, 12, 1, tzinfo=UTC), datetime(2025, 1, 1, tzinfo=UTC))
    assert month_scope(dec) == (dec.since, datetime(2025, 1, 1, tzinfo=UTC))
    since = datetime(2025, 5, 10, tzinfo=UTC)
    assert month_scope(w(*MAY), since, None) == (since, MAY[1])
    assert month_scope(w(*MAY), None, datetime(2025, 4, 1, tzinfo=UTC)) == (MAY[0], MAY[0])  # empty
    assert month_scope(w(*MAY), since, since + timedelta(days=1)) == (since, since + timedelta(days=1))


def test_scope_sql_refuses_a_statement_it_cannot_confine():
    with pytest.raises(ValueError, match="outside the scope"):
        scope_sql("WITH x AS (SELECT 1) SELECT * FROM x, archived_memories z")
