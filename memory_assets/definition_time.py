"""The values Dagster fixes when the definitions load, read from the environment once, here.

Partitions (first night, time zone), schedules (hour), concurrency pools, the backfill policy and asset
kinds are part of the definitions the UI shows before any run: they cannot come from a run's
SettingsResource (memory_assets.resources), which is the only other place memory_assets reads the
environment. This read is of the environment alone: no database, no file, no network, so the
definitions load (and `lint-imports` imports them) without a database.
"""

from __future__ import annotations

from memory_lib.core.config import Settings

# Definition-time only: at run time every setting comes from SettingsResource.
SETTINGS_AT_LOAD = Settings.from_env()
SLOW_PATH = SETTINGS_AT_LOAD.slow_path
# The asset kind of the configured object store ('s3' or 'file'): kinds are static per definition.
STORE_KIND = "s3" if SETTINGS_AT_LOAD.object_store.kind == "s3" else "file"
