"""Slow Path nights: partition "2026-03-14" is batch `night-2026-03-14`, claimed as of the end of that
day in the configured time zone, and run through the stages of pipeline.py (post-commit included).

A night can be split over user shards (shards.py) run concurrently: shard 1 of 4 of that night is
batch `night-2026-03-14-shard-1of4`, so each shard run claims, takes over and commits only its own
batch. A shard run's numbers are its shard's; `night_totals` adds up every batch of the night."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg

from ..core.config import ArchivalCriteria, RetentionConfig, RetrievalConfig
from ..core.errors import InvalidInputError
from ..core.rows import Conn
from ..core.shards import ALL, Shard
from ..core.statuses import OPEN_STATUSES
from ..lifecycle import retention
from ..llm.embedding import Embedder
from ..llm.summarize import Summarizer
from ..storage.objectstore import ObjectStore
from . import pipeline
from .archive import ArchivalServices, StepResult
from .pipeline import BatchReport, StageOutcome

ACTOR = "slow-path"


def batch_key_for(night: date, shard: Shard = ALL) -> str:
    return f"night-{night.isoformat()}{shard.batch_suffix()}"


def night_totals(conn: Conn, night: date) -> dict[str, int]:
    """The night's attempts by status over all its batches (every shard), read from the database: the
    night's own totals, whichever shard run asks. Keys: batches, claimed, archived, open, released."""
    key = batch_key_for(night)
    # The batches (a reference table) first, then one aggregate over their attempts: Citus cannot push
    # down a subquery over the batches in the target list of an aggregate over a distributed table.
    batches = conn.execute(
        """SELECT batch_key, archived_pruned FROM archival_batches
           WHERE batch_key = %s OR batch_key LIKE %s""",
        (key, key + "-shard-%"),
    ).fetchall()
    pruned = sum(b["archived_pruned"] or 0 for b in batches)
    row = conn.execute(
        """SELECT count(a.memory_id) AS claimed,
                  count(*) FILTER (WHERE a.status = 'archived') AS archived,
                  count(*) FILTER (WHERE a.status = ANY(%(open)s)) AS open,
                  count(*) FILTER (WHERE a.status = 'released') AS released
           FROM archival_attempts a WHERE a.batch_key = ANY(%(keys)s)""",
        {"keys": [b["batch_key"] for b in batches], "open": list(OPEN_STATUSES)},
    ).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns exactly one row
    totals = {"batches": len(batches), **row}
    totals["claimed"] += pruned
    totals["archived"] += pruned
    return {k: int(totals[k]) for k in ("batches", "claimed", "archived", "open", "released")}


def parse_night(partition_key: str) -> date:
    try:
        return date.fromisoformat(partition_key)
    except (TypeError, ValueError):
        raise InvalidInputError("partition_key", partition_key, "must be a date YYYY-MM-DD") from None


