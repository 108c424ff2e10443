"""`connect` takes the URL as the settings hold it: Settings.database_url is a SecretStr."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr

from memory_lib import Settings
from memory_lib.storage.db import connect


def test_connect_takes_the_settings_database_url(db_url: str) -> None:
    settings = Settings.from_env({"DATABASE_URL": db_url})
    assert isinstance(settings.database_url, SecretStr)
    with connect(settings.database_url) as conn:
        row = conn.execute("SELECT current_database() AS db, '[1,2,3]'::vector AS v").fetchone()
    assert row is not None
    assert row["db"] == conninfo_to_dict(db_url)["dbname"]
    assert row["v"].to_list() == [1.0, 2.0, 3.0]  # pgvector types registered (unregistered: a str)


def test_connect_still_takes_a_plain_url(db_url: str) -> None:
    with connect(db_url, autocommit=False) as conn:
        assert conn.autocommit is False
        row = conn.execute("SELECT 1 AS one").fetchone()
    assert row == {"one": 1}
