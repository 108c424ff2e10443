"""The one lock order for every writer of a user's rows.

A transaction that creates, changes, moves between tiers or deletes a user's memories takes, in this
order, and never the other way round:

1. The user's write lock: a transaction-scoped advisory lock per user (`USER_LOCK_SQL`). A transaction
   covering several users (an archival commit chunk) takes them in ascending user_id order
   (`lock_users`). It is held until commit or rollback.
2. Then row locks, each table's rows in ascending id order where a statement locks several.

Writers that take it: add, update and delete (memory_lib.write.write_path, memory_lib.write.memory_api), forget
(memory_lib.lifecycle.forget, both of its row-changing steps), the archival commit (memory_lib.archival.archive), expand,
promotion and restore (memory_lib.lifecycle.promotion), access counting (memory_lib.lifecycle.promotion) and unsupersede.
So forget and the archival of the same user serialize: whichever takes the lock second sees what the
first committed (a forget that wins leaves the commit no hot row to archive; a commit that wins leaves
forget archive rows to delete). Claims (memory_lib.archival.claims) take no user lock: they lock with SKIP
LOCKED, so they never wait while holding a lock.

No lock is held across a network call (an LLM, an embedder, the object store): those run before the
transaction that locks, which re-checks under its locks that what was read did not change meanwhile.
- Expand, re-promotion and restore (memory_lib.lifecycle.promotion: expand_flow, promote_flow,
  restore_flow) read and verify the backup, and re-embed its text when its space is not the active
  one, with no transaction open; the locked transaction re-reads the archive row and the active space
  and starts over when either is not the one read (a read that failed because the row changed starts
  over too).
- Re-embedding (memory_lib.lifecycle.reembedding: the dual write and the backfill) reads pending rows
  without locking them, embeds them with no transaction open, and writes only the rows still pending
  with the text and stub state embedded; the others stay pending for the next batch.
- The bulk restore (memory_lib.lifecycle.restore.restore_archives) reads a group's backups ahead and
  waits for them before it locks the group.
The stated exceptions, each bounded:
- The bulk restore reads under its group's locks a backup whose row changed between the read-ahead
  and the lock (another ref or sha256: archived again meanwhile), and the backups of a group whose
  statements failed, when it retries its members one by one in the group's transaction
  (restore_archive); and it re-embeds under them the text of a backup from before a re-embedding flip
  (EmbedText in promotion.restore_many_rows_plan). At most `commit_every` memories of an operator's
  command, which restoring everything runs with archival paused.
- The archival commit verifies the backups that no bucket version keeps (a local store, a bucket
  without versioning) after locking the chunk's users and rows and before deleting the originals,
  since a check made before the locks could be out of date when the original goes. It is one HEAD per
  backup object of the chunk, in parallel, given up after `archive.LOCKED_VERIFY_SECONDS` (the chunk's
  unchecked memories then stay hot): a user's writes wait for it at most that long, once per chunk
  holding the user's memories.

One more lock, outside that order, so that forget cannot be outrun by a backup in flight: the archival
backup step (and the dry run's scratch copies) hold each of their users' *backup lock* shared
(`backups_in_flight`, a session-scoped advisory lock) from before they read the originals until their
checkpoints are written, and put nothing of a memory that is gone or that an open forget request
covers (`memory_lib.lifecycle.forget.forgetting`).
Forget records its request and, in the same transaction, takes the user's backup lock exclusively
(`WAIT_FOR_BACKUPS_SQL`), before it lists the user's objects: every backup that read the user's rows
before the request existed has put and checkpointed its objects by then (so forget finds them), and
every later one sees the request. Forget takes it before any other lock of its transaction, so
while it waits it holds nothing a backup could need.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import psycopg

from .rows import Conn


def user_lock_key(user_id_sql: str) -> str:
    """The SQL of a user's write-lock key, the user id given as the SQL expression `user_id_sql`. The one
    definition of the key: it keeps its historical name so that processes of an older version still
    serialize with this one."""
    return f"hashtextextended('memory_lib.add:' || {user_id_sql}, 0)"


USER_LOCK_SQL = f"SELECT pg_advisory_xact_lock({user_lock_key('%(user_id)s')})"
# The write locks of several users in one statement, in the order of the array %(users)s, which the
# caller sorts (a function scan yields an array's elements in order): lock_users' order, set-based.
USERS_LOCK_SQL = f"""
    SELECT count(pg_advisory_xact_lock({user_lock_key("u")})) AS n
    FROM unnest(%(users)s::text[]) AS u"""


_BACKUP_KEY = "hashtextextended('memory_lib.backup:' || %(user_id)s, 0)"
# Taken first in forget's transaction that records its request: waits for the user's backups in flight.
WAIT_FOR_BACKUPS_SQL = f"SELECT pg_advisory_xact_lock({_BACKUP_KEY})"


def lock_users(conn: Conn, user_ids: Iterable[str]) -> None:
    """Take the write lock of each user, in ascending order (inside the caller's transaction)."""
    for user in sorted(set(user_ids)):
        conn.execute(USER_LOCK_SQL, {"user_id": user})


@contextlib.contextmanager
def backups_in_flight(conn: Conn, user_ids: Iterable[str]) -> Iterator[None]:
    """Hold each user's backup lock shared (ascending user_id) on `conn`'s session until the block
    ends: a forget of one of these users waits for the block before it lists the user's objects.
    Session-scoped, so the block's own transactions may commit inside it; a process that dies
    releases it with its connection."""
    users = sorted(set(user_ids))
    taken: list[str] = []
    try:
        for user in users:
            conn.execute(f"SELECT pg_advisory_lock_shared({_BACKUP_KEY})", {"user_id": user})
            taken.append(user)
        yield
    finally:
        # A lost connection has released them already; its error is the one worth raising.
        with contextlib.suppress(psycopg.OperationalError):
            for user in reversed(taken):
                conn.execute(f"SELECT pg_advisory_unlock_shared({_BACKUP_KEY})", {"user_id": user})
