"""The audit log's one writer: every row of memory_events is inserted by a statement built here.

Three shapes, one column list and one clock rule:

* `event(...)`: one event, as a plan's `Sql` (`EVENT_SQL`);
* `events(...)`: one event per (memory_id, user_id, details), one multi-row VALUES;
* `insert_select(source)`: one event per row of a query (`memory_id`, `user_id`, `details` columns),
  for the set-based writers (the archival commit, bulk store, stubbing), which build the details in SQL.

The clock rule: an event's `occurred_at` is the operation's `now` when the writer is given one (the
time the caller states the operation happens at: the clients' and the CLI's clock, or a test's), and
otherwise the database clock when the row is inserted (clock_timestamp(), as the column default). The
expansion window (memory_lib.lifecycle.promotion) counts events by this time. Forget records its
tombstone at the database clock on purpose: its `now` is the request's time, not the erasure's.

`event_type` is an `EventType` (memory_lib.core.statuses); a bare string is checked against it, so an
unknown type fails here with its value named, not at the database's CHECK.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from ..core.errors import InvalidInputError
from ..core.plans import Sql
from ..core.statuses import EventType

__all__ = [
    "EVENTS_SQL",
    "EVENT_SQL",
    "EventType",
    "checked_type",
    "event",
    "event_params",
    "events",
    "insert_select",
]

_INSERT = "INSERT INTO memory_events (memory_id, user_id, event_type, actor, occurred_at, details)"
# The one clock rule (module docstring).
_OCCURRED_AT = "coalesce(%(now)s::timestamptz, clock_timestamp())"

EVENT_SQL = f"""{_INSERT}
    VALUES (%(memory_id)s, %(user_id)s, %(event_type)s, %(actor)s, {_OCCURRED_AT}, %(details)s)"""


def insert_select(source: str) -> str:
    """The INSERT of one event per row of `source` (a SELECT whose columns include memory_id, user_id
    and details jsonb; it may name a CTE of the statement it ends). Its parameters: event_params'."""
    return f"""{_INSERT}
    SELECT e.memory_id, e.user_id, %(event_type)s, %(actor)s, {_OCCURRED_AT}, e.details
    FROM ({source}) AS e"""


EVENTS_SQL = insert_select(
    "SELECT * FROM unnest(%(memory_ids)s::uuid[], %(user_ids)s::text[], %(details)s::jsonb[])"
    " AS t(memory_id, user_id, details)"
)


def checked_type(value: EventType | str) -> str:
    """`value` as an EventType's value; anything else raises InvalidInputError naming it."""
    try:
        return EventType(value).value
    except ValueError:
        raise InvalidInputError(
            "event_type", value, f"must be one of {[t.value for t in EventType]}"
        ) from None


def event_params(event_type: EventType | str, actor: str, now: datetime | None) -> dict[str, Any]:
    """The parameters every shape takes: the type, the actor, and `now` (None: the database clock)."""
    return {"event_type": checked_type(event_type), "actor": actor, "now": now}


def event(
    memory_id: uuid.UUID,
    user_id: str,
    event_type: EventType | str,
    actor: str,
    now: datetime | None,
    details: dict[str, Any],
) -> Sql:
    """One event, as a statement of a plan (its result: the rowcount)."""
    params = event_params(event_type, actor, now)
    return Sql(
        EVENT_SQL,
        params | {"memory_id": memory_id, "user_id": user_id, "details": Jsonb(details)},
        "rowcount",
    )


_VALUES_ROW = (
    "(%(memory_id_{i})s, %(user_id_{i})s, %(event_type)s, %(actor)s, " + _OCCURRED_AT + ", %(details_{i})s)"
)


def events(
    event_type: EventType | str,
    rows: Sequence[tuple[uuid.UUID, str, dict[str, Any]]],
    *,
    actor: str,
    now: datetime | None,
) -> Sql:
    """One event per (memory_id, user_id, details) of `rows`, in one statement (result: the rowcount).
    A multi-row VALUES, not EVENTS_SQL's INSERT ... SELECT from arrays: distributed Postgres routes it to
    the shards of its rows' users (one, for one user's events) instead of pulling rows to the coordinator."""
    params = event_params(event_type, actor, now)
    if not rows:
        return Sql(EVENTS_SQL, params | {"memory_ids": [], "user_ids": [], "details": []}, "rowcount")
    for i, (memory_id, user_id, details) in enumerate(rows):
        params |= {f"memory_id_{i}": memory_id, f"user_id_{i}": user_id, f"details_{i}": Jsonb(details)}
    values = ",\n    ".join(_VALUES_ROW.format(i=i) for i in range(len(rows)))
    return Sql(f"{_INSERT}\n    VALUES {values}", params, "rowcount")
