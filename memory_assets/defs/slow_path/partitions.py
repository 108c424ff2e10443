"""Archival nights: one daily partition per night, in the configured time zone."""

from __future__ import annotations

import warnings
from datetime import date

import dagster as dg

from memory_lib.config import Settings
from memory_lib.nights import parse_night

# Read once at import: partitions and the schedule are part of the definitions the UI shows.
SLOW_PATH = Settings.from_env().slow_path

nights = dg.DailyPartitionsDefinition(
    start_date=SLOW_PATH.partition_start_date.isoformat(),
    timezone=SLOW_PATH.timezone,
)

# The first backlog (seed's Phase 3) is a backfill over every past night. A run takes up to a month
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
