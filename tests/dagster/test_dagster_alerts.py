"""The pause you can see and the alerts you can point at Slack: the sensors against the embedded
Postgres, a real failed Slow Path night (fake LLM) and a webhook receiver on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import pytest

from memory_assets.alerts import AlertDeliveryError, AlertResource
from memory_assets.defs.slow_path.sensors import ARCHIVAL_PAUSE, archival_failure_alert, archival_pause_sensor
from memory_assets.resources import DatabaseResource, SummarizerResource
from memory_lib.archival import nights
from memory_lib.lifecycle import pause as pause_switch
from testing.dagster_helpers import metadata_value
from testing.slow_path import (
    NIGHT,
    materialize,
    resources,
)

WEBHOOK_VAR = "MEMORY_ARCHIVE_SLOW_PATH__ALERT_WEBHOOK_URL"
TOKEN_PATH = "/services/T000/B000/secret-token"


class Receiver:
    """A webhook on 127.0.0.1 that keeps every JSON body it is sent and answers `status`."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.paths: list[str] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.paths.append(self.path)
                receiver.received.append(json.loads(body))
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{TOKEN_PATH}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook(monkeypatch):
    receiver = Receiver()
    monkeypatch.setenv(WEBHOOK_VAR, receiver.url)
    yield receiver
    receiver.close()


def tick(instance, db_url, cursor):
    """One evaluation of archival_pause_sensor through Dagster's sensor machinery (resources set up)."""
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"database": DatabaseResource(database_url=db_url), "alerts": AlertResource()},
    )
    with context:
        return archival_pause_sensor.evaluate_tick(context)


def test_the_pause_sensor_shows_the_state_records_changes_and_alerts_a_new_pause(conn, db_url, webhook):
    with dg.instance_for_test() as instance:
        running = tick(instance, db_url, None)
        assert running.skip_message == "archival is running"
        assert [e.asset_key for e in running.asset_events] == [ARCHIVAL_PAUSE.key]
        assert metadata_value(running.asset_events[0], "paused") is False
        assert webhook.received == []  # running is no news

        quiet = tick(instance, db_url, running.cursor)  # nothing changed: nothing recorded, no alert
        assert quiet.asset_events == [] and quiet.skip_message == "archival is running"

        pause_switch.set_pause(
            conn, reason="gate failed on night-x", actor="archive_backups", batch_key="night-x"
        )
        paused = tick(instance, db_url, quiet.cursor)
        assert paused.skip_message.startswith("archival paused after night-x by archive_backups at ")
        assert (
            "gate failed on night-x" in paused.skip_message
            and "alert sent to 127.0.0.1" in paused.skip_message
        )
        meta = {k: v.value for k, v in paused.asset_events[0].metadata.items()}
        assert (meta["paused"], meta["actor"], meta["reason"], meta["batch_key"]) == (
            True,
            "archive_backups",
            "gate failed on night-x",
            "night-x",
        )
        assert meta["changed_at"] == pytest.approx(pause_switch.pause_status(conn).changed_at.timestamp())
        [alert] = webhook.received
        assert alert["event"] == "archival_paused" and alert["actor"] == "archive_backups"
        assert "gate failed on night-x" in alert["text"] and "clear_archival_pause" in alert["text"]
        assert webhook.paths == [TOKEN_PATH]

        still = tick(instance, db_url, paused.cursor)  # the same pause: alerted once
        assert still.asset_events == [] and len(webhook.received) == 1
        assert still.skip_message.startswith("archival paused after night-x")

        pause_switch.clear_pause(conn, reason="fixed", actor="ops")
        cleared = tick(instance, db_url, still.cursor)
        assert cleared.skip_message == "archival is running"
        assert metadata_value(cleared.asset_events[0], "paused") is False
        assert len(webhook.received) == 1


def test_a_webhook_that_refuses_fails_the_tick_without_showing_its_token(conn, db_url, webhook):
    webhook.status = 500
    pause_switch.set_pause(conn, reason="outage", actor="ops")
    with dg.instance_for_test() as instance, pytest.raises(AlertDeliveryError) as err:
        tick(instance, db_url, None)  # raised: the cursor stays, the next tick tries again
    assert "HTTP 500" in str(err.value) and "127.0.0.1" in str(err.value)
    assert "secret-token" not in str(err.value)
    assert len(webhook.received) == 1


def test_without_a_webhook_the_alert_is_only_in_the_tick(conn, db_url, monkeypatch):
    monkeypatch.delenv(WEBHOOK_VAR, raising=False)
    pause_switch.set_pause(conn, reason="outage", actor="ops")
    with dg.instance_for_test() as instance:
        result = tick(instance, db_url, None)
    assert "alert not sent: MEMORY_ARCHIVE_SLOW_PATH__ALERT_WEBHOOK_URL is unset" in result.skip_message


