"""The retrievability gate: can each night's archived memories still be found by two-phase search?

Blocking, ERROR severity, on archive_rows, one result per night, read-only. archive_rows probes each
night after its commit (a sample of the night's searchable archive rows, superseded originals never
sampled, searched with their own most specific sentence, memory_lib.archival.retrievability) and keeps the result on
the batch (`archived`: the night's searchable rows); a night below
RetrievalConfig.retrievability_floor (0.9) has already paused archival there. This check reports that
result: the share found in the top 10, the floor, and examples of what was missed.
"""

from collections.abc import Iterator

import dagster as dg

from memory_assets.resources import DatabaseResource
from memory_lib.archival import nights, retrievability

from .assets import archive_rows
from .checks import NOTHING, evaluation
from .partitions import nights as night_partitions
from .partitions import run_nights, run_shard


# asset_check's type wants one AssetCheckResult; Dagster also runs generator checks (one result a night).
@dg.asset_check(asset=archive_rows, blocking=True, partitions_def=night_partitions)  # type: ignore[arg-type]
def archive_retrievable(
    context: dg.AssetCheckExecutionContext, database: DatabaseResource
) -> Iterator[dg.AssetCheckEvaluation | dg.Output]:
    """Each night: the share of sampled archived memories found in the top 10 by their most specific sentence
    is at least the floor (0.9)."""
    with database.connect() as conn:
        for night in run_nights(context):
            key = nights.batch_key_for(night, run_shard(context))
            result = retrievability.recorded(conn, key)
            if result is None or result.share_found is None:
                yield evaluation(
                    context,
                    archive_rows,
                    night,
                    passed=True,
                    metadata={"nothing_to_check": True},
                    description=f"{NOTHING}: {key} has no archived memories probed",
                )
                continue
            meta: dict[str, object] = {
                "floor": result.floor,
                "archived": result.archived,
                "sampled": result.sampled,
                "found": result.found,
                "share_found": round(result.share_found, 4),
                "k": result.k,
                "probe_seconds": round(result.seconds, 2),
                "nothing_to_check": False,
            }
            if result.missed:
                meta["missed_examples"] = ", ".join(str(m) for m in result.missed[:5])
            description = result.describe() + (
                "" if result.passed else ": archived memories are not findable, archival paused"
            )
            yield evaluation(
                context, archive_rows, night, passed=result.passed, metadata=meta, description=description
            )
    yield dg.Output(None)
