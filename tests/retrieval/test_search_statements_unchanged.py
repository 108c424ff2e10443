"""The search statements' faster forms return what the forms they replaced returned: the same candidates
with the same scores, so the same ranking. The reference statements are the current ones with the
replaced parts put back (each archive match's document computed from its summary, each match's idf sum
by a subquery per match)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.ranking import rank_candidates
from memory_lib.retrieval.sql import (
    ARCHIVED_SEARCH_SQL,
    BOTH_TIERS_SQL,
    HOT_SEARCH_SQL,
    SEARCH_SETTINGS_SQL,
    WITH_SUPERSEDED_SQL,
    homes_of,
    pruned,
    search_session_sql,
    statement_params,
)
from memory_lib.retrieval.types import SearchFilters
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.factories import FirstSentenceSummarizer, archival_services

ADDED = datetime(2025, 1, 10, 12, 0, tzinfo=UTC)
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)

PEOPLE = ("Priya", "Tomasz", "Okafor", "Lumi", "Marlow")
THINGS = ("ferry", "cello", "passport", "dentist", "harbour", "dinner", "boat", "garden")
PLACES = ("Lisbon", "Kraków", "Port Ellery", "the clinic", "the market")
QUERIES = (
    "When does the ferry to Port Ellery leave?",
    "Who teaches Tomasz the cello?",
    "What did Priya say about the garden in Lisbon?",
    "dentist appointment at the clinic",
    "boat harbour dinner",
    "Where is Okafor's passport?",
    "What happened at the market with Lumi and Marlow?",
    "zebra",  # no memory has it
)


def _seed(conn: Any, store: Any) -> None:
    """Two users' chats, a few minutes apart in bursts (context neighbours), many sharing words (ties);
    the older two thirds archived with fingerprints."""
    rng = np.random.default_rng(7)
    embedder = HashingEmbedder(TEST_DIM)
    rows = []
    for user in ("u1", "u2"):
        at = ADDED - timedelta(days=120)
        for i in range(240):
            p, t, q = rng.choice(PEOPLE), rng.choice(THINGS), rng.choice(PLACES)
            text = f"{p} mentioned the {t} near {q}. Note {i % 17}: {rng.choice(THINGS)} again."
            at += timedelta(minutes=int(rng.choice([1, 2, 3, 240])))
            rows.append(
                {
                    "user_id": user,
                    "content": text,
                    "embedding": embedder.embed([text])[0],
                    "embedding_model": embedder.model,
                    "created_at": at,
                }
            )
    insert_memories(conn, rows, actor="test", now=ADDED)
    criteria = ArchivalCriteria(
        min_age_days=30, force_archive_age_days=30, max_importance_score=1.0, exempt_categories=()
    )
    services = archival_services(store, summarizer=FirstSentenceSummarizer())
    as_of = rows[160]["created_at"] + timedelta(days=30)  # u1's first 160 memories and some of u2's
    report = run_batch(
        conn, services, criteria, batch_key=f"b-{uuid.uuid4().hex[:8]}", as_of=as_of, actor="test"
    )
    assert report.status.archived > 200 and report.status.failed == 0
    conn.execute("VACUUM (ANALYZE) memories, archived_memories")


_DOCUMENT = "(to_tsvector('english'::regconfig, a.summary) || coalesce(a.lexemes, ''::tsvector))"


_BLOCK = re.compile(
    r"(\w)_hits AS MATERIALIZED \(\s+SELECT (.*?) AS tsv, sel\.tsq, [^\n]* AS size\n(\s+FROM .*?LIMIT %\(match_cap\)s)"
    r"\s+\), \1_idf AS MATERIALIZED .*?\), \1_bm25 AS MATERIALIZED \(",
    re.S,
)
_OLD_BLOCK = (
    r"\1_hits AS MATERIALIZED (SELECT \2 AS tsv, sel.tsq\n\3\n), \1_matched AS ("
    r"SELECT h.id, h.created, h.key, ts_rank_cd(h.tsv, h.tsq) AS cd, "
    r"(SELECT coalesce(sum(i.w), 0) FROM idf i WHERE h.tsv @@ i.tq) AS idf_sum FROM \1_hits h"
    r"), \1_bm25 AS MATERIALIZED ("
)


def _reference(sql: str) -> str:
    """`sql` as it was before: each match's idf sum by a subquery per match, its ts_rank_cd computed
    whatever its idf sum, and each archive match's document computed from its summary."""
    old, n_block = _BLOCK.subn(_OLD_BLOCK, sql)
    old = re.sub(r"\ba\.document\b", _DOCUMENT, old)  # the stored document, where the statement reads it
    assert n_block == ("m_exact AS" in sql) + ("a_exact AS" in sql), "the statements changed shape"
    return old


