"""Slow Path nights: partition "2026-03-14" is batch `night-2026-03-14`, claimed as of the end of that
day in the configured time zone, and run through the stages of pipeline.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg

from . import pipeline, retention
from .archive import ArchivalServices, StepResult
from .config import ArchivalCriteria, RetentionConfig
from .embedding import Embedder
from .errors import InvalidInputError
from .objectstore import ObjectStore
from .pipeline import BatchReport, StageOutcome
from .summarize import Summarizer

ACTOR = "slow-path"


def batch_key_for(night: date) -> str:
    return f"night-{night.isoformat()}"


def parse_night(partition_key: str) -> date:
    try:
        return date.fromisoformat(partition_key)
    except (TypeError, ValueError):
        raise InvalidInputError("partition_key", partition_key, "must be a date YYYY-MM-DD") from None


def night_as_of(night: date, timezone: str) -> datetime:
    """The end of `night` (midnight starting the next day) in `timezone`, as aware UTC."""
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInputError("timezone", timezone, "is not a known IANA time zone") from None
    return datetime.combine(night + timedelta(days=1), dtime(0), zone).astimezone(UTC)




def _on(night: date, outcome: StageOutcome) -> StageOutcome:
    outcome.night = night
    return outcome


def claim_night(
    conn: psycopg.Connection, night: date, criteria: ArchivalCriteria, timezone: str, *, limit: int | None = None
) -> StageOutcome:
    """Claim the night's batch (at most criteria.batch_size memories, once per night)."""
    return _on(night, pipeline.claim_stage(conn, batch_key_for(night), criteria, night_as_of(night, timezone),
                                           limit=limit))  # fmt: skip


def summarize_night(
    conn: psycopg.Connection, night: date, summarizer: Summarizer, embedder: Embedder,
    criteria: ArchivalCriteria, *, workers: int = 4,
) -> StageOutcome:  # fmt: skip
    return _on(night, pipeline.summarize_stage(conn, batch_key_for(night), summarizer, embedder, criteria,
                                               workers=workers))  # fmt: skip


def backup_night(
    conn: psycopg.Connection, night: date, store: ObjectStore, criteria: ArchivalCriteria, *, workers: int = 8
) -> StageOutcome:
    return _on(night, pipeline.backup_stage(conn, batch_key_for(night), store, criteria, workers=workers))


def commit_night(
    conn: psycopg.Connection, night: date, store: ObjectStore, criteria: ArchivalCriteria,
    *, actor: str = ACTOR, workers: int = 8,
) -> StageOutcome:  # fmt: skip
    return _on(night, pipeline.commit_stage(conn, batch_key_for(night), store, criteria, actor=actor,
                                            workers=workers))  # fmt: skip


def run_night(
    conn: psycopg.Connection, services: ArchivalServices, criteria: ArchivalCriteria, night: date,
    timezone: str, *, actor: str = ACTOR, workers: int = 4, retention_config: RetentionConfig | None = None,
) -> BatchReport:  # fmt: skip
    """One partition night without Dagster, as the Dagster job runs it: the night's retention scores
    (memory_lib.retention, with `retention_config` or the defaults), then pipeline.run_batch."""
    retention.score(conn, night_as_of(night, timezone), retention_config or RetentionConfig())
    report = pipeline.run_batch(conn, services, criteria, batch_key=batch_key_for(night),
                                as_of=night_as_of(night, timezone), actor=actor, workers=workers)  # fmt: skip
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


