"""Make live again the memories the write path's former near-duplicate rule hid (`memory-archive unsupersede`).

`add` used to supersede a user's nearest live memory when a new text looked like the same fact with one
changed value; that rule hid many distinct memories (search skips superseded ones, hot and archived).
Those supersedes are recognized by their audit event: the memory's latest 'superseded' event names the
memory's current `superseded_by` and has no `reason` (every supersede written since names one: update,
explicit, llm, state_rule; a redacted event is left alone, its reason is gone).

For each user (one transaction per user, under the user's write lock, memory_lib.core.locks): the
hidden hot rows (`superseded_by` set) and archive rows (`original_superseded_by` set), oldest first.
Applied, each is made live again (the column cleared; a hot row's updated_at moves to now) with one
'updated' event, details {"reason": "unsupersede", "was_superseded_by": "<id>"}. A memory whose text a
live memory of the user already holds (the same dedupe key in either tier, or the same content sha256)
stays superseded, reported as kept: only one live memory may hold a text (memories_dedupe_live), and a
restore would otherwise bring back a second one. A dry run (the default) reads the same and writes
nothing. A second run finds nothing to change: the memories it made live are no longer superseded.

Every statement filters by user_id, except the one listing which users have superseded memories at all
(when no user is given), which reads user ids only.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from psycopg import errors as pg_errors

from ..core import validation
from ..core.locks import USER_LOCK_SQL
from ..core.rows import Conn
from ..core.statuses import EventType
from ..storage.events import event

__all__ = ["HiddenMemory", "UnsupersedeReport", "UserUnsupersede", "find_hidden", "unsupersede"]

REASON = "unsupersede"

_USERS_SQL = """
    SELECT user_id FROM memories WHERE superseded_by IS NOT NULL
    UNION
    SELECT user_id FROM archived_memories WHERE original_superseded_by IS NOT NULL
    ORDER BY 1"""
# The memory's latest 'superseded' event: written by add's former rule when it has no reason.
_FORMER_RULE = """
    CROSS JOIN LATERAL (
        SELECT e.details FROM memory_events e
        WHERE e.user_id = %(user_id)s AND e.memory_id = {id} AND e.event_type = 'superseded'
        ORDER BY e.id DESC LIMIT 1
    ) e
    WHERE {alias}.user_id = %(user_id)s AND {col} IS NOT NULL
      AND NOT e.details ? 'reason' AND NOT e.details ? 'redacted'
      AND e.details ->> 'superseded_by' = {col}::text"""
_HIDDEN_HOT_SQL = """
    SELECT m.id AS memory_id, m.superseded_by, m.dedupe_key AS key, m.content_sha256 AS sha, m.created_at
    FROM memories m""" + _FORMER_RULE.format(id="m.id", alias="m", col="m.superseded_by")
_HIDDEN_ARCHIVED_SQL = """
    SELECT a.original_id AS memory_id, a.original_superseded_by AS superseded_by, a.original_dedupe_key AS key,
           NULL::text AS sha, a.original_created_at AS created_at
    FROM archived_memories a""" + _FORMER_RULE.format(
    id="a.original_id", alias="a", col="a.original_superseded_by"
)
# Live memories of the user holding one of these texts (hot ones first: they win a tie).
_LIVE_TEXTS_SQL = """
    SELECT m.id, m.dedupe_key AS key, m.content_sha256 AS sha, 0 AS tier, m.created_at FROM memories m
    WHERE m.user_id = %(user_id)s AND m.superseded_by IS NULL
      AND (m.dedupe_key = ANY(%(keys)s::text[]) OR m.content_sha256 = ANY(%(shas)s::text[]))
    UNION ALL
    SELECT a.original_id, a.original_dedupe_key, NULL, 1, a.original_created_at FROM archived_memories a
    WHERE a.user_id = %(user_id)s AND a.original_superseded_by IS NULL AND a.original_dedupe_key = ANY(%(keys)s::text[])
    ORDER BY tier, created_at, id"""
_LIVE_HOT_HOLDER_SQL = """
    SELECT id FROM memories
    WHERE user_id = %(user_id)s AND superseded_by IS NULL AND id <> %(id)s AND (dedupe_key = %(key)s OR content_sha256 = %(sha)s)
    ORDER BY created_at, id LIMIT 1"""
_CLEAR_HOT_SQL = """
    UPDATE memories SET superseded_by = NULL, updated_at = greatest(updated_at, %(now)s)
    WHERE user_id = %(user_id)s AND id = %(id)s AND superseded_by = %(was)s"""
_CLEAR_ARCHIVED_SQL = """
    UPDATE archived_memories SET original_superseded_by = NULL
    WHERE user_id = %(user_id)s AND original_id = %(id)s AND original_superseded_by = %(was)s"""


@dataclass(frozen=True)
class HiddenMemory:
    """A memory superseded by add's former rule."""

    memory_id: uuid.UUID
    user_id: str
    tier: Literal["hot", "archived"]
    superseded_by: uuid.UUID
    key: str | None = None  # dedupe key (normalized text)
    sha: str | None = None  # content sha256 (hot rows)


