"""The retention score of hot memories, which decays with time since last access, kept incrementally.

    R = max(floor_c, 0.5 ** (days since last access / (half_life_c * (1 + retrieval_boost * ln(1 + accesses)))))

`days since last access` counts from the last use, a restore or a re-promotion counting as one (else
from creation: eligibility.TOUCHED_SQL, the rule for restores), to the end of the night;
floors and half-lives are per category (config.RetentionConfig, defaults: core floor 0.60).

Between accesses R only falls, so a memory's whole future follows from its inputs (category, last
touch, accesses): memory_retention keeps them per hot memory (sql/021_nightly_cost.sql) with
the instant R reaches floor + floor_tolerance (`floor_at`) and the first night of its streak at the
floor (`floor_since`). Triggers on memories mark a row pending when its inputs change; a night
computes the pending rows of memories created by its end, nothing else. R itself, "at floor" and the
days at the floor as of any night are computed when read (`scores`, `distribution`).

Invariants:
* A score is never below its category's floor nor above 1; a category without a half-life never decays.
* A night's `score` writes only rows whose inputs changed since they were last computed (written, used,
  re-categorized, or every row after a change of the retention settings), one statement per batch of
  users (`users_per_statement`); every row is computed from its own memory only: nothing crosses user_id.
* The values as of a night equal a full rescan's, night after night (tests/lifecycle/test_retention.py
  checks this against the rescan-everything reference): re-running a night writes nothing new, and an
  older night re-run later changes nothing.
* A streak at the floor begins on the first night end at or after `floor_at`, never before the night
  its inputs were first observed (a memory imported long decayed starts its count on its first night,
  so switching to policy `retention` does not archive a backlog at once), grows by one per night, and
  restarts on any access (an access changes the inputs). Nights not scored in between still count:
  decay is monotone between accesses.
* Reading is read-only: `scores`, `distribution` and `tier_counts` write nothing.

memory_lib.lifecycle.eligibility decides what the streak means for archival (policy `retention`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from ..core.config import RetentionConfig
from ..core.rows import Conn, Row
from ..core.shards import ALL, Shard, shard_filter
from .eligibility import RETENTION_EXEMPT, TOUCHED_SQL

CATEGORIES = ("episodic", "semantic", "procedural", "core")
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
BUCKETS = 10  # score buckets of width 0.1
# The exponent is capped at 60 half-lives (0.5 ** 60 < 1e-18): float8 power() raises on underflow.
MAX_HALF_LIVES = 60.0
_SETTINGS_KEY = "retention_config"


def category_params(config: RetentionConfig) -> dict[str, list[Any]]:
    return {
        "cats": list(CATEGORIES),
        "half": [getattr(config, f"{c}_half_life_days") for c in CATEGORIES],
        "floors": [getattr(config, f"{c}_floor") for c in CATEGORIES],
    }


def config_key(config: RetentionConfig, timezone: str) -> str:
    """What the stored rows were computed under: another value means every row is recomputed."""
    return json.dumps(
        category_params(config)
        | {"boost": config.retrieval_boost, "tol": config.floor_tolerance, "timezone": timezone},
        sort_keys=True,
    )


# The pending rows of a batch of users, computed from their memories. floor_at solves
# 0.5 ** (d / h) = floor + tol for d; floor_since rounds it up to a night end (local midnight in the
# Slow Path's timezone: Postgres does the DST arithmetic) and never before the night the inputs were
# first seen (kept when they did not change: a changed setting alone does not restart a streak).
# One statement over colocated tables joined on (user_id, id), with only IMMUTABLE functions (seconds
# are added to floor_at in UTC, not by the STABLE timestamptz + interval): distributed Postgres runs
# it on the users' shards in one step, where the CTEs became subplans through the coordinator.
_SCORE_SQL = f"""
UPDATE memory_retention r SET
    -- Still pending when a write or a use marked it after the inputs below were read.
    pending = r.marks <> f.marks, created_at = f.created_at, category = f.category, last_touched_at = f.touched,
    access_count = f.access_count, half_life_days = f.h, floor = f.floor, floor_at = f.floor_at,
    scored_as_of = f.seen,
    -- (greatest() skips NULLs: a memory that never reaches its floor has no streak.)
    floor_since = CASE WHEN f.floor_at IS NOT NULL THEN greatest(f.seen, CASE
        WHEN (f.floor_at AT TIME ZONE %(tz)s)::time = time '00:00' THEN f.floor_at
        ELSE (date_trunc('day', f.floor_at AT TIME ZONE %(tz)s) + interval '1 day') AT TIME ZONE %(tz)s END) END
