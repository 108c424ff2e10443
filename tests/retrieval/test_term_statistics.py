"""The full-text arm's BM25 statistics (sql/020): kept exact on write through every path that moves a
memory, read per user and per query term only, and archive rows found by their original's words
whatever the summarizer kept (the lexical fingerprint)."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria, RetentionConfig
from memory_lib.lifecycle import stubs
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.retrieval.sql import BOTH_TIERS_SQL, MATCH_CAP, search_session_sql, statement_params
from memory_lib.retrieval.types import SearchFilters
from memory_lib.storage.store import insert_memories
from testing.citus import citus_urls
from testing.constants import TEST_DIM
from testing.explain import PLAN_CONFIG, base_name, plan_nodes
from testing.factories import FirstSentenceSummarizer, archival_services, make_client

ADDED = datetime(2025, 1, 10, 12, 0, tzinfo=UTC)
ARCHIVED = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)

TEXTS = (
    "Booked the dentist for 14 June at the Marlow clinic, second floor.",
    "Priya's nephew Tomasz starts at the Kraków conservatory in September.",
    "The harbour ferry to Port Ellery leaves at 7:40 on weekdays.",
    "Paid 80 EUR deposit for the anniversary dinner at Casa Lumi.",
    "Reminder: renew the passport before the Lisbon trip in March.",
    "Tomasz plays the cello; his teacher is Ms Okafor.",
)


def _archive_all(conn: Any, store: Any, summarizer: Any = None) -> int:
    services = archival_services(store, summarizer=summarizer)
    # everything older than 30 days, whatever its importance or category
    criteria = ArchivalCriteria(
        min_age_days=30, force_archive_age_days=30, max_importance_score=1.0, exempt_categories=()
    )
    report = run_batch(
        conn, services, criteria, batch_key=f"b-{uuid.uuid4().hex[:8]}", as_of=ARCHIVED, actor="test"
    )
    assert report.gate_passed and report.status.failed == 0
    return report.status.archived


def _stats(conn: Any) -> tuple[set[tuple[str, str, int]], set[tuple[str, int, int]]]:
    terms = {(r["user_id"], r["lexeme"], r["df"]) for r in conn.execute("SELECT * FROM user_term_stats")}
    corpus = {
        (r["user_id"], r["docs"], r["lexemes"]) for r in conn.execute("SELECT * FROM user_corpus_stats")
    }
    return terms, corpus


def _from_scratch(conn: Any) -> tuple[set[tuple[str, str, int]], set[tuple[str, int, int]]]:
    """The statistics computed from the tables themselves, without the view the migration defines: each
    tier's counts read on their own and added here (a UNION ALL of both tiers under one GROUP BY is a
    join Citus cannot plan)."""
    tiers = (
        "SELECT user_id, content_tsv AS doc FROM memories WHERE superseded_by IS NULL",
        """SELECT user_id, to_tsvector('english', summary) || coalesce(lexemes, '') AS doc
           FROM archived_memories WHERE original_superseded_by IS NULL""",
    )
    terms: Counter[tuple[str, str]] = Counter()
    docs: Counter[str] = Counter()
    lexemes: Counter[str] = Counter()
    for tier in tiers:
        for r in conn.execute(
            f"SELECT d.user_id, l, count(*) AS n FROM ({tier}) d, unnest(tsvector_to_array(d.doc)) l GROUP BY 1, 2"
        ):
            terms[r["user_id"], r["l"]] += r["n"]
        for r in conn.execute(
            f"SELECT d.user_id, count(*) AS n, sum(length(d.doc)) AS len FROM ({tier}) d GROUP BY 1"
        ):
            docs[r["user_id"]] += r["n"]
            lexemes[r["user_id"]] += r["len"]
    return {(u, lx, n) for (u, lx), n in terms.items()}, {(u, n, lexemes[u]) for u, n in docs.items()}


def _assert_exact(conn: Any, step: str) -> None:
    kept, scratch = _stats(conn), _from_scratch(conn)
    assert kept[1] == scratch[1], f"corpus statistics after {step}"
    assert kept[0] == scratch[0], f"term statistics after {step}: {sorted(kept[0] ^ scratch[0])[:6]}"


def test_statistics_stay_exact_through_add_update_archive_restore_stub_and_forget(conn, local_store):
    client = make_client(conn, local_store)
    ids = {}
    for user in ("u1", "u2"):
        for text in TEXTS:
            ids[user, text] = client.add(user, text, now=ADDED).memory_id
    _assert_exact(conn, "add")
    assert _stats(conn)[1] and {u for u, _, _ in _stats(conn)[1]} == {"u1", "u2"}

    client.update(
        "u1", ids["u1", TEXTS[0]], "Booked the dentist for 21 June at the Marlow clinic.", now=ADDED
    )
    client.update("u1", ids["u1", TEXTS[1]], importance=0.9, now=ADDED)  # no text change: no document change
    _assert_exact(conn, "update")

    assert _archive_all(conn, local_store) >= 10
    conn.execute("UPDATE archived_memories SET archived_at = %s", (ARCHIVED,))  # the night it ran
    _assert_exact(conn, "archive")

    archived = conn.execute("SELECT id, original_id FROM archived_memories WHERE user_id = 'u1'").fetchall()
    client.restore("u1", archive_id=archived[0]["id"], now=ARCHIVED)
    _assert_exact(conn, "restore")

    due = ARCHIVED + timedelta(days=RetentionConfig().stub_after_days + 1)
    assert stubs.convert(conn, local_store, due, stub_after_days=RetentionConfig().stub_after_days).due > 0
    _assert_exact(conn, "stub")

    client.forget("u1", archived[1]["original_id"], now=due)  # an archived memory
    client.forget("u1", archived[0]["original_id"], now=due)  # the restored, hot one
    _assert_exact(conn, "forget")
    client.forget_user("u2", now=due)
    _assert_exact(conn, "forget_user")
    assert all(u == "u1" for u, _, _ in _stats(conn)[0])

    if citus_urls() is not None:
        return  # TRUNCATE of a distributed table deadlocks on Citus (docs/how-to/distributed-postgres.md, limits)
    conn.execute("TRUNCATE memories CASCADE")  # archive rows stay: their statistics too
    _assert_exact(conn, "truncate")
    assert _stats(conn)[1]


def test_an_archive_row_is_found_by_a_rare_name_its_summary_dropped(conn, local_store):
    client = make_client(conn, local_store)
    text = "We walked along the harbour. Later Zbigniew showed me his boat, the Kestrel, at Port Ellery."
    target = client.add("u1", text, now=ADDED).memory_id
    for i in range(30):
        client.add("u1", f"We walked along the harbour and talked about boats, day {i}.", now=ADDED)
    _archive_all(conn, local_store, FirstSentenceSummarizer())
    row = conn.execute("SELECT summary FROM archived_memories WHERE original_id = %s", (target,)).fetchone()
    assert "Zbigniew" not in row["summary"] and "Kestrel" not in row["summary"]

    for question in ("Who is Zbigniew?", "What is the Kestrel?"):
        hits = client.search("u1", question, now=ARCHIVED)
        assert hits.hits[0].provenance.memory_id == target, question
        assert hits.hits[0].source == "archived"


def _by_user(cond: str) -> bool:
    """An index condition on u2's key: a literal on one node, the statement's parameter on a Citus worker."""
    return re.search(r"user_id = ('u2'|\$\d+)", cond) is not None


def test_the_lexical_leg_reads_the_query_terms_postings_of_one_user(conn, local_store):
    """EXPLAIN ANALYZE of both tiers' statement: the statistics are read by index, one row per query
    term of this user; the postings read are those of the user's rarest query term only ('wool', a
    third of the user's memories; 'cargo' is in all of them and only scores)."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(3000):
        v = rng.normal(size=TEST_DIM).astype(np.float32)
        rows.append(
            {
                "user_id": f"u{i % 4}",
                "content": f"Harbour log {i}: cargo {['salt', 'tea', 'wool'][i % 3]} and tides",
                "embedding": v / np.linalg.norm(v),
                "embedding_model": HashingEmbedder(TEST_DIM).model,
                "created_at": ADDED - timedelta(days=200) + timedelta(minutes=7 * i),
            }
        )
    insert_memories(conn, rows, actor="test", now=ADDED)
    _archive_all(conn, local_store)
    conn.execute("VACUUM (ANALYZE) memories, archived_memories, user_term_stats, user_corpus_stats")
    query = "cargo of wool"
    embedding = HashingEmbedder(TEST_DIM).embed([query])[0]
    params = statement_params("u2", embedding, query, PLAN_CONFIG, SearchFilters()) | {
        "pool": 40,
        "archived_pool": 40,
    }
    with conn.transaction():  # under the search's own settings, which reach a Citus worker too
        conn.execute(search_session_sql(100))
        plan = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + BOTH_TIERS_SQL, params, prepare=False
        ).fetchone()
    nodes = plan_nodes(plan["QUERY PLAN"][0]["Plan"])
    # (the exact vector arm may read the user's rows from the same index, by user_id alone: not postings)
    lexical = [
        n
        for n in nodes
        if base_name(n.get("Index Name")) in ("memories_user_tsv", "archived_user_lexemes")
        and "@@" in n["Index Cond"]
    ]
    assert {base_name(n["Index Name"]) for n in lexical} == {"memories_user_tsv", "archived_user_lexemes"}
    for n in lexical:
        assert n["Node Type"] == "Bitmap Index Scan" and _by_user(n["Index Cond"]), n
    for n in nodes:  # no other node filters memories by their text
        if (
            base_name(n.get("Relation Name")) in ("memories", "archived_memories")
            and n["Node Type"] == "Seq Scan"
        ):
            assert "@@" not in n.get("Filter", ""), n
    df = {r["lexeme"]: r["df"] for r in conn.execute("SELECT * FROM user_term_stats WHERE user_id = 'u2'")}
    assert df["cargo"] > MATCH_CAP >= df["wool"] > 0
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in lexical) == df["wool"]
    stats = [n for n in nodes if base_name(n.get("Relation Name")) == "user_term_stats"]
    assert stats and all(_by_user(n.get("Index Cond", "")) for n in stats), stats
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in stats) == 2  # 'of' is a stop word


def test_a_users_search_never_reads_another_users_statistics(conn, local_store):
    client = make_client(conn, local_store)
    for text in TEXTS:
        client.add("u1", text, now=ADDED)

    def scores() -> list[tuple[uuid.UUID, float | None, float]]:
        result = client.search("u1", "Tomasz cello conservatory", phase2="never", now=ADDED)
        return [(h.provenance.memory_id, h.scores.text_rank, h.scores.final) for h in result.hits]

    before = scores()
    assert before and before[0][1] is not None
    for i in range(40):  # another user says the same words a lot: u1's idf must not move
        client.add("u2", f"Tomasz practised the cello at the conservatory, session {i}.", now=ADDED)
    assert scores() == before
    u1_terms = {
        r["lexeme"]: r["df"] for r in conn.execute("SELECT * FROM user_term_stats WHERE user_id = 'u1'")
    }
    assert u1_terms["tomasz"] == 2
