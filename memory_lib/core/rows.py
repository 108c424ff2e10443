"""The connection and row types of the whole library: every connection it opens or accepts returns rows
as dicts (`row_factory=dict_row`), so a row is read by column name, never by position."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeAlias

import psycopg
from psycopg.rows import DictRow

Row: TypeAlias = dict[str, Any]
Conn: TypeAlias = psycopg.Connection[DictRow]
AsyncConn: TypeAlias = psycopg.AsyncConnection[DictRow]


def server_now(conn: Conn) -> datetime:
    """The server's clock (the transaction's `now()`), read once so that statements take it as a
    parameter: distributed Postgres (Citus) refuses now() inside CASE or COALESCE over a reference
    table, in an upsert's DO UPDATE SET, and volatile functions in UPDATEs of distributed tables."""
    row = conn.execute("SELECT now() AS now").fetchone()
    assert row is not None
    return row["now"]
