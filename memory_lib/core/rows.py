"""The connection and row types of the whole library: every connection it opens or accepts returns rows
as dicts (`row_factory=dict_row`), so a row is read by column name, never by position."""

from __future__ import annotations

from typing import Any, TypeAlias

import psycopg
from psycopg.rows import DictRow

Row: TypeAlias = dict[str, Any]
Conn: TypeAlias = psycopg.Connection[DictRow]
AsyncConn: TypeAlias = psycopg.AsyncConnection[DictRow]
