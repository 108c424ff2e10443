"""Migration checksums cover the SQL without comments; databases recorded by the whole-text runner upgrade."""

from __future__ import annotations

import shutil

import psycopg
import pytest
from psycopg.rows import dict_row

from memory_lib.core.errors import SchemaError
from memory_lib.storage.db import MIGRATIONS_DIR, load_migrations, migrate, rerender_migration_checksums
from memory_lib.storage.first_shipped_comments import FIRST_SHIPPED_COMMENTS, as_first_shipped
from memory_lib.storage.sql_text import sql_checksum, sql_without_comments

# What the runner recorded before checksums left comments out, for the shipped migrations rendered at
# embedding_dim=32: sha256 of each file's whole text as it shipped then (comments and all). Written down
# from that release, not computed by the code under test.
WHOLE_TEXT_CHECKSUMS_DIM_32 = {
    1: "585b8c7ba8cdee33dbc623e9a6ce061ab8e281b03b0fe4890fa4c1e1834a78de",
    2: "7ede21c286d1a81548a3700daf0dfd61f0864445778415c094795b7c366919b6",
    3: "0ea57372579eb1686442fd9f81bf48672b3f7fba039cb2d8b9d362c551390abc",
    4: "8da98db81466d9a6c1a77271a6aca25934f311fd463da3cac5b6e96e1ec8ebc6",
    5: "cb24c2a260523fd7cbbda0e83f5640019bd8a802d09f23880d054c27b7a4d674",
    6: "0fab7ea0552e7cf9a702771265cdf2a9478b2654c636a57675c9c86a5d352719",
    7: "33a5ac2cfc6a68d2756d4d5ff68ae7d4e4d230d0d9e7831c4a7f07ffca5e34a0",
    8: "90a763abf48a1ad385927ef60b557cd99323d127a43a2bc908bca90b412b172f",
    9: "9fb2345f6cc943878fef0a0bdb1e8e13f8c5ce561753dda02f836dd443073e66",
    10: "d68631b2a255cda98410b603e113202fc3b345b4a1e02e035157abf0b5c4352b",
    11: "e5907efb26fe58eaa2b2d5c87156913bdcc7626717e297b63a2692f4a1f9fc2e",
    12: "6f3c490fe2b46a3c141ef39d8df865319888456153662868754f78b8fd38b4ae",
    13: "6a2b136440f66caf9fc328ee6233a3633afcc13b1c1c89ac13c7254c2ca43f3c",
    14: "37cb0fff77754dd165354232fcbe941987358330cf9f97b727d2751ce44839e0",
    15: "9fc0200ca5030a5e89d91e64cf950698d3607207139e9ee8a1a73b61f7b67569",
    16: "75dddc6f2372d3f3e36096256b7bb899bc7ca22b4808094c269c6639f042a28a",
    17: "975b955783491923676959edfa7c7b287899404f58b297cf513fc3828f067a8c",
    18: "a9afa7d2a647981e5bb66baeb6167ede061705deb47161337be4bed9926b88f4",
    19: "14ec3d6090dfa1e9f565d6b454f930f99e0596809f1b85fd8ea4ff84e581edbf",
    20: "4050b35b0b1f247484586e580a6a10f20aae9d2a5be6eed612cb03f2b25c17c8",
    21: "016dca0fdb0f388dd635b2883de6a6aa3d5758fada2b284017825a4ab214a9f3",
    22: "8be6dbe05ec1f6326296dbec3558b3e2f5028e5b37c36b8e6ed75c2a9148c348",
    23: "3bf8b2d43001c619a325a3dac0d34f316ee02f8bd86105c5d8d2e01f76022050",
    24: "5bab950819f12abacda219dc24ab6c5288b97784b9a62a68356836ad3d034a86",
    25: "df0f4689e17f2f69ac16fc1e2f7ad9ab216d89b6f48ff00ef1ee12dbef624e7d",
}


def _recorded(url: str) -> dict[int, str]:
    with psycopg.connect(url) as c:
        return dict(c.execute("SELECT version, checksum FROM schema_migrations").fetchall())


def _record_as_the_whole_text_runner_did(url: str) -> None:
    with psycopg.connect(url) as c:
        for version, checksum in WHOLE_TEXT_CHECKSUMS_DIM_32.items():
            c.execute("UPDATE schema_migrations SET checksum = %s WHERE version = %s", (checksum, version))


# --------------------------------------------------------------------------- the text a checksum covers


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1; -- why\nSELECT 2;", "SELECT 1;\nSELECT 2;"),
        ("SELECT /* a /* nested */ comment */ 1", "SELECT 1"),
        ("  CREATE   TABLE t\t(a int)  \n\n\n  ;  ", "CREATE TABLE t (a int)\n;"),
        ("SELECT '-- not a comment', '/* nor this */'", "SELECT '-- not a comment', '/* nor this */'"),
        ("SELECT 'it''s -- kept'", "SELECT 'it''s -- kept'"),
        ("SELECT E'it\\'s -- kept' -- gone", "SELECT E'it\\'s -- kept'"),
        ('SELECT 1 AS "a -- b  c"', 'SELECT 1 AS "a -- b  c"'),
        ("AS $$ -- body\n  SELECT  1 $$; -- gone", "AS $$ -- body\n  SELECT  1 $$;"),
        ("AS $fn$ /* $$ */ SELECT 1 $fn$", "AS $fn$ /* $$ */ SELECT 1 $fn$"),
        ("SELECT $1 -- a parameter\n, a$b$ FROM t", "SELECT $1\n, a$b$ FROM t"),
        ("SELECT 'a'   -- continued\n  'b'", "SELECT 'a'\n'b'"),
        ("SELECT 'a' /* x */ 'b'", "SELECT 'a' 'b'"),
    ],
)
def test_comments_go_and_literals_stay_byte_for_byte(sql, expected):
    assert sql_without_comments(sql) == expected


