"""Dagster instance storage that stays in this project's state dir, named by the instance files.

`dagster dev -w workspace.yaml` run from the project root without $DAGSTER_HOME loads the root
dagster.yaml but keeps storage in a temporary `.tmp_dagster_home_*` folder that it deletes on exit
(dagster/_cli/utils.py, `_get_temporary_instance` in 1.13): every run, log and schedule tick would be
lost. Dagster's config has no "environment variable with a default" (`{env: VAR}` must be set), so
dagster.yaml names these classes instead; each picks its folder in the process that loads it:

  $DAGSTER_HOME when set (`make dev`, `python -m memory_assets.dev`, the demo: unchanged), else
  $MEMORY_ARCHIVE_STATE_DIR/dagster, else <default state dir>/dagster (<checkout>/.state/dagster in a
  source checkout: memory_lib.core.config.default_state_dir).

Under that folder the layout is Dagster's own default for a DAGSTER_HOME (history/, schedules/,
storage/), so the same history shows whichever way the UI was started. A `base_dir` in the config
still wins.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dagster import Field, StringSource
from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager
from dagster._core.storage.root import LocalArtifactStorage
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage
from dagster._serdes import ConfigurableClassData

_BASE_DIR = {"base_dir": Field(StringSource, is_required=False)}


def instance_dir() -> Path:
    """$DAGSTER_HOME, else <state dir>/dagster (the folder `python -m memory_assets.dev` would use)."""
    home = os.getenv("DAGSTER_HOME")
    if home:
        return Path(home).resolve()
    from memory_assets.dev import state_dir

    return state_dir() / "dagster"


def _base(config_value: dict[str, Any], *parts: str) -> str:
    return str(config_value.get("base_dir") or instance_dir().joinpath(*parts))


class StateDirSqliteStorage(DagsterSqliteStorage):
    """Runs, event logs and schedules in SQLite under instance_dir() (Dagster's default layout)."""

    @classmethod
    def config_type(cls) -> Any:
        return _BASE_DIR

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData, config_value: dict[str, Any]
    ) -> DagsterSqliteStorage:
        return DagsterSqliteStorage.from_local(_base(config_value), inst_data=inst_data)


class StateDirArtifactStorage(LocalArtifactStorage):
    """The instance's root folder (IO manager outputs under storage/, schedules/) at instance_dir()."""

    @classmethod
    def config_type(cls) -> Any:
        return _BASE_DIR

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: dict[str, Any]
    ) -> LocalArtifactStorage:
        base = _base(config_value)
        Path(base).mkdir(parents=True, exist_ok=True)
        return LocalArtifactStorage(base, inst_data=inst_data)


class StateDirComputeLogManager(LocalComputeLogManager):
    """Captured stdout/stderr of steps under instance_dir()/storage, as Dagster's default."""

    @classmethod
    def config_type(cls) -> Any:
        return _BASE_DIR | {"polling_timeout": Field(float, is_required=False)}

    @classmethod
    def from_config_value(  # type: ignore[override]
        cls, inst_data: ConfigurableClassData | None, config_value: dict[str, Any]
    ) -> LocalComputeLogManager:
        return LocalComputeLogManager(
            _base(config_value, "storage"),
            polling_timeout=config_value.get("polling_timeout"),
            inst_data=inst_data,
        )