FROM (
    SELECT s.*, CASE WHEN s.floor + %(tol)s >= 1.0 THEN s.touched
                     WHEN s.h IS NULL OR s.floor + %(tol)s <= power(0.5::float8, {MAX_HALF_LIVES}) THEN NULL
                     ELSE ((s.touched AT TIME ZONE 'UTC')
                           + make_interval(secs => s.h * 86400.0 * ln(1.0 / (s.floor + %(tol)s)) / ln(2.0)))
                          AT TIME ZONE 'UTC'
                END AS floor_at
    FROM (
        SELECT m.user_id, m.id, m.created_at, m.category, m.access_count, c.floor, r.marks,
               {TOUCHED_SQL} AS touched,
               c.half_life * (1.0 + %(boost)s * ln(1.0 + m.access_count)) AS h,
               CASE WHEN r.last_touched_at = {TOUCHED_SQL}
                         AND r.access_count = m.access_count AND r.category = m.category
                    THEN coalesce(r.scored_as_of, %(as_of)s) ELSE %(as_of)s END AS seen
        FROM memory_retention r
        JOIN memories m ON m.user_id = r.user_id AND m.id = r.memory_id
        JOIN unnest(%(cats)s::text[], %(half)s::float8[], %(floors)s::float8[]) AS c(category, half_life, floor)
             ON c.category = m.category
        WHERE r.pending AND r.user_id = ANY(%(users)s) AND r.created_at <= %(as_of)s
    ) s
) f
WHERE r.user_id = f.user_id AND r.memory_id = f.id
"""

# A row as of the end of a night (%(as_of)s): the score, at the floor or not, the streak.
AS_OF_SQL = f"""
SELECT r.user_id, r.memory_id, r.category, r.floor, r.last_touched_at, r.access_count,
       CASE WHEN r.half_life_days IS NULL THEN 1.0
            ELSE least(1.0, greatest(r.floor, power(0.5::float8, least({MAX_HALF_LIVES},
                 greatest(0.0, extract(epoch FROM %(as_of)s - r.last_touched_at)::float8 / 86400.0)
                 / r.half_life_days)))) END AS score,
       coalesce(r.floor_since <= %(as_of)s, false) AS at_floor,
       CASE WHEN r.floor_since <= %(as_of)s THEN r.floor_since END AS floor_since,
       -- Nights at the floor, this one included (rounded: a 23 h or 25 h night across DST counts as one).
       CASE WHEN r.floor_since <= %(as_of)s
            THEN round(extract(epoch FROM %(as_of)s - r.floor_since) / 86400)::integer + 1 ELSE 0 END AS days_at_floor
