"""Fixtures of the packaging tests: a wheel built from a copy of the checkout, and a fresh venv with it
installed."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".state",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    "results",
)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of a copy of the checkout (building in place would leave build/ in the worktree).
    No build isolation: setuptools comes from this venv instead of a download."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=_NOT_SOURCE)
    out = base / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    (found,) = out.glob("memory_archive-*.whl")
    return found


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed (--no-deps); its dependencies come from this venv's
    site-packages, appended by a .pth file after the venv's own (so memory_lib is the wheel's)."""
    env_dir = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=env_dir,
        env=clean_env(),
    )
    # Only now: with this venv's memory-archive (editable) visible, pip would skip the wheel as installed.
    (Path(purelib) / "_deps_from_test_venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return env_dir


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMORY_ARCHIVE_") and k not in ("PYTHONPATH", "DATABASE_URL", "VIRTUAL_ENV")
    }
    return env | extra


def offline_env(**extra: str) -> dict[str, str]:
    """clean_env for a process of this checkout (PYTHONPATH): no DAGSTER_HOME, no LLM key, no model hub."""
    env = clean_env(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    for key in ("DAGSTER_HOME", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        env.pop(key, None)
    return env | extra


@dataclass(frozen=True)
class DemoRun:
    state: (
        Path  # its MEMORY_ARCHIVE_STATE_DIR: demo.env, the embedded Postgres, the objects, the Dagster home
    )
    proc: subprocess.CompletedProcess[str]


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """`make demo`'s `python -m memory_assets.demo`, default arguments, in a state dir of its own: run once
    for the tests that read its output or its data (about 2 minutes on 2 cores)."""
    state = tmp_path_factory.mktemp("demo") / "state"
    proc = subprocess.run(
        [sys.executable, "-m", "memory_assets.demo"],
        cwd=ROOT,
        env=offline_env(MEMORY_ARCHIVE_STATE_DIR=str(state)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return DemoRun(state, proc)
