"""`python -m memory_assets.dev` (what `make dev` runs) against a real `dagster dev`: it stops everything it
started within 10 s of SIGTERM or a terminal's Ctrl-C, and prints no warning of its own making."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest

from testing.constants import TEST_DIM
from testing.dagster_helpers import offline_dagster_env

# Real webserver, daemon and code server: ~15-25 s per start on 2 cores.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STOP_WITHIN_S = 10.0
START_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dev_env(tmp_path: Path, db_url: str) -> dict[str, str]:
    return offline_dagster_env(tmp_path, db_url, TEST_DIM)


def wait_for_webserver(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before serving:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"no /server_info within {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")


def started_processes(root: int) -> list[psutil.Process]:
    """The root and its descendants, once the code server is up (the webserver may answer first)."""
    proc = psutil.Process(root)
    deadline = time.monotonic() + 60
    while True:
        family = [proc, *proc.children(recursive=True)]
        commands = " ".join(" ".join(p.cmdline()) for p in family if p.is_running())
        if all(part in commands for part in ("dagster_webserver", "dagster._daemon", "grpc")):
            return family
        assert time.monotonic() < deadline, f"services not all started: {commands}"
        time.sleep(0.5)


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (same pid and start time), zombies counted as gone."""
    out = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@contextmanager
def running(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`cmd` in its own session (as a terminal's foreground job: the test's own group never gets the
    signals), killed with everything below it if the test fails half-way."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    family: list[psutil.Process] = [psutil.Process(proc.pid)]
    try:
        yield proc
    finally:
        family += psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        for p in alive(family):
            p.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "how",
    [
        pytest.param("sigterm", id="SIGTERM to the process"),
        pytest.param("ctrl-c", id="SIGINT to the process group (a terminal's Ctrl-C)"),
    ],
)
def test_dev_stops_everything_it_started(how, tmp_path, db_url):
    port = free_port()
    log = tmp_path / "dev.log"
    cmd = [sys.executable, "-m", "memory_assets.dev", "--port", str(port)]
    with running(cmd, dev_env(tmp_path, db_url), ROOT, log) as proc:
        wait_for_webserver(proc, port, log)
        family = started_processes(proc.pid)
        assert len(family) >= 4, family  # supervisor, dagster dev, webserver, daemon, code server(s)

        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        while alive(family) and time.monotonic() - sent < STOP_WITHIN_S:
            time.sleep(0.1)
        left = alive(family)
        took = time.monotonic() - sent
        assert not left, (
            f"still running {took:.1f} s after {how}: {[(p.pid, p.cmdline()[:4]) for p in left]}\n"
            + log.read_text()[-3000:]
        )
        signum = signal.SIGTERM if how == "sigterm" else signal.SIGINT
        assert proc.wait(timeout=5) == 128 + signum
    text = log.read_text()
    assert "Shutting down Dagster services" in text, text[-3000:]  # forwarded, not just killed
    assert "Warning" not in text, text[-3000:]  # no SupersessionWarning (`dg dev`) and the like
