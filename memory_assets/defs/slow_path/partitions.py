"""Archival nights: one daily partition per night, in the configured time zone; user shards of a run.

The first night is MEMORY_ARCHIVE_PARTITION_START; unset, today minus FALLBACK_DAYS (logged as a
warning), so a fresh deployment does not show hundreds of "missing" nights. The definitions never read
the database to choose it (they load without one): set it to keep the first night fixed, e.g. to the
night of the oldest memory, which `python -m memory_assets.dev` pins for you when it is unset
(memory_assets.dev.pin_partition_start) and `make demo` sets to the demo's first night.
"""

from __future__ import annotations

import logging
import warnings
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import dagster as dg

from memory_assets.definition_time import SLOW_PATH
from memory_lib.archival.nights import parse_night
from memory_lib.core.config import SlowPathConfig
from memory_lib.core.errors import InvalidInputError
from memory_lib.core.shards import ALL, Shard

log = logging.getLogger(__name__)

FALLBACK_DAYS = 7
# Run tag of a shard run: "i/n" archives only the users of shard i of n (memory_lib.core.shards). Several
# runs of one night, each with its own shard, archive concurrently on separate workers.
SHARD_TAG = "memory-archive/shard"


def partition_start(slow: SlowPathConfig, *, today: date | None = None) -> date:
    """The first archival night (see the module docstring); an explicit setting always wins. No I/O."""
    if slow.partition_start_date is not None:
        return slow.partition_start_date
    today = today or datetime.now(ZoneInfo(slow.timezone)).date()
    fallback = today - timedelta(days=FALLBACK_DAYS)
    log.warning(
        "archival nights start at %s (today - %d days): MEMORY_ARCHIVE_PARTITION_START is unset; set it "
        "(e.g. to the oldest memory's night) to keep the first night fixed",
        fallback,
        FALLBACK_DAYS,
    )
    return fallback


START = partition_start(SLOW_PATH)

nights = dg.DailyPartitionsDefinition(start_date=START.isoformat(), timezone=SLOW_PATH.timezone)

# The first backlog (after the dry run) is a backfill over every past night. A run takes up to a month
# of nights and works through them in date order; runs of one backfill run one after another
# (dagster.yaml limits them per backfill), and each run is gated by its own checks, so a bad month
# stops archival without holding back the months already archived.
BACKFILL_NIGHTS_PER_RUN = SLOW_PATH.backfill_nights_per_run
# backfill_policy is a beta parameter of @asset in 1.13, in use since 1.5: say so once, here, not per asset.
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy`", category=dg.BetaWarning)
backfill_policy = dg.BackfillPolicy.multi_run(max_partitions_per_run=BACKFILL_NIGHTS_PER_RUN)


def run_nights(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> list[date]:
    """The nights of this run, oldest first (one, or a backfill's range)."""
    ctx = context.op_execution_context if isinstance(context, dg.AssetCheckExecutionContext) else context
    return sorted(parse_night(k) for k in ctx.partition_keys)


def run_shard(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> Shard:
    """The run's user shard, from its SHARD_TAG ("i/n"); every user without the tag. A bad value fails
    the step before anything is written, naming the tag and the value."""
    ctx = context.op_execution_context if isinstance(context, dg.AssetCheckExecutionContext) else context
    value = ctx.run.tags.get(SHARD_TAG)
    try:
        return ALL if value is None else Shard.parse(value, field=SHARD_TAG)
    except InvalidInputError as exc:  # a Failure: the UI shows the message itself, not a traceback
        raise dg.Failure(description=str(exc), metadata={"tag": SHARD_TAG, "value": value}) from exc
