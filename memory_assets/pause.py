"""The archival pause from a shell: `python -m memory_assets.pause status|set|clear`.

Uses the same database as the Dagster resources: DATABASE_URL, else the embedded server under
MEMORY_ARCHIVE_STATE_DIR (database MEMORY_ARCHIVE_EMBEDDED_DB, default postgres).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from memory_lib import pause
from memory_lib.config import Settings
from memory_lib.db import connect, open_migrated
from memory_lib.errors import MemoryArchiveError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memory_assets.pause", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="show the pause state and its recent history")
    for name, text in (("set", "pause archival"), ("clear", "resume archival")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--reason", required=True, help="why (kept in archival_pause_events)")
        p.add_argument("--operator", default=getpass.getuser(), help="who (default: your login)")
    args = parser.parse_args(argv)

    db, url = open_migrated(
        database_url=os.getenv("DATABASE_URL") or None,
        embedded_database=Settings.from_env().embedded_database,
    )
    try:
        with connect(url) as conn:
            if args.command == "set":
                state = pause.set_pause(conn, reason=args.reason, actor=args.operator)
            elif args.command == "clear":
                state = pause.clear_pause(conn, reason=args.reason, actor=args.operator)
            else:
                state = pause.pause_status(conn)
            print(state.describe())
            if args.command == "status":
                for event in pause.pause_history(conn, limit=5):
                    print(f"  {event['occurred_at']:%Y-%m-%d %H:%M} {event['action']:<7} by {event['actor']}: "
                          f"{event['reason']}")  # fmt: skip
    except MemoryArchiveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
