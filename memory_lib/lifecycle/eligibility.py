"""Which hot memories are cold enough to archive: the archival criteria as SQL, in one place.

Never pinned, and:
* expired: a TTL (`ttl_days` > 0 on the write path) whose `expires_at` is before the end of the night,
  used or not: reason `ttl_expired`, whatever its age, policy or category (the TTL
  is the caller's word on this memory; exempt categories shield from the heuristics below);
or, never in an exempt category (`core` by default), one of:
* superseded on the write path (a changed fact) before the end of the night and not used since:
  reason `superseded`, whatever its age or policy (superseded originals move to cold at once);
* policy `adr004` (default), the archival criteria: old enough, not in active use, and
  either unimportant (`stale_low_importance`) or past the force age (`force_age`);
* policy `retention`, migration to cold by retention score: at its retention floor for `cold_migration_days`
  consecutive nights with no access since the streak began (`retention_floor`); `core` never,
  whatever `exempt_categories` says (memory_lib.lifecycle.retention keeps the score and the streak).
Two liveness rules sit on top: a memory held by an open attempt is not claimed twice, and a memory
released after `max_attempts` failures stays hot until it changes.

A restore is a use and a new start: a memory brought back from the archive (a restore of one memory,
of a user's or of all, or a re-promotion: `memories.restored_at`, set by
promotion.restore_many_rows_plan, sql/025) has its age and its time since its last use counted from
its last restore when that is later (SINCE_SQL, LAST_USE_SQL). So the night after a restore finds it
ineligible, whatever pause is set or not, and it is archived again only when the criteria above,
counted from the restore, say so. The retention score counts from the same instant (retention.py uses
TOUCHED_SQL).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ..core.config import ArchivalCriteria
from ..core.rows import Conn, Row
from ..core.shards import ALL, Shard, shard_filter
from ..core.statuses import OPEN_STATUSES, ArchiveReason, AttemptStatus
from ..storage.store import MEMORY_COLUMNS

REASON_LOW_IMPORTANCE = ArchiveReason.STALE_LOW_IMPORTANCE.value
REASON_FORCE_AGE = ArchiveReason.FORCE_AGE.value
REASON_SUPERSEDED = ArchiveReason.SUPERSEDED.value
REASON_RETENTION = ArchiveReason.RETENTION_FLOOR.value
REASON_TTL_EXPIRED = ArchiveReason.TTL_EXPIRED.value
REASONS: tuple[str, ...] = tuple(r.value for r in ArchiveReason)
# Core memories skip the lifecycle: they stay hot, protected by the 0.60 floor.
RETENTION_EXEMPT = ("core",)


def criteria_params(criteria: ArchivalCriteria, as_of: datetime, shard: Shard = ALL) -> dict[str, Any]:
    as_of = as_of.astimezone(UTC)
    return shard.params() | {
        "min_cutoff": as_of - timedelta(days=criteria.min_age_days),
        "force_cutoff": as_of - timedelta(days=criteria.force_archive_age_days),
        "recent_cutoff": as_of - timedelta(days=criteria.recent_access_window_days),
        "as_of": as_of,
        "policy": criteria.policy,
        # days_at_floor >= N <=> the streak began N - 1 nights before as_of; half a day of slack so a
        # 23 h night across a DST change still counts (as memory_retention.days_at_floor rounds).
        "floor_cutoff": as_of - timedelta(days=criteria.cold_migration_days - 1) + timedelta(hours=12),
        "retention_exempt": list(RETENTION_EXEMPT),
        "max_imp": criteria.max_importance_score,
        "max_access": criteria.max_recent_access_count,
        "exempt": list(criteria.exempt_categories),
        "open_statuses": list(OPEN_STATUSES),
        "released": AttemptStatus.RELEASED.value,
    }


# "In active use" = more accesses than allowed with the last one inside the recent window (the table
# keeps a count and a last-access time, not a full access log). The policy is a parameter, so callers
# (claims, dry run) share one statement; the shard condition is true for every user with the default
# shard 0/1; a custom plan folds the branch that is off away.
# Retention: a streak at the floor that began early enough, with no access since it began — decay is
# monotone between accesses, so it is still at the floor at `as_of` even if tonight was not scored.
# Superseded before the end of the night and not used since (a restore or a re-promotion counts as a
# use): a superseded memory brought back from the archive is not sent straight back.
# Expired before the end of the night, used or not (a TTL is not extended by reads). A restored or
# re-promoted memory comes back without its TTL (restores write MEMORY_COLUMNS), so it is not sent back.
# The one rule for restores (module docstring), in these three expressions; `m` is the hot row. A
# restore leaves the archived columns as they were, so its instant is a column of its own.
SINCE_SQL = "greatest(m.created_at, m.restored_at)"  # in the hot tier since (greatest() skips NULLs)
LAST_USE_SQL = "greatest(m.last_accessed_at, m.restored_at)"  # NULL: never used, never restored
TOUCHED_SQL = f"coalesce({LAST_USE_SQL}, m.created_at)"  # what the retention score decays from
TTL_EXPIRED_SQL = "(m.expires_at <= %(as_of)s)"
SUPERSEDED_SQL = f"""(m.superseded_by IS NOT NULL AND m.updated_at <= %(as_of)s
                      AND coalesce({LAST_USE_SQL} <= m.updated_at, true))"""
ELIGIBLE_SQL = f"""
    FROM memories m
    WHERE NOT m.pinned
      AND {shard_filter("m.user_id")}
      AND ({TTL_EXPIRED_SQL} OR m.category <> ALL(%(exempt)s) AND (
           {SUPERSEDED_SQL}
           OR (%(policy)s::text = 'adr004'
               AND {SINCE_SQL} <= %(min_cutoff)s
               AND (m.importance_score <= %(max_imp)s OR {SINCE_SQL} <= %(force_cutoff)s)
               AND NOT (m.access_count > %(max_access)s AND m.last_accessed_at >= %(recent_cutoff)s))
           OR (%(policy)s::text = 'retention'
               AND m.category <> ALL(%(retention_exempt)s)
               AND EXISTS (SELECT 1 FROM memory_retention r
                           WHERE r.user_id = m.user_id AND r.memory_id = m.id AND r.floor_since <= %(floor_cutoff)s
                             AND {TOUCHED_SQL} <= r.floor_since))))
      AND NOT EXISTS (SELECT 1 FROM archival_attempts a
                      WHERE a.memory_id = m.id AND a.user_id = m.user_id AND a.status = ANY(%(open_statuses)s))
      AND NOT EXISTS (SELECT 1 FROM archival_attempts a
                      WHERE a.memory_id = m.id AND a.user_id = m.user_id AND a.status = %(released)s
                        AND coalesce(a.released_at, a.updated_at) >= m.updated_at)