FROM memory_retention r
WHERE NOT r.pending AND r.created_at <= %(as_of)s
"""


@dataclass
class ScoreRun:
    as_of: datetime
    users: int = 0
    scored: int = 0
    statements: int = 0
    seconds: float = 0.0
    settings_changed: bool = False  # every row was marked for recomputation first


def _settings_changed(conn: Conn, key: str) -> bool:
    """Record `key` as the settings the rows follow; when it differs from the recorded one, mark every
    row pending (a maintenance statement over all users, run once per change). The upsert's row lock
    makes concurrent shard runs agree: one marks, the others see the new key."""
    with conn.transaction():
        row = conn.execute(
            "SELECT value FROM memory_archive_settings WHERE key = %s FOR UPDATE", (_SETTINGS_KEY,)
        ).fetchone()
        if row is None:  # the first night: every row is pending already
            conn.execute(
                "INSERT INTO memory_archive_settings (key, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (_SETTINGS_KEY, key),
            )
            return False
        if row["value"] == key:
            return False
        conn.execute("UPDATE memory_archive_settings SET value = %s WHERE key = %s", (key, _SETTINGS_KEY))
        conn.execute("UPDATE memory_retention SET pending = true, marks = marks + 1 WHERE NOT pending")
        return True


def score(
    conn: Conn, as_of: datetime, config: RetentionConfig, *, timezone: str = "UTC", shard: Shard = ALL
) -> ScoreRun:
    """Compute the pending rows of `shard`'s users whose memories were created by `as_of` (the end of a
    night in `timezone`, the Slow Path's), one statement per user batch. Concurrent shard runs compute
    disjoint users, so they never update the same rows."""
    as_of = as_of.astimezone(UTC)
    started = time.monotonic()
    run = ScoreRun(as_of)
    run.settings_changed = _settings_changed(conn, config_key(config, timezone))
    params = (
        category_params(config)
        | shard.params()
        | {"as_of": as_of, "boost": config.retrieval_boost, "tol": config.floor_tolerance, "tz": timezone}
    )
    after = ""
    while True:
        users = [
            r["user_id"]
            for r in conn.execute(
                f"""SELECT DISTINCT user_id FROM memory_retention
                WHERE pending AND created_at <= %(as_of)s AND user_id > %(after)s AND {shard_filter("user_id")}
                ORDER BY user_id LIMIT %(n)s""",
                shard.params() | {"as_of": as_of, "after": after, "n": config.users_per_statement},
            ).fetchall()
        ]
        if not users:
            break
        with conn.transaction():
            run.scored += conn.execute(_SCORE_SQL, params | {"users": users}).rowcount
        run.users += len(users)
        run.statements += 1
        after = users[-1]
    run.seconds = time.monotonic() - started
    return run


def rescan(
    conn: Conn, as_of: datetime, config: RetentionConfig, *, timezone: str = "UTC", shard: Shard = ALL
) -> ScoreRun:
    """Recompute every row of `shard`'s users from scratch (what a night did before scores were kept
    incrementally; the reference the incremental nights must equal). Observation nights are kept
    where the inputs did not change, as a night's `score` keeps them."""
    with conn.transaction():
        conn.execute(
            f"UPDATE memory_retention SET pending = true, marks = marks + 1 WHERE NOT pending AND {shard_filter('user_id')}",
            shard.params(),
        )
    return score(conn, as_of, config, timezone=timezone, shard=shard)


def scores(conn: Conn, as_of: datetime, *, user_id: str | None = None) -> list[Row]:
    """Every scored hot memory (of `user_id`, or all) as of the end of a night: user_id, memory_id,
    category, floor, last_touched_at, access_count, score, at_floor, floor_since (None when not at the
    floor), days_at_floor. Read-only."""
    where = "" if user_id is None else " AND r.user_id = %(user_id)s"
    return conn.execute(
        AS_OF_SQL + where + " ORDER BY r.user_id, r.memory_id",
        {"as_of": as_of.astimezone(UTC), "user_id": user_id},
    ).fetchall()


@dataclass
class Distribution:
    """Retention scores as of one night (every hot memory created by then and scored)."""

    scored: int
    at_floor: int
    ready: int  # at the floor for at least cold_migration_days nights, core excluded
    mean: float | None
    quantiles: dict[float, float]
    buckets: list[int]  # counts per 0.1 of score, [0, 0.1) ... [0.9, 1.0]
    by_category: dict[str, dict[str, float | int]] = field(default_factory=dict)


