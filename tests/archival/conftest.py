"""Fixtures of the archival tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from memory_lib.core.rows import Conn


@pytest.fixture
def test_trigger(conn: Conn) -> Iterator[Callable[..., None]]:
    """`test_trigger(name, table, when, body, level='ROW')`: a plpgsql trigger function `name()` with
    `body` and its trigger on `table`, both dropped after the test. On Citus a session's databases are
    emptied between tests, not made again: a trigger left behind would fire in the next test."""
    made: list[tuple[str, str]] = []

    def create(name: str, table: str, when: str, body: str, level: str = "ROW") -> None:
        conn.execute(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ {body} $$")
        made.append((name, table))
        conn.execute("SET citus.enable_unsafe_triggers = on")  # a trigger on a distributed table (Citus)
        conn.execute(f"CREATE TRIGGER {name} {when} ON {table} FOR EACH {level} EXECUTE FUNCTION {name}()")

    yield create
    for name, table in made:
        try:
            conn.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            conn.execute(f"DROP FUNCTION IF EXISTS {name}()")
        except psycopg.Error:
            pass  # a closed or broken connection: a database per test (single node) is dropped anyway
