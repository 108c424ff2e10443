"""Archival nights: one daily partition per night, in the configured time zone; user shards of a run.

The first night is MEMORY_ARCHIVE_PARTITION_START when set; otherwise the night of the oldest memory
(hot or archived), read from the database when the definitions load (a 3 s connect timeout; an
embedded server is read only when it is already running); with no database or no memory, today minus
FALLBACK_DAYS (logged). So a fresh deployment does not show hundreds of "missing" nights.
"""

from __future__ import annotations

import logging
import warnings
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import dagster as dg
import psycopg

from memory_lib.archival.nights import oldest_night, parse_night
from memory_lib.core.config import Settings
from memory_lib.core.errors import InvalidInputError, MemoryArchiveError
from memory_lib.core.shards import ALL, Shard
from memory_lib.storage.db import reachable_url

log = logging.getLogger(__name__)

FALLBACK_DAYS = 7
CONNECT_TIMEOUT_S = 3
# Run tag of a shard run: "i/n" archives only the users of shard i of n (memory_lib.core.shards). Several
# runs of one night, each with its own shard, archive concurrently on separate workers.
SHARD_TAG = "memory-archive/shard"


def partition_start(settings: Settings) -> date:
    """The first archival night (see the module docstring); an explicit setting always wins."""
    slow = settings.slow_path
    if slow.partition_start_date is not None:
        return slow.partition_start_date
    url = reachable_url(settings)
    found, why = None, "no database URL and no running embedded server"
    if url is not None:
        try:
            found = oldest_night(url, slow.timezone, connect_timeout=CONNECT_TIMEOUT_S)
            why = "no memory in the database"
        except (psycopg.Error, MemoryArchiveError) as exc:
            why = f"database not readable ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    if found is not None:
        log.info("archival nights start at the oldest memory's night, %s", found)
        return found
    fallback = datetime.now(ZoneInfo(slow.timezone)).date() - timedelta(days=FALLBACK_DAYS)
    log.warning(
        "archival nights start at %s (today - %d days): %s; set MEMORY_ARCHIVE_PARTITION_START "
        "to choose the first night",
        fallback,
        FALLBACK_DAYS,
        why,
    )
    return fallback


# Read once at import: partitions and the schedule are part of the definitions the UI shows.
SETTINGS = Settings.from_env()
SLOW_PATH = SETTINGS.slow_path
START = partition_start(SETTINGS)

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
