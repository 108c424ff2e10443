"""The Slow Path around memory_lib.archive: nights, the pause switch, the checks that gate deleting
originals, the dry run and bulk restore.

memory_assets (Dagster) calls these functions; nothing here imports Dagster. A night is one archival
batch: partition "2026-03-14" is batch `night-2026-03-14`, claimed as of the end of that day in the
configured time zone. While archival is paused every step of every night does nothing and says why.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from . import archive
from .archive import ArchivalServices, BatchStatus, ClaimResult, StepResult
from .config import ArchivalCriteria, Settings
from .db import Database, migrate, open_database
from .embedding import Embedder
from .errors import IntegrityError, InvalidInputError, MemoryArchiveError, NotFoundError, SchemaError
from .models import BackupObject, sha256_hex, to_float32
from .objectstore import ObjectStore
from .store import MEMORY_COLUMNS, fetch_memories
from .summarize import Summarizer, SummaryInput

log = logging.getLogger(__name__)

ACTOR = "slow-path"
_OPEN = archive.OPEN_STATUSES


# --------------------------------------------------------------------------- database


def migrate_database(url: str, default_dim: int) -> list[str]:
    """Apply pending migrations; an initialized database keeps the embedding dim it was created with."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'"
            ).fetchone()
    except psycopg.errors.UndefinedTable:
        row = None
    return migrate(url, embedding_dim=int(row[0]) if row else default_dim)


_DB_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def open_migrated(
    *,
    database_url: str | None = None,
    embedded_database: str | None = None,
    state_dir: str | Path | None = None,
    embedding_dim: int | None = None,
) -> tuple[Database, str]:
    """(the open database, the URL to connect to) with migrations applied: `database_url`, else the
    embedded server under the state dir (database `embedded_database`, created if missing). Close the
    Database when done: that releases this process's hold on the embedded server."""
    overrides: dict[str, Any] = {}
    if database_url:
        overrides["database_url"] = database_url
    if state_dir:
        overrides["state_dir"] = Path(state_dir)
    settings = Settings.from_env(**overrides)
    db = open_database(settings)
    try:
        url = db.url
        if db.embedded is not None and embedded_database:
            url = _ensure_database(db.url, embedded_database)
        migrate_database(url, embedding_dim or settings.embedding.dim)
    except BaseException:
        db.close()
        raise
    return db, url


def _ensure_database(server_url: str, name: str) -> str:
    if not _DB_NAME.match(name):
        raise InvalidInputError(
            "embedded_database", name, "must be a lowercase identifier ([a-z_][a-z0-9_]*)"
        )
    with psycopg.connect(server_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):  # another process was first
                conn.execute(f'CREATE DATABASE "{name}"')
    return make_conninfo(server_url, dbname=name)


# --------------------------------------------------------------------------- nights


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


# --------------------------------------------------------------------------- pause switch


@dataclass(frozen=True)
class PauseState:
    paused: bool
    reason: str | None
    actor: str | None
    batch_key: str | None
    changed_at: datetime
    details: dict[str, Any]

    def describe(self) -> str:
        if not self.paused:
            return "archival is running"
        where = f" after {self.batch_key}" if self.batch_key else ""
        return f"archival paused{where} by {self.actor} at {self.changed_at:%Y-%m-%d %H:%M %Z}: {self.reason}"


def _pause_row(conn: psycopg.Connection, *, lock: bool = False) -> PauseState:
    try:
        row = conn.execute(
            "SELECT paused, reason, actor, batch_key, changed_at, details FROM archival_pause"
            + (" FOR UPDATE" if lock else "")
        ).fetchone()
    except psycopg.errors.UndefinedTable:
        raise SchemaError("archival_pause is missing: run migrations (sql/003_slow_path.sql)") from None
    if row is None:
        raise SchemaError("archival_pause has no row: sql/003_slow_path.sql was not applied whole")
    return PauseState(**row)


def pause_status(conn: psycopg.Connection) -> PauseState:
    return _pause_row(conn)


def _check_note(name: str, value: str | None) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise InvalidInputError(name, value, "must be a non-empty string")
    return value.strip()


