"""The Slow Path's assets and checks as the Dagster tests materialize them: one night, resources pointing
at a test's own database, and readers of what a run recorded."""

from __future__ import annotations

import dagster as dg

from memory_assets.defs.slow_path import assets, checks
from memory_assets.resources import (
    ArchivalCriteriaResource,
    DatabaseResource,
    EmbedderResource,
    SummarizerResource,
)
from testing.constants import TEST_DIM
from testing.dagster_helpers import last_night

SLOW_PATH_DEFS = [
    assets.archival_candidates,
    assets.memory_summaries,
    assets.archive_backups,
    assets.archive_rows,
    checks.backups_round_trip,
    checks.error_rate_gate,
    checks.tiers_consistent,
]
NIGHT = last_night()


def resources(db_url, store, summarizer=None, **criteria):
    return {
        "database": DatabaseResource(database_url=db_url),
        "object_store": store,
        "summarizer": summarizer or SummarizerResource(provider="extractive"),
        "embedder": EmbedderResource(provider="hashing", dim=TEST_DIM),
        "archival": ArchivalCriteriaResource(**criteria),
    }


def materialize(res, night=NIGHT, defs=SLOW_PATH_DEFS, instance=None):
    return dg.materialize(
        defs,
        partition_key=night.isoformat(),
        resources=res,
        instance=instance or dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def checks_of(result) -> dict[str, tuple[bool, str]]:
    return {e.check_name: (e.passed, e.severity.value) for e in result.get_asset_check_evaluations()}


def materialized(result) -> dict[str, dict]:
    return {
        e.asset_key.path[-1]: {k: v.value for k, v in e.materialization.metadata.items()}
        for e in result.get_asset_materialization_events()
    }


def count(conn, sql, *args) -> int:
    return conn.execute(sql, args).fetchone()["n"]
