"""`promotions`: the nightly sweep of the re-promotion rule (memory_lib.lifecycle.promotion.sweep_promotions).

Expansions promote on the spot (the Nth expansion within the window brings a memory back to hot);
this sweep applies the same rule to every archived memory once a night, so a rule change (fewer
expansions, a longer window) or a promotion an expansion could not finish takes effect. Thin: the
rule, the SQL and the per-promotion transactions are memory_lib's.
"""

from datetime import UTC, datetime
from typing import Any

import dagster as dg
from pydantic import ValidationError

from memory_assets.metadata import markdown_table
from memory_assets.resources import DatabaseResource, ObjectStoreResource
from memory_lib.core.config import PromotionConfig
from memory_lib.core.errors import InvalidInputError
from memory_lib.lifecycle.promotion import sweep_promotions

GROUP = "retrieval"
ACTOR = "dagster:promotions"


class PromotionSweepConfig(dg.Config):
    """Overrides for one run; unset fields come from settings (PromotionConfig)."""

    expansions_to_promote: int | None = None
    window_days: int | None = None
    as_of: str | None = None  # ISO 8601 with a UTC offset; unset: the run's start


def promotion_config(config: PromotionSweepConfig, base: PromotionConfig) -> PromotionConfig:
    """`base` (the run's settings) with the run's overrides, validated."""
    overrides = {
        k: v
        for k, v in (
            ("expansions_to_promote", config.expansions_to_promote),
            ("window_days", config.window_days),
        )
        if v is not None
    }
    try:
        return PromotionConfig.model_validate(base.model_dump() | overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InvalidInputError(f"promotion.{err['loc'][0]}", err.get("input"), err["msg"]) from None


def sweep_as_of(config: PromotionSweepConfig) -> datetime:
    if config.as_of is None:
        return datetime.now(UTC)
    try:
        as_of = datetime.fromisoformat(config.as_of)
    except ValueError:
        raise InvalidInputError("as_of", config.as_of, "must be an ISO 8601 timestamp") from None
    if as_of.tzinfo is None:
        raise InvalidInputError("as_of", config.as_of, "must carry a UTC offset")
    return as_of


@dg.asset(group_name=GROUP, kinds={"postgres"})
def promotions(
    context: dg.AssetExecutionContext,
    config: PromotionSweepConfig,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
) -> dg.MaterializeResult:
    """Archived memories expanded `expansions_to_promote` times within `window_days`, back in the hot
    tier. One transaction per memory; a backup failing verification stays archived and fails the run."""
    rule = promotion_config(config, database.run_settings().promotion)
    as_of = sweep_as_of(config)
    with database.connect() as conn:
        report = sweep_promotions(conn, object_store.get_store(), rule, as_of=as_of, actor=ACTOR)
    metadata: dict[str, Any] = {
        "as_of": as_of.isoformat(),
        "expansions_to_promote": rule.expansions_to_promote,
        "window_days": rule.window_days,
        "due": report.due,
        "promoted": len(report.promoted),
        "skipped": report.skipped,
        "failed": len(report.failed),
    }
    if report.failed:
        rows = [[str(k), v] for k, v in list(report.failed.items())[:20]]
        raise dg.Failure(
            description=f"{len(report.failed)} promotion(s) failed; the memories stay archived",
            metadata=metadata | {"failures": markdown_table(["archive_id", "error"], rows, width=300)},
        )
    context.log.info("promoted %d of %d due archived memories", len(report.promoted), report.due)
    return dg.MaterializeResult(metadata=metadata)
