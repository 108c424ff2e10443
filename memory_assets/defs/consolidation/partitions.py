"""Months and years of consolidation, in the archival nights' time zone.

A month partition covers every user: the asset iterates the month's users inside and reports per-user
numbers in its metadata. One partition per month (not month × user) keeps the UI honest about what a
month is (is it consolidated or not?) and keeps partitions few whatever the number of users; a user is
rebuilt alone by memory_lib.consolidation.monthly.rebuild_for_user (forget, repairs).

Months start at the month of MEMORY_ARCHIVE_SLOW_PATH__CONSOLIDATION_START_DATE when set, else of the
first archival night. Set it to the oldest memory's month when the nights start later than the
history: the first nights archive older months' memories, and a month that is not a partition never
gets its digest. The month in progress is not a partition yet (end_offset 0): its digest would be
rewritten every day.
"""

from __future__ import annotations

from datetime import date

import dagster as dg

from memory_assets.defs.slow_path.partitions import SLOW_PATH, START

TIMEZONE = SLOW_PATH.timezone
_FIRST = SLOW_PATH.consolidation_start_date or START
FIRST_MONTH = date(_FIRST.year, _FIRST.month, 1)

months = dg.MonthlyPartitionsDefinition(start_date=FIRST_MONTH.isoformat(), timezone=TIMEZONE)
# Dagster has no yearly helper: a cron of January 1 gives one partition per year, keyed "YYYY". The year
# in progress is a partition (end_offset 1): its digest is the year to date, rebuilt as its months complete.
years = dg.TimeWindowPartitionsDefinition(
    start=str(FIRST_MONTH.year), fmt="%Y", cron_schedule="0 0 1 1 *", timezone=TIMEZONE, end_offset=1
)


def partition_day(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> date:
    """The first day of the run's partition (a month or a year)."""
    ctx = context.op_execution_context if isinstance(context, dg.AssetCheckExecutionContext) else context
    return ctx.partition_time_window.start.date()
