"""Start the Dagster UI: `python -m memory_assets.dev [--demo] [--host 127.0.0.1] [--port 3000]`.

Prepares $DAGSTER_HOME (default: $MEMORY_ARCHIVE_STATE_DIR/dagster) with this project's instance file
(dagster.yaml: SQLite; dagster.postgres.yaml when DAGSTER_PG_URL is set), then runs
`dagster dev -w workspace.yaml -h HOST -p PORT` as a child in its own session. With --demo the code
location uses the demo's database (database memory_demo in the embedded server, the settings
`make demo` wrote to <state>/demo.env), never DATABASE_URL.

Stopping: Ctrl-C (SIGINT), SIGTERM or SIGHUP is forwarded as SIGINT to dagster dev's process group (what
a terminal's Ctrl-C does to a foreground `dagster dev`: webserver, daemon and code server shut down
cleanly); whatever is still alive GRACE_SECONDS later (or at a second Ctrl-C) is killed with its
process group, then this process exits. dagster dev alone waits up to 60 s per service and, started
without a terminal, can ignore SIGTERM for 20+ s: its own session keeps it from the terminal's signals,
so this process decides when it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEMO_ENV = "demo.env"
STATE_DIR_STORAGE = "memory_assets.instance_storage"  # the root instance files' storage for no DAGSTER_HOME
# After the forwarded Ctrl-C, how long dagster dev gets to stop its services before they are killed
# (a clean stop took 1-5 s on 2 cores; the whole stop must stay under 10 s).
GRACE_SECONDS = 6.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A -W filter: action:message (the start of it, matched literally):category.
DEV_SUPERSEDED_WARNING = "ignore:Function `dev_command` is superseded::"


def state_dir() -> Path:
    """MEMORY_ARCHIVE_STATE_DIR, else the library's default (memory_lib.core.config.default_state_dir)."""
    from memory_lib.core.config import default_state_dir

    return Path(os.getenv("MEMORY_ARCHIVE_STATE_DIR") or default_state_dir()).resolve()


def psycopg2_url(url: str) -> str:
    """dagster-postgres needs the psycopg2 driver named in the URL (SQLAlchemy maps bare postgresql:// to psycopg 3)."""
    for bare in ("postgresql://", "postgres://"):
        if url.startswith(bare):
            return "postgresql+psycopg2://" + url[len(bare) :]
    return url


