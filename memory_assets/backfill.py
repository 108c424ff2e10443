"""Backlogs as real Dagster backfills: run the daemon, submit a job backfill, wait, read its results.

A backfill submitted here is the one the UI's "Launch backfill" on a partitioned job creates: a
PartitionBackfill over the job's partition set, stored in the instance as REQUESTED. Nothing runs in
this process: the daemon's backfill loop splits the nights by the job's BackfillPolicy (multi_run: N
nights per run), puts the runs in the run queue (QueuedRunCoordinator; dagster.yaml lets one run of a
backfill go at a time, pools such as llm_api apply) and marks the backfill COMPLETED_SUCCESS or
COMPLETED_FAILED once all of its runs have finished. So the Backfills tab, the job's runs and the
timeline show it, as for any backfill launched from the UI.

Child processes (daemon, webserver) run in a session of their own with the environment they are given
(DAGSTER_HOME, the memory-archive settings); `stop_process_group` ends the whole group, code servers
and run workers included, also on Ctrl-C or an error of the caller.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import dagster as dg

ROOT = Path(__file__).resolve().parent.parent
WORKSPACE = ROOT / "workspace.yaml"


def dagster_command(name: str) -> str:
    """A console script of the running interpreter's environment (dagster-daemon, dagster-webserver)."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise RuntimeError(f"{path} not found: install dagster and dagster-webserver in this environment")
    return str(path)