@dataclass(frozen=True)
class UserUnsupersede:
    """One user's outcome: the memories made live again (or that would be, in a dry run), and those kept
    superseded because a live memory holds the same text (memory, that live memory's id)."""

    user_id: str
    live_again: tuple[HiddenMemory, ...]
    kept: tuple[tuple[HiddenMemory, uuid.UUID], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "unsupersede": len(self.live_again),
            "hot": [str(h.memory_id) for h in self.live_again if h.tier == "hot"],
            "archived": [str(h.memory_id) for h in self.live_again if h.tier == "archived"],
            "kept": {str(h.memory_id): f"kept: same text as {same}" for h, same in self.kept},
        }


@dataclass(frozen=True)
class UnsupersedeReport:
    applied: bool  # False: a dry run, nothing written
    users: tuple[UserUnsupersede, ...]

    @property
    def live_again(self) -> int:
        return sum(len(u.live_again) for u in self.users)

    @property
    def kept(self) -> int:
        return sum(len(u.kept) for u in self.users)

    def to_json(self) -> dict[str, Any]:
        """What the command prints: per user counts and ids; `unsuperseded` is 0 in a dry run, whose
        `would_unsupersede` says what --apply would change."""
        users = {u.user_id: u.to_json() for u in self.users if u.live_again or u.kept}
        return {
            "applied": self.applied,
            "unsuperseded": self.live_again if self.applied else 0,
            "would_unsupersede": 0 if self.applied else self.live_again,
            "kept": self.kept,
            "users": len(users),
            "by_user": users,
        }


def find_hidden(conn: Conn, user_id: str, *, lock: bool = False) -> list[HiddenMemory]:
    """The user's memories superseded by add's former rule, hot and archived, oldest first (read-only;
    lock=True locks the rows, inside the caller's transaction)."""
    user = validation.user(user_id)
    found: list[tuple[datetime, str, HiddenMemory]] = []
    tiers: tuple[tuple[Literal["hot", "archived"], str, str], ...] = (
        ("hot", _HIDDEN_HOT_SQL, "m"),
        ("archived", _HIDDEN_ARCHIVED_SQL, "a"),
    )
    for tier, sql, alias in tiers:
        rows = conn.execute(sql + (f" FOR UPDATE OF {alias}" if lock else ""), {"user_id": user}).fetchall()
        for r in rows:
            hidden = HiddenMemory(r["memory_id"], user, tier, r["superseded_by"], r["key"], r["sha"])
            found.append((r["created_at"], str(r["memory_id"]), hidden))
    return [h for _, _, h in sorted(found, key=lambda f: (f[0], f[1]))]


