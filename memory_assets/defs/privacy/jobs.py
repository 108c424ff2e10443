"""`forget_user`: erase every memory of one user (right to erasure), then prove nothing of it remains."""

from typing import Any

import dagster as dg

from memory_assets.metadata import markdown_table
from memory_assets.resources import DatabaseResource, ObjectStoreResource
from memory_lib.lifecycle import forget


class ForgetUserConfig(dg.Config):
    user_id: str
    operator: str = "forget_user-job"


@dg.op(out=dg.Out(str))
def forget_user_memories(
    context: dg.OpExecutionContext,
    config: ForgetUserConfig,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
) -> str:
    """memory_lib.lifecycle.forget.forget_user: objects (every version), then rows, then tombstones. A killed run
    leaves an unfinished request that the next run of this job resumes."""
    with database.connect() as conn:
        result = forget.forget_user(conn, object_store.get_store(), config.user_id, actor=config.operator)
    context.add_output_metadata(
        {
            "request_id": str(result.request_id),
            "memories": len(result.memory_ids),
            "object_versions_deleted": result.object_versions_deleted,
            "resumed": result.resumed,
            "rows_deleted": markdown_table(["table", "rows"], sorted(result.rows_deleted.items())),
        }
    )
    return config.user_id


@dg.op
def verify_user_forgotten(
    context: dg.OpExecutionContext,
    user_id: str,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
) -> None:
    """Fails the run unless nothing of the user remains: no row in any table with a user_id (listed by
    information_schema, known to forget or not) but the redacted audit log, no audit event with content,
    and no version or delete marker of any of the user's backup keys."""
    with database.connect() as conn:
        left = forget.remaining(conn, object_store.get_store(), user_id)
    metadata: dict[str, Any] = {
        "rows_left": markdown_table(["table", "rows"], sorted(left.rows.items())),
        "unredacted_events": left.unredacted_events,
        "object_versions_left": len(left.objects),
        "tables_unknown_to_forget": ", ".join(left.uncovered_tables) or "none",
    }
    context.add_output_metadata(metadata)
    if not left.clean:
        raise dg.Failure(f"user {user_id!r} is not fully forgotten: {left}", metadata=metadata)
    if left.uncovered_tables:
        context.log.warning(
            f"tables with a user_id not in memory_lib.lifecycle.forget.erased_tables(): {left.uncovered_tables}"
        )


@dg.job(description="Forget one user (config user_id): every tier, table and object version; verified.")
def forget_user() -> None:
    verify_user_forgotten(forget_user_memories())
