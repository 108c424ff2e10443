"""A covered memory's change makes its digest stale, and the next build rewrites it (forget, restore,
supersede).

Each change goes through the product's own API (MemoryClient.restore / update / forget) on a month of
two users, some of its memories archived by a real run_batch, consolidated by consolidate_month and
build_level(3). Real Postgres, local object store.
"""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import pytest

from memory_lib.archival.pipeline import run_batch
from memory_lib.consolidation.digests import ExtractiveDigestBuilder, build_level
from memory_lib.consolidation.facts import RuleFactExtractor
from memory_lib.consolidation.monthly import check_provenance, consolidate_month, missing_digests
from memory_lib.consolidation.sources import period_bounds
from memory_lib.core.config import ArchivalCriteria, RetrievalConfig
from memory_lib.llm.embedding import HashingEmbedder
from testing.constants import TEST_DIM
from testing.factories import archival_services, make_client

EMB = HashingEmbedder(TEST_DIM)
BUILDER = ExtractiveDigestBuilder()
RULES = RuleFactExtractor()
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
OLD = datetime(2024, 11, 12, 9, 0, tzinfo=UTC)  # 201 days before NOW: archived unless important
MONTH, YEAR = date(2024, 11, 1), date(2024, 1, 1)
# (name, text, importance): importance <= 0.3 is archived by the default criteria, 0.9 stays hot.
NOTES = {
    "u1": [
        ("lives", "Ada lives in Lisbon with two cats.", 0.1),
        ("manager", "Ada's manager is Sarah Chen; their 1:1 is every Monday.", 0.1),
        ("tea", "Ada prefers green tea in the morning.", 0.9),
        ("dinner", "Paid EUR 40 for the dinner at Tasca.", 0.1),
    ],
    "u2": [
        ("lives", "Bruno lives in Porto near the river.", 0.1),
        ("manager", "Bruno's manager is Sarah Chen.", 0.1),
        ("coffee", "Bruno prefers a cortado in the morning.", 0.9),
    ],
}


def _consolidate(conn, month: date = MONTH) -> dict[str, str]:
    """consolidate_month for both users, then their yearly digests; the statuses per (user, level)."""
    report = consolidate_month(conn, month, builder=BUILDER, extractor=RULES, embedder=EMB)
    out: dict[str, str] = {f"{o.user_id}:2": o.status for o in report.digests}
    out |= {f"{o.user_id}:facts": o.status for o in report.facts}
    for user in NOTES:
        out[f"{user}:3"] = build_level(conn, 3, user, month, builder=BUILDER, embedder=EMB).status
    return out


def _digest(conn, user: str, level: int, start: date):
    return conn.execute(
        "SELECT *, xmin::text AS row_version FROM memory_digests "
        "WHERE user_id = %s AND level = %s AND period_start = %s",
        (user, level, start),
    ).fetchone()


def _facts_citing(conn, user: str, memory_id: uuid.UUID) -> list[tuple[str, str, str]]:
    rows = conn.execute(
        "SELECT subject, predicate, object FROM memory_facts WHERE user_id = %s "
        "AND %s = ANY(source_memory_ids) ORDER BY 1, 2, 3",
        (user, memory_id),
    ).fetchall()
    return [(r["subject"], r["predicate"], r["object"]) for r in rows]


def _month_ids(conn, user: str, month: date) -> set[uuid.UUID]:
    """The month's current memories of the user, hot or archived (what its digest must cover)."""
    start, end = period_bounds(2, month)
    rows = conn.execute(
        """SELECT id FROM memories WHERE user_id = %(u)s AND superseded_by IS NULL
             AND created_at >= %(s)s AND created_at < %(e)s
           UNION SELECT original_id FROM archived_memories WHERE user_id = %(u)s AND original_superseded_by IS NULL
             AND original_created_at >= %(s)s AND original_created_at < %(e)s""",
        {"u": user, "s": start, "e": end},
    ).fetchall()
    return {r["id"] for r in rows}


def _derived(conn, user: str) -> dict[str, list[str]]:
    """Every consolidation row of the user, whole, with its row version: equal = not written."""
    return {
        t: [
            r["r"]
            for r in conn.execute(
                f"SELECT t::text || ' ' || t.xmin::text AS r FROM {t} t WHERE user_id = %s ORDER BY 1",
                (user,),
            ).fetchall()
        ]
        for t in ("memory_digests", "memory_facts", "key_moments", "consolidation_builds")
    }