def start_process_group(cmd: Sequence[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start `cmd` in a new session (its own process group) in DAGSTER_HOME, output appended to `log`.
    A new session: Ctrl-C in the terminal reaches only the caller, which then stops the group in order."""
    home = env.get("DAGSTER_HOME")
    if not home:
        raise ValueError("env['DAGSTER_HOME'] is not set: the child would use a temporary instance")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        # cwd is DAGSTER_HOME, not the project root: dagster warns about the dagster.yaml template there.
        return subprocess.Popen(
            list(cmd), cwd=home, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after `grace_s` (dagster's processes may
    ignore SIGTERM for 20 s and more). Also ends children the group leader left behind."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextmanager
def running_daemon(env: Mapping[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`dagster-daemon run -w workspace.yaml` on env's DAGSTER_HOME for the duration of the block."""
    proc = start_process_group([dagster_command("dagster-daemon"), "run", "-w", str(WORKSPACE)], env, log)
    try:
        yield proc
    finally:
        stop_process_group(proc)


@contextmanager
def _environ(env: Mapping[str, str] | None) -> Iterator[None]:
    """os.environ replaced by `env` for the block: Dagster starts the code server with os.environ."""
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass(frozen=True)
class SubmittedBackfill:
    backfill_id: str
    job_name: str
    partitions: list[str]
    runs_expected: int  # by the job's backfill policy: ranges of at most max_partitions_per_run


def submit_job_backfill(
    instance: dg.DagsterInstance,
    job_name: str,
    partitions: Sequence[str],
    *,
    title: str | None = None,
    description: str | None = None,
    tags: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> SubmittedBackfill:
    """Store a REQUESTED backfill of `job_name` over `partitions` (as the UI does); the daemon runs it.

    The workspace (workspace.yaml) is loaded in a code server of its own, started with `env` (give the
    daemon's: the partitions are built from it; default this process's environment), to find the job's
    partition set and backfill policy; it is stopped before returning."""
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
    from dagster._core.utils import make_new_backfill_id
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget
    from dagster._time import get_current_timestamp

    if not partitions:
        raise ValueError(f"partitions={list(partitions)!r}: a backfill needs at least one partition")
    with (
        _environ(env),
        WorkspaceProcessContext(
            instance, WorkspaceFileTarget(paths=[str(WORKSPACE)]), code_server_log_level="WARNING"
        ) as process,
    ):
        workspace = process.create_request_context()
        errors = {
            name: e.load_error for name, e in workspace.get_code_location_entries().items() if e.load_error
        }
        if errors:
            raise RuntimeError(f"workspace {WORKSPACE} failed to load: {errors}")
        matches = [
            ps
            for location in workspace.code_locations
            for repo in location.get_repositories().values()
            for ps in repo.get_partition_sets()
            if ps.job_name == job_name
        ]
        if len(matches) != 1:
            raise ValueError(
                f"job_name={job_name!r}: {len(matches)} partitioned jobs of that name in {WORKSPACE}"
            )
        partition_set = matches[0]
        known = set(partition_set.get_partitions_definition().get_partition_keys())
        unknown = [p for p in partitions if p not in known]
        if unknown:
            raise ValueError(f"partitions={unknown[:5]!r}: not partitions of {job_name}")
        policy = partition_set.backfill_policy
        per_run = (policy.max_partitions_per_run if policy else 1) or len(partitions)
        backfill = PartitionBackfill(
            backfill_id=make_new_backfill_id(),
            partition_set_origin=partition_set.get_remote_origin(),
            status=BulkActionStatus.REQUESTED,
            partition_names=list(partitions),
            from_failure=False,
            reexecution_steps=None,
            tags=dict(tags or {}),
            backfill_timestamp=get_current_timestamp(),
            title=title,
            description=description,
        )
        instance.add_backfill(backfill)
    return SubmittedBackfill(
        backfill.backfill_id, job_name, list(partitions), runs_expected=-(-len(partitions) // per_run)
    )


@dataclass
class RunResult:
    """One finished run of a backfill, read from the instance's run storage and event log."""

    run_id: str
    status: str
    nights: tuple[str, str]  # first and last partition of the run
    start_time: float | None
    end_time: float | None
    materializations: list[dg.AssetMaterialization] = field(default_factory=list)
    checks: list[Any] = field(default_factory=list)  # AssetCheckEvaluation, one per check and night

    @property
    def seconds(self) -> float:
        return (self.end_time or 0) - (self.start_time or 0)


def backfill_runs(instance: dg.DagsterInstance, backfill_id: str) -> list[Any]:
    """The backfill's run records (any status), oldest first."""
    import dagster as dg
    from dagster._core.storage.dagster_run import DagsterRun

    records = instance.get_run_records(dg.RunsFilter(tags=DagsterRun.tags_for_backfill_id(backfill_id)))
    return sorted(records, key=lambda r: r.create_timestamp)


def read_run(instance: dg.DagsterInstance, record: Any) -> RunResult:
    import dagster as dg

    run = record.dagster_run
    tags = run.tags
    first = tags.get("dagster/asset_partition_range_start") or tags.get("dagster/partition", "")
    last = tags.get("dagster/asset_partition_range_end") or tags.get("dagster/partition", "")
    result = RunResult(run.run_id, run.status.value, (first, last), record.start_time, record.end_time)
    of_type = {dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.ASSET_CHECK_EVALUATION}
    for entry in instance.all_logs(run.run_id, of_type=of_type):
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            result.materializations.append(event.event_specific_data.materialization)  # type: ignore[union-attr]
        else:
            result.checks.append(event.event_specific_data)
    return result


def wait_for_backfill(
    instance: dg.DagsterInstance,
    backfill_id: str,
    *,
    timeout_s: float,
    on_run: Callable[[RunResult], None] | None = None,
    daemon: subprocess.Popen[bytes] | None = None,
    poll_s: float = 2.0,
    runs_finished: int | None = None,
) -> Any:
    """Poll until the backfill reaches a terminal status; returns it (a PartitionBackfill).

    Calls `on_run` once per run as it finishes, in the order the runs finish. With `runs_finished`,
    returns as soon as that many of its runs have finished, status not yet terminal: the daemon marks
    a backfill done only on its next loop, up to 30 s later, and the caller may work meanwhile. Raises
    TimeoutError after `timeout_s`, RuntimeError when `daemon` exits before the backfill is done."""
    from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES

    deadline = time.monotonic() + timeout_s
    reported: set[str] = set()
    while True:
        backfill = instance.get_backfill(backfill_id)
        if backfill is None:
            raise ValueError(f"backfill_id={backfill_id!r}: no such backfill in the instance")
        for record in backfill_runs(instance, backfill_id):
            if record.dagster_run.is_finished and record.dagster_run.run_id not in reported:
                reported.add(record.dagster_run.run_id)
                if on_run is not None:
                    on_run(read_run(instance, record))
        if backfill.status in BULK_ACTION_TERMINAL_STATUSES:
            return backfill
        if runs_finished is not None and len(reported) >= runs_finished:
            return backfill
        if daemon is not None and daemon.poll() is not None:
            raise RuntimeError(
                f"dagster-daemon exited with code {daemon.returncode} before backfill {backfill_id} ended"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"backfill {backfill_id} still {backfill.status.value} after {timeout_s:.0f} s"
            )
        time.sleep(poll_s)


def cancel_backfill(instance: dg.DagsterInstance, backfill_id: str, reason: str) -> None:
    """After the daemon is gone (Ctrl-C, error): mark the backfill and its unfinished runs canceled, so
    the UI does not show them as still running."""
    from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES, BulkActionStatus
    from dagster._time import get_current_timestamp

    for record in backfill_runs(instance, backfill_id):
        if not record.dagster_run.is_finished:
            instance.report_run_canceled(record.dagster_run, message=reason)
    backfill = instance.get_backfill(backfill_id)
    if backfill is not None and backfill.status not in BULK_ACTION_TERMINAL_STATUSES:
        instance.update_backfill(
            backfill.with_status(BulkActionStatus.CANCELED).with_end_timestamp(get_current_timestamp())
        )
