"""Start the Dagster UI: `python -m memory_assets.dev [--demo] [--host 127.0.0.1] [--port 3000]`.

Prepares $DAGSTER_HOME (default: $MEMORY_ARCHIVE_STATE_DIR/dagster) with this project's instance file
(dagster.yaml: SQLite; dagster.postgres.yaml when DAGSTER_PG_URL is set), then runs
`dagster dev -w workspace.yaml -h HOST -p PORT` in the project root. With --demo the code location
uses the demo's database (database memory_demo in the embedded server, the settings `make demo`
wrote to <state>/demo.env), never DATABASE_URL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO_ENV = "demo.env"


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
    """Create $DAGSTER_HOME with the instance file matching the environment; returns it."""
    home = Path(env.get("DAGSTER_HOME") or state_dir() / "dagster").resolve()
    home.mkdir(parents=True, exist_ok=True)
    env["DAGSTER_HOME"] = str(home)
    source = "dagster.yaml"
    if env.get("DAGSTER_PG_URL"):
        env["DAGSTER_PG_URL"] = psycopg2_url(env["DAGSTER_PG_URL"])
        source = "dagster.postgres.yaml"
    shutil.copyfile(ROOT / source, home / "dagster.yaml")
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m memory_assets.dev", description=__doc__.splitlines()[0])
    parser.add_argument("--demo", action="store_true", help="use the demo's database and settings")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", default="3000")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    env.setdefault("MEMORY_ARCHIVE_STATE_DIR", str(state_dir()))
    if args.demo:
        env = demo_env(env)
    home = prepare_dagster_home(env)
    dagster = Path(sys.executable).with_name("dagster")
    cmd = [str(dagster), "dev", "-w", str(ROOT / "workspace.yaml"), "-h", args.host, "-p", str(args.port)]
    print(f"DAGSTER_HOME={home}  ({'postgres' if env.get('DAGSTER_PG_URL') else 'sqlite'} instance storage)")
    print(" ".join(cmd), flush=True)
    os.chdir(home)  # not the project root: dagster warns about the dagster.yaml template it finds there
    os.execve(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
