"""Nightly at schedule_hour (02:00 by default) for the night that just ended.

The tick runs in the partitions' time zone (SlowPathConfig.timezone); Dagster refuses execution_timezone
together with hour_of_day, the zone comes from the partitions definition.
"""

import dagster as dg

from .jobs import slow_path_job
from .partitions import SLOW_PATH

slow_path = dg.build_schedule_from_partitioned_job(
    slow_path_job,
    name="slow_path",
    hour_of_day=SLOW_PATH.schedule_hour,
    minute_of_hour=0,
    description="The Slow Path for the previous day's partition; does nothing (and says why) while paused.",
)
