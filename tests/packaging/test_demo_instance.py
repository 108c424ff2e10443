"""What the Dagster UI shows after `make demo`: its instance, read as the UI reads it, night by night.

The demo's own run (the session's `demo` fixture: the daemon's backfill, the consolidation jobs, the
sensors' ticks) in its own state dir; this reads the instance under <state>/dagster: each night's
tiers mean the same on archive_rows and stub_conversions and add up to what the demo printed,
retention_scores records no tiers, memory_summaries' counts are its steps' own, every size has its
unit, every consolidation partition with memories is materialized, and the pause sensor's ticks say
why (the skip reason on the tick and its log).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import InstigatorType

from tests.packaging.conftest import DemoRun

pytestmark = pytest.mark.slow

_UNIT = re.compile(r"^(\d+ B|\d+\.\d (KiB|MiB|GiB|TiB)) \(([\d,]+) bytes\)")


@pytest.fixture(scope="module")
def instance(demo: DemoRun) -> Iterator[dg.DagsterInstance]:
    assert demo.proc.returncode == 0, demo.proc.stdout[-3000:] + demo.proc.stderr[-3000:]
    with dg.DagsterInstance.from_config(str(demo.state / "dagster")) as inst:
        yield inst


def _page(instance: dg.DagsterInstance, asset: str, night: str) -> dict:
    [record] = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[night]), limit=10
    ).records
    assert record.asset_materialization is not None
    return {k: v.value for k, v in record.asset_materialization.metadata.items()}


def test_each_nights_page_says_what_its_names_say(demo: DemoRun, instance: dg.DagsterInstance) -> None:
    nights = sorted(instance.get_materialized_partitions(dg.AssetKey("archive_rows")))
    assert len(nights) == 60
    for asset in ("retention_scores", "memory_summaries", "archive_backups", "stub_conversions"):
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == set(nights), asset
    archived_before, sizes = 0, 0
    for night in nights:
        scores, summaries, backups, rows, stubs = (
            _page(instance, a, night)
            for a in (
                "retention_scores",
                "memory_summaries",
                "archive_backups",
                "archive_rows",
                "stub_conversions",
            )
        )
        # The tiers at the end of the night: the same on both pages, the night's archival included.
        assert (stubs["hot_memories"], stubs["archived_memories"]) == (
            rows["hot_memories"],
            rows["archived_memories"],
        ), night
        assert rows["archived_memories"] == archived_before + rows["archived"], night
        archived_before = rows["archived_memories"]
        assert not {"hot_memories", "archived_memories"} & set(scores), night
        # memory_summaries: each step's own counts.
        assert "processed" not in summaries
        assert summaries["summarize_processed"] == summaries["summarized"] == rows["archived"], night
        assert summaries["embed_processed"] == summaries["embedded"] == summaries["summarized"], night
        # Sizes: an int named in bytes, beside the same size as text with a unit.
        for page in (backups, rows):
            for key, n in page.items():
                if "bytes" in key:
                    match = _UNIT.match(page[key.replace("bytes", "size")])
                    assert match and int(match.group(3).replace(",", "")) == n, (night, key)
                    sizes += 1
    assert sizes >= 2 * len(nights)
    # The last night's tiers are the ones the demo printed from the tables after the backfill.
    tiers = re.search(r"^tiers after: hot (\d+), archived (\d+)", demo.proc.stdout, re.M)
    assert tiers, demo.proc.stdout[-3000:]
    last = _page(instance, "archive_rows", nights[-1])
    assert (last["hot_memories"], last["archived_memories"]) == (int(tiers.group(1)), int(tiers.group(2)))
    assert "not as of this night" in last["hot_table_size_after_run"]


def test_the_demos_consolidation_is_materialized_in_the_instance(
    demo: DemoRun, instance: dg.DagsterInstance
) -> None:
    span = re.search(r"^months (\d{4}-\d{2})\.\.(\d{4}-\d{2}) by (\d+) runs", demo.proc.stdout, re.M)
    assert span, demo.proc.stdout[-3000:]
    first, last = (date.fromisoformat(f"{m}-01") for m in span.groups()[:2])
    months = {
        date(y, m, 1).isoformat()
        for y in range(first.year, last.year + 1)
        for m in range(1, 13)
        if first <= date(y, m, 1) <= last
    }
    assert len(months) == int(span.group(3)) >= 4
    for asset in ("monthly_digests", "memory_facts", "key_moments"):
        assert instance.get_materialized_partitions(dg.AssetKey(asset)) == months, asset
    assert instance.get_materialized_partitions(dg.AssetKey("yearly_digests")) == {
        str(y) for y in range(first.year, last.year + 1)
    }


def test_the_pause_sensors_ticks_say_why(instance: dg.DagsterInstance) -> None:
    [state] = [
        s
        for s in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
        if s.instigator_name == "archival_pause_sensor"
    ]
    ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=10)
    assert ticks
    for tick in ticks:
        assert tick.tick_data.skip_reason == "archival is running"
        assert tick.log_key is not None
        logged = instance.compute_log_manager.get_log_data(tick.log_key)
        assert b"archival is running" in (logged.stderr or b"") + (logged.stdout or b"")
