"""Reading rows in tests."""

from __future__ import annotations

from typing import TypeVar

import psycopg

Row = TypeVar("Row")


def one(cur: psycopg.Cursor[Row]) -> Row:
    """The row a statement returns: a test that reads one row fails here when there is none."""
    row = cur.fetchone()
    assert row is not None, "the statement returned no row"
    return row
