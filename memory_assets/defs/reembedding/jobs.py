"""Re-embedding steps as jobs, launched by hand from the UI (memory_lib.lifecycle.reembedding): start (config: the
target model and dim), flip, flip back, drop the old vectors. Each step checks its own preconditions
and fails naming them (a flip without full coverage names each table's uncovered rows)."""

import dagster as dg

from memory_assets.resources import DatabaseResource
from memory_lib.lifecycle import reembedding
from memory_lib.lifecycle.reembedding import Migration


class StartConfig(dg.Config):
    target_model: str  # e.g. all-MiniLM-L6-v2, text-embedding-3-large, hashing-lexical-v1-384
    target_dim: int
    operator: str = "reembedding_start-job"


class StepConfig(dg.Config):
    operator: str = "reembedding-job"


def _metadata(m: Migration) -> dict[str, object]:
    active, secondary = m.active, m.secondary
    return {
        "migration": m.id,
        "state": m.state,
        "flips": m.flips,
        "active": f"{active[0]} ({active[1]}-d)",
        "secondary": f"{secondary[0]} ({secondary[1]}-d)" if m.open else "none",
    }


def _step(context: dg.OpExecutionContext, database: DatabaseResource, step, operator: str) -> None:
    try:
        with database.connect() as conn:
            m = step(conn, actor=operator)
    except reembedding.ReembeddingError as exc:
        raise dg.Failure(str(exc)) from None
    context.add_output_metadata(_metadata(m))


@dg.op
def start_reembedding(
    context: dg.OpExecutionContext, config: StartConfig, database: DatabaseResource
) -> None:
    """Record the migration and add the second columns (catalog only); then backfill `reembedding`."""
    _step(
        context,
        database,
        lambda conn, actor: reembedding.start(conn, config.target_model, config.target_dim, actor=actor),
        config.operator,
    )


@dg.op
def flip_reembedding(context: dg.OpExecutionContext, config: StepConfig, database: DatabaseResource) -> None:
    """Build the missing indexes (CONCURRENTLY), then swap to the new space in one transaction."""
    _step(context, database, reembedding.flip, config.operator)


@dg.op
def flip_back_reembedding(
    context: dg.OpExecutionContext, config: StepConfig, database: DatabaseResource
) -> None:
    """Swap back to the old space (kept up to date while flipped)."""
    _step(context, database, reembedding.flip_back, config.operator)


@dg.op
def drop_old_reembedding(
    context: dg.OpExecutionContext, config: StepConfig, database: DatabaseResource
) -> None:
    """Drop the old space's columns: the migration is finished, no flip back from here."""
    _step(context, database, reembedding.drop_old, config.operator)


@dg.job(description="Start re-embedding into a new model/dim (config); then backfill the reembedding asset.")
def reembedding_start() -> None:
    start_reembedding()


@dg.job(description="Make the re-embedded space active (refused unless every row is covered).")
def reembedding_flip() -> None:
    flip_reembedding()


@dg.job(description="Make the old embedding space active again.")
def reembedding_flip_back() -> None:
    flip_back_reembedding()


@dg.job(description="After a flip, on request: drop the old vectors; the migration is finished.")
def reembedding_drop_old() -> None:
    drop_old_reembedding()
