"""A wheel built from the checkout, installed in a fresh venv, migrates an empty database from another
folder; it ships the migrations and no top-level `bench`."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memory_lib.storage.db import check_schema

ROOT = Path(__file__).resolve().parent.parent
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


@pytest.fixture(scope="module")
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


def test_wheel_ships_the_migrations_and_no_bench(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.startswith("memory_archive-")}
    assert top == {"memory_lib", "memory_assets"}, top
    shipped = sorted(n for n in names if n.startswith("memory_lib/sql/"))
    assert shipped == sorted(f"memory_lib/sql/{p.name}" for p in (ROOT / "sql").glob("*.sql")) and shipped


@pytest.fixture(scope="module")
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
        env=_clean_env(),
    )
    # Only now: with this venv's memory-archive (editable) visible, pip would skip the wheel as installed.
    (Path(purelib) / "_deps_from_test_venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return env_dir


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMORY_ARCHIVE_") and k not in ("PYTHONPATH", "DATABASE_URL", "VIRTUAL_ENV")
    }
    return env | extra


def test_installed_wheel_migrates_an_empty_database_from_another_folder(
    venv: Path, empty_database: str, tmp_path
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env(DATABASE_URL=empty_database, MEMORY_ARCHIVE_EMBEDDING_DIM="48")
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
    assert applied == sorted(p.stem for p in (ROOT / "sql").glob("*.sql"))
    assert check_schema(empty_database, embedding_dim=48) == 48
    again = subprocess.run(
        [cli, "migrate"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1]) == {"applied": []}
    assert list(elsewhere.iterdir()) == []  # no .state or anything else left in the working folder


def test_installed_wheel_keeps_state_in_the_user_state_dir(venv: Path, tmp_path):
    """Outside a checkout, the default state dir is the user's (XDG), whatever the working folder."""
    code = "from memory_lib.core.config import Settings; print(Settings.from_env().state_dir)"
    env = _clean_env(XDG_STATE_HOME=str(tmp_path / "xdg"))
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == str(tmp_path / "xdg" / "memory-archive")
