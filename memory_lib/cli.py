"""`memory-archive`: migrate, inspect, archive and restore from a shell, without Dagster."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from datetime import UTC, datetime

from .archive import ArchivalServices, archive_batch, archived_ids, eligible_counts, restore_archive
from .config import Settings
from .db import migrate, open_database
from .errors import MemoryArchiveError
from .store import tier_stats


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memory-archive", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="create or upgrade the schema")
    sub.add_parser("stats", help="memories per tier, bytes on disk, eligible backlog")
    a = sub.add_parser("archive", help="archive one batch of eligible memories")
    a.add_argument("--batch-key", help="default: adhoc-<timestamp>")
    a.add_argument("--limit", type=int, help="at most this many (default: archival.batch_size)")
    r = sub.add_parser("restore", help="bring archived memories back to the hot tier")
    r.add_argument("--user-id", help="only this user's archives")
    r.add_argument("--original-id", type=uuid.UUID, help="one memory (needs --user-id)")
    r.add_argument("--all", action="store_true", help="every archive (of --user-id when given)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        with open_database(settings) as db:
            if args.command == "migrate":
                applied = migrate(db.url, embedding_dim=settings.embedding.dim)
                print(json.dumps({"applied": applied}))
                return 0
            migrate(db.url, embedding_dim=settings.embedding.dim)
            with db.connect() as conn:
                return _run(args, settings, conn)
    except MemoryArchiveError as exc:
        print(f"memory-archive: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, settings: Settings, conn) -> int:
    now = datetime.now(UTC)
    if args.command == "stats":
        stats = tier_stats(conn)
        eligible = eligible_counts(conn, settings.archival, now)
        print(json.dumps({"hot": stats.hot, "archived": stats.archived, "hot_bytes": stats.hot_bytes,
                          "archived_bytes": stats.archived_bytes, "eligible": eligible}))  # fmt: skip
        return 0
    services = ArchivalServices.from_settings(settings)
    if args.command == "archive":
        key = args.batch_key or f"adhoc-{now:%Y%m%dT%H%M%S}"
        report = archive_batch(conn, services, settings.archival, batch_key=key, as_of=now, actor="cli",
                               limit=args.limit, workers=settings.llm.max_concurrency)  # fmt: skip
        print(json.dumps({"batch_key": key, "claimed": report.claim.claimed, "archived": report.status.archived,
                          "failed": report.status.failed, "gate_passed": report.gate_passed}))  # fmt: skip
        return 0 if report.gate_passed else 1
    if args.original_id is not None:
        if not args.user_id:
            print("memory-archive: --original-id needs --user-id", file=sys.stderr)
            return 2
        targets = [(args.user_id, args.original_id)]
    elif args.all:
        targets = archived_ids(conn, user_id=args.user_id)
    else:
        print("memory-archive: restore needs --original-id or --all", file=sys.stderr)
        return 2
    restored = sum(
        restore_archive(conn, services.object_store, user_id=u, original_id=o, actor="cli").restored
        for u, o in targets
    )
    print(json.dumps({"restored": restored, "requested": len(targets)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