def set_pause(
    conn: psycopg.Connection,
    *,
    reason: str,
    actor: str,
    batch_key: str | None = None,
    details: dict[str, Any] | None = None,
) -> PauseState:
    """Pause archival. Already paused: nothing changes, the first cause stays on record."""
    reason, actor = _check_note("reason", reason), _check_note("actor", actor)
    with conn.transaction():
        current = _pause_row(conn, lock=True)
        if current.paused:
            return current
        conn.execute(
            """UPDATE archival_pause SET paused = true, reason = %s, actor = %s, batch_key = %s,
                      details = %s, changed_at = now()""",
            (reason, actor, batch_key, Jsonb(details or {})),
        )
        conn.execute(
            """INSERT INTO archival_pause_events (action, reason, actor, batch_key, details)
               VALUES ('paused', %s, %s, %s, %s)""",
            (reason, actor, batch_key, Jsonb(details or {})),
        )
    log.error("archival paused by %s: %s", actor, reason)
    return _pause_row(conn)


def clear_pause(conn: psycopg.Connection, *, reason: str, actor: str) -> PauseState:
    """Resume archival. Not paused: nothing changes."""
    reason, actor = _check_note("reason", reason), _check_note("actor", actor)
    with conn.transaction():
        current = _pause_row(conn, lock=True)
        if not current.paused:
            return current
        conn.execute(
            """UPDATE archival_pause SET paused = false, reason = NULL, actor = NULL, batch_key = NULL,
                      details = '{}', changed_at = now()"""
        )
        conn.execute(
            """INSERT INTO archival_pause_events (action, reason, actor, details)
               VALUES ('cleared', %s, %s, %s)""",
            (reason, actor, Jsonb({"was": {"reason": current.reason, "actor": current.actor,
                                           "batch_key": current.batch_key}})),
        )  # fmt: skip
    log.warning("archival pause cleared by %s: %s", actor, reason)
    return _pause_row(conn)


def pause_history(conn: psycopg.Connection, limit: int = 20) -> list[dict[str, Any]]:
    return conn.execute(
        """SELECT id, action, reason, actor, batch_key, occurred_at FROM archival_pause_events
           ORDER BY id DESC LIMIT %s""",
        (limit,),
    ).fetchall()


def skipped_nights(conn: psycopg.Connection, batch_key: str | None = None) -> list[dict[str, Any]]:
    return conn.execute(
        """SELECT batch_key, step, reason, pause_event_id, recorded_at FROM archival_skipped_nights
           WHERE %(b)s::text IS NULL OR batch_key = %(b)s ORDER BY id""",
        {"b": batch_key},
    ).fetchall()


def _record_skip(conn: psycopg.Connection, batch_key: str, step: str, pause: PauseState) -> None:
    conn.execute(
        """INSERT INTO archival_skipped_nights (batch_key, step, reason, pause_event_id)
           SELECT %s, %s, %s, (SELECT max(id) FROM archival_pause_events WHERE action = 'paused')""",
        (batch_key, step, pause.describe()),
    )


# --------------------------------------------------------------------------- the nightly steps


@dataclass
class NightOutcome:
    """One step of one night: what it did, or why it did nothing."""

    night: date
    batch_key: str
    step: str
    skipped: str | None = None
    claim: ClaimResult | None = None
    results: list[StepResult] = field(default_factory=list)


def _paused(conn: psycopg.Connection, night: date, step: str) -> NightOutcome | None:
    pause = pause_status(conn)
    if not pause.paused:
        return None
    key = batch_key_for(night)
    _record_skip(conn, key, step, pause)
    log.warning("%s %s skipped: %s", key, step, pause.describe())
    return NightOutcome(night, key, step, skipped=pause.describe())


def claim_night(
    conn: psycopg.Connection,
    night: date,
    criteria: ArchivalCriteria,
    timezone: str,
    *,
    limit: int | None = None,
) -> NightOutcome:
    """Claim the night's batch (at most criteria.batch_size memories, once per night)."""
    if (skip := _paused(conn, night, "claim")) is not None:
        return skip
    key = batch_key_for(night)
    claim = archive.claim_batch(conn, key, criteria, night_as_of(night, timezone), limit=limit)
    return NightOutcome(night, key, "claim", claim=claim)


def summarize_night(
    conn: psycopg.Connection, night: date, summarizer: Summarizer, embedder: Embedder,
    criteria: ArchivalCriteria, *, workers: int = 4,
) -> NightOutcome:  # fmt: skip
    """Summarize the night's claimed memories, then embed the summaries."""
    if (skip := _paused(conn, night, "summarize")) is not None:
        return skip
    key = batch_key_for(night)
    results = [archive.summarize_batch(conn, key, summarizer, criteria, workers=workers)]
    if _has_status(conn, key, "summarized"):
        results.append(archive.embed_batch(conn, key, embedder, criteria))
    else:
        results.append(StepResult("embed"))
    return NightOutcome(night, key, "summarize", results=results)


