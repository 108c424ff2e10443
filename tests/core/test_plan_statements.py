"""The plan runtime sends a long statement with named parameters in Postgres' own `$n` form, parsed once
(psycopg re-parses statements over 4 KiB on every execution): the same rows as psycopg's own conversion,
on the sync and the async runtime, prepared after psycopg's threshold like any other statement."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import _queries
from psycopg.rows import dict_row

from memory_lib.core.plans import Plan, Sql, _native_form, run_plan, run_plan_async
from memory_lib.core.rows import Conn

# Over 4 KiB, a name used twice, a literal % written %%, a comment: what the search statements hold.
_FILLER = "\n".join(
    f"    -- padding line {i}: keeps this statement over psycopg's 4 KiB cache limit" for i in range(70)
)
LONG = f"""SELECT g AS n, %(label)s || '-' || g AS label, %(label)s = 'row' AS same,
           format('%%s%%%%', g) AS pct, g * %(step)s::int AS scaled
    FROM generate_series(1, %(count)s::int) AS g
{_FILLER}
    WHERE g %% 2 = %(parity)s::int
    ORDER BY g"""
PARAMS = {"label": "row", "step": 3, "count": 9, "parity": 1}


def test_native_form() -> None:
    assert len(LONG) > 4096
    form = _native_form(LONG)
    assert form is not None
    query, names = form
    assert names == ("label", "step", "count", "parity")  # first use order; label once
    assert "%(" not in query and query.count("$1") == 2 and "'%s%%'" in query and "g % 2 = $4::int" in query
    # what psycopg itself would send, placeholder for placeholder
    assert query.encode() == _queries._query2pg_nocache(LONG.encode(), "utf-8")[0]
    assert _native_form("SELECT %s") is None and _native_form("SELECT %(a)b") is None  # psycopg's to parse


def _plan(times: int) -> Plan[list[list[dict[str, Any]]]]:
    out = []
    for _ in range(times):
        out.append((yield Sql(LONG, PARAMS)))
    return out


@pytest.fixture
def no_psycopg_parse(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """Records every statement psycopg parses for placeholders without its cache (over 4 KiB)."""
    parsed: list[bytes] = []
    original = _queries._query2pg_nocache

    def spy(query: bytes, encoding: str) -> Any:
        parsed.append(query)
        return original(query, encoding)

    monkeypatch.setattr(_queries, "_query2pg_nocache", spy)
    yield parsed


def test_long_statement_same_rows_parsed_once(conn: Conn, db_url: str, no_psycopg_parse: list[bytes]) -> None:
    expected = conn.execute(LONG, PARAMS).fetchall()  # psycopg's own conversion
    assert len(no_psycopg_parse) == 1
    assert [r["n"] for r in expected] == [1, 3, 5, 7, 9] and expected[0]["pct"] == "1%"
    assert expected[0]["same"] is True and expected[2]["scaled"] == 15

    runs = run_plan(conn, _plan(7))
    assert runs == [expected] * 7
    assert len(no_psycopg_parse) == 1  # the runtime never had psycopg parse it again
    prepared = conn.execute(
        "SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE '%%padding line 69%%'"
    ).fetchone()
    assert prepared is not None and prepared["n"] == 1  # prepared after psycopg's threshold (5 runs)

    async def scenario() -> list[list[dict[str, Any]]]:
        aconn = await psycopg.AsyncConnection.connect(db_url, autocommit=True, row_factory=dict_row)
        try:
            return await run_plan_async(aconn, _plan(6))
        finally:
            await aconn.close()

    assert asyncio.run(scenario()) == [expected] * 6
    assert len(no_psycopg_parse) == 1


def test_missing_parameter_is_an_error(conn: Conn) -> None:
    def plan() -> Plan[Any]:
        return (yield Sql(LONG, {k: v for k, v in PARAMS.items() if k != "step"}))

    with pytest.raises(KeyError, match="step"):
        run_plan(conn, plan())
    assert conn.execute("SELECT 1 AS ok").fetchone() == {"ok": 1}  # the connection is usable after it
