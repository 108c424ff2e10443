"""A database migrated to just before one migration, to test that migration over existing rows."""

from __future__ import annotations

from pathlib import Path

from memory_lib.storage.db import MIGRATIONS_DIR, migrate


def migrate_before(url: str, version: str, scratch: Path, *, embedding_dim: int = 4) -> None:
    """Apply the shipped migrations numbered below `version` ("023"): copied to `scratch`, as a database
    deployed before `version` shipped; `migrate(url, ...)` then applies the rest."""
    before = scratch / "sql"
    before.mkdir()
    for f in sorted(Path(str(MIGRATIONS_DIR)).glob("*.sql")):
        if f.name < version:
            (before / f.name).write_text(f.read_text())
    migrate(url, embedding_dim=embedding_dim, directory=before)
