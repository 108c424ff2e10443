"""A plain `dagster dev -w workspace.yaml` in the project root, without DAGSTER_HOME, keeps its history
under <state dir>/dagster: the instance is built the way dagster dev builds it (dagster/_cli/utils.py,
get_possibly_temporary_instance_for_cli), from the root dagster.yaml, and outlives it."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster._cli.utils import get_possibly_temporary_instance_for_cli

from memory_assets.dev import prepare_dagster_home
from testing.dagster_helpers import sqlalchemy_url

ROOT = Path(__file__).resolve().parents[2]


@dg.asset
def one() -> int:
    return 1


def _run_once(instance: dg.DagsterInstance) -> None:
    assert dg.materialize([one], instance=instance).success


def test_without_dagster_home_the_history_stays_in_the_state_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("MEMORY_ARCHIVE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(ROOT)  # dagster dev reads ./dagster.yaml
    home = tmp_path / "state" / "dagster"
    with get_possibly_temporary_instance_for_cli("dagster dev") as instance:
        assert Path(instance.root_directory) == home
        storage = instance.get_ref().storage_data
        assert storage is not None and storage.module_name == "memory_assets.instance_storage"
        assert instance.compute_log_manager._base_dir == str(home / "storage")  # type: ignore[attr-defined]
        _run_once(instance)
    assert (home / "history" / "runs.db").is_file() and (home / "schedules" / "schedules.db").is_file()
    # The next `dagster dev` sees the run (Dagster's own temporary folder is gone by now).
    with get_possibly_temporary_instance_for_cli("dagster dev") as again:
        assert again.get_runs_count() == 1


@pytest.mark.parametrize("pg", [False, True], ids=["dagster.yaml", "dagster.postgres.yaml"])
def test_with_dagster_home_everything_stays_under_it(pg, tmp_path, monkeypatch, empty_database):
    """`make dev` / `python -m memory_assets.dev` / the demo: DAGSTER_HOME wins over the state dir."""
    env = {"DAGSTER_HOME": str(tmp_path / "home"), "MEMORY_ARCHIVE_STATE_DIR": str(tmp_path / "state")}
    if pg:
        env["DAGSTER_PG_URL"] = sqlalchemy_url(empty_database)
    home = prepare_dagster_home(env)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with get_possibly_temporary_instance_for_cli("dagster dev") as instance:
        assert Path(instance.root_directory) == home
        _run_once(instance)
        assert instance.get_runs_count() == 1
    assert (home / "storage").is_dir() and not (tmp_path / "state").exists()
    assert (home / "history" / "runs.db").is_file() != pg
