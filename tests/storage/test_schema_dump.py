"""sql/schema.sql is the schema the migrations make (as procrastinate keeps its schema.sql)."""

from __future__ import annotations

import difflib

from memory_lib.storage.embedded import embedded_bin_dir
from memory_lib.storage.migrations import load_migrations, migrate, shipped_migrations
from memory_lib.storage.schema_dump import DEFAULT_OUTPUT, REGENERATE, default_dim, normalize, render


def test_schema_sql_is_what_the_migrations_make(empty_database):
    migrate(empty_database, embedding_dim=default_dim())
    made = render(empty_database, bin_dir=embedded_bin_dir())
    shipped = DEFAULT_OUTPUT.read_text(encoding="utf-8") if DEFAULT_OUTPUT.is_file() else ""
    if made != shipped:
        diff = "".join(
            list(
                difflib.unified_diff(
                    shipped.splitlines(True), made.splitlines(True), "sql/schema.sql", "migrations"
                )
            )[:80]
        )
        raise AssertionError(
            f"sql/schema.sql is not the schema the migrations make: run {REGENERATE}\n{diff}"
        )


def test_schema_sql_ships_beside_the_migrations_and_is_not_one():
    assert (shipped_migrations() / "schema.sql").is_file()
    assert "schema" not in {m.name for m in load_migrations(embedding_dim=8)}


def test_normalize_drops_what_varies_by_run_owner_and_server():
    dump = (
        "--\n-- PostgreSQL database dump\n--\n\n\\restrict Zq81kRandom\n\n"
        "-- Dumped from database version 18.6\n-- Dumped by pg_dump version 18.6\n\n"
        "SET statement_timeout = 0;\nSELECT pg_catalog.set_config('search_path', '', false);\n\n"
        "--\n-- Name: vector; Type: EXTENSION; Schema: -; Owner: -\n--\n\n"
        "CREATE EXTENSION IF NOT EXISTS vector WITH SCHEMA public;   \n\n\n\n"
        "COMMENT ON EXTENSION vector IS 'vector data type and ivfflat and hnsw access methods';\n\n"
        "CREATE TABLE public.t (\n    a integer -- kept: a comment in a definition\n);\n\n"
        "--\n-- PostgreSQL database dump complete\n--\n\n\\unrestrict Zq81kRandom\n"
    )
    assert normalize(dump) == (
        "CREATE EXTENSION IF NOT EXISTS vector WITH SCHEMA public;\n\n"
        "CREATE TABLE public.t (\n    a integer -- kept: a comment in a definition\n);\n"
    )