def distribution(conn: Conn, as_of: datetime, *, cold_migration_days: int) -> Distribution:
    """One read of memory_retention (narrow rows, no join): the night's figures for the UI."""
    as_of = as_of.astimezone(UTC)
    p = {
        "as_of": as_of,
        "days": cold_migration_days,
        "qs": list(QUANTILES),
        "exempt": list(RETENTION_EXEMPT),
    }
    # One scan: the score of each row is computed once (the costly part), buckets as FILTER counts.
    bucket_counts = ", ".join(
        f"count(*) FILTER (WHERE least(width_bucket(score, 0, 1, {BUCKETS}), {BUCKETS}) = {i + 1}) AS b{i}"
        for i in range(BUCKETS)
    )
    rows = conn.execute(
        f"""WITH a AS MATERIALIZED ({AS_OF_SQL})
           SELECT grouping(category) = 1 AS overall, category, count(*) AS n,
                  count(*) FILTER (WHERE at_floor) AS at_floor,
                  count(*) FILTER (WHERE days_at_floor >= %(days)s AND category <> ALL(%(exempt)s)) AS ready,
                  avg(score) AS mean, min(score) AS min,
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY score) AS median,
                  percentile_cont(%(qs)s::float8[]) WITHIN GROUP (ORDER BY score) AS qs, {bucket_counts}
           FROM a GROUP BY GROUPING SETS ((category), ())""",
        p,
    ).fetchall()
    overall = next(r for r in rows if r["overall"])
    buckets = [overall[f"b{i}"] for i in range(BUCKETS)]
    return Distribution(
        scored=overall["n"],
        at_floor=overall["at_floor"],
        ready=overall["ready"],
        mean=None if overall["mean"] is None else float(overall["mean"]),
        quantiles=dict(zip(QUANTILES, overall["qs"] or [], strict=False)),
        buckets=buckets,
        by_category={
            c["category"]: {"n": c["n"], "at_floor": c["at_floor"], "min": c["min"], "median": c["median"]}
            for c in sorted((r for r in rows if not r["overall"]), key=lambda r: r["category"])
        },
    )


class Tiers(NamedTuple):
    hot: int
    archived: int  # archive rows still vector-searchable
    stub: int  # archive rows that are stubs (memory_lib.lifecycle.stubs)


@dataclass
class TierCounts:
    """Memories per tier and user at the end of a night, its own archival included, rebuilt from what
    the rows record, so a night counted later (a backfill, a re-run) shows its own numbers:
    an archive row made by an archival batch counts from the end of that batch's night (the batch's
    as_of), whenever the batch ran; one made outside a batch counts from its archived_at. hot = created
    by then and not archived by then; stub = stubbed by then (stubbed_at is the end of the night that
    made the stub; a stub expanded since counts as archived: its stubbed_at is cleared)."""

    as_of: datetime
    by_user: dict[str, Tiers]

    @property
    def hot(self) -> int:
        return sum(t.hot for t in self.by_user.values())

    @property
    def archived(self) -> int:
        return sum(t.archived for t in self.by_user.values())

    @property
    def stub(self) -> int:
        return sum(t.stub for t in self.by_user.values())


def tier_counts(conn: Conn, as_of: datetime) -> TierCounts:
    as_of = as_of.astimezone(UTC)
    rows = conn.execute(
        """WITH h AS (SELECT user_id, count(*) AS n FROM memories WHERE created_at <= %(t)s GROUP BY 1),
                r AS (SELECT r.user_id, r.stubbed_at, r.original_created_at,
                             coalesce(b.as_of, r.archived_at) AS archived_as_of
                      FROM archived_memories r
                      LEFT JOIN archival_batches b ON b.batch_key = r.metadata->>'batch_key'),
                a AS (SELECT user_id,
                             count(*) FILTER (WHERE archived_as_of <= %(t)s
                                              AND NOT coalesce(stubbed_at <= %(t)s, false)) AS archived,
                             count(*) FILTER (WHERE stubbed_at <= %(t)s) AS stub,
                             count(*) FILTER (WHERE archived_as_of > %(t)s AND original_created_at <= %(t)s)
                                 AS hot_then
                      FROM r GROUP BY 1)
           SELECT user_id, coalesce(h.n, 0) + coalesce(a.hot_then, 0) AS hot, coalesce(a.archived, 0) AS archived,
                  coalesce(a.stub, 0) AS stub
           FROM h FULL JOIN a USING (user_id)""",
        {"t": as_of},
    ).fetchall()
    return TierCounts(
        as_of,
        {
            r["user_id"]: Tiers(r["hot"], r["archived"], r["stub"])
            for r in rows
            if r["hot"] or r["archived"] or r["stub"]
        },
    )
