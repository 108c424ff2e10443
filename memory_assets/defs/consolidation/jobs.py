"""consolidation_job: a month's digests, facts and key moments (with their checks); yearly_job: a year's digests.

Scheduled monthly (schedules.py); the backlog's months are consolidated by a backfill of the job over
the months wanted (the UI's Materialize); the demo runs it in process.
"""

import dagster as dg

from .assets import key_moments, memory_facts, monthly_digests, yearly_digests

consolidation_job = dg.define_asset_job(
    "consolidation_job",
    selection=[monthly_digests, memory_facts, key_moments],
    description="Level-2 digests, facts and key moments of one month, for every user.",
)
yearly_job = dg.define_asset_job(
    "yearly_digests_job",
    selection=[yearly_digests],
    description="Level-3 digests of one year, from its monthly digests.",
)
