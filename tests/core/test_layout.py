"""memory_lib stays importable without Dagster; the Dagster family is pinned together."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import memory_lib

ROOT = Path(__file__).resolve().parents[2]


def test_memory_lib_never_imports_dagster():
    modules = [m.name for m in pkgutil.walk_packages(memory_lib.__path__, "memory_lib.")]
    assert len(modules) >= 60  # every module of every package, not only the top level
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "leaked = sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster'))\n"
        "print(','.join(leaked))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_dagster_family_is_pinned_together():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dagster"]
    pins = {d.split("==")[0]: d.split("==")[1] for d in deps if d.startswith("dagster")}
    assert pins["dagster"] == pins["dagster-webserver"] == "1.13.27"
    assert pins["dagster-postgres"] == pins["dagster-aws"] == "0.29.27"