def _run(conn: Any, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.transaction():  # under the search's own settings, as search_plan runs it
        session = conn.execute(search_session_sql(100)).fetchone()
        if session["partitioned"]:
            session = conn.execute(
                SEARCH_SETTINGS_SQL, {"ef_search": "100", "user_id": params["user_id"]}
            ).fetchone()
        homes = homes_of(session)
        return conn.execute(pruned(sql, homes) if homes else sql, params, prepare=False).fetchall()


def _key(row: dict[str, Any]) -> tuple[str, str]:
    return (row.get("tier") or "", str(row["memory_id"]))


@pytest.mark.parametrize("superseded", [False, True], ids=["live", "with-superseded"])
def test_the_search_statements_return_the_candidates_and_scores_of_their_reference_forms(
    conn, local_store, superseded
):
    _seed(conn, local_store)
    conn.execute(  # a superseded memory in each tier for the audit statements
        """UPDATE memories SET superseded_by = (SELECT id FROM memories WHERE user_id = 'u1'
                                                ORDER BY created_at DESC LIMIT 1)
           WHERE user_id = 'u1' AND id = (SELECT id FROM memories WHERE user_id = 'u1'
                                          ORDER BY created_at DESC OFFSET 1 LIMIT 1)"""
    )
    conn.execute(
        """UPDATE archived_memories SET original_superseded_by = (SELECT id FROM memories WHERE user_id = 'u1'
                                                               ORDER BY created_at DESC LIMIT 1)
           WHERE user_id = 'u1' AND id = (SELECT id FROM archived_memories WHERE user_id = 'u1'
                                          ORDER BY original_created_at LIMIT 1)"""
    )
    config = RetrievalConfig()
    embedder = HashingEmbedder(TEST_DIM)
    compared = 0
    for sql in (HOT_SEARCH_SQL, ARCHIVED_SEARCH_SQL, BOTH_TIERS_SQL):
        stmt = WITH_SUPERSEDED_SQL[sql] if superseded else sql
        reference = _reference(stmt)
        assert reference != stmt
        for user in ("u1", "u2"):
            for query in QUERIES:
                params = statement_params(
                    user, embedder.embed([query])[0], query, config, SearchFilters()
                ) | {"pool": 40, "archived_pool": 40}
                new, old = _run(conn, stmt, params), _run(conn, reference, params)
                assert sorted(map(_key, new)) == sorted(map(_key, old)), query
                by_key = {_key(r): r for r in old}
                for row in new:
                    ref = by_key[_key(row)]
                    assert row.keys() == ref.keys()
                    for col, value in row.items():
                        if isinstance(value, float):
                            assert value == pytest.approx(ref[col], rel=1e-12, abs=1e-12), (query, col)
                        else:
                            assert value == ref[col], (query, col)
                ranked = [
                    rank_candidates(
                        rows,
                        sources=[r.get("tier") or ("archived" if r["archive_id"] else "hot") for r in rows],
                        config=config,
                        tags=(),
                        now=NOW,
                    )
                    for rows in (new, old)
                ]
                assert [h.id for h in ranked[0]] == [h.id for h in ranked[1]], query
                compared += len(new)
                if query != "zebra":
                    assert any(r["text_rank"] is not None for r in new), query
    assert compared > 1000
