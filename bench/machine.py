"""What the benches read of the machine and the tools they drive: RSS and CPU samplers, load average,
the memory-archive command, a bucket made ready."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

MIB = 1024 * 1024


@contextmanager
def rss_sampler(interval_s: float = 0.05) -> Iterator[dict[str, float]]:
    """Sample this process's RSS in a thread while the block runs; out["peak_mib"] is the highest seen
    (VmHWM would include the backlog load before the run), out["growth_mib"] the peak less the RSS at
    the start (what the run itself added: under `python -m bench all` the process already holds the
    earlier benchmarks' model and vectors; `bench memory` measures a fresh process)."""
    proc, stop = psutil.Process(), threading.Event()
    start = proc.memory_info().rss / MIB
    out = {"peak_mib": start, "start_mib": start, "growth_mib": 0.0}

    def sample() -> None:
        while True:
            out["peak_mib"] = max(out["peak_mib"], proc.memory_info().rss / MIB)
            if stop.wait(interval_s):
                return

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        out["peak_mib"] = max(out["peak_mib"], proc.memory_info().rss / MIB)
        out["growth_mib"] = out["peak_mib"] - start


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process: this one, Postgres,
    SeaweedFS, anything else running), from psutil.cpu_times: idle and I/O wait excluded."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def ensure_bucket(client: Any, bucket: str) -> None:
    from botocore.exceptions import ClientError

    try:
        client.head_bucket(Bucket=bucket)
    except ClientError:
        client.create_bucket(Bucket=bucket)


def memory_archive_command() -> str:
    path = Path(sys.executable).with_name("memory-archive")
    if not path.exists():
        raise RuntimeError(f"{path} not found: install memory-archive (pip install -e .) in this environment")
    return str(path)
