"""The retention score of hot memories, which decays with time since last access, computed in SQL.

    R = max(floor_c, 0.5 ** (days since last access / (half_life_c * (1 + retrieval_boost * ln(1 + accesses)))))

`days since last access` counts from coalesce(last_accessed_at, created_at) to the end of the night;
floors and half-lives are per category (config.RetentionConfig, defaults: core floor 0.60).

Invariants:
* A score is never below its category's floor nor above 1; a category without a half-life never decays.
* `score` writes one statement per batch of users (set-based, `users_per_statement` users each), and
  every row is computed from its own memory only: nothing crosses user_id.
* memory_retention holds one row per scored hot memory, as of the latest night scored: re-running a
  night writes the same values, and an older night re-run later changes nothing (idempotent).
* A streak at the floor (`floor_since`, `days_at_floor`) starts on the first night found at the floor
  (within `floor_tolerance`), grows by one per night, and restarts on any access since it began
  (last_accessed_at > floor_since) or ends when the score leaves the floor. Nights not scored in
  between still count: decay is monotone between accesses.
* Reading is read-only: `distribution` and `tier_counts` write nothing.

memory_lib.lifecycle.eligibility decides what the streak means for archival (policy `retention`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from ..core.config import RetentionConfig
from ..core.rows import Conn
from ..core.shards import ALL, Shard, shard_filter
from .eligibility import RETENTION_EXEMPT

CATEGORIES = ("episodic", "semantic", "procedural", "core")
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
BUCKETS = 10  # score buckets of width 0.1


def category_params(config: RetentionConfig) -> dict[str, list[Any]]:
    return {
        "cats": list(CATEGORIES),
        "half": [getattr(config, f"{c}_half_life_days") for c in CATEGORIES],
        "floors": [getattr(config, f"{c}_floor") for c in CATEGORIES],
    }


# The exponent is capped at 60 half-lives (0.5 ** 60 < 1e-18): float8 power() raises on underflow.
_SCORE_SQL = """
WITH c AS (
    SELECT * FROM unnest(%(cats)s::text[], %(half)s::float8[], %(floors)s::float8[]) AS c(category, half_life, floor)
), s AS (
    SELECT m.id, m.user_id, m.access_count, c.floor, coalesce(m.last_accessed_at, m.created_at) AS touched,
           greatest(c.floor, CASE WHEN c.half_life IS NULL THEN 1.0 ELSE power(0.5::float8, least(60.0,
               greatest(0.0, extract(epoch FROM %(as_of)s - coalesce(m.last_accessed_at, m.created_at))::float8 / 86400.0)
               / (c.half_life * (1.0 + %(boost)s * ln(1.0 + m.access_count))))) END) AS score
    FROM memories m JOIN c ON c.category = m.category
    WHERE m.user_id = ANY(%(users)s) AND m.created_at <= %(as_of)s
)
INSERT INTO memory_retention AS r
       (memory_id, user_id, score, floor, at_floor, floor_since, last_touched_at, access_count, scored_as_of)
SELECT id, user_id, least(1.0, score), floor, score <= floor + %(tol)s,
       CASE WHEN score <= floor + %(tol)s THEN %(as_of)s END, touched, access_count, %(as_of)s
FROM s
ON CONFLICT (memory_id) DO UPDATE SET
    user_id = EXCLUDED.user_id, score = EXCLUDED.score, floor = EXCLUDED.floor, at_floor = EXCLUDED.at_floor,
    floor_since = CASE WHEN NOT EXCLUDED.at_floor THEN NULL
                       WHEN r.floor_since <= EXCLUDED.scored_as_of AND EXCLUDED.last_touched_at <= r.floor_since
                       THEN r.floor_since
                       ELSE EXCLUDED.scored_as_of END,
    last_touched_at = EXCLUDED.last_touched_at, access_count = EXCLUDED.access_count,
    scored_as_of = EXCLUDED.scored_as_of
