"""The nightly job, and the operator's pause switch from the UI."""

import dagster as dg

from memory_assets.resources import DatabaseResource
from memory_lib.lifecycle import pause

slow_path_job = dg.define_asset_job(
    "slow_path_job",
    selection=dg.AssetSelection.groups("slow_path"),
    description="One archival night: candidates → summaries → backups → (checks) → archive rows.",
)


class PauseChangeConfig(dg.Config):
    """Who changes the pause and why: both are kept in archival_pause_events."""

    reason: str
    operator: str


@dg.op
def clear_pause(
    context: dg.OpExecutionContext, config: PauseChangeConfig, database: DatabaseResource
) -> None:
    with database.connect() as conn:
        before = pause.pause_status(conn)
        after = pause.clear_pause(conn, reason=config.reason, actor=config.operator)
    context.add_output_metadata(
        {"was": before.describe(), "now": after.describe(), "changed": before.paused != after.paused}
    )


@dg.job(description="Resume archival after a failed gate: later nights claim and archive again.")
def clear_archival_pause() -> None:
    clear_pause()


@dg.op
def set_pause(context: dg.OpExecutionContext, config: PauseChangeConfig, database: DatabaseResource) -> None:
    with database.connect() as conn:
        state = pause.set_pause(conn, reason=config.reason, actor=config.operator)
    context.add_output_metadata({"now": state.describe()})


@dg.job(description="Stop archival until cleared: nightly runs record why and archive nothing.")
def pause_archival() -> None:
    set_pause()
