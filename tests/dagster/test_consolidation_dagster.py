"""The consolidation assets and their blocking checks through Dagster (dg.materialize), on a real database."""

from __future__ import annotations

import uuid

import dagster as dg
import pytest

from memory_assets.defs.consolidation import assets, checks
from memory_assets.defs.consolidation.jobs import consolidation_job
from memory_assets.resources import DatabaseResource, EmbedderResource, SummarizerResource
from memory_lib.archival.pipeline import run_batch
from memory_lib.core.config import ArchivalCriteria
from memory_lib.llm.embedding import HashingEmbedder
from testing.constants import TEST_DIM
from testing.dagster_helpers import END, metadata_value
from testing.factories import archival_services

MONTHLY = [
    assets.monthly_digests,
    assets.memory_facts,
    assets.key_moments,
    checks.monthly_digests_provenance,
    checks.monthly_digests_fresh,
    checks.memory_facts_provenance,
    checks.key_moments_provenance,
]


@pytest.fixture
def archived_history(conn, history, local_store):
    services = archival_services(local_store)
    assert run_batch(conn, services, ArchivalCriteria(), batch_key="n1", as_of=END, actor="test").archived > 0
    return conn.execute(
        "SELECT date_trunc('month', min(original_created_at))::date AS m FROM archived_memories"
    ).fetchone()["m"]


def _resources(db_url):
    return {
        "database": DatabaseResource(database_url=db_url),
        "summarizer": SummarizerResource(provider="extractive"),
        "embedder": EmbedderResource(provider="hashing", dim=TEST_DIM),
    }


def _run(db_url, defs, key):
    return dg.materialize(
        defs,
        partition_key=key,
        resources=_resources(db_url),
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )


def _checks(result) -> dict[str, bool]:
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}


def _done(result) -> set[str]:
    return {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}


def test_a_month_then_its_year_build_with_passing_checks(conn, db_url, archived_history):
    month = archived_history
    result = _run(db_url, MONTHLY, month.isoformat())
    assert result.success and _done(result) == {"monthly_digests", "memory_facts", "key_moments"}
    assert set(_checks(result).values()) == {True} and len(_checks(result)) == 4
    meta = {
        e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()
    }
    assert meta["monthly_digests"]["built"].value == meta["monthly_digests"]["users"].value == 3
    assert meta["memory_facts"]["extractor"].value == "rules-offline-v1"
    again = _run(db_url, MONTHLY, month.isoformat())
    assert again.success
    assert {
        e.asset_key.path[-1]: metadata_value(e.materialization, "unchanged")
        for e in again.get_asset_materialization_events()
    } == {"monthly_digests": 3, "memory_facts": 3, "key_moments": 3}
    year = _run(db_url, [assets.yearly_digests, checks.yearly_digests_provenance], str(month.year))
    assert year.success and _checks(year) == {"yearly_digests_provenance": True}
    assert conn.execute("SELECT count(*) AS n FROM memory_digests WHERE level = 3").fetchone()["n"] == 3
    assert consolidation_job.name == "consolidation_job"


def test_a_dangling_or_foreign_source_fails_the_check_and_blocks_downstream(conn, db_url, archived_history):
    month = archived_history
    foreign = conn.execute("SELECT id FROM memories WHERE user_id = 'user-bruno' LIMIT 1").fetchone()["id"]
    for source in (uuid.uuid4(), foreign):
        conn.execute("DELETE FROM memory_facts")
        conn.execute(
            """INSERT INTO memory_facts (user_id, kind, subject, predicate, object, valid_from, source_memory_ids,
                   extractor, embedding, embedding_model, source_month)
               VALUES ('user-ada', 'person', 'Ada', 'knows', 'Maya', now(), %s, 'test', %s, 'm', %s)""",
            ([source], HashingEmbedder(TEST_DIM).embed(["Ada knows Maya"])[0], month),
        )
        result = _run(db_url, MONTHLY, month.isoformat())
        assert not result.success
        assert _checks(result)["monthly_digests_provenance"] is False
        assert _done(result) == {"monthly_digests"}  # facts and key moments did not run
        evaluation = next(
            e for e in result.get_asset_check_evaluations() if e.check_name == "monthly_digests_provenance"
        )
        assert str(source) in metadata_value(evaluation, "examples")