def test_a_bad_webhook_url_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(WEBHOOK_VAR, "ftp://hooks.example.com/x")
    with pytest.raises(Exception, match=WEBHOOK_VAR):
        AlertResource().notify({"event": "x", "text": "x"})


def test_a_night_failing_its_gate_is_alerted_with_its_night_and_then_its_pause(
    conn,
    db_url,
    history,
    local_store_resource,
    fake_llm,
    llm_keys,
    webhook,
):
    fake_llm.fail_fraction, fake_llm.fail_status = 0.1, 400
    llm = SummarizerResource(
        provider="anthropic", base_url=fake_llm.base_url, requests_per_second=1000.0, max_retries=0
    )
    with dg.instance_for_test() as instance:
        result = materialize(resources(db_url, local_store_resource, summarizer=llm), instance=instance)
        assert not result.success

        context = dg.build_run_status_sensor_context(
            sensor_name="archival_failure_alert",
            dagster_event=result.get_run_failure_event(),
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            resources={"alerts": AlertResource()},
        ).for_run_failure()
        skip = archival_failure_alert(context)
        assert isinstance(skip, dg.SkipReason)
        [alert] = webhook.received
        assert alert["event"] == "run_failure" and alert["run_id"] == result.run_id
        assert alert["partition"] == NIGHT.isoformat() and NIGHT.isoformat() in alert["text"]
        assert skip.skip_message is not None
        assert any("error_rate_gate" in s["error"] for s in alert["failed_steps"])
        assert "alert sent to 127.0.0.1" in skip.skip_message

        paused = tick(instance, db_url, None)
        assert webhook.received[-1]["event"] == "archival_paused"
        assert webhook.received[-1]["batch_key"] == nights.batch_key_for(NIGHT)
        assert metadata_value(paused.asset_events[0], "paused") is True


def test_a_night_stalled_behind_an_llm_batch_submission_fails_its_run_and_is_alerted(
    conn, db_url, history, tmp_path, fake_llm, llm_keys, webhook
):
    from memory_assets.defs.slow_path.partitions import SLOW_PATH
    from memory_assets.resources import ArchivalCriteriaResource, ObjectStoreResource
    from memory_lib.llm import batches

    store = ObjectStoreResource(kind="local", local_root=str(tmp_path / "objects"), prefix="test")

    # An earlier run's submission of most of the night got no answer and the provider has no batch for
    # it; creates still fail. The run archives the rest, yet the night is stalled: its run fails.
    night = nights.claim_night(conn, NIGHT, ArchivalCriteriaResource().get_criteria(), SLOW_PATH.timezone)
    key = nights.batch_key_for(NIGHT)
    assert night.claim is not None
    ids = [
        r["memory_id"]
        for r in conn.execute(
            "SELECT memory_id FROM archival_attempts WHERE batch_key = %s ORDER BY memory_id", (key,)
        ).fetchall()
    ]
    assert night.claim.claimed == len(ids) > 5
    stuck = ids[3:]
    submission = batches.submission_key(key, stuck)
    batches.record_intent(conn, key, submission, "anthropic", "claude-3-haiku-20240307", stuck)
    batches.mark(conn, submission, "submitting", "outcome unknown: HTTP 500 InternalServerError")
    fake_llm.batch_create_status = 500
    llm = SummarizerResource(
        provider="anthropic",
        base_url=fake_llm.base_url,
        requests_per_second=1000.0,
        max_retries=0,
        batch_threshold=10,
    )
    with dg.instance_for_test() as instance:
        result = materialize(resources(db_url, store, summarizer=llm), instance=instance)
        assert not result.success
        meta = {
            e.asset_key.path[-1]: {k: v.value for k, v in e.materialization.metadata.items()}
            for e in result.get_asset_materialization_events()
        }
        assert meta["memory_summaries"]["stalled"] is True
        assert meta["memory_summaries"]["held_by_llm_batches"] == len(stuck)
        rows = meta["archive_rows"]  # the night did archive the rest: recorded, with why it stalled
        assert rows["archived"] == 3 and rows["stalled"] is True
        assert f"{len(stuck)} memories held by LLM batch {submission} in status 'submitting'" in rows["why"]

        context = dg.build_run_status_sensor_context(
            sensor_name="archival_failure_alert",
            dagster_event=result.get_run_failure_event(),
            dagster_instance=instance,
            dagster_run=result.dagster_run,
            resources={"alerts": AlertResource()},
        ).for_run_failure()
        archival_failure_alert(context)
    [alert] = webhook.received
    assert alert["event"] == "run_failure" and alert["partition"] == NIGHT.isoformat()
    [step] = [s for s in alert["failed_steps"] if "archive_rows" in s["step"]]
    assert (
        "stalled in an LLM batch submission" in step["error"] and f"LLM batch {submission}" in step["error"]
    )
    assert not pause_switch.pause_status(conn).paused  # the next run resolves the submission: no pause
