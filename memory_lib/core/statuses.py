"""The status vocabularies of the archival tables, once. tests/test_statuses.py checks them against
the CHECK constraints in sql/, so code and schema cannot drift apart."""

from __future__ import annotations

from enum import StrEnum


class AttemptStatus(StrEnum):
    """archival_attempts.status: the last checkpoint a memory reached in its batch."""

    CLAIMED = "claimed"
    SUMMARIZED = "summarized"
    EMBEDDED = "embedded"
    BACKED_UP = "backed_up"
    ARCHIVED = "archived"  # terminal: the archive row replaced the original
    RELEASED = "released"  # terminal: given up (max_attempts reached, or the memory was deleted)


# Open = the memory is still hot and held by its batch (at most one open attempt per memory).
OPEN_STATUSES: tuple[str, ...] = (
    AttemptStatus.CLAIMED,
    AttemptStatus.SUMMARIZED,
    AttemptStatus.EMBEDDED,
    AttemptStatus.BACKED_UP,
)
TERMINAL_STATUSES: tuple[str, ...] = (AttemptStatus.ARCHIVED, AttemptStatus.RELEASED)


class PauseAction(StrEnum):
    """archival_pause_events.action."""

    PAUSED = "paused"
    CLEARED = "cleared"


class Step(StrEnum):
    """archival_attempts.failed_step: where a memory's last failure happened."""

    SUMMARIZE = "summarize"
    EMBED = "embed"
    BACKUP = "backup"
    VERIFY = "verify"
    FIDELITY = "fidelity"
    COMMIT = "commit"


class ArchiveReason(StrEnum):
    """archival_attempts.archive_reason and archived_memories.archive_reason (memory_lib.lifecycle.eligibility)."""

    STALE_LOW_IMPORTANCE = "stale_low_importance"
    FORCE_AGE = "force_age"
    SUPERSEDED = "superseded"
    RETENTION_FLOOR = "retention_floor"
    TTL_EXPIRED = "ttl_expired"


class EventType(StrEnum):
    """memory_events.event_type: what happened to a memory (the CHECK of sql/014). Written only through
    memory_lib.storage.events."""

    CREATED = "created"
    UPDATED = "updated"
    ARCHIVED = "archived"
    RESTORED = "restored"
    EXPANDED = "expanded"
    PROMOTED = "promoted"
    DELETED = "deleted"  # allowed by the schema since 001; no writer of this version records it
    SUPERSEDED = "superseded"
    STUBBED = "stubbed"
    UNSTUBBED = "unstubbed"
    FORGOTTEN = "forgotten"
    REDACTED = "redacted"  # written by the database itself (redact_memory_events, sql/014)