def _decide(
    conn: Conn, user: str, hidden: list[HiddenMemory]
) -> tuple[list[HiddenMemory], list[tuple[HiddenMemory, uuid.UUID]]]:
    """Which hidden memories can be live again: oldest first, each unless a live memory (or one made
    live before it in this run) holds its text."""
    keys = sorted({h.key for h in hidden if h.key})
    shas = sorted({h.sha for h in hidden if h.sha})
    by_key: dict[str, uuid.UUID] = {}
    by_sha: dict[str, uuid.UUID] = {}
    if keys or shas:
        for r in conn.execute(_LIVE_TEXTS_SQL, {"user_id": user, "keys": keys, "shas": shas}).fetchall():
            if r["key"]:
                by_key.setdefault(r["key"], r["id"])
            if r["sha"]:
                by_sha.setdefault(r["sha"], r["id"])
    live, kept = [], []
    for h in hidden:
        same = (by_key.get(h.key) if h.key else None) or (by_sha.get(h.sha) if h.sha else None)
        if same is not None:
            kept.append((h, same))
            continue
        live.append(h)
        if h.key:
            by_key[h.key] = h.memory_id
        if h.sha:
            by_sha[h.sha] = h.memory_id
    return live, kept


def _apply(
    conn: Conn,
    user: str,
    live: list[HiddenMemory],
    kept: list[tuple[HiddenMemory, uuid.UUID]],
    *,
    actor: str,
    now: datetime,
) -> tuple[list[HiddenMemory], list[tuple[HiddenMemory, uuid.UUID]]]:
    done: list[HiddenMemory] = []
    for h in live:
        params = {"user_id": user, "id": h.memory_id, "was": h.superseded_by, "now": now}
        try:
            with conn.transaction():  # a savepoint: a writer that takes no user lock (a restore) may race
                sql = _CLEAR_HOT_SQL if h.tier == "hot" else _CLEAR_ARCHIVED_SQL
                changed = conn.execute(sql, params).rowcount
        except pg_errors.UniqueViolation:
            holder = conn.execute(
                _LIVE_HOT_HOLDER_SQL, {"user_id": user, "id": h.memory_id, "key": h.key, "sha": h.sha}
            ).fetchone()
            if holder is None:
                raise
            kept.append((h, holder["id"]))
            continue
        if changed != 1:
            continue  # moved or changed since it was read (archived, restored, forgotten): left alone
        details = {"reason": REASON, "was_superseded_by": str(h.superseded_by)}
        recorded = event(h.memory_id, user, EventType.UPDATED, actor, now, details)
        conn.execute(recorded.query, recorded.params)
        done.append(h)
    return done, kept


def unsupersede(
    conn: Conn,
    *,
    user_id: str | None = None,
    apply: bool = False,
    actor: str = "memory-archive",
    now: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> UnsupersedeReport:
    """List (apply=False, the default: nothing written) or make live again (apply=True) the memories of
    `user_id` (or of every user) that add's former near-duplicate rule superseded; see the module.
    `progress` is called with (users done, users) after each user."""
    users = [validation.user(user_id)] if user_id is not None else None
    apply = validation.boolean("apply", apply)
    actor = validation.text("actor", actor, max_chars=validation.MAX_LABEL_CHARS)
    when = datetime.now(UTC) if now is None else validation.timestamp("now", now)
    if users is None:
        users = [r["user_id"] for r in conn.execute(_USERS_SQL).fetchall()]
    results = []
    if progress is not None:
        progress(0, len(users))
    for user in users:
        with conn.transaction():
            if apply:
                conn.execute(USER_LOCK_SQL, {"user_id": user})
            hidden = find_hidden(conn, user, lock=apply)
            live, kept = _decide(conn, user, hidden)
            if apply and live:
                live, kept = _apply(conn, user, live, kept, actor=actor, now=when)
        results.append(UserUnsupersede(user, tuple(live), tuple(kept)))
        if progress is not None:
            progress(len(results), len(users))
    return UnsupersedeReport(apply, tuple(results))
