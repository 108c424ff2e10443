"""Real components for the whole session: one embedded Postgres, one SeaweedFS, one fake LLM server.

The fixtures live in plugins by component (loaded here, so every test sees them): tests/fix_db.py (the
embedded Postgres, a fresh migrated database per test), tests/fix_store.py (object stores, SeaweedFS),
tests/fix_llm.py (the fake LLM server), tests/fix_clients.py (clients, services, archived memories, the
CLI's environment). Constants come from testing.constants.
"""

from __future__ import annotations

import os

from hypothesis import settings as hypothesis_settings

pytest_plugins = ["tests.fix_db", "tests.fix_store", "tests.fix_llm", "tests.fix_clients"]

# CI replays a fixed set of examples (a run there must be reproducible); locally, hypothesis keeps
# exploring new ones and remembers failures in .hypothesis/.
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")

# The Dagster definitions load once per process, before any test database exists, and take their first
# night from the database unless it is set: the tests' fixed histories (2026) need a fixed start.
os.environ.setdefault("MEMORY_ARCHIVE_PARTITION_START", "2025-01-01")