def backup_night(
    conn: psycopg.Connection, night: date, store: ObjectStore, criteria: ArchivalCriteria, *, workers: int = 8
) -> NightOutcome:
    if (skip := _paused(conn, night, "backup")) is not None:
        return skip
    key = batch_key_for(night)
    return NightOutcome(
        night, key, "backup", results=[archive.backup_batch(conn, key, store, criteria, workers=workers)]
    )


def commit_night(
    conn: psycopg.Connection, night: date, store: ObjectStore, criteria: ArchivalCriteria,
    *, actor: str = ACTOR, workers: int = 8,
) -> NightOutcome:  # fmt: skip
    """Replace the night's backed-up originals by archive rows, if its error rate passes the gate.

    The gate is also a blocking Dagster check before this step; re-checking here keeps a run that
    selects this step alone from deleting originals of a night that failed it.
    """
    if (skip := _paused(conn, night, "commit")) is not None:
        return skip
    key = batch_key_for(night)
    gate = error_gate(conn, key, criteria)
    if not gate.passed:
        return NightOutcome(night, key, "commit", skipped=gate.describe())
    result = archive.commit_batch(conn, key, store, criteria, actor=actor, workers=workers)
    return NightOutcome(night, key, "commit", results=[result])


def _has_status(conn: psycopg.Connection, batch_key: str, status: str) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM archival_attempts WHERE batch_key = %s AND status = %s) AS e",
        (batch_key, status),
    ).fetchone()
    return bool(row["e"])


@dataclass
class StepTotals:
    """Step results of several nights added up, for reporting."""

    processed: int = 0
    succeeded: int = 0
    failed: int = 0
    released: int = 0
    bytes_written: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    failed_by_step: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def totals(outcomes: Iterable[NightOutcome]) -> StepTotals:
    t = StepTotals()
    for o in outcomes:
        if o.skipped:
            t.skipped[o.batch_key] = o.skipped
        for r in o.results:
            t.processed += r.processed
            t.succeeded += r.succeeded
            t.failed += r.failed
            t.released += r.released
            t.bytes_written += r.bytes_written
            t.input_tokens += r.input_tokens
            t.output_tokens += r.output_tokens
            t.cost_usd += r.cost_usd
            t.seconds += r.seconds
            if r.failed:
                t.failed_by_step[r.step] += r.failed
            t.errors.extend(r.errors[: max(0, 20 - len(t.errors))])
    return t


# --------------------------------------------------------------------------- error-rate gate


@dataclass(frozen=True)
class GateResult:
    status: BatchStatus
    max_error_rate: float

    @property
    def passed(self) -> bool:
        return self.status.error_rate <= self.max_error_rate

    def describe(self) -> str:
        s = self.status
        verdict = "within" if self.passed else "above"
        return (
            f"{s.batch_key}: {s.failed}/{s.attempted} failed ({100 * s.error_rate:.1f}%), "
            f"{verdict} max_error_rate {100 * self.max_error_rate:.1f}%"
        )


def error_gate(conn: psycopg.Connection, batch_key: str, criteria: ArchivalCriteria) -> GateResult:
    """failed / attempted of the batch against criteria.max_error_rate (no attempts: passes)."""
    return GateResult(archive.batch_status(conn, batch_key), criteria.max_error_rate)


# --------------------------------------------------------------------------- backup fidelity


