"""Consolidation: monthly and yearly digests, facts with validity, key moments, their checks.

Real Postgres, real archival (run_batch with the extractive summarizer and a local object store).
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_lib.archival.pipeline import run_batch
from memory_lib.consolidation.digests import ExtractiveDigestBuilder, build_level
from memory_lib.consolidation.facts import RuleFactExtractor, build_facts, facts_about, who_is
from memory_lib.consolidation.monthly import (
    check_provenance,
    consolidate_month,
    drop_memory_from_consolidation,
    missing_digests,
    rebuild_for_user,
)
from memory_lib.consolidation.sources import period_bounds, user_months
from memory_lib.core.config import ArchivalCriteria
from memory_lib.core.errors import InvalidInputError
from memory_lib.core.models import NewMemory
from memory_lib.lifecycle.restore import restore_archive
from memory_lib.llm.embedding import HashingEmbedder
from memory_lib.storage.store import insert_memories
from testing.constants import TEST_DIM
from testing.dagster_helpers import END
from testing.factories import archival_services

EMB = HashingEmbedder(TEST_DIM)
BUILDER = ExtractiveDigestBuilder()
RULES = RuleFactExtractor()


def _archive(conn, store, key: str = "n1", as_of: datetime = END) -> None:
    services = archival_services(store, embedder=EMB)
    report = run_batch(conn, services, ArchivalCriteria(), batch_key=key, as_of=as_of, actor="test")
    assert report.gate_passed and report.archived > 0


def _consolidate_all(conn) -> None:
    for month in sorted({m for _, m in user_months(conn)}):
        consolidate_month(conn, month, builder=BUILDER, extractor=RULES, embedder=EMB)


def _add(conn, user: str, text: str, at: datetime, importance: float = 0.5) -> uuid.UUID:
    [mid] = insert_memories(
        conn,
        [
            NewMemory(
                user_id=user,
                content=text,
                embedding=EMB.embed([text])[0],
                embedding_model=EMB.model,
                created_at=at,
                importance_score=importance,
            )
        ],
        actor="test",
    )
    return mid


def _digest(conn, user: str, level: int, start: date):
    return conn.execute(
        "SELECT *, xmin::text AS row_version FROM memory_digests WHERE user_id = %s AND level = %s AND period_start = %s",
        (user, level, start),
    ).fetchone()


def _month_ids(conn, user: str, month: date) -> set[uuid.UUID]:
    start, end = period_bounds(2, month)
    rows = conn.execute(
        """SELECT id FROM memories WHERE user_id = %(u)s AND superseded_by IS NULL AND created_at >= %(s)s AND created_at < %(e)s
           UNION SELECT original_id FROM archived_memories WHERE user_id = %(u)s AND original_superseded_by IS NULL
             AND original_created_at >= %(s)s AND original_created_at < %(e)s""",
        {"u": user, "s": start, "e": end},
    ).fetchall()
    return {r["id"] for r in rows}


def test_digests_and_facts_built_offline_for_the_demo_history(conn, history, local_store):
    _archive(conn, local_store)
    _consolidate_all(conn)
    pairs = user_months(conn)
    assert len({u for u, _ in pairs}) == 3 and len(pairs) >= 12
    for user, month in pairs:
        d = _digest(conn, user, 2, month)
        assert d is not None, (user, month)
        assert set(d["source_memory_ids"]) == _month_ids(conn, user, month)
        assert d["summarizer_kind"] == "extractive-offline"
        body = d["body"]
        assert {"summary", "keyTopics", "keyPeople", "emotionalHighlights"} <= body.keys()
        assert body["counts"]["memories"] == len(d["source_memory_ids"])
        for h in body["emotionalHighlights"]:
            assert uuid.UUID(h["memoryId"]) in set(d["source_memory_ids"])
    assert missing_digests(conn, builder=BUILDER) == []
    # Level 3 from level 2, by the same function.
    user = pairs[0][0]
    year = build_level(conn, 3, user, pairs[0][1], builder=BUILDER, embedder=EMB)
    assert year.status == "built"
    y = _digest(conn, user, 3, date(pairs[0][1].year, 1, 1))
    months = conn.execute(
        "SELECT id, source_memory_ids FROM memory_digests WHERE user_id = %s AND level = 2 "
        "AND extract(year FROM period_start) = %s",
        (user, pairs[0][1].year),
    ).fetchall()
    assert set(y["source_digest_ids"]) == {m["id"] for m in months}
    assert set(y["source_memory_ids"]) == {i for m in months for i in m["source_memory_ids"]}
    # Facts: offline extractor named as such; core facts of the demo profiles are found with provenance.
    facts = conn.execute("SELECT * FROM memory_facts").fetchall()
    assert facts and {f["extractor"] for f in facts} == {"rules-offline-v1"}
    lives = [f for f in facts if f["predicate"] == "lives in"]
    assert {(f["user_id"], f["object"]) for f in lives} >= {("user-ada", "Lisbon"), ("user-bruno", "Porto")}
    manager = next(f for f in facts if f["user_id"] == "user-ada" and f["predicate"] == "has manager")
    who = facts_about(conn, "user-ada", manager["object"])
    assert who and all(set(f["source_memory_ids"]) <= set(history) for f in who)
    assert any(f["predicate"] == "has manager" and f["subject"] == "Ada" for f in who)
    moments = conn.execute("SELECT * FROM key_moments").fetchall()
    assert moments and all(m["importance"] >= 0.8 for m in moments)
    assert check_provenance(conn) == []


def test_a_superseded_fact_keeps_its_interval(conn):
    jan, mar, may = (datetime(2025, m, 10, tzinfo=UTC) for m in (1, 3, 5))
    lisbon = _add(conn, "u1", "Ada lives in Lisbon with two cats.", jan)
    porto = _add(conn, "u1", "Ada moved to Porto for the new job.", mar)
    again = _add(conn, "u1", "Ada lives in Porto and likes it.", may)
    _add(conn, "u2", "Ada lives in Berlin.", may)  # another user's Ada: never in u1's chain
    for m in (may, jan, mar):  # any order: the chain is recomputed from the rows
        build_facts(conn, "u1", m.date(), extractor=RULES, embedder=EMB)
    build_facts(conn, "u2", may.date(), extractor=RULES, embedder=EMB)
    rows = conn.execute(
        "SELECT object, valid_from, valid_to, source_memory_ids FROM memory_facts "
        "WHERE user_id = 'u1' AND predicate = 'lives in' ORDER BY valid_from"
    ).fetchall()
    assert [(r["object"], r["valid_from"], r["valid_to"]) for r in rows] == [
        ("Lisbon", jan, mar),
        ("Porto", mar, None),
        ("Porto", may, None),
    ]
    assert [r["source_memory_ids"] for r in rows] == [[lisbon], [porto], [again]]
    # Rebuilding an unchanged month writes nothing; the old value stays, closed.
    before = conn.execute("SELECT id, xmin::text AS x FROM memory_facts ORDER BY id").fetchall()
    assert build_facts(conn, "u1", jan.date(), extractor=RULES, embedder=EMB).status == "unchanged"
    assert conn.execute("SELECT id, xmin::text AS x FROM memory_facts ORDER BY id").fetchall() == before
    berlin = conn.execute("SELECT valid_to FROM memory_facts WHERE user_id = 'u2'").fetchall()
    assert [r["valid_to"] for r in berlin] == [None]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["u1", "u2", "u3"]),
            st.integers(0, 3),
            st.integers(1, 27),
            st.sampled_from(
                [
                    "Maya Patel met Ada about Project Atlas.",
                    "Ada flew to Kyoto.",
                    "Ada lives in Lisbon.",
                    "Paid EUR 40 for the bill.",
                ]
            ),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_a_users_digests_never_include_another_users_memories(conn, items):
    # DELETE, not one TRUNCATE of five tables: on Citus that can deadlock with itself across its connections.
    for table in ("key_moments", "memory_facts", "memory_digests", "consolidation_builds", "memories"):
        conn.execute(
            f"DELETE FROM {table}"
        )  # memories: its memory_retention rows go with it (ON DELETE CASCADE)
    owner = {}
    for user, month, day, text in items:
        owner[_add(conn, user, text, datetime(2025, 1 + month, day, tzinfo=UTC))] = user
    _consolidate_all(conn)
    for user in ("u1", "u2", "u3"):
        build_level(conn, 3, user, date(2025, 1, 1), builder=BUILDER, embedder=EMB)
    digests = conn.execute(
        "SELECT user_id, level, period_start, source_memory_ids FROM memory_digests"
    ).fetchall()
    assert digests
    for d in digests:
        assert {owner[i] for i in d["source_memory_ids"]} == {d["user_id"]}
        if d["level"] == 2:
            assert set(d["source_memory_ids"]) == _month_ids(conn, d["user_id"], d["period_start"])
    for f in conn.execute("SELECT user_id, source_memory_ids FROM memory_facts").fetchall():
        assert {owner[i] for i in f["source_memory_ids"]} == {f["user_id"]}
    assert check_provenance(conn) == []


def test_a_change_to_a_covered_memory_rebuilds_and_nothing_else_writes(conn, history, local_store):
    _archive(conn, local_store)
    _consolidate_all(conn)
    user, month = next(
        (u, m)
        for u, m in user_months(conn)
        if conn.execute(
            "SELECT 1 FROM archived_memories WHERE user_id = %s AND "
            "date_trunc('month', original_created_at)::date = %s",
            (u, m),
        ).fetchone()
    )
    first = _digest(conn, user, 2, month)

    def again():
        return build_level(conn, 2, user, month, builder=BUILDER, embedder=EMB)

    assert again().status == "unchanged"
    assert _digest(conn, user, 2, month)["row_version"] == first["row_version"]  # no write at all
    # Restore: the memory changes tier, the fingerprint changes, the digest is rebuilt.
    archived = conn.execute(
        "SELECT original_id FROM archived_memories WHERE user_id = %s AND "
        "date_trunc('month', original_created_at)::date = %s LIMIT 1",
        (user, month),
    ).fetchone()
    restore_archive(conn, local_store, user_id=user, original_id=archived["original_id"], actor="test")
    stale = missing_digests(conn, builder=BUILDER, months=[month])
    assert [(m["user_id"], m["problem"]) for m in stale] == [
        (user, "stale digest")
    ]  # the freshness check sees it
    assert again().status == "built"
    assert missing_digests(conn, builder=BUILDER, months=[month]) == []
    second = _digest(conn, user, 2, month)
    assert second["source_fingerprint"] != first["source_fingerprint"]
    assert set(second["source_memory_ids"]) == set(first["source_memory_ids"])
    # Supersede: the memory leaves the digest.
    conn.execute(  # the id as a parameter: Citus refuses a VOLATILE function in an UPDATE
        "UPDATE memories SET superseded_by = %s, updated_at = now() WHERE id = %s",
        (uuid.uuid4(), archived["original_id"]),
    )
    assert again().status == "built"
    third = _digest(conn, user, 2, month)
    assert archived["original_id"] not in third["source_memory_ids"]
    assert third["source_fingerprint"] not in (first["source_fingerprint"], second["source_fingerprint"])
    # Archive (another night): the tier changes again, and so does the digest.
    conn.execute("UPDATE memories SET superseded_by = NULL WHERE id = %s", (archived["original_id"],))
    again()
    before = _digest(conn, user, 2, month)["source_fingerprint"]
    # A restore is a new start: the restored memory is archived again once the criteria, counted from
    # the restore (the database clock), select it; a night past the force-age limit does.
    _archive(conn, local_store, key="n2", as_of=datetime.now(UTC) + timedelta(days=400))
    assert conn.execute(
        "SELECT 1 FROM archived_memories WHERE user_id = %s AND original_id = %s",
        (user, archived["original_id"]),
    ).fetchone()
    assert again().status == "built" and _digest(conn, user, 2, month)["source_fingerprint"] != before


def test_checks_fail_on_dangling_or_cross_user_provenance(conn, history):
    consolidate_month(conn, history_month(conn), builder=BUILDER, extractor=RULES, embedder=EMB)
    assert check_provenance(conn) == []
    digest = conn.execute("SELECT id, user_id FROM memory_digests ORDER BY user_id LIMIT 1").fetchone()
    other = conn.execute(
        "SELECT id FROM memories WHERE user_id <> %s LIMIT 1", (digest["user_id"],)
    ).fetchone()["id"]
    ghost = uuid.uuid4()
    conn.execute(
        "UPDATE memory_digests SET source_memory_ids = source_memory_ids || ARRAY[%s, %s]::uuid[] "
        "WHERE id = %s",
        (ghost, other, digest["id"]),
    )
    fact = conn.execute(
        "SELECT id, user_id FROM memory_facts WHERE user_id = %s LIMIT 1", (digest["user_id"],)
    ).fetchone()
    conn.execute(
        "UPDATE memory_facts SET source_memory_ids = ARRAY[%s]::uuid[] WHERE id = %s", (other, fact["id"])
    )
    problems = {(p.table, p.memory_id, p.problem) for p in check_provenance(conn)}
    assert problems == {
        ("memory_digests", str(ghost), "missing"),
        ("memory_digests", str(other), "other user"),
        ("memory_facts", str(other), "other user"),
    }
    # Freshness: an archived month without its digest is reported.
    conn.execute("DELETE FROM memory_digests")
    # The backup object first: Citus plans no INSERT whose VALUES read another table (a subquery).
    backup = conn.execute(
        "INSERT INTO backup_objects (user_id, ref) VALUES ('u9', 'x') RETURNING id"
    ).fetchone()["id"]
    conn.execute(
        """INSERT INTO archived_memories (original_id, user_id, summary, summary_embedding, summary_embedding_model,
        original_category, original_embedding_model, original_updated_at, importance_score, archived_at, original_created_at,
        archive_reason, backup_object, backup_digest, backup_size_bytes, summary_model, summarizer_kind)
        VALUES (gen_random_uuid(), 'u9', 'Ada met Maya.', %s, 'm', 'episodic', 'm', now(), 0.1, now(), '2024-02-03', 'force_age',
                %s, sha256(''), 1, 'm', 'k')""",
        (EMB.embed(["Ada met Maya."])[0].astype("float16"), backup),
    )
    assert [(r["user_id"], r["month"]) for r in missing_digests(conn)] == [("u9", date(2024, 2, 1))]


def history_month(conn) -> date:
    return conn.execute("SELECT date_trunc('month', min(created_at))::date AS m FROM memories").fetchone()[
        "m"
    ]


def test_forget_hooks_drop_then_rebuild(conn, history):
    user = "user-ada"
    rebuild_for_user(conn, user, builder=BUILDER, extractor=RULES, embedder=EMB)
    fact = conn.execute(
        "SELECT * FROM memory_facts WHERE user_id = %s AND predicate = 'lives in' AND object = 'Lisbon'",
        (user,),
    ).fetchone()
    [gone] = fact["source_memory_ids"]
    counts = drop_memory_from_consolidation(conn, user, gone)
    assert counts["memory_digests"] >= 1 and counts["memory_facts_deleted"] >= 1
    assert not conn.execute(
        "SELECT 1 FROM memory_digests WHERE %s = ANY(source_memory_ids)", (gone,)
    ).fetchone()
    assert not conn.execute(
        "SELECT 1 FROM memory_facts WHERE %s = ANY(source_memory_ids)", (gone,)
    ).fetchone()
    conn.execute("DELETE FROM memories WHERE id = %s", (gone,))  # what a forget does to the memory itself
    out = rebuild_for_user(conn, user, builder=BUILDER, extractor=RULES, embedder=EMB)
    assert out["digests_built"] >= 1
    assert check_provenance(conn) == [] and missing_digests(conn, builder=BUILDER) == []
    assert not [f for f in facts_about(conn, user, "Lisbon") if f["predicate"] == "lives in"]
    with pytest.raises(InvalidInputError, match="user_id"):
        drop_memory_from_consolidation(conn, "", gone)
    with pytest.raises(InvalidInputError, match="level"):
        build_level(conn, 1, user, date(2025, 1, 1), builder=BUILDER, embedder=EMB)


def test_yearly_level_is_the_same_function_and_follows_months(conn):
    a = _add(conn, "u1", "Maya Patel reviewed Project Atlas with Ada.", datetime(2024, 3, 5, tzinfo=UTC), 0.9)
    _add(conn, "u1", "Ada flew to Kyoto on 12 May 2024.", datetime(2024, 5, 2, tzinfo=UTC))
    _consolidate_all(conn)
    y = build_level(conn, 3, "u1", date(2024, 7, 1), builder=BUILDER, embedder=EMB)
    assert y.status == "built" and y.sources == 2 and y.period_start == date(2024, 1, 1)
    assert build_level(conn, 3, "u1", date(2024, 7, 1), builder=BUILDER, embedder=EMB).status == "unchanged"
    conn.execute(
        "UPDATE memories SET importance_score = 0.95, updated_at = now() + interval '1 s' WHERE id = %s", (a,)
    )
    consolidate_month(conn, date(2024, 3, 1), builder=BUILDER, extractor=RULES, embedder=EMB)
    assert build_level(conn, 3, "u1", date(2024, 7, 1), builder=BUILDER, embedder=EMB).status == "built"
    decade = build_level(conn, 4, "u1", date(2024, 7, 1), builder=BUILDER, embedder=EMB)
    assert decade.status == "built" and decade.period_start == date(2020, 1, 1)
    assert "Maya Patel" in _digest(conn, "u1", 4, date(2020, 1, 1))["body"]["keyPeople"]


def test_who_is_answered_from_facts_when_the_memories_are_archived(conn, local_store):
    old = END - timedelta(days=200)
    ids = [
        _add(conn, "u1", "Ada's manager is Sarah Chen; their 1:1 is every Monday.", old, 0.1),
        _add(conn, "u1", "Had a standup with Sarah Chen about Project Atlas and the Q3 budget.", old, 0.1),
        _add(conn, "u2", "Bruno's manager is Sarah Chen.", old, 0.1),
    ]
    _archive(conn, local_store)
    assert not conn.execute("SELECT 1 FROM memories WHERE id = ANY(%s)", (ids,)).fetchone()  # all archived
    for user in ("u1", "u2"):
        build_facts(conn, user, old.date(), extractor=RULES, embedder=EMB)
    answer = who_is(conn, "u1", "sarah chen")
    assert [(a["subject"], a["predicate"], a["object"]) for a in answer] == [
        ("Ada", "has manager", "Sarah Chen"),
        ("Sarah Chen", "works with", "Project Atlas"),
    ]
    assert [a["source_memory_ids"] for a in answer] == [
        [ids[0]],
        [ids[1]],
    ]  # provenance: u1's archived memories only
    assert answer[0]["valid_to"] is None and answer[0]["extractors"] == {"rules-offline-v1"}
    assert who_is(conn, "u3", "Sarah Chen") == []
    with pytest.raises(InvalidInputError, match="name"):
        who_is(conn, "u1", "  ")


def test_a_fact_written_without_source_month_gets_its_valid_from_month(conn):
    """Writers that predate the builders' columns (search tests, hand-made facts) still insert."""
    conn.execute(
        """INSERT INTO memory_facts (user_id, kind, subject, predicate, object, valid_from, source_memory_ids,
               extractor, embedding, embedding_model)
           VALUES ('u1', 'person', 'Ada', 'knows', 'Maya', '2025-03-31 23:30+00', %s, 'hand', %s, 'm')""",
        ([uuid.uuid4()], EMB.embed(["Ada knows Maya"])[0]),
    )
    row = conn.execute("SELECT source_month, single_valued FROM memory_facts").fetchone()
    assert (row["source_month"], row["single_valued"]) == (date(2025, 3, 1), False)
    assert [p.problem for p in check_provenance(conn)] == ["missing"]
