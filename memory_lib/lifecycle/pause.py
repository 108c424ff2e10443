"""The archival pause: the operator's switch that failed gates throw, and its history.

While paused, every step of every batch (CLI or Dagster night) does nothing and records why in
archival_skipped_nights. A pause is cleared only on purpose (`memory-archive pause clear`, the
clear_archival_pause job): the first cause stays on record until then.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from ..core.errors import InvalidInputError, SchemaError
from ..core.rows import Conn, Row

log = logging.getLogger(__name__)


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


def _pause_row(conn: Conn, *, lock: bool = False) -> PauseState:
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


def pause_status(conn: Conn) -> PauseState:
    return _pause_row(conn)


def _check_note(name: str, value: str | None) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise InvalidInputError(name, value, "must be a non-empty string")
    return value.strip()


def set_pause(
    conn: Conn,
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
    log.info("archival paused by %s: %s", actor, reason)
    return _pause_row(conn)


def clear_pause(conn: Conn, *, reason: str, actor: str) -> PauseState:
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
            (
                reason,
                actor,
                Jsonb(
                    {
                        "was": {
                            "reason": current.reason,
                            "actor": current.actor,
                            "batch_key": current.batch_key,
                        }
                    }
                ),
            ),
        )
    log.info("archival pause cleared by %s: %s", actor, reason)
    return _pause_row(conn)


def pause_history(conn: Conn, limit: int = 20) -> list[Row]:
    return conn.execute(
        """SELECT id, action, reason, actor, batch_key, occurred_at FROM archival_pause_events
           ORDER BY id DESC LIMIT %s""",
        (limit,),
    ).fetchall()


def skipped_nights(conn: Conn, batch_key: str | None = None) -> list[Row]:
    return conn.execute(
        """SELECT batch_key, step, reason, pause_event_id, recorded_at FROM archival_skipped_nights
           WHERE %(b)s::text IS NULL OR batch_key = %(b)s ORDER BY id""",
        {"b": batch_key},
    ).fetchall()


def _record_skip(conn: Conn, batch_key: str, step: str, pause: PauseState) -> None:
    conn.execute(
        """INSERT INTO archival_skipped_nights (batch_key, step, reason, pause_event_id)
           SELECT %s, %s, %s, (SELECT max(id) FROM archival_pause_events WHERE action = 'paused')""",
        (batch_key, step, pause.describe()),
    )


def paused_skip(conn: Conn, batch_key: str, step: str) -> PauseState | None:
    """The pause state if archival is paused (and the skip recorded for `batch_key`), else None."""
    pause = pause_status(conn)
    if not pause.paused:
        return None
    _record_skip(conn, batch_key, step, pause)
    log.warning("%s %s skipped: %s", batch_key, step, pause.describe())
    return pause
