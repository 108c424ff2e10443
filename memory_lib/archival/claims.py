"""Claims: which batch holds which memory, under a lease, and how work moves on when a run dies.

Invariants:
* A memory is in at most one open attempt (a unique partial index), so two batches or two
  concurrent runs never work on the same memory.
* A batch holds its open attempts under a lease that every step renews (`renew_lease`). A batch is
  *finished* once its commit step ran; its open attempts are then the memories that failed.
* A new batch first takes over the open attempts of finished batches and of batches whose lease
  expired (or whose holder process is dead on this host), keeping their checkpoints: a failure is
  retried by the next night, and a killed run strands nothing. An attempt that failed
  `max_attempts` times is released and its memory stays hot (visible in `attempt_counts`).
* A claim takes no row locks across users: candidates are read without locks; claiming one is an
  INSERT ... ON CONFLICT DO NOTHING on the one-open index, taking one over an UPDATE per user with
  `batch_key = old`. Each write routes to one user's shard (Citus), and a claimer that loses a race
  for a memory just claims fewer (one that loses a deadlock to another claimer claims again, whole).
* A batch of a user shard (shards.py) claims and takes over only memories of its shard's users, so
  concurrent shard runs have disjoint work; their batch keys differ (nights.batch_key_for), so
  none takes over a batch another shard is still running.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.types.json import Jsonb

from ..core import validation
from ..core.config import ArchivalCriteria
from ..core.errors import InvalidInputError
from ..core.rows import Conn, Row, server_now
from ..core.shards import ALL, Shard, shard_filter
from ..core.statuses import OPEN_STATUSES, AttemptStatus
from ..lifecycle.eligibility import select_eligible
from ..storage.db import ONE_CONNECTION_PER_WORKER, pid_alive

# Rounds of a claim that lost memories to concurrent claimers (each round sees their commits).
CLAIM_ROUNDS = 8
# Tries of a claim that lost a deadlock to a concurrent claimer (each try is the whole claim again).
CLAIM_TRIES = 5


@dataclass(frozen=True)
class ClaimResult:
    batch_key: str
    as_of: datetime
    claimed: int
    by_reason: dict[str, int]
    newly_claimed: bool
    taken_over: int = 0


@dataclass(frozen=True)
class Holder:
    """Who holds a batch's lease. `pid` is set only by a process that owns the whole batch (the CLI):
    when that pid is dead on this host the lease is void at once, not after `lease_seconds`."""

    owner: str
    host: str
    pid: int | None

    @classmethod
    def this_process(cls, owner: str, *, track_pid: bool) -> Holder:
        return cls(owner, socket.gethostname(), os.getpid() if track_pid else None)


def _dead_holders(conn: Conn) -> list[str]:
    """Unfinished batches whose holder process on this host no longer exists."""
    rows = conn.execute(
        """SELECT batch_key, lease_pid FROM archival_batches
           WHERE finished_at IS NULL AND lease_pid IS NOT NULL AND lease_host = %s""",
        (socket.gethostname(),),
    ).fetchall()
    return [r["batch_key"] for r in rows if r["lease_pid"] != os.getpid() and not pid_alive(r["lease_pid"])]


def claim_batch(
    conn: Conn,
    batch_key: str,
    criteria: ArchivalCriteria,
    as_of: datetime,
    *,
    limit: int | None = None,
    holder: Holder | None = None,
    shard: Shard = ALL,
) -> ClaimResult:
    """Claim up to `limit` (default criteria.batch_size) memories of `shard`'s users for `batch_key`.

    First the open attempts of finished, expired or dead batches (checkpoints kept), then eligible
    memories. Idempotent: a batch is claimed once; claiming it again renews its lease and returns
    what it holds. Concurrent claimers never share a memory: candidates are read without row locks,
    and a claim is a write that only one of them can make (the one-open index, or a takeover's
    `batch_key = old` condition).
    """
    batch_key = validation.batch_key("batch_key", batch_key)
    as_of = as_of.astimezone(UTC)
    limit = criteria.batch_size if limit is None else limit
    if not isinstance(limit, int) or not 0 <= limit <= criteria.batch_size:
        raise InvalidInputError("limit", limit, f"must be between 0 and batch_size={criteria.batch_size}")
    if not isinstance(shard, Shard):
        raise InvalidInputError("shard", shard, "must be a Shard (shards.Shard.parse('i/n'))")
    holder = holder or Holder.this_process("memory-archive", track_pid=False)
    for attempt in range(CLAIM_TRIES):
        try:
            return _claim(conn, batch_key, criteria, as_of, limit, holder, shard)
        except psycopg.errors.DeadlockDetected:
            # Claimers of overlapping memories wait on each other's uncommitted attempts; across claim
            # rounds that can be a cycle. The victim's whole claim rolled back: it claims again.
            if attempt == CLAIM_TRIES - 1:
                raise
    raise AssertionError("unreachable")


def _claim(
    conn: Conn,
    batch_key: str,
    criteria: ArchivalCriteria,
    as_of: datetime,
    limit: int,
    holder: Holder,
    shard: Shard,
) -> ClaimResult:
    existing = conn.execute(
        "SELECT as_of FROM archival_batches WHERE batch_key = %s", (batch_key,)
    ).fetchone()
    if existing is not None:
        return _claimed_again(conn, batch_key, existing["as_of"], criteria, holder)
    now = server_now(conn)
    # Candidates are read before the claim's transaction: a multi-shard read there would forbid
    # writing the batch (a reference table) afterwards on Citus; the writes below re-check them.
    takeable = _takeable(conn, shard, now, limit)
    eligible = select_eligible(conn, criteria, as_of, limit, shard)
    with conn.transaction():
        conn.execute(ONE_CONNECTION_PER_WORKER)
        inserted = conn.execute(
            """INSERT INTO archival_batches (batch_key, as_of, criteria, claimed_count, lease_owner,
                                             lease_host, lease_pid, lease_expires_at)
               VALUES (%s, %s, %s, 0, %s, %s, %s, %s)
               ON CONFLICT (batch_key) DO NOTHING RETURNING batch_key""",
            (
                batch_key,
                as_of,
                Jsonb(criteria.model_dump(mode="json")),
                holder.owner,
                holder.host,
                holder.pid,
                now + timedelta(seconds=criteria.lease_seconds),
            ),
        ).fetchone()
        if inserted is None:  # a concurrent claimer of the same batch got there first
            raced = conn.execute(
                "SELECT as_of FROM archival_batches WHERE batch_key = %s", (batch_key,)
            ).fetchone()
            assert raced is not None  # the insert conflicted on this batch_key; batches are never deleted
            claimed_again = raced["as_of"]
        else:
            claimed_again = None
            taken = _take_over(conn, batch_key, takeable, now)
            claimed = _claim_new(conn, batch_key, criteria, as_of, shard, limit - taken, eligible)
            conn.execute(
                "UPDATE archival_batches SET claimed_count = %s WHERE batch_key = %s",
                (taken + claimed, batch_key),
            )
    if claimed_again is not None:
        return _claimed_again(conn, batch_key, claimed_again, criteria, holder)
    by_reason = _reason_counts(conn, batch_key)
    return ClaimResult(batch_key, as_of, sum(by_reason.values()), by_reason, True, taken)


def _claimed_again(
    conn: Conn, batch_key: str, as_of: datetime, criteria: ArchivalCriteria, holder: Holder
) -> ClaimResult:
    _renew(conn, batch_key, criteria, holder)
    by_reason = _reason_counts(conn, batch_key)
    return ClaimResult(batch_key, as_of, sum(by_reason.values()), by_reason, False)


def _takeable(conn: Conn, shard: Shard, now: datetime, limit: int) -> list[Row]:
    """Open attempts of finished, expired or dead batches (of the shard's users), read without locks."""
    return conn.execute(
        f"""SELECT a.batch_key, a.memory_id, a.user_id FROM archival_attempts a
            JOIN archival_batches b ON b.batch_key = a.batch_key
            WHERE a.status = ANY(%(open)s) AND {shard_filter("a.user_id")}
              AND (b.finished_at IS NOT NULL OR b.lease_expires_at IS NULL
                   OR b.lease_expires_at < %(now)s OR b.batch_key = ANY(%(dead)s))
            ORDER BY a.memory_id LIMIT %(limit)s""",
        {"open": list(OPEN_STATUSES), "now": now, "dead": _dead_holders(conn), "limit": limit}
        | shard.params(),
    ).fetchall()


def _by_user(rows: list[Row]) -> dict[str, list[Row]]:
    """Rows grouped per user, users in a fixed order (concurrent claimers lock users in one order)."""
    users: dict[str, list[Row]] = {}
    for r in sorted(rows, key=lambda r: r["user_id"]):
        users.setdefault(r["user_id"], []).append(r)
    return users


def _take_over(conn: Conn, batch_key: str, takeable: list[Row], now: datetime) -> int:
    """Move the takeable attempts to `batch_key`, one statement per user (one shard each). The
    `batch_key = old` condition makes it optimistic: an attempt another claimer moved first stays
    with it (its batch is new, so not among the old ones)."""
    taken = 0
    for user_id, rows in _by_user(takeable).items():
        taken += conn.execute(
            """UPDATE archival_attempts SET batch_key = %(new)s, taken_over_from = batch_key,
                                            updated_at = %(now)s
               WHERE user_id = %(user)s AND memory_id = ANY(%(ids)s) AND batch_key = ANY(%(old)s)
                 AND status = ANY(%(open)s)""",
            {
                "new": batch_key,
                "now": now,
                "user": user_id,
                "ids": [r["memory_id"] for r in rows],
                "old": sorted({r["batch_key"] for r in rows}),
                "open": list(OPEN_STATUSES),
            },
        ).rowcount
    return taken


def _claim_new(
    conn: Conn,
    batch_key: str,
    criteria: ArchivalCriteria,
    as_of: datetime,
    shard: Shard,
    want: int,
    eligible: list[Row],
) -> int:
    """Open an attempt for up to `want` eligible memories, one row each (routed to its user's shard).
    The one-open index lets one claimer have a memory; the others skip it (after waiting for the
    winner's commit) and look again, so concurrent claimers spread over the eligible memories."""
    claimed, candidates = 0, eligible[: max(want, 0)]
    for _ in range(CLAIM_ROUNDS):
        if not candidates:
            break
        with conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO archival_attempts (batch_key, memory_id, user_id, archive_reason)
                   VALUES (%s, %s, %s, %s)
                   ON CONFLICT (user_id, memory_id) WHERE status NOT IN ('archived', 'released') DO NOTHING""",
                # In (user_id, id) order: concurrent claimers of overlapping candidates wait on each
                # other's uncommitted rows of the one-open index in one order, never in a cycle.
                [
                    (batch_key, r["id"], user_id, r["reason"])
                    for user_id, rows in _by_user(candidates).items()
                    for r in sorted(rows, key=lambda r: r["id"])
                ],
            )
            n = cur.rowcount  # the sum over the rows (psycopg >= 3.1): a conflict counts 0
        claimed += n
        if n == len(candidates) or claimed >= want:
            break
        candidates = select_eligible(conn, criteria, as_of, want - claimed, shard)
    return claimed


def _renew(conn: Conn, batch_key: str, criteria: ArchivalCriteria, holder: Holder | None) -> None:
    conn.execute(
        """UPDATE archival_batches
           SET lease_expires_at = now() + make_interval(secs => %s),
               lease_owner = coalesce(%s, lease_owner), lease_host = coalesce(%s, lease_host),
               lease_pid = CASE WHEN %s THEN %s ELSE lease_pid END
           WHERE batch_key = %s""",
        (
            criteria.lease_seconds,
            holder and holder.owner,
            holder and holder.host,
            holder is not None,
            holder and holder.pid,
            batch_key,
        ),
    )


@contextmanager
def working_on(conn: Conn, batch_key: str) -> Iterator[None]:
    """Hold the batch's work lock (a session advisory lock) while a stage works on it: two runs of the
    same batch (the same night and shard launched twice) take turns, so no memory is summarized,
    written or committed twice. The lock dies with the connection, so a killed run holds nothing."""
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", ("batch:" + batch_key,))
    try:
        yield
    finally:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR:
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", ("batch:" + batch_key,))


def renew_lease(conn: Conn, batch_key: str, criteria: ArchivalCriteria) -> None:
    """Each step calls this when it starts: the batch is alive for another `lease_seconds`."""
    _renew(conn, batch_key, criteria, None)


def finish_batch(conn: Conn, batch_key: str) -> None:
    """The batch's commit step ran: what it still holds are failures, for the next batch to retry."""
    conn.execute(
        "UPDATE archival_batches SET finished_at = now() WHERE batch_key = %s AND finished_at IS NULL",
        (batch_key,),
    )


def _reason_counts(conn: Conn, batch_key: str) -> dict[str, int]:
    rows = conn.execute(
        "SELECT archive_reason, count(*) AS n FROM archival_attempts WHERE batch_key = %s GROUP BY 1",
        (batch_key,),
    ).fetchall()
    return {r["archive_reason"]: r["n"] for r in rows}


def attempt_counts(conn: Conn) -> Row:
    """Liveness at a glance: memories held by open attempts, those of them carrying an error (to be
    retried by the next batch), those waiting for a takeover (finished or expired batch), and those
    released after max_attempts that are still hot (with their last error)."""
    row = conn.execute(
        """SELECT
             count(*) FILTER (WHERE a.status = ANY(%(open)s)) AS open,
             count(*) FILTER (WHERE a.status = ANY(%(open)s) AND a.error IS NOT NULL) AS failed,
             count(*) FILTER (WHERE a.status = ANY(%(open)s)
                              AND (b.finished_at IS NOT NULL OR b.lease_expires_at < now())) AS awaiting_takeover,
             count(*) FILTER (WHERE a.status = %(released)s
                              AND EXISTS (SELECT 1 FROM memories m WHERE m.id = a.memory_id AND m.user_id = a.user_id)) AS released
           FROM archival_attempts a JOIN archival_batches b ON b.batch_key = a.batch_key
           WHERE a.status <> %(archived)s""",
        {
            "open": list(OPEN_STATUSES),
            "released": AttemptStatus.RELEASED.value,
            "archived": AttemptStatus.ARCHIVED.value,
        },
    ).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns exactly one row
    return dict(row)


def released_memories(conn: Conn, limit: int = 20) -> list[Row]:
    """Memories given up after max_attempts and still hot, newest first, with their last error."""
    return conn.execute(
        """SELECT a.memory_id, a.user_id, a.batch_key, a.failed_step, a.error, a.attempts, a.released_at
           FROM archival_attempts a
           WHERE a.status = %s AND EXISTS (SELECT 1 FROM memories m WHERE m.id = a.memory_id AND m.user_id = a.user_id)
           ORDER BY a.released_at DESC NULLS LAST LIMIT %s""",
        (AttemptStatus.RELEASED.value, limit),
    ).fetchall()
