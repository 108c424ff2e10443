"""Monthly, after the month's last night is archived: the month that just ended is consolidated, then the
digest of its year is brought up to date.

Both tick on the 1st in the nights' time zone, two and three hours after the Slow Path (whose 02:00 run
archives the month's last night), at 23:00 at the latest. Like the Slow Path's, they start stopped:
turn them on in the UI (Automation) once the backlog's months have been consolidated by a backfill.
"""

from datetime import datetime, timedelta

import dagster as dg

from memory_assets.defs.slow_path.partitions import SLOW_PATH

from .jobs import consolidation_job, yearly_job
from .partitions import TIMEZONE

MONTH_HOUR = min(SLOW_PATH.schedule_hour + 2, 23)
YEAR_HOUR = min(SLOW_PATH.schedule_hour + 3, 23)

consolidation_monthly = dg.build_schedule_from_partitioned_job(
    consolidation_job,
    name="consolidation_monthly",
    day_of_month=1,
    hour_of_day=MONTH_HOUR,
    minute_of_hour=0,
    description="Digests, facts and key moments of the month that just ended, for every user.",
)


def year_of_last_month(tick: datetime) -> str:
    """The yearly_digests partition that the month before `tick` belongs to (December -> last year)."""
    return str((tick.date().replace(day=1) - timedelta(days=1)).year)


@dg.schedule(
    job=yearly_job,
    cron_schedule=f"0 {YEAR_HOUR} 1 * *",
    execution_timezone=TIMEZONE,
    name="yearly_digests_monthly",
    description="The year-to-date digest of the year of the month that just ended (its month digests first).",
)
def yearly_digests_monthly(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    key = year_of_last_month(context.scheduled_execution_time)
    return dg.RunRequest(run_key=f"{key}@{context.scheduled_execution_time.date()}", partition_key=key)