@dataclass
class FidelityReport:
    """Every backup object of a batch read back and compared with its source."""

    batch_key: str
    checked: int = 0
    faithful: int = 0
    stale: int = 0  # the hot row changed after its backup: commit backs it up again, nothing is lost
    bytes_read: int = 0
    seconds: float = 0.0
    failures: dict[uuid.UUID, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures


_BACKUP_FIELDS = ("schema_version", "original_id", "user_id", "content", "embedding", "entity_links",
                  "metadata", "importance_score", "created_at", "archived_at", "archive_reason")  # fmt: skip


def _differences(doc: BackupObject, expected: dict[str, Any]) -> list[str]:
    """Names of the fields of `doc` that differ from `expected` (embedding compared bit for bit)."""
    bad = []
    for name in _BACKUP_FIELDS:
        if name not in expected:
            continue
        got, want = getattr(doc, name), expected[name]
        if name == "embedding":
            same = doc.embedding_array().tobytes() == np.asarray(want, dtype=np.float32).tobytes()
        elif name == "entity_links":
            same = list(got) == list(want or [])
        else:
            same = got == want
        if not same:
            bad.append(name)
    return bad


def verify_backups(
    conn: psycopg.Connection, store: ObjectStore, batch_key: str, *, workers: int = 8
) -> FidelityReport:
    """Read back every backup object the batch wrote and compare it with its source.

    Source: the live row while the memory is hot (every backup field, the embedding bit for bit),
    else its archive row and the attempt's record (ids, scores, timestamps, reference, sha256 and size).
    """
    started = time.monotonic()
    report = FidelityReport(batch_key)
    attempts = conn.execute(
        """SELECT memory_id, user_id, status, archive_reason, backup_key, backup_ref, backup_sha256,
                  backup_size_bytes, backup_archived_at
           FROM archival_attempts
           WHERE batch_key = %s AND status IN ('backed_up', 'archived') AND backup_key IS NOT NULL
           ORDER BY memory_id""",
        (batch_key,),
    ).fetchall()
    if not attempts:
        return report
    ids = [a["memory_id"] for a in attempts]
    live = fetch_memories(conn, ids)
    archived = {
        r["original_id"]: r
        for r in conn.execute(
            """SELECT original_id, user_id, importance_score, original_created_at, archived_at, archive_reason,
                      storage_ref, backup_sha256, backup_size_bytes
               FROM archived_memories WHERE original_id = ANY(%s)""",
            (ids,),
        ).fetchall()
    }

    def read(attempt: dict[str, Any]) -> bytes:
        return store.get(attempt["backup_key"])

    for attempt, data in archive.run_parallel(read, attempts, workers):
        report.checked += 1
        mid = attempt["memory_id"]
        if isinstance(data, BaseException):
            report.failures[mid] = f"read failed: {type(data).__name__}: {data}"[:300]
            continue
        report.bytes_read += len(data)
        verdict, problem = _check_one(attempt, data, live.get(mid), archived.get(mid), store)
        if verdict == "failed":
            report.failures[mid] = problem or "?"
        elif verdict == "stale":
            report.stale += 1
        else:
            report.faithful += 1
    report.seconds = time.monotonic() - started
    return report


def _check_one(
    att: dict[str, Any], data: bytes, row: dict[str, Any] | None, arch: dict[str, Any] | None,
    store: ObjectStore,
) -> tuple[str, str | None]:  # fmt: skip
    """("faithful", None), ("stale", None) when the live row changed after its backup (commit backs it
    up again), or ("failed", what differs)."""
    if len(data) != att["backup_size_bytes"]:
        return "failed", f"size {len(data)} != recorded {att['backup_size_bytes']}"
    actual = sha256_hex(data)
    if actual != att["backup_sha256"]:
        return "failed", f"sha256 {actual[:12]}… != recorded {att['backup_sha256'][:12]}…"
    try:
        doc = BackupObject.from_json_bytes(data)
    except IntegrityError as exc:
        return "failed", f"not a backup document: {exc}"
    if row is not None:
        source = BackupObject.from_row(
            row, archived_at=att["backup_archived_at"], archive_reason=att["archive_reason"]
        )
        if sha256_hex(source.to_json_bytes()) != att["backup_sha256"]:
            return "stale", None
        expected = source.model_dump() | {"embedding": to_float32(row["embedding"])}
        bad = _differences(doc, expected)
        if sha256_hex(doc.content) != row["content_sha256"]:
            bad.append("content_sha256")
        return ("failed", f"fields differ from the live row: {', '.join(bad)}") if bad else ("faithful", None)
    if arch is not None:
        expected = {
            "schema_version": 1, "original_id": att["memory_id"], "user_id": arch["user_id"],
            "importance_score": arch["importance_score"], "created_at": arch["original_created_at"],
            "archived_at": arch["archived_at"], "archive_reason": arch["archive_reason"],
        }  # fmt: skip
        bad = _differences(doc, expected)
        if (
            arch["backup_sha256"] != att["backup_sha256"]
            or arch["backup_size_bytes"] != att["backup_size_bytes"]
        ):
            bad.append("archive row sha256/size")
        if arch["storage_ref"] != store.ref_for(att["backup_key"]):
            bad.append("archive row storage_ref")
        return (
            ("failed", f"fields differ from the archive row: {', '.join(bad)}") if bad else ("faithful", None)
        )
    return "failed", "memory is neither hot nor archived"


def reset_unfaithful_backups(
    conn: psycopg.Connection, report: FidelityReport, criteria: ArchivalCriteria
) -> int:
    """Record each failed round trip on its attempt and send still-hot memories back to be backed up again."""
    sent_back = 0
    sink = StepResult("fidelity")
    for mid, problem in report.failures.items():
        row = conn.execute(
            "SELECT status FROM archival_attempts WHERE batch_key = %s AND memory_id = %s",
            (report.batch_key, mid),
        ).fetchone()
        if row is None or row["status"] != "backed_up":
            continue  # an archived memory's backup cannot be rewritten from a source that is gone
        archive.record_failure(conn, report.batch_key, mid, "fidelity", IntegrityError("backup", "round trip", problem),
                                criteria, sink)  # fmt: skip
        archive.return_to_status(conn, report.batch_key, mid, "embedded")
        sent_back += 1
    return sent_back


def orphaned_backups(conn: psycopg.Connection, store: ObjectStore, prefix: str = "memories/") -> list[str]:
    """Backup objects no archival attempt records (a crash between put and checkpoint, repaired by a re-run)."""
    keys = list(store.list(prefix))
    if not keys:
        return []
    known = {
        r["backup_key"]
        for r in conn.execute(
            "SELECT backup_key FROM archival_attempts WHERE backup_key = ANY(%s)", (keys,)
        ).fetchall()
    }
    return [k for k in keys if k not in known]


# --------------------------------------------------------------------------- integrity


@dataclass(frozen=True)
class IntegrityReport:
    both_tiers: int  # memories with a hot row and an archive row
    double_open: int  # memories in two open archival attempts
    lost: int  # archived by these batches, now neither hot nor archived
    archived_without_event: int  # archive rows of these batches without an 'archived' audit event
    mismatched_records: int  # archive row and attempt disagree on the backup (ref or sha256)
    archived: int  # archive rows written by these batches

    @property
    def passed(self) -> bool:
        return not (self.both_tiers or self.double_open or self.lost or self.archived_without_event
                    or self.mismatched_records)  # fmt: skip

    def problems(self) -> dict[str, int]:
        names = ("both_tiers", "double_open", "lost", "archived_without_event", "mismatched_records")
        return {n: getattr(self, n) for n in names}


def integrity_report(conn: psycopg.Connection, batch_keys: Sequence[str]) -> IntegrityReport:
    """Every memory exactly once in hot or archive (whole database), and these batches' records agree."""
    row = conn.execute(
        f"""SELECT
            (SELECT count(*) FROM archived_memories a JOIN memories m ON m.id = a.original_id) AS both_tiers,
            (SELECT count(*) FROM (SELECT memory_id FROM archival_attempts
                                   WHERE status IN {_OPEN!r} GROUP BY memory_id HAVING count(*) > 1) d) AS double_open,
            (SELECT count(*) FROM archival_attempts t
              WHERE t.batch_key = ANY(%(keys)s) AND t.status = 'archived'
                AND NOT EXISTS (SELECT 1 FROM memories m WHERE m.id = t.memory_id)
                AND NOT EXISTS (SELECT 1 FROM archived_memories a WHERE a.original_id = t.memory_id)) AS lost,
            (SELECT count(*) FROM archived_memories a
              WHERE a.metadata->>'batch_key' = ANY(%(keys)s)
                AND NOT EXISTS (SELECT 1 FROM memory_events e
                                WHERE e.memory_id = a.original_id AND e.event_type = 'archived'))
                AS archived_without_event,
            (SELECT count(*) FROM archival_attempts t JOIN archived_memories a ON a.original_id = t.memory_id
              WHERE t.batch_key = ANY(%(keys)s) AND t.status = 'archived'
                AND a.metadata->>'batch_key' = t.batch_key
                AND (a.backup_sha256 <> t.backup_sha256 OR a.storage_ref <> t.backup_ref)) AS mismatched_records,
            (SELECT count(*) FROM archived_memories a WHERE a.metadata->>'batch_key' = ANY(%(keys)s)) AS archived
        """,
        {"keys": list(batch_keys)},
    ).fetchone()
    return IntegrityReport(**row)


# --------------------------------------------------------------------------- one night, start to end


@dataclass
class NightReport:
    night: date
    batch_key: str
    outcomes: list[NightOutcome]
    fidelity: FidelityReport | None
    gate: GateResult | None
    integrity: IntegrityReport | None
    paused: PauseState | None

    @property
    def archived(self) -> int:
        return sum(r.succeeded for o in self.outcomes if o.step == "commit" for r in o.results)


def run_night(
    conn: psycopg.Connection, services: ArchivalServices, criteria: ArchivalCriteria, night: date,
    timezone: str, *, actor: str = ACTOR, workers: int = 4,
) -> NightReport:  # fmt: skip
    """One partition night without Dagster: claim, summarize, back up, check, commit, check.

    A failed fidelity or error-rate check keeps every original and pauses archival.
    """
    key = batch_key_for(night)
    outcomes = [claim_night(conn, night, criteria, timezone)]
    if outcomes[0].skipped:
        return NightReport(night, key, outcomes, None, None, None, pause_status(conn))
    outcomes.append(
        summarize_night(conn, night, services.summarizer, services.embedder, criteria, workers=workers)
    )
    outcomes.append(backup_night(conn, night, services.object_store, criteria, workers=workers))
    fidelity = verify_backups(conn, services.object_store, key, workers=workers)
    gate = error_gate(conn, key, criteria)
    if not fidelity.passed:
        reset_unfaithful_backups(conn, fidelity, criteria)
        pause = set_pause(conn, reason=f"backup fidelity failed for {len(fidelity.failures)} memories",
                          actor=actor, batch_key=key)  # fmt: skip
        return NightReport(night, key, outcomes, fidelity, gate, None, pause)
    if not gate.passed:
        pause = set_pause(conn, reason=gate.describe(), actor=actor, batch_key=key)
        return NightReport(night, key, outcomes, fidelity, gate, None, pause)
    outcomes.append(commit_night(conn, night, services.object_store, criteria, actor=actor, workers=workers))
    return NightReport(night, key, outcomes, fidelity, gate, integrity_report(conn, [key]), None)


# --------------------------------------------------------------------------- dry run


@dataclass(frozen=True)
class SampleReview:
    memory_id: uuid.UUID
    user_id: str
    reason: str
    created_at: datetime
    importance_score: float
    original: str
    summary: str | None
    error: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: float


@dataclass(frozen=True)
class RoundTrip:
    written: int
    faithful: int
    deleted: int
    bytes_written: int
    failures: dict[str, str]
    seconds: float


@dataclass(frozen=True)
class Projection:
    eligible: int
    nights_needed: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    seconds: float
    seconds_per_memory: dict[str, float]
    bytes: int


@dataclass(frozen=True)
class DryRunReport:
    as_of: datetime
    eligible_by_reason: dict[str, int]
    samples: list[SampleReview]
    round_trip: RoundTrip
    projection: Projection

    @property
    def summary_errors(self) -> int:
        return sum(1 for s in self.samples if s.error)


def sample_eligible(
    conn: psycopg.Connection, criteria: ArchivalCriteria, as_of: datetime, n: int, *, seed: str = "dry-run"
) -> list[dict[str, Any]]:
    """A deterministic pseudo-random sample of eligible memories across users and reasons (read-only)."""
    # Same eligibility SQL as claim_batch, so the sample is what a night could claim.
    params = archive.criteria_params(criteria, as_of.astimezone(UTC)) | {"limit": n, "seed": seed}
    return conn.execute(
        f"""SELECT {", ".join("m." + c.strip() for c in MEMORY_COLUMNS.split(","))},
                   {archive.REASON_SQL} AS reason {archive.ELIGIBLE_SQL}
            ORDER BY md5(m.id::text || %(seed)s) LIMIT %(limit)s""",
        params,
    ).fetchall()


def dry_run(
    conn: psycopg.Connection,
    services: ArchivalServices,
    criteria: ArchivalCriteria,
    *,
    as_of: datetime,
    sample_size: int = 50,
    workers: int = 4,
    requests_per_second: float | None = None,
    scratch_token: str | None = None,
) -> DryRunReport:
    """What a run would do, writing nothing to Postgres: eligible counts, `sample_size` memories
    summarized for review, their backups round-tripped under a scratch prefix (deleted after),
    and the backlog's cost and duration projected from what the sample measured."""
    if not 1 <= sample_size <= 500:
        raise InvalidInputError("sample_size", sample_size, "must be between 1 and 500")
    by_reason = archive.eligible_counts(conn, criteria, as_of)
    rows = sample_eligible(conn, criteria, as_of, sample_size)

    t0 = time.monotonic()

    def summarize(row: dict[str, Any]):
        return services.summarizer.summarize(
            SummaryInput(row["content"], row["created_at"], row["domain"], row["category"])
        )

    outcomes = list(archive.run_parallel(summarize, rows, workers))
    t_summary = time.monotonic() - t0
    samples: list[SampleReview] = []
    for row, out in outcomes:
        ok = not isinstance(out, BaseException)
        samples.append(
            SampleReview(
                row["id"], row["user_id"], row["reason"], row["created_at"], float(row["importance_score"]),
                row["content"], out.text if ok else None, None if ok else f"{type(out).__name__}: {out}"[:300],
                out.input_tokens if ok else 0, out.output_tokens if ok else 0, out.cost_usd if ok else 0.0,
            )
        )  # fmt: skip
    t1 = time.monotonic()
    texts = [s.summary for s in samples if s.summary]
    if texts:
        services.embedder.embed(texts)
    t_embed = time.monotonic() - t1
    trip = _scratch_round_trip(
        services.object_store, rows, as_of, scratch_token or secrets.token_hex(6), workers
    )

    eligible = sum(by_reason.values())
    n = max(len(samples), 1)
    per = {
        "summarize": t_summary / n,
        "embed": t_embed / max(len(texts), 1),
        "backup": trip.seconds / max(trip.written, 1),
    }
    if requests_per_second:  # the rate limit caps the summary rate whatever the sample's latency
        per["summarize"] = max(per["summarize"], 1.0 / requests_per_second)
    ok = [s for s in samples if s.summary]
    k = max(len(ok), 1)
    projection = Projection(
        eligible=eligible,
        nights_needed=math.ceil(eligible / criteria.batch_size),
        input_tokens=round(eligible * sum(s.input_tokens for s in ok) / k),
        output_tokens=round(eligible * sum(s.output_tokens for s in ok) / k),
        cost_usd=eligible * sum(s.cost_usd for s in ok) / k,
        seconds=eligible * sum(per.values()),
        seconds_per_memory=per,
        bytes=round(eligible * trip.bytes_written / max(trip.written, 1)),
    )
    return DryRunReport(as_of, by_reason, samples, trip, projection)


def _scratch_key(store: ObjectStore, token: str, memory_id: uuid.UUID) -> str:
    name = f"dry-run/{token}/memories/{memory_id}.json"
    return f"{store.prefix}/{name}" if store.prefix else name


def _scratch_round_trip(
    store: ObjectStore, rows: list[dict[str, Any]], as_of: datetime, token: str, workers: int
) -> RoundTrip:
    started = time.monotonic()

    def trip(row: dict[str, Any]) -> int:
        doc = BackupObject.from_row(row, archived_at=as_of, archive_reason=row["reason"])
        data = doc.to_json_bytes()
        key = _scratch_key(store, token, row["id"])
        try:
            store.put(key, data, sha256_hex(data))
            back = BackupObject.from_json_bytes(store.get_verified(key, sha256_hex(data)))
            expected = doc.model_dump() | {"embedding": to_float32(row["embedding"])}
            bad = _differences(back, expected)
            if bad:
                raise IntegrityError(key, "every field equal to the source", f"differs in {', '.join(bad)}")
        finally:
            store.delete(key)
        if store.head(key) is not None:
            raise MemoryArchiveError(f"scratch object {key} still exists after delete")
        return len(data)

    written = faithful = deleted = size = 0
    failures: dict[str, str] = {}
    for row, out in archive.run_parallel(trip, rows, workers):
        written += 1
        if isinstance(out, BaseException):
            failures[str(row["id"])] = f"{type(out).__name__}: {out}"[:300]
        else:
            faithful += 1
            deleted += 1
            size += out
    return RoundTrip(written, faithful, deleted, size, failures, time.monotonic() - started)


# --------------------------------------------------------------------------- rollback


@dataclass
class RestoreReport:
    requested: int = 0
    restored: int = 0
    already_hot: int = 0
    not_found: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def restore_archives(
    conn: psycopg.Connection,
    store: ObjectStore,
    *,
    actor: str,
    all_archives: bool = False,
    user_id: str | None = None,
    original_ids: Sequence[uuid.UUID | str] | None = None,
    chunk_size: int = 500,
    progress: Callable[[RestoreReport], None] | None = None,
) -> RestoreReport:
    """Restore archived memories to `memories`: all, one user's, or the listed original ids.

    Each memory is restored in its own transaction after its backup is verified against the recorded
    sha256 (archive.restore_archive); a memory already hot is counted, not touched. Interrupted, a
    re-run restores what is still archived: idempotent and resumable.
    """
    ids = _check_selection(all_archives, user_id, original_ids)
    report = RestoreReport()
    started = time.monotonic()

    def restore(uid: str, oid: uuid.UUID) -> None:
        report.requested += 1
        try:
            result = archive.restore_archive(conn, store, user_id=uid, original_id=oid, actor=actor)
        except NotFoundError as exc:
            report.not_found += 1
            _note(report, f"{oid}: {exc}")
        except (MemoryArchiveError, psycopg.Error) as exc:
            report.failed += 1
            _note(report, f"{oid}: {type(exc).__name__}: {exc}")
        else:
            if result.restored:
                report.restored += 1
            else:
                report.already_hot += 1

    if ids is not None:
        owners = {
            r["original_id"]: r["user_id"]
            for r in conn.execute(
                """SELECT original_id, user_id FROM archived_memories
                   WHERE original_id = ANY(%(ids)s) AND (%(u)s::text IS NULL OR user_id = %(u)s)""",
                {"ids": ids, "u": user_id},
            ).fetchall()
        }
        hot = {
            r["id"]: r["user_id"]
            for r in conn.execute(
                """SELECT id, user_id FROM memories
                   WHERE id = ANY(%(ids)s) AND (%(u)s::text IS NULL OR user_id = %(u)s)""",
                {"ids": ids, "u": user_id},
            ).fetchall()
        }
        for i, oid in enumerate(ids):
            owner = owners.get(oid) or hot.get(oid)
            if owner is None:
                report.requested += 1
                report.not_found += 1
                _note(
                    report,
                    f"{oid}: no archived or hot memory" + (f" for user_id={user_id!r}" if user_id else ""),
                )
            else:
                restore(owner, oid)
            if progress and (i + 1) % chunk_size == 0:
                progress(report)
    else:
        cursor: tuple[datetime, uuid.UUID] | None = None
        while True:
            page = conn.execute(
                """SELECT user_id, original_id, archived_at FROM archived_memories
                   WHERE (%(u)s::text IS NULL OR user_id = %(u)s)
                     AND (%(c_at)s::timestamptz IS NULL OR (archived_at, original_id) > (%(c_at)s, %(c_id)s))
                   ORDER BY archived_at, original_id LIMIT %(n)s""",
                {"u": user_id, "c_at": cursor[0] if cursor else None, "c_id": cursor[1] if cursor else None,
                 "n": chunk_size},
            ).fetchall()  # fmt: skip
            if not page:
                break
            for r in page:
                restore(r["user_id"], r["original_id"])
            cursor = (page[-1]["archived_at"], page[-1]["original_id"])
            if progress:
                progress(report)
    report.seconds = time.monotonic() - started
    return report


def _check_selection(
    all_archives: bool, user_id: str | None, original_ids: Sequence[uuid.UUID | str] | None
) -> list[uuid.UUID] | None:
    if user_id is not None and (not isinstance(user_id, str) or not user_id.strip()):
        raise InvalidInputError("user_id", user_id, "must be a non-empty string")
    if all_archives and (user_id is not None or original_ids):
        raise InvalidInputError(
            "all", all_archives, "restore all, or select by user_id/original_ids, not both"
        )
    if not all_archives and user_id is None and not original_ids:
        raise InvalidInputError("selection", None, "choose all=true, a user_id, or a list of original_ids")
    if not original_ids:
        return None
    ids: list[uuid.UUID] = []
    for i, value in enumerate(original_ids):
        try:
            ids.append(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
        except ValueError:
            raise InvalidInputError(f"original_ids[{i}]", value, "is not a UUID") from None
    return list(dict.fromkeys(ids))


def _note(report: RestoreReport, message: str) -> None:
    if len(report.errors) < 20:
        report.errors.append(message[:300])


# --------------------------------------------------------------------------- helpers


def exact_rows(conn: psycopg.Connection, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, dict[str, Any]]:
    """Hot rows with every column, the embedding as raw float32 bytes: equal means byte-exact."""
    rows = conn.execute(
        f"SELECT {MEMORY_COLUMNS}, content_tsv::text AS content_tsv FROM memories WHERE id = ANY(%s)",
        (list(ids),),
    ).fetchall()
    out = {}
    for r in rows:
        r = dict(r)
        r["embedding"] = to_float32(r["embedding"]).tobytes()
        out[r["id"]] = r
    return out
