"""The warm tier in time: phase 2 searches only the months a query names.

When a question names a time ("in May 2023", "last week", "last year": memory_lib.core.timescope), the
archive rows phase 2 reads are those of the user whose original was created in the calendar months
(UTC) that window touches, intersected with the caller's since/until filters. The statement reads
them once, into a MATERIALIZED CTE `a_scope`, by a range scan of the index archived_user_created_id
(user_id, original_created_at) that 001 ships; both arms (bit vectors, full text) and the BM25
text arm then read that CTE only, never `archived_memories` itself (scope_sql rewrites every reference
and refuses a statement it could not rewrite). Ranking inside the months is exact: Hamming distance
over every row in scope, full text over every document (summary + fingerprint) in scope, scored with the user's BM25
statistics (the same as unscoped search, so hot and archived scores compare).

Why an index range and not a table partitioned by month: partitioning would need original_id's
UNIQUE constraint and the primary key to include the partition key (the archive, promotion and
stub code all look rows up by id or original_id alone), one HNSW index per partition, the triggers of
002/007 re-created per partition, and moving rows across partitions when original_created_at is
corrected. The range scan prunes just as provably (EXPLAIN shows one Index Scan on
archived_user_created_id bounded by the months; tests/retrieval/test_warm.py reads the plan) with no schema
change. Its cost grows with the rows in the months asked for (the GIN and HNSW indexes are not
used inside the scope), which is the trade made: a month is small, a year is twelve of them.

It is opt-in: `RetrievalConfig.archive_time_scope="months"`. The default, "off", searches the whole
archive and the named time only boosts hits (delta_time), because a memory's text often names a
date other than the month it was created in ("dentist on 14 June" written in April): with the scope
on by default, the nightly retrievability gate found 40 of 50 demo memories by their first sentence
(floor 0.9) and failed; on LoCoMo (hashing embedder, tiered) recall@10 was 0.614 with it, 0.615 without.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ..core.timescope import TimeWindow

__all__ = ["SCOPE_CTE", "month_scope", "scope_sql"]

SCOPE_CTE = """a_scope AS MATERIALIZED (
        SELECT * FROM archived_memories
        WHERE user_id = %(user_id)s
          AND original_created_at >= %(scope_since)s::timestamptz
          AND original_created_at < %(scope_until)s::timestamptz
    )"""

# Every way the search statements name the archive table, and what it becomes in scope.
_REWRITES = (
    ("FROM archived_memories sa", "FROM a_scope sa"),
    ("FROM archived_memories a", "FROM a_scope a"),
    ("JOIN archived_memories a", "JOIN a_scope a"),
)


def _month_start(ts: datetime) -> datetime:
    ts = ts.astimezone(UTC)
    return datetime(ts.year, ts.month, 1, tzinfo=UTC)


def _next_month(start: datetime) -> datetime:
    return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)


def month_scope(
    window: TimeWindow | None, since: datetime | None = None, until: datetime | None = None
) -> tuple[datetime, datetime] | None:
    """[first day of the window's first month, first day after its last month), narrowed by the
    since/until filters; None when the query names no time. An empty scope (filters outside the
    window) is returned as is: phase 2 then finds nothing, as the filters require."""
    if window is None:
        return None
    lo = _month_start(window.since)
    hi = _next_month(_month_start(window.until - timedelta(microseconds=1)))
    if since is not None:
        lo = max(lo, since)
    if until is not None:
        hi = min(hi, until)
    return lo, max(lo, hi)


def scope_sql(sql: str) -> str:
    """`sql` (a search statement starting WITH) reading the archive only through `a_scope`."""
    if not sql.lstrip().startswith("WITH "):
        raise ValueError("scope_sql: expected a statement starting WITH")
    for old, new in _REWRITES:
        sql = sql.replace(old, new)
    if "archived_memories" in sql:  # a reference the rewrites missed would read every month
        raise ValueError("scope_sql: the statement still reads archived_memories outside the scope")
    head, _, rest = sql.partition("WITH ")
    return f"{head}WITH {SCOPE_CTE}, {rest}"