"""
REASON_SQL = f"""CASE WHEN {SUPERSEDED_SQL} AND m.category <> ALL(%(exempt)s) THEN '{REASON_SUPERSEDED}'
                      WHEN {TTL_EXPIRED_SQL} THEN '{REASON_TTL_EXPIRED}'
                      WHEN %(policy)s::text = 'retention' THEN '{REASON_RETENTION}'
                      WHEN m.importance_score <= %(max_imp)s THEN '{REASON_LOW_IMPORTANCE}'
                      ELSE '{REASON_FORCE_AGE}' END"""
# Superseded and expired first: they go the next night even when the batch is full. The index
# memories_claim_order (sql/021) holds this order, so a claim reads about a batch, not the table.
ORDER_SQL = (
    "ORDER BY (m.superseded_by IS NULL AND m.expires_at IS NULL), m.importance_score, m.created_at, m.id"
)


def eligible_counts(
    conn: Conn, criteria: ArchivalCriteria, as_of: datetime, shard: Shard = ALL
) -> dict[str, int]:
    """How many hot memories (of the shard's users) are eligible now, by archive reason (read-only)."""
    rows = conn.execute(
        f"SELECT {REASON_SQL} AS reason, count(*) AS n {ELIGIBLE_SQL} GROUP BY 1",
        criteria_params(criteria, as_of, shard),
    ).fetchall()
    return {r["reason"]: r["n"] for r in rows}


def select_eligible(
    conn: Conn, criteria: ArchivalCriteria, as_of: datetime, limit: int, shard: Shard = ALL
) -> list[Row]:
    """Eligible memories (of the shard's users), lowest importance then oldest first (read-only, no locks)."""
    return conn.execute(
        f"SELECT m.id, m.user_id, {REASON_SQL} AS reason {ELIGIBLE_SQL} {ORDER_SQL} LIMIT %(limit)s",
        criteria_params(criteria, as_of, shard) | {"limit": limit},
    ).fetchall()


def sample_eligible(
    conn: Conn, criteria: ArchivalCriteria, as_of: datetime, n: int, *, seed: str = "dry-run"
) -> list[Row]:
    """A deterministic pseudo-random sample of eligible memories with every column (read-only)."""
    columns = ", ".join("m." + c.strip() for c in MEMORY_COLUMNS.split(","))
    return conn.execute(
        f"""SELECT {columns}, {REASON_SQL} AS reason {ELIGIBLE_SQL}
            ORDER BY md5(m.id::text || %(seed)s) LIMIT %(limit)s""",
        criteria_params(criteria, as_of) | {"limit": n, "seed": seed},
    ).fetchall()
