"""Consolidation as one library call per month and per user, its checks, and the hooks a forget calls.

* `consolidate_month`: a month's level-2 digests, facts and key moments for every user with memories.
* `check_provenance`: every digest, fact and key moment points only at memories that exist (hot
  memories.id or archived_memories.original_id) of the SAME user, and every lower digest a digest
  cites is the same user's. `missing_digests`: months with archived memories and no (or a stale)
  level-2 digest. Both only read.
* Forget runs `drop_from_consolidation_plan` in its transaction (the memory's text leaves
  every digest at once: digests that cover it are deleted, not left quoting it), then
  `rebuild_for_user` (or the next scheduled run) builds what was dropped again from what remains.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from ..core.errors import InvalidInputError
from ..core.plans import Plan, Sql, run_plan
from ..core.rows import Conn
from ..llm.embedding import Embedder
from .digests import DigestBuilder, DigestOutcome, build_level, build_period, period_users
from .facts import CLOSE_SUPERSEDED_SQL, BuildOutcome, FactExtractor, build_facts, build_key_moments
from .sources import fingerprint, load_period_memories, period_bounds, user_months

__all__ = [
    "MonthReport",
    "ProvenanceProblem",
    "check_provenance",
    "consolidate_month",
    "drop_from_consolidation_plan",
    "drop_memory_from_consolidation",
    "missing_digests",
    "rebuild_for_user",
]


@dataclass
class MonthReport:
    month: date
    digests: list[DigestOutcome] = field(default_factory=list)
    facts: list[BuildOutcome] = field(default_factory=list)
    key_moments: list[BuildOutcome] = field(default_factory=list)

    def count(self, family: str, status: str) -> int:
        return sum(1 for o in getattr(self, family) if o.status == status)


def consolidate_month(
    conn: Conn,
    month: date,
    *,
    builder: DigestBuilder,
    extractor: FactExtractor,
    embedder: Embedder,
    tz: str = "UTC",
    users: list[str] | None = None,
) -> MonthReport:
    report = MonthReport(period_bounds(2, month)[0])
    who = users if users is not None else period_users(conn, 2, month, tz=tz)
    report.digests = build_period(conn, 2, month, builder=builder, embedder=embedder, tz=tz, users=who)
    report.facts = [build_facts(conn, u, month, extractor=extractor, embedder=embedder, tz=tz) for u in who]
    report.key_moments = [build_key_moments(conn, u, month, tz=tz) for u in who]
    return report


# ------------------------------------------------------------------------------------------ checks


@dataclass(frozen=True)
class ProvenanceProblem:
    table: str
    row_id: str
    user_id: str
    memory_id: str
    problem: str  # "missing" (no such memory) or "other user" (the memory is another user's)


# Each reference joined to the same user's rows by (user_id, id): colocated, so one statement per table
# runs on every worker at once (a join by id alone crosses users: Citus refuses it). What is not the
# user's is then looked up by id alone, to say whether it is another user's or missing.
_REFS = (
    (
        "memory_digests",
        "memory_digests d CROSS JOIN unnest(d.source_memory_ids) AS s(mid)",
        "s.mid",
        "d.period_start >= %(start)s AND d.period_end <= %(end)s",
    ),
    (
        "memory_facts",
        "memory_facts d CROSS JOIN unnest(d.source_memory_ids) AS s(mid)",
        "s.mid",
        "d.source_month >= %(start)s AND d.source_month < %(end)s",
    ),
    ("key_moments", "key_moments d", "d.memory_id", "d.month >= %(start)s AND d.month < %(end)s"),
)
_UNOWNED_SQL = """
    SELECT %(tbl)s AS tbl, d.id::text AS row_id, d.user_id, {mid}::text AS memory_id FROM {source}
    WHERE (%(user)s::text IS NULL OR d.user_id = %(user)s) AND {period}
      AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.user_id = d.user_id AND m.id = {mid})
      AND NOT EXISTS (SELECT 1 FROM archived_memories a WHERE a.user_id = d.user_id AND a.original_id = {mid})"""
_UNOWNED_DIGESTS_SQL = """
    SELECT 'memory_digests' AS tbl, d.id::text AS row_id, d.user_id, s.did::text AS memory_id
    FROM memory_digests d CROSS JOIN unnest(d.source_digest_ids) AS s(did)
    WHERE (%(user)s::text IS NULL OR d.user_id = %(user)s) AND d.period_start >= %(start)s
      AND d.period_end <= %(end)s
      AND NOT EXISTS (SELECT 1 FROM memory_digests c WHERE c.user_id = d.user_id AND c.id = s.did)"""
_OWNED_SQL = """
    SELECT id::text AS id FROM memories WHERE id = ANY(%(ids)s::uuid[])
    UNION SELECT original_id::text FROM archived_memories WHERE original_id = ANY(%(ids)s::uuid[])"""
_OWNED_DIGESTS_SQL = "SELECT id::text AS id FROM memory_digests WHERE id = ANY(%(ids)s::uuid[])"


def check_provenance(
    conn: Conn,
    *,
    user_id: str | None = None,
    start: date | None = None,
    end: date | None = None,
    limit: int = 1000,
) -> list[ProvenanceProblem]:
    """References to memories (or lower digests) that do not exist or belong to another user; [] is a pass.
    `start`/`end` limit it to digests inside [start, end) and facts / key moments of months in it."""
    params = {"user": user_id, "start": start or date.min, "end": end or date.max}
    memory_refs: list[Any] = []
    for tbl, source, mid, period in _REFS:
        sql = _UNOWNED_SQL.format(source=source, mid=mid, period=period)
        memory_refs += conn.execute(sql, params | {"tbl": tbl}).fetchall()
    digest_refs = conn.execute(_UNOWNED_DIGESTS_SQL, params).fetchall()
    found: set[str] = set()
    for refs, sql in ((memory_refs, _OWNED_SQL), (digest_refs, _OWNED_DIGESTS_SQL)):
        if refs:
            ids = sorted({r["memory_id"] for r in refs})
            found |= {r["id"] for r in conn.execute(sql, {"ids": ids}).fetchall()}
    problems = [
        ProvenanceProblem(
            r["tbl"],
            r["row_id"],
            r["user_id"],
            r["memory_id"],
            ("other user" if r["memory_id"] in found else "missing")
            if is_memory
            else ("other user's digest" if r["memory_id"] in found else "missing lower digest"),
        )
        for refs, is_memory in ((memory_refs, True), (digest_refs, False))
        for r in refs
    ]
    return sorted(problems, key=lambda p: (p.table, p.row_id, p.memory_id))[:limit]


def missing_digests(
    conn: Conn,
    *,
    builder: DigestBuilder | None = None,
    months: list[date] | None = None,
    tz: str = "UTC",
) -> list[dict[str, Any]]:
    """(user, month) with archived memories and no level-2 digest; with `builder`, also a digest whose
    fingerprint no longer matches its memories (stale: a covered memory changed since)."""
    rows = conn.execute(
        """SELECT a.user_id, date_trunc('month', a.original_created_at AT TIME ZONE %(tz)s)::date AS month,
                  count(*) AS archived, d.source_fingerprint
           FROM archived_memories a
           LEFT JOIN memory_digests d ON d.user_id = a.user_id AND d.level = 2
                AND d.period_start = date_trunc('month', a.original_created_at AT TIME ZONE %(tz)s)::date
           WHERE a.original_superseded_by IS NULL
           GROUP BY 1, 2, 4 ORDER BY 1, 2""",
        {"tz": tz},
    ).fetchall()
    out = []
    wanted = {period_bounds(2, m)[0] for m in months} if months is not None else None
    for r in rows:
        if wanted is not None and r["month"] not in wanted:
            continue
        if r["source_fingerprint"] is None:
            out.append(
                {
                    "user_id": r["user_id"],
                    "month": r["month"],
                    "archived": r["archived"],
                    "problem": "no digest",
                }
            )
        elif builder is not None:
            start, end = period_bounds(2, r["month"])
            memories = load_period_memories(conn, r["user_id"], start, end, tz=tz)
            if fingerprint(f"{builder.kind}:{builder.model}", memories) != r["source_fingerprint"]:
                out.append(
                    {
                        "user_id": r["user_id"],
                        "month": r["month"],
                        "archived": r["archived"],
                        "problem": "stale digest",
                    }
                )
    return out


# ------------------------------------------------------------------------------------------ forget hooks


def drop_memory_from_consolidation(conn: Conn, user_id: str, memory_id: uuid.UUID) -> dict[str, int]:
    """Remove one memory of `user_id` from everything consolidation derived from it, in the caller's
    transaction (see `drop_from_consolidation_plan`). Returns counts per table."""
    if not isinstance(user_id, str) or not user_id.strip():
        raise InvalidInputError("user_id", user_id, "must be a non-empty string")
    if not isinstance(memory_id, uuid.UUID):
        raise InvalidInputError("memory_id", memory_id, "must be a UUID")
    return run_plan(conn, drop_from_consolidation_plan(user_id, [memory_id]))


def drop_from_consolidation_plan(
    user_id: str, memory_ids: list[uuid.UUID], *, whole_user: bool = False
) -> Plan[dict[str, int]]:
    """The forget hook, as statements that run in the forget's transaction: digests covering any of
    the memories (every level) are deleted, not left quoting them; facts lose them as sources (a fact
    left with no source is deleted, and validity chains are recomputed); their key moments go; and the
    months' builds are forgotten so the next run rebuilds what remains. `whole_user`: every row of
    the user in the consolidation tables goes, builds included."""
    for family in ("memory_facts", "key_moments"):  # the builders' per-user locks (facts.lock_user)
        yield Sql(
            "SELECT pg_advisory_xact_lock(hashtextextended(%(k)s, 0))", {"k": f"{family}:{user_id}"}, "one"
        )
    p = {"u": user_id, "ids": list(memory_ids)}
    if whole_user:
        counts = {}
        for table in ("memory_digests", "memory_facts", "key_moments", "consolidation_builds"):
            counts[table] = yield Sql(f"DELETE FROM {table} WHERE user_id = %(u)s", p, "rowcount")
        return counts
    digests = yield Sql(
        "DELETE FROM memory_digests WHERE user_id = %(u)s AND source_memory_ids && %(ids)s::uuid[] "
        "RETURNING period_start",
        p,
        "all",
    )
    facts_deleted = yield Sql(
        "DELETE FROM memory_facts WHERE user_id = %(u)s AND source_memory_ids <@ %(ids)s::uuid[] "
        "RETURNING source_month",
        p,
        "all",
    )
    facts_updated = yield Sql(
        """UPDATE memory_facts SET source_memory_ids = ARRAY(
               SELECT s FROM unnest(source_memory_ids) WITH ORDINALITY AS t (s, i)
               WHERE s <> ALL (%(ids)s::uuid[]) ORDER BY i)
           WHERE user_id = %(u)s AND source_memory_ids && %(ids)s::uuid[] RETURNING source_month""",
        p,
        "all",
    )
    moments = yield Sql(
        "DELETE FROM key_moments WHERE user_id = %(u)s AND memory_id = ANY(%(ids)s) RETURNING month", p, "all"
    )
    months = {r["source_month"] for r in facts_deleted + facts_updated} | {r["month"] for r in moments}
    months |= {r["period_start"] for r in digests}
    if months:
        yield Sql(
            "DELETE FROM consolidation_builds WHERE user_id = %(u)s AND period_start = ANY(%(m)s)",
            {"u": user_id, "m": sorted(months)},
            "rowcount",
        )
    if facts_deleted or facts_updated:
        yield Sql(CLOSE_SUPERSEDED_SQL, {"u": user_id}, "rowcount")
    return {
        "memory_digests": len(digests),
        "memory_facts_deleted": len(facts_deleted),
        "memory_facts_updated": len(facts_updated),
        "key_moments": len(moments),
    }


def rebuild_for_user(
    conn: Conn,
    user_id: str,
    *,
    builder: DigestBuilder,
    extractor: FactExtractor,
    embedder: Embedder,
    tz: str = "UTC",
    max_level: int = 3,
) -> dict[str, int]:
    """Bring every month (and each higher level's period) of one user up to date with its memories:
    months with memories are (re)built when their fingerprint changed; months without memories lose
    their digests, facts and key moments. Returns how many digests were built and dropped."""
    if not isinstance(user_id, str) or not user_id.strip():
        raise InvalidInputError("user_id", user_id, "must be a non-empty string")
    months = {m for _, m in user_months(conn, tz=tz, user_id=user_id)}
    derived = conn.execute(
        """SELECT period_start AS m FROM memory_digests WHERE user_id = %(u)s AND level = 2
           UNION SELECT source_month FROM memory_facts WHERE user_id = %(u)s
           UNION SELECT month FROM key_moments WHERE user_id = %(u)s""",
        {"u": user_id},
    ).fetchall()
    months |= {r["m"] for r in derived}
    built = dropped = 0
    for month in sorted(months):
        report = consolidate_month(
            conn, month, builder=builder, extractor=extractor, embedder=embedder, tz=tz, users=[user_id]
        )
        built += report.count("digests", "built")
        dropped += report.count("digests", "deleted")
    for level in range(3, max_level + 1):
        periods = sorted({period_bounds(level, m)[0] for m in months})
        periods_now = conn.execute(
            "SELECT period_start FROM memory_digests WHERE user_id = %s AND level = %s", (user_id, level)
        ).fetchall()
        for start in sorted(set(periods) | {r["period_start"] for r in periods_now}):
            out = build_level(conn, level, user_id, start, builder=builder, embedder=embedder, tz=tz)
            built += out.status == "built"
            dropped += out.status == "deleted"
    return {"digests_built": built, "digests_dropped": dropped}
