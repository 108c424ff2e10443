"""The image's entry point: `python -m memory_assets.code_server [dagster code-server start options]`.

The definitions never read the database (memory_assets.defs.slow_path.partitions), so an unset
MEMORY_ARCHIVE_PARTITION_START would start the archival nights at today minus 7 days, a window that moves
every day. This entry point pins it first, as `make dev` does (memory_assets.dev.pin_partition_start: the
oldest memory's night, read once), then replaces itself with `python -m dagster code-server start ... -m
memory_assets.definitions`: every code server of a deployment, restarted or not, shows the same nights.
"""

from __future__ import annotations

import os
import sys

from .dev import pin_partition_start

DEFINITIONS = "memory_assets.definitions"


def command(argv: list[str], env: dict[str, str]) -> list[str]:
    """The code server's command line; pins MEMORY_ARCHIVE_PARTITION_START in `env` when it is unset."""
    if (night := pin_partition_start(env)) is not None:
        print(f"MEMORY_ARCHIVE_PARTITION_START={night}: the oldest memory's night", file=sys.stderr)
    # This interpreter's Dagster, whatever PATH says.
    return [sys.executable, "-m", "dagster", "code-server", "start", *argv, "-m", DEFINITIONS]


def main(argv: list[str] | None = None) -> None:
    env = dict(os.environ)
    args = command(sys.argv[1:] if argv is None else argv, env)
    os.execvpe(args[0], args, env)


if __name__ == "__main__":
    main()
