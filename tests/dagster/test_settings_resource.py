"""One SettingsResource per run: the environment is read once per run, whichever resources hold it, and
a run sees the environment of its own start."""

from __future__ import annotations

import dagster as dg

from memory_assets.defs.common.resources import defs as common_defs
from memory_assets.resources import (
    ArchivalCriteriaResource,
    DatabaseResource,
    ObjectStoreResource,
    SettingsResource,
)
from memory_lib.core.config import Settings


def test_a_run_reads_the_environment_once(db_url, tmp_path, monkeypatch):
    reads: list[int] = []
    real = Settings.from_env.__func__  # type: ignore[attr-defined]

    def counted(cls, env=None, **overrides):
        reads.append(1)
        return real(cls, env, **overrides)

    monkeypatch.setattr(Settings, "from_env", classmethod(counted))
    monkeypatch.setenv("MEMORY_ARCHIVE_ARCHIVAL__BATCH_SIZE", "17")
    settings = SettingsResource()
    seen: dict[str, object] = {}

    @dg.asset
    def probe(
        database: DatabaseResource, archival: ArchivalCriteriaResource, object_store: ObjectStoreResource
    ):
        seen["batch_size"] = archival.get_criteria().batch_size
        seen["retrieval"] = database.run_settings().retrieval
        seen["root"] = str(object_store.config().local_root)

    resources = {
        "database": DatabaseResource(settings=settings, database_url=db_url),
        "archival": ArchivalCriteriaResource(settings=settings),
        "object_store": ObjectStoreResource(settings=settings, kind="local", local_root=str(tmp_path)),
    }
    assert dg.materialize([probe], resources=resources).success
    assert len(reads) == 1 and seen["batch_size"] == 17 and seen["root"] == str(tmp_path)

    # The next run reads the environment of its own start.
    monkeypatch.setenv("MEMORY_ARCHIVE_ARCHIVAL__BATCH_SIZE", "23")
    assert dg.materialize([probe], resources=resources).success
    assert len(reads) == 2 and seen["batch_size"] == 23
    assert SettingsResource._BY_RUN == {}  # released at the end of each run


def test_the_definitions_bind_one_settings_resource_to_every_resource():
    resources = common_defs().resources or {}
    held = {key: r.settings for key, r in resources.items() if key not in ("io_manager", "alerts")}
    assert set(held) == {"database", "object_store", "summarizer", "embedder", "archival"}
    assert len({id(s) for s in held.values()}) == 1 and isinstance(
        next(iter(held.values())), SettingsResource
    )