@pytest.fixture
def month(conn, local_store) -> dict[str, dict[str, uuid.UUID]]:
    """Both users' November 2024 notes; the unimportant ones archived; the month and year consolidated."""
    client = make_client(
        conn, local_store, embedder=EMB, retrieval=RetrievalConfig(near_duplicate_threshold=1.0)
    )
    ids = {
        user: {
            name: client.add(user, text, importance=imp, now=OLD + timedelta(hours=i)).memory_id
            for i, (name, text, imp) in enumerate(notes)
        }
        for user, notes in NOTES.items()
    }
    services = archival_services(local_store, embedder=EMB)
    report = run_batch(conn, services, ArchivalCriteria(), batch_key="n1", as_of=NOW, actor="test")
    assert report.gate_passed and report.status.archived == 5  # all but the two important notes
    assert set(_consolidate(conn).values()) == {"built"}
    assert missing_digests(conn, builder=BUILDER, months=[MONTH]) == []
    for user in NOTES:
        assert set(_digest(conn, user, 2, MONTH)["source_memory_ids"]) == set(ids[user].values())
    # The rule extractor read the archived summaries: the facts the changes below must follow are there.
    assert _facts_citing(conn, "u1", ids["u1"]["lives"]) == [("Ada", "lives in", "Lisbon")]
    assert _facts_citing(conn, "u1", ids["u1"]["manager"]) == [("Ada", "has manager", "Sarah Chen")]
    assert ("Ada", "prefers", "green tea in the morning") in _facts_citing(conn, "u1", ids["u1"]["tea"])
    return ids


@pytest.mark.parametrize("change", ["restore", "supersede", "forget"])
def test_a_covered_memorys_change_makes_its_digest_stale_and_the_next_build_rewrites_it(
    conn, local_store, month, change
):
    client = make_client(
        conn, local_store, embedder=EMB, retrieval=RetrievalConfig(near_duplicate_threshold=1.0)
    )
    ids = month["u1"]
    before = {level: _digest(conn, "u1", level, start) for level, start in ((2, MONTH), (3, YEAR))}
    u2_before = _derived(conn, "u2")
    target, new_id = None, None

    if change == "restore":  # an archived memory back to hot: its tier changes, the month's memories do not
        target = ids["lives"]
        assert client.restore("u1", original_id=target, now=NOW).restored
        record = client.get("u1", target)
        assert record is not None and record.tier == "hot"
    elif change == "supersede":  # new text: a new version supersedes the old one, which leaves the month
        target = ids["tea"]
        result = client.update("u1", target, "Ada prefers black coffee in the morning.", now=NOW)
        assert (result.outcome, result.previous_id) == ("superseded", target)
        new_id = result.memory_id
    else:  # forget: the forget's own transaction drops what was derived from the memory
        target = ids["manager"]
        client.forget("u1", target, now=NOW)
        assert client.get("u1", target) is None
        assert _digest(conn, "u1", 2, MONTH) is None and _digest(conn, "u1", 3, YEAR) is None
        assert _facts_citing(conn, "u1", target) == []

    # The freshness check sees the month: stale (its fingerprint no longer matches), or without a digest.
    problem = "no digest" if change == "forget" else "stale digest"
    assert [(m["user_id"], m["month"], m["problem"]) for m in missing_digests(conn, builder=BUILDER)] == [
        ("u1", MONTH, problem)
    ]
    assert _derived(conn, "u2") == u2_before

    statuses = _consolidate(conn)
    assert statuses == {
        "u1:2": "built",
        "u1:3": "built",
        "u1:facts": "built",
        "u2:2": "unchanged",
        "u2:3": "unchanged",
        "u2:facts": "unchanged",
    }
    assert missing_digests(conn, builder=BUILDER) == []
    after = {level: _digest(conn, "u1", level, start) for level, start in ((2, MONTH), (3, YEAR))}
    for level in (2, 3):
        assert after[level]["source_fingerprint"] != before[level]["source_fingerprint"]
        assert set(after[level]["source_memory_ids"]) == _month_ids(conn, "u1", MONTH)
    counts = after[2]["body"]["counts"]
    if change == "restore":
        assert set(after[2]["source_memory_ids"]) == set(ids.values())  # same memories, one more hot
        assert (counts["hot"], counts["archived"]) == (2, 2) and before[2]["body"]["counts"]["hot"] == 1
        # The extractor now reads the restored original: the fact still cites it, from its hot text.
        assert _facts_citing(conn, "u1", target) == [("Ada", "lives in", "Lisbon")]
    else:
        assert set(after[2]["source_memory_ids"]) == set(ids.values()) - {target}
        assert counts["memories"] == 3
        assert _facts_citing(conn, "u1", target) == []  # the facts that cited it are gone
    if change == "supersede":  # the new version is a memory of the month it was written in
        assert new_id is not None
        june = _consolidate(conn, date(2025, 6, 1))
        assert (june["u1:2"], june["u1:facts"], june["u2:3"]) == ("built", "built", "empty")
        assert ("Ada", "prefers", "black coffee in the morning") in _facts_citing(conn, "u1", new_id)
        assert _digest(conn, "u1", 2, date(2025, 6, 1))["source_memory_ids"] == [new_id]
    # Other facts of the month keep citing their memories; nothing points at a memory that is gone.
    if change != "forget":
        assert _facts_citing(conn, "u1", ids["manager"]) == [("Ada", "has manager", "Sarah Chen")]
    assert check_provenance(conn) == []
    assert _derived(conn, "u2") == u2_before  # the other user's digests, facts and builds: not written
    # And a second build writes nothing.
    again = _derived(conn, "u1")
    assert set(_consolidate(conn).values()) == {"unchanged"}
    assert _derived(conn, "u1") == again