def _zone(timezone: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInputError("timezone", timezone, "is not a known IANA time zone") from None


def night_as_of(night: date, timezone: str) -> datetime:
    """The end of `night` (midnight starting the next day) in `timezone`, as aware UTC."""
    return datetime.combine(night + timedelta(days=1), dtime(0), _zone(timezone)).astimezone(UTC)


def oldest_night(url: str, timezone: str, *, connect_timeout: int = 3) -> date | None:
    """The night (date in `timezone`) of the oldest memory, hot or archived, or None in an empty
    database. Archived memories count, so the first night does not move as archival goes on.
    Raises psycopg.Error when the database cannot be reached within `connect_timeout` seconds."""
    zone = _zone(timezone)
    with psycopg.connect(url, connect_timeout=connect_timeout, autocommit=True) as conn:
        row = conn.execute(
            """SELECT least((SELECT min(created_at) FROM memories),
                            (SELECT min(original_created_at) FROM archived_memories))"""
        ).fetchone()
    assert row is not None  # a SELECT without FROM returns exactly one row
    return None if row[0] is None else row[0].astimezone(zone).date()


def _on(night: date, outcome: StageOutcome) -> StageOutcome:
    outcome.night = night
    return outcome


def claim_night(
    conn: Conn,
    night: date,
    criteria: ArchivalCriteria,
    timezone: str,
    *,
    limit: int | None = None,
    shard: Shard = ALL,
) -> StageOutcome:
    """Claim the night's batch of `shard` (at most criteria.batch_size memories, once per night and shard)."""
    return _on(
        night,
        pipeline.claim_stage(
            conn,
            batch_key_for(night, shard),
            criteria,
            night_as_of(night, timezone),
            limit=limit,
            shard=shard,
        ),
    )


def summarize_night(
    conn: Conn,
    night: date,
    summarizer: Summarizer,
    embedder: Embedder,
    criteria: ArchivalCriteria,
    *,
    workers: int = 4,
    shard: Shard = ALL,
) -> StageOutcome:
    return _on(
        night,
        pipeline.summarize_stage(
            conn, batch_key_for(night, shard), summarizer, embedder, criteria, workers=workers
        ),
    )


def backup_night(
    conn: Conn,
    night: date,
    store: ObjectStore,
    criteria: ArchivalCriteria,
    *,
    workers: int = 8,
    shard: Shard = ALL,
) -> StageOutcome:
    return _on(
        night, pipeline.backup_stage(conn, batch_key_for(night, shard), store, criteria, workers=workers)
    )


def commit_night(
    conn: Conn,
    night: date,
    store: ObjectStore,
    criteria: ArchivalCriteria,
    *,
    actor: str = ACTOR,
    workers: int = 8,
    shard: Shard = ALL,
) -> StageOutcome:
    return _on(
        night,
        pipeline.commit_stage(
            conn, batch_key_for(night, shard), store, criteria, actor=actor, workers=workers
        ),
    )


def run_night(
    conn: Conn,
    services: ArchivalServices,
    criteria: ArchivalCriteria,
    night: date,
    timezone: str,
    *,
    actor: str = ACTOR,
    workers: int = 4,
    shard: Shard = ALL,
    retention_config: RetentionConfig | None = None,
    retrieval: RetrievalConfig | None = None,
) -> BatchReport:
    """One partition night (of `shard`'s users) in this process, without Dagster: the night's retention
    scores (memory_lib.lifecycle.retention, with `retention_config` or the defaults), then
    pipeline.run_batch on the shard's batch, whose stages and post-commit stage (gate after commit, tier
    audit, stall diagnosis, retrievability probe with `retrieval`, each with its pause) are those the
    Dagster Slow Path's assets run for the night, retention_scores through archive_rows.

    Not run here: the Dagster job's stub_conversions (memory_lib.lifecycle.stubs.convert) after
    archive_rows. A Dagster run over several nights sets the retrievability pause once its nights are
    done; a night run here is its own run, so it pauses right after its probe."""
    as_of = night_as_of(night, timezone)
    retention.score(conn, as_of, retention_config or RetentionConfig(), timezone=timezone, shard=shard)
    report = pipeline.run_batch(
        conn,
        services,
        criteria,
        batch_key=batch_key_for(night, shard),
        as_of=as_of,
        actor=actor,
        workers=workers,
        shard=shard,
        retrieval=retrieval,
    )
    for o in report.outcomes:
        o.night = night
    return report


@dataclass
class StepTotals(StepResult):
    """Step results of several nights added up, for reporting: StepResult's counters summed, plus
    failures by step and the nights skipped (why)."""

    step: str = "total"
    failed_by_step: Counter[str] = field(default_factory=Counter)
    skipped: dict[str, str] = field(default_factory=dict)


# Every counter StepResult has is summed: a counter added there is totalled without a change here.
_SUMMED = [f.name for f in fields(StepResult) if f.type in ("int", "float")]


def totals(outcomes: Iterable[StageOutcome]) -> StepTotals:
    t = StepTotals()
    for o in outcomes:
        if o.skipped:
            t.skipped[o.batch_key] = o.skipped
        for r in o.results:
            for name in _SUMMED:
                setattr(t, name, getattr(t, name) + getattr(r, name))
            if r.failed:
                t.failed_by_step[r.step] += r.failed
            t.errors.extend(r.errors[: max(0, 20 - len(t.errors))])
    return t
