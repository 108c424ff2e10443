"""Alerts from the Dagster sensors: a JSON POST to a webhook (Slack incoming webhooks, or any receiver
that forwards to e-mail, PagerDuty, ...). Pluggable: bind another `AlertResource` subclass under the
resource key `alerts` (override `notify`) to deliver elsewhere, for example by SMTP.

The webhook URL is a secret (a Slack webhook's path is its token): it comes from the setting
`slow_path.alert_webhook_url` (MEMORY_ARCHIVE_SLOW_PATH__ALERT_WEBHOOK_URL) only, never from Dagster config
(which the UI shows), and errors name its host, never its path.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import dagster as dg
from pydantic import Field

from memory_assets.resources import SettingsResource


class AlertDeliveryError(RuntimeError):
    """The webhook did not take the alert: the sensor's tick fails and retries on its next tick."""


class AlertResource(dg.ConfigurableResource):
    """Sends an alert: `notify(alert)` POSTs the alert as JSON to the configured webhook.

    The alert is a dict with at least `text` (one line, what Slack shows) and `event`. Returns where it
    went, or "not sent: ..." when no webhook is configured (the sensor's tick still records the alert).
    """

    timeout_seconds: float = Field(default=10.0, gt=0, description="Per webhook request.")

    def webhook_url(self) -> str | None:
        # Sensors tick outside runs (no run's SettingsResource): the settings are read at the tick, by a
        # SettingsResource of the alert's own. A nested resource would make this one a context manager
        # that sensor contexts built without `with` refuse.
        url = SettingsResource().get().slow_path.alert_webhook_url
        return url.get_secret_value() if url is not None else None

    def notify(self, alert: dict[str, Any]) -> str:
        url = self.webhook_url()
        if url is None:
            return "not sent: MEMORY_ARCHIVE_SLOW_PATH__ALERT_WEBHOOK_URL is unset"
        host = urlsplit(url).netloc.rsplit("@", 1)[-1]
        body = json.dumps(alert, default=str).encode()
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "memory-archive"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            raise AlertDeliveryError(f"alert webhook at {host} answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AlertDeliveryError(f"alert webhook at {host} unreachable: {reason}") from None
        return f"sent to {host} (HTTP {status})"
