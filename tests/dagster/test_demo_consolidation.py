"""The demo's consolidation section (memory_assets.demo_consolidation.consolidation), run on the tests' small demo
history: it materializes the consolidation assets through Dagster (consolidation_job per month partition
with memories, yearly_digests_job per year) in a real instance, so the UI shows them, and prints one
"who is …?" answer from facts whose every source is shown with its id and its tier. The full
`make demo` takes minutes; this is the function it calls, on real Postgres after a real archival night."""

from __future__ import annotations

import re
import uuid

import dagster as dg
import pytest

from memory_assets.demo_consolidation import consolidation
from memory_assets.resources import DatabaseResource, EmbedderResource, SummarizerResource
from memory_lib.archival.pipeline import run_batch
from memory_lib.consolidation.sources import user_months
from memory_lib.core.config import ArchivalCriteria
from memory_lib.lifecycle.restore import restore_archive
from memory_lib.llm.embedding import HashingEmbedder
from testing.constants import TEST_DIM
from testing.dagster_helpers import END
from testing.factories import archival_services

EMB = HashingEmbedder(TEST_DIM)
_SOURCE = re.compile(
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}) \((hot|archived|missing)\)"
)


def _tier(conn, user: str, memory_id: uuid.UUID) -> str:
    if conn.execute("SELECT 1 FROM memories WHERE user_id = %s AND id = %s", (user, memory_id)).fetchone():
        return "hot"
    if conn.execute(
        "SELECT 1 FROM archived_memories WHERE user_id = %s AND original_id = %s", (user, memory_id)
    ).fetchone():
        return "archived"
    return "missing"


@pytest.fixture
def instance(tmp_path):
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as inst:
        yield inst


def _resources(db_url: str) -> dict:
    return {
        "database": DatabaseResource(database_url=db_url),
        "embedder": EmbedderResource(provider="hashing", dim=TEST_DIM),
        "summarizer": SummarizerResource(provider="extractive"),
    }


def test_the_demo_consolidates_through_dagster_so_the_instance_shows_every_month(
    conn, db_url, history, local_store, instance, capsys
):
    services = archival_services(local_store, embedder=EMB)
    assert run_batch(conn, services, ArchivalCriteria(), batch_key="n1", as_of=END, actor="test").gate_passed
    assert consolidation(conn, instance, _resources(db_url)) is True
    out = capsys.readouterr().out
    months = sorted({m.isoformat() for _, m in user_months(conn, tz="UTC")})
    assert len(months) >= 4, months
    assert f"months {months[0][:7]}..{months[-1][:7]} by {len(months)} runs of consolidation_job" in out, out
    for asset in ("monthly_digests", "memory_facts", "key_moments"):
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == set(months), asset
    assert instance.get_materialized_partitions(dg.AssetKey("yearly_digests")) == {months[0][:4]}
    # Runs of the jobs the schedules run, each with its blocking checks, all passed, in the instance.
    runs = instance.get_run_records(dg.RunsFilter())
    assert sorted(r.dagster_run.job_name for r in runs) == ["consolidation_job"] * len(months) + [
        "yearly_digests_job"
    ]
    assert all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    fresh = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(dg.AssetKey("monthly_digests"), "monthly_digests_fresh"), limit=50
    )
    assert sorted(r.partition for r in fresh) == months
    assert "checks (blocking, per partition): provenance and freshness OK on every partition" in out
    # What the instance says matches the database: one digest per user and month built.
    meta = (
        instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("monthly_digests"), asset_partitions=[months[0]]),
            limit=1,
        )
        .records[0]
        .asset_materialization.metadata
    )
    digests = conn.execute(
        "SELECT count(*) AS n FROM memory_digests WHERE level = 2 AND period_start = %s", (months[0],)
    ).fetchone()["n"]
    assert meta["built"].value == meta["users"].value == digests > 0


def test_the_demo_answers_who_is_from_facts_with_each_sources_id_and_tier(
    conn, db_url, history, local_store, instance, capsys
):
    services = archival_services(local_store, embedder=EMB)
    assert run_batch(conn, services, ArchivalCriteria(), batch_key="n1", as_of=END, actor="test").gate_passed
    assert consolidation(conn, instance, _resources(db_url)) is True  # checks green
    first = capsys.readouterr().out
    who = re.search(
        r"^who is (.+)\? \((\S+), answered from facts, with their sources\)$", first, re.MULTILINE
    )
    assert who, first
    name, user = who.group(1), who.group(2)
    # A source printed as archived goes back to hot memory (restore): the next run prints it as hot.
    fact, archived_source = next(
        (line[: line.index(" (from ")], uuid.UUID(i))
        for line in first.splitlines()
        if line.startswith("  - ")
        for i, t in _SOURCE.findall(line)
        if t == "archived"
    )
    restore_archive(conn, local_store, user_id=user, original_id=archived_source, actor="test")

    # The month is rebuilt for the restore: still fresh.
    assert consolidation(conn, instance, _resources(db_url)) is True
    out = capsys.readouterr().out
    lines = out[out.index(f"who is {name}?") :].splitlines()[1:]
    facts = [line for line in lines if line.startswith("  - ")]
    assert facts and any(f"has manager {name} (" in x for x in facts), out
    shown = [(uuid.UUID(i), t) for line in facts for i, t in _SOURCE.findall(line)]
    assert shown, out
    for memory_id, tier in shown:  # every printed source: a memory of this user, with its tier as stored
        assert tier == _tier(conn, user, memory_id) != "missing"
    assert {t for _, t in shown} <= {"hot", "archived"}
    line = next(x for x in facts if x.startswith(f"{fact} (from "))
    assert dict(_SOURCE.findall(line))[str(archived_source)] == "hot"
    subject_predicate_object = fact.removeprefix("  - ")
    ids = conn.execute(
        """SELECT array_agg(DISTINCT s) AS ids FROM memory_facts, unnest(source_memory_ids) AS s
           WHERE user_id = %s AND subject || ' ' || predicate || ' ' || object = %s""",
        (user, subject_predicate_object),
    ).fetchone()["ids"]
    counts = re.search(r"(\d+) sources?, (\d+) archived", line)
    assert counts and int(counts.group(1)) == len(ids) and archived_source in ids
    assert int(counts.group(2)) == sum(_tier(conn, user, i) == "archived" for i in ids)