WHERE r.scored_as_of <= EXCLUDED.scored_as_of
"""


@dataclass
class ScoreRun:
    as_of: datetime
    users: int = 0
    scored: int = 0
    statements: int = 0
    seconds: float = 0.0


def score(conn: Conn, as_of: datetime, config: RetentionConfig, *, shard: Shard = ALL) -> ScoreRun:
    """Score every hot memory of `shard`'s users created by `as_of` (the end of a night), one statement
    per user batch. Concurrent shard runs score disjoint users, so they never upsert the same rows."""
    as_of = as_of.astimezone(UTC)
    started = time.monotonic()
    run = ScoreRun(as_of)
    params = (
        category_params(config)
        | shard.params()
        | {"as_of": as_of, "boost": config.retrieval_boost, "tol": config.floor_tolerance}
    )
    after = ""
    while True:
        users = [
            r["user_id"]
            for r in conn.execute(
                f"""SELECT DISTINCT user_id FROM memories WHERE user_id > %(after)s AND {shard_filter("user_id")}
                ORDER BY user_id LIMIT %(n)s""",
                shard.params() | {"after": after, "n": config.users_per_statement},
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


@dataclass
class Distribution:
    """Retention scores of one night (the rows scored as of `as_of`)."""

    scored: int
    at_floor: int
    ready: int  # at the floor for at least cold_migration_days nights, core excluded
    mean: float | None
    quantiles: dict[float, float]
    buckets: list[int]  # counts per 0.1 of score, [0, 0.1) ... [0.9, 1.0]
    by_category: dict[str, dict[str, float | int]] = field(default_factory=dict)


def distribution(conn: Conn, as_of: datetime, *, cold_migration_days: int) -> Distribution:
    as_of = as_of.astimezone(UTC)
    p = {
        "as_of": as_of,
        "days": cold_migration_days,
        "qs": list(QUANTILES),
        "n": BUCKETS,
        "exempt": list(RETENTION_EXEMPT),
    }
    row = conn.execute(
        """SELECT count(*) AS scored, count(*) FILTER (WHERE r.at_floor) AS at_floor,
                  count(*) FILTER (WHERE r.days_at_floor >= %(days)s AND m.category <> ALL(%(exempt)s)) AS ready,
                  avg(r.score) AS mean,
                  percentile_cont(%(qs)s::float8[]) WITHIN GROUP (ORDER BY r.score) AS qs
           FROM memory_retention r JOIN memories m ON m.id = r.memory_id
           WHERE r.scored_as_of = %(as_of)s""",
        p,
    ).fetchone()
    assert row is not None  # aggregates without GROUP BY return one row
    buckets = [0] * BUCKETS
    for b in conn.execute(
        """SELECT least(width_bucket(score, 0, 1, %(n)s), %(n)s) AS b, count(*) AS k
           FROM memory_retention WHERE scored_as_of = %(as_of)s GROUP BY 1""",
        p,
    ).fetchall():
        buckets[b["b"] - 1] = b["k"]
    cats = conn.execute(
        """SELECT m.category, count(*) AS n, count(*) FILTER (WHERE r.at_floor) AS at_floor,
                  min(r.score) AS min, percentile_cont(0.5) WITHIN GROUP (ORDER BY r.score) AS median
           FROM memory_retention r JOIN memories m ON m.id = r.memory_id
           WHERE r.scored_as_of = %(as_of)s GROUP BY 1 ORDER BY 1""",
        p,
    ).fetchall()
    return Distribution(
        scored=row["scored"],
        at_floor=row["at_floor"],
        ready=row["ready"],
        mean=None if row["mean"] is None else float(row["mean"]),
        quantiles=dict(zip(QUANTILES, row["qs"] or [], strict=False)),
        buckets=buckets,
        by_category={
            c["category"]: {"n": c["n"], "at_floor": c["at_floor"], "min": c["min"], "median": c["median"]}
            for c in cats
        },
    )


class Tiers(NamedTuple):
    hot: int
    archived: int  # archive rows still vector-searchable
    stub: int  # archive rows that are stubs (memory_lib.lifecycle.stubs)


@dataclass
class TierCounts:
    """Memories per tier and user as of the end of a night, rebuilt from timestamps, so a night
    counted later (a backfill) shows its own numbers: hot = created by then and not yet archived,
    stub = stubbed by then (a stub expanded since counts as archived: its stubbed_at is cleared)."""

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
                a AS (SELECT user_id,
                             count(*) FILTER (WHERE archived_at <= %(t)s AND NOT coalesce(stubbed_at <= %(t)s, false))
                                 AS archived,
                             count(*) FILTER (WHERE stubbed_at <= %(t)s) AS stub,
                             count(*) FILTER (WHERE archived_at > %(t)s AND original_created_at <= %(t)s) AS hot_then
                      FROM archived_memories GROUP BY 1)
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
