"""The archival pause as state you can see, and the alerts.

- `archival_pause_sensor` reads the pause every minute. Its tick says what is true now (Automation →
  the sensor: "archival paused after night-... by ... at ...: why", or "archival is running": the
  tick's skip reason, on its result in the tick list, and the tick's log), and each
  change of the pause is recorded as an observation of the asset `archival_pause` (metadata paused,
  actor, reason, batch_key, changed_at: its page keeps the history). A new pause is alerted.
- `archival_failure_alert` (a run-failure sensor over this code location's jobs) alerts on every
  failed run: a failed blocking gate fails its run, so a night whose gate failed is alerted here.

Both only read; the pause is written by the gated assets and the operator's jobs (see assets.py, jobs.py).
Alerts go through the `alerts` resource (memory_assets.alerts): a webhook from
MEMORY_ARCHIVE_SLOW_PATH__ALERT_WEBHOOK_URL, or whatever a subclass delivers. A webhook that does not
take the alert fails the tick, and the sensor tries again on its next tick.
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg

from memory_assets.alerts import AlertResource
from memory_assets.resources import DatabaseResource
from memory_lib.lifecycle import pause as pause_switch

from .assets import OWNERS

ARCHIVAL_PAUSE = dg.AssetSpec(
    "archival_pause",
    group_name="operations",
    owners=OWNERS,
    kinds={"postgres"},
    tags={"domain": "archival"},
    description="The archival pause switch (table archival_pause), observed by archival_pause_sensor at each "
    "change: paused, who, why, when. Clear it with the clear_archival_pause job.",
)
# Partition/range tags Dagster sets on a run: name the nights of a failed run in its alert.
_NIGHT_TAGS = (
    "dagster/partition",
    "dagster/asset_partition_range_start",
    "dagster/asset_partition_range_end",
)


def pause_metadata(state: pause_switch.PauseState) -> dict[str, Any]:
    return {
        "paused": state.paused,
        "actor": state.actor or "",
        "reason": state.reason or "",
        "batch_key": state.batch_key or "",
        "changed_at": dg.MetadataValue.timestamp(state.changed_at),
        "status": state.describe(),
    }


@dg.sensor(
    name="archival_pause_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Shows whether archival is paused (who, why, when) on each tick; records each change as an "
    "observation of archival_pause and alerts a new pause.",
)
def archival_pause_sensor(
    context: dg.SensorEvaluationContext, database: DatabaseResource, alerts: AlertResource
) -> dg.SensorResult:
    with database.connect() as conn:
        state = pause_switch.pause_status(conn)
    seen = {"paused": state.paused, "changed_at": state.changed_at.isoformat()}
    before = json.loads(context.cursor) if context.cursor else None
    events: list[dg.AssetObservation] = []
    status = state.describe()
    if seen != before:
        events.append(dg.AssetObservation(asset_key=ARCHIVAL_PAUSE.key, metadata=pause_metadata(state)))
        if state.paused:  # a new pause (or one found when the sensor first runs)
            sent = alerts.notify(
                {
                    "event": "archival_paused",
                    "text": f"memory-archive: {status}. Clear it with the clear_archival_pause job "
                    "or `memory-archive pause clear`.",
                    "paused": True,
                    "actor": state.actor,
                    "reason": state.reason,
                    "batch_key": state.batch_key,
                    "changed_at": state.changed_at.isoformat(),
                }
            )
            status += f"; alert {sent}"
    # The tick's skip reason (the tick list shows it on the tick's result) and its log ("View logs").
    (context.log.warning if state.paused else context.log.info)(status)
    return dg.SensorResult(skip_reason=status, asset_events=events, cursor=json.dumps(seen))


@dg.run_failure_sensor(
    name="archival_failure_alert",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Alerts every failed run of this code location (a failed gate fails its night's run) "
    "through the alerts resource.",
)
def archival_failure_alert(context: dg.RunFailureSensorContext, alerts: AlertResource) -> dg.SkipReason:
    run = context.dagster_run
    nights = {k.removeprefix("dagster/"): run.tags[k] for k in _NIGHT_TAGS if k in run.tags}
    # STEP_FAILURE events only: step_failure_data is their event_specific_data (None when absent).
    steps = [
        {
            "step": e.step_key,
            "error": (
                e.step_failure_data.error.message.strip()
                if e.step_failure_data and e.step_failure_data.error
                else e.message or ""
            )[:500],
        }
        for e in context.get_step_failure_events()
    ]
    where = ", ".join(f"{k}={v}" for k, v in nights.items())
    text = f"memory-archive: run {run.run_id[:8]} of {run.job_name} failed" + (f" ({where})" if where else "")
    if steps:
        text += ": " + "; ".join(
            f"{s['step']}: {s['error'].splitlines()[0] if s['error'] else '?'}" for s in steps[:3]
        )
    sent = alerts.notify(
        {
            "event": "run_failure",
            "text": text,
            "run_id": run.run_id,
            "job": run.job_name,
            **nights,
            "failure": context.failure_event.message,
            "failed_steps": steps,
        }
    )
    return dg.SkipReason(f"{text}; alert {sent}")
