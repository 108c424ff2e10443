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

No lock is held across a network call to an LLM or embedder: those run before the transaction.
"""

from __future__ import annotations

from collections.abc import Iterable

from .rows import Conn

# The key keeps its historical name so that processes of an older version still serialize with this one.
USER_LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended('memory_lib.add:' || %(user_id)s, 0))"


def lock_users(conn: Conn, user_ids: Iterable[str]) -> None:
    """Take the write lock of each user, in ascending order (inside the caller's transaction)."""
    for user in sorted(set(user_ids)):
        conn.execute(USER_LOCK_SQL, {"user_id": user})
