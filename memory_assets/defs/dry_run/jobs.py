"""`dry_run`: launch it from the UI (Jobs → dry_run) before the first backfill."""

import dagster as dg

from .assets import archival_dry_run

dry_run = dg.define_asset_job(
    "dry_run",
    selection=[archival_dry_run],
    description="Read-only preview of the Slow Path: eligible counts, 50 summaries to review, projected cost.",
)
