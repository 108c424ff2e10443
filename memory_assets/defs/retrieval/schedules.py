"""The sweep runs nightly, half an hour after the Slow Path starts, in the same time zone."""

import dagster as dg

from memory_assets.definition_time import SLOW_PATH

from .assets import promotions

promotions_job = dg.define_asset_job(
    "promotions_job",
    selection=[promotions],
    description="Apply the re-promotion rule to every archived memory.",
)

promotions_nightly = dg.ScheduleDefinition(
    name="promotions_nightly",
    job=promotions_job,
    cron_schedule=f"30 {SLOW_PATH.schedule_hour} * * *",
    execution_timezone=SLOW_PATH.timezone,
    description="Nightly re-promotion sweep (memory_lib.lifecycle.promotion.sweep_promotions).",
)
