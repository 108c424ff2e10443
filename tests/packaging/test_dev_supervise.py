"""memory_assets.dev.supervise without Dagster (fast): services that ignore the forwarded Ctrl-C, one of
them in a session of its own (out of the process group), are killed when the grace period ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]

# A service that ignores SIGINT and starts a helper in a new session that ignores it too.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
helper = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(300)"
child = subprocess.Popen([sys.executable, "-c", helper], start_new_session=True)
print(child.pid, flush=True)
time.sleep(300)
"""
SUPERVISOR = """
import os, sys
from pathlib import Path
from memory_assets.dev import supervise
sys.exit(supervise([sys.executable, "-c", sys.argv[1]], dict(os.environ), Path("."), grace=1.0))
"""


def test_stragglers_are_killed_after_the_grace_period():
    proc = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, STUBBORN],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    family: list[psutil.Process] = []
    try:
        assert proc.stdout is not None
        helper = psutil.Process(int(proc.stdout.readline()))
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True), helper]
        assert len({p.pid for p in family}) == 3
        assert os.getsid(helper.pid) != os.getsid(family[1].pid)  # out of the group a killpg reaches

        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
        sent = time.monotonic()
        assert proc.wait(timeout=10) == 128 + signal.SIGINT
        gone, alive = psutil.wait_procs(family, timeout=max(0.1, 5 - (time.monotonic() - sent)))
        assert not alive, alive
        assert time.monotonic() - sent < 5
    finally:
        for p in family:
            if p.is_running():
                p.kill()
        proc.wait(timeout=10)