def prepare_dagster_home(env: dict[str, str]) -> Path:
    """Create $DAGSTER_HOME with the instance file matching the environment; returns it.

    The file is the project's (dagster.yaml, or dagster.postgres.yaml with DAGSTER_PG_URL) without its
    memory_assets.instance_storage sections: those place storage by the environment of the process that
    loads the file, for a `dagster dev` run without DAGSTER_HOME. In $DAGSTER_HOME, Dagster's defaults
    keep everything in that folder, for every process that opens it (DagsterInstance.from_config(home)
    included), whatever its environment."""
    import yaml  # type: ignore[import-untyped]  # a dependency of dagster

    home = Path(env.get("DAGSTER_HOME") or state_dir() / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    env["DAGSTER_HOME"] = str(home)
    source = "dagster.yaml"
    if env.get("DAGSTER_PG_URL"):
        env["DAGSTER_PG_URL"] = psycopg2_url(env["DAGSTER_PG_URL"])
        source = "dagster.postgres.yaml"
    config = yaml.safe_load((ROOT / source).read_text())
    for key in ("storage", "local_artifact_storage", "compute_logs"):
        section = config.get(key) or {}
        if STATE_DIR_STORAGE in (section.get("module"), (section.get("custom") or {}).get("module")):
            del config[key]
    (home / "dagster.yaml").write_text(
        f"# Written by memory_assets.dev from {source}, storage in this folder (Dagster's defaults).\n"
        + yaml.safe_dump(config, sort_keys=False)
    )
    return home


def demo_env(env: dict[str, str]) -> dict[str, str]:
    """The demo's settings (written by `python -m memory_assets.demo`) over `env`, without DATABASE_URL."""
    path = state_dir() / DEMO_ENV
    if not path.exists():
        raise SystemExit(f"{path} not found: run the demo first (make demo / python -m memory_assets.demo)")
    out = {k: v for k, v in env.items() if k != "DATABASE_URL"}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


# How long pin_partition_start waits for the database: `make dev` must start without one too.
CONNECT_TIMEOUT_S = 3


def pin_partition_start(env: dict[str, str]) -> str | None:
    """Set MEMORY_ARCHIVE_PARTITION_START in `env` to the night of the oldest memory (hot or archived,
    memory_lib.archival.nights.oldest_night, in the configured zone) when it is unset, so the first
    archival night is the history's and stays put as archival goes on; returns the value it set, or None.

    This entry point reads the database once, before Dagster starts: the definitions themselves never
    do (memory_assets.defs.slow_path.partitions). Nothing set with no DATABASE_URL and no running
    embedded server, no memory, or a database not readable within CONNECT_TIMEOUT_S (said on stderr):
    the definitions then start at today minus 7 days and say so."""
    import psycopg

    from memory_lib.archival.nights import oldest_night
    from memory_lib.core.config import Settings
    from memory_lib.core.errors import MemoryArchiveError
    from memory_lib.storage.db import reachable_url

    settings = Settings.from_env(env)
    if settings.slow_path.partition_start_date is not None:
        return None
    url = reachable_url(settings)
    if url is None:
        return None
    try:
        night = oldest_night(url, settings.slow_path.timezone, connect_timeout=CONNECT_TIMEOUT_S)
    except (psycopg.Error, MemoryArchiveError) as exc:
        why = " ".join(str(exc).split())[:200]
        print(
            f"MEMORY_ARCHIVE_PARTITION_START not pinned: database not readable ({type(exc).__name__}: {why})",
            file=sys.stderr,
        )
        return None
    if night is None:
        return None
    env["MEMORY_ARCHIVE_PARTITION_START"] = night.isoformat()
    return env["MEMORY_ARCHIVE_PARTITION_START"]


def process_table() -> dict[int, tuple[int, float]]:
    """Every live process: pid -> (parent pid, start time); zombies left out. psutil when installed,
    else /proc (Linux)."""
    try:
        psutil: Any = importlib.import_module("psutil")  # no type stubs installed
    except ImportError:
        return _proc_table()
    table: dict[int, tuple[int, float]] = {}
    for p in psutil.process_iter(["ppid", "create_time", "status"]):
        info = p.info
        if info["status"] != psutil.STATUS_ZOMBIE and info["ppid"] is not None:
            table[p.pid] = (info["ppid"], info["create_time"])
    return table


def _proc_table() -> dict[int, tuple[int, float]]:
    table: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ... starttime (field 22): comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            table[int(entry.name)] = (int(fields[1]), float(fields[19]))
    return table


class Family:
    """The processes below `proc`, remembered by pid and start time: one that outlives its parent (and is
    reparented) is still found, and a pid reused by an unrelated process is never taken for it."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self.known: dict[int, float] = {}

    def refresh(self) -> list[int]:
        """Record the current descendants; returns the remembered ones still alive."""
        table = process_table()
        self.known = {pid: t for pid, t in self.known.items() if pid in table and table[pid][1] == t}
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        # The root only while not reaped: after that its pid may belong to another process.
        todo = [*self.known, *([self.proc.pid] if self.proc.poll() is None else [])]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in self.known:
                    self.known[child] = table[child][1]
                    todo.append(child)
        return list(self.known)


def _signal_all(pgid: int, pids: Iterable[int], sig: int) -> None:
    """`sig` to process group `pgid` and to each of `pids` (those that left the group: new sessions)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def supervise(cmd: list[str], env: dict[str, str], cwd: Path, grace: float = GRACE_SECONDS) -> int:
    """Run `cmd` in its own session until it exits or a stop signal arrives; leave nothing behind.

    Returns its exit status, or 128 + the signal number when stopped by a signal (shell convention)."""
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    # Handlers before the child starts: a handled signal is reset to the default in the child at exec,
    # so dagster dev takes SIGINT even when this process was started with SIGINT ignored (`make dev &`).
    previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, start_new_session=True)
    family = Family(proc)
    try:
        while proc.poll() is None and not received:
            family.refresh()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)
        if received:
            family.refresh()
            _signal_all(proc.pid, [], signal.SIGINT)
            deadline = time.monotonic() + grace
            count = len(received)  # a second Ctrl-C: no more waiting
            while time.monotonic() < deadline and len(received) == count:
                if not family.refresh() and proc.poll() is not None:
                    break
                time.sleep(0.1)
    finally:
        # Stragglers: a service still stopping, or one dagster dev left behind when it exited on its own.
        left = family.refresh()
        if proc.poll() is None or left:
            _signal_all(proc.pid, left, signal.SIGKILL)
        proc.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + received[0] if received else proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memory_assets.dev", description=__doc__.splitlines()[0])
    parser.add_argument("--demo", action="store_true", help="use the demo's database and settings")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", default="3000")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    env.setdefault("MEMORY_ARCHIVE_STATE_DIR", str(state_dir()))
    if args.demo:
        env = demo_env(env)
    if (start := pin_partition_start(env)) is not None:
        print(f"MEMORY_ARCHIVE_PARTITION_START={start}  (the oldest memory's night)")
    home = prepare_dagster_home(env)
    # `dagster dev` warns on every start that `dg dev` supersedes it; dg comes from another package
    # (dagster-dg-cli) this project does not install, so the advice is noise here. Only that message.
    env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), DEV_SUPERSEDED_WARNING]))
    dagster = Path(sys.executable).with_name("dagster")
    cmd = [str(dagster), "dev", "-w", str(ROOT / "workspace.yaml"), "-h", args.host, "-p", str(args.port)]
    print(f"DAGSTER_HOME={home}  ({'postgres' if env.get('DAGSTER_PG_URL') else 'sqlite'} instance storage)")
    print(" ".join(cmd), flush=True)
    # cwd: $DAGSTER_HOME, not the project root, where dagster warns about the dagster.yaml it finds.
    return supervise(cmd, env, home)


if __name__ == "__main__":
    sys.exit(main())
