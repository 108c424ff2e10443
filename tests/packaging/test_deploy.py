"""Deployment files: the instance dagster.yaml runs on Postgres with the run queue and the llm_api
pool, the Helm values point Dagster's chart at the code-location image, the image installs the
package non-editable with pinned dependencies, and that installed package loads as a code location.
(No image is built here: no registry access.)"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import dagster as dg
import psycopg
import yaml  # type: ignore[import-untyped]  # a dependency of dagster
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from testing.dagster_helpers import sqlalchemy_url
from testing.rows import one
from tests.packaging.conftest import clean_env

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def test_deploy_dagster_yaml_is_a_valid_instance_config(tmp_path, monkeypatch):
    from dagster._core.instance.config import dagster_instance_config

    (tmp_path / "dagster.yaml").write_text((DEPLOY / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_PG_URL", "postgresql+psycopg2://dagster@db.internal:5432/dagster")
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["storage"]["postgres"]["postgres_url"] == {"env": "DAGSTER_PG_URL"}
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    assert config["concurrency"]["pools"]["default_limit"] == 1
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert {"key": "dagster/backfill", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
    assert config["python_logs"]["managed_python_loggers"] == ["memory_lib"]
    # Both scale-out launchers are documented, ready to uncomment.
    text = (DEPLOY / "dagster.yaml").read_text()
    assert "#   class: DockerRunLauncher" in text and "#   class: K8sRunLauncher" in text


def test_the_deploy_instance_runs_on_postgres_with_the_queue_and_the_llm_pool(
    tmp_path, monkeypatch, empty_database
):
    (tmp_path / "dagster.yaml").write_text((DEPLOY / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_PG_URL", sqlalchemy_url(empty_database))

    @dg.asset(pool="llm_api")
    def summarized() -> int:
        return 1

    with dg.DagsterInstance.get() as instance:
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        result = dg.materialize([summarized], instance=instance)
        assert result.success
        assert instance.event_log_storage.get_concurrency_info("llm_api").slot_count == 1
        run_id = result.run_id
    with psycopg.connect(empty_database) as c:  # the run is in Postgres, not in a local SQLite file
        assert one(c.execute("SELECT count(*) FROM runs WHERE run_id = %s", (run_id,)))[0] == 1
    assert not list(tmp_path.glob("**/*.db"))


def test_helm_values_point_the_chart_at_the_code_location_image():
    values = yaml.safe_load((DEPLOY / "helm-values.yaml").read_text())
    uds = values["dagster-user-deployments"]
    assert uds["enabled"] and uds["enableSubchart"]
    [location] = uds["deployments"]
    assert location["codeServerArgs"] == ["-m", "memory_assets.definitions"]
    assert location["port"] == 4000 and location["image"]["tag"] not in ("", "latest")
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    assert coordinator["enabled"] and coordinator["type"] == "QueuedRunCoordinator"
    limits = coordinator["config"]["queuedRunCoordinator"]["tagConcurrencyLimits"]
    assert {"key": "dagster/backfill", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits
    assert values["concurrency"]["enabled"] and values["concurrency"]["pools"]["defaultLimit"] == 1
    assert values["pythonLogs"]["managedPythonLoggers"] == ["memory_lib"]
    # The same settings as the instance file.
    instance = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    assert (
        instance["concurrency"]["runs"]["max_concurrent_runs"]
        == (coordinator["config"]["queuedRunCoordinator"]["maxConcurrentRuns"])
    )


def test_the_image_installs_the_package_pinned_and_not_editable():
    lines = [
        ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines() if not ln.lstrip().startswith("#")
    ]
    text = "\n".join(lines)
    assert 'pip install --constraint deploy/constraints.txt ".[all]"' in text
    assert not re.search(r"pip install[^\n]*(-e|--editable)\b", text)
    assert "dagster.yaml" not in text and "DAGSTER_HOME" not in text  # the instance is not the code server's
    assert lines[-1] == 'CMD ["python", "-m", "memory_assets.code_server", "-h", "0.0.0.0", "-p", "4000"]'


def test_constraints_pin_every_dependency_to_the_tested_versions():
    from deploy.pin_constraints import render

    pins: dict[str, str] = {}
    for line in (DEPLOY / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for raw in project["dependencies"]:
        req = Requirement(raw)
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} is not pinned in deploy/constraints.txt"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} does not satisfy {raw}"
    assert pins["dagster"] == "1.13.27" and pins["dagster-aws"] == pins["dagster-postgres"] == "0.29.27"
    assert "pandas" not in {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    # Regenerated from this environment, the file is the same: the image gets what the tests ran on.
    assert (DEPLOY / "constraints.txt").read_text() == render(), "run python deploy/pin_constraints.py"


def test_the_installed_package_loads_as_a_code_location_outside_the_checkout(venv, tmp_path):  # noqa: F811
    """What the image runs: the non-editable install, from a folder that is not the checkout."""
    code = (
        "import memory_assets, dagster as dg; from memory_assets.definitions import defs; d = defs();"
        "dg.Definitions.validate_loadable(d); print(memory_assets.__file__);"
        "print(sorted(s.name for s in d.sensors), d.resolve_job_def('slow_path_job').name)"
    )
    env = clean_env(XDG_STATE_HOME=str(tmp_path / "xdg"))
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    where, wired = out.stdout.strip().splitlines()[-2:]
    assert where.startswith(str(venv)) and not where.startswith(str(ROOT))
    assert wired == "['archival_failure_alert', 'archival_pause_sensor'] slow_path_job"
    assert not (tmp_path / ".state").exists()
