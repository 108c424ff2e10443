"""`rollback`: bring archived memories back to the hot tier from their verified backups."""

from typing import Any

import dagster as dg

from memory_assets.metadata import markdown_table
from memory_assets.resources import DatabaseResource, ObjectStoreResource
from memory_lib.lifecycle import restore
from memory_lib.lifecycle.pause import pause_status
from memory_lib.llm.embedding import Embedder, embedder_from_settings


class RollbackConfig(dg.Config):
    """Choose one: all=true, a user_id, or original_ids (optionally with the user_id they belong to)."""

    all: bool = False
    user_id: str | None = None
    original_ids: list[str] = []
    # Unset: pause archival when restoring all (no night archives anything until the pause is cleared).
    # Paused or not, a restored memory stays hot until the criteria, counted from its restore, select it.
    pause_archival: bool | None = None
    operator: str = "rollback-job"


class _LazyEmbedder:
    """The configured embedder (settings, as the library client's), built only when a backup from before a
    re-embedding flip needs it: most restores reuse the backup's vector, and the local model takes seconds
    to load."""

    def __init__(self, database: DatabaseResource):
        self._database = database
        self._embedder: Embedder | None = None

    def __getattr__(self, name: str) -> Any:  # an Embedder's attribute
        if self._embedder is None:
            self._embedder = embedder_from_settings(self._database.run_settings().embedding)
        return getattr(self._embedder, name)


@dg.op
def restore_archives(
    context: dg.OpExecutionContext,
    config: RollbackConfig,
    database: DatabaseResource,
    object_store: ObjectStoreResource,
) -> None:
    """Each memory restored in its own savepoint after its backup's sha256 is verified, committed 50 at
    a time; memories already hot are counted, not touched. Interrupted or partly failed: run it again."""
    store = object_store.get_store()
    with database.connect() as conn:

        def progress(r: restore.RestoreReport) -> None:
            context.log.info(f"restored {r.restored}, already hot {r.already_hot}, failed {r.failed}")

        report = restore.restore_archives(
            conn,
            store,
            actor=config.operator,
            all_archives=config.all,
            user_id=config.user_id,
            original_ids=config.original_ids or None,
            progress=progress,
            pause_archival=config.pause_archival,
            embedder=_LazyEmbedder(database),
        )
        paused = pause_status(conn)
    if paused.paused:
        context.log.warning(paused.describe())
    metadata: dict[str, Any] = {
        "requested": report.requested,
        "restored": report.restored,
        "already_hot": report.already_hot,
        "not_found": report.not_found,
        "failed": report.failed,
        "duration_s": round(report.seconds, 2),
        "archival_paused": report.paused_archival,
    }
    if report.errors:
        metadata["errors"] = markdown_table(["error"], [[e] for e in report.errors], width=300)
    context.add_output_metadata(metadata)
    if report.failed:
        raise dg.Failure(
            f"{report.failed} memories not restored (see errors); restored ones stay restored: run again",
            metadata=metadata,
        )


@dg.job(description="Restore all, one user's, or selected archived memories (config), verified by sha256.")
def rollback() -> None:
    restore_archives()