def test_a_change_inside_a_literal_or_a_function_body_changes_the_checksum():
    base = "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 -- one\n$$;\nSELECT 'a  b';"
    reflowed = base.replace("int LANGUAGE", "int\t LANGUAGE").replace(
        "\nSELECT 'a", "  -- why\n\n  SELECT 'a"
    )
    assert sql_checksum(base) == sql_checksum("-- header\n" + reflowed)
    for changed in (
        base.replace("-- one", "-- two"),  # a function body is stored as written, its comments too
        base.replace("'a  b'", "'a b'"),
        base.replace("SELECT 1", "SELECT 2"),
    ):
        assert sql_checksum(changed) != sql_checksum(base)


def test_each_shipped_migration_differs_from_its_first_text_only_in_comments():
    """The pairs that rebuild a migration's first text name text the file still holds, once each, and
    change nothing but comments: the SQL a database applied is the SQL the file holds."""
    for version, pairs in FIRST_SHIPPED_COMMENTS.items():
        (path,) = [p for p in MIGRATIONS_DIR.iterdir() if p.name.startswith(f"{version:03d}_")]
        text = path.read_text(encoding="utf-8")
        for today, _first in pairs:
            assert text.count(today) == 1, f"{path.name} no longer holds, once, the text {today!r}"
        first = as_first_shipped(version, text)
        assert first != text and sql_without_comments(first) == sql_without_comments(text), path.name


def test_whole_text_checksums_are_those_the_earlier_runner_recorded():
    # Migrations written after that runner (026 on) never had a whole-text checksum recorded.
    recorded = {m.version: m.whole_text_checksum for m in load_migrations(embedding_dim=32)}
    assert {
        v: c for v, c in recorded.items() if v in WHOLE_TEXT_CHECKSUMS_DIM_32
    } == WHOLE_TEXT_CHECKSUMS_DIM_32


# --------------------------------------------------------------------------- migrate


def test_a_comment_only_change_is_accepted(empty_database, tmp_path):
    migrations = tmp_path / "sql"
    shutil.copytree(str(MIGRATIONS_DIR), migrations)
    migrate(empty_database, embedding_dim=32, directory=migrations)
    recorded = _recorded(empty_database)
    last = sorted(migrations.glob("0*.sql"))[-1]
    last.write_text(
        "-- A corrected explanation, /* with */ 'quotes'.\n\n" + last.read_text() + "\n-- the end\n"
    )
    assert migrate(empty_database, embedding_dim=32, directory=migrations) == []
    assert _recorded(empty_database) == recorded


def test_an_sql_change_is_refused_naming_the_migration(empty_database, tmp_path):
    migrations = tmp_path / "sql"
    shutil.copytree(str(MIGRATIONS_DIR), migrations)
    migrate(empty_database, embedding_dim=32, directory=migrations)
    path = migrations / "014_forget.sql"
    path.write_text(path.read_text().replace("'pending'", "'waiting'", 1))
    with pytest.raises(SchemaError, match="migration 014_forget changed after it was applied"):
        migrate(empty_database, embedding_dim=32, directory=migrations)


def test_a_database_of_the_whole_text_runner_is_recorded_again_once(empty_database):
    """A database migrated when checksums covered the whole text (comments since corrected included)
    migrates cleanly; its checksums are then the comment-free ones, and stay so."""
    migrate(empty_database, embedding_dim=32)
    _record_as_the_whole_text_runner_did(empty_database)
    assert migrate(empty_database, embedding_dim=32) == []
    expected = {m.version: m.checksum for m in load_migrations(embedding_dim=32)}
    assert _recorded(empty_database) == expected
    assert migrate(empty_database, embedding_dim=32) == [] and _recorded(empty_database) == expected


def test_a_whole_text_checksum_of_other_sql_is_still_refused(empty_database, tmp_path):
    migrations = tmp_path / "sql"
    shutil.copytree(str(MIGRATIONS_DIR), migrations)
    migrate(empty_database, embedding_dim=32, directory=migrations)
    _record_as_the_whole_text_runner_did(empty_database)
    path = migrations / "020_term_statistics.sql"
    path.write_text(path.read_text().replace("df <= 0", "df < 0", 1))
    with pytest.raises(SchemaError, match="migration 020_term_statistics changed after it was applied"):
        migrate(empty_database, embedding_dim=32, directory=migrations)
    assert _recorded(empty_database)[20] == WHOLE_TEXT_CHECKSUMS_DIM_32[20]  # nothing recorded again


def test_a_dimension_flip_rerenders_whole_text_checksums_too(empty_database):
    """A re-embedding flip on a database the whole-text runner recorded: `migrate` at the new dim works."""
    migrate(empty_database, embedding_dim=32)
    _record_as_the_whole_text_runner_did(empty_database)
    with psycopg.connect(empty_database, row_factory=dict_row) as c, c.transaction():
        assert rerender_migration_checksums(c, 48) == len(WHOLE_TEXT_CHECKSUMS_DIM_32)
        c.execute("UPDATE memory_archive_settings SET value = '48' WHERE key = 'embedding_dim'")
    assert _recorded(empty_database) == {m.version: m.checksum for m in load_migrations(embedding_dim=48)}
    assert migrate(empty_database, embedding_dim=48) == []
